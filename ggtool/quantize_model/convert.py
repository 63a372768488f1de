"""Converting a planned model's tensor data: pieces of rows.

Exists to keep the mechanics of conversion apart from the rules (`.rules`) and from the writing
loop (the package itself, `ggtool.quantize_model`): reading source rows, dequantizing them to
float32 exactly as gguf-py's ``dequantize`` does and quantizing with ``ggtool.quant`` (byte-identical
to GGML), naming the first NaN/inf on failure, cutting the work into pieces and windows, and
copying unchanged tensors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .. import quant as Q
from .. import types as T
from ..errors import QuantizationError
from .rules import QuantizePlan, TensorPlan


def _source_rows(path: str, offset: int, src_type: T.GGMLType, ne0: int, r0: int, r1: int) -> np.ndarray:
    from ..gguf_io.storage import FileStorage
    rb = T.row_size(src_type, ne0)
    raw = FileStorage(path).array[offset + r0 * rb: offset + r1 * rb]
    raw = raw.reshape(r1 - r0, rb)
    if T.is_quantized(src_type) or src_type == T.GGMLType.BF16:
        return raw
    return raw.view(T.np_dtype(src_type))


def _convert_rows(x, src_type: T.GGMLType, dst_type: T.GGMLType, name: str, shape, r0: int) -> bytes:
    """Convert rows [r0, r0+len(x)) of a tensor (numpy `shape`); errors name the full-tensor index."""
    try:
        if src_type in (T.F32, T.F16) and dst_type in (T.Q4_0, T.Q8_0, T.F16, T.F32):
            vals = np.asarray(x, dtype=np.float32) if src_type == T.F16 else x
        else:
            vals = Q.dequantize(x, src_type)
        out = Q.quantize(vals, dst_type, name)
    except QuantizationError as e:
        raise _relocate(e, x if src_type in (T.F32, T.F16) else Q.dequantize(x, src_type), name,
                        shape, r0) from None
    return np.ascontiguousarray(out).view(np.uint8).tobytes()


def _relocate(e: QuantizationError, vals: np.ndarray, name: str, shape, r0: int) -> QuantizationError:
    vals = np.asarray(vals)
    if vals.dtype.kind != "f":
        return e
    fin = np.isfinite(vals.reshape(-1))
    if fin.all():
        return e
    k = int(np.argmin(fin))
    v = vals.reshape(-1)[k]
    flat = r0 * vals.shape[-1] + k
    idx = tuple(int(i) for i in np.unravel_index(flat, shape))
    what = "NaN" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    return QuantizationError(f"tensor '{name}': cannot quantize {what} at index {idx}")


@dataclass
class _Item:
    """One piece of output, in file order: a tensor copied verbatim, or rows r0..r1 converted."""

    t: TensorPlan
    r0: int = 0
    r1: int = 0
    first: bool = True
    last: bool = True

    @property
    def work(self) -> int:       # f32 bytes the conversion handles
        return 0 if self.t.copy else (self.r1 - self.r0) * self.t.ne[0] * 4


def _items(plan: QuantizePlan, piece_bytes: int) -> list[_Item]:
    items = []
    for t in plan.tensors:
        if t.copy:
            items.append(_Item(t))
            continue
        ne0 = t.ne[0]
        nrows = t.n_elements // ne0 if ne0 else 0
        rows = max(1, piece_bytes // (4 * max(ne0, 1)))
        starts = list(range(0, nrows, rows)) or [0]
        for k, r0 in enumerate(starts):
            items.append(_Item(t, r0, min(nrows, r0 + rows), k == 0, k == len(starts) - 1))
    return items


def _windows(items: list[_Item], window_bytes: int):
    """Consecutive runs of items holding about window_bytes of conversion work."""
    cur, work = [], 0
    for it in items:
        cur.append(it)
        work += it.work
        if work >= window_bytes:
            yield cur
            cur, work = [], 0
    if cur:
        yield cur


def _npy_rows(plan: QuantizePlan, it: _Item) -> np.ndarray:
    ne0 = it.t.ne[0]
    x = np.asarray(plan.npy.reshape(-1, ne0)[it.r0:it.r1])
    return x.astype(np.float32) if x.dtype == np.float64 else x


def _copy_tensor(plan: QuantizePlan, t: TensorPlan, out_fd: int, write, on_bytes) -> None:
    if plan.npy is not None:
        a = np.ascontiguousarray(plan.npy, dtype=np.float16 if t.src_type == T.F16 else np.float32)
        write(a.view(np.uint8).reshape(-1))
        return
    step = 64 << 20
    with open(plan.input, "rb") as src:
        done = 0
        while done < t.src_bytes:
            n = min(step, t.src_bytes - done)
            try:
                k = os.copy_file_range(src.fileno(), out_fd, n, t.src_offset + done)
            except (AttributeError, OSError):
                k = 0
            if k <= 0:   # no copy_file_range here (or it refused): through the memory map
                from ..gguf_io.storage import FileStorage
                write(FileStorage(plan.input).array[t.src_offset + done: t.src_offset + done + n])
                k = n
            done += k
            if on_bytes:
                on_bytes(k)

