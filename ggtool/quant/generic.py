"""Type-generic entry points: ``quantize`` / ``dequantize`` / ``convert`` between any GGML types:
F16 and BF16 here, every block type by its ``ggtool.qtypes`` record (its quantizers on the quantizer
threads, with or without an importance matrix; its dequantizer), Q4_0 and Q8_0 without one by their
own drivers (numpy twins for small work), the rest through gguf-py; the integer types checked for
range and integrality."""

from __future__ import annotations

import functools

import numpy as np

from .. import types as T
from ..errors import QuantizationError
from .bf16 import bf16_to_fp32, fp32_to_bf16
from .blocks import _F32, check_finite
from .f16 import fp32_to_fp16
from .q4_0 import dequantize_q4_0, quantize_q4_0
from .q8_0 import dequantize_q8_0, quantize_q8_0


def _gguf_quants():
    import gguf.quants as gq
    return gq


def _record(t):
    """The ``ggtool.qtypes`` record of type t, or None (the types it has no record for)."""
    from .. import qtypes
    return qtypes.REGISTRY.get(t)


def can_quantize(t) -> bool:
    """Whether quantize() can produce type t (natively, by a qtypes record, or through gguf-py)."""
    t = T.parse_type(t)
    if t in (T.F32, T.F16, T.BF16) or _record(t) is not None:
        return True
    return _gguf_can(t, "quantize")


def can_dequantize(t) -> bool:
    t = T.parse_type(t)
    if t in T.NP_DTYPES or t == T.BF16 or _record(t) is not None:
        return True
    return _gguf_can(t, "dequantize")


@functools.lru_cache(maxsize=None)
def _gguf_can(t: T.GGMLType, way: str) -> bool:
    """Whether gguf-py's public quantize / dequantize takes type t, asked of one block of zeros:
    gguf-py says NotImplementedError for a type it lacks, or whose way it has not written."""
    gq = _gguf_quants()
    block = (np.zeros((1, T.block_size(t)), _F32) if way == "quantize"
             else np.zeros((1, T.type_size(t)), np.uint8))
    try:
        with np.errstate(all="ignore"):
            getattr(gq, way)(block, t)
    except NotImplementedError:
        return False
    return True


def quantize(x, ggml_type, name: str = "tensor", imatrix=None) -> np.ndarray:
    """x (float values, numpy order) in ggml_type: a typed array for F32/F16/I32, bytes otherwise
    (BF16: the bytes of its uint16 bits, (..., 2n); NaN and inf are values there, as in F16).

    `imatrix` (one importance per column, x.shape[-1] floats, as llama-quantize passes it to
    ggml_quantize_chunk) selects GGML's weighted path of the qtypes records' types that read it
    (all but Q8_0); the other types ignore it, as GGML does. For a 3-d (MoE) x, `imatrix` may be (n_expert, columns): each expert its own."""
    t = T.parse_type(ggml_type)
    if t == T.Q4_0 and imatrix is None:
        return quantize_q4_0(x, name)
    if t == T.Q8_0:
        return quantize_q8_0(x, name)
    record = _record(t)
    if record is not None:
        return _quantize_record(record, x, name, imatrix)
    x = np.asarray(x)
    if t == T.F32:
        return x.astype(_F32)
    if t == T.F16:
        return fp32_to_fp16(x)
    if t == T.BF16:
        bits = fp32_to_bf16(x.reshape(1) if x.ndim == 0 else x)
        return bits.view(np.uint8)
    if t in T.NP_DTYPES:
        return _to_int(x, t, name)
    if not can_quantize(t):
        raise QuantizationError(f"tensor '{name}': cannot quantize to {T.type_name(t)} (not implemented)")
    blk = T.block_size(t)
    if x.ndim == 0 or x.shape[-1] % blk:
        n = x.shape[-1] if x.ndim else 1
        raise QuantizationError(f"tensor '{name}': row length {n} is not a multiple of {blk} "
                                f"({T.type_name(t)} block size)")
    check_finite(x, name)
    return np.asarray(_gguf_quants().quantize(x.astype(_F32, copy=False), t))


def dequantize(raw, ggml_type) -> np.ndarray:
    """float32 values of data stored as ggml_type (bytes (..., row_bytes) for block types)."""
    t = T.parse_type(ggml_type)
    if t == T.Q4_0:
        return dequantize_q4_0(raw)
    if t == T.Q8_0:
        return dequantize_q8_0(raw)
    raw = np.asarray(raw)
    if t in T.NP_DTYPES:
        dt = T.np_dtype(t)
        if raw.dtype != dt:
            raw = raw.view(dt) if raw.dtype == np.uint8 else raw.astype(dt)
        return raw.astype(_F32)
    record = _record(t)
    if record is not None:
        return record.dequantize(raw)
    if t == T.BF16:
        return bf16_to_fp32(raw)
    try:
        out = _gguf_quants().dequantize(np.ascontiguousarray(raw), t)
    except NotImplementedError:
        raise QuantizationError(f"cannot dequantize {T.type_name(t)} data (gguf-py has no "
                                f"dequantizer for it)") from None
    return np.asarray(out, dtype=_F32)


def _quantize_record(record, x, name: str, imatrix) -> np.ndarray:
    """x in a qtypes record's type, its rows over the quantizer threads (``threads``); a 2-d
    imatrix gives expert e of a 3-d x the importances imatrix[e], as llama-quantize does."""
    from .threads import _run_chunks

    qw = None if imatrix is None else np.asarray(imatrix)
    if qw is None or qw.ndim != 2:
        return record.quantize(x, qw, name=name, run=_run_chunks)
    x = np.asarray(x)
    if x.ndim != 3 or x.shape[0] != qw.shape[0]:
        raise QuantizationError(f"tensor '{name}': an importance matrix of {qw.shape[0]} experts "
                                f"does not fit data of shape {x.shape}")
    if not len(qw):
        return record.quantize(x, None, name=name, run=_run_chunks)
    return np.stack([record.quantize(x[e], qw[e], name=name, run=_run_chunks) for e in range(len(qw))])


def _to_int(x: np.ndarray, t, name: str) -> np.ndarray:
    dt = T.np_dtype(t)
    if x.dtype.kind in "iub":
        info = np.iinfo(dt)
        if x.size and (x.min() < info.min or x.max() > info.max):
            bad = np.flatnonzero((x.reshape(-1) < info.min) | (x.reshape(-1) > info.max))[0]
            idx = tuple(int(i) for i in np.unravel_index(bad, x.shape))
            raise QuantizationError(f"tensor '{name}': value {x.reshape(-1)[bad]} at index {idx} "
                                    f"does not fit {T.type_name(t)}")
        return x.astype(dt)
    check_finite(x, name)
    info = np.iinfo(dt)
    flat = x.reshape(-1)
    badm = (flat != np.trunc(flat)) | (flat < info.min) | (flat > info.max)
    if badm.any():
        bad = int(np.argmax(badm))
        idx = tuple(int(i) for i in np.unravel_index(bad, x.shape))
        raise QuantizationError(f"tensor '{name}': value {flat[bad]!r} at index {idx} is not "
                                f"a {T.type_name(t)} integer")
    return x.astype(dt)


def convert(array, src_type, dst_type, name: str = "tensor") -> np.ndarray:
    """Typed conversion of `array` (data stored as src_type) to dst_type.

    Quantized data is uint8 bytes (..., row_bytes); other types are numpy arrays of their dtype.
    The result is bytes (..., row_bytes) for quantized dst types, else an array of dst's dtype.
    """
    src, dst = T.parse_type(src_type), T.parse_type(dst_type)
    a = np.asarray(array)
    if src == dst:
        if T.is_quantized(src) or src == T.BF16:
            return a if a.dtype == np.uint8 else a.view(np.uint8)
        return a.astype(T.np_dtype(src), copy=False)
    if src in T.NP_DTYPES and dst in T.NP_DTYPES and T.np_dtype(dst).kind in "iu":
        return _to_int(a.astype(T.np_dtype(src), copy=False), dst, name)
    if src in T.NP_DTYPES and T.np_dtype(src).kind in "iu":
        vals = a.astype(T.np_dtype(src), copy=False).astype(_F32)
    else:
        vals = dequantize(a, src)
    return quantize(vals, dst, name)
