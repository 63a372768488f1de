"""GGML's K-quants, 256 values a block: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (ggml-common.h's block_qN_K;
the byte layouts are in ``_k_quantize``'s docstring).

Values: Q2_K ``(d*sc) * q - (dmin*m)`` per 16 (4-bit scale and min), Q3_K ``(d*(sc-32)) * q`` (q
the 2 bits, minus 4 where the hmask bit is clear), Q4_K/Q5_K ``(d*sc) * q - (dmin*m)`` per 32 (6-bit
scales and mins), Q6_K ``(d*sc) * (q - 32)`` per 16 (int8 scales). vec_dot_type Q8_K. Quantizers:
``quantize_row_qN_K_ref`` (``_k_quantize``) and ``quantize_row_qN_K_impl`` with an importance
matrix (``_weighted_quantize``). Compute: ``kernels.dot_k``'s tiles (one int8 form for the types
with mins, Q6_K's 6-bit form for Q3_K and Q6_K); llama.cpp's x86 orders (``llama_cpp``) in
``kernels.x86_kquants`` and ``kernels.x86`` (Q6_K, the repacked q4_K_8x8), with q2_K_8x8 on AVX-512.
"""

from __future__ import annotations


from .. import types as T
from . import X86_BUILDS
from ._classic import ClassicType, dequantizer, quantizer

_KIND = {"q2_K": 0, "q3_K": 1, "q4_K": 2, "q5_K": 3}          # kernels.x86_kquants' K kinds


def _run_x86(cls, w, a, out, path, rows, i0):
    """ggml-cpu's path for a K-quant: the repacked gemm (rows in fours) and gemv (q4_K_8x8, and
    q2_K_8x8 on AVX-512), the tiled kernel from 8 rows, else the AVX2 vec_dot (which the AVX-512
    build compiles too); Q6_K's own (``kernels.x86``)."""
    from ..kernels import x86, x86_kquants
    from ..kernels.tables import F16_TO_F32 as f16

    gemm_rows = rows - rows % 4
    if cls.ggml_type == T.GGMLType.Q6_K:
        x86.dot_q6_k(w, a, out, path == "tiled", f16)
    elif path == "repacked" and cls.ggml_type == T.GGMLType.Q4_K:
        x86.dot_q4_k(w, a, out, i0, gemm_rows, f16)
    elif path == "repacked":
        x86_kquants.repacked_q2_k(w, a, out, i0, gemm_rows, f16)
    else:
        (x86_kquants.tiled_k if path == "tiled" else x86_kquants.vec_dot_k)(w, _KIND[cls.name], a, out, f16)


class _KQuant(ClassicType):
    block_size = 256
    vec_dot_type = T.GGMLType.Q8_K
    llama_cpp = dict.fromkeys(X86_BUILDS, _run_x86)
    CHUNK_BLOCKS = 1024           # blocks per work item of quantize (1 MiB of float32, as quant's drivers)


class Q2_K(_KQuant, ggml_type=T.GGMLType.Q2_K):
    type_size = 84
    x86_repacked = ("llama.cpp-avx512",)      # q2_K_8x8 (AVX-512 only)
    quantize_kernel = quantizer("_k_quantize:q2_k_quantize", "_weighted_quantize:q2_k_quantize_w")


class Q3_K(_KQuant, ggml_type=T.GGMLType.Q3_K):
    type_size = 110
    quantize_kernel = quantizer("_k_quantize:q3_k_quantize", "_weighted_quantize:q3_k_quantize_w")


class Q4_K(_KQuant, ggml_type=T.GGMLType.Q4_K):
    type_size = 144
    x86_repacked = X86_BUILDS                 # q4_K_8x8
    quantize_kernel = quantizer("_k_quantize:q4_k_quantize", "_weighted_quantize:q4_k_quantize_w")
    dequantize_blocks = dequantizer("compiled:dequantize_q4_k")


class Q5_K(_KQuant, ggml_type=T.GGMLType.Q5_K):
    type_size = 176
    quantize_kernel = quantizer("_k_quantize:q5_k_quantize", "_weighted_quantize:q5_k_quantize_w")


class Q6_K(_KQuant, ggml_type=T.GGMLType.Q6_K):
    type_size = 210
    quantize_kernel = quantizer("_k_quantize:q6_k_quantize", "_weighted_quantize:q6_k_quantize_w")
    dequantize_blocks = dequantizer("compiled:dequantize_q6_k")
