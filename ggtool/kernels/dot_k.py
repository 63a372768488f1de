"""K-quant dot products: Q2_K, Q3_K, Q4_K, Q5_K and Q6_K weights x Q8_K activations.

Every K-quant type is repacked into one form: per block of 256, int8 codes (the stored integer,
offset applied: Q2_K 0..3, Q3_K -4..3, Q4_K 0..15, Q5_K 0..31, Q6_K -32..31), an integer scale and
min per 16 values (int32 and int16), and float32 d / dmin, interleaved across rows as ``dot``'s
types are (``simd``'s layout). Then one dot, ``simd.tile_k``, serves them all
(GGML's generic ``ggml_vec_dot_qN_K_q8_K``, integer parts exact):
``sumi = sum_j sc_j * (codes_j . a_j)``, ``summ = sum_j m_j * bsums_j``, then
``out += (d_w * d_a) * sumi`` and ``out -= (dmin_w * d_a) * summ``, block after block. (GGML sums
the scaled parts in 8 float lanes: the last bits may differ; the order never depends on the split
between participants.) Adding a K-quant type is one pack function (decode a block) and a register.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from . import simd
from .dot_base import GROUP, register, store_group
from .jit import njit

Q8_K_BYTES = 292


@njit
def _scatter_k(codes, sc, mn, dw, dmw, g, nb, b, r, c256, s16, m16, d, dmin):
    """One row's decoded block into the packed arrays, per chunk of L rows (``simd``): codes in
    quads [chunk][64][L][4], scales as int32 [chunk][16][L], mins as int16 pairs of sub-blocks
    [chunk][8][L][2]; d and dmin per row."""
    gb, c, rr, L = g * nb + b, r // simd.L, r % simd.L, simd.L
    for v in range(256):
        codes[gb * 256 * GROUP + ((c * 64 + v // 4) * L + rr) * 4 + v % 4] = c256[v]
    for j in range(16):
        sc[gb * 16 * GROUP + (c * 16 + j) * L + rr] = s16[j]
        mn[gb * 16 * GROUP + ((c * 8 + j // 2) * L + rr) * 2 + j % 2] = m16[j]
    dw[gb * GROUP + r] = d
    dmw[gb * GROUP + r] = dmin


@njit
def _alloc_k(n, nb):
    G = (n + GROUP - 1) // GROUP
    return (np.zeros(G * nb * 256 * GROUP, np.int8), np.zeros(G * nb * 16 * GROUP, np.int32),
            np.zeros(G * nb * 16 * GROUP, np.int16), np.zeros(G * nb * GROUP, np.float32),
            np.zeros(G * nb * GROUP, np.float32))


@njit
def _scale_min_k4(q, o, j):
    """ggml's get_scale_min_k4: 6-bit scale and min of sub-block j from the 12 bytes at q[o:]."""
    if j < 4:
        return np.int32(q[o + j]) & 63, np.int32(q[o + j + 4]) & 63
    sc = (np.int32(q[o + j + 4]) & 15) | ((np.int32(q[o + j - 4]) >> 6) << 4)
    m = (np.int32(q[o + j + 4]) >> 4) | ((np.int32(q[o + j]) >> 6) << 4)
    return sc, m


@njit
def _f16_at(w, i, o, f16):
    return f16[np.int64(w[i, o]) | (np.int64(w[i, o + 1]) << 8)]


@njit
def _pack_q45_k(w, f16, five):
    """Q4_K (144 bytes: d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles) or Q5_K (176:
    the same with qh[32] before the nibbles, a fifth bit per value)."""
    nbytes = 176 if five else 144
    q0 = 48 if five else 16
    n, nb = w.shape[0], w.shape[1] // nbytes
    codes, sc, mn, dw, dmw = _alloc_k(n, nb)
    c256 = np.empty(256, np.int8)
    s16 = np.empty(16, np.int32)
    m16 = np.empty(16, np.int32)
    for i in range(n):
        for b in range(nb):
            o = b * nbytes
            for c in range(4):
                for k in range(32):
                    q = w[i, o + q0 + 32 * c + k]
                    h = w[i, o + 16 + k] if five else np.uint8(0)
                    c256[64 * c + k] = (q & 15) | (((h >> (2 * c)) & 1) << 4)
                    c256[64 * c + 32 + k] = (q >> 4) | (((h >> (2 * c + 1)) & 1) << 4)
            for j in range(8):
                s, m = _scale_min_k4(w[i], o + 4, j)
                s16[2 * j] = s16[2 * j + 1] = s
                m16[2 * j] = m16[2 * j + 1] = m
            _scatter_k(codes, sc, mn, dw, dmw, i // GROUP, nb, b, i % GROUP, c256, s16, m16,
                       _f16_at(w, i, o, f16), _f16_at(w, i, o + 2, f16))
    return codes, sc, mn, dw, dmw, n, nb


@njit
def _pack_q4_k(w, f16):
    return _pack_q45_k(w, f16, False)


@njit
def _pack_q5_k(w, f16):
    return _pack_q45_k(w, f16, True)


@njit
def _pack_q6_k(w, f16):
    """Q6_K (210 bytes: ql[128], qh[64], int8 scales[16], d): codes (ql nibble | qh 2 bits << 4) - 32."""
    n, nb = w.shape[0], w.shape[1] // 210
    codes, sc, mn, dw, dmw = _alloc_k(n, nb)
    c256 = np.empty(256, np.int8)
    s16 = np.empty(16, np.int32)
    m16 = np.zeros(16, np.int32)
    for i in range(n):
        for b in range(nb):
            o = b * 210
            for half in range(2):
                for g4 in range(4):
                    for k in range(32):
                        lo = (np.int32(w[i, o + half * 64 + k + 32 * (g4 & 1)]) >> (4 * (g4 >> 1))) & 15
                        hi = (np.int32(w[i, o + 128 + half * 32 + k]) >> (2 * g4)) & 3
                        c256[half * 128 + 32 * g4 + k] = (lo | (hi << 4)) - 32
            for j in range(16):
                s16[j] = np.int32(np.int8(w[i, o + 192 + j]))
            _scatter_k(codes, sc, mn, dw, dmw, i // GROUP, nb, b, i % GROUP, c256, s16, m16,
                       _f16_at(w, i, o + 208, f16), np.float32(0.0))
    return codes, sc, mn, dw, dmw, n, nb


@njit
def _pack_q2_k(w, f16):
    """Q2_K (84 bytes: scales[16] (4-bit scale | 4-bit min << 4), qs[64] of 2-bit codes, d, dmin)."""
    n, nb = w.shape[0], w.shape[1] // 84
    codes, sc, mn, dw, dmw = _alloc_k(n, nb)
    c256 = np.empty(256, np.int8)
    s16 = np.empty(16, np.int32)
    m16 = np.empty(16, np.int32)
    for i in range(n):
        for b in range(nb):
            o = b * 84
            for half in range(2):
                for j in range(4):
                    for k in range(32):           # bytes k of the half's 32: values 16*(2j + k//16) + k%16
                        c256[half * 128 + 32 * j + k] = (w[i, o + 16 + half * 32 + k] >> (2 * j)) & 3
            for j in range(16):
                s16[j] = np.int32(w[i, o + j]) & 15
                m16[j] = np.int32(w[i, o + j]) >> 4
            _scatter_k(codes, sc, mn, dw, dmw, i // GROUP, nb, b, i % GROUP, c256, s16, m16,
                       _f16_at(w, i, o + 80, f16), _f16_at(w, i, o + 82, f16))
    return codes, sc, mn, dw, dmw, n, nb


@njit
def _pack_q3_k(w, f16):
    """Q3_K (110 bytes: hmask[32], qs[64] of 2-bit codes, 12 bytes of 6-bit scales, d): codes are
    the 2 bits minus 4 where the hmask bit is clear (-4..3); scales are the 6 bits minus 32."""
    n, nb = w.shape[0], w.shape[1] // 110
    codes, sc, mn, dw, dmw = _alloc_k(n, nb)
    c256 = np.empty(256, np.int8)
    s16 = np.empty(16, np.int32)
    m16 = np.zeros(16, np.int32)
    for i in range(n):
        for b in range(nb):
            o = b * 110
            for half in range(2):
                for j in range(4):
                    bit = 4 * half + j
                    for k in range(32):
                        q = (np.int32(w[i, o + 32 + half * 32 + k]) >> (2 * j)) & 3
                        h = (np.int32(w[i, o + k]) >> bit) & 1
                        c256[half * 128 + 32 * j + k] = q - 4 * (1 - h)
            for k in range(4):
                lo, hi, top = np.int32(w[i, o + 96 + k]), np.int32(w[i, o + 100 + k]), np.int32(w[i, o + 104 + k])
                s16[k] = ((lo & 15) | ((top & 3) << 4)) - 32
                s16[4 + k] = ((hi & 15) | (((top >> 2) & 3) << 4)) - 32
                s16[8 + k] = ((lo >> 4) | (((top >> 4) & 3) << 4)) - 32
                s16[12 + k] = ((hi >> 4) | (((top >> 6) & 3) << 4)) - 32
            _scatter_k(codes, sc, mn, dw, dmw, i // GROUP, nb, b, i % GROUP, c256, s16, m16,
                       _f16_at(w, i, o + 108, f16), np.float32(0.0))
    return codes, sc, mn, dw, dmw, n, nb


@njit
def _act_pairs_k(act):
    """Q8_K activation rows as ``simd.tile_k`` reads them, indexed [block, row]: ap (128 int16 pairs
    of the 256 codes, ``simd``'s order), bp (the 16 bsums in 8 pairs), d (float32)."""
    M, nb = act.shape[0], act.shape[1] // Q8_K_BYTES
    qa = act.view(np.int8)
    ap = np.empty((nb, M, 128), np.int32)
    bp = np.empty((nb, M, 8), np.int32)
    da = np.empty((nb, M), np.float32)
    for m in range(M):
        for b in range(nb):
            o = b * Q8_K_BYTES
            da[b, m] = act[m, o:o + 4].copy().view(np.float32)[0]
            for p in range(128):
                x = o + 4 + 4 * (p // 2) + p % 2
                ap[b, m, p] = (np.int32(qa[m, x]) & 0xFFFF) | (np.int32(qa[m, x + 2]) << 16)
            for p in range(8):
                x = o + 260 + 4 * p          # bsums 2p and 2p + 1: two little-endian int16, one int32
                lo = np.int32(act[m, x]) | (np.int32(act[m, x + 1]) << 8)
                hi = np.int32(act[m, x + 2]) | (np.int32(act[m, x + 3]) << 8)
                bp[b, m, p] = lo | (hi << 16)
    return ap, bp, da


@njit
def _dot_k(codes, sc, mn, dw, dmw, n, nb, act, f16, out):
    M = act.shape[0]
    G = (n + GROUP - 1) // GROUP
    ap, bp, da = _act_pairs_k(act)
    acc = np.empty((M, GROUP), np.float32)
    for g in range(G):
        acc[:, :] = 0
        for b in range(nb):
            gb = g * nb + b
            for m0 in range(0, M, simd.MT):
                so = b * M + m0
                simd.tile_k(codes, gb * 256 * GROUP, sc, mn, gb * 16 * GROUP, dw, dmw, gb * GROUP, ap, so * 128,
                            bp, so * 8, da, so, acc, m0 * GROUP, min(simd.MT, M - m0))
        store_group(acc, out, g, n)


register(T.GGMLType.Q2_K, 84, _pack_q2_k, _dot_k)
register(T.GGMLType.Q3_K, 110, _pack_q3_k, _dot_k)
register(T.GGMLType.Q4_K, 144, _pack_q4_k, _dot_k)
register(T.GGMLType.Q5_K, 176, _pack_q5_k, _dot_k)
register(T.GGMLType.Q6_K, 210, _pack_q6_k, _dot_k)
