"""GGML tensor types. Ids, block sizes and type sizes come from gguf-py (with GGML's own size where
gguf-py's table is behind); this adds names and numpy views."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .errors import GGToolError

GGMLType = GGMLQuantizationType

F32, F16, Q4_0, Q8_0, I32 = GGMLType.F32, GGMLType.F16, GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.I32
BF16 = GGMLType.BF16

# numpy dtype of one element for the unquantized types
_NP_DTYPES = {
    GGMLType.F32: np.dtype(np.float32),
    GGMLType.F16: np.dtype(np.float16),
    GGMLType.I8: np.dtype(np.int8),
    GGMLType.I16: np.dtype(np.int16),
    GGMLType.I32: np.dtype(np.int32),
    GGMLType.I64: np.dtype(np.int64),
    GGMLType.F64: np.dtype(np.float64),
}

# CPU vec_dot_type: what mul_mat converts src1 to (spec 1.1); F32 where GGML leaves it zero.
_VEC_DOT = {GGMLType.F16: GGMLType.F16, GGMLType.Q4_0: GGMLType.Q8_0, GGMLType.Q5_0: GGMLType.Q8_0,
            GGMLType.Q8_0: GGMLType.Q8_0, GGMLType.Q4_1: GGMLType.Q8_1, GGMLType.Q5_1: GGMLType.Q8_1,
            GGMLType.BF16: GGMLType.BF16, GGMLType.IQ4_NL: GGMLType.Q8_0}
_KQUANTS = {GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
            GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ3_XXS, GGMLType.IQ1_S, GGMLType.IQ3_S,
            GGMLType.IQ2_S, GGMLType.IQ4_XS, GGMLType.IQ1_M, GGMLType.TQ1_0, GGMLType.TQ2_0}

# The types ggtool computes with; the rest can be read from GGUF and converted on load.
COMPUTE_TYPES = (F32, F16, BF16, I32, Q4_0, Q8_0)
# weight types mul_mat multiplies as they are, with a compiled dot each (ggtool.kernels.dot
# registers them: the block types' integer dots, and BF16's in ggtool.kernels.dot_bf16)
DOT_TYPES = (Q4_0, Q8_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q2_K, GGMLType.Q3_K,
             GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, BF16)


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
    if t not in GGML_QUANT_SIZES:
        raise GGToolError(f"tensor type id {int(t)} is a removed GGML type")
    return t


# gguf-py 0.19 still gives block_q8_1 its old layout (float d, float s: 40 bytes); GGML's is two
# fp16 and the codes, 36 bytes (ggml-common.h). Q8_1 is never stored in a file, only planned and
# computed with, so GGML's number is the one that counts (the plan's work_size).
_SIZES = {**GGML_QUANT_SIZES, GGMLType.Q8_1: (32, 36)}


def block_size(t: GGMLType) -> int:
    return _SIZES[t][0]


def type_size(t: GGMLType) -> int:
    return _SIZES[t][1]


def is_quantized(t: GGMLType) -> bool:
    return block_size(t) > 1


def row_size(t: GGMLType, n: int) -> int:
    """ggml_row_size: bytes of n elements of type t (n a multiple of the block size)."""
    return type_size(t) * n // block_size(t)


def np_dtype(t: GGMLType) -> np.dtype:
    """numpy dtype of one element; BF16 (no numpy dtype) as its uint16 bits; quantized types are
    viewed as raw bytes (uint8)."""
    if t == BF16:
        return np.dtype(np.uint16)
    return _NP_DTYPES.get(t, np.dtype(np.uint8))


def from_np_dtype(dt: np.dtype) -> GGMLType:
    dt = np.dtype(dt)
    for t, d in _NP_DTYPES.items():
        if d == dt:
            return t
    raise GGToolError(f"no GGML type for numpy dtype {dt} (use float32, float16 or int32)")


def vec_dot_type(t: GGMLType) -> GGMLType:
    if t in _KQUANTS:
        return GGMLType.Q8_K
    return _VEC_DOT.get(t, GGMLType.F32)
