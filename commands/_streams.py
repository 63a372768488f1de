"""The command line's standard streams as the shell gave them, closed ones included, and the one
reader of stdin.

A shell can start ggtool with stdin, stdout or stderr closed (`<&-`, `>&-`, `2>&-`). Python then
sets sys.stdin (sys.stdout, sys.stderr) to None, and the descriptor is free: the next file ggtool
opens (a model, an output's temporary file) would get it, and whatever is written to fd 1 or 2
would land in that file. `adopt` (ggtool.commands.console's second line) puts /dev/null on each
closed descriptor, so none is ever reused, and gives Python a stream for it: reading a closed
stdin, or writing data to a closed stdout, is one clear error line (exit 1), as a C tool's `write
error: Bad file descriptor`; a closed stderr swallows the diagnostics (the exit status still
says how it went). A command that never touches a closed stream runs as usual.

Light (os, sys, io): it runs before click and numpy load.
"""

from __future__ import annotations

import errno
import io
import os
import sys

from ggtool.errors import GGToolError

NAMES = {0: "stdin", 1: "stdout", 2: "stderr"}
CLOSED_BY = {0: "<&-", 1: ">&-", 2: "2>&-"}


class ClosedStream(io.TextIOBase):
    """sys.stdin or sys.stdout for a descriptor the shell closed: reading and writing fail with an
    OSError whose text is the one line the command line prints."""

    def __init__(self, fd: int):
        super().__init__()
        self.fd = fd

    @property
    def name(self) -> str:
        return f"<{NAMES[self.fd]}>"

    @property
    def buffer(self):   # sys.stdin.buffer, sys.stdout.buffer: the same closed stream
        return self

    def readable(self) -> bool:
        return self.fd == 0

    def writable(self) -> bool:
        return self.fd != 0

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise self.error()

    def read(self, size: int | None = -1):
        raise self.error()

    def readline(self, size: int | None = -1):
        raise self.error()

    def write(self, data) -> int:
        raise self.error()

    def flush(self) -> None:   # nothing is ever buffered
        pass

    def error(self) -> OSError:
        what = "nothing can be read from it" if self.fd == 0 else "the output has nowhere to go"
        return OSError(errno.EBADF, f"{NAMES[self.fd]} is closed ({CLOSED_BY[self.fd]}): {what}")


def is_closed(stream) -> bool:
    return stream is None or isinstance(stream, ClosedStream)


def adopt() -> None:
    """/dev/null on each standard descriptor that is closed, and a stream for it in sys: a
    ClosedStream for stdin and stdout, a sink for stderr."""
    for fd, attr in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        if getattr(sys, attr) is not None or _is_open(fd):
            continue
        null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd, inheritable=True)
            os.close(null)
        else:
            os.set_inheritable(fd, True)
        if fd == 2:
            setattr(sys, attr, open(fd, "w", encoding="utf-8", errors="backslashreplace", closefd=False))
        else:
            setattr(sys, attr, ClosedStream(fd))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def read_stdin(what: str, limit: int | None = None) -> bytes:
    """All of stdin (at most limit + 1 bytes, so that a caller can tell it was more), for `what`
    ("the text", "the program", "--tensor x"): a GGToolError naming stdin if it is closed or
    cannot be read."""
    stream = sys.stdin
    if is_closed(stream):
        raise GGToolError(f"stdin is closed ({CLOSED_BY[0]}): nothing to read {what} from")
    raw = getattr(stream, "buffer", stream)
    try:
        data = raw.read() if limit is None else raw.read(limit + 1)
    except OSError as e:
        raise GGToolError(f"stdin cannot be read ({e.strerror or e}): nothing to read {what} from") from None
    return data if isinstance(data, bytes) else data.encode("utf-8", "surrogateescape")
