"""Q8_0 (34-byte blocks: fp16 d, 32 int8), quantized both as the reference
(``quantize_row_q8_0_ref``, roundf) and as the x86 AVX2 CPU ``from_float`` mul_mat uses for its
activations (id = 127/amax, ties to even), and dequantized; byte-exact with GGML. The loops are
compiled (``ggtool.kernels.quantize``), imported on first use."""

from __future__ import annotations

import numpy as np

from .blocks import Q8_0_BYTES, _dequantize_blocks, _quantize_blocks, dequantizer, kernel


def quantize_q8_0(x, name: str = "tensor") -> np.ndarray:
    """Reference Q8_0 bytes (quantize_row_q8_0_ref: roundf), shape (..., row/32*34)."""
    return _quantize_blocks(x, name, "Q8_0", Q8_0_BYTES, kernel("Q8_0", "q8_0_quantize", np.size(x)))


def quantize_q8_0_cpu(x, name: str = "tensor") -> np.ndarray:
    """Q8_0 bytes as the x86 AVX2 CPU from_float makes them for mul_mat (id=127/amax, ties even)."""
    return _quantize_blocks(x, name, "Q8_0", Q8_0_BYTES, kernel("Q8_0_cpu", "q8_0_quantize_cpu", np.size(x)))



def dequantize_q8_0(raw) -> np.ndarray:
    """float32 values of Q8_0 bytes (rows of 34-byte blocks): shape (..., row_bytes/34*32)."""
    return _dequantize_blocks(raw, Q8_0_BYTES, "Q8_0", dequantizer(raw, Q8_0_BYTES, "q8_0_dequantize"))


def quantize_q8_1_cpu(x, name: str = "tensor") -> np.ndarray:
    """Q8_1 bytes (fp16 d, fp16 s = d * sum(qs), int8 qs[32]) as the x86 AVX2 from_float makes them
    for mul_mat with Q4_1/Q5_1 weights: d and qs as quantize_q8_0_cpu."""
    return _quantize_blocks(x, name, "Q8_1", 36, kernel("Q8_1_cpu", "q8_1_quantize_cpu", np.size(x)))
