"""GGML's block quantizers beyond Q4_0/Q8_0, bit for bit as ggml_quantize_chunk writes them, as
compiled kernels: the K-quants (Q2_K..Q6_K, ``blocks``: ``quantize_row_qN_K_ref`` and its scale
searches), IQ4_NL (``legacy``; Q4_1/Q5_0/Q5_1's reference rows are vectorised beside Q4_0's in
``ggtool.kernels.quantize``), and the importance-matrix paths of all of them and
of Q4_0 (``weighted``: ``quantize_row_*_impl`` with quant_weights).

Kept out of ``ggtool.kernels`` (the shared compile machinery and the matmul/Q4_0 loops) as a
capability of its own; ``ggtool.quant.quantize`` runs these kernels over an array's blocks on its
threads. Importing this package does not load numba: ``kernel(t)`` / ``weighted_kernel(t)`` do,
at first use.
"""

from __future__ import annotations

QK_K = 256

# ggml type name -> (values per block, bytes per block, module of the kernel without weights ("kernels":
# ggtool.kernels.quantize, vectorised beside Q4_0's), its name, the kernel with quant_weights)
BLOCKS = {
    "q2_K": (256, 84, "blocks", "q2_k_quantize", "q2_k_quantize_w"),
    "q3_K": (256, 110, "blocks", "q3_k_quantize", "q3_k_quantize_w"),
    "q4_K": (256, 144, "blocks", "q4_k_quantize", "q4_k_quantize_w"),
    "q5_K": (256, 176, "blocks", "q5_k_quantize", "q5_k_quantize_w"),
    "q6_K": (256, 210, "blocks", "q6_k_quantize", "q6_k_quantize_w"),
    "q4_1": (32, 20, "kernels", "q4_1_quantize", "q4_1_quantize_w"),
    "q5_0": (32, 22, "kernels", "q5_0_quantize", "q5_0_quantize_w"),
    "q5_1": (32, 24, "kernels", "q5_1_quantize", "q5_1_quantize_w"),
    "iq4_nl": (32, 18, "legacy", "iq4_nl_quantize", "iq4_nl_quantize_w"),
    "q4_0": (32, 18, None, None, "q4_0_quantize_w"),    # without weights: ggtool.kernels.quantize
}


def kernel(type_name: str):
    """The compiled quantizer of a type without an importance matrix, as kernel(xb float32 (n, qk),
    out uint8 (n, bytes)) -> -1 or the flat index of xb's first NaN/inf (the shape ggtool.quant's
    block drivers run)."""
    import importlib

    from ..kernels.tables import F16_TO_F32

    _, _, module, name, _ = BLOCKS[type_name]
    if module == "kernels":
        from ..kernels import quantize
        return getattr(quantize, name)
    fn = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return lambda xb, out: fn(xb, out, F16_TO_F32)


def weighted_kernel(type_name: str):
    """The compiled quantizer of a type with quant_weights, as kernel(xb float32 (n, qk) of whole
    rows, out uint8 (n, bytes), qw float32 (blocks per row, qk)) -> -1 or the flat index of xb's
    first NaN/inf."""
    from ..kernels.tables import F16_TO_F32
    from . import weighted

    fn = getattr(weighted, BLOCKS[type_name][4])
    return lambda xb, out, qw: fn(xb, out, qw, F16_TO_F32)
