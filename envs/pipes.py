"""Reading a worker process's replies with a deadline (for the sandbox client, envs/sandbox.py)."""

from __future__ import annotations

import os
import select
import time


def read_line(fd: int, buf: bytes, deadline: float, exited: str) -> tuple[bytes | None, bytes]:
    """(one line from the pipe ``fd``, what is left buffered after it), or (None, buf) at the ``deadline``
    (time.monotonic()). ``buf`` holds bytes read earlier and not yet returned. Raises EOFError(``exited``) when
    the writer has closed the pipe."""
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return None, buf
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise EOFError(exited)
        buf += chunk
    line, _, rest = buf.partition(b"\n")
    return line, rest
