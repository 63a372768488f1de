"""The 32-value block quantizers llama-quantize writes besides Q4_0/Q8_0, without an importance
matrix, bit for bit as ggml_quantize_chunk writes them: ``quantize_row_q4_1_ref``,
``quantize_row_q5_0_ref``, ``quantize_row_q5_1_ref`` and ``quantize_iq4_nl`` (its reference row is
never used by llama-quantize: ``quantize_iq4_nl`` searches 7 steps either side, weighted by x*x).

Each kernel takes (xb float32 (n, 32), out uint8 (n, block bytes), f16: kernels.tables.F16_TO_F32)
and returns -1, or the flat index in xb of its first NaN/inf (then it writes nothing). Layouts
(ggml-common.h): Q4_1 (20) fp16 d, fp16 m, qs[16]; Q5_0 (22) fp16 d, qh u32, qs[16]; Q5_1 (24)
fp16 d, fp16 m, qh u32, qs[16]; IQ4_NL (18) fp16 d, qs[16] (indices into ``KVALUES``). Nibbles are
split-half: element j low, j + 16 high; qh bit j is element j's 5th bit.

C's ``(int8_t)`` / ``(uint8_t)`` of a float is what gcc compiles on x86-64: cvttss2si to 32 bits,
then the low byte (0 for NaN, inf or anything beyond int32, which a subnormal scale's 1/d makes).
"""

from __future__ import annotations

import numpy as np

from ..kernels.jit import njit
from .blocks import GROUP_MAX_EPS, _first_bad, _fp16_round, _put_f16

F32 = np.float32
_F0 = F32(0.0)
_F1 = F32(1.0)
_HALF = F32(0.5)
_FLT_MAX = F32(3.4028234663852886e38)
_I32_LIMIT = F32(2147483648.0)

# kvalues_iq4nl: IQ4_NL's 16 levels (ggml-common.h), as float32 (C compares and multiplies them so)
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


@njit
def cvt_byte(v):
    """The low byte (0..255) of x86's cvttss2si of v: C's (int8_t)/(uint8_t) cast as gcc emits it."""
    if not (abs(v) < _I32_LIMIT):
        return np.int64(0)
    return np.int64(np.int32(v)) & 0xFF


@njit
def _signed(b):
    return b - 256 if b >= 128 else b


@njit
def _put_qh(out, i, at, qh):
    for k in range(4):
        out[i, at + k] = np.uint8((qh >> (8 * k)) & 0xFF)


@njit
def _minmax(x):
    """q4_1/q5_1's min (from FLT_MAX) and max (from -FLT_MAX)."""
    mn = _FLT_MAX
    mx = -_FLT_MAX
    for j in range(x.shape[0]):
        v = x[j]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    return mn, mx


@njit
def _amax_signed(x):
    amax = _F0
    mx = _F0
    for j in range(x.shape[0]):
        ax = abs(x[j])
        if amax < ax:
            amax = ax
            mx = x[j]
    return amax, mx


@njit
def q4_1_quantize(xb, out, f16):
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    for i in range(xb.shape[0]):
        x = xb[i]
        mn, mx = _minmax(x)
        d = F32(F32(mx - mn) / F32(15.0))
        idv = F32(_F1 / d) if d != _F0 else _F0
        hd, _ = _fp16_round(d, f16)
        hm, _ = _fp16_round(mn, f16)
        _put_f16(out, i, 0, hd)
        _put_f16(out, i, 2, hm)
        for j in range(16):
            c0 = min(15, _signed(cvt_byte(F32(F32(F32(x[j] - mn) * idv) + _HALF)))) & 0xFF
            c1 = min(15, _signed(cvt_byte(F32(F32(F32(x[j + 16] - mn) * idv) + _HALF)))) & 0xFF
            out[i, 4 + j] = np.uint8((c0 | (c1 << 4)) & 0xFF)
    return -1


@njit
def q5_0_quantize(xb, out, f16):
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    f165 = F32(16.5)
    for i in range(xb.shape[0]):
        x = xb[i]
        amax, mx = _amax_signed(x)
        d = F32(mx / F32(-16.0))
        idv = F32(_F1 / d) if d != _F0 else _F0
        hd, _ = _fp16_round(d, f16)
        _put_f16(out, i, 0, hd)
        qh = np.int64(0)
        for j in range(16):
            c0 = min(31, _signed(cvt_byte(F32(F32(x[j] * idv) + f165)))) & 0xFF
            c1 = min(31, _signed(cvt_byte(F32(F32(x[j + 16] * idv) + f165)))) & 0xFF
            out[i, 6 + j] = np.uint8((c0 & 0xF) | ((c1 & 0xF) << 4))
            qh |= ((c0 & 0x10) >> 4) << j
            qh |= ((c1 & 0x10) >> 4) << (j + 16)
        _put_qh(out, i, 2, qh)
    return -1


@njit
def q5_1_quantize(xb, out, f16):
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    for i in range(xb.shape[0]):
        x = xb[i]
        mn, mx = _minmax(x)
        d = F32(F32(mx - mn) / F32(31.0))
        idv = F32(_F1 / d) if d != _F0 else _F0
        hd, _ = _fp16_round(d, f16)
        hm, _ = _fp16_round(mn, f16)
        _put_f16(out, i, 0, hd)
        _put_f16(out, i, 2, hm)
        qh = np.int64(0)
        for j in range(16):
            c0 = cvt_byte(F32(F32(F32(x[j] - mn) * idv) + _HALF))
            c1 = cvt_byte(F32(F32(F32(x[j + 16] - mn) * idv) + _HALF))
            out[i, 8 + j] = np.uint8((c0 & 0xF) | ((c1 & 0xF) << 4))
            qh |= ((c0 & 0x10) >> 4) << j
            qh |= ((c1 & 0x10) >> 4) << (j + 16)
        _put_qh(out, i, 4, qh)
    return -1


# -- IQ4_NL ---------------------------------------------------------------------------------------

@njit
def best_index(kv, x):
    """best_index_int8(16, kvalues, x): the nearest level's index, the upper one on ties (and for NaN)."""
    if x <= kv[0]:
        return 0
    if x >= kv[15]:
        return 15
    ml = 0
    mu = 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < kv[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if F32(x - kv[mu - 1]) < F32(kv[mu] - x) else mu


@njit
def iq4_nl_block(x, w, kv, L, ntry):
    """quantize_row_iq4_nl_impl's search for one 32-value block (super block == block): the scale d
    (0 for a block below GROUP_MAX_EPS, L then left as it was), codes L[0:32]."""
    amax = _F0
    mx = _F0
    for j in range(32):
        ax = abs(x[j])
        if ax > amax:
            amax = ax
            mx = x[j]
    if amax < GROUP_MAX_EPS:
        return _F0
    d = F32(-mx / kv[0]) if ntry > 0 else F32(mx / kv[0])
    idv = F32(_F1 / d)
    sumqx = _F0
    sumq2 = _F0
    for j in range(32):
        lv = best_index(kv, F32(idv * x[j]))
        L[j] = lv
        q = kv[lv]
        wq = F32(w[j] * q)
        sumqx = F32(sumqx + F32(wq * x[j]))
        sumq2 = F32(sumq2 + F32(wq * q))
    d = F32(sumqx / sumq2) if sumq2 > _F0 else _F0
    best = F32(d * sumqx)
    for itry in range(-ntry, ntry + 1):
        idv = F32(F32(itry + kv[0]) / mx)
        sumqx = _F0
        sumq2 = _F0
        for j in range(32):
            q = kv[best_index(kv, F32(idv * x[j]))]
            wq = F32(w[j] * q)
            sumqx = F32(sumqx + F32(wq * x[j]))
            sumq2 = F32(sumq2 + F32(wq * q))
        if sumq2 > _F0 and F32(sumqx * sumqx) > F32(best * sumq2):
            d = F32(sumqx / sumq2)
            best = F32(d * sumqx)
    return d


@njit
def iq4_nl_finish(x, d, kv, L, out, i, f16):
    """The single-block end of quantize_row_iq4_nl_impl (ntry > 0): fp16 d, codes again from 1/d."""
    hd, _ = _fp16_round(d, f16)
    _put_f16(out, i, 0, hd)
    idv = F32(_F1 / d) if d != _F0 else _F0
    for j in range(32):
        L[j] = best_index(kv, F32(idv * x[j]))
    for j in range(16):
        out[i, 2 + j] = np.uint8(L[j] | (L[16 + j] << 4))


@njit
def iq4_nl_quantize(xb, out, f16):
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    kv = KVALUES
    L = np.zeros(32, np.int64)
    w = np.zeros(32, np.float32)
    for i in range(xb.shape[0]):
        x = xb[i]
        for j in range(32):
            w[j] = F32(x[j] * x[j])
        d = iq4_nl_block(x, w, kv, L, 7)
        iq4_nl_finish(x, d, kv, L, out, i, f16)
    return -1
