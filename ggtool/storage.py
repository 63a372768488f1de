"""Tensor data that lives outside the pool: a read-only memory map of a file (GGUF weights).

Picklable by path, so every worker process maps the same file itself (shared page cache, no copy).
"""

from __future__ import annotations

import os

import numpy as np

_MAPS: dict[str, tuple[int, np.ndarray]] = {}  # per process: path -> (mtime_ns, whole-file map), newest only


class FileStorage:
    __slots__ = ("path", "_array")

    def __init__(self, path: str | os.PathLike):
        self.path = os.path.abspath(os.fspath(path))
        self._array = None

    @property
    def array(self) -> np.ndarray:
        """The whole file, mapped once per process (per modification time: a rewritten file is
        mapped anew by the next FileStorage of it)."""
        if self._array is None:
            mtime = os.stat(self.path).st_mtime_ns
            cached = _MAPS.get(self.path)
            if cached is None or cached[0] != mtime:
                cached = _MAPS[self.path] = (mtime, np.memmap(self.path, dtype=np.uint8, mode="r"))
            self._array = cached[1]
        return self._array

    def __getstate__(self):
        return self.path

    def __setstate__(self, state):
        self.path = state
        self._array = None

    def __eq__(self, other) -> bool:
        return isinstance(other, FileStorage) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"FileStorage({self.path!r})"
