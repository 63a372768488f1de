"""Converting a planned model's tensor data: pieces of rows.

Exists to keep the mechanics of conversion apart from the rules (`.rules`) and from the writing
loop (`.write`): reading source rows, dequantizing them to
float32 exactly as gguf-py's ``dequantize`` does and quantizing with ``ggtool.quant`` (byte-identical
to GGML), naming the first NaN/inf on failure, cutting the work into pieces and windows, and
copying unchanged tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import quant as Q
from .. import types as T
from ..errors import QuantizationError
from ..gguf_io.write import copy_file_bytes
from .rules import QuantizePlan, TensorPlan


def source_rows(path: str, offset: int, src_type: T.GGMLType, ne0: int, r0: int, r1: int) -> np.ndarray:
    """Rows r0..r1 of the tensor at `offset` in `path`, mapped: float values, or raw block bytes."""
    from ..gguf_io.storage import FileStorage
    rb = T.row_size(src_type, ne0)
    raw = FileStorage(path).array[offset + r0 * rb: offset + r1 * rb]
    raw = raw.reshape(r1 - r0, rb)
    if T.is_quantized(src_type) or src_type == T.GGMLType.BF16:
        return raw
    return raw.view(T.np_dtype(src_type))


def convert_rows(x, src_type: T.GGMLType, dst_type: T.GGMLType, name: str, shape, r0: int, imatrix=None) -> bytes:
    """Convert rows [r0, r0+len(x)) of a tensor (numpy `shape`); errors name the full-tensor index.
    `imatrix`: importances per column, or (n_expert, columns) for a 3-d tensor, whose rows r of
    expert r // rows-per-expert take that expert's (llama.cpp's chunks stop at expert boundaries)."""
    try:
        if src_type in (T.F32, T.F16) and dst_type in (T.Q4_0, T.Q8_0, T.F16, T.F32):
            vals = np.asarray(x, dtype=np.float32) if src_type == T.F16 else x
        else:
            vals = Q.dequantize(x, src_type)
        if imatrix is None or np.ndim(imatrix) == 1:
            out = Q.quantize(vals, dst_type, name, imatrix=imatrix)
        else:
            per = shape[-2]
            cuts = [0] + [e * per - r0 for e in range(r0 // per + 1, (r0 + len(vals) - 1) // per + 1)] + [len(vals)]
            out = np.concatenate([np.ascontiguousarray(Q.quantize(vals[a:b], dst_type, name, imatrix=imatrix[(r0 + a) // per]))
                                  .view(np.uint8).reshape(b - a, -1) for a, b in zip(cuts, cuts[1:])])
    except QuantizationError as e:
        raise _relocate(e, x if src_type in (T.F32, T.F16) else Q.dequantize(x, src_type), name,
                        shape, r0) from None
    raw = np.ascontiguousarray(out).view(np.uint8).reshape(-1)
    _check_written(raw, vals, dst_type, name, shape, r0)
    return raw.tobytes()


# byte offsets of the f16 fields (d, and m where there is one) in a block of the types ggtool writes
_F16_FIELDS = {T.Q4_0: (0,), T.Q8_0: (0,), T.GGMLType.Q5_0: (0,), T.GGMLType.Q4_1: (0, 2), T.GGMLType.Q5_1: (0, 2),
               T.GGMLType.Q2_K: (80, 82), T.GGMLType.Q3_K: (108,), T.GGMLType.Q4_K: (0, 2),
               T.GGMLType.Q5_K: (0, 2), T.GGMLType.Q6_K: (208,)}


def _check_written(raw: np.ndarray, vals, dst_type: T.GGMLType, name: str, shape, r0: int) -> None:
    """ggml_validate_row_data on converted rows before they are written: no inf or NaN in an f32,
    f16 or bf16 value nor in a block's f16 scale. llama-quantize refuses such a tensor too
    ("quantized data validation failed"); this error names the tensor, the value and its index:
    70000 in a row that falls back to f16 (largest 65504), a q4_0 block whose values reach 524288."""
    per = 1
    if dst_type == T.F32:
        bad = ~np.isfinite(raw.view(np.float32))
    elif dst_type == T.F16:
        bad = ~np.isfinite(raw.view(np.float16))
    elif dst_type == T.BF16:
        bad = (raw.view(np.uint16) & 0x7F80) == 0x7F80
    elif dst_type in _F16_FIELDS:        # every block size is even: its f16 fields are uint16 columns
        blocks = raw.view(np.uint16).reshape(-1, T.type_size(dst_type) // 2)
        bad = np.zeros(len(blocks), bool)
        for o in _F16_FIELDS[dst_type]:
            bad |= (blocks[:, o // 2] & 0x7C00) == 0x7C00
        per = T.block_size(dst_type)
    else:
        return
    if not bad.any():
        return
    k = int(np.argmax(bad)) * per
    vals = np.asarray(vals, dtype=np.float32).reshape(-1)
    src = vals[k:k + per]
    fin = np.isfinite(src)
    if not fin.all():
        raise _nonfinite(vals, k + int(np.argmin(fin)), name, shape, r0)
    tn = T.type_name(dst_type)
    if per == 1:
        why = (f"; its rows of {shape[-1]} are not a multiple of 32, so llama.cpp's rules give it f16"
               if dst_type == T.F16 and shape[-1] % 32 else "")
        raise QuantizationError(f"tensor '{name}': value {float(vals[k]):g} at index {_index(shape, r0, k)} "
                                f"is too large for {tn} (it would be inf){why}")
    raise QuantizationError(f"tensor '{name}': the {tn} block at index {_index(shape, r0, k)} holds values up "
                            f"to {float(np.abs(src).max()):g}, too large for its f16 scale (it would be inf)")


def _relocate(e: QuantizationError, vals: np.ndarray, name: str, shape, r0: int) -> QuantizationError:
    vals = np.asarray(vals)
    if vals.dtype.kind != "f":
        return e
    fin = np.isfinite(vals.reshape(-1))
    if fin.all():
        return e
    return _nonfinite(vals.reshape(-1), int(np.argmin(fin)), name, shape, r0)


def _nonfinite(flat: np.ndarray, k: int, name: str, shape, r0: int) -> QuantizationError:
    v = flat[k]
    what = "NaN" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    return QuantizationError(f"tensor '{name}': cannot quantize {what} at index {_index(shape, r0, k)}")


def _index(shape, r0: int, k: int) -> tuple[int, ...]:
    """Index in the whole tensor (numpy order) of flat element k of the rows from row r0 on."""
    return tuple(int(i) for i in np.unravel_index(r0 * shape[-1] + k, shape))


@dataclass
class Piece:
    """One piece of output, in file order: a tensor copied verbatim, or rows r0..r1 converted."""

    t: TensorPlan
    r0: int = 0
    r1: int = 0
    first: bool = True
    last: bool = True

    @property
    def work(self) -> int:       # f32 bytes the conversion handles
        return 0 if self.t.copy else (self.r1 - self.r0) * self.t.ne[0] * 4


def pieces(tensors: list[TensorPlan], piece_bytes: int) -> list[Piece]:
    """The output cut into pieces in file order: each copied tensor whole, each converted one in
    row ranges of about piece_bytes of f32."""
    items = []
    for t in tensors:
        if t.copy:
            items.append(Piece(t))
            continue
        ne0 = t.ne[0]
        nrows = t.n_elements // ne0 if ne0 else 0
        rows = max(1, piece_bytes // (4 * max(ne0, 1)))
        starts = list(range(0, nrows, rows)) or [0]
        for k, r0 in enumerate(starts):
            items.append(Piece(t, r0, min(nrows, r0 + rows), k == 0, k == len(starts) - 1))
    return items


def windows(items: list[Piece], window_bytes: int):
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


def npy_rows(plan: QuantizePlan, it: Piece) -> np.ndarray:
    ne0 = it.t.ne[0]
    x = np.asarray(plan.npy.reshape(-1, ne0)[it.r0:it.r1])
    return x.astype(np.float32) if x.dtype == np.float64 else x


def copy_tensor(plan: QuantizePlan, t: TensorPlan, out_fd: int, write, on_bytes) -> None:
    if plan.npy is not None:
        a = np.ascontiguousarray(plan.npy, dtype=np.float16 if t.src_type == T.F16 else np.float32)
        write(a.view(np.uint8).reshape(-1))
        return
    copy_file_bytes(t.src_path, t.src_offset, t.src_bytes, out_fd, write, on_bytes)
