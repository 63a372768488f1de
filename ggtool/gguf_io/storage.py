"""Tensor data that lives outside the pool: a read-only memory map of a file (GGUF weights).

Picklable by path, so every worker process maps the same file itself (shared page cache, no copy).
"""

from __future__ import annotations

import mmap
import os

import numpy as np

_MAPS: dict[str, tuple[int, np.ndarray, dict]] = {}  # per process: path -> (mtime_ns, map, derived), newest only


class FileStorage:
    __slots__ = ("path", "_map")

    def __init__(self, path: str | os.PathLike):
        self.path = os.path.abspath(os.fspath(path))
        self._map = None

    def _mapped(self) -> tuple:
        if self._map is None:
            mtime = os.stat(self.path).st_mtime_ns
            cached = _MAPS.get(self.path)
            if cached is None or cached[0] != mtime:
                cached = _MAPS[self.path] = (mtime, np.memmap(self.path, dtype=np.uint8, mode="r"), {})
            self._map = cached
        return self._map

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
        return self.path

    def __setstate__(self, state):
        self.path = state
        self._map = None

    def __eq__(self, other) -> bool:
        return isinstance(other, FileStorage) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"FileStorage({self.path!r})"
