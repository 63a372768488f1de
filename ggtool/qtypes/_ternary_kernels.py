"""TQ1_0 / TQ2_0's compiled kernels (``ternary`` describes the formats): quantize_row_tq{1,2}_0_ref
and ggml_vec_dot_tq{1,2}_0_q8_K_generic, GGML's float32 order."""

from __future__ import annotations

import math

import numpy as np

from ..kernels.jit import njit
from ..kquants.blocks import _first_bad, _fp16_round, _put_f16

F32 = np.float32
_F0 = F32(0.0)
_POW3 = np.array([1, 3, 9, 27, 81, 243], np.int64)
Q8_K_BYTES = 292


@njit
def _scale(x):
    """amax of the block (MAX over fabsf), and id = 1/amax (0 for amax 0)."""
    amax = _F0
    for j in range(256):
        a = abs(x[j])
        amax = amax if amax > a else a
    return amax, (F32(F32(1.0) / amax) if amax != _F0 else _F0)


@njit
def _trit(v, id_):
    """lroundf(v * id) + 1 as the low byte C keeps: half away from zero; inf/NaN (id = inf) give
    x86's 0x8000000000000000, so 1."""
    r = F32(v * id_)
    if not math.isfinite(r):
        return 1
    a = math.floor(abs(np.float64(r)) + 0.5)
    return np.int64(-a if r < 0 else a) + 1


@njit
def _tq1_0_block(x, out, i, o, f16):
    """quantize_row_tq1_0_ref of one block of 256 into out[i, o:o + 54]."""
    d, id_ = _scale(x)
    h, _ = _fp16_round(d, f16)
    _put_f16(out, i, o + 52, h)
    for m in range(32):                       # qs[0:32]: values m + 32n
        q = 0
        for n in range(5):
            q = (q * 3 + _trit(x[m + 32 * n], id_)) & 0xFF
        out[i, o + m] = np.uint8(((q * 256 + 242) // 243) & 0xFF)
    for m in range(16):                       # qs[32:48]: values 160 + m + 16n
        q = 0
        for n in range(5):
            q = (q * 3 + _trit(x[160 + m + 16 * n], id_)) & 0xFF
        out[i, o + 32 + m] = np.uint8(((q * 256 + 242) // 243) & 0xFF)
    for j in range(4):                        # qh: values 240 + j + 4n, the first trit most significant
        q = 0
        for m in range(4):
            q = (q * 3 + _trit(x[240 + j + 4 * m], id_)) & 0xFF
        q = (q * 3) & 0xFF
        out[i, o + 48 + j] = np.uint8(((q * 256 + 242) // 243) & 0xFF)


@njit
def _tq2_0_block(x, out, i, o, f16):
    d, id_ = _scale(x)
    h, _ = _fp16_round(d, f16)
    _put_f16(out, i, o + 64, h)
    for j in range(0, 64, 32):
        for m in range(32):
            q = 0
            for n in range(4):
                q += (_trit(x[4 * j + m + 32 * n], id_) & 3) << (2 * n)
            out[i, o + j + m] = np.uint8(q & 0xFF)


@njit
def quantize_tq1_0(x, out, qw, f16):
    """quantize_tq1_0 (quantize_row_tq1_0_ref): x float32 (rows, n) -> out uint8 (rows, n / 256 * 54);
    qw ignored. -1, or the flat index of x's first NaN/inf."""
    bad = _first_bad(x)
    if bad >= 0:
        return bad
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 256):
            _tq1_0_block(x[r, 256 * b:256 * b + 256], out, r, 54 * b, f16)
    return -1


@njit
def quantize_tq2_0(x, out, qw, f16):
    """quantize_tq2_0 (quantize_row_tq2_0_ref): x float32 (rows, n) -> out uint8 (rows, n / 256 * 66)."""
    bad = _first_bad(x)
    if bad >= 0:
        return bad
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 256):
            _tq2_0_block(x[r, 256 * b:256 * b + 256], out, r, 66 * b, f16)
    return -1


@njit
def _f16_at(w, o, f16):
    return f16[np.int64(w[o]) | (np.int64(w[o + 1]) << 8)]


@njit
def _tq1_trit(byte, n):
    q = (np.int64(byte) * _POW3[n]) & 0xFF
    return (q * 3) >> 8


@njit
def dot_tq1_0(w, a, f16):
    """ggml_vec_dot_tq1_0_q8_K_generic: one row of TQ1_0 blocks (54 bytes) . one row of Q8_K (292)."""
    nb = w.shape[0] // 54
    af = a.view(np.float32)      # Q8_K's d: the first 4 bytes of each 292 (73 floats)
    sumf = _F0
    for i in range(nb):
        o, p = 54 * i, Q8_K_BYTES * i + 4
        s = 0
        for l in range(5):
            for m in range(32):
                s += (_tq1_trit(w[o + m], l) - 1) * np.int64(np.int8(a[p + l * 32 + m]))
        for l in range(5):
            for m in range(16):
                s += (_tq1_trit(w[o + 32 + m], l) - 1) * np.int64(np.int8(a[p + 160 + l * 16 + m]))
        for l in range(4):
            for j in range(4):
                s += (_tq1_trit(w[o + 48 + j], l) - 1) * np.int64(np.int8(a[p + 240 + l * 4 + j]))
        sumf = F32(sumf + F32(F32(s) * F32(_f16_at(w, o + 52, f16) * af[73 * i])))
    return sumf


@njit
def dot_tq2_0(w, a, f16):
    """ggml_vec_dot_tq2_0_q8_K_generic: one row of TQ2_0 blocks (66 bytes) . one row of Q8_K (292)."""
    nb = w.shape[0] // 66
    af = a.view(np.float32)
    sumf = _F0
    for i in range(nb):
        o, p = 66 * i, Q8_K_BYTES * i + 4
        s = 0
        for j in range(0, 64, 32):
            for l in range(4):
                for k in range(32):
                    s += np.int64(np.int8(a[p + 4 * j + 32 * l + k])) * (((np.int64(w[o + j + k]) >> (2 * l)) & 3) - 1)
        d = F32(af[73 * i] * _f16_at(w, o + 64, f16))
        sumf = F32(sumf + F32(F32(s) * d))
    return sumf


@njit
def mul_mat_tq1_0(w, a, out, f16):
    """out[m, r] = dot_tq1_0(w[r], a[m])."""
    for m in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[m, r] = dot_tq1_0(w[r], a[m], f16)


@njit
def mul_mat_tq2_0(w, a, out, f16):
    """out[m, r] = dot_tq2_0(w[r], a[m])."""
    for m in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[m, r] = dot_tq2_0(w[r], a[m], f16)
