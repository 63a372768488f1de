"""Where a program's input tensors and metadata come from: `Env`. `ggtool.tensor_io.Inputs`
implements it over tensor sources and GGUF files; `DictEnv` serves tests and library users."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..context import Context
from ..tensor import Tensor


@runtime_checkable
class Env(Protocol):
    read_data: bool  # False where no data is read (inspect-graph, plan): input() may use placeholders

    def tensor(self, name: str, ctx: Context) -> Tensor | None:
        """The input tensor `name`, created in ctx on first use; None if there is none."""

    def names(self) -> list[str]:
        """Every input tensor name (for "did you mean" suggestions)."""

    def metadata(self, key: str) -> Any:
        """A metadata value (GGUF key/value); raises KeyError if absent."""


# numpy dtypes GGML has no compute type for, and what DictEnv stores them as
_NARROW = {np.dtype(np.float64): np.float32, np.dtype(np.int64): np.int32, np.dtype(bool): np.int32}


class DictEnv:
    """Inputs from numpy arrays (shape (d3, d2, d1, d0) is ggml ne [d0, d1, d2, d3]).

    float64 and int64 arrays (what Python lists become) are stored as f32 and i32.
    """

    def __init__(self, tensors: dict[str, Any] | None = None, metadata: dict | None = None,
                 read_data: bool = True):
        self.read_data = read_data
        self.arrays = {k: np.asarray(v) for k, v in (tensors or {}).items()}
        self.meta = dict(metadata or {})
        self._made: dict[str, Tensor] = {}

    def tensor(self, name: str, ctx: Context) -> Tensor | None:
        if name not in self.arrays:
            return None
        t = self._made.get(name)
        if t is None or t.ctx is not ctx:
            arr = self.arrays[name]
            if arr.dtype in _NARROW:
                arr = arr.astype(_NARROW[arr.dtype])
            t = self._made[name] = ctx.new_tensor_from(arr, name=name)
        return t

    def names(self) -> list[str]:
        return list(self.arrays)

    def metadata(self, key: str) -> Any:
        return self.meta[key]
