"""GGML's K-quants, 256 values a block: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (ggml-common.h's block_qN_K;
the byte layouts are in ``_k_quantize``'s docstring).

Values: Q2_K ``(d*sc) * q - (dmin*m)`` per 16 (4-bit scale and min), Q3_K ``(d*(sc-32)) * q`` (q
the 2 bits, minus 4 where the hmask bit is clear), Q4_K/Q5_K ``(d*sc) * q - (dmin*m)`` per 32 (6-bit
scales and mins), Q6_K ``(d*sc) * (q - 32)`` per 16 (int8 scales). vec_dot_type Q8_K. Quantizers:
``quantize_row_qN_K_ref`` (``_k_quantize``) and ``quantize_row_qN_K_impl`` with an importance
matrix (``_weighted_quantize``). Compute: ``kernels.dot_k``'s tiles (one int8 form for the types
with mins, Q6_K's 6-bit form for Q3_K and Q6_K); llama.cpp's x86 orders (``llama_cpp``) in
``kernels.x86_kquants`` and ``kernels.x86`` (Q6_K, the repacked q4_K_8x8), with q2_K_8x8 on AVX-512.

``decode_rows``: (codes int8 (n, nb, 256) in value order, scales and mins int32 (n, nb, 16) per
sub-block of 16, d and dmin float32 (n, nb)), which the packed tiles and the numpy twin multiply.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..kernels.decode import blocks, f16_at, scales_k4
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


def _decode_q45_k(w, five: bool):
    """Q4_K (d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles); Q5_K with qh[32] before
    the nibbles, a fifth bit per value."""
    nbytes, q0 = (176, 48) if five else (144, 16)
    b = blocks(w, nbytes)
    q = b[:, :, q0:q0 + 128].reshape(*b.shape[:2], 4, 32)                   # [c][k]
    codes = np.stack([q & 15, q >> 4], axis=3)                                # [c][half][k]: value 64c + 32half + k
    if five:
        h = b[:, :, 16:48]
        shifts = np.arange(8, dtype=np.uint8).reshape(4, 2, 1)               # bit 2c + half
        codes = codes | (((h[:, :, None, None, :] >> shifts) & 1) << 4)
    sc, mn = scales_k4(b[:, :, 4:16])
    return codes.reshape(*b.shape[:2], 256).view(np.int8), sc, mn, f16_at(b, 0), f16_at(b, 2)


class _KQuant(ClassicType):
    block_size = 256
    vec_dot_type = T.GGMLType.Q8_K
    llama_cpp = dict.fromkeys(X86_BUILDS, _run_x86)
    packed_form = "k"             # kernels.dot_k's tile: int8 codes, scales and mins per 16
    CHUNK_BLOCKS = 1024           # blocks per work item of quantize (1 MiB of float32, as quant's drivers)


class Q2_K(_KQuant, ggml_type=T.GGMLType.Q2_K):
    type_size = 84
    x86_repacked = ("llama.cpp-avx512",)      # q2_K_8x8 (AVX-512 only)
    quantize_kernel = quantizer("_k_quantize:q2_k_quantize", "_weighted_quantize:q2_k_quantize_w")
    twin_decode_seconds = 8.0e-9

    @classmethod
    def decode_rows(cls, w):
        """scales[16]: 4-bit scale | 4-bit min << 4, qs[64] of 2-bit codes, d, dmin."""
        b = blocks(w, 84)
        n, nb = b.shape[:2]
        qs = b[:, :, 16:80].reshape(n, nb, 2, 1, 32)
        j = np.arange(4, dtype=np.uint8).reshape(4, 1)
        codes = ((qs >> (2 * j)) & 3).reshape(n, nb, 256).view(np.int8)
        s = b[:, :, 0:16].astype(np.int32)
        return codes, s & 15, s >> 4, f16_at(b, 80), f16_at(b, 82)


class Q3_K(_KQuant, ggml_type=T.GGMLType.Q3_K):
    type_size = 110
    quantize_kernel = quantizer("_k_quantize:q3_k_quantize", "_weighted_quantize:q3_k_quantize_w")
    packed_form = "k6"            # codes -4..3 fit Q6_K's 6-bit tile
    twin_decode_seconds = 9.0e-9

    @classmethod
    def decode_rows(cls, w):
        """hmask[32], qs[64] of 2-bit codes, 12 bytes of 6-bit scales, d: codes are the 2 bits minus
        4 where the hmask bit is clear; scales the 6 bits minus 32."""
        b = blocks(w, 110)
        n, nb = b.shape[:2]
        qs = b[:, :, 32:96].reshape(n, nb, 2, 1, 32).astype(np.int16)
        hm = b[:, :, 0:32].reshape(n, nb, 1, 1, 32).astype(np.int16)
        j = np.arange(4, dtype=np.int16).reshape(4, 1)
        half = np.arange(2, dtype=np.int16).reshape(2, 1, 1)
        h = (hm >> (4 * half + j)) & 1
        codes = (((qs >> (2 * j)) & 3) - 4 * (1 - h)).astype(np.int8).reshape(n, nb, 256)
        s = b[:, :, 96:108].astype(np.int32)
        lo, hi, top = s[:, :, 0:4], s[:, :, 4:8], s[:, :, 8:12]
        sc = np.concatenate([(lo & 15) | ((top & 3) << 4), (hi & 15) | (((top >> 2) & 3) << 4),
                             (lo >> 4) | (((top >> 4) & 3) << 4), (hi >> 4) | (((top >> 6) & 3) << 4)], axis=2) - 32
        return codes, sc, np.zeros((n, nb, 16), np.int32), f16_at(b, 108), np.zeros((n, nb), np.float32)


class Q4_K(_KQuant, ggml_type=T.GGMLType.Q4_K):
    type_size = 144
    x86_repacked = X86_BUILDS                 # q4_K_8x8
    runner_x86_repacked = ("X_Q4_K", None)    # unrepacked: its vec_dot or tiled kernel, from Python
    quantize_kernel = quantizer("_k_quantize:q4_k_quantize", "_weighted_quantize:q4_k_quantize_w")
    twin_decode_seconds = 7.5e-9
    dequantize_blocks = dequantizer("compiled:dequantize_q4_k")

    @classmethod
    def decode_rows(cls, w):
        return _decode_q45_k(w, False)


class Q5_K(_KQuant, ggml_type=T.GGMLType.Q5_K):
    type_size = 176
    quantize_kernel = quantizer("_k_quantize:q5_k_quantize", "_weighted_quantize:q5_k_quantize_w")
    twin_decode_seconds = 9.0e-9

    @classmethod
    def decode_rows(cls, w):
        return _decode_q45_k(w, True)


class Q6_K(_KQuant, ggml_type=T.GGMLType.Q6_K):
    type_size = 210
    quantize_kernel = quantizer("_k_quantize:q6_k_quantize", "_weighted_quantize:q6_k_quantize_w")
    packed_form = "k6"
    twin_decode_seconds = 10.1e-9
    runner_x86 = ("X_Q6_K", None)
    dequantize_blocks = dequantizer("compiled:dequantize_q6_k")

    @classmethod
    def decode_rows(cls, w):
        """ql[128], qh[64], int8 scales[16], d: codes (ql nibble | qh 2 bits << 4) - 32."""
        b = blocks(w, 210)
        n, nb = b.shape[:2]
        ql = b[:, :, 0:128].reshape(n, nb, 2, 2, 32)                            # [half][g4 & 1][k]
        qh = b[:, :, 128:192].reshape(n, nb, 2, 32)                             # [half][k]
        codes = np.empty((n, nb, 2, 4, 32), np.uint8)                           # [half][g4][k]
        for g4 in range(4):     # low nibble of ql[g4 & 1] (g4 < 2) or its high one, and bits 2*g4.. of qh
            lo = ql[:, :, :, g4 & 1] & np.uint8(15) if g4 < 2 else ql[:, :, :, g4 & 1] >> np.uint8(4)
            np.bitwise_or(lo, ((qh >> np.uint8(2 * g4)) & np.uint8(3)) << np.uint8(4), out=codes[:, :, :, g4])
        codes -= np.uint8(32)                                                   # 0..63 - 32, as int8 below
        codes = codes.view(np.int8).reshape(n, nb, 256)
        sc = b[:, :, 192:208].view(np.int8).astype(np.int32)
        return codes, sc, np.zeros((n, nb, 16), np.int32), f16_at(b, 208), np.zeros((n, nb), np.float32)
