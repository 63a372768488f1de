"""BF16 dot product: BF16 weights x BF16 activations (GGML's vec_dot_type for BF16 is BF16 itself:
mul_mat converts its f32 activations with GGML_FP32_TO_BF16 into the work buffer first).

Numerics: GGML's scalar ``ggml_vec_dot_bf16`` (ggml-cpu/vec.cpp without SIMD), bit for bit. Per
output element, with ``x`` a weight row and ``y`` an activation row, both widened exactly to float32:
``sumf`` is a double (``ggml_float``) starting at +0.0, ``sumf += (double)(x[i] * y[i])`` for
i = 0..K-1 in order, the product a float32 multiplication (exact for two bf16 values unless it
overflows or falls below float32's normal range), and the result is ``(float)sumf``. GGML's SIMD
builds differ in the last bits: x86 AVX2 sums in 4x8 float32 lanes (and llamafile's tinyBLAS, which
GGML's CPU backend tries first for BF16, in 8 float32 lanes with FMA); the scalar order is the
reference this kernel keeps, and it never depends on how rows are split between participants.

Weights are repacked as the block types' are (``dot``): ``GROUP`` rows' values side by side for
each k, still as bf16 bits (the packed form costs what the weight does); the innermost loop runs
across rows and adds the products into ``GROUP`` double accumulators per activation row, each in k
order. Up to ``FUSED_MAX_M`` activation rows each weight is widened to float32 where it is used
(M=1: ~2.3x faster than a separate pass); for more rows a k-slice is widened once for all of them.
Both orders of work give the same bits.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from .dot_base import GROUP, U, register
from .jit import njit

KB = 256      # k values per slice of widened weights (KB x GROUP float32: 128 KiB, in L2)
FUSED_MAX_M = 4   # up to this many activation rows, each weight is widened where it is used
_S16 = np.uint32(16)


@njit
def _pack(w):
    """qs[(g*K + k)*GROUP + r] = w[g*GROUP + r, k] (bf16 bits); rows past n stay 0."""
    n, K = w.shape[0], w.shape[1]
    G = (n + GROUP - 1) // GROUP
    qs = np.zeros(G * K * GROUP, np.uint16)
    for g in range(G):
        base = g * K * GROUP
        for r in range(min(GROUP, n - g * GROUP)):
            i = g * GROUP + r
            for k in range(K):
                qs[base + k * GROUP + r] = w[i, k]
    return qs, n, K


@njit
def _dot(qs, n, K, act, out):
    """out (M, n) = the packed weight rows . bf16 activation rows act (uint16 (M, K))."""
    M = act.shape[0]
    G = (n + GROUP - 1) // GROUP
    xf = np.empty((M, K), np.float32)
    for m in range(M):
        for k in range(K):
            xf[m, k] = np.uint32(np.uint32(act[m, k]) << _S16).view(np.float32)
    wb = np.empty(KB * GROUP if M > FUSED_MAX_M else 0, np.uint32)
    wf = wb.view(np.float32)
    acc = np.empty((M, GROUP), np.float64)
    for g in range(G):
        acc[:, :] = 0.0
        base = g * K * GROUP
        for k0 in range(0, K, KB):
            nk = min(KB, K - k0)
            src = U(base + k0 * GROUP)
            if M <= FUSED_MAX_M:      # widen each weight as it is used
                for m in range(M):
                    for k in range(nk):
                        xk = xf[m, k0 + k]
                        o = src + U(k * GROUP)
                        for r in range(GROUP):
                            w = np.uint32(np.uint32(qs[o + U(r)]) << _S16).view(np.float32)
                            acc[m, U(r)] += np.float64(w * xk)
            else:                     # widen the k-slice once for all M rows
                for j in range(nk * GROUP):
                    wb[U(j)] = np.uint32(qs[src + U(j)]) << _S16
                for m in range(M):
                    for k in range(nk):
                        xk = xf[m, k0 + k]
                        o = U(k * GROUP)
                        for r in range(GROUP):
                            acc[m, U(r)] += np.float64(wf[o + U(r)] * xk)
        for m in range(M):
            for r in range(min(GROUP, n - g * GROUP)):
                out[m, g * GROUP + r] = np.float32(acc[m, r])


def _bits(a: np.ndarray) -> np.ndarray:
    """bf16 rows as uint16 (M, K): uint16 as they are, uint8 row bytes (M, 2K) viewed."""
    a = np.ascontiguousarray(a)
    return a if a.dtype == np.uint16 else a.view(np.uint16)


def pack_bf16(w, f16=None):
    """The interleaved form of bf16 weight rows (uint16 (n, K), or their bytes uint8 (n, 2K))."""
    return _pack(_bits(w))


def dot_bf16(qs, n, K, act, f16, out) -> None:
    """out (M, n) float32 = packed weights . bf16 activation rows (uint16 (M, K) or bytes (M, 2K))."""
    _dot(qs, n, K, _bits(act), out)


register(T.BF16, 2, pack_bf16, dot_bf16)
