"""llama.cpp's x86-64 orders for the K-quants Q2_K, Q3_K, Q4_K (where not repacked) and Q5_K
(``ggtool.kernels.x86`` holds Q6_K and the repacked Q4_K; docs/engine.md, numerics).

Every form below sums the same exact integers (a weight's code times its sub-block scale times an
8-bit activation); only the float32 steps differ, and they are placed as the x86 code places them:

- ``vec_dot_k`` (below 8 activation rows; Q2_K on the AVX2 build): ``ggml_vec_dot_q{2,3,4,5}_K_q8_K``'s
  AVX2 code, which the AVX-512 build compiles too. Per 256-value block 8 lanes, lane l holding the
  values 4l..4l+3 of every 32; ``acc_l = fma(d_a * d_w, lane, acc_l)``; the mins through the bsums:
  Q2_K one more FMA per lane before it (``-(d_a * dmin_w)`` times the lane's two 16-value mins),
  Q4_K a second 4-lane accumulator (pairs of 32-value mins, reduced ``(0+2) + (1+3)``), Q5_K a scalar
  ``summs = fma(-(d_a * dmin_w), sum, summs)``; then hsum_float_8 (plus the mins' sum).
- ``tiled_k`` (from 8 activation rows): ggml-cpu's tiled kernel (tiled/tiled-kernel.cpp, VNNI and AVX2
  alike): per block the exact sums s1 (codes times scales) and s2 (mins times bsums),
  ``r = float(s1) * d_w``, ``r = fma(-dmin_w, float(s2), r)``, ``acc = fma(r, d_a, acc)``.
- ``repacked_q2_k``: the AVX-512 build repacks Q2_K (q2_K_8x8, 2-D weights of 8k rows): the gemv one
  FMA per block (``fma(float(isum), d_w * d_a, acc)``, the mins alike with dmin_w), the gemm for
  activation rows in fours one per half block (128 values); the result ``acc - acc_min``.

The weights are decoded VK rows at a time into "weighted codes" (scale times signed code, exact
integers in float32: below 2**11) side by side, so that every inner loop runs across rows; a 32-value
partial sum stays below 2**23 (exact in float32) and longer exact sums are float64.
"""

from __future__ import annotations

import numpy as np

from .dot_k import _scale_min_k4
from .jit import njit
from .x86 import VK, _act_q8_k, _f16, hsum_float_8, _madd4, fmaf

F32, F64 = np.float32, np.float64

# the types and their blocks: (bytes, mins per block (0: none), values a min covers)
Q2_K, Q3_K, Q4_K, Q5_K = 0, 1, 2, 3
_BYTES = (84, 110, 144, 176)
_NMIN = (16, 0, 8, 8)


@njit
def _decode_k(w, n0, kind, nb, v, mn, wd, wm, f16):
    """Rows n0 .. n0+VK of Q2_K, Q3_K, Q4_K or Q5_K (`kind`): v (nb * 256, VK) the scale times the signed
    code of each value, mn (nb * 16, VK) the mins (16 a block for Q2_K, 8 for Q4_K/Q5_K), wd and wm
    (nb, VK) d and dmin, as float32; rows past the end are zero."""
    nbytes = _BYTES[kind]
    for a in (v, mn, wd, wm):
        a[:, :] = 0
    for r in range(min(VK, w.shape[0] - n0)):
        q = w[n0 + r]
        for b in range(nb):
            o = b * nbytes
            e0 = 256 * b
            if kind == Q2_K:        # scales[16] (scale | min << 4), qs[64], d, dmin
                wd[b, r] = _f16(q, o + 80, f16)
                wm[b, r] = _f16(q, o + 82, f16)
                for j in range(16):
                    mn[16 * b + j, r] = np.int32(q[o + j]) >> 4
                for e in range(256):
                    code = (np.int32(q[o + 16 + 32 * (e // 128) + e % 32]) >> (2 * ((e % 128) // 32))) & 3
                    v[e0 + e, r] = code * (np.int32(q[o + e // 16]) & 15)
            elif kind == Q3_K:      # hmask[32], qs[64], scales[12], d
                wd[b, r] = _f16(q, o + 108, f16)
                for e in range(256):
                    half, j, ll = e // 128, (e % 128) // 32, e % 32
                    low = (np.int32(q[o + 32 + 32 * half + ll]) >> (2 * j)) & 3
                    high = (np.int32(q[o + ll]) >> (4 * half + j)) & 1
                    i = e // 16
                    s = (np.int32(q[o + 96 + i]) & 15) if i < 8 else (np.int32(q[o + 96 + i - 8]) >> 4)
                    s |= ((np.int32(q[o + 104 + i % 4]) >> (2 * (i // 4))) & 3) << 4
                    v[e0 + e, r] = (low - 4 + 4 * high) * (s - 32)
            else:                   # Q4_K: d, dmin, scales[12], qs[128]; Q5_K: qh[32] before qs
                wd[b, r] = _f16(q, o, f16)
                wm[b, r] = _f16(q, o + 2, f16)
                qs = o + (48 if kind == Q5_K else 16)
                for j in range(8):
                    s, m = _scale_min_k4(q, o + 4, j)
                    mn[8 * b + j, r] = m
                    for ll in range(32):
                        x = np.int32(q[qs + 32 * (j // 2) + ll])
                        code = (x >> 4) if j % 2 else (x & 15)
                        if kind == Q5_K:
                            code += ((np.int32(q[o + 16 + ll]) >> j) & 1) << 4
                        v[e0 + 32 * j + ll, r] = code * s


@njit
def vec_dot_k(w, kind, act, out, f16):
    """out (M, N) = w (N rows of Q2_K/Q3_K/Q4_K/Q5_K: `kind`) . act (M rows of Q8_K), as the AVX2
    ggml_vec_dot_*_q8_K (module docstring)."""
    N, M, nb = w.shape[0], act.shape[0], w.shape[1] // _BYTES[kind]
    ad, af, bs = _act_q8_k(act)
    v = np.empty((nb * 256, VK), F32)
    mn = np.empty((nb * 16, VK), F32)
    wd = np.empty((nb, VK), F32)
    wm = np.empty((nb, VK), F32)
    lane = np.empty((8, VK), F32)
    acc = np.empty((8, VK), F32)
    accm = np.empty((4, VK), F32)
    summs = np.empty(VK, F32)
    for n0 in range(0, N, VK):
        _decode_k(w, n0, kind, nb, v, mn, wd, wm, f16)
        for m in range(M):
            acc[:, :] = 0
            accm[:, :] = 0
            summs[:] = 0
            for b in range(nb):
                for ln in range(8):       # lane ln: values 4 ln .. 4 ln + 3 of every 32
                    s = lane[ln]
                    s[:] = 0
                    for c in range(8):
                        _madd4(s, v, af, m, 256 * b + 32 * c + 4 * ln)
                da = ad[m, b]
                dwb, dmb = wd[b], wm[b]
                if kind == Q2_K:        # one lane: the mins of 16-value sub-blocks 2 ln, 2 ln + 1
                    for ln in range(8):
                        b0, b1 = F32(bs[m, 16 * b + 2 * ln]), F32(bs[m, 16 * b + 2 * ln + 1])
                        m0, m1, al = mn[16 * b + 2 * ln], mn[16 * b + 2 * ln + 1], acc[ln]
                        for r in range(VK):
                            al[r] = fmaf(-(da * dmb[r]), m0[r] * b0 + m1[r] * b1, al[r])
                elif kind == Q4_K:      # 4 lanes: pairs of 32-value sub-blocks
                    for p in range(4):
                        j = 16 * b + 4 * p
                        b0 = F32(bs[m, j] + bs[m, j + 1])
                        b1 = F32(bs[m, j + 2] + bs[m, j + 3])
                        m0, m1, ap = mn[8 * b + 2 * p], mn[8 * b + 2 * p + 1], accm[p]
                        for r in range(VK):
                            ap[r] = fmaf(-(da * dmb[r]), m0[r] * b0 + m1[r] * b1, ap[r])
                elif kind == Q5_K:      # one scalar: all 8 sub-blocks' mins
                    for r in range(VK):
                        t = F32(0)
                        for j in range(8):
                            t += mn[8 * b + j, r] * F32(bs[m, 16 * b + 2 * j] + bs[m, 16 * b + 2 * j + 1])
                        summs[r] = fmaf(-(da * dmb[r]), t, summs[r])
                for ln in range(8):
                    s, al = lane[ln], acc[ln]
                    for r in range(VK):
                        al[r] = fmaf(da * dwb[r], s[r], al[r])
            for r in range(min(VK, N - n0)):
                res = hsum_float_8(acc[:, r])
                if kind == Q4_K:
                    res += (accm[0, r] + accm[2, r]) + (accm[1, r] + accm[3, r])
                elif kind == Q5_K:
                    res += summs[r]
                out[m, n0 + r] = res


@njit
def _block_sums(v, mn, af, bs, m, b, kind, lo, hi, s1, s2):
    """s1 (VK) = the exact sum of v . a over values lo..hi of block b (float64), s2 the exact sum of
    the mins times the bsums there (float64, zero without mins)."""
    part = np.empty(v.shape[1], F32)
    s1[:] = 0
    s2[:] = 0
    for c in range(lo // 32, hi // 32):
        part[:] = 0
        for k in range(256 * b + 32 * c, 256 * b + 32 * c + 32, 4):
            _madd4(part, v, af, m, k)
        for r in range(part.shape[0]):
            s1[r] += F64(part[r])
    nmin = _NMIN[kind]
    if nmin:
        per = 256 // nmin               # values a min covers: 16 (Q2_K) or 32
        for j in range(lo // per, hi // per):
            bsum = 0
            for t in range(per // 16):
                bsum += bs[m, 16 * b + j * per // 16 + t]
            mj = mn[nmin * b + j]
            for r in range(part.shape[0]):
                s2[r] += F64(mj[r]) * F64(bsum)


@njit
def tiled_k(w, kind, act, out, f16):
    """out (M, N) = w (N rows of Q2_K/Q3_K/Q4_K/Q5_K) . act (M rows of Q8_K), as ggml-cpu's tiled
    kernel (from 8 rows): per block r = float(s1) * d_w, r = fma(-dmin_w, float(s2), r),
    acc = fma(r, d_a, acc)."""
    N, M, nb = w.shape[0], act.shape[0], w.shape[1] // _BYTES[kind]
    ad, af, bs = _act_q8_k(act)
    v = np.empty((nb * 256, VK), F32)
    mn = np.empty((nb * 16, VK), F32)
    wd = np.empty((nb, VK), F32)
    wm = np.empty((nb, VK), F32)
    s1 = np.empty(VK, F64)
    s2 = np.empty(VK, F64)
    acc = np.empty(VK, F32)
    mins = _NMIN[kind] > 0
    for n0 in range(0, N, VK):
        _decode_k(w, n0, kind, nb, v, mn, wd, wm, f16)
        for m in range(M):
            acc[:] = 0
            for b in range(nb):
                _block_sums(v, mn, af, bs, m, b, kind, 0, 256, s1, s2)
                da, dwb, dmb = ad[m, b], wd[b], wm[b]
                for r in range(VK):
                    res = F32(s1[r]) * dwb[r]
                    if mins:
                        res = fmaf(-dmb[r], F32(s2[r]), res)
                    acc[r] = fmaf(res, da, acc[r])
            for r in range(min(VK, N - n0)):
                out[m, n0 + r] = acc[r]


@njit
def repacked_q2_k(w, act, out, m_first, m_gemm, f16):
    """out (M, N) = w (N rows of Q2_K) . act (M rows of Q8_K) as the AVX-512 build's repacked
    q2_K_8x8 kernels: activation row m is row m_first + m of its matrix; rows below m_gemm (a multiple
    of 4) go through the gemm (one FMA per half block), the rest through the gemv (one per block)."""
    N, M, nb = w.shape[0], act.shape[0], w.shape[1] // 84
    ad, af, bs = _act_q8_k(act)
    v = np.empty((nb * 256, VK), F32)
    mn = np.empty((nb * 16, VK), F32)
    wd = np.empty((nb, VK), F32)
    wm = np.empty((nb, VK), F32)
    s1 = np.empty(VK, F64)
    s2 = np.empty(VK, F64)
    acc = np.empty(VK, F32)
    accm = np.empty(VK, F32)
    for n0 in range(0, N, VK):
        _decode_k(w, n0, Q2_K, nb, v, mn, wd, wm, f16)
        for m in range(M):
            acc[:] = 0
            accm[:] = 0
            step = 128 if m_first + m < m_gemm else 256
            for b in range(nb):
                da, dwb, dmb = ad[m, b], wd[b], wm[b]
                for lo in range(0, 256, step):
                    _block_sums(v, mn, af, bs, m, b, Q2_K, lo, lo + step, s1, s2)
                    for r in range(VK):
                        acc[r] = fmaf(F32(s1[r]), dwb[r] * da, acc[r])
                        accm[r] = fmaf(F32(s2[r]), dmb[r] * da, accm[r])
            for r in range(min(VK, N - n0)):
                out[m, n0 + r] = acc[r] - accm[r]
