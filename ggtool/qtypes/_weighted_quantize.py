"""The importance-matrix (quant_weights) paths of ggml_quantize_chunk, bit for bit, compiled:
``quantize_row_q4_0_impl``, ``q4_1``, ``q5_0``, ``q5_1`` (legacy 32-value blocks),
``quantize_row_q2_K_impl`` .. ``q6_K_impl`` and ``quantize_iq4_nl`` with weights, and the searches
only they use (``make_qx_quants`` weighted, ``make_qkx3_quants``, ``make_qp_quants``).

Each kernel takes (xb float32 (n, qk), out uint8 (n, block bytes), qw float32 (blocks per row, qk):
the importance of each column, f16 table); xb's blocks are whole rows in order (a row is
qw.shape[0] blocks) because the legacy paths take sigma2 over a whole row. It returns -1 or the
flat index in xb of its first NaN/inf. The float32 order of operations is GGML's, as in
``blocks`` (every constant float32, integers made float32 before they meet a float).
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels.jit import njit
from ._k_quantize import _MAGIC, GROUP_MAX_EPS, QK_K, _bits, _first_bad, _fp16_round, _put_f16, _q2_k_write, _q3_k_write, _q6_k_write, _q45_k_write, nearest_int
from ._iq4nl_quantize import KVALUES, iq4_nl_block, iq4_nl_finish

F32 = np.float32
_F0 = F32(0.0)
_F1 = F32(1.0)
_F01 = F32(0.1)
_RMIN = F32(-0.9)
_RDELTA = F32(0.05)


# make_qx_quants' 19 trial scales (steps -9..9, step 0 the first guess) summed side by side, one lane each:
# each lane's two sums keep C's order, but the lanes' adds overlap instead of waiting on each other.
STEP_LANES = 24                   # 19 lanes padded to whole vectors (the rest repeat step 0)
SCRATCH = 3 * STEP_LANES          # float32s of make_qx_quants_w's `fl`


@njit(inline="always")
def _code(iscale, v, nmax):
    """max(-nmax, min(nmax - 1, nearest_int(iscale * v))) in int32 (nearest_int's value, vectorisable)."""
    q = (_bits(F32(F32(iscale * v) + _MAGIC)) & np.int32(0x7FFFFF)) - np.int32(0x400000)
    return max(np.int32(-nmax), min(np.int32(nmax - 1), q))


@njit
def make_qx_quants_w(x, n, nmax, L, qw, wx, fl):
    """make_qx_quants(n, nmax, x, L, rmse_type=1, qw): codes L[:n] in 0..2*nmax-1, the scale.
    wx: scratch of n float32 (qw*x); fl: scratch of SCRATCH float32 (each step's inverse scale and
    two sums). The steps are decided in C's order once every step's sums are known."""
    amax = _F0
    mx = _F0
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _F0
    for i in range(n):
        wx[i] = F32(qw[i] * x[i])
    fn = F32(nmax)
    isc = fl[0:STEP_LANES]
    sx = fl[STEP_LANES:2 * STEP_LANES]
    s2 = fl[2 * STEP_LANES:3 * STEP_LANES]
    for k in range(STEP_LANES):
        step = k - 9 if k < 19 else 0          # step 0: -nmax/mx, the first guess (fn + 0 is fn)
        isc[k] = F32(-F32(fn + F32(_F01 * F32(step))) / mx)
        sx[k] = _F0
        s2[k] = _F0
    lo, hi = F32(-nmax), F32(nmax - 1)
    for i in range(n):
        xi = x[i]
        wxi = wx[i]
        qwi = qw[i]
        for k in range(STEP_LANES):     # |isc*x| <= nmax + 0.9: nearest_int is (v + 1.5*2**23) - 1.5*2**23
            f = max(lo, min(hi, F32(F32(F32(isc[k] * xi) + _MAGIC) - _MAGIC)))
            sx[k] = F32(sx[k] + F32(wxi * f))
            s2[k] = F32(s2[k] + F32(F32(qwi * f) * f))
    sumlx = sx[9]
    suml2 = s2[9]
    scale = F32(sumlx / suml2) if suml2 != _F0 else _F0
    best = F32(scale * sumlx)
    win = 9
    for k in range(19):
        if k == 9:
            continue
        sumlx = sx[k]
        suml2 = s2[k]
        if suml2 > _F0 and F32(sumlx * sumlx) > F32(best * suml2):
            scale = F32(sumlx / suml2)
            best = F32(scale * sumlx)
            win = k
    iscale = isc[win]
    for i in range(n):
        L[i] = np.int64(_code(iscale, x[i], nmax)) + nmax
    return scale


@njit
def make_qkx3_quants(x, n, nmax, w, L, Laux):
    """make_qkx3_quants(n, nmax, x, w, L, &the_min, Laux, -0.9f, 0.05f, 36, false), the only way
    GGML calls it: codes L[:n] in 0..nmax; returns (scale, the_min)."""
    mn = x[0]
    mx = x[0]
    sum_w = w[0]
    sum_x = F32(sum_w * x[0])
    for i in range(1, n):
        xi = x[i]
        if xi < mn:
            mn = xi
        if xi > mx:
            mx = xi
        sum_w = F32(sum_w + w[i])
        sum_x = F32(sum_x + F32(w[i] * xi))
    if mn > _F0:
        mn = _F0
    if mx <= mn:
        for i in range(n):
            L[i] = 0
        return _F0, F32(-mn)
    fn = F32(nmax)
    iscale = F32(fn / F32(mx - mn))
    scale = F32(_F1 / iscale)
    best_mad = _F0
    for i in range(n):
        lv = max(0, min(nmax, nearest_int(F32(iscale * F32(x[i] - mn)))))
        L[i] = lv
        diff = F32(F32(F32(scale * F32(lv)) + mn) - x[i])
        best_mad = F32(best_mad + F32(w[i] * F32(diff * diff)))
    for step in range(37):
        iscale = F32(F32(F32(_RMIN + F32(_RDELTA * F32(step))) + fn) / F32(mx - mn))
        sum_l = _F0
        sum_l2 = _F0
        sum_xl = _F0
        for i in range(n):
            lv = max(0, min(nmax, nearest_int(F32(iscale * F32(x[i] - mn)))))
            Laux[i] = lv
            wl = F32(w[i] * F32(lv))
            sum_l = F32(sum_l + wl)
            sum_l2 = F32(sum_l2 + F32(wl * F32(lv)))
            sum_xl = F32(sum_xl + F32(wl * x[i]))
        D = F32(F32(sum_w * sum_l2) - F32(sum_l * sum_l))
        if D > _F0:
            this_scale = F32(F32(F32(sum_w * sum_xl) - F32(sum_x * sum_l)) / D)
            this_min = F32(F32(F32(sum_l2 * sum_x) - F32(sum_l * sum_xl)) / D)
            if this_min > _F0:
                this_min = _F0
                this_scale = F32(sum_xl / sum_l2)
            mad = _F0
            for i in range(n):
                diff = F32(F32(F32(this_scale * F32(Laux[i])) + this_min) - x[i])
                mad = F32(mad + F32(w[i] * F32(diff * diff)))
            if mad < best_mad:
                for i in range(n):
                    L[i] = Laux[i]
                best_mad = mad
                scale = this_scale
                mn = this_min
    return scale, F32(-mn)


@njit
def make_qp_quants(n, nmax, x, L, qw):
    """make_qp_quants(n, nmax, x, L, quant_weights): codes L[:n] as uint8_t (a negative code wraps,
    as in C), the scale."""
    mx = _F0
    for i in range(n):
        mx = mx if mx > x[i] else x[i]
    if mx < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _F0
    fn = F32(nmax)
    iscale = F32(fn / mx)
    for i in range(n):
        L[i] = nearest_int(F32(iscale * x[i])) & 0xFF
    scale = F32(_F1 / iscale)
    best_mse = _F0
    for i in range(n):
        diff = F32(x[i] - F32(scale * F32(L[i])))
        best_mse = F32(best_mse + F32(F32(qw[i] * diff) * diff))
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = F32(F32(F32(_F01 * F32(step)) + fn) / mx)
        scale_is = F32(_F1 / iscale_is)
        mse = _F0
        for i in range(n):
            lv = min(nmax, nearest_int(F32(iscale_is * x[i])))
            diff = F32(x[i] - F32(scale_is * F32(lv)))
            mse = F32(mse + F32(F32(qw[i] * diff) * diff))
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = _F0
    suml2 = _F0
    for i in range(n):
        lv = min(nmax, nearest_int(F32(iscale * x[i])))
        L[i] = lv & 0xFF
        fl = F32(lv)
        sumlx = F32(sumlx + F32(F32(qw[i] * x[i]) * fl))
        suml2 = F32(suml2 + F32(F32(qw[i] * fl) * fl))
    for _ in range(5):
        changed = 0
        for i in range(n):
            w = qw[i]
            li = F32(L[i])
            slx = F32(sumlx - F32(F32(w * x[i]) * li))
            sl2 = F32(suml2 - F32(F32(w * li) * li))
            if slx > _F0 and sl2 > _F0:
                new_l = min(nmax, nearest_int(F32(F32(x[i] * sl2) / slx)))
                if new_l != L[i]:
                    fl = F32(new_l)
                    slx = F32(slx + F32(F32(w * x[i]) * fl))
                    sl2 = F32(sl2 + F32(F32(w * fl) * fl))
                    if F32(F32(slx * slx) * suml2) > F32(F32(sumlx * sumlx) * sl2):
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if changed == 0:
            break
    return F32(sumlx / suml2) if suml2 > _F0 else _F0


@njit
def _sum_x2(x, n):
    s = _F0
    for j in range(n):
        s = F32(s + F32(x[j] * x[j]))
    return s


@njit
def _weights(x, qw, sigma2, w, n):
    """w[j] = qw[j] * sqrtf(sigma2 + x[j]*x[j]), every path's weight."""
    for j in range(n):
        w[j] = F32(qw[j] * F32(math.sqrt(F32(sigma2 + F32(x[j] * x[j])))))


@njit
def _row_sigma2(xb, r0, nbpr):
    """sum of x*x over a whole row of 32-value blocks, over n_per_row: the legacy paths' sigma2."""
    s = _F0
    for b in range(r0, r0 + nbpr):
        for j in range(xb.shape[1]):
            v = xb[b, j]
            s = F32(s + F32(v * v))
    return F32(s / F32(nbpr * xb.shape[1]))


@njit
def _put_u32(out, i, at, v):
    for k in range(4):
        out[i, at + k] = np.uint8((v >> (8 * k)) & 0xFF)


@njit
def _legacy(xb, out, qw, f16, kind):
    """quantize_row_q4_0/q4_1/q5_0/q5_1_impl (kind 0..3) over whole rows."""
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    nbpr = qw.shape[0]
    w = np.zeros(32, np.float32)
    wx = np.zeros(32, np.float32)
    fl = np.zeros(SCRATCH, np.float32)
    L = np.zeros(32, np.int64)
    Laux = np.zeros(32, np.int64)
    for r0 in range(0, xb.shape[0], nbpr):
        sigma2 = _row_sigma2(xb, r0, nbpr)
        for b in range(nbpr):
            i = r0 + b
            x = xb[i]
            _weights(x, qw[b], sigma2, w, 32)
            if kind == 0 or kind == 2:
                d = make_qx_quants_w(x, 32, 8 if kind == 0 else 16, L, w, wx, fl)
                hd, _ = _fp16_round(d, f16)
                _put_f16(out, i, 0, hd)
                at = 2
            else:
                d, the_min = make_qkx3_quants(x, 32, 15 if kind == 1 else 31, w, L, Laux)
                hd, _ = _fp16_round(d, f16)
                hm, _ = _fp16_round(F32(-the_min), f16)
                _put_f16(out, i, 0, hd)
                _put_f16(out, i, 2, hm)
                at = 4
            if kind <= 1:
                for j in range(16):
                    out[i, at + j] = np.uint8((L[j] | (L[j + 16] << 4)) & 0xFF)
            else:
                qh = np.int64(0)
                for j in range(16):
                    out[i, at + 4 + j] = np.uint8((L[j] & 0xF) | ((L[j + 16] & 0xF) << 4))
                    qh |= ((L[j] & 0x10) >> 4) << j
                    qh |= ((L[j + 16] & 0x10) >> 4) << (j + 16)
                _put_u32(out, i, at, qh)
    return -1


@njit
def q4_0_quantize_w(xb, out, qw, f16):
    return _legacy(xb, out, qw, f16, 0)


@njit
def q4_1_quantize_w(xb, out, qw, f16):
    return _legacy(xb, out, qw, f16, 1)


@njit
def q5_0_quantize_w(xb, out, qw, f16):
    return _legacy(xb, out, qw, f16, 2)


@njit
def q5_1_quantize_w(xb, out, qw, f16):
    return _legacy(xb, out, qw, f16, 3)


@njit
def iq4_nl_quantize_w(xb, out, qw, f16):
    """quantize_iq4_nl with quant_weights: sigma2 over each 32-value block."""
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    nbpr = qw.shape[0]
    L = np.zeros(32, np.int64)
    w = np.zeros(32, np.float32)
    for i in range(xb.shape[0]):
        x = xb[i]
        sigma2 = F32(_sum_x2(x, 32) * F32(0.0625))
        _weights(x, qw[i % nbpr], sigma2, w, 32)
        d = iq4_nl_block(x, w, KVALUES, L, 7)
        iq4_nl_finish(x, d, KVALUES, L, out, i, f16)
    return -1


@njit
def q2_k_quantize_w(xb, out, qw, f16):
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    nbpr = qw.shape[0]
    L = np.zeros(QK_K, np.int64)
    Laux = np.zeros(16, np.int64)
    w = np.zeros(16, np.float32)
    scales = np.zeros(16, np.float32)
    mins = np.zeros(16, np.float32)
    sw = np.zeros(16, np.float32)
    Ls = np.zeros(16, np.int64)
    Lm = np.zeros(16, np.int64)
    sc = np.zeros(16, np.int64)
    for i in range(xb.shape[0]):
        x = xb[i]
        q = qw[i % nbpr]
        sigma2 = F32(_sum_x2(x, QK_K) / F32(256.0))
        for j in range(16):
            _weights(x[16 * j:16 * j + 16], q[16 * j:16 * j + 16], sigma2, w, 16)
            sw[j] = _sum(w, 16)
            scales[j], mins[j] = make_qkx3_quants(x[16 * j:16 * j + 16], 16, 3, w, L[16 * j:16 * j + 16], Laux)
        dm = make_qp_quants(16, 15, scales, Ls, sw)
        mm = make_qp_quants(16, 15, mins, Lm, sw)
        hd, d = _fp16_round(dm, f16)
        hm, dmin = _fp16_round(mm, f16)
        for j in range(16):
            sc[j] = (Ls[j] | (Lm[j] << 4)) & 0xFF
        _q2_k_write(x, L, sc, hd, d, hm, dmin, out, i)
    return -1


@njit
def _sum(w, n):
    """sum of w[:n] from 0, in order (the sub-blocks' total weight)."""
    s = _F0
    for j in range(n):
        s = F32(s + w[j])
    return s


@njit
def q3_k_quantize_w(xb, out, qw, f16):
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    nbpr = qw.shape[0]
    L = np.zeros(QK_K, np.int64)
    w = np.zeros(16, np.float32)
    scales = np.zeros(16, np.float32)
    sw = np.zeros(16, np.float32)
    Ls = np.zeros(16, np.int64)
    sc = np.zeros(12, np.int64)
    wx = np.zeros(16, np.float32)
    fl = np.zeros(SCRATCH, np.float32)
    for i in range(xb.shape[0]):
        x = xb[i]
        q = qw[i % nbpr]
        sigma2 = F32(F32(F32(2.0) * _sum_x2(x, QK_K)) / F32(256.0))
        for j in range(16):
            _weights(x[16 * j:16 * j + 16], q[16 * j:16 * j + 16], sigma2, w, 16)
            sw[j] = _sum(w, 16)
            scales[j] = make_qx_quants_w(x[16 * j:16 * j + 16], 16, 4, L[16 * j:16 * j + 16], w, wx, fl)
        d_block = make_qx_quants_w(scales, 16, 32, Ls, sw, wx, fl)
        for j in range(12):
            sc[j] = 0
        for j in range(16):
            lv = Ls[j]
            if j < 8:
                sc[j] = lv & 0xF
            else:
                sc[j - 8] |= (lv & 0xF) << 4
            sc[j % 4 + 8] = (sc[j % 4 + 8] | ((lv >> 4) << (2 * (j // 4)))) & 0xFF
        hd, d = _fp16_round(d_block, f16)
        _q3_k_write(x, L, sc, hd, d, out, i)
    return -1


@njit
def _q45_k_w(xb, out, qw, f16, nmax, qh_at, qs_at):
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    nbpr = qw.shape[0]
    L = np.zeros(QK_K, np.int64)
    Laux = np.zeros(32, np.int64)
    w = np.zeros(32, np.float32)
    scales = np.zeros(8, np.float32)
    mins = np.zeros(8, np.float32)
    sw = np.zeros(8, np.float32)
    Ls = np.zeros(8, np.int64)
    Lm = np.zeros(8, np.int64)
    sc = np.zeros(12, np.int64)
    for i in range(xb.shape[0]):
        x = xb[i]
        q = qw[i % nbpr]
        sigma2 = F32(F32(F32(2.0) * _sum_x2(x, QK_K)) / F32(256.0))
        for j in range(8):
            _weights(x[32 * j:32 * j + 32], q[32 * j:32 * j + 32], sigma2, w, 32)
            sw[j] = _sum(w, 32)
            scales[j], mins[j] = make_qkx3_quants(x[32 * j:32 * j + 32], 32, nmax, w, L[32 * j:32 * j + 32], Laux)
        d_block = make_qp_quants(8, 63, scales, Ls, sw)
        m_block = make_qp_quants(8, 63, mins, Lm, sw)
        for j in range(8):
            ls = Ls[j]
            lm = Lm[j]
            if nmax == 31:                  # q5_K_impl clamps; q4_K_impl does not
                ls = min(63, ls)
                lm = min(63, lm)
            if j < 4:
                sc[j] = ls
                sc[j + 4] = lm
            else:
                sc[j + 4] = ((ls & 0xF) | ((lm & 0xF) << 4)) & 0xFF
                sc[j - 4] = (sc[j - 4] | ((ls >> 4) << 6)) & 0xFF
                sc[j] = (sc[j] | ((lm >> 4) << 6)) & 0xFF
        hd, d = _fp16_round(d_block, f16)
        hm, dmin = _fp16_round(m_block, f16)
        _q45_k_write(x, L, sc, hd, d, hm, dmin, nmax, qh_at, qs_at, out, i)
    return -1


@njit
def q4_k_quantize_w(xb, out, qw, f16):
    return _q45_k_w(xb, out, qw, f16, 15, -1, 16)


@njit
def q5_k_quantize_w(xb, out, qw, f16):
    return _q45_k_w(xb, out, qw, f16, 31, 16, 48)


@njit
def q6_k_quantize_w(xb, out, qw, f16):
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    nbpr = qw.shape[0]
    L = np.zeros(QK_K, np.int64)
    scales = np.zeros(16, np.float32)
    sc = np.zeros(16, np.int64)
    wx = np.zeros(16, np.float32)
    fl = np.zeros(SCRATCH, np.float32)
    for i in range(xb.shape[0]):
        x = xb[i]
        q = qw[i % nbpr]
        max_scale = _F0
        max_abs_scale = _F0
        for j in range(16):
            scales[j] = make_qx_quants_w(x[16 * j:16 * j + 16], 16, 32, L[16 * j:16 * j + 16], q[16 * j:16 * j + 16],
                                         wx, fl)
            s = abs(scales[j])
            if s > max_abs_scale:
                max_abs_scale = s
                max_scale = scales[j]
        _q6_k_write(x, L, scales, max_scale, max_abs_scale, sc, out, i, f16)
    return -1
