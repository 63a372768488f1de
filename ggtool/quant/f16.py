"""fp32 <-> fp16 exactly as GGML_FP32_TO_FP16 / GGML_FP16_TO_FP32 (RNE, overflow to +-inf,
subnormals kept, NaN -> 0x7e00 | sign): the conversion every other module builds on."""

from __future__ import annotations

import numpy as np

from .blocks import _F32


def fp32_to_fp16(x) -> np.ndarray:
    """GGML_FP32_TO_FP16 elementwise: float16 array (RNE; NaN -> 0x7e00 with the input's sign)."""
    x = np.asarray(x, dtype=_F32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16)
    nan = np.isnan(x)
    if nan.any():
        bits = h.view(np.uint16)
        sign = (x.view(np.uint32)[nan] >> 16).astype(np.uint16) & np.uint16(0x8000)
        bits[nan] = np.uint16(0x7E00) | sign
    return h


def fp16_to_fp32(h) -> np.ndarray:
    """GGML_FP16_TO_FP32 (exact). Accepts float16 values or their uint16 bits."""
    h = np.asarray(h)
    if h.dtype == np.uint16:
        h = h.view(np.float16)
    return h.astype(_F32)
