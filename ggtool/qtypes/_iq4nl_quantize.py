"""IQ4_NL without an importance matrix, bit for bit as ggml_quantize_chunk writes it:
``quantize_iq4_nl`` (llama-quantize never uses its reference row: ``quantize_iq4_nl`` searches 7
steps either side of the first scale, weighted by x*x), and the search its weighted path shares.

The kernel takes (xb float32 (n, 32), out uint8 (n, 18), f16: kernels.tables.F16_TO_F32) and
returns -1, or the flat index in xb of its first NaN/inf (then it writes nothing). A block
(ggml-common.h's block_iq4_nl) is fp16 d and qs[16]: indices into ``KVALUES``, element j in the low
nibble of byte j, j + 16 in the high one.
"""

from __future__ import annotations

import numpy as np

from ..kernels.jit import njit
from ..kernels.tables import KVALUES_IQ4NL
from ._k_quantize import GROUP_MAX_EPS, _first_bad, _fp16_round, _put_f16

F32 = np.float32
_F0 = F32(0.0)
_F1 = F32(1.0)

KVALUES = KVALUES_IQ4NL   # IQ4_NL's 16 levels, the dequantizer's table

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
