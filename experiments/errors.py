"""Errors the command line reports as one line (importing this module imports nothing heavy)."""


class ConfigError(ValueError):
    """A configuration problem found before any compute started."""


class RunFolderError(RuntimeError):
    """A run folder that cannot be used as it is (unreadable files, another process in it); the message says
    which file and what to do."""
