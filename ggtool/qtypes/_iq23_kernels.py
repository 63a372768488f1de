"""The compiled loops of IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S (numba; imported by the records
of ``iq2`` and ``iq3`` at first use, so that the registry loads without numba).

* ``iq2_tables`` / ``iq3_tables``: ggml-quants.c's iq2xs_init_impl / iq3xs_init_impl: the
  quantizer's grid (levels 2l+1 of each point), the map from a point's levels to its grid index
  (or, off the grid, to its list of neighbours) and the neighbour lists, in GGML's order.
* ``quantize_*``: quantize_iq2_xxs .. quantize_iq3_s (their ``_impl``), bit for bit: every float
  operation is float32 in C's order (numba promotes int x float32 and Python float literals to
  float64, so every constant is a float32 and every integer that meets a float is made one first).
  Each takes (x float32 (nrows, n), out uint8 (nrows, n // 256 * type size), qw float32 (n,) or
  (0,) for none, tables...) and returns -1, the flat index in x of its first NaN/inf (then it
  writes nothing), or -2 - b where block b (flat over x) makes GGML abort (a GGML_ASSERT: no
  neighbour nearer than FLT_MAX, a point off the grid, a NaN scale); blocks before b are written.
* ``dot_*``: ggml_vec_dot_*_q8_K_generic of one row of weight blocks and one of Q8_K blocks, the
  integer sums exact and the float ones in GGML's order; ``mul_mat_*``: that dot for every pair of
  rows of two matrices.
* ``k_form_*``: rows decoded into the form of ggtool's K-quant dots (int8 codes, an int32 scale
  per 16 values, float32 d, no min), whose sum times the type's final factor is the generic dot.

All of it lives in one file, the helpers both kernel modules share apart (``_kernel_base``, which
the kernel cache's key covers): numba's disk cache checks a kernel against its own file only.
"""

from __future__ import annotations

import numpy as np

from ..kernels.jit import njit
from ._weighted_quantize import make_qp_quants
from ._kernel_base import _first_bad, _float, _put16, _put32, fp16_bits, grid_tables, nearest_int, read_only

F32 = np.float32
_F0 = F32(0.0)
_F1 = F32(1.0)
_F05 = F32(0.5)
_F01 = F32(0.1)
_F02 = F32(0.2)
_F025 = F32(0.25)
_F2 = F32(2.0)
_F31 = F32(31.0)
_F256 = F32(256.0)
_FLT_MAX = F32(3.4028234663852886e38)
_EPS = F32(1e-15)                        # GROUP_MAX_EPS
_EPS_8 = F32(1e-8)                       # GROUP_MAX_EPS_IQ2_S, GROUP_MAX_EPS_IQ3_XXS
_FUDGE_IQ2_S = F32(0.9875)
_FUDGE_IQ3_XXS = F32(1.0125)
_FUDGE_IQ3_S = F32(1.033)
QK_K = 256
Q8_K_BYTES = 292



# -- iq2xs_init_impl / iq3xs_init_impl ------------------------------------------------------------------
def iq2_tables(kgrid, nwant):
    """iq2xs_init_impl of a 2-bit grid (IQ2_XXS: 256 points, IQ2_XS: 512, IQ2_S: 1024; nwant 2, 2, 1)."""
    return read_only(grid_tables(np.ascontiguousarray(kgrid, np.uint16), 2, 8, 43692, nwant))


def iq3_tables(kgrid, nwant):
    """iq3xs_init_impl of a 3-bit grid (IQ3_XXS: 256 points, nwant 2; IQ3_S: 512, nwant 3)."""
    return read_only(grid_tables(np.ascontiguousarray(kgrid, np.uint16), 3, 4, 4096, nwant))


# -- the searches the quantizers share --------------------------------------------------------------------
@njit
def _best_neighbour(nb, start, grid, xval, waux, o, npos, scale, L):
    """iq2/iq3_find_best_neighbour: the grid point of the list at nb[start] nearest xval[o:o+npos]
    (weighted by waux), its levels into L[o:o+npos]; its index, or -1 where none is nearer than
    FLT_MAX (GGML_ASSERT: GGML aborts)."""
    best_d2 = _FLT_MAX
    gi = -1
    for j in range(1, np.int64(nb[start]) + 1):
        g = np.int64(nb[start + j])
        d2 = _F0
        for i in range(npos):
            diff = F32(F32(scale * F32(grid[g, i])) - xval[o + i])
            d2 = F32(d2 + F32(F32(waux[o + i] * diff) * diff))
        if d2 < best_d2:
            best_d2 = d2
            gi = g
    if gi >= 0:
        for i in range(npos):
            L[o + i] = (grid[gi, i] - 1) // 2
    return gi


@njit
def _levels(xval, o, npos, bits, kmax, idv, L):
    """Levels max(0, min(kmax-1, nearest_int(0.5*(id*x - 1)))) of xval[o:o+npos] into L, and the
    point's map index."""
    u = 0
    for i in range(npos):
        lv = nearest_int(F32(_F05 * F32(F32(idv * xval[o + i]) - _F1)))
        lv = max(0, min(kmax - 1, lv))
        L[o + i] = lv
        u |= lv << (bits * i)
    return u


@njit
def _sums(weight, xval, L, n):
    sumqx = _F0
    sumq2 = _F0
    for i in range(n):
        w = weight[i]
        q = F32(2 * np.int64(L[i]) + 1)
        sumqx = F32(sumqx + F32(F32(w * xval[i]) * q))
        sumq2 = F32(sumq2 + F32(F32(w * q) * q))
    return sumqx, sumq2


@njit
def _signs(xb, o, weight, xval, ngroups, parity, block_signs):
    """xval = |x| of the groups of 8 and their sign bits; with parity (IQ2_XXS, IQ2_XS, IQ3_XXS)
    an odd count of minus signs flips the value of least weight*x*x (7 bits kept)."""
    for k in range(ngroups):
        nflip = 0
        s = 0
        for i in range(8):
            v = xb[o + 8 * k + i]
            if v >= _F0:
                xval[8 * k + i] = v
            else:
                xval[8 * k + i] = -v
                nflip += 1
                s |= 1 << i
        if parity:
            if nflip % 2:
                imin = 0
                mn = F32(F32(weight[8 * k] * xb[o + 8 * k]) * xb[o + 8 * k])
                for i in range(1, 8):
                    ax = F32(F32(weight[8 * k + i] * xb[o + 8 * k + i]) * xb[o + 8 * k + i])
                    if ax < mn:
                        mn = ax
                        imin = i
                xval[8 * k + imin] = -xval[8 * k + imin]
                s ^= 1 << imin
            block_signs[k] = s & 127
        else:
            block_signs[k] = s


@njit
def _weights(xb, o, n, qw, qo, sigma2, mode, weight, waux):
    """weight: qw * sqrt(sigma2 + x*x) with an importance matrix (qw of the row, from column qo);
    without one x*x (mode 0: IQ3) or 0.25*sigma2 + x*x (mode 1: IQ2_S); waux = sqrt(weight)."""
    for i in range(n):
        x = xb[o + i]
        if qw.shape[0]:
            weight[i] = F32(qw[qo + i] * F32(np.sqrt(F32(sigma2 + F32(x * x)))))
        elif mode == 0:
            weight[i] = F32(x * x)
        else:
            weight[i] = F32(F32(_F025 * sigma2) + F32(x * x))
    for i in range(n):
        waux[i] = F32(np.sqrt(weight[i]))


@njit
def _sumx2(xb, o):
    s = _F0
    for i in range(QK_K):
        s = F32(s + F32(xb[o + i] * xb[o + i]))
    return s


@njit
def _max(xval, n):
    m = xval[0]
    for i in range(1, n):
        m = m if m > xval[i] else xval[i]          # MAX(a, b): a > b ? a : b
    return m


@njit
def _search(xval, weight, waux, n, npos, bits, kmax, nis, step, on_grid_start, refine_all,
            grid, kmap, nb, L, Laux, on_grid, on_grid_aux, mx):
    """The scale search of IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S (one sub-block of n values in groups
    of npos): the scale, its levels in L; NaN marks a GGML abort (no neighbour)."""
    ng = n // npos
    fk = F32(2 * kmax - 1)
    best = _F0
    scale = F32(mx / fk)
    for k in range(ng):
        on_grid[k] = on_grid_start
    for is_ in range(-nis, nis + 1):
        idv = F32(F32(fk + F32(F32(is_) * step)) / mx)
        this_scale = F32(_F1 / idv)
        for k in range(ng):
            u = _levels(xval, npos * k, npos, bits, kmax, idv, Laux)
            on_grid_aux[k] = True
            if kmap[u] < 0:
                on_grid_aux[k] = False
                if _best_neighbour(nb, -kmap[u] - 1, grid, xval, waux, npos * k, npos, this_scale, Laux) < 0:
                    return np.float32(np.nan)
        sumqx, sumq2 = _sums(weight, xval, Laux, n)
        if sumq2 > _F0 and F32(sumqx * sumqx) > F32(best * sumq2):
            scale = F32(sumqx / sumq2)
            best = F32(scale * sumqx)
            for i in range(n):
                L[i] = Laux[i]
            for k in range(ng):
                on_grid[k] = on_grid_aux[k]
    n_off = 0
    for k in range(ng):
        if not on_grid[k]:
            n_off += 1
    if n_off > 0 and scale > _F0:
        idv = F32(_F1 / scale)
        for k in range(ng):
            if on_grid[k] and not refine_all:
                continue
            u = _levels(xval, npos * k, npos, bits, kmax, idv, L)
            if kmap[u] < 0:
                if _best_neighbour(nb, -kmap[u] - 1, grid, xval, waux, npos * k, npos, scale, L) < 0:
                    return np.float32(np.nan)
        sumqx, sumq2 = _sums(weight, xval, L, n)
        if sumq2 > _F0:
            scale = F32(sumqx / sumq2)
    return scale


@njit
def _point(L, o, npos, bits, kmap):
    """The grid index of the levels L[o:o+npos], or -1 off the grid (GGML aborts: "Oops")."""
    u = 0
    for i in range(npos):
        u |= np.int64(L[o + i]) << (bits * i)
    g = kmap[u]
    return g if g >= 0 else -1


@njit
def _scale_nibble(idv, s):
    lv = nearest_int(F32(_F05 * F32(F32(idv * s) - _F1)))
    return max(0, min(15, lv))


# -- IQ2_XXS --------------------------------------------------------------------------------------------
@njit
def quantize_iq2_xxs(x, out, qw, grid, kmap, nb):
    """quantize_iq2_xxs (quantize_row_iq2_xxs_impl; quant_weights required): 66-byte blocks of
    fp16 d and uint32 pairs per 32 values: 4 grid indices (a byte each), then 4 x 7 sign bits and
    a 4-bit scale in the top bits."""
    bad = _first_bad(x)
    if bad >= 0:
        return bad
    nrows, n = x.shape
    nbl = n // QK_K
    weight = np.empty(32, F32)
    waux = np.empty(32, F32)
    xval = np.empty(32, F32)
    L = np.zeros(32, np.int64)
    Laux = np.zeros(32, np.int64)
    qpl = np.zeros(32, np.int64)
    bsg = np.zeros(4, np.int64)
    scales = np.empty(8, F32)
    q2 = np.zeros(16, np.uint32)
    for r in range(nrows):
        for ibl in range(nbl):
            o0 = QK_K * ibl
            ob = 66 * ibl
            for i in range(16):
                q2[i] = 0
            max_scale = _F0
            sigma2 = F32(_sumx2(x[r], o0) / _F256)
            for ib in range(8):
                o = o0 + 32 * ib
                _weights(x[r], o, 32, qw, o, sigma2, 0, weight, waux)
                _signs(x[r], o, weight, xval, 4, True, bsg)
                mx = _max(xval, 32)
                if mx < _EPS:
                    scales[ib] = _F0
                    continue
                scale = make_qp_quants(32, 4, xval, qpl, weight)
                eff_max = F32(scale * F32(3.0))
                if eff_max <= _F0:
                    scales[ib] = _F0
                    continue
                best = _F0
                for is_ in range(-6, 7):
                    idv = F32(F32(F32(5.0) + F32(F32(is_) * _F01)) / eff_max)
                    this_scale = F32(_F1 / idv)
                    for k in range(4):
                        u = _levels(xval, 8 * k, 8, 2, 3, idv, Laux)
                        if kmap[u] < 0:
                            if _best_neighbour(nb, -kmap[u] - 1, grid, xval, waux, 8 * k, 8, this_scale, Laux) < 0:
                                return -2 - (r * nbl + ibl)
                    sumqx, sumq2 = _sums(weight, xval, Laux, 32)
                    if sumq2 > _F0 and F32(sumqx * sumqx) > F32(best * sumq2):
                        scale = F32(sumqx / sumq2)
                        best = F32(scale * sumqx)
                        for i in range(32):
                            L[i] = Laux[i]
                if scale > _F0:
                    idv = F32(_F1 / scale)
                    for k in range(4):
                        u = _levels(xval, 8 * k, 8, 2, 3, idv, L)
                        gi = kmap[u]
                        if gi < 0:
                            gi = _best_neighbour(nb, -gi - 1, grid, xval, waux, 8 * k, 8, scale, L)
                            if gi < 0:
                                return -2 - (r * nbl + ibl)
                    sumqx, sumq2 = _sums(weight, xval, L, 32)
                    if sumq2 > _F0:
                        scale = F32(sumqx / sumq2)
                if scale < _F0:
                    scale = -scale
                    for k in range(4):
                        bsg[k] = (~bsg[k]) & 127
                for k in range(4):
                    gi = _point(L, 8 * k, 8, 2, kmap)
                    if gi < 0:
                        return -2 - (r * nbl + ibl)
                    q2[2 * ib] |= np.uint32(gi) << np.uint32(8 * k)
                    q2[2 * ib + 1] |= np.uint32(bsg[k]) << np.uint32(7 * k)
                if not scale >= _F0:
                    return -2 - (r * nbl + ibl)
                scales[ib] = scale
                max_scale = max_scale if max_scale > scale else scale
            if max_scale == _F0:
                for i in range(66):
                    out[r, ob + i] = 0
                continue
            d = F32(max_scale / _F31)
            _put16(out, r, ob, fp16_bits(d))
            idv = F32(_F1 / d)
            for ib in range(8):
                q2[2 * ib + 1] |= np.uint32(_scale_nibble(idv, scales[ib])) << np.uint32(28)
            for i in range(16):
                _put32(out, r, ob + 2 + 4 * i, q2[i])
    return -1


# -- IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S ------------------------------------------------------------------------
@njit
def quantize_iq2_xs(x, out, qw, grid, kmap, nb):
    """quantize_iq2_xs (quant_weights required): 74-byte blocks of fp16 d, uint16 qs[32] (a 9-bit
    grid index and 7 sign bits per 8 values), scales[8] (a 4-bit scale per 16 values)."""
    return _quantize_16(x, out, qw, grid, kmap, nb, False)


@njit
def quantize_iq2_s(x, out, qw, grid, kmap, nb):
    """quantize_iq2_s (quant_weights optional): 82-byte blocks of fp16 d, qs[32] (grid index low
    bytes), signs[32] (8 bits per 8 values), qh[8] (the index's 2 high bits), scales[8]."""
    return _quantize_16(x, out, qw, grid, kmap, nb, True)


@njit
def _quantize_16(x, out, qw, grid, kmap, nb, is_s):
    bad = _first_bad(x)
    if bad >= 0:
        return bad
    nrows, n = x.shape
    nbl = n // QK_K
    nbytes = 82 if is_s else 74
    weight = np.empty(16, F32)
    waux = np.empty(16, F32)
    xval = np.empty(16, F32)
    L = np.zeros(16, np.int64)
    Laux = np.zeros(16, np.int64)
    bsg = np.zeros(2, np.int64)
    og = np.zeros(2, np.bool_)
    oga = np.zeros(2, np.bool_)
    scales = np.empty(16, F32)
    eps = _EPS_8 if is_s else _EPS
    for r in range(nrows):
        for ibl in range(nbl):
            o0 = QK_K * ibl
            ob = nbytes * ibl
            for i in range(nbytes):
                out[r, ob + i] = 0
            max_scale = _F0
            s2 = _sumx2(x[r], o0)
            sigma2 = F32(F32(_F2 * s2) / _F256) if is_s else F32(s2 / _F256)
            for ib in range(16):
                o = o0 + 16 * ib
                _weights(x[r], o, 16, qw, o, sigma2, 1, weight, waux)
                _signs(x[r], o, weight, xval, 2, not is_s, bsg)
                mx = _max(xval, 16)
                for i in range(16):
                    L[i] = 0
                if mx < eps:
                    scales[ib] = _F0
                    continue
                scale = _search(xval, weight, waux, 16, 8, 2, 3, 9, _F01, True, False,
                                grid, kmap, nb, L, Laux, og, oga, mx)
                if scale != scale:
                    return -2 - (r * nbl + ibl)
                if scale < _F0:
                    scale = -scale
                    for k in range(2):
                        bsg[k] = (~bsg[k]) & (255 if is_s else 127)
                for k in range(2):
                    gi = _point(L, 8 * k, 8, 2, kmap)
                    if gi < 0:
                        return -2 - (r * nbl + ibl)
                    if is_s:
                        i8 = 2 * ib + k
                        out[r, ob + 2 + i8] = np.uint8(gi & 255)
                        out[r, ob + 66 + i8 // 4] |= np.uint8((gi >> 8) << (2 * (i8 % 4)))
                        out[r, ob + 2 + 32 + i8] = np.uint8(bsg[k])
                    else:
                        _put16(out, r, ob + 2 + 2 * (2 * ib + k), gi | (bsg[k] << 9))
                scales[ib] = scale
                max_scale = max_scale if max_scale > scale else scale
            if max_scale == _F0:
                if not is_s:
                    for i in range(2, 66):     # IQ2_XS: qs zeroed, d and scales (zero) stay
                        out[r, ob + i] = 0
                continue
            d = F32(max_scale / _F31)
            _put16(out, r, ob, fp16_bits(F32(d * _FUDGE_IQ2_S) if is_s else d))
            idv = F32(_F1 / d)
            at = ob + (74 if is_s else 66)
            for ib in range(16):
                lv = _scale_nibble(idv, scales[ib])
                if ib % 2 == 0:
                    out[r, at + ib // 2] = np.uint8(lv)
                else:
                    out[r, at + ib // 2] |= np.uint8(lv << 4)
    return -1


@njit
def quantize_iq3_xxs(x, out, qw, grid, kmap, nb):
    """quantize_iq3_xxs (quantize_row_iq3_xxs_impl(256, ...); quant_weights optional): 98-byte
    blocks of fp16 d, qs[64] (a grid index a byte per 4 values), then per 32 values a uint32 of
    4 x 7 sign bits and a 4-bit scale on top."""
    bad = _first_bad(x)
    if bad >= 0:
        return bad
    nrows, n = x.shape
    nbl = n // QK_K
    weight = np.empty(32, F32)
    waux = np.empty(32, F32)
    xval = np.empty(32, F32)
    L = np.zeros(32, np.int64)
    Laux = np.zeros(32, np.int64)
    bsg = np.zeros(4, np.int64)
    og = np.zeros(8, np.bool_)
    oga = np.zeros(8, np.bool_)
    scales = np.empty(8, F32)
    sas = np.zeros(8, np.uint32)
    for r in range(nrows):
        for ibl in range(nbl):
            o0 = QK_K * ibl
            ob = 98 * ibl
            for i in range(98):
                out[r, ob + i] = 0
            for i in range(8):
                sas[i] = 0
            max_scale = _F0
            sigma2 = F32(F32(_F2 * _sumx2(x[r], o0)) / _F256)
            for ib in range(8):
                o = o0 + 32 * ib
                _weights(x[r], o, 32, qw, o, sigma2, 0, weight, waux)
                _signs(x[r], o, weight, xval, 4, True, bsg)
                mx = _max(xval, 32)
                for i in range(32):
                    L[i] = 0
                if mx < _EPS_8:
                    scales[ib] = _F0
                    continue
                scale = _search(xval, weight, waux, 32, 4, 3, 8, 15, _F02, True, False,
                                grid, kmap, nb, L, Laux, og, oga, mx)
                if scale != scale:
                    return -2 - (r * nbl + ibl)
                if scale < _F0:
                    scale = -scale
                    for k in range(4):
                        bsg[k] = (~bsg[k]) & 127
                for k in range(8):
                    gi = _point(L, 4 * k, 4, 3, kmap)
                    if gi < 0:
                        return -2 - (r * nbl + ibl)
                    out[r, ob + 2 + 8 * ib + k] = np.uint8(gi)
                sas[ib] = np.uint32(bsg[0] | (bsg[1] << 7) | (bsg[2] << 14) | (bsg[3] << 21))
                scales[ib] = scale
                max_scale = max_scale if max_scale > scale else scale
            if max_scale == _F0:
                for i in range(2, 98):
                    out[r, ob + i] = 0
                continue
            d = F32(max_scale / _F31)
            _put16(out, r, ob, fp16_bits(F32(d * _FUDGE_IQ3_XXS)))
            idv = F32(_F1 / d)
            for ib in range(8):
                v = sas[ib] | (np.uint32(_scale_nibble(idv, scales[ib])) << np.uint32(28))
                _put32(out, r, ob + 2 + 64 + 4 * ib, v)
    return -1


@njit
def quantize_iq3_s(x, out, qw, grid, kmap, nb):
    """quantize_iq3_s (quantize_row_iq3_s_impl with block_size 32; quant_weights optional):
    110-byte blocks of fp16 d, qs[64] (grid index low bytes), qh[8] (their 9th bits), signs[32]
    (8 bits per 8 values), scales[4] (4 bits per 32 values). As in GGML, an all-zero sub-block
    writes no qs or signs and the next sub-block's take its place (qh and scales stay in place)."""
    bad = _first_bad(x)
    if bad >= 0:
        return bad
    nrows, n = x.shape
    nbl = n // QK_K
    weight = np.empty(32, F32)
    waux = np.empty(32, F32)
    xval = np.empty(32, F32)
    L = np.zeros(32, np.int64)
    Laux = np.zeros(32, np.int64)
    bsg = np.zeros(4, np.int64)
    og = np.zeros(8, np.bool_)
    oga = np.zeros(8, np.bool_)
    scales = np.empty(8, F32)
    for r in range(nrows):
        for ibl in range(nbl):
            o0 = QK_K * ibl
            ob = 110 * ibl
            for i in range(110):
                out[r, ob + i] = 0
            max_scale = _F0
            done = 0           # sub-blocks written: GGML's qs and signs pointers move on only for these
            sigma2 = F32(F32(_F2 * _sumx2(x[r], o0)) / _F256)
            for ib in range(8):
                o = o0 + 32 * ib
                _weights(x[r], o, 32, qw, o, sigma2, 0, weight, waux)
                _signs(x[r], o, weight, xval, 4, False, bsg)
                mx = _max(xval, 32)
                for i in range(32):
                    L[i] = 0
                if mx == _F0:
                    scales[ib] = _F0
                    continue
                scale = _search(xval, weight, waux, 32, 4, 3, 8, 9, _F02, False, True,
                                grid, kmap, nb, L, Laux, og, oga, mx)
                if scale != scale:
                    return -2 - (r * nbl + ibl)
                if scale < _F0:
                    scale = -scale
                    for k in range(4):
                        bsg[k] = (~bsg[k]) & 255
                for k in range(8):
                    gi = _point(L, 4 * k, 4, 3, kmap)
                    if gi < 0:
                        return -2 - (r * nbl + ibl)
                    out[r, ob + 2 + 8 * done + k] = np.uint8(gi & 255)
                    out[r, ob + 66 + ib] |= np.uint8((gi >> 8) << k)
                for k in range(4):
                    out[r, ob + 74 + 4 * done + k] = np.uint8(bsg[k])
                done += 1
                scales[ib] = scale
                max_scale = max_scale if max_scale > scale else scale
            if max_scale == _F0:
                continue
            d = F32(max_scale / _F31)
            _put16(out, r, ob, fp16_bits(F32(d * _FUDGE_IQ3_S)))
            idv = F32(_F1 / d)
            for ib in range(0, 8, 2):
                l1 = _scale_nibble(idv, scales[ib])
                l2 = _scale_nibble(idv, scales[ib + 1])
                out[r, ob + 106 + ib // 2] = np.uint8(l1 | (l2 << 4))
    return -1


# -- dot products with Q8_K (ggml_vec_dot_*_q8_K_generic) -------------------------------------------------
@njit
def _f32_at(a, o):
    """The float32 stored little-endian at a[o:o+4] (Q8_K's d)."""
    v = np.int64(a[o]) | (np.int64(a[o + 1]) << 8) | (np.int64(a[o + 2]) << 16) | (np.int64(a[o + 3]) << 24)
    return _float(np.int32(v))


@njit
def _u16(w, o):
    return np.int64(w[o]) | (np.int64(w[o + 1]) << 8)


@njit
def _u32(w, o):
    return _u16(w, o) | (_u16(w, o + 2) << 16)


@njit
def _group8(gb, g, signs, q8, o):
    """sum_j grid[g][j] * q8[o+j] * (-1 if bit j of signs), 8 values (exact, int64)."""
    s = 0
    for j in range(8):
        v = np.int64(gb[8 * g + j]) * np.int64(q8[o + j])
        s += -v if (signs >> j) & 1 else v
    return s


@njit
def _group4x2(gb, g1, g2, signs, q8, o):
    """Two 4-value points (IQ3): grid g1 against q8[o:o+4], g2 against q8[o+4:o+8]."""
    s = 0
    for j in range(4):
        v = np.int64(gb[4 * g1 + j]) * np.int64(q8[o + j])
        s += -v if (signs >> j) & 1 else v
        v = np.int64(gb[4 * g2 + j]) * np.int64(q8[o + 4 + j])
        s += -v if (signs >> (j + 4)) & 1 else v
    return s


@njit
def dot_iq2_xxs(w, a, gb, ksigns, f16):
    """ggml_vec_dot_iq2_xxs_q8_K_generic: one row of IQ2_XXS blocks . one row of Q8_K blocks."""
    nb = w.shape[0] // 66
    q8 = a.view(np.int8)
    sumf = _F0
    for i in range(nb):
        ow, oa = 66 * i, Q8_K_BYTES * i
        d = F32(f16[_u16(w, ow)] * _f32_at(a, oa))
        bsum = 0
        for ib in range(8):
            o = ow + 2 + 8 * ib
            hi = _u32(w, o + 4)
            ls = 2 * (hi >> 28) + 1
            sumi = 0
            for l in range(4):
                sumi += _group8(gb, np.int64(w[o + l]), np.int64(ksigns[(hi >> (7 * l)) & 127]), q8, oa + 4 + 32 * ib + 8 * l)
            bsum += sumi * ls
        sumf = F32(sumf + F32(d * F32(np.int32(bsum))))
    return F32(F32(0.125) * sumf)


@njit
def dot_iq2_xs(w, a, gb, ksigns, f16):
    """ggml_vec_dot_iq2_xs_q8_K_generic."""
    nb = w.shape[0] // 74
    q8 = a.view(np.int8)
    sumf = _F0
    for i in range(nb):
        ow, oa = 74 * i, Q8_K_BYTES * i
        d = F32(f16[_u16(w, ow)] * _f32_at(a, oa))
        bsum = 0
        for ib in range(8):
            sc = np.int64(w[ow + 66 + ib])
            for half in range(2):
                sumi = 0
                for l in range(2 * half, 2 * half + 2):
                    q = _u16(w, ow + 2 + 8 * ib + 2 * l)
                    sumi += _group8(gb, q & 511, np.int64(ksigns[q >> 9]), q8, oa + 4 + 32 * ib + 8 * l)
                bsum += sumi * (2 * ((sc >> (4 * half)) & 15) + 1)
        sumf = F32(sumf + F32(d * F32(np.int32(bsum))))
    return F32(F32(0.125) * sumf)


@njit
def dot_iq2_s(w, a, gb, ksigns, f16):
    """ggml_vec_dot_iq2_s_q8_K_generic."""
    nb = w.shape[0] // 82
    q8 = a.view(np.int8)
    sumf = _F0
    for i in range(nb):
        ow, oa = 82 * i, Q8_K_BYTES * i
        d = F32(f16[_u16(w, ow)] * _f32_at(a, oa))
        bsum = 0
        for ib in range(8):
            sc = np.int64(w[ow + 74 + ib])
            qh = np.int64(w[ow + 66 + ib])
            sumi1 = 0
            sumi2 = 0
            for l in range(4):
                g = np.int64(w[ow + 2 + 4 * ib + l]) | ((qh << (8 - 2 * l)) & 0x300)
                s = _group8(gb, g, np.int64(w[ow + 34 + 4 * ib + l]), q8, oa + 4 + 32 * ib + 8 * l)
                if l < 2:
                    sumi1 += s
                else:
                    sumi2 += s
            bsum += (1 + 2 * (sc & 15)) * sumi1 + (1 + 2 * (sc >> 4)) * sumi2
        sumf = F32(sumf + F32(d * F32(np.int32(bsum))))
    return F32(F32(0.125) * sumf)


@njit
def dot_iq3_xxs(w, a, gb, ksigns, f16):
    """ggml_vec_dot_iq3_xxs_q8_K_generic."""
    nb = w.shape[0] // 98
    q8 = a.view(np.int8)
    sumf = _F0
    for i in range(nb):
        ow, oa = 98 * i, Q8_K_BYTES * i
        d = F32(f16[_u16(w, ow)] * _f32_at(a, oa))
        bsum = 0
        for ib in range(8):
            aux = _u32(w, ow + 66 + 4 * ib)
            ls = 2 * (aux >> 28) + 1
            sumi = 0
            for l in range(4):
                o = ow + 2 + 8 * ib + 2 * l
                sumi += _group4x2(gb, np.int64(w[o]), np.int64(w[o + 1]), np.int64(ksigns[(aux >> (7 * l)) & 127]),
                                  q8, oa + 4 + 32 * ib + 8 * l)
            bsum += sumi * ls
        sumf = F32(sumf + F32(d * F32(np.int32(bsum))))
    return F32(F32(0.25) * sumf)


@njit
def dot_iq3_s(w, a, gb, ksigns, f16):
    """ggml_vec_dot_iq3_s_q8_K_generic."""
    nb = w.shape[0] // 110
    q8 = a.view(np.int8)
    sumf = _F0
    for i in range(nb):
        ow, oa = 110 * i, Q8_K_BYTES * i
        d = F32(f16[_u16(w, ow)] * _f32_at(a, oa))
        bsum = 0
        for ib in range(8):
            qh = np.int64(w[ow + 66 + ib])
            sumi = 0
            for l in range(4):
                o = ow + 2 + 8 * ib + 2 * l
                g1 = np.int64(w[o]) | ((qh << (8 - 2 * l)) & 256)
                g2 = np.int64(w[o + 1]) | ((qh << (7 - 2 * l)) & 256)
                sumi += _group4x2(gb, g1, g2, np.int64(w[ow + 74 + 4 * ib + l]), q8, oa + 4 + 32 * ib + 8 * l)
            sc = np.int64(w[ow + 106 + ib // 2])
            bsum += sumi * (2 * ((sc >> (4 * (ib % 2))) & 15) + 1)
        sumf = F32(sumf + F32(d * F32(np.int32(bsum))))
    return sumf


@njit
def mul_mat_iq2_xxs(w, a, out, gb, ksigns, f16):
    """out[m, r] = dot_iq2_xxs(w[r], a[m]) for every weight row r and activation row m."""
    for m in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[m, r] = dot_iq2_xxs(w[r], a[m], gb, ksigns, f16)


@njit
def mul_mat_iq2_xs(w, a, out, gb, ksigns, f16):
    """out[m, r] = dot_iq2_xs(w[r], a[m]) for every weight row r and activation row m."""
    for m in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[m, r] = dot_iq2_xs(w[r], a[m], gb, ksigns, f16)


@njit
def mul_mat_iq2_s(w, a, out, gb, ksigns, f16):
    """out[m, r] = dot_iq2_s(w[r], a[m]) for every weight row r and activation row m."""
    for m in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[m, r] = dot_iq2_s(w[r], a[m], gb, ksigns, f16)


@njit
def mul_mat_iq3_xxs(w, a, out, gb, ksigns, f16):
    """out[m, r] = dot_iq3_xxs(w[r], a[m]) for every weight row r and activation row m."""
    for m in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[m, r] = dot_iq3_xxs(w[r], a[m], gb, ksigns, f16)


@njit
def mul_mat_iq3_s(w, a, out, gb, ksigns, f16):
    """out[m, r] = dot_iq3_s(w[r], a[m]) for every weight row r and activation row m."""
    for m in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[m, r] = dot_iq3_s(w[r], a[m], gb, ksigns, f16)


# -- the K form: what GGML's generic dots multiply ----------------------------------------------------------
# Each type's dot is sum over blocks of (d_w * d_a) * bsum, bsum = sum_j scale_j * (codes_j . q8_j)
# over 16-value groups j, times a final constant (0.125 for IQ2, 0.25 for IQ3_XXS, 1 for IQ3_S):
# the form of ggtool's K-quant dots (int8 codes, an integer scale per 16 values, float d, no min).
@njit
def _k_alloc(w, nbytes):
    n, nb = w.shape[0], w.shape[1] // nbytes
    return np.empty((n, nb, 256), np.int8), np.empty((n, nb, 16), np.int32), np.empty((n, nb), np.float32), n, nb


@njit
def _k_put8(codes, i, b, at, gb, g, signs):
    for j in range(8):
        v = np.int8(gb[8 * g + j])
        codes[i, b, at + j] = -v if (signs >> j) & 1 else v


@njit
def _k_put4x2(codes, i, b, at, gb, g1, g2, signs):
    for j in range(4):
        v = np.int8(gb[4 * g1 + j])
        codes[i, b, at + j] = -v if (signs >> j) & 1 else v
        v = np.int8(gb[4 * g2 + j])
        codes[i, b, at + 4 + j] = -v if (signs >> (j + 4)) & 1 else v


@njit
def k_form_iq2_xxs(w, gb, ksigns, f16):
    """IQ2_XXS rows (uint8 (n, nb * 66)) in the K form: codes int8 (n, nb, 256), scales int32
    (n, nb, 16), d float32 (n, nb); the dot's final factor is 0.125."""
    codes, sc, d, n, nb = _k_alloc(w, 66)
    for i in range(n):
        for b in range(nb):
            ow = 66 * b
            d[i, b] = f16[_u16(w[i], ow)]
            for ib in range(8):
                o = ow + 2 + 8 * ib
                hi = _u32(w[i], o + 4)
                sc[i, b, 2 * ib] = sc[i, b, 2 * ib + 1] = 2 * (hi >> 28) + 1
                for l in range(4):
                    _k_put8(codes, i, b, 32 * ib + 8 * l, gb, np.int64(w[i, o + l]), np.int64(ksigns[(hi >> (7 * l)) & 127]))
    return codes, sc, d


@njit
def k_form_iq2_xs(w, gb, ksigns, f16):
    """IQ2_XS rows in the K form (final factor 0.125)."""
    codes, sc, d, n, nb = _k_alloc(w, 74)
    for i in range(n):
        for b in range(nb):
            ow = 74 * b
            d[i, b] = f16[_u16(w[i], ow)]
            for ib in range(8):
                s = np.int64(w[i, ow + 66 + ib])
                sc[i, b, 2 * ib] = 2 * (s & 15) + 1
                sc[i, b, 2 * ib + 1] = 2 * (s >> 4) + 1
                for l in range(4):
                    q = _u16(w[i], ow + 2 + 8 * ib + 2 * l)
                    _k_put8(codes, i, b, 32 * ib + 8 * l, gb, q & 511, np.int64(ksigns[q >> 9]))
    return codes, sc, d


@njit
def k_form_iq2_s(w, gb, ksigns, f16):
    """IQ2_S rows in the K form (final factor 0.125)."""
    codes, sc, d, n, nb = _k_alloc(w, 82)
    for i in range(n):
        for b in range(nb):
            ow = 82 * b
            d[i, b] = f16[_u16(w[i], ow)]
            for ib in range(8):
                s = np.int64(w[i, ow + 74 + ib])
                sc[i, b, 2 * ib] = 2 * (s & 15) + 1
                sc[i, b, 2 * ib + 1] = 2 * (s >> 4) + 1
                qh = np.int64(w[i, ow + 66 + ib])
                for l in range(4):
                    g = np.int64(w[i, ow + 2 + 4 * ib + l]) | ((qh << (8 - 2 * l)) & 0x300)
                    _k_put8(codes, i, b, 32 * ib + 8 * l, gb, g, np.int64(w[i, ow + 34 + 4 * ib + l]))
    return codes, sc, d


@njit
def k_form_iq3_xxs(w, gb, ksigns, f16):
    """IQ3_XXS rows in the K form (final factor 0.25)."""
    codes, sc, d, n, nb = _k_alloc(w, 98)
    for i in range(n):
        for b in range(nb):
            ow = 98 * b
            d[i, b] = f16[_u16(w[i], ow)]
            for ib in range(8):
                aux = _u32(w[i], ow + 66 + 4 * ib)
                sc[i, b, 2 * ib] = sc[i, b, 2 * ib + 1] = 2 * (aux >> 28) + 1
                for l in range(4):
                    o = ow + 2 + 8 * ib + 2 * l
                    _k_put4x2(codes, i, b, 32 * ib + 8 * l, gb, np.int64(w[i, o]), np.int64(w[i, o + 1]),
                              np.int64(ksigns[(aux >> (7 * l)) & 127]))
    return codes, sc, d


@njit
def k_form_iq3_s(w, gb, ksigns, f16):
    """IQ3_S rows in the K form (final factor 1)."""
    codes, sc, d, n, nb = _k_alloc(w, 110)
    for i in range(n):
        for b in range(nb):
            ow = 110 * b
            d[i, b] = f16[_u16(w[i], ow)]
            for ib in range(8):
                s = (np.int64(w[i, ow + 106 + ib // 2]) >> (4 * (ib % 2))) & 15
                sc[i, b, 2 * ib] = sc[i, b, 2 * ib + 1] = 2 * s + 1
                qh = np.int64(w[i, ow + 66 + ib])
                for l in range(4):
                    o = ow + 2 + 8 * ib + 2 * l
                    g1 = np.int64(w[i, o]) | ((qh << (8 - 2 * l)) & 256)
                    g2 = np.int64(w[i, o + 1]) | ((qh << (7 - 2 * l)) & 256)
                    _k_put4x2(codes, i, b, 32 * ib + 8 * l, gb, g1, g2, np.int64(w[i, ow + 74 + 4 * ib + l]))
    return codes, sc, d
