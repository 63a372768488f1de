"""MXFP4's compiled kernels (``mxfp4`` describes the format): quantize_row_mxfp4_ref and
ggml_vec_dot_mxfp4_q8_0_generic, GGML's float32 order (every constant float32; integers made
float32 before they meet a float, as C's conversions do)."""

from __future__ import annotations

import math

import numpy as np

from ..kernels.jit import njit
from ..kquants.blocks import _first_bad
from .grids import KVALUES_MXFP4
from .mxfp4 import e8m0_half

F32 = np.float32
_F0 = F32(0.0)
_KV = KVALUES_MXFP4.astype(np.float32)      # small tables: frozen into the kernels
_KV_INT = KVALUES_MXFP4.astype(np.int64)
_E8M0_HALF = e8m0_half(np.arange(256))      # GGML_E8M0_TO_FP32_HALF of every exponent


@njit
def _best(x, d):
    """best_index_mxfp4: the first level i of least |kvalues[i] * d - x|."""
    best = 0
    err = abs(F32(_KV[0] * d) - x)
    for i in range(1, 16):
        e = abs(F32(_KV[i] * d) - x)
        if e < err:
            best = i
            err = e
    return best


@njit
def quantize_mxfp4(x, out, qw, f16):
    """x float32 (rows, n) -> out uint8 (rows, n / 32 * 17); qw ignored (GGML ignores it). -1, or
    the flat index of x's first NaN/inf."""
    bad = _first_bad(x)
    if bad >= 0:
        return bad
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            xb = x[r, 32 * b:32 * b + 32]
            o = 17 * b
            amax = _F0
            for j in range(32):
                if amax < abs(xb[j]):
                    amax = abs(xb[j])
            e = 0
            if amax > _F0:
                e = (np.int64(math.floor(math.log2(amax))) - 2 + 127) & 0xFF   # (uint8_t) of the float: x86 truncation
            d = _E8M0_HALF[e]
            out[r, o] = np.uint8(e)
            for j in range(16):
                out[r, o + 1 + j] = np.uint8(_best(xb[j], d) | (_best(xb[j + 16], d) << 4))
    return -1


@njit
def dot_mxfp4(w, a, f16):
    """ggml_vec_dot_mxfp4_q8_0_generic: one row of MXFP4 blocks (17 bytes) . one row of Q8_0 (34)."""
    nb = w.shape[0] // 17
    sumf = _F0
    for ib in range(nb):
        o, p = 17 * ib, 34 * ib
        d = F32(f16[np.int64(a[p]) | (np.int64(a[p + 1]) << 8)] * _E8M0_HALF[w[o]])
        s1 = 0
        s2 = 0
        for j in range(16):
            q = w[o + 1 + j]
            s1 += np.int64(np.int8(a[p + 2 + j])) * _KV_INT[q & 15]
            s2 += np.int64(np.int8(a[p + 18 + j])) * _KV_INT[q >> 4]
        sumf = F32(sumf + F32(d * F32(s1 + s2)))
    return sumf


@njit
def mul_mat_mxfp4(w, a, out, f16):
    """out[m, r] = dot_mxfp4(w[r], a[m])."""
    for m in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[m, r] = dot_mxfp4(w[r], a[m], f16)
