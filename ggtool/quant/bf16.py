"""fp32 <-> bf16 exactly as GGML_FP32_TO_BF16 / GGML_BF16_TO_FP32 (ggml-impl.h).

A bf16 value is the upper half of a float32: numpy has no such dtype, so ggtool holds bf16 data as
its uint16 bit patterns (``types.np_dtype(BF16)`` is uint16; a BF16 tensor's ``.data`` is a uint16
view, ``.numpy()`` its float32 values).

* bf16 -> fp32 is exact: the 16 bits shifted into the top of a float32.
* fp32 -> bf16 (``ggml_compute_fp32_to_bf16``): a NaN keeps its sign and upper 16 bits and is made
  quiet (``(bits >> 16) | 64``); every other value, infinities and subnormals included, is rounded
  to nearest, ties to even, on the integer bits: ``(bits + 0x7fff + ((bits >> 16) & 1)) >> 16``
  (so a finite value above the largest bf16 becomes inf, and subnormals are kept, never flushed).

This is also the CPU backend's ``from_float`` for BF16 (``ggml_cpu_fp32_to_bf16``, a plain loop of
GGML_FP32_TO_BF16), which mul_mat uses to convert its f32 activations for BF16 weights, and what cpy
to a bf16 tensor does. Plain numpy: a handful of integer passes, memory-bound.
"""

from __future__ import annotations

import numpy as np

from ..errors import QuantizationError

_ABS = np.uint32(0x7FFFFFFF)
_INF = np.uint32(0x7F800000)
_QUIET = np.uint32(64)


def fp32_to_bf16(x) -> np.ndarray:
    """GGML_FP32_TO_BF16 elementwise: the uint16 bits of bf16 values (x's shape). Other dtypes are
    converted to float32 first (as GGML's conversions from f16 or integers go through float)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    out = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)   # wraps for NaN only
    nan = (u & _ABS) > _INF
    if nan.any():
        out = np.where(nan, (u >> np.uint32(16)) | _QUIET, out)
    return out.astype(np.uint16)


def bf16_bits(raw) -> np.ndarray:
    """bf16 data as uint16 bits: uint16 as it is, uint8 row bytes (..., 2n) viewed as (..., n)."""
    raw = np.asarray(raw)
    if raw.dtype == np.uint16:
        return raw
    if raw.dtype != np.uint8:
        raise QuantizationError(f"bf16 data must be uint16 bits or uint8 bytes, not {raw.dtype}")
    raw = np.ascontiguousarray(raw)
    if raw.ndim == 0 or raw.shape[-1] % 2:
        raise QuantizationError(f"bf16 rows of {raw.shape[-1] if raw.ndim else 0} bytes are not whole 2-byte values")
    return raw.view(np.uint16)


def bf16_to_fp32(raw) -> np.ndarray:
    """GGML_BF16_TO_FP32 elementwise (exact): float32 values of bf16 bits (uint16, or uint8 bytes)."""
    bits = bf16_bits(raw)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
