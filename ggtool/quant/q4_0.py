"""Q4_0 (18-byte blocks: fp16 d, 16 bytes of nibbles), quantized as ``quantize_row_q4_0_ref``
and dequantized, byte-exact with GGML. The loops are compiled (``ggtool.kernels.quantize``),
imported on first use so that ``import ggtool.quant`` does not load numba."""

from __future__ import annotations

import numpy as np

from .blocks import Q4_0_BYTES, _dequantize_blocks, _quantize_blocks, dequantizer, kernel


def quantize_q4_0(x, name: str = "tensor") -> np.ndarray:
    """Q4_0 bytes of x: uint8 of shape (*x.shape[:-1], x.shape[-1] // 32 * 18)."""
    return _quantize_blocks(x, name, "Q4_0", Q4_0_BYTES, kernel("Q4_0", "q4_0_quantize", np.size(x)))


def dequantize_q4_0(raw) -> np.ndarray:
    """float32 values of Q4_0 bytes (rows of 18-byte blocks): shape (..., row_bytes/18*32)."""
    return _dequantize_blocks(raw, Q4_0_BYTES, "Q4_0", dequantizer(raw, Q4_0_BYTES, "q4_0_dequantize"))

