"""Tensor data that lives outside the pool: a read-only memory map of a file (GGUF weights).

Picklable by path, so every worker process maps the same file itself (shared page cache, no copy).
"""

from __future__ import annotations

import mmap
import os
import signal
import sys

import numpy as np

from .. import role
from ..errors import InputError

_MAPS: dict[str, tuple[int, np.ndarray, dict]] = {}  # per process: path -> (mtime_ns, map, derived), newest only


class FileStorage:
    __slots__ = ("path", "_map", "opened")

    def __init__(self, path: str | os.PathLike):
        self.path = os.path.abspath(os.fspath(path))
        self._map = None
        try:   # the file as it was when this storage was made (a worker's copy keeps its maker's)
            self.opened = _identity(os.stat(self.path))
        except OSError:
            self.opened = None

    def _mapped(self) -> tuple:
        if self._map is None:
            try:
                st = os.stat(self.path)
            except OSError as e:
                raise InputError(f"{self.path} can no longer be read ({e.strerror}): it was removed or "
                                 f"replaced while in use?") from None
            if self.opened is not None and _identity(st) != self.opened:
                raise InputError(self._changed(st.st_size))
            cached = _MAPS.get(self.path)
            if cached is None or cached[0] != st.st_mtime_ns:
                if role.COMMAND_LINE:   # a library's process keeps its signals
                    guard_sigbus()
                cached = _MAPS[self.path] = (st.st_mtime_ns, np.memmap(self.path, dtype=np.uint8, mode="r"), {})
            self._map = cached
        return self._map

    def _changed(self, size: int) -> str:
        """Why a file this storage has not mapped yet may not be mapped now: it is not the file its
        tensors (offsets, types, shapes) were read from. A worker that maps it only after a
        truncation is told of the truncation, as its caller is."""
        was = self.opened[1]
        if size < was:
            return f"{self.path} shrank from {was} to {size} bytes since it was opened (truncated while in use?)"
        return (f"{self.path} changed since it was opened (rewritten or replaced while in use?): its tensors "
                f"were read from the earlier file")

    @property
    def array(self) -> np.ndarray:
        """The whole file, mapped once per process (per modification time: a rewritten file is
        mapped anew by the next FileStorage of it)."""
        return self._mapped()[1]

    @property
    def derived(self) -> dict:
        """A cache of what is computed from the mapped bytes (repacked weights), living and dying
        with the map: a rewritten file starts an empty one."""
        return self._mapped()[2]

    def verify(self) -> None:
        """Refuse to compute on a map whose file has since shrunk: reading its lost pages would end
        the process with SIGBUS. (A truncation during the compute is caught by `guard_sigbus`.)"""
        if self._map is not None:
            lost = _shrunk(self.path, len(self._map[1]))
            if lost:
                raise InputError(lost)

    def release(self, view: np.ndarray) -> None:
        """Unmap this process's pages of `view` (bytes of this file, now repacked elsewhere): they
        leave our resident set, stay in the page cache, and come back on the next read. Without
        this a model's weights count twice in a process that repacks them, as file pages and as
        packed copies. Only whole pages inside the view are dropped."""
        mm = self._mapped()[1]
        raw = getattr(mm, "_mmap", None)
        if raw is None or not hasattr(mmap, "MADV_DONTNEED") or view.size == 0:
            return
        start = view.__array_interface__["data"][0] - mm.__array_interface__["data"][0]
        if start < 0 or start + view.nbytes > len(mm):
            return
        lo = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        hi = (start + view.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if hi > lo:
            try:
                raw.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
            except (OSError, ValueError):  # pragma: no cover - advice only
                pass

    def __getstate__(self):
        return self.path, self.opened

    def __setstate__(self, state):
        self.path, self.opened = state
        self._map = None

    def __eq__(self, other) -> bool:
        return isinstance(other, FileStorage) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"FileStorage({self.path!r})"


def _identity(st: os.stat_result) -> tuple:
    """What tells one file from another at a path: its inode, size and modification time."""
    return st.st_dev, st.st_size, st.st_ino, st.st_mtime_ns


def _shrunk(path: str, mapped: int) -> str | None:
    try:
        size = os.stat(path).st_size
    except OSError:
        size = 0
    if size >= mapped:
        return None
    return f"{path} shrank from {mapped} to {size} bytes while memory-mapped (truncated while in use?)"


def shrunk() -> list[str]:
    """What went wrong with this process's mapped files, if any is now shorter than its map."""
    found = (_shrunk(path, len(m[1])) for path, m in list(_MAPS.items()))
    return [lost for lost in found if lost]


_GUARD = None   # the installed handler (a ctypes function that must stay alive)


def guard_sigbus() -> None:
    """Make SIGBUS, which a read of a mapped file truncated under us raises, end this process with one
    `Error:` line naming the file and exit status 1 instead of a crash with no word (the command line
    installs it; a library leaves its process's signals alone). A forked worker dies of it as before,
    and its caller reports the death with the same diagnosis (pool.caller).

    Python's own signal handlers run between bytecodes, after the faulting read has been retried for
    ever; this one is a C-level handler (through ctypes) that writes the line and leaves at once: the
    pool's segments are unlinked first."""
    global _GUARD
    if _GUARD is not None or not hasattr(signal, "SIGBUS"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        install = libc.signal
    except (OSError, AttributeError):  # pragma: no cover - no C library to ask
        return
    install.restype, install.argtypes = ctypes.c_void_p, (ctypes.c_int, ctypes.c_void_p)
    owner = os.getpid()

    def on_sigbus(signum: int) -> None:
        if os.getpid() != owner:    # a forked worker: die of the signal (the read is retried), the caller reports it
            install(signum, int(signal.SIG_DFL))
            return
        why = "; ".join(shrunk()) or "a memory-mapped input could not be read (bus error: a file truncated while in use?)"
        os.write(2, f"Error: {why}\n".encode("utf-8", "replace"))
        shm = sys.modules.get("ggtool.pool.shm")
        if shm is not None:     # the pool's segments: its workers, left without a caller, then end
            shm.remove_orphans(owner)
        os._exit(1)

    _GUARD = ctypes.CFUNCTYPE(None, ctypes.c_int)(on_sigbus)
    install(int(signal.SIGBUS), ctypes.cast(_GUARD, ctypes.c_void_p).value)
