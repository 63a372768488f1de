"""llama.cpp's x86-64 orders for Q4_1, Q5_1 and IQ4_NL weights (``ggtool.kernels.x86`` holds Q4_0,
Q5_0 and Q8_0; docs/engine.md, numerics). Both x86 builds sum these alike.

- ``vec_dot_q1``: Q4_1 / Q5_1 x Q8_1, the only kernel llama.cpp has for them on x86 (no llamafile, no
  repack): ``ggml_vec_dot_q4_1_q8_1`` / ``_q5_1_q8_1``'s AVX2 code. Per block 8 lanes of 4 unsigned
  codes times activations (exact), ``acc_l = fma(d_w * d_a, lane, acc_l)``, and the offsets on the
  side, ``summs = fma(m_w, s_a, summs)``; the result ``hsum_float_8(acc) + summs``.
- ``vec_dot_iq4_nl``: IQ4_NL x Q8_0 for one activation row where the weights are not repacked
  (``ggml_vec_dot_iq4_nl_q8_0``): blocks in pairs into two 8-lane accumulators,
  ``fma(d_a * d_w, lane, acc)``, then ``hsum_float_8(acc1 + acc2)``; an odd last block as
  ``sumf = fma(d_a * d_w, float(sum), sumf)`` (the AVX-512 build: ``sumf + (d_a * d_w) * float(sum)``). From 2 rows llamafile's tinyBLAS_Q0 (``x86.dot_q0``
  with the IQ4_NL levels); repacked (iq4_nl_8x8) as Q4_0's q4_0_8x8 (``x86.dot_q4_0``).
"""

from __future__ import annotations

import numpy as np

from .jit import njit
from .tables import KVALUES_IQ4NL
from .x86 import V0, _act_q8_0, _f16, hsum_float_8, fmaf

F32 = np.float32
Q4_1_KIND, Q5_1_KIND = 0, 1
_BYTES = (20, 24)


@njit
def _act_q8_1(act, f16):
    """Q8_1 rows (d, s, qs[32]): d and s (M, nb), the codes (M, nb * 32) as float32 (exact)."""
    M, nb = act.shape[0], act.shape[1] // 36
    d = np.empty((M, nb), F32)
    s = np.empty((M, nb), F32)
    q = np.empty((M, nb * 32), F32)
    i8 = act.view(np.int8)
    for m in range(M):
        for b in range(nb):
            d[m, b] = _f16(act[m], 36 * b, f16)
            s[m, b] = _f16(act[m], 36 * b + 2, f16)
            for k in range(32):
                q[m, 32 * b + k] = i8[m, 36 * b + 4 + k]
    return d, s, q


@njit
def _decode_q1(w, n0, kind, nb, wq, wd, wm, f16):
    """Rows n0 .. n0+V0 of Q4_1 or Q5_1: codes 0..15 / 0..31 (nb * 32, V0), d and m (nb, V0), as float32;
    rows past the end are zero."""
    nbytes = _BYTES[kind]
    wq[:, :] = 0
    wd[:, :] = 0
    wm[:, :] = 0
    for r in range(min(V0, w.shape[0] - n0)):
        q = w[n0 + r]
        for b in range(nb):
            o = b * nbytes
            wd[b, r] = _f16(q, o, f16)
            wm[b, r] = _f16(q, o + 2, f16)
            if kind == Q5_1_KIND:
                qh = (np.uint32(q[o + 4]) | (np.uint32(q[o + 5]) << 8) | (np.uint32(q[o + 6]) << 16)
                      | (np.uint32(q[o + 7]) << 24))
                for j in range(16):
                    x = np.int32(q[o + 8 + j])
                    wq[32 * b + j, r] = (x & 15) | np.int32(((qh >> j) & 1) << 4)
                    wq[32 * b + 16 + j, r] = (x >> 4) | np.int32(((qh >> (j + 16)) & 1) << 4)
            else:
                for j in range(16):
                    x = np.int32(q[o + 4 + j])
                    wq[32 * b + j, r] = x & 15
                    wq[32 * b + 16 + j, r] = x >> 4


@njit
def vec_dot_q1(w, kind, act, out, f16):
    """out (M, N) = w (N rows of Q4_1 or Q5_1: `kind`) . act (M rows of Q8_1) (module docstring). A
    lane's four products stay below 2**15: exact in float32."""
    N, M = w.shape[0], act.shape[0]
    nb = w.shape[1] // _BYTES[kind]
    ad, asum, af = _act_q8_1(act, f16)
    wq = np.empty((nb * 32, V0), F32)
    wd = np.empty((nb, V0), F32)
    wm = np.empty((nb, V0), F32)
    c = np.empty((8, V0), F32)
    summs = np.empty(V0, F32)
    db = np.empty(V0, F32)
    for n0 in range(0, N, V0):
        _decode_q1(w, n0, kind, nb, wq, wd, wm, f16)
        for m in range(M):
            c[:, :] = 0
            summs[:] = 0
            for b in range(nb):
                dm, sm, wdb, wmb = ad[m, b], asum[m, b], wd[b], wm[b]
                for r in range(V0):
                    summs[r] = fmaf(wmb[r], sm, summs[r])
                    db[r] = wdb[r] * dm
                for lane in range(8):
                    k = 32 * b + 4 * lane
                    a0, a1, a2, a3 = af[m, k], af[m, k + 1], af[m, k + 2], af[m, k + 3]
                    w0, w1, w2, w3, cl = wq[k], wq[k + 1], wq[k + 2], wq[k + 3], c[lane]
                    for r in range(V0):
                        cl[r] = fmaf(db[r], w0[r] * a0 + w1[r] * a1 + w2[r] * a2 + w3[r] * a3, cl[r])
            for r in range(min(V0, N - n0)):
                out[m, n0 + r] = hsum_float_8(c[:, r]) + summs[r]


@njit
def _decode_iq4_nl(w, n0, nb, wq, wd, f16):
    """Rows n0 .. n0+V0 of IQ4_NL: the levels (nb * 32, V0) and d (nb, V0), as float32."""
    wq[:, :] = 0
    wd[:, :] = 0
    for r in range(min(V0, w.shape[0] - n0)):
        q = w[n0 + r]
        for b in range(nb):
            o = b * 18
            wd[b, r] = _f16(q, o, f16)
            for j in range(16):
                x = np.int32(q[o + 2 + j])
                wq[32 * b + j, r] = KVALUES_IQ4NL[x & 15]
                wq[32 * b + 16 + j, r] = KVALUES_IQ4NL[x >> 4]


@njit
def vec_dot_iq4_nl(w, act, out, fused_tail, f16):
    """out (M, N) = w (N rows of IQ4_NL) . act (M rows of Q8_0), as ggml_vec_dot_iq4_nl_q8_0's AVX2 code
    (module docstring); `fused_tail`: the odd last block added by FMA (the AVX2 build), else its
    product rounded first (the AVX-512 build: GCC contracted the one and not the other). A lane's
    four products stay below 2**16, a block's sum below 2**19: exact."""
    N, M = w.shape[0], act.shape[0]
    nb = w.shape[1] // 18
    ad, af = _act_q8_0(act, f16)
    wq = np.empty((nb * 32, V0), F32)
    wd = np.empty((nb, V0), F32)
    c = np.empty((2, 8, V0), F32)
    db = np.empty(V0, F32)
    tail = np.empty(V0, F32)
    for n0 in range(0, N, V0):
        _decode_iq4_nl(w, n0, nb, wq, wd, f16)
        for m in range(M):
            c[:, :, :] = 0
            for b in range(nb - nb % 2):
                dm, wdb, cb = ad[m, b], wd[b], c[b % 2]
                for r in range(V0):
                    db[r] = dm * wdb[r]
                for lane in range(8):
                    k = 32 * b + 4 * lane
                    a0, a1, a2, a3 = af[m, k], af[m, k + 1], af[m, k + 2], af[m, k + 3]
                    w0, w1, w2, w3, cl = wq[k], wq[k + 1], wq[k + 2], wq[k + 3], cb[lane]
                    for r in range(V0):
                        cl[r] = fmaf(db[r], w0[r] * a0 + w1[r] * a1 + w2[r] * a2 + w3[r] * a3, cl[r])
            for r in range(min(V0, N - n0)):
                tail[r] = hsum_float_8(c[0, :, r] + c[1, :, r])
            if nb % 2:
                b = nb - 1
                dm, wdb = ad[m, b], wd[b]
                for r in range(V0):
                    s = F32(0)
                    for k in range(32 * b, 32 * b + 32):
                        s += wq[k, r] * af[m, k]
                    tail[r] = fmaf(dm * wdb[r], s, tail[r]) if fused_tail else tail[r] + (dm * wdb[r]) * s
            for r in range(min(V0, N - n0)):
                out[m, n0 + r] = tail[r]
