"""GGML tensor types: ids, names, block sizes and type sizes (ggml_type_traits), and numpy views.

The table is GGML's own (ggml.h, ggml.c), held here rather than taken from gguf-py so that the
engine and the worker processes start without importing gguf (~60 ms); `tests/test_packaging.py`
checks it against gguf-py's GGMLQuantizationType and GGML_QUANT_SIZES, which agree but for
block_q8_1 (gguf-py 0.19 still has its old 40-byte layout: GGML's is 36, see _SIZES)."""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from .errors import GGToolError

# name, id, block size, type size (bytes per block); ids 4, 5, 31-33 and 36-38 are removed types
_TABLE = (
    ("F32", 0, 1, 4), ("F16", 1, 1, 2), ("Q4_0", 2, 32, 18), ("Q4_1", 3, 32, 20), ("Q5_0", 6, 32, 22),
    ("Q5_1", 7, 32, 24), ("Q8_0", 8, 32, 34), ("Q8_1", 9, 32, 36), ("Q2_K", 10, 256, 84),
    ("Q3_K", 11, 256, 110), ("Q4_K", 12, 256, 144), ("Q5_K", 13, 256, 176), ("Q6_K", 14, 256, 210),
    ("Q8_K", 15, 256, 292), ("IQ2_XXS", 16, 256, 66), ("IQ2_XS", 17, 256, 74), ("IQ3_XXS", 18, 256, 98),
    ("IQ1_S", 19, 256, 50), ("IQ4_NL", 20, 32, 18), ("IQ3_S", 21, 256, 110), ("IQ2_S", 22, 256, 82),
    ("IQ4_XS", 23, 256, 136), ("I8", 24, 1, 1), ("I16", 25, 1, 2), ("I32", 26, 1, 4), ("I64", 27, 1, 8),
    ("F64", 28, 1, 8), ("IQ1_M", 29, 256, 56), ("BF16", 30, 1, 2), ("TQ1_0", 34, 256, 54),
    ("TQ2_0", 35, 256, 66), ("MXFP4", 39, 32, 17), ("NVFP4", 40, 64, 36), ("Q1_0", 41, 128, 18),
)

GGMLType = IntEnum("GGMLType", [(name, i) for name, i, _, _ in _TABLE], module=__name__)
GGMLType.__doc__ = "enum ggml_type (the members and values of gguf-py's GGMLQuantizationType)"

F32, F16, Q4_0, Q8_0, I32 = GGMLType.F32, GGMLType.F16, GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.I32
BF16 = GGMLType.BF16

# numpy dtype of one element for the unquantized types (BF16 has none: see np_dtype)
NP_DTYPES = {
    GGMLType.F32: np.dtype(np.float32),
    GGMLType.F16: np.dtype(np.float16),
    GGMLType.I8: np.dtype(np.int8),
    GGMLType.I16: np.dtype(np.int16),
    GGMLType.I32: np.dtype(np.int32),
    GGMLType.I64: np.dtype(np.int64),
    GGMLType.F64: np.dtype(np.float64),
}

# CPU vec_dot_type (type_traits_cpu[].vec_dot_type): what mul_mat converts src1 to; F32 where GGML leaves it zero.
_VEC_DOT = {GGMLType.F16: GGMLType.F16, GGMLType.Q4_0: GGMLType.Q8_0, GGMLType.Q5_0: GGMLType.Q8_0,
            GGMLType.Q8_0: GGMLType.Q8_0, GGMLType.Q4_1: GGMLType.Q8_1, GGMLType.Q5_1: GGMLType.Q8_1,
            GGMLType.BF16: GGMLType.BF16, GGMLType.IQ4_NL: GGMLType.Q8_0, GGMLType.MXFP4: GGMLType.Q8_0}
_KQUANTS = {GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
            GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ3_XXS, GGMLType.IQ1_S, GGMLType.IQ3_S,
            GGMLType.IQ2_S, GGMLType.IQ4_XS, GGMLType.IQ1_M, GGMLType.TQ1_0, GGMLType.TQ2_0}

# The types ggtool computes with; the rest can be read from GGUF and converted on load.
COMPUTE_TYPES = (F32, F16, BF16, I32, Q4_0, Q8_0)


def type_name(t: GGMLType) -> str:
    """ggml_type_name: lower case, K types keep their capital K (q4_K)."""
    n = t.name.lower()
    return n[:-2] + "_K" if n.endswith("_k") else n


def parse_type(name: str | int | GGMLType) -> GGMLType:
    """A type from its ggml name (`f32`, `q4_0`, `Q4_K`), id or enum member."""
    if isinstance(name, GGMLType):
        return name
    try:
        if isinstance(name, int):
            t = GGMLType(name)
        else:
            t = GGMLType[name.strip().upper()]
    except (KeyError, ValueError):
        known = ", ".join(type_name(t) for t in COMPUTE_TYPES)
        raise GGToolError(f"unknown tensor type {name!r} (ggtool computes with {known})") from None
    return t


# (block size, type size) per type. Q8_1 is GGML's two fp16 and the codes, 36 bytes (ggml-common.h);
# it is never stored in a file, only planned and computed with (the plan's work_size).
_SIZES = {GGMLType(i): (blck, size) for _, i, blck, size in _TABLE}


def block_size(t: GGMLType) -> int:
    return _SIZES[t][0]


def type_size(t: GGMLType) -> int:
    return _SIZES[t][1]


def is_quantized(t: GGMLType) -> bool:
    return block_size(t) > 1


def pad(n: int, align: int) -> int:
    """GGML_PAD: n rounded up to a multiple of align (context memory, GGUF data, tensor alignment)."""
    return (n + align - 1) // align * align


def n_dims(ne) -> int:
    """ggml_n_dims: the dimensions up to the last one above 1 (trailing 1s do not count), at least 1."""
    for i in range(len(ne) - 1, 0, -1):
        if ne[i] > 1:
            return i + 1
    return 1


def row_size(t: GGMLType, n: int) -> int:
    """ggml_row_size: bytes of n elements of type t (n a multiple of the block size)."""
    return type_size(t) * n // block_size(t)


def np_dtype(t: GGMLType) -> np.dtype:
    """numpy dtype of one element; BF16 (no numpy dtype) as its uint16 bits; quantized types are
    viewed as raw bytes (uint8)."""
    if t == BF16:
        return np.dtype(np.uint16)
    return NP_DTYPES.get(t, np.dtype(np.uint8))


def from_np_dtype(dt: np.dtype) -> GGMLType:
    dt = np.dtype(dt)
    for t, d in NP_DTYPES.items():
        if d == dt:
            return t
    raise GGToolError(f"no GGML type for numpy dtype {dt} (use float32, float16 or int32)")


def vec_dot_type(t: GGMLType) -> GGMLType:
    if t in _KQUANTS:
        return GGMLType.Q8_K
    return _VEC_DOT.get(t, GGMLType.F32)
