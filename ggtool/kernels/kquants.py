"""Dequantizers for the block types of llama.cpp's K-quant mixes (Q5_0, Q4_K, Q6_K, IQ4_NL), compiled.

Each takes (blocks uint8 (n, block_bytes), f16 table, out float32 (n, values per block)) and
computes gguf-py's float32 arithmetic exactly (so ``ggtool quantize`` reads a source tensor as
llama-quantize does, and requantizes it to the same bytes):
Q5_0 ``(q - 16) * d``; Q4_K ``(d*sc) * q - (dmin*m)``; Q6_K ``(d*sc) * (q - 32)``;
IQ4_NL ``d * kvalues_iq4nl[q]`` (GGML's dequantize_row_iq4_nl).
"""

from __future__ import annotations

import numpy as np

from .jit import njit
from .tables import KVALUES_IQ4NL


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
def dequantize_iq4_nl(blocks, f16, out):
    """IQ4_NL (18 bytes: d, qs[16]): element j is kvalues_iq4nl[low nibble of byte j], j + 16 the high one."""
    kv = KVALUES_IQ4NL
    for i in range(blocks.shape[0]):
        d = _f16(f16, blocks[i, 0], blocks[i, 1])
        for j in range(16):
            b = np.int64(blocks[i, 2 + j])
            out[i, j] = d * kv[b & 15]
            out[i, j + 16] = d * kv[b >> 4]


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


# -- Q8_K: the activations K-quant weights are multiplied with -------------------------------------
_RNE = np.float32(12582912.0)       # 1.5 * 2**23: (v + _RNE) - _RNE is nearest_int (half to even)


@njit
def quantize_q8_k(x, out):
    """quantize_row_q8_K_ref (also the CPU from_float): block of 256 -> float32 d, int8 qs[256],
    int16 bsums[16] (292 bytes). Returns -1, or the flat index in x of the first NaN/inf."""
    od = out.view(np.float32)            # out rows are 292 bytes: d at byte 0 of each row
    for i in range(x.shape[0]):
        amax = np.float32(0.0)
        mx = np.float32(0.0)
        for j in range(256):
            v = x[i, j]
            if not np.isfinite(v):
                return i * 256 + j
            a = abs(v)
            if a > amax:
                amax = a
                mx = v
        if amax == 0:
            out[i, :] = 0
            continue
        iscale = np.float32(-127.0) / mx
        for j in range(256):
            q = np.int32((iscale * x[i, j] + _RNE) - _RNE)
            out[i, 4 + j] = np.uint8(np.int8(min(q, 127)) & 0xFF)
        for j in range(16):
            s = 0
            for k in range(16):
                s += np.int32(np.int8(out[i, 4 + 16 * j + k]))
            out[i, 260 + 2 * j] = np.uint8(s & 0xFF)
            out[i, 261 + 2 * j] = np.uint8((s >> 8) & 0xFF)
        od[i, 0] = np.float32(1.0) / iscale
    return -1
