"""IQ4_XS's compiled kernels (``iq4xs`` describes the format): quantize_iq4_xs with and without
quant_weights (IQ4_NL's search: ggtool.kquants.legacy, not a copy) and
ggml_vec_dot_iq4_xs_q8_K_generic, GGML's float32 order."""

from __future__ import annotations

import math

import numpy as np

from ..kernels.jit import njit
from ..kernels.tables import KVALUES_IQ4NL
from ..kquants.blocks import _first_bad, _fp16_round, _put_f16, nearest_int
from ..kquants.legacy import best_index, iq4_nl_block

F32 = np.float32
_F0 = F32(0.0)
_F1 = F32(1.0)
_KV_INT = KVALUES_IQ4NL.astype(np.int64)
Q8_K_BYTES = 292


@njit
def _iq4_xs_block(x, qw, weighted, out, i, o, f16, L, weight, scales):
    """quantize_row_iq4_nl_impl(QK_K, 32, ...) for one block of 256 into out[i, o:o + 136]."""
    kv = KVALUES_IQ4NL
    sigma2 = _F0
    for j in range(256):
        sigma2 = F32(sigma2 + F32(x[j] * x[j]))
    sigma2 = F32(sigma2 * F32(0.0078125))                  # 2.f / 256
    max_scale = _F0
    amax_scale = _F0
    for ib in range(8):
        xb = x[32 * ib:32 * ib + 32]
        if weighted:
            for j in range(32):
                weight[j] = F32(qw[32 * ib + j] * F32(math.sqrt(F32(sigma2 + F32(xb[j] * xb[j])))))
        else:
            for j in range(32):
                weight[j] = F32(xb[j] * xb[j])
        d = iq4_nl_block(xb, weight, kv, L[32 * ib:32 * ib + 32], 7)
        scales[ib] = d
        if abs(d) > amax_scale:
            amax_scale = abs(d)
            max_scale = d
    d = F32(-max_scale / F32(32.0))
    h, _ = _fp16_round(d, f16)
    _put_f16(out, i, o, h)
    id_ = F32(_F1 / d) if d != _F0 else _F0
    sh = 0
    for ib in range(8):
        l = nearest_int(F32(id_ * scales[ib]))
        l = max(-32, min(31, l))
        dl = F32(d * F32(l))
        idl = F32(_F1 / dl) if dl != _F0 else _F0
        for j in range(32):
            L[32 * ib + j] = best_index(kv, F32(idl * x[32 * ib + j]))
        l += 32
        if ib % 2 == 0:
            out[i, o + 4 + ib // 2] = np.uint8(l & 15)
        else:
            out[i, o + 4 + ib // 2] |= np.uint8((l & 15) << 4)
        sh |= (l >> 4) << (2 * ib)
    out[i, o + 2] = np.uint8(sh & 0xFF)
    out[i, o + 3] = np.uint8(sh >> 8)
    for ib in range(8):
        for j in range(16):
            out[i, o + 8 + 16 * ib + j] = np.uint8(L[32 * ib + j] | (L[32 * ib + 16 + j] << 4))


@njit
def quantize_iq4_xs(x, out, qw, f16):
    """quantize_iq4_xs: x float32 (rows, n) -> out uint8 (rows, n / 256 * 136), with quant_weights
    qw (n,), or without (qw of size 0: weights x*x). -1, or the flat index of x's first NaN/inf."""
    bad = _first_bad(x)
    if bad >= 0:
        return bad
    weighted = qw.shape[0] > 0
    L = np.zeros(256, np.int64)
    weight = np.zeros(32, np.float32)
    scales = np.zeros(8, np.float32)
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 256):
            q = qw[256 * b:256 * b + 256] if weighted else qw
            _iq4_xs_block(x[r, 256 * b:256 * b + 256], q, weighted, out, r, 136 * b, f16, L, weight, scales)
    return -1


@njit
def dot_iq4_xs(w, a, f16):
    """ggml_vec_dot_iq4_xs_q8_K_generic: one row of IQ4_XS blocks (136 bytes) . one row of Q8_K (292)."""
    nb = w.shape[0] // 136
    af = a.view(np.float32)
    sumf = _F0
    for ibl in range(nb):
        o, p = 136 * ibl, Q8_K_BYTES * ibl + 4
        d4d8 = F32(f16[np.int64(w[o]) | (np.int64(w[o + 1]) << 8)] * af[73 * ibl])
        h = np.int64(w[o + 2]) | (np.int64(w[o + 3]) << 8)
        for ib in range(0, 8, 2):
            sl = np.int64(w[o + 4 + ib // 2])
            ls1 = (sl & 15) | ((h << 4) & 0x30)
            ls2 = (sl >> 4) | ((h << 2) & 0x30)
            h >>= 4
            d1 = F32(d4d8 * F32(ls1 - 32))
            d2 = F32(d4d8 * F32(ls2 - 32))
            for half in range(2):
                q = o + 8 + 16 * (ib + half)
                r = p + 32 * (ib + half)
                s1 = 0
                s2 = 0
                for j in range(16):
                    s1 += np.int64(np.int8(a[r + j])) * _KV_INT[w[q + j] & 15]
                    s2 += np.int64(np.int8(a[r + 16 + j])) * _KV_INT[w[q + j] >> 4]
                sumf = F32(sumf + F32((d1 if half == 0 else d2) * F32(s1 + s2)))
    return sumf


@njit
def mul_mat_iq4_xs(w, a, out, f16):
    """out[m, r] = dot_iq4_xs(w[r], a[m])."""
    for m in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[m, r] = dot_iq4_xs(w[r], a[m], f16)
