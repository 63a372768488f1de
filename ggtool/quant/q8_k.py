"""Q8_K, the activations K-quant (and most IQ) weights are multiplied with: quantize_row_q8_K_ref,
which is also GGML's CPU from_float (``kernels.quantize.quantize_q8_k``, or its twin for small work)."""

from __future__ import annotations

import numpy as np

from .blocks import _quantize_blocks, kernel

Q8_K_BYTES = 292


def quantize_q8_k(x, name: str = "tensor") -> np.ndarray:
    """Q8_K bytes of x: rows of 256-value blocks of 292 bytes (float32 d, int8 qs[256], int16 bsums[16])."""
    return _quantize_blocks(x, name, "Q8_K", Q8_K_BYTES, kernel("Q8_K", "quantize_q8_k", np.size(x)), 256)
