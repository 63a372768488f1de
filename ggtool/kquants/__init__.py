"""GGML's K-quant block quantizers (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), bit for bit the reference
``quantize_row_qN_K_ref`` of ggml-quants.c and its scale searches, as compiled kernels.

Kept out of ``ggtool.kernels`` (the shared compile machinery and the matmul/Q4_0 loops) as a
capability of its own; ``ggtool.quant.quantize`` runs these kernels over an array's blocks on its
threads. ``blocks`` holds the kernels, one per type, and the scale searches they share. Importing
this package does not load numba: ``kernel(t)`` does, at first use.
"""

from __future__ import annotations

QK_K = 256

# ggml type name -> (bytes per 256-value block, kernel name in ggtool.kquants.blocks)
BLOCKS = {
    "q2_K": (84, "q2_k_quantize"),
    "q3_K": (110, "q3_k_quantize"),
    "q4_K": (144, "q4_k_quantize"),
    "q5_K": (176, "q5_k_quantize"),
    "q6_K": (210, "q6_k_quantize"),
}


def kernel(type_name: str):
    """The compiled quantizer of a K type, as kernel(xb float32 (n, 256), out uint8 (n, bytes)) -> -1
    or the flat index of xb's first NaN/inf (the shape ggtool.quant's block drivers run)."""
    from ..kernels.tables import F16_TO_F32
    from . import blocks

    fn = getattr(blocks, BLOCKS[type_name][1])
    return lambda xb, out: fn(xb, out, F16_TO_F32)
