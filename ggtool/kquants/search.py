"""GGML's scale searches for the K-quants (ggml-quants.c: ``nearest_int``, ``make_qx_quants``,
``make_q3_quants``, ``make_qkx2_quants``), compiled, in GGML's float32 order of operations.

numba promotes int x float32 to float64 and Python float literals to float64: every constant here
is a float32 and every integer that meets a float is made float32 first, as C's usual arithmetic
conversions do, so each expression rounds exactly where GGML's does.
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels.jit import njit

F32 = np.float32
_MAGIC = F32(12582912.0)        # 1.5 * 2**23
GROUP_MAX_EPS = F32(1e-15)
_F0 = F32(0.0)
_F1 = F32(1.0)
_F01 = F32(0.1)


@njit
def nearest_int(fval):
    """GGML's nearest_int: the low 23 bits of fval + 1.5*2**23, less 2**22 (round half to even for
    |fval| < 2**22; outside that range GGML's bits, which release builds return unchecked)."""
    val = F32(fval + _MAGIC)
    if val >= F32(8388608.0) and val < F32(16777216.0):
        return np.int64(val) - 12582912
    if val != val:
        return 0                                  # x86's default NaN: mantissa 0x400000
    if math.isinf(val) or val == _F0:
        return -4194304
    m, _ = math.frexp(abs(np.float64(val)))       # m in [0.5, 1): m * 2**24 is the 24-bit significand
    return (np.int64(m * 16777216.0) & 0x7FFFFF) - 0x400000


@njit
def _amax_signed(x, o, n):
    """(max |x|, the x that has it: the first one on ties) over x[o:o+n]."""
    mx = _F0
    amax = _F0
    for i in range(n):
        ax = abs(x[o + i])
        if ax > amax:
            amax = ax
            mx = x[o + i]
    return amax, mx


@njit
def make_qx_quants_rmse1(x, o, n, nmax, L):
    """make_qx_quants(n, nmax, x+o, L+o, rmse_type=1, qw=NULL): codes L[o:o+n] in 0..2*nmax-1, scale."""
    amax, mx = _amax_signed(x, o, n)
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[o + i] = 0
        return _F0
    fn = F32(nmax)
    iscale = F32(-fn / mx)
    sumlx = _F0
    suml2 = _F0
    for i in range(n):
        xi = x[o + i]
        lv = max(-nmax, min(nmax - 1, nearest_int(F32(iscale * xi))))
        L[o + i] = lv + nmax
        w = F32(xi * xi)
        fl = F32(lv)
        sumlx = F32(sumlx + F32(F32(w * xi) * fl))
        suml2 = F32(suml2 + F32(F32(w * fl) * fl))
    scale = F32(sumlx / suml2) if suml2 != _F0 else _F0
    best = F32(scale * sumlx)
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = F32(-F32(fn + F32(_F01 * F32(step))) / mx)
        sumlx = _F0
        suml2 = _F0
        for i in range(n):
            xi = x[o + i]
            lv = max(-nmax, min(nmax - 1, nearest_int(F32(iscale * xi))))
            w = F32(xi * xi)
            fl = F32(lv)
            sumlx = F32(sumlx + F32(F32(w * xi) * fl))
            suml2 = F32(suml2 + F32(F32(w * fl) * fl))
        if suml2 > _F0 and F32(sumlx * sumlx) > F32(best * suml2):
            for i in range(n):
                L[o + i] = nmax + max(-nmax, min(nmax - 1, nearest_int(F32(iscale * x[o + i]))))
            scale = F32(sumlx / suml2)
            best = F32(scale * sumlx)
    return scale


@njit
def make_q3_quants_rmse(x, o, n, nmax, L):
    """make_q3_quants(n, nmax, x+o, L+o, do_rmse=true): codes L[o:o+n] in 0..2*nmax-1, scale."""
    amax, mx = _amax_signed(x, o, n)
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[o + i] = 0
        return _F0
    iscale = F32(-F32(nmax) / mx)
    sumlx = _F0
    suml2 = _F0
    for i in range(n):
        xi = x[o + i]
        lv = max(-nmax, min(nmax - 1, nearest_int(F32(iscale * xi))))
        L[o + i] = lv
        w = F32(xi * xi)
        fl = F32(lv)
        sumlx = F32(sumlx + F32(F32(w * xi) * fl))
        suml2 = F32(suml2 + F32(F32(w * fl) * fl))
    for _ in range(5):
        changed = 0
        for i in range(n):
            xi = x[o + i]
            w = F32(xi * xi)
            li = F32(L[o + i])
            slx = F32(sumlx - F32(F32(w * xi) * li))
            if slx > _F0:
                sl2 = F32(suml2 - F32(F32(w * li) * li))
                new_l = max(-nmax, min(nmax - 1, nearest_int(F32(F32(xi * sl2) / slx))))
                if new_l != L[o + i]:
                    fl = F32(new_l)
                    slx = F32(slx + F32(F32(w * xi) * fl))
                    sl2 = F32(sl2 + F32(F32(w * fl) * fl))
                    if sl2 > _F0 and F32(F32(slx * slx) * suml2) > F32(F32(sumlx * sumlx) * sl2):
                        L[o + i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if changed == 0:
            break
    for i in range(n):
        L[o + i] += nmax
    return F32(sumlx / suml2) if suml2 > _F0 else _F0


@njit
def make_qkx2_quants(x, o, n, nmax, w, L, Laux, rmin, rdelta, nstep, use_mad):
    """make_qkx2_quants(n, nmax, x+o, w, L+o, &the_min, Laux, rmin, rdelta, nstep, use_mad):
    codes L[o:o+n] in 0..nmax; returns (scale, the_min)."""
    mn = x[o]
    mx = x[o]
    sum_w = w[0]
    sum_x = F32(sum_w * x[o])
    for i in range(1, n):
        xi = x[o + i]
        if xi < mn:
            mn = xi
        if xi > mx:
            mx = xi
        sum_w = F32(sum_w + w[i])
        sum_x = F32(sum_x + F32(w[i] * xi))
    if mn > _F0:
        mn = _F0
    if mx == mn:
        for i in range(n):
            L[o + i] = 0
        return _F0, F32(-mn)
    fn = F32(nmax)
    iscale = F32(fn / F32(mx - mn))
    scale = F32(_F1 / iscale)
    best_error = _F0
    for i in range(n):
        xi = x[o + i]
        lv = max(0, min(nmax, nearest_int(F32(iscale * F32(xi - mn)))))
        L[o + i] = lv
        diff = F32(F32(F32(scale * F32(lv)) + mn) - xi)
        diff = abs(diff) if use_mad else F32(diff * diff)
        best_error = F32(best_error + F32(w[i] * diff))
    if nstep < 1:
        return scale, F32(-mn)
    for step in range(nstep + 1):
        iscale = F32(F32(F32(rmin + F32(rdelta * F32(step))) + fn) / F32(mx - mn))
        sum_l = _F0
        sum_l2 = _F0
        sum_xl = _F0
        for i in range(n):
            xi = x[o + i]
            lv = max(0, min(nmax, nearest_int(F32(iscale * F32(xi - mn)))))
            Laux[i] = lv
            fl = F32(lv)
            wl = F32(w[i] * fl)
            sum_l = F32(sum_l + wl)
            sum_l2 = F32(sum_l2 + F32(wl * fl))
            sum_xl = F32(sum_xl + F32(wl * xi))
        D = F32(F32(sum_w * sum_l2) - F32(sum_l * sum_l))
        if D > _F0:
            this_scale = F32(F32(F32(sum_w * sum_xl) - F32(sum_x * sum_l)) / D)
            this_min = F32(F32(F32(sum_l2 * sum_x) - F32(sum_l * sum_xl)) / D)
            if this_min > _F0:
                this_min = _F0
                this_scale = F32(sum_xl / sum_l2)
            cur_error = _F0
            for i in range(n):
                diff = F32(F32(F32(this_scale * F32(Laux[i])) + this_min) - x[o + i])
                diff = abs(diff) if use_mad else F32(diff * diff)
                cur_error = F32(cur_error + F32(w[i] * diff))
            if cur_error < best_error:
                for i in range(n):
                    L[o + i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, F32(-mn)
