"""IQ1_S / IQ1_M's compiled kernels (``iq1`` describes the formats): the grid's map and neighbours
as iq2xs_init_impl builds them, quantize_row_iq1_s_impl / quantize_row_iq1_m_impl, and
ggml_vec_dot_iq1_{s,m}_q8_K_generic, GGML's float32 order (every constant float32; integers made
float32 before they meet a float, as C's conversions do).

The quantizers take (x float32 (rows, n), out uint8 (rows, row bytes), qw float32 (n,) or (0,):
none, f16, grid (2048, 8) int64 (the values + 1: 0, 1, 2), kmap int32, neighbours uint16) and
return -1, the flat index of x's first NaN/inf, or -2 - b for the first block b (counted over
x's rows) where llama.cpp's result is undefined: its neighbour search found no candidate (every
distance inf or NaN: the values and weights overflow float32), so GGML goes on to a search that
reads past the 8 values it was given (and asserts if that finds nothing), or a scale that is NaN,
where GGML_ASSERT aborts.
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels.jit import njit
from ..kquants.blocks import _first_bad, _fp16_round, nearest_int
from .grids import IQ1S_GRID

F32 = np.float32
_F0 = F32(0.0)
_F1 = F32(1.0)
_FLT_MAX = F32(3.4028234663852886e38)
_DELTA = F32(0.125)                                  # IQ1S_DELTA, IQ1M_DELTA
_EPS_S = F32(1e-12)                                  # GROUP_MAX_EPS_IQ1_S
_EPS_M = F32(1e-7)                                   # GROUP_MAX_EPS_IQ1_M
_XP = np.array([-1 + 0.125, 0.125, 1 + 0.125], np.float32)    # x_p: the levels shifted up
_XM = np.array([-1 - 0.125, -0.125, 1 - 0.125], np.float32)   # x_m: shifted down
_GRID = IQ1S_GRID.view(np.int8).reshape(2048, 8).astype(np.int64)   # the dots' table (16 KiB frozen)
KMAP_SIZE = 43692
NWANT = 3                                            # IQ1's neighbours: the 3 nearest distances
Q8_K_BYTES = 292


# -- the grid's map and neighbours (iq2xs_init_impl for IQ1_S / IQ1_M) ------------------------------------
@njit
def build_neighbours(grid):
    """kmap (int32, KMAP_SIZE): for each 2-bit code word u of 8 values (value k in bits 2k), the grid
    index where u is on the grid, else -(1 + the offset of its list in neighbours); neighbours
    (uint16): per list, the count, then the grid indices of the NWANT nearest squared distances in
    GGML's qsort order (distance, then index). grid: (2048, 8) int64 of the values + 1. Lists are
    made for the code words of values 0..2 only (the others are never looked up)."""
    kmap = np.full(KMAP_SIZE, -1, np.int32)
    for i in range(2048):
        u = 0
        for k in range(8):
            u |= grid[i, k] << (2 * k)
        kmap[u] = i
    n_grid = 2048
    d2 = np.empty(n_grid, np.int64)
    count = np.zeros(8 * 16 + 1, np.int64)
    out = np.empty(4096 * 1024, np.uint16)      # grown below if needed
    used = 0
    pos = np.empty(8, np.int64)
    for u in range(KMAP_SIZE):
        if kmap[u] >= 0:
            continue
        ok = True
        for k in range(8):
            v = (u >> (2 * k)) & 3
            if v == 3:
                ok = False
            pos[k] = 2 * v + 1
        if not ok:
            continue
        count[:] = 0
        for j in range(n_grid):
            s = 0
            for k in range(8):
                t = 2 * grid[j, k] + 1 - pos[k]
                s += t * t
            d2[j] = s
            count[s] += 1
        picked = np.empty(NWANT, np.int64)
        npick = 0
        total = 0
        for s in range(count.shape[0]):
            if count[s] and npick < NWANT:
                picked[npick] = s
                npick += 1
                total += count[s]
        if used + 1 + total > out.shape[0]:
            bigger = np.empty(2 * out.shape[0] + total + 1, np.uint16)
            bigger[:used] = out[:used]
            out = bigger
        kmap[u] = -(used + 1)
        out[used] = total
        used += 1
        for p in range(npick):
            for j in range(n_grid):
                if d2[j] == picked[p]:
                    out[used] = j
                    used += 1
    return kmap, out[:used].copy()


# -- shared pieces of the two quantizers -----------------------------------------------------------------
@njit
def _sort_pairs(xb, n, idx):
    """idx[:n] = the indices of xb[:n] by value, equal values in index order (GGML's qsort of
    (value, index) pairs is glibc's merge sort, which is stable)."""
    for j in range(n):
        v = xb[j]
        k = j
        while k > 0 and xb[idx[k - 1]] > v:
            idx[k] = idx[k - 1]
            k -= 1
        idx[k] = j


@njit
def _best_neighbour(nb, start, grid, xval, weight, scale, xx):
    """iq1_find_best_neighbour2 over the list at neighbours[start]: the grid index of least weighted
    squared distance to xval (first on ties), or -1 if none is below FLT_MAX."""
    best = _FLT_MAX
    gi = -1
    for j in range(1, np.int64(nb[start]) + 1):
        g = np.int64(nb[start + j])
        d2 = _F0
        for i in range(8):
            q = xx[grid[g, i]]
            diff = F32(F32(scale * q) - xval[i])
            d2 = F32(d2 + F32(F32(weight[i] * diff) * diff))
        if d2 < best:
            best = d2
            gi = g
    return gi


@njit
def _weights(xb, qw, sigma2, weighted, weight, n):
    for i in range(n):
        if weighted:
            weight[i] = F32(qw[i] * F32(math.sqrt(F32(sigma2 + F32(xb[i] * xb[i])))))
        else:
            weight[i] = F32(xb[i] * xb[i])


@njit
def _sigma2(x):
    s = _F0
    for i in range(256):
        s = F32(s + F32(x[i] * x[i]))
    return F32(F32(F32(2.0) * s) / F32(256.0))


@njit
def _amax(xb, n):
    m = abs(xb[0])
    for i in range(1, n):
        a = abs(xb[i])
        m = m if m > a else a
    return m


# -- IQ1_S -------------------------------------------------------------------------------------------------
@njit
def _iq1_s_block(x, qw, out, row, o, f16, grid, kmap, nb, weight, sumx, sumw, idx, L, index, scales, shifts):
    """quantize_row_iq1_s_impl for one block of 256 into out[row, o:o + 50]; False where llama.cpp's
    result is undefined (see the module's docstring)."""
    for k in range(50):
        out[row, o + k] = 0
    max_scale = _F0
    sigma2 = _sigma2(x)
    for ib in range(8):
        xb = x[32 * ib:32 * ib + 32]
        _weights(xb, qw[32 * ib:32 * ib + 32], sigma2, True, weight, 32)
        if _amax(xb, 32) < _EPS_S:
            scales[ib] = _F0
            shifts[ib] = 1
            continue
        _sort_pairs(xb, 32, idx)
        sumx[0] = _F0
        sumw[0] = _F0
        for j in range(32):
            i = idx[j]
            sumx[j + 1] = F32(sumx[j] + F32(weight[i] * xb[i]))
            sumw[j + 1] = F32(sumw[j] + weight[i])
        best_score = -_FLT_MAX
        scale = _F0
        besti1 = -1
        besti2 = -1
        best_shift = 0
        for i1 in range(33):
            a1 = F32(sumx[i1] - sumx[0])
            w1 = F32(sumw[i1] - sumw[0])
            for i2 in range(i1, 33):
                a2 = F32(sumx[i2] - sumx[i1])
                a3 = F32(sumx[32] - sumx[i2])
                w2 = F32(sumw[i2] - sumw[i1])
                w3 = F32(sumw[32] - sumw[i2])
                for s in range(2):
                    xx = _XP if s == 0 else _XM
                    sumqx = F32(F32(F32(a1 * xx[0]) + F32(a2 * xx[1])) + F32(a3 * xx[2]))
                    sumq2 = F32(F32(F32(F32(w1 * xx[0]) * xx[0]) + F32(F32(w2 * xx[1]) * xx[1])) + F32(F32(w3 * xx[2]) * xx[2]))
                    if sumq2 > _F0 and F32(sumqx * sumqx) > F32(best_score * sumq2):
                        scale = F32(sumqx / sumq2)
                        best_score = F32(scale * sumqx)
                        besti1 = i1
                        besti2 = i2
                        best_shift = 1 if s == 0 else -1
        if besti1 < 0 or besti2 < 0 or best_shift == 0:
            scales[ib] = _F0
            shifts[ib] = 1
            continue
        for j in range(32):
            L[idx[j]] = 0 if j < besti1 else (1 if j < besti2 else 2)
        if scale < _F0:
            for j in range(32):
                L[j] = 2 - L[j]
            scale = -scale
            best_shift = -best_shift
        xx = _XP if best_shift == 1 else _XM
        all_on_grid = True
        for k in range(4):
            u = 0
            for j in range(8):
                u |= L[8 * k + j] << (2 * j)
            gi = np.int64(kmap[u])
            if gi < 0:
                all_on_grid = False
                gi = _best_neighbour(nb, -gi - 1, grid, xb[8 * k:8 * k + 8], weight[8 * k:8 * k + 8], scale, xx)
                if gi < 0:
                    return False
            index[k] = gi
        if not all_on_grid:
            sumqx = _F0
            sumq2 = _F0
            for k in range(4):
                for j in range(8):
                    w = weight[8 * k + j]
                    q = xx[grid[index[k], j]]
                    sumqx = F32(sumqx + F32(F32(w * q) * xb[8 * k + j]))
                    sumq2 = F32(sumq2 + F32(F32(w * q) * q))
            if sumqx > _F0 and sumq2 > _F0:
                scale = F32(sumqx / sumq2)
        h = 0
        for k in range(4):
            out[row, o + 2 + 4 * ib + k] = np.uint8(index[k] & 255)
            h |= (index[k] >> 8) << (3 * k)
        out[row, o + 34 + 2 * ib] = np.uint8(h & 0xFF)
        out[row, o + 35 + 2 * ib] = np.uint8(h >> 8)
        if not scale >= _F0:                             # GGML_ASSERT(scale >= 0): NaN aborts
            return False
        scales[ib] = scale
        shifts[ib] = best_shift
        max_scale = max_scale if max_scale > scale else scale
    if max_scale == _F0:
        return True
    d = F32(max_scale / F32(15.0))
    hd, _ = _fp16_round(F32(d * F32(1.125)), f16)
    out[row, o] = np.uint8(hd & np.uint32(0xFF))
    out[row, o + 1] = np.uint8(hd >> np.uint32(8))
    id_ = F32(_F1 / d)
    for ib in range(8):
        l = nearest_int(F32(F32(0.5) * F32(F32(id_ * scales[ib]) - _F1)))
        l = max(0, min(7, l))
        if shifts[ib] == -1:
            l |= 8
        out[row, o + 35 + 2 * ib] |= np.uint8((l << 4) & 0xFF)
    return True


@njit
def quantize_iq1_s(x, out, qw, f16, grid, kmap, nb):
    """quantize_iq1_s: x float32 (rows, n) -> out uint8 (rows, n / 256 * 50) with quant_weights qw
    (n,) (GGML has no path without: the record refuses none)."""
    bad = _first_bad(x)
    if bad >= 0:
        return bad
    weight = np.zeros(32, np.float32)
    sumx = np.zeros(33, np.float32)
    sumw = np.zeros(33, np.float32)
    idx = np.zeros(32, np.int64)
    L = np.zeros(32, np.int64)
    index = np.zeros(4, np.int64)
    scales = np.zeros(8, np.float32)
    shifts = np.zeros(8, np.int64)
    nbl = x.shape[1] // 256
    for r in range(x.shape[0]):
        for b in range(nbl):
            if not _iq1_s_block(x[r, 256 * b:256 * b + 256], qw[256 * b:256 * b + 256], out, r, 50 * b, f16, grid, kmap,
                                nb, weight, sumx, sumw, idx, L, index, scales, shifts):
                return -2 - (r * nbl + b)
    return -1


# -- IQ1_M -------------------------------------------------------------------------------------------------
_MASKS = np.array([0x00, 0x80, 0x08, 0x88], np.int64)


@njit
def _iq1_m_block(x, qw, weighted, out, row, o, f16, grid, kmap, nb, weight, px, pw, idx, L, index, scales, shifts):
    """quantize_row_iq1_m_impl for one block of 256 into out[row, o:o + 56]; False where llama.cpp's
    result is undefined."""
    for k in range(56):
        out[row, o + k] = 0
    max_scale = _F0
    sigma2 = _sigma2(x)
    cp1 = F32(F32(_XP[0] * _XP[0]) - F32(_XP[1] * _XP[1]))
    cp2 = F32(F32(_XP[1] * _XP[1]) - F32(_XP[2] * _XP[2]))
    cm1 = F32(F32(_XM[0] * _XM[0]) - F32(_XM[1] * _XM[1]))
    cm2 = F32(F32(_XM[1] * _XM[1]) - F32(_XM[2] * _XM[2]))
    p2 = _XP[2]
    m2 = _XM[2]
    for ib in range(16):
        xb = x[16 * ib:16 * ib + 16]
        _weights(xb, qw[16 * ib:16 * ib + 16], sigma2, weighted, weight, 16)
        if _amax(xb, 16) < _EPS_M:
            scales[ib] = _F0
            shifts[ib] = 0
            continue
        _sort_pairs(xb, 16, idx)
        px[0, 0] = _F0
        px[1, 0] = _F0
        pw[0, 0] = _F0
        pw[1, 0] = _F0
        for j in range(16):
            i = idx[j]
            h = 0 if i < 8 else 1
            px[h, j + 1] = F32(px[h, j] + F32(weight[i] * xb[i]))
            px[1 - h, j + 1] = px[1 - h, j]
            pw[h, j + 1] = F32(pw[h, j] + weight[i])
            pw[1 - h, j + 1] = pw[1 - h, j]
        tx0, tx1 = px[0, 16], px[1, 16]
        tw0, tw1 = pw[0, 16], pw[1, 16]
        tqp0 = F32(tx0 * p2)
        tqp1 = F32(tx1 * p2)
        tqm0 = F32(tx0 * m2)
        tqm1 = F32(tx1 * m2)
        twp0 = F32(F32(tw0 * p2) * p2)
        twp1 = F32(F32(tw1 * p2) * p2)
        twm0 = F32(F32(tw0 * m2) * m2)
        twm1 = F32(F32(tw1 * m2) * m2)
        best_score = -_FLT_MAX
        scale = _F0
        besti1 = -1
        besti2 = -1
        best_k = -1
        for i1 in range(17):
            for i2 in range(i1, 17):
                sx0 = F32(px[0, i1] + px[0, i2])
                sx1 = F32(px[1, i1] + px[1, i2])
                qxp0 = F32(tqp0 - sx0)
                qxm0 = F32(tqm0 - sx0)
                qxp1 = F32(tqp1 - sx1)
                qxm1 = F32(tqm1 - sx1)
                q2p0 = F32(F32(twp0 + F32(pw[0, i1] * cp1)) + F32(pw[0, i2] * cp2))
                q2m0 = F32(F32(twm0 + F32(pw[0, i1] * cm1)) + F32(pw[0, i2] * cm2))
                q2p1 = F32(F32(twp1 + F32(pw[1, i1] * cp1)) + F32(pw[1, i2] * cp2))
                q2m1 = F32(F32(twm1 + F32(pw[1, i1] * cm1)) + F32(pw[1, i2] * cm2))
                for k in range(4):
                    if k == 0:
                        sqx, sq2 = F32(qxp0 + qxp1), F32(q2p0 + q2p1)
                    elif k == 1:
                        sqx, sq2 = F32(qxp0 + qxm1), F32(q2p0 + q2m1)
                    elif k == 2:
                        sqx, sq2 = F32(qxm0 + qxp1), F32(q2m0 + q2p1)
                    else:
                        sqx, sq2 = F32(qxm0 + qxm1), F32(q2m0 + q2m1)
                    if sq2 > _F0 and F32(sqx * sqx) > F32(best_score * sq2):
                        scale = F32(sqx / sq2)
                        best_score = F32(scale * sqx)
                        besti1 = i1
                        besti2 = i2
                        best_k = k
        if besti1 < 0 or besti2 < 0 or best_k < 0:
            scales[ib] = _F0
            shifts[ib] = 0
            continue
        for j in range(16):
            L[idx[j]] = 0 if j < besti1 else (1 if j < besti2 else 2)
        if scale < _F0:
            for j in range(16):
                L[j] = 2 - L[j]
            scale = -scale
            best_k = 3 - best_k
        all_on_grid = True
        for k in range(2):
            if k == 0:
                xx = _XP if best_k < 2 else _XM
            else:
                xx = _XP if best_k % 2 == 0 else _XM
            u = 0
            for j in range(8):
                u |= L[8 * k + j] << (2 * j)
            gi = np.int64(kmap[u])
            if gi < 0:
                all_on_grid = False
                gi = _best_neighbour(nb, -gi - 1, grid, xb[8 * k:8 * k + 8], weight[8 * k:8 * k + 8], scale, xx)
                if gi < 0:
                    return False
            index[k] = gi
        if not all_on_grid:
            sumqx = _F0
            sumq2 = _F0
            for k in range(2):
                if k == 0:
                    xx = _XP if best_k < 2 else _XM
                else:
                    xx = _XP if best_k % 2 == 0 else _XM
                for j in range(8):
                    w = weight[8 * k + j]
                    q = xx[grid[index[k], j]]
                    sumqx = F32(sumqx + F32(F32(w * q) * xb[8 * k + j]))
                    sumq2 = F32(sumq2 + F32(F32(w * q) * q))
            if sumqx > _F0 and sumq2 > _F0:
                scale = F32(sumqx / sumq2)
        out[row, o + 2 * ib] = np.uint8(index[0] & 255)
        out[row, o + 2 * ib + 1] = np.uint8(index[1] & 255)
        out[row, o + 32 + ib] = np.uint8((index[0] >> 8) | ((index[1] >> 8) << 4))
        if not scale >= _F0:                             # GGML_ASSERT(scale >= 0): NaN aborts
            return False
        scales[ib] = scale
        shifts[ib] = best_k
        max_scale = max_scale if max_scale > scale else scale
    if max_scale == _F0:
        return True
    d = F32(max_scale / F32(15.0))
    id_ = F32(_F1 / d)
    sumqx = _F0
    sumq2 = _F0
    sc = np.zeros(4, np.int64)
    for ib in range(16):
        l = nearest_int(F32(F32(0.5) * F32(F32(id_ * scales[ib]) - _F1)))
        l = max(0, min(7, l))
        sc[ib // 4] |= l << (3 * (ib % 4))
        qh = np.int64(out[row, o + 32 + ib]) | _MASKS[shifts[ib]]
        out[row, o + 32 + ib] = np.uint8(qh)
        xb = x[16 * ib:16 * ib + 16]
        _weights(xb, qw[16 * ib:16 * ib + 16], sigma2, weighted, weight, 16)
        fl = F32(2 * l + 1)
        for k in range(2):
            if k == 0:
                xx = _XP if shifts[ib] < 2 else _XM
            else:
                xx = _XP if shifts[ib] % 2 == 0 else _XM
            g = np.int64(out[row, o + 2 * ib + k]) + ((qh << (8 - 4 * k)) & 0x700)
            for j in range(8):
                w = weight[8 * k + j]
                q = F32(xx[grid[g, j]] * fl)
                sumqx = F32(sumqx + F32(F32(w * q) * xb[8 * k + j]))
                sumq2 = F32(sumq2 + F32(F32(w * q) * q))
    if sumq2 > _F0:
        d = F32(sumqx / sumq2)
    s, _ = _fp16_round(F32(d * F32(1.1125)), f16)
    s = np.int64(s)
    sc[0] |= (s & 0x000F) << 12
    sc[1] |= (s & 0x00F0) << 8
    sc[2] |= (s & 0x0F00) << 4
    sc[3] |= s & 0xF000
    for k in range(4):
        out[row, o + 48 + 2 * k] = np.uint8(sc[k] & 0xFF)
        out[row, o + 49 + 2 * k] = np.uint8((sc[k] >> 8) & 0xFF)
    return True


@njit
def quantize_iq1_m(x, out, qw, f16, grid, kmap, nb):
    """quantize_iq1_m: x float32 (rows, n) -> out uint8 (rows, n / 256 * 56), with quant_weights qw
    (n,), or without (qw of size 0: weights x*x)."""
    bad = _first_bad(x)
    if bad >= 0:
        return bad
    weighted = qw.shape[0] > 0
    weight = np.zeros(16, np.float32)
    px = np.zeros((2, 17), np.float32)
    pw = np.zeros((2, 17), np.float32)
    idx = np.zeros(16, np.int64)
    L = np.zeros(16, np.int64)
    index = np.zeros(2, np.int64)
    scales = np.zeros(16, np.float32)
    shifts = np.zeros(16, np.int64)
    nbl = x.shape[1] // 256
    for r in range(x.shape[0]):
        for b in range(nbl):
            q = qw[256 * b:256 * b + 256] if weighted else qw
            if not _iq1_m_block(x[r, 256 * b:256 * b + 256], q, weighted, out, r, 56 * b, f16, grid, kmap, nb, weight,
                                px, pw, idx, L, index, scales, shifts):
                return -2 - (r * nbl + b)
    return -1


# -- the dots (vec_dot_type Q8_K) ----------------------------------------------------------------------------
@njit
def dot_iq1_s(w, a, f16):
    """ggml_vec_dot_iq1_s_q8_K_generic: one row of IQ1_S blocks (50 bytes) . one row of Q8_K (292)."""
    nb = w.shape[0] // 50
    af = a.view(np.float32)
    sumf = _F0
    for i in range(nb):
        o, p = 50 * i, Q8_K_BYTES * i
        sumi = 0
        sumi1 = 0
        for ib in range(8):
            qh = np.int64(w[o + 34 + 2 * ib]) | (np.int64(w[o + 35 + 2 * ib]) << 8)
            ls = 2 * ((qh >> 12) & 7) + 1
            delta = -1 if qh & 0x8000 else 1
            lsum = 0
            for l in range(4):
                g = np.int64(w[o + 2 + 4 * ib + l]) | (((qh >> (3 * l)) & 7) << 8)
                for j in range(8):
                    lsum += np.int64(np.int8(a[p + 4 + 32 * ib + 8 * l + j])) * _GRID[g, j]
            bs = p + 260 + 4 * ib
            b0 = np.int64(np.int16(np.uint16(a[bs]) | (np.uint16(a[bs + 1]) << np.uint16(8))))
            b1 = np.int64(np.int16(np.uint16(a[bs + 2]) | (np.uint16(a[bs + 3]) << np.uint16(8))))
            sumi += ls * lsum
            sumi1 += ls * delta * (b0 + b1)
        d = F32(f16[np.int64(w[o]) | (np.int64(w[o + 1]) << 8)] * af[73 * i])
        sumf = F32(sumf + F32(d * F32(F32(sumi) + F32(_DELTA * F32(sumi1)))))
    return sumf


@njit
def dot_iq1_m(w, a, f16):
    """ggml_vec_dot_iq1_m_q8_K_generic: one row of IQ1_M blocks (56 bytes) . one row of Q8_K (292)."""
    nb = w.shape[0] // 56
    af = a.view(np.float32)
    sumf = _F0
    for i in range(nb):
        o, p = 56 * i, Q8_K_BYTES * i
        sc = np.empty(4, np.int64)
        for k in range(4):
            sc[k] = np.int64(w[o + 48 + 2 * k]) | (np.int64(w[o + 49 + 2 * k]) << 8)
        s16 = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000)
        sumi1 = 0
        sumi2 = 0
        for ib in range(8):
            qh0 = np.int64(w[o + 32 + 2 * ib])
            qh1 = np.int64(w[o + 33 + 2 * ib])
            s1a = 0
            s1b = 0
            s2a = 0
            s2b = 0
            for l in range(4):
                qh = qh0 if l < 2 else qh1
                g = np.int64(w[o + 4 * ib + l]) | ((qh << (8 - 4 * (l % 2))) & 0x700)
                delta = -1 if (qh & (0x08 if l % 2 == 0 else 0x80)) else 1
                ls1 = 0
                ls2 = 0
                for j in range(8):
                    q = np.int64(np.int8(a[p + 4 + 32 * ib + 8 * l + j]))
                    ls1 += q * _GRID[g, j]
                    ls2 += q
                if l < 2:
                    s1a += ls1
                    s2a += ls2 * delta
                else:
                    s1b += ls1
                    s2b += ls2 * delta
            sv = sc[ib // 2]
            l1 = 2 * ((sv >> (6 * (ib % 2))) & 7) + 1
            l2 = 2 * ((sv >> (6 * (ib % 2) + 3)) & 7) + 1
            sumi1 += s1a * l1 + s1b * l2
            sumi2 += s2a * l1 + s2b * l2
        d = F32(f16[s16] * af[73 * i])
        sumf = F32(sumf + F32(d * F32(F32(sumi1) + F32(_DELTA * F32(sumi2)))))
    return sumf


@njit
def mul_mat_iq1_s(w, a, out, f16):
    """out[m, r] = dot_iq1_s(w[r], a[m])."""
    for m in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[m, r] = dot_iq1_s(w[r], a[m], f16)


@njit
def mul_mat_iq1_m(w, a, out, f16):
    """out[m, r] = dot_iq1_m(w[r], a[m])."""
    for m in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[m, r] = dot_iq1_m(w[r], a[m], f16)
