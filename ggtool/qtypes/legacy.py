"""GGML's first block types, 32 values a block: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (ggml-common.h's
block_q4_0 ...).

Layouts: Q4_0 fp16 d, qs[16] (nibbles: value j low, j + 16 high), values (q - 8) * d; Q4_1 fp16 d,
fp16 m, qs[16], q * d + m; Q5_0 fp16 d, qh (the 5th bits, little-endian u32), qs[16], (q - 16) * d;
Q5_1 fp16 d, fp16 m, qh, qs[16], q * d + m; Q8_0 fp16 d, int8 qs[32], q * d. vec_dot_type Q8_0
(Q8_1 for the types with a min). ``decode_rows``: the codes of every block in value order, d
(and m) as float32, which the packed tiles and the numpy twin multiply. Quantizers: the reference rows (``kernels.quantize``), and with
an importance matrix ``quantize_row_*_impl`` (``_weighted_quantize``; Q8_0 ignores one, as GGML
does). Compute: ``kernels.dot``'s packed tiles; llama.cpp's x86 orders (``llama_cpp``) are ``kernels.x86``'s
(tinyBLAS_Q0, Q4_0's repacked q4_0_8x8) and ``kernels.x86_legacy``'s (Q4_1, Q5_1).
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..kernels.decode import blocks, f16_at, five, nibbles
from . import X86_BUILDS
from ._classic import ClassicType, dequantizer, quantizer


def _q0_x86(kind: str) -> dict:
    """``llama_cpp`` of Q8_0, Q5_0 and Q4_0 (``kernels.x86``'s `kind`): the repacked q4_0_8x8 gemm and
    gemv where the weights are repacked (Q4_0), else llamafile's tinyBLAS_Q0 lanes (its AVX2 vec_dot
    for one row sums alike)."""

    def run(cls, w, a, out, path, rows, i0):
        from ..kernels import x86
        from ..kernels.tables import F16_TO_F32

        if path == "repacked":
            x86.dot_b32_repacked(w, getattr(x86, kind), a, out, F16_TO_F32)
        else:
            x86.dot_q0(w, getattr(x86, kind), a, out, F16_TO_F32)

    return dict.fromkeys(X86_BUILDS, run)


def _q1_x86(kind: str) -> dict:
    """``llama_cpp`` of Q4_1 and Q5_1: ggml_vec_dot_q4_1_q8_1 / _q5_1_q8_1's AVX2 code (``kernels.x86_legacy``)
    for any number of rows (no repacking, no tiled kernel, no tinyBLAS for Q8_1)."""

    def run(cls, w, a, out, path, rows, i0):
        from ..kernels import x86_legacy
        from ..kernels.tables import F16_TO_F32

        x86_legacy.vec_dot_q1(w, getattr(x86_legacy, kind), a, out, F16_TO_F32)

    return dict.fromkeys(X86_BUILDS, run)


class _Legacy(ClassicType):
    block_size = 32
    vec_dot_type = T.GGMLType.Q8_0
    packed_form = "int8"          # kernels.dot's tile of int8 codes (Q8_0's), d per block
    CHUNK_BLOCKS = 8192           # blocks per work item of quantize (1 MiB of float32, as quant's drivers)


class Q4_0(_Legacy, ggml_type=T.Q4_0):
    type_size = 18
    llama_cpp = _q0_x86("Q4_0_KIND")
    x86_repacked = X86_BUILDS     # q4_0_8x8
    runner_x86 = ("X_Q0", "Q4_0_KIND")
    runner_x86_repacked = ("X_Q4_0", None)
    quantize_kernel = quantizer("kernels:q4_0_quantize", "_weighted_quantize:q4_0_quantize_w")
    packed_form = "nibbles"       # the 16 nibble bytes as they are, at byte 2
    twin_decode_seconds = 2.0e-9

    dequantize_blocks = dequantizer("twin:q4_0_dequantize")

    @classmethod
    def decode_rows(cls, w):
        b = blocks(w, 18)
        return (nibbles(b[:, :, 2:18]).view(np.int8) - np.int8(8)), f16_at(b, 0), None


class Q4_1(_Legacy, ggml_type=T.GGMLType.Q4_1):
    type_size = 20
    vec_dot_type = T.GGMLType.Q8_1
    llama_cpp = _q1_x86("Q4_1_KIND")
    quantize_kernel = quantizer("kernels:q4_1_quantize", "_weighted_quantize:q4_1_quantize_w")
    packed_form = "int8_min"
    twin_decode_seconds = 5.1e-9

    @classmethod
    def decode_rows(cls, w):
        b = blocks(w, 20)
        return nibbles(b[:, :, 4:20]).view(np.int8), f16_at(b, 0), f16_at(b, 2)


class Q5_0(_Legacy, ggml_type=T.GGMLType.Q5_0):
    type_size = 22
    llama_cpp = _q0_x86("Q5_0_KIND")
    runner_x86 = ("X_Q0", "Q5_0_KIND")
    quantize_kernel = quantizer("kernels:q5_0_quantize", "_weighted_quantize:q5_0_quantize_w")
    twin_decode_seconds = 5.1e-9

    dequantize_blocks = dequantizer("compiled:dequantize_q5_0")

    @classmethod
    def decode_rows(cls, w):
        b = blocks(w, 22)
        return (five(b[:, :, 6:22], b[:, :, 2:6]).view(np.int8) - np.int8(16)), f16_at(b, 0), None


class Q5_1(_Legacy, ggml_type=T.GGMLType.Q5_1):
    type_size = 24
    vec_dot_type = T.GGMLType.Q8_1
    llama_cpp = _q1_x86("Q5_1_KIND")
    quantize_kernel = quantizer("kernels:q5_1_quantize", "_weighted_quantize:q5_1_quantize_w")
    packed_form = "int8_min"
    twin_decode_seconds = 6.0e-9

    @classmethod
    def decode_rows(cls, w):
        b = blocks(w, 24)
        return five(b[:, :, 8:24], b[:, :, 4:8]).view(np.int8), f16_at(b, 0), f16_at(b, 2)


class Q8_0(_Legacy, ggml_type=T.Q8_0):
    type_size = 34
    llama_cpp = _q0_x86("Q8_0_KIND")
    runner_x86 = ("X_Q0", "Q8_0_KIND")
    quantize_kernel = quantizer("kernels:q8_0_quantize", None)   # GGML's Q8_0 ignores quant_weights
    twin_decode_seconds = 1.2e-9

    dequantize_blocks = dequantizer("twin:q8_0_dequantize")

    @classmethod
    def decode_rows(cls, w):
        b = blocks(w, 34)
        return b[:, :, 2:34].view(np.int8), f16_at(b, 0), None
