"""Errors the command line reports as one line (importing this module imports nothing heavy)."""

import re


class ConfigError(ValueError):
    """A configuration problem found before any compute started."""


class RunFolderError(RuntimeError):
    """A run folder that cannot be used as it is (unreadable files, another process in it); the message says
    which file and what to do."""


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def one_line(e: BaseException) -> str:
    """``Type: first line of the message``, without colour codes (Ray colours its tracebacks)."""
    lines = [line for line in ANSI.sub("", str(e)).strip().splitlines() if line.strip()]
    text = f"{type(e).__name__}: {lines[0].strip()}" if lines else type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."
