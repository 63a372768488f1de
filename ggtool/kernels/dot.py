"""Quantized dot products: weights of a block type x their vec_dot_type activations (Q8_0 or Q8_1
here, Q8_K in ``dot_k``), GGML's integer block dot.

Each weight type registers a ``DotKernel``: ``pack`` (rows of GGML blocks -> an interleaved layout
where ``GROUP`` rows' blocks sit side by side, so the innermost loop runs across rows and
vectorises; GGML's CPU backend repacks Q4_0 for the same reason) and ``dot`` (packed weights x
activation rows -> float32). Adding a type is one pack function and one ``register`` call (and a dot
function if no existing one fits its packed form).

Numerics: per block the integer sum ``sumi`` of code products is exact, then the float32 scaling
is added to the output block after block. For Q4_0 and Q8_0 that is ``(float(sumi) * d_w) * d_a``
from +0.0: GGML's scalar reference (``ggml_vec_dot_q4_0_q8_0`` without SIMD) bit for bit; Q5_0
shares Q8_0's kernel (GGML's scalar Q5_0 multiplies ``(d_w * d_a) * sumi``: the last bit may differ);
Q4_1/Q5_1 add ``(d_w * d_a) * sumi + m_w * s_a`` as GGML's scalar code does.
The order never depends on how rows are split between participants, so results are bit-identical
for 1..N of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import types as T
from .jit import njit
from .tables import F16_TO_F32

GROUP = 128       # weight rows per interleaved group (32 and up vectorise; 128 measured fastest)
Q4_0_BYTES, Q8_0_BYTES, QK = 18, 34, 32



@dataclass(frozen=True)
class DotKernel:
    type: T.GGMLType
    block_bytes: int
    pack: Callable        # (w uint8 (n, row_bytes), f16 table) -> packed arrays (a tuple)
    dot: Callable         # (*packed, act uint8 (M, row_bytes of Q8_0), f16 table, out f32 (M, n)) -> None


DOTS: dict[T.GGMLType, DotKernel] = {}


def register(type_, block_bytes: int, pack, dot) -> None:
    DOTS[type_] = DotKernel(type_, block_bytes, pack, dot)


def pack(type_, w: np.ndarray) -> tuple:
    """The interleaved form of weight rows w (uint8 (n, row_bytes)) of type_."""
    return DOTS[type_].pack(np.ascontiguousarray(w), F16_TO_F32)


def dot(type_, packed: tuple, act: np.ndarray, out: np.ndarray) -> None:
    """out (M, n) = packed weight rows . Q8_0 activation rows act (uint8 (M, row_bytes))."""
    DOTS[type_].dot(*packed, np.ascontiguousarray(act), F16_TO_F32, out)


# -- shared by the Q8_0-activation types -------------------------------------------------------------
@njit
def _q8_0_scales(act, f16, sums):
    """Per activation row and block: d as float32, and (if sums) the sum of the 32 codes."""
    M, nb = act.shape[0], act.shape[1] // Q8_0_BYTES
    d = np.empty((M, nb), np.float32)
    s = np.zeros((M, nb), np.int32)
    qa = act.view(np.int8)
    for m in range(M):
        for b in range(nb):
            o = b * Q8_0_BYTES
            d[m, b] = f16[np.int64(act[m, o]) | (np.int64(act[m, o + 1]) << 8)]
            if sums:
                t = 0
                for k in range(QK):
                    t += np.int32(qa[m, o + 2 + k])
                s[m, b] = t
    return d, s


# Indices are unsigned (U): numba wraps negative indices, and that select per lane would turn every
# contiguous load into a gather; with unsigned indices the row loop vectorises.
U = np.uint64


@njit
def store_group(acc, out, g, n):
    """The results of row group g (acc: (M, GROUP)) into out (M, n), leaving out the padding rows."""
    for m in range(acc.shape[0]):
        for r in range(min(GROUP, n - g * GROUP)):
            out[m, g * GROUP + r] = acc[m, r]


# -- Q4_0 ------------------------------------------------------------------------------------------
@njit
def _pack_q4_0(w, f16):
    """qs[((g*nb + b)*16 + j)*GROUP + r] = byte j of block b of row g*GROUP + r; d likewise (float32)."""
    n, nb = w.shape[0], w.shape[1] // Q4_0_BYTES
    G = (n + GROUP - 1) // GROUP
    qs = np.zeros(G * nb * 16 * GROUP, np.uint8)
    d = np.zeros(G * nb * GROUP, np.float32)
    for g in range(G):
        for b in range(nb):
            o = b * Q4_0_BYTES
            base = (g * nb + b) * 16 * GROUP
            for r in range(min(GROUP, n - g * GROUP)):
                i = g * GROUP + r
                d[(g * nb + b) * GROUP + r] = f16[np.int64(w[i, o]) | (np.int64(w[i, o + 1]) << 8)]
                for j in range(16):
                    qs[base + j * GROUP + r] = w[i, o + 2 + j]
    return qs, d, n, nb


@njit
def _dot_q4_0(qs, d, n, nb, act, f16, out):
    M = act.shape[0]
    G = (n + GROUP - 1) // GROUP
    qa = act.view(np.int8)
    dA, sA = _q8_0_scales(act, f16, True)
    sumi = np.empty(GROUP, np.int32)
    acc = np.empty((M, GROUP), np.float32)
    for g in range(G):
        acc[:, :] = 0
        for b in range(nb):
            base = U((g * nb + b) * 16 * GROUP)
            dw = (g * nb + b) * GROUP
            ao = b * Q8_0_BYTES + 2
            for m in range(M):
                sumi[:] = 0
                for j in range(16):
                    alo = np.int32(qa[m, ao + j])
                    ahi = np.int32(qa[m, ao + 16 + j])
                    o = base + U(j * GROUP)
                    for r in range(GROUP):
                        q = np.int32(qs[o + U(r)])
                        sumi[U(r)] += (q & 15) * alo + (q >> 4) * ahi
                off = 8 * sA[m, b]          # the codes are nibble - 8: sum(8 * a) taken out once
                da = dA[m, b]
                for r in range(GROUP):
                    acc[m, r] += (np.float32(sumi[r] - off) * d[dw + r]) * da
        store_group(acc, out, g, n)


# -- Q8_0 ------------------------------------------------------------------------------------------
@njit
def _pack_q8_0(w, f16):
    """qs[(((g*nb + b)*16 + j)*GROUP + r)*2 + h] = code j + 16h of block b of row g*GROUP + r (the
    pair a byte's nibbles hold in Q4_0: the same loop shape vectorises); d as for Q4_0."""
    n, nb = w.shape[0], w.shape[1] // Q8_0_BYTES
    G = (n + GROUP - 1) // GROUP
    qs = np.zeros(G * nb * QK * GROUP, np.int8)
    d = np.zeros(G * nb * GROUP, np.float32)
    wq = w.view(np.int8)
    for g in range(G):
        for b in range(nb):
            o = b * Q8_0_BYTES
            base = (g * nb + b) * QK * GROUP
            for r in range(min(GROUP, n - g * GROUP)):
                i = g * GROUP + r
                d[(g * nb + b) * GROUP + r] = f16[np.int64(w[i, o]) | (np.int64(w[i, o + 1]) << 8)]
                for j in range(16):
                    qs[base + (j * GROUP + r) * 2] = wq[i, o + 2 + j]
                    qs[base + (j * GROUP + r) * 2 + 1] = wq[i, o + 18 + j]
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
            base = (g * nb + b) * QK * GROUP
            for r in range(min(GROUP, n - g * GROUP)):
                i = g * GROUP + r
                d[(g * nb + b) * GROUP + r] = f16[np.int64(w[i, o]) | (np.int64(w[i, o + 1]) << 8)]
                qh = np.int64(w[i, o + 2]) | (np.int64(w[i, o + 3]) << 8) | (np.int64(w[i, o + 4]) << 16) | \
                    (np.int64(w[i, o + 5]) << 24)
                for j in range(16):
                    q = np.int64(w[i, o + 6 + j])
                    qs[base + (j * GROUP + r) * 2] = ((q & 15) | (((qh >> j) & 1) << 4)) - 16
                    qs[base + (j * GROUP + r) * 2 + 1] = ((q >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16
    return qs, d, n, nb


@njit
def _dot_q8_0(qs, d, n, nb, act, f16, out):
    M = act.shape[0]
    G = (n + GROUP - 1) // GROUP
    qa = act.view(np.int8)
    dA, _ = _q8_0_scales(act, f16, False)
    sumi = np.empty(GROUP, np.int32)
    acc = np.empty((M, GROUP), np.float32)
    for g in range(G):
        acc[:, :] = 0
        for b in range(nb):
            base = U((g * nb + b) * QK * GROUP)
            dw = (g * nb + b) * GROUP
            ao = b * Q8_0_BYTES + 2
            for m in range(M):
                sumi[:] = 0
                for j in range(16):
                    alo = np.int32(qa[m, ao + j])
                    ahi = np.int32(qa[m, ao + 16 + j])
                    o = base + U(j * GROUP * 2)
                    for r in range(GROUP):
                        sumi[U(r)] += np.int32(qs[o + U(2 * r)]) * alo + np.int32(qs[o + U(2 * r + 1)]) * ahi
                da = dA[m, b]
                for r in range(GROUP):
                    acc[m, r] += (np.float32(sumi[r]) * d[dw + r]) * da
        store_group(acc, out, g, n)


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
            base = (g * nb + b) * QK * GROUP
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
                    qs[base + (j * GROUP + r) * 2] = (q & 15) | (((qh >> j) & 1) << 4)
                    qs[base + (j * GROUP + r) * 2 + 1] = (q >> 4) | (((qh >> (j + 16)) & 1) << 4)
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
    M = act.shape[0]
    G = (n + GROUP - 1) // GROUP
    qa = act.view(np.int8)
    dA = np.empty((M, nb), np.float32)
    sA = np.empty((M, nb), np.float32)
    for m in range(M):
        for b in range(nb):
            o = b * 36
            dA[m, b] = f16[np.int64(act[m, o]) | (np.int64(act[m, o + 1]) << 8)]
            sA[m, b] = f16[np.int64(act[m, o + 2]) | (np.int64(act[m, o + 3]) << 8)]
    sumi = np.empty(GROUP, np.int32)
    acc = np.empty((M, GROUP), np.float32)
    for g in range(G):
        acc[:, :] = 0
        for b in range(nb):
            base = U((g * nb + b) * QK * GROUP)
            dw = (g * nb + b) * GROUP
            ao = b * 36 + 4
            for m in range(M):
                sumi[:] = 0
                for j in range(16):
                    alo = np.int32(qa[m, ao + j])
                    ahi = np.int32(qa[m, ao + 16 + j])
                    o = base + U(j * GROUP * 2)
                    for r in range(GROUP):
                        sumi[U(r)] += np.int32(qs[o + U(2 * r)]) * alo + np.int32(qs[o + U(2 * r + 1)]) * ahi
                da, sa = dA[m, b], sA[m, b]
                for r in range(GROUP):
                    acc[m, r] += (d[dw + r] * da) * np.float32(sumi[r]) + mn[dw + r] * sa
        store_group(acc, out, g, n)


register(T.Q4_0, Q4_0_BYTES, _pack_q4_0, _dot_q4_0)
register(T.Q8_0, Q8_0_BYTES, _pack_q8_0, _dot_q8_0)
register(T.GGMLType.Q5_0, 22, _pack_q5_0, _dot_q8_0)
register(T.GGMLType.Q4_1, 20, _pack_q4_1, _dot_q8_1)
register(T.GGMLType.Q5_1, 24, _pack_q5_1, _dot_q8_1)

from . import dot_bf16, dot_k  # noqa: E402,F401 - the BF16 and K-quant dots register themselves
