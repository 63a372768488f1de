"""POSIX shared memory for the worker pool: named segments mapped as numpy uint8 arrays.

The creating process (the pool's caller) makes each segment (`shm_open` with O_EXCL, `ftruncate`)
and maps it as a plain `mmap` that numpy views can keep alive for as long as they exist. Only the
creator unlinks, exactly once: when the context or pool that used it is done, on an error or a
signal, at exit. Should the creator die before it could (SIGKILL), its pool's workers, which see
their life pipe close, remove the segments named after it (`remove_orphans`); should they die with
it (SIGKILL of the whole process group), the next pool to start removes them (`remove_dead_owners`). Python's
`multiprocessing.shared_memory` is not used: its resource tracker, a third Python process started
with the first segment, cost ~25 ms of every pooled command's start on 2 cores.

Worker processes attach with `attach()`: the same `shm_open` + `mmap`.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from ..errors import GGToolError
from ..interrupts import process_alive, signals_held

try:
    import _posixshmem
except ImportError:  # pragma: no cover (not POSIX)
    _posixshmem = None

PREFIX = "ggtool_"
_SHM_DIR = "/dev/shm"   # where Linux shows POSIX shared memory
PAGE = mmap.PAGESIZE


class SharedMemoryError(GGToolError):
    """The worker pool cannot have the shared memory it needs: `needed` bytes where /dev/shm has
    `free` (None: this system has no POSIX shared memory). Computing in one process needs none."""

    def __init__(self, needed: int, free: int | None):
        self.needed, self.free = needed, free
        if free is None:
            super().__init__("the worker pool needs POSIX shared memory, which this system lacks "
                             "(compute on one thread)")
        else:
            super().__init__(f"not enough shared memory for the worker pool: the context needs {needed} bytes, "
                             f"/dev/shm has {free} free (enlarge /dev/shm or compute on one thread)")


def _path(name: str) -> str:
    return "/" + name


_MADV_POPULATE_WRITE = 23   # Linux 5.14


def _map(name: str, size: int) -> mmap.mmap:
    fd = _posixshmem.shm_open(_path(name), os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def attach(name: str, size: int) -> np.ndarray:
    """Map an existing segment read-write; the array keeps the mapping alive."""
    return np.frombuffer(_map(name, size), dtype=np.uint8)


def _nonzero(chunk: np.ndarray) -> bool:
    whole = len(chunk) // 8 * 8
    return bool(chunk[:whole].view(np.uint64).any() or chunk[whole:].any())


class Segment:
    """A named segment this process created. `array` is the whole segment as uint8."""

    __slots__ = ("_mm", "_pid", "array", "linked", "name", "size")

    def __init__(self, size: int):
        if _posixshmem is None:  # pragma: no cover
            raise SharedMemoryError(size, None)
        size = max(PAGE, -(-int(size) // PAGE) * PAGE)
        self.name, self.size, self._pid = f"{PREFIX}{os.getpid()}_{os.urandom(6).hex()}", size, os.getpid()
        self.linked = False
        with signals_held():  # Ctrl-C now would leave a named segment nobody knows of
            fd = _posixshmem.shm_open(_path(self.name), os.O_RDWR | os.O_CREAT | os.O_EXCL, mode=0o600)
            self.linked = True
            try:
                os.ftruncate(fd, size)
                self._mm = mmap.mmap(fd, size)
                self.array = np.frombuffer(self._mm, dtype=np.uint8)
            except BaseException:
                self.unlink()
                raise
            finally:
                os.close(fd)

    def fill(self, data: np.ndarray, ranges=None, chunk: int = 1 << 22, populate: int = 1 << 28) -> None:
        """Copy `data` (uint8) to the start of this new, zero-filled segment: the byte ranges
        [start, end) of `ranges` (sorted, not overlapping; all of `data` by default). Bytes outside
        them stay zero, and their pages are never allocated.

        The pages of each range are first allocated and mapped by madvise, `populate` bytes at a
        time, rather than by a page fault per 4 KiB page (shared memory gets no huge pages), in the
        copy or later in the compute: 2-4x faster for 2.4 GB here. All-zero chunks (a context's
        results before they are computed) are then left as they are, not copied. Where the kernel
        cannot populate (before Linux 5.14), the pages fault in as they are written. A signal is
        handled between steps (one madvise of many GB would hold off Ctrl-C or SIGTERM for seconds)."""
        advice = getattr(mmap, "MADV_POPULATE_WRITE", _MADV_POPULATE_WRITE)
        if ranges is None:
            ranges = [(0, len(data))]
        for lo, hi in ranges:
            hi = min(hi, len(data))
            for start in range(lo, hi, populate):
                end = min(hi, start + populate)
                if end - start >= PAGE and advice is not None:
                    first = start // PAGE * PAGE   # madvise starts on a page
                    try:
                        self._mm.madvise(advice, first, end - first)
                    except (OSError, ValueError):
                        advice = None
                for a in range(start, end, chunk):
                    src = data[a: min(end, a + chunk)]
                    if _nonzero(src):
                        self.array[a: a + len(src)] = src

    def unlink(self) -> None:
        """Remove the name (idempotent). Mappings, ours and the workers', stay valid until dropped.

        Safe in a garbage-collection callback (one system call, no lock)."""
        if not self.linked:
            return
        self.linked = False
        if os.getpid() != self._pid:
            return  # a forked child: the segment is its parent's to remove
        try:
            _posixshmem.shm_unlink(_path(self.name))
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        state = "" if self.linked else ", unlinked"
        return f"<Segment {self.name} {self.size} bytes{state}>"


def remove_orphans(pid: int) -> list[str]:
    """Unlink every segment process `pid` created (their names start with ggtool_<pid>_), for a
    worker whose caller died without removing them; returns their names."""
    gone = []
    for name in list_segments():
        if name.startswith(f"{PREFIX}{pid}_"):
            try:
                _posixshmem.shm_unlink(_path(name))
                gone.append(name)
            except OSError:
                pass
    return gone


def remove_dead_owners() -> list[str]:
    """Unlink every ggtool segment of this user whose creator (the pid in its name) is dead, and
    return their names: what a SIGKILL of a whole process group, caller and workers together,
    leaves behind (no one was left to run `remove_orphans`). A pool does it when it starts: one
    listing of /dev/shm. A creator's pid reused by a live process keeps its segments until that
    process is gone too."""
    gone = []
    for name in list_segments():
        pid = name[len(PREFIX):].split("_", 1)[0]
        if not pid.isdigit() or process_alive(int(pid)):
            continue
        try:
            if os.stat(os.path.join(_SHM_DIR, name), follow_symlinks=False).st_uid != os.geteuid():
                continue
            _posixshmem.shm_unlink(_path(name))
            gone.append(name)
        except OSError:
            pass
    return gone


def list_segments() -> list[str]:
    """Names of ggtool segments in /dev/shm (Linux), for tests and diagnostics."""
    try:
        return sorted(n for n in os.listdir(_SHM_DIR) if n.startswith(PREFIX))
    except FileNotFoundError:  # pragma: no cover
        return []
