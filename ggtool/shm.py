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
from multiprocessing import resource_tracker, shared_memory

import numpy as np

try:
    import _posixshmem
except ImportError:  # pragma: no cover (not POSIX)
    _posixshmem = None

PREFIX = "ggtool_"
PAGE = mmap.PAGESIZE


def _path(name: str) -> str:
    return "/" + name


def attach(name: str, size: int) -> np.ndarray:
    """Map an existing segment read-write; the array keeps the mapping alive."""
    if _posixshmem is not None:
        fd = _posixshmem.shm_open(_path(name), os.O_RDWR, mode=0o600)
    else:  # pragma: no cover
        fd = os.open(os.path.join("/dev/shm", name), os.O_RDWR)
    try:
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=np.uint8)


class Segment:
    """A named segment this process created. `array` is the whole segment as uint8."""

    __slots__ = ("name", "size", "array", "_shm", "__weakref__")

    def __init__(self, size: int):
        size = max(PAGE, -(-int(size) // PAGE) * PAGE)
        name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
        self._shm = shared_memory.SharedMemory(name=name, create=True, size=size)
        self._shm.close()  # its own mapping is not used; the name stays until unlink()
        self.name, self.size = name, size
        try:
            self.array = attach(name, size)
        except BaseException:
            self.unlink()
            raise

    @property
    def linked(self) -> bool:
        return self._shm is not None

    def unlink(self) -> None:
        """Remove the name (idempotent). Mappings, ours and the workers', stay valid until dropped."""
        shm, self._shm = self._shm, None
        if shm is None:
            return
        try:
            shm.unlink()  # shm_unlink + resource_tracker.unregister
        except FileNotFoundError:
            resource_tracker.unregister(shm._name, "shared_memory")

    def __repr__(self) -> str:
        state = "" if self.linked else ", unlinked"
        return f"<Segment {self.name} {self.size} bytes{state}>"


def list_segments() -> list[str]:
    """Names of ggtool segments in /dev/shm (Linux), for tests and diagnostics."""
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(PREFIX))
    except FileNotFoundError:  # pragma: no cover
        return []
