"""The K-quant block quantizers, GGML's ``quantize_row_q{2,3,4,5,6}_K_ref`` bit for bit, compiled.

Each kernel takes (xb float32 (n, 256), out uint8 (n, block bytes), f16: kernels.tables.F16_TO_F32),
fills one block per row and returns -1, or the flat index in xb of its first NaN/inf (then it
writes nothing: GGML would write garbage, the caller reports the value). The layouts are ggml-common.h's block_qN_K structs:

* Q2_K (84):  scales[16] (4-bit scale | 4-bit min << 4), qs[64] (2 bits), fp16 d, fp16 dmin
* Q3_K (110): hmask[32] (3rd bit), qs[64] (2 bits), scales[12] (6-bit signed, packed), fp16 d
* Q4_K (144): fp16 d, fp16 dmin, scales[12] (6-bit scales and mins, packed), qs[128] (nibbles)
* Q5_K (176): fp16 d, fp16 dmin, scales[12], qh[32] (5th bit), qs[128]
* Q6_K (210): ql[128] (low nibbles), qh[64] (2 high bits), int8 scales[16], fp16 d

The scale searches come first (``nearest_int``, ``make_qx_quants``, ``make_q3_quants``,
``make_qkx2_quants``), in GGML's float32 order of operations: numba promotes int x float32 to
float64 and Python float literals to float64, so every constant here is a float32 and every integer
that meets a float is made float32 first, as C's usual arithmetic conversions do. They live in this
module with the kernels because numba's disk cache checks a kernel against its own file only: a
search changed in another file would leave stale kernels in the cache.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from ..kernels.jit import njit, numba

types = numba.types
intrinsic = numba.extending.intrinsic

F32 = np.float32
_MAGIC = F32(12582912.0)        # 1.5 * 2**23
GROUP_MAX_EPS = F32(1e-15)
_F0 = F32(0.0)
_F1 = F32(1.0)
_F01 = F32(0.1)


@intrinsic
def _bits(typingctx, v):
    """The bits of a float32 as an int32 (C's memcpy from float to int): an LLVM bitcast."""
    if not isinstance(v, types.Float) or v.bitwidth != 32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


@njit
def nearest_int(fval):
    """GGML's nearest_int: the low 23 bits of fval + 1.5*2**23, less 2**22 (round half to even for
    |fval| < 2**22; outside that range GGML's bits, which release builds return unchecked)."""
    return np.int64((_bits(F32(fval + _MAGIC)) & np.int32(0x7FFFFF)) - np.int32(0x400000))


@njit
def _amax_signed(x, n):
    """(max |x|, the x that has it: the first one on ties) over x[:n]."""
    mx = _F0
    amax = _F0
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    return amax, mx


@njit
def make_qx_quants_rmse1(xo, o, n, nmax, Lo):
    """make_qx_quants(n, nmax, x+o, L+o, rmse_type=1, qw=NULL): codes L[o:o+n] in 0..2*nmax-1, scale."""
    x = xo[o:o + n]          # slices: indices counted from 0 need no negative-index check (2x faster)
    L = Lo[o:o + n]
    amax, mx = _amax_signed(x, n)
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _F0
    fn = F32(nmax)
    iscale = F32(-fn / mx)
    sumlx = _F0
    suml2 = _F0
    for i in range(n):
        xi = x[i]
        lv = max(-nmax, min(nmax - 1, nearest_int(F32(iscale * xi))))
        L[i] = lv + nmax
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
            xi = x[i]
            lv = max(-nmax, min(nmax - 1, nearest_int(F32(iscale * xi))))
            w = F32(xi * xi)
            fl = F32(lv)
            sumlx = F32(sumlx + F32(F32(w * xi) * fl))
            suml2 = F32(suml2 + F32(F32(w * fl) * fl))
        if suml2 > _F0 and F32(sumlx * sumlx) > F32(best * suml2):
            for i in range(n):
                L[i] = nmax + max(-nmax, min(nmax - 1, nearest_int(F32(iscale * x[i]))))
            scale = F32(sumlx / suml2)
            best = F32(scale * sumlx)
    return scale


@njit
def make_q3_quants_rmse(xo, o, n, nmax, Lo):
    """make_q3_quants(n, nmax, x+o, L+o, do_rmse=true): codes L[o:o+n] in 0..2*nmax-1, scale."""
    x = xo[o:o + n]
    L = Lo[o:o + n]
    amax, mx = _amax_signed(x, n)
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _F0
    iscale = F32(-F32(nmax) / mx)
    sumlx = _F0
    suml2 = _F0
    for i in range(n):
        xi = x[i]
        lv = max(-nmax, min(nmax - 1, nearest_int(F32(iscale * xi))))
        L[i] = lv
        w = F32(xi * xi)
        fl = F32(lv)
        sumlx = F32(sumlx + F32(F32(w * xi) * fl))
        suml2 = F32(suml2 + F32(F32(w * fl) * fl))
    for _ in range(5):
        changed = 0
        for i in range(n):
            xi = x[i]
            w = F32(xi * xi)
            li = F32(L[i])
            slx = F32(sumlx - F32(F32(w * xi) * li))
            if slx > _F0:
                sl2 = F32(suml2 - F32(F32(w * li) * li))
                new_l = max(-nmax, min(nmax - 1, nearest_int(F32(F32(xi * sl2) / slx))))
                if new_l != L[i]:
                    fl = F32(new_l)
                    slx = F32(slx + F32(F32(w * xi) * fl))
                    sl2 = F32(sl2 + F32(F32(w * fl) * fl))
                    if sl2 > _F0 and F32(F32(slx * slx) * suml2) > F32(F32(sumlx * sumlx) * sl2):
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if changed == 0:
            break
    for i in range(n):
        L[i] += nmax
    return F32(sumlx / suml2) if suml2 > _F0 else _F0


@njit
def make_qkx2_quants(xo, o, n, nmax, w, Lo, Laux, rmin, rdelta, nstep, use_mad):
    """make_qkx2_quants(n, nmax, x+o, w, L+o, &the_min, Laux, rmin, rdelta, nstep, use_mad):
    codes L[o:o+n] in 0..nmax; returns (scale, the_min)."""
    x = xo[o:o + n]
    L = Lo[o:o + n]
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
    if mx == mn:
        for i in range(n):
            L[i] = 0
        return _F0, F32(-mn)
    fn = F32(nmax)
    iscale = F32(fn / F32(mx - mn))
    scale = F32(_F1 / iscale)
    best_error = _F0
    for i in range(n):
        xi = x[i]
        lv = max(0, min(nmax, nearest_int(F32(iscale * F32(xi - mn)))))
        L[i] = lv
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
            xi = x[i]
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
                diff = F32(F32(F32(this_scale * F32(Laux[i])) + this_min) - x[i])
                diff = abs(diff) if use_mad else F32(diff * diff)
                cur_error = F32(cur_error + F32(w[i] * diff))
            if cur_error < best_error:
                for i in range(n):
                    L[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, F32(-mn)


# -- the block kernels ----------------------------------------------------------------------------

QK_K = 256
_ABS = np.uint32(0x7FFFFFFF)
_INF = np.uint32(0x7F800000)


@njit
def _fp16_round(v, f16):
    """(fp16 bits of the float32 v as GGML_FP32_TO_FP16 gives them, the float32 they stand for),
    found in f16 (kernels.tables.F16_TO_F32, exact and increasing over 0..0x7c00): the nearest
    entry, ties to the even pattern, |v| >= 65520 to inf, NaN to 0x7e00 (with the sign, as GGML)."""
    sign = np.uint32(0x8000) if _bits(v) < 0 else np.uint32(0)     # NaN's sign too (x86's are negative)
    a = abs(v)
    if a != a:
        h = np.uint32(0x7E00)
    elif a >= F32(65520.0):
        h = np.uint32(0x7C00)
    else:
        lo, hi = 0, 0x7BFF                        # f16[lo] <= a < f16[hi + 1]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if f16[mid] <= a:
                lo = mid
            else:
                hi = mid - 1
        below = np.float64(a) - np.float64(f16[lo])
        above = np.float64(f16[lo + 1]) - np.float64(a)
        if above < below or (above == below and (lo & 1) == 1):
            lo += 1
        h = np.uint32(lo)
    h = np.uint32(h | sign)
    return h, f16[h]


@njit
def _put_f16(out, i, at, h):
    out[i, at] = np.uint8(h & np.uint32(0xFF))
    out[i, at + 1] = np.uint8(h >> np.uint32(8))


@njit
def _first_bad(xb):
    """-1, or the flat index of the first NaN/inf of xb."""
    xi = xb.reshape(-1).view(np.uint32)
    for k in range(xi.shape[0]):
        if (xi[k] & _ABS) >= _INF:
            return k
    return -1


@njit
def _pack_2bit(L, out, i, at):
    """qs: 4 codes of 2 bits per byte, element j + 32 * s in bits 2s of byte j of each 128-half."""
    for j in range(0, QK_K, 128):
        for m in range(32):
            out[i, at + j // 4 + m] = np.uint8(L[j + m] | (L[j + m + 32] << 2) | (L[j + m + 64] << 4) | (L[j + m + 96] << 6))


@njit
def _q2_k_write(x, L, sc, hd, d, hm, dmin, out, i):
    """Q2_K's end, shared with the weighted path: codes again from the fp16 scales, then the bytes."""
    for j in range(16):
        dj = F32(d * F32(sc[j] & 0xF))
        if dj == _F0:
            continue
        dm = F32(dmin * F32(sc[j] >> 4))
        for m in range(16):
            L[16 * j + m] = max(0, min(3, nearest_int(F32(F32(x[16 * j + m] + dm) / dj))))
    for j in range(16):
        out[i, j] = np.uint8(sc[j])
    _pack_2bit(L, out, i, 16)
    _put_f16(out, i, 80, hd)
    _put_f16(out, i, 82, hm)


@njit
def q2_k_quantize(xb, out, f16):
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    L = np.zeros(QK_K, np.int32)
    Laux = np.zeros(16, np.int32)
    w = np.zeros(16, np.float32)
    scales = np.zeros(16, np.float32)
    mins = np.zeros(16, np.float32)
    sc = np.zeros(16, np.int64)
    q4scale = F32(15.0)
    for i in range(xb.shape[0]):
        x = xb[i]
        max_scale = _F0
        max_min = _F0
        for j in range(16):
            for m in range(16):
                w[m] = abs(x[16 * j + m])
            scales[j], mins[j] = make_qkx2_quants(x, 16 * j, 16, 3, w, L, Laux, F32(-0.5), F32(0.1), 15, True)
            if scales[j] > max_scale:
                max_scale = scales[j]
            if mins[j] > max_min:
                max_min = mins[j]
        if max_scale > _F0:
            iscale = F32(q4scale / max_scale)
            for j in range(16):
                sc[j] = nearest_int(F32(iscale * scales[j])) & 0xFF
            hd, d = _fp16_round(F32(max_scale / q4scale), f16)
        else:
            for j in range(16):
                sc[j] = 0
            hd, d = _fp16_round(_F0, f16)
        if max_min > _F0:
            iscale = F32(q4scale / max_min)
            for j in range(16):
                sc[j] = (sc[j] | (nearest_int(F32(iscale * mins[j])) << 4)) & 0xFF
            hm, dmin = _fp16_round(F32(max_min / q4scale), f16)
        else:
            hm, dmin = _fp16_round(_F0, f16)
        _q2_k_write(x, L, sc, hd, d, hm, dmin, out, i)
    return -1


@njit
def _q3_k_write(x, L, sc, hd, d, out, i):
    """Q3_K's end (sc: the 12 packed scale bytes), shared with the weighted path."""
    for j in range(16):
        s = sc[j] & 0xF if j < 8 else sc[j - 8] >> 4
        s = (s | (((sc[8 + j % 4] >> (2 * (j // 4))) & 3) << 4)) - 32
        dj = F32(d * F32(s))
        if dj == _F0:
            continue
        for m in range(16):
            L[16 * j + m] = max(-4, min(3, nearest_int(F32(x[16 * j + m] / dj)))) + 4
    for m in range(32):
        out[i, m] = 0
    for j in range(QK_K):                     # the 3rd bit of element j: bit j // 32 of hmask[j % 32]
        if L[j] > 3:
            out[i, j % 32] |= np.uint8(1 << (j // 32))
            L[j] -= 4
    _pack_2bit(L, out, i, 32)
    for j in range(12):
        out[i, 96 + j] = np.uint8(sc[j])
    _put_f16(out, i, 108, hd)


@njit
def q3_k_quantize(xb, out, f16):
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    L = np.zeros(QK_K, np.int32)
    scales = np.zeros(16, np.float32)
    sc = np.zeros(12, np.int64)
    for i in range(xb.shape[0]):
        x = xb[i]
        max_scale = _F0
        amax = _F0
        for j in range(16):
            scales[j] = make_q3_quants_rmse(x, 16 * j, 16, 4, L)
            s = abs(scales[j])
            if s > amax:
                amax = s
                max_scale = scales[j]
        for j in range(12):
            sc[j] = 0
        if max_scale != _F0:
            iscale = F32(F32(-32.0) / max_scale)
            for j in range(16):
                lv = nearest_int(F32(iscale * scales[j]))
                lv = (lv + 128) % 256 - 128                  # int8_t l = nearest_int(...)
                lv = max(-32, min(31, lv)) + 32
                if j < 8:
                    sc[j] = lv & 0xF
                else:
                    sc[j - 8] |= (lv & 0xF) << 4
                sc[j % 4 + 8] = (sc[j % 4 + 8] | ((lv >> 4) << (2 * (j // 4)))) & 0xFF
            hd, d = _fp16_round(F32(_F1 / iscale), f16)
        else:
            hd, d = _fp16_round(_F0, f16)
        _q3_k_write(x, L, sc, hd, d, out, i)
    return -1


@njit
def _q45_k_write(x, L, sc, hd, d, hm, dmin, nmax, qh_at, qs_at, out, i):
    """Q4_K/Q5_K's end (sc: the 12 packed scale/min bytes), shared with the weighted path."""
    for j in range(8):
        if j < 4:
            s, m6 = sc[j] & 63, sc[j + 4] & 63
        else:
            s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4)
            m6 = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)
        dj = F32(d * F32(s))
        if dj == _F0:
            continue
        dm = F32(dmin * F32(m6))
        for m in range(32):
            L[32 * j + m] = max(0, min(nmax, nearest_int(F32(F32(x[32 * j + m] + dm) / dj))))
    _put_f16(out, i, 0, hd)
    _put_f16(out, i, 2, hm)
    for j in range(12):
        out[i, 4 + j] = np.uint8(sc[j])
    if qh_at >= 0:
        for m in range(32):
            out[i, qh_at + m] = 0
    for c in range(4):                        # 32 bytes per 64 values: element m low, m + 32 high
        for m in range(32):
            l1 = L[64 * c + m]
            l2 = L[64 * c + m + 32]
            if l1 > 15:
                l1 -= 16
                out[i, qh_at + m] |= np.uint8(1 << (2 * c))
            if l2 > 15:
                l2 -= 16
                out[i, qh_at + m] |= np.uint8(2 << (2 * c))
            out[i, qs_at + 32 * c + m] = np.uint8(l1 | (l2 << 4))


@njit
def _q45_k(xb, out, f16, nmax, rmin, nstep, qh_at, qs_at):
    """Q4_K (nmax 15) and Q5_K (nmax 31, whose 5th bits go to qh): 8 sub-blocks of 32 with a
    6-bit scale and min each."""
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    L = np.zeros(QK_K, np.int32)
    Laux = np.zeros(32, np.int32)
    w = np.zeros(32, np.float32)
    scales = np.zeros(8, np.float32)
    mins = np.zeros(8, np.float32)
    sc = np.zeros(12, np.int64)
    f63 = F32(63.0)
    for i in range(xb.shape[0]):
        x = xb[i]
        max_scale = _F0
        max_min = _F0
        for j in range(8):
            sum_x2 = _F0
            for m in range(32):
                v = x[32 * j + m]
                sum_x2 = F32(sum_x2 + F32(v * v))
            av_x = F32(math.sqrt(F32(sum_x2 / F32(32.0))))
            for m in range(32):
                w[m] = F32(av_x + abs(x[32 * j + m]))
            scales[j], mins[j] = make_qkx2_quants(x, 32 * j, 32, nmax, w, L, Laux, rmin, F32(0.1), nstep, False)
            if scales[j] > max_scale:
                max_scale = scales[j]
            if mins[j] > max_min:
                max_min = mins[j]
        inv_scale = F32(f63 / max_scale) if max_scale > _F0 else _F0
        inv_min = F32(f63 / max_min) if max_min > _F0 else _F0
        for j in range(8):
            ls = min(63, nearest_int(F32(inv_scale * scales[j])) & 0xFF)
            lm = min(63, nearest_int(F32(inv_min * mins[j])) & 0xFF)
            if j < 4:
                sc[j] = ls
                sc[j + 4] = lm
            else:
                sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
                sc[j - 4] |= (ls >> 4) << 6
                sc[j] |= (lm >> 4) << 6
        hd, d = _fp16_round(F32(max_scale / f63), f16)
        hm, dmin = _fp16_round(F32(max_min / f63), f16)
        _q45_k_write(x, L, sc, hd, d, hm, dmin, nmax, qh_at, qs_at, out, i)
    return -1


@njit
def q4_k_quantize(xb, out, f16):
    return _q45_k(xb, out, f16, 15, F32(-1.0), 20, -1, 16)


@njit
def q5_k_quantize(xb, out, f16):
    return _q45_k(xb, out, f16, 31, F32(-0.5), 15, 16, 48)


@njit
def _q6_k_write(x, L, scales, max_scale, max_abs_scale, sc, out, i, f16):
    """Q6_K's end from the 16 sub-block scales, shared with the weighted path."""
    if max_abs_scale < GROUP_MAX_EPS:
        for k in range(210):
            out[i, k] = 0
        return
    iscale = F32(F32(-128.0) / max_scale)
    hd, d = _fp16_round(F32(_F1 / iscale), f16)
    for j in range(16):
        sc[j] = (min(127, nearest_int(F32(iscale * scales[j]))) + 128) % 256 - 128    # int8_t
    for j in range(16):
        dj = F32(d * F32(sc[j]))
        if dj == _F0:
            continue
        for m in range(16):
            L[16 * j + m] = max(-32, min(31, nearest_int(F32(x[16 * j + m] / dj)))) + 32
    for h in range(2):                        # 128 values: ql 64 bytes, qh 32 bytes each
        j = 128 * h
        for m in range(32):
            q1, q2, q3, q4 = L[j + m], L[j + m + 32], L[j + m + 64], L[j + m + 96]
            out[i, 64 * h + m] = np.uint8((q1 & 0xF) | ((q3 & 0xF) << 4))
            out[i, 64 * h + m + 32] = np.uint8((q2 & 0xF) | ((q4 & 0xF) << 4))
            out[i, 128 + 32 * h + m] = np.uint8(((q1 >> 4) & 3) | (((q2 >> 4) & 3) << 2) |
                                                (((q3 >> 4) & 3) << 4) | (((q4 >> 4) & 3) << 6))
    for j in range(16):
        out[i, 192 + j] = np.uint8(sc[j] & 0xFF)
    _put_f16(out, i, 208, hd)


@njit
def q6_k_quantize(xb, out, f16):
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    L = np.zeros(QK_K, np.int32)
    scales = np.zeros(16, np.float32)
    sc = np.zeros(16, np.int64)
    for i in range(xb.shape[0]):
        x = xb[i]
        max_scale = _F0
        max_abs_scale = _F0
        for j in range(16):
            scales[j] = make_qx_quants_rmse1(x, 16 * j, 16, 32, L)
            s = abs(scales[j])
            if s > max_abs_scale:
                max_abs_scale = s
                max_scale = scales[j]
        _q6_k_write(x, L, scales, max_scale, max_abs_scale, sc, out, i, f16)
    return -1
