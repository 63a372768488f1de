"""Quantized dot products: weights of a block type x their vec_dot_type activations (Q8_0 or Q8_1
here, Q8_K in ``dot_k``), GGML's integer block dot.

Each weight type registers a ``DotKernel`` (``dot_base``, the registry this module, ``dot_k`` and
``dot_bf16`` share; importing this module loads all three): ``pack`` (rows of GGML blocks -> an interleaved layout
where the codes of 16 rows sit side by side in groups of ``GROUP`` rows, as ``simd``'s vector tiles
read them; GGML's CPU backend repacks Q4_0 for the same reason) and ``dot`` (packed weights x
activation rows -> float32: the activations prepared as ``simd``'s int16 pairs, then per row group
and block one tile for up to ``simd.MT`` activation rows at a time). Adding a type is one pack
function and one ``register`` call (and a dot function if no existing one fits its packed form).

Numerics: per block the integer sum ``sumi`` of code products is exact, then the float32 scaling
is added to the output block after block. For Q4_0 and Q8_0 that is ``(float(sumi) * d_w) * d_a``
from +0.0: GGML's scalar reference (``ggml_vec_dot_q4_0_q8_0`` without SIMD) bit for bit; Q5_0
shares Q8_0's kernel (GGML's scalar Q5_0 multiplies ``(d_w * d_a) * sumi``: the last bit may differ);
Q4_1/Q5_1 add ``(d_w * d_a) * sumi + m_w * s_a`` as GGML's scalar code does.
The order never depends on how rows are split between participants, so results are bit-identical
for 1..N of them.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from . import dot_bf16, dot_float, dot_k, simd  # noqa: F401 - the BF16, F32/F16 and K-quant dots register themselves
from .dot_base import DOTS, GROUP, register, store_group
from .jit import njit
from .tables import F16_TO_F32

Q4_0_BYTES, Q8_0_BYTES, QK = 18, 34, 32


def pack(type_, w: np.ndarray) -> tuple:
    """The interleaved form of weight rows w (uint8 (n, row_bytes)) of type_."""
    return DOTS[type_].pack(np.ascontiguousarray(w), F16_TO_F32)


def dot(type_, packed: tuple, act: np.ndarray, out: np.ndarray) -> None:
    """out (M, n) = packed weight rows . Q8_0 activation rows act (uint8 (M, row_bytes))."""
    DOTS[type_].dot(*packed, np.ascontiguousarray(act), F16_TO_F32, out)


# -- shared by the 32-value block types ------------------------------------------------------------
@njit
def _at(g, nb, b, r, byte, quads):
    """Index of byte `byte` of row g*GROUP + r's block b in ``simd``'s layout: quads of 4 bytes per
    row and block, for L rows side by side, a chunk of L rows' quads after another."""
    return ((((g * nb + b) * (GROUP // simd.L) + r // simd.L) * quads + byte // 4) * simd.L + r % simd.L) * 4 + byte % 4


@njit
def _act_pairs(act, f16, nbytes, nibbles, sums):
    """Q8_0 (34-byte) or Q8_1 (36-byte: s at byte 2) activation rows as ``simd``'s tiles read them,
    indexed [block, row]: ap (16 int16 pairs per block and row, in the order of the weight
    codes: ``simd``'s docstring), off (-8 * sum of the 32 codes if sums, else 0: Q4_0's codes are
    nibble - 8), d and s as float32."""
    M, nb = act.shape[0], act.shape[1] // nbytes
    qa = act.view(np.int8)
    q0 = nbytes - 32
    ap = np.empty((nb, M, 16), np.int32)
    off = np.zeros((nb, M), np.int32)
    da = np.empty((nb, M), np.float32)
    sa = np.zeros((nb, M), np.float32)
    for m in range(M):
        for b in range(nb):
            o = b * nbytes
            da[b, m] = f16[np.int64(act[m, o]) | (np.int64(act[m, o + 1]) << 8)]
            if nbytes == 36:
                sa[b, m] = f16[np.int64(act[m, o + 2]) | (np.int64(act[m, o + 3]) << 8)]
            if sums:
                t = 0
                for k in range(QK):
                    t += np.int32(qa[m, o + q0 + k])
                off[b, m] = -8 * t
            for p in range(16):
                x = 4 * (p // 4) + (p % 4) // 2 + 16 * (p % 2) if nibbles else 4 * (p // 2) + p % 2
                ap[b, m, p] = (np.int32(qa[m, o + q0 + x]) & 0xFFFF) | (np.int32(qa[m, o + q0 + x + 2]) << 16)
    return ap, off, da, sa


# The drivers of the three tiles (one each, so that a type compiles only its own tile): per group of
# GROUP weight rows and block, ``simd``'s tile for MT activation rows at a time, into acc (M, GROUP).
@njit
def _run_q4_0(qs, d, n, nb, ap, off, da, out):
    M, G = ap.shape[1], (n + GROUP - 1) // GROUP
    acc = np.empty((M, GROUP), np.float32)
    for g in range(G):
        acc[:, :] = 0
        for b in range(nb):
            wo = (g * nb + b) * GROUP
            for m0 in range(0, M, simd.MT):
                so = b * M + m0
                simd.tile_q4_0(qs, wo * 16, d, d, wo, ap, so * 16, off, da, da, so, acc, m0 * GROUP, min(simd.MT, M - m0))
        store_group(acc, out, g, n)


@njit
def _run_q8_0(qs, d, n, nb, ap, off, da, out):
    M, G = ap.shape[1], (n + GROUP - 1) // GROUP
    acc = np.empty((M, GROUP), np.float32)
    for g in range(G):
        acc[:, :] = 0
        for b in range(nb):
            wo = (g * nb + b) * GROUP
            for m0 in range(0, M, simd.MT):
                so = b * M + m0
                simd.tile_q8_0(qs, wo * QK, d, d, wo, ap, so * 16, off, da, da, so, acc, m0 * GROUP, min(simd.MT, M - m0))
        store_group(acc, out, g, n)


@njit
def _run_q8_1(qs, d, mn, n, nb, ap, off, da, sa, out):
    M, G = ap.shape[1], (n + GROUP - 1) // GROUP
    acc = np.empty((M, GROUP), np.float32)
    for g in range(G):
        acc[:, :] = 0
        for b in range(nb):
            wo = (g * nb + b) * GROUP
            for m0 in range(0, M, simd.MT):
                so = b * M + m0
                simd.tile_q8_1(qs, wo * QK, d, mn, wo, ap, so * 16, off, da, sa, so, acc, m0 * GROUP, min(simd.MT, M - m0))
        store_group(acc, out, g, n)


# -- Q4_0 ------------------------------------------------------------------------------------------
@njit
def _pack_q4_0(w, f16):
    """qs: the 16 nibble bytes of each row and block in quads (``_at``); d[(g*nb + b)*GROUP + r]
    the block's scale as float32."""
    n, nb = w.shape[0], w.shape[1] // Q4_0_BYTES
    G = (n + GROUP - 1) // GROUP
    qs = np.zeros(G * nb * 16 * GROUP, np.uint8)
    d = np.zeros(G * nb * GROUP, np.float32)
    for g in range(G):
        for b in range(nb):
            o = b * Q4_0_BYTES
            for r in range(min(GROUP, n - g * GROUP)):
                i = g * GROUP + r
                d[(g * nb + b) * GROUP + r] = f16[np.int64(w[i, o]) | (np.int64(w[i, o + 1]) << 8)]
                for j in range(16):
                    qs[_at(g, nb, b, r, j, 4)] = w[i, o + 2 + j]
    return qs, d, n, nb


@njit
def _dot_q4_0(qs, d, n, nb, act, f16, out):
    ap, off, da, sa = _act_pairs(act, f16, Q8_0_BYTES, True, True)
    _run_q4_0(qs, d, n, nb, ap, off, da, out)


# -- Q8_0 ------------------------------------------------------------------------------------------
@njit
def _pack_q8_0(w, f16):
    """qs: the 32 int8 codes of each row and block in quads (``_at``); d as for Q4_0."""
    n, nb = w.shape[0], w.shape[1] // Q8_0_BYTES
    G = (n + GROUP - 1) // GROUP
    qs = np.zeros(G * nb * QK * GROUP, np.int8)
    d = np.zeros(G * nb * GROUP, np.float32)
    wq = w.view(np.int8)
    for g in range(G):
        for b in range(nb):
            o = b * Q8_0_BYTES
            for r in range(min(GROUP, n - g * GROUP)):
                i = g * GROUP + r
                d[(g * nb + b) * GROUP + r] = f16[np.int64(w[i, o]) | (np.int64(w[i, o + 1]) << 8)]
                for j in range(QK):
                    qs[_at(g, nb, b, r, j, 8)] = wq[i, o + 2 + j]
    return qs, d, n, nb


@njit
def _pack_q5_0(w, f16):
    """Q5_0 (22 bytes: d, qh u32, nibbles) as Q8_0's packed form: codes (nibble | bit << 4) - 16."""
    n, nb = w.shape[0], w.shape[1] // 22
    G = (n + GROUP - 1) // GROUP
    qs = np.zeros(G * nb * QK * GROUP, np.int8)
    d = np.zeros(G * nb * GROUP, np.float32)
    for g in range(G):
        for b in range(nb):
            o = b * 22
            for r in range(min(GROUP, n - g * GROUP)):
                i = g * GROUP + r
                d[(g * nb + b) * GROUP + r] = f16[np.int64(w[i, o]) | (np.int64(w[i, o + 1]) << 8)]
                qh = np.int64(w[i, o + 2]) | (np.int64(w[i, o + 3]) << 8) | (np.int64(w[i, o + 4]) << 16) | \
                    (np.int64(w[i, o + 5]) << 24)
                for j in range(16):
                    q = np.int64(w[i, o + 6 + j])
                    qs[_at(g, nb, b, r, j, 8)] = ((q & 15) | (((qh >> j) & 1) << 4)) - 16
                    qs[_at(g, nb, b, r, j + 16, 8)] = ((q >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16
    return qs, d, n, nb


@njit
def _dot_q8_0(qs, d, n, nb, act, f16, out):
    ap, off, da, sa = _act_pairs(act, f16, Q8_0_BYTES, False, False)
    _run_q8_0(qs, d, n, nb, ap, off, da, out)


# -- Q4_1 / Q5_1 x Q8_1 ------------------------------------------------------------------------------
@njit
def _pack_q_1(w, f16, nbytes, five):
    """Q4_1 (20 bytes: d, m, nibbles) or Q5_1 (24: d, m, qh u32, nibbles): codes 0..15 / 0..31 in
    Q8_0's packed form, plus the min m per row and block (value = d * code + m)."""
    n, nb = w.shape[0], w.shape[1] // nbytes
    G = (n + GROUP - 1) // GROUP
    qs = np.zeros(G * nb * QK * GROUP, np.int8)
    d = np.zeros(G * nb * GROUP, np.float32)
    mn = np.zeros(G * nb * GROUP, np.float32)
    q0 = 8 if five else 4
    for g in range(G):
        for b in range(nb):
            o = b * nbytes
            for r in range(min(GROUP, n - g * GROUP)):
                i = g * GROUP + r
                d[(g * nb + b) * GROUP + r] = f16[np.int64(w[i, o]) | (np.int64(w[i, o + 1]) << 8)]
                mn[(g * nb + b) * GROUP + r] = f16[np.int64(w[i, o + 2]) | (np.int64(w[i, o + 3]) << 8)]
                qh = np.int64(0)
                if five:
                    qh = np.int64(w[i, o + 4]) | (np.int64(w[i, o + 5]) << 8) | (np.int64(w[i, o + 6]) << 16) | \
                        (np.int64(w[i, o + 7]) << 24)
                for j in range(16):
                    q = np.int64(w[i, o + q0 + j])
                    qs[_at(g, nb, b, r, j, 8)] = (q & 15) | (((qh >> j) & 1) << 4)
                    qs[_at(g, nb, b, r, j + 16, 8)] = (q >> 4) | (((qh >> (j + 16)) & 1) << 4)
    return qs, d, mn, n, nb


@njit
def _pack_q4_1(w, f16):
    return _pack_q_1(w, f16, 20, False)


@njit
def _pack_q5_1(w, f16):
    return _pack_q_1(w, f16, 24, True)


@njit
def _dot_q8_1(qs, d, mn, n, nb, act, f16, out):
    """GGML's scalar vec_dot_q4_1_q8_1 / q5_1: out += (d_w * d_a) * sumi + m_w * s_a per block."""
    ap, off, da, sa = _act_pairs(act, f16, 36, False, False)
    _run_q8_1(qs, d, mn, n, nb, ap, off, da, sa, out)


register(T.Q4_0, Q4_0_BYTES, _pack_q4_0, _dot_q4_0)
register(T.Q8_0, Q8_0_BYTES, _pack_q8_0, _dot_q8_0)
register(T.GGMLType.Q5_0, 22, _pack_q5_0, _dot_q8_0)
register(T.GGMLType.Q4_1, 20, _pack_q4_1, _dot_q8_1)
register(T.GGMLType.Q5_1, 24, _pack_q5_1, _dot_q8_1)
