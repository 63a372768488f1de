"""Compiled dequantizers of Q5_0, Q4_K and Q6_K, the block types of llama.cpp's K-quant mixes whose
source tensors ``ggtool quantize`` reads most (their records' ``dequantize_blocks``; IQ4_NL's is
numpy, in its record).

Each takes (blocks uint8 (n, block_bytes), f16 table, out float32 (n, values per block)) and
computes gguf-py's float32 arithmetic exactly (so ``ggtool quantize`` reads a source tensor as
llama-quantize does, and requantizes it to the same bytes):
Q5_0 ``(q - 16) * d``; Q4_K ``(d*sc) * q - (dmin*m)``; Q6_K ``(d*sc) * (q - 32)``.
"""

from __future__ import annotations

import numpy as np

from ..kernels.jit import njit


@njit
def _f16(f16, lo, hi):
    return f16[np.int64(lo) | (np.int64(hi) << 8)]


@njit
def dequantize_q5_0(blocks, f16, out):
    """Q5_0 (22 bytes: d, qh u32, qs[16]): element j is (nibble | bit j of qh << 4) - 16, times d."""
    for i in range(blocks.shape[0]):
        d = _f16(f16, blocks[i, 0], blocks[i, 1])
        qh = np.int64(blocks[i, 2]) | (np.int64(blocks[i, 3]) << 8) | (np.int64(blocks[i, 4]) << 16) | \
            (np.int64(blocks[i, 5]) << 24)
        for j in range(16):
            b = np.int64(blocks[i, 6 + j])
            lo = (b & 15) | (((qh >> j) & 1) << 4)
            hi = (b >> 4) | (((qh >> (j + 16)) & 1) << 4)
            out[i, j] = np.float32(lo - 16) * d
            out[i, j + 16] = np.float32(hi - 16) * d




@njit
def _scale_min_k4(scales, i, j):
    """ggml's get_scale_min_k4: 6-bit scale and min of sub-block j from the 12 packed bytes."""
    if j < 4:
        return np.int64(scales[i, 4 + j]) & 63, np.int64(scales[i, 8 + j]) & 63
    sc = (np.int64(scales[i, 8 + j]) & 15) | ((np.int64(scales[i, j]) >> 6) << 4)
    m = (np.int64(scales[i, 8 + j]) >> 4) | ((np.int64(scales[i, 4 + j]) >> 6) << 4)
    return sc, m


@njit
def dequantize_q4_k(blocks, f16, out):
    """Q4_K (144 bytes: d, dmin, 12 bytes of scales/mins, 128 bytes of nibbles)."""
    for i in range(blocks.shape[0]):
        d = _f16(f16, blocks[i, 0], blocks[i, 1])
        dmin = _f16(f16, blocks[i, 2], blocks[i, 3])
        for c in range(4):                              # 32 bytes: sub-blocks 2c (low) and 2c+1 (high)
            sc0, m0 = _scale_min_k4(blocks, i, 2 * c)
            sc1, m1 = _scale_min_k4(blocks, i, 2 * c + 1)
            a0, b0 = d * np.float32(sc0), dmin * np.float32(m0)
            a1, b1 = d * np.float32(sc1), dmin * np.float32(m1)
            for k in range(32):
                q = np.int64(blocks[i, 16 + 32 * c + k])
                out[i, 64 * c + k] = a0 * np.float32(q & 15) - b0
                out[i, 64 * c + 32 + k] = a1 * np.float32(q >> 4) - b1


@njit
def dequantize_q6_k(blocks, f16, out):
    """Q6_K (210 bytes: ql[128], qh[64], int8 scales[16], d): per half of 128 values, ql bytes k and
    k+32 give four values' low nibbles, qh byte k their four 2-bit tops (as dequantize_row_q6_K)."""
    for i in range(blocks.shape[0]):
        d = _f16(f16, blocks[i, 208], blocks[i, 209])
        for half in range(2):
            ql, qh, y = half * 64, 128 + half * 32, half * 128
            for g in range(4):                         # y[32g + k] uses scale 8*half + 2g + k//16
                for k in range(32):
                    b = np.int64(blocks[i, ql + k + 32 * (g & 1)])
                    lo = (b >> (4 * (g >> 1))) & 15
                    hi = (np.int64(blocks[i, qh + k]) >> (2 * g)) & 3
                    sc = np.float32(np.int8(blocks[i, 192 + half * 8 + 2 * g + k // 16]))
                    out[i, y + 32 * g + k] = (d * sc) * np.float32((lo | (hi << 4)) - 32)
