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
from ..quant.validate import validate_row_data
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
    return np.ascontiguousarray(out).view(np.uint8).reshape(-1).tobytes()


class InvalidDataError(QuantizationError):
    """Data that ggml_validate_row_data refuses, found before it is written: `tensor`, `type` (of
    the data), `index` (numpy order, of the value or the block's first value), `field` ("value",
    or the block's scale: "d", "m", "dmin", "e"), `problem` ("NaN", "inf", ...), `cause`:
    "values" (the source's values do not fit the type), "importances" (the importance matrix's
    weights made the scale so), "copied" (the tensor is copied unchanged and holds it)."""

    kind = "invalid-data"

    def __init__(self, message: str, *, tensor: str, type: T.GGMLType, index: tuple[int, ...], field: str,
                 problem: str, cause: str):
        self.tensor, self.type, self.index, self.field, self.problem, self.cause = tensor, type, index, field, problem, cause
        super().__init__(message)


def validate_piece(data, t: TensorPlan, r0: int, source=None) -> None:
    """ggml_validate_row_data on the bytes of a piece before they are written (rows r0.. of tensor
    t, converted; or the whole tensor copied unchanged). llama-quantize refuses such data too
    ("quantized data validation failed", naming neither tensor nor block); this error names the
    tensor, the block or value (numpy index), what is wrong and why: 70000 in a row that falls
    back to f16 (largest 65504), a q4_0 block whose values reach 524288, an IQ4_NL block whose
    importances of 3e38 make its scale NaN. `source()` gives the rows' source values (float32)."""
    found = validate_row_data(t.dst_type, data)
    if found is None:
        return
    shape = tuple(t.ne[::-1])
    per = T.block_size(t.dst_type)
    k = found.index * per                                     # its first value, from row r0 on
    tn = T.type_name(t.dst_type)
    fields = dict(tensor=t.name, type=t.dst_type, index=_index(shape, r0, k), field=found.field, problem=found.problem)
    if found.problem == "unknown type":
        raise InvalidDataError(f"tensor '{t.name}' is {tn}, a type GGML does not validate (llama.cpp cannot load "
                               "it)", cause="copied", **fields)
    if t.copy:
        what = (f"{found.problem} at index {fields['index']}" if per == 1 else
                f"a {tn} block at index {fields['index']} whose {found.field} is {found.problem}")
        raise InvalidDataError(f"tensor '{t.name}' ({tn}, copied unchanged) holds {what}, which GGML refuses "
                               "(llama.cpp cannot load it)", cause="copied", **fields)
    vals = np.asarray(source(), dtype=np.float32).reshape(-1)
    src = vals[k:k + per]
    fin = np.isfinite(src)
    if not fin.all():
        raise _nonfinite(vals, k + int(np.argmin(fin)), t.name, shape, r0)
    if per == 1:
        why = (f"; its rows of {shape[-1]} are not a multiple of 32, so llama.cpp's rules give it f16"
               if t.dst_type == T.F16 and shape[-1] % 32 else "")
        raise InvalidDataError(f"tensor '{t.name}': value {float(vals[k]):g} at index {fields['index']} is too large "
                               f"for {tn} (it would be {found.problem}){why}", cause="values", **fields)
    weights = _block_importances(t, r0, k, per, shape)
    if weights is not None and validate_row_data(t.dst_type, Q.quantize(src.reshape(1, per), t.dst_type, t.name)) is None:
        raise InvalidDataError(f"tensor '{t.name}': the {tn} block at index {fields['index']} would have a "
                               f"{found.problem} f16 scale ({found.field}): its importances reach {float(np.max(weights)):g}, too "
                               f"large to weigh its values (up to {float(np.abs(src).max()):g}) with; the importance "
                               "matrix cannot be used for this tensor", cause="importances", **fields)
    raise InvalidDataError(f"tensor '{t.name}': the {tn} block at index {fields['index']} holds values up to "
                           f"{float(np.abs(src).max()):g}, too large for its f16 scale (it would be {found.problem})",
                           cause="values", **fields)


def source_values(x, src_type: T.GGMLType) -> np.ndarray:
    """Source rows as float32 values (as convert_rows reads them)."""
    return np.asarray(x, dtype=np.float32) if src_type in (T.F32, T.F16) else Q.dequantize(x, src_type)


def _block_importances(t: TensorPlan, r0: int, k: int, per: int, shape) -> np.ndarray | None:
    """The importances of the block of `per` values at flat index k from row r0 on (None without)."""
    if t.imatrix is None:
        return None
    ncols = shape[-1]
    row, col = r0 + k // ncols, k % ncols
    w = np.asarray(t.imatrix)
    if w.ndim == 2:                                            # per expert: row // rows per expert
        w = w[row // shape[-2]]
    return w[col:col + per]


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
    with np.errstate(over="ignore"):           # inf: refused by the quantizers, naming its index
        return x.astype(np.float32) if x.dtype == np.float64 else x


def npy_copy(plan: QuantizePlan, t: TensorPlan) -> np.ndarray:
    """A .npy input's array as the bytes of its own type (float64 rounded to float32)."""
    with np.errstate(over="ignore"):           # a float64 beyond float32 is inf here: the validator names it
        a = np.ascontiguousarray(plan.npy, dtype=np.float16 if t.src_type == T.F16 else np.float32)
    return a.view(np.uint8).reshape(-1)


def source_bytes(path: str, offset: int, n_bytes: int) -> np.ndarray:
    """A copied tensor's bytes in its input file, mapped (read by the validator, then copied)."""
    from ..gguf_io.storage import FileStorage
    return FileStorage(path).array[offset: offset + n_bytes]
