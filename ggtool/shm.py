"""POSIX shared memory for the worker pool: named segments mapped as numpy uint8 arrays.

The creating process (the pool's caller) makes each segment with `multiprocessing.shared_memory`, so
Python's resource tracker knows it and removes it should the process be killed before it could clean
up. The segment is then mapped once more, by name, as a plain `mmap` that numpy views can keep alive
for as long as they exist (a `SharedMemory` object cannot be closed while views of its buffer exist,
and complains when garbage-collected in that state). Only the creator unlinks, exactly once.

Worker processes attach with `attach()`: the same `shm_open` + `mmap`, without registering the name
with a resource tracker. (Python 3.11's `SharedMemory(name)` registers on attach too, and the worker's
tracker would then unlink the caller's segment and warn about a "leak" when the worker exits.)
"""

from __future__ import annotations

import mmap
import os
import secrets
import signal
import threading
from contextlib import contextmanager
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from .errors import GGToolError

try:
    import _posixshmem
except ImportError:  # pragma: no cover (not POSIX)
    _posixshmem = None

PREFIX = "ggtool_"
PAGE = mmap.PAGESIZE


@contextmanager
def signals_held():
    """Hold SIGINT and SIGTERM (their Python handlers) until the block is over, so that it completes
    or fails as a whole; a signal that came meanwhile is raised again afterwards.

    (Masking the signal would not do: any other thread of the process, a BLAS thread say, may take
    it, and Python runs the handler in the main thread at its next bytecode.)"""
    if threading.current_thread() is not threading.main_thread():
        yield  # Python runs signal handlers in the main thread only
        return
    held: list[int] = []
    saved = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        h = signal.getsignal(sig)
        if callable(h):
            saved[sig] = signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, h in saved.items():
            signal.signal(sig, h)
        for sig in dict.fromkeys(held):
            signal.raise_signal(sig)


def _path(name: str) -> str:
    return "/" + name


_MADV_POPULATE_WRITE = 23   # Linux 5.14


def attach(name: str, size: int, populate: int = 0) -> np.ndarray:
    """Map an existing segment read-write; the array keeps the mapping alive. `populate`: bytes
    from the start to allocate and map at once, for a segment about to be written whole: one
    madvise instead of a page fault per 4 KiB page (shared memory gets no huge pages), 2-4x faster
    for a 2.4 GB copy here. Where the kernel cannot, the pages fault in as they are written."""
    fd = _posixshmem.shm_open(_path(name), os.O_RDWR, mode=0o600)
    try:
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    if populate >= PAGE:
        try:
            mm.madvise(getattr(mmap, "MADV_POPULATE_WRITE", _MADV_POPULATE_WRITE), 0, populate // PAGE * PAGE)
        except (OSError, ValueError):
            pass
    return np.frombuffer(mm, dtype=np.uint8)


class Segment:
    """A named segment this process created. `array` is the whole segment as uint8."""

    __slots__ = ("_pid", "array", "linked", "name", "size")

    def __init__(self, size: int, populate: int = 0):
        """A new segment of `size` bytes (rounded up to pages); see `attach` for `populate`."""
        if _posixshmem is None:  # pragma: no cover
            raise GGToolError("the worker pool needs POSIX shared memory (use --threads 1)")
        size = max(PAGE, -(-int(size) // PAGE) * PAGE)
        self.name, self.size, self._pid = f"{PREFIX}{os.getpid()}_{secrets.token_hex(6)}", size, os.getpid()
        self.linked = False
        with signals_held():  # Ctrl-C now would leave a named segment nobody knows of
            # created and registered with the tracker; its own mapping is not used
            shared_memory.SharedMemory(name=self.name, create=True, size=size).close()
            self.linked = True
            try:
                self.array = attach(self.name, size, min(populate, size))
            except BaseException:
                self.unlink()
                raise

    def unlink(self) -> None:
        """Remove the name (idempotent). Mappings, ours and the workers', stay valid until dropped.

        Safe in a garbage-collection callback: the name goes at once, the resource tracker is told
        later (`flush`), because Python 3.11's tracker takes a non-reentrant lock that the interrupted
        code may be holding."""
        if not self.linked:
            return
        self.linked = False
        if os.getpid() != self._pid:
            return  # a forked child: the segment is its parent's to remove
        try:
            _posixshmem.shm_unlink(_path(self.name))
        except FileNotFoundError:
            pass
        _unregister.append(_path(self.name))

    def __repr__(self) -> str:
        state = "" if self.linked else ", unlinked"
        return f"<Segment {self.name} {self.size} bytes{state}>"


_unregister: list[str] = []


def flush() -> None:
    """Tell the resource tracker about the segments unlinked since the last call."""
    while _unregister:
        resource_tracker.unregister(_unregister.pop(), "shared_memory")


def list_segments() -> list[str]:
    """Names of ggtool segments in /dev/shm (Linux), for tests and diagnostics."""
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(PREFIX))
    except FileNotFoundError:  # pragma: no cover
        return []
