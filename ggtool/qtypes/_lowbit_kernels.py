"""The compiled kernels of IQ1_S, IQ1_M, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 and MXFP4 (the records: ``iq1``,
``iq4nl``, ``iq4xs``, ``ternary``, ``mxfp4``), in one module because numba's cache checks a kernel against
its own file only: the helpers they share live beside them, those the IQ2/IQ3 kernels share too in
``_kernel_base`` (which the kernel cache's key covers). IQ4_XS's per-32 search is IQ4_NL's own
(``_iq4nl_quantize``, whose file the kernel cache's key covers), not a copy.

GGML's float32 order throughout (ggml-quants.c, ggml-cpu/quants.c ``*_generic``): every constant
float32, integers made float32 before they meet a float, as C's conversions do (numba would
promote int x float32 to float64).

Quantizers: (x float32 (rows, n), out uint8 (rows, row bytes), qw float32 (n,) or (0,): none,
*the record's quantizer_tables()) -> -1, the flat index of x's first NaN/inf (nothing written
then), or -2 - b for the first block b (counted over x's rows) GGML aborts on or leaves undefined
(IQ1: see ``iq1``). Dots: (w uint8 (row bytes,), a uint8 (vec_dot_type row bytes,), f16) ->
float32; mul_mat: (w (N, row bytes), a (M, ...), out float32 (M, N), f16).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from ..kernels import simd
from ..kernels.jit import njit, numba
from ..kernels.tables import KVALUES_IQ4NL
from ._iq4nl_quantize import best_index, iq4_nl_block, iq4_nl_quantize
from ._weighted_quantize import iq4_nl_quantize_w
from ._kernel_base import _f16_at, _first_bad, _put16, fp16_bits, nearest_int
from .grids import IQ1S_GRID, KVALUES_MXFP4
from .mxfp4 import e8m0_half

F32 = np.float32
_F0 = F32(0.0)
_F1 = F32(1.0)
Q8_K_BYTES = 292
_types = numba.types


# -- shared helpers ---------------------------------------------------------------------------------------
# -- MXFP4 ---------------------------------------------------------------------------------------------
_KV4 = KVALUES_MXFP4.astype(np.float32)     # small tables: frozen into the kernels
_KV4_INT = KVALUES_MXFP4.astype(np.int64)
_E8M0_HALF = e8m0_half(np.arange(256))      # GGML_E8M0_TO_FP32_HALF of every exponent


@njit
def _best(x, d):
    """best_index_mxfp4: the first level i of least |kvalues[i] * d - x|."""
    best = 0
    err = abs(F32(_KV4[0] * d) - x)
    for i in range(1, 16):
        e = abs(F32(_KV4[i] * d) - x)
        if e < err:
            best = i
            err = e
    return best


@njit
def quantize_mxfp4(x, out, qw):
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
        d = F32(_f16_at(a, p, f16) * _E8M0_HALF[w[o]])
        s1 = 0
        s2 = 0
        for j in range(16):
            q = w[o + 1 + j]
            s1 += np.int64(np.int8(a[p + 2 + j])) * _KV4_INT[q & 15]
            s2 += np.int64(np.int8(a[p + 18 + j])) * _KV4_INT[q >> 4]
        sumf = F32(sumf + F32(d * F32(s1 + s2)))
    return sumf


@njit
def mul_mat_mxfp4(w, a, out, f16):
    """out[m, r] = dot_mxfp4(w[r], a[m])."""
    for m in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[m, r] = dot_mxfp4(w[r], a[m], f16)


# -- IQ4_NL ----------------------------------------------------------------------------------------------
# The searches are _iq4nl_quantize's (without quant_weights) and _weighted_quantize's (with), run here in the
# records' calling convention: (x (rows, n), out (rows, row bytes), qw (n,) or (0,), f16).
@njit
def quantize_iq4_nl(x, out, qw, f16):
    """quantize_iq4_nl over whole rows: the blocks of x, with quant_weights where qw has them."""
    rows, n = x.shape
    xb = x.reshape(rows * (n // 32), 32)
    ob = out.reshape(rows * (n // 32), 18)
    if qw.shape[0] == 0:
        return iq4_nl_quantize(xb, ob, f16)
    return iq4_nl_quantize_w(xb, ob, qw.reshape(n // 32, 32), f16)


@njit
def dot_iq4_nl(w, a, f16):
    """ggml_vec_dot_iq4_nl_q8_0_generic: one row of IQ4_NL blocks (18 bytes) . one row of Q8_0 (34):
    ``sumf += (d_a * d_w) * float(sumi1 + sumi2)`` block after block."""
    nb = w.shape[0] // 18
    sumf = _F0
    for ib in range(nb):
        o, p = 18 * ib, 34 * ib
        d = F32(_f16_at(a, p, f16) * _f16_at(w, o, f16))
        s1 = 0
        s2 = 0
        for j in range(16):
            q = w[o + 2 + j]
            s1 += np.int64(np.int8(a[p + 2 + j])) * _KV_INT[q & 15]
            s2 += np.int64(np.int8(a[p + 18 + j])) * _KV_INT[q >> 4]
        sumf = F32(sumf + F32(d * F32(s1 + s2)))
    return sumf


@njit
def mul_mat_iq4_nl(w, a, out, f16):
    """out[m, r] = dot_iq4_nl(w[r], a[m])."""
    for m in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[m, r] = dot_iq4_nl(w[r], a[m], f16)


# -- TQ1_0, TQ2_0 -------------------------------------------------------------------------------------
_POW3 = np.array([1, 3, 9, 27, 81, 243], np.int64)


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
def _tq1_0_block(x, out, i, o):
    """quantize_row_tq1_0_ref of one block of 256 into out[i, o:o + 54]."""
    d, id_ = _scale(x)
    _put16(out, i, o + 52, fp16_bits(d))
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
def _tq2_0_block(x, out, i, o):
    d, id_ = _scale(x)
    _put16(out, i, o + 64, fp16_bits(d))
    for j in range(0, 64, 32):
        for m in range(32):
            q = 0
            for n in range(4):
                q += (_trit(x[4 * j + m + 32 * n], id_) & 3) << (2 * n)
            out[i, o + j + m] = np.uint8(q & 0xFF)


@njit
def quantize_tq1_0(x, out, qw):
    """quantize_tq1_0 (quantize_row_tq1_0_ref): x float32 (rows, n) -> out uint8 (rows, n / 256 * 54);
    qw ignored. -1, or the flat index of x's first NaN/inf."""
    bad = _first_bad(x)
    if bad >= 0:
        return bad
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 256):
            _tq1_0_block(x[r, 256 * b:256 * b + 256], out, r, 54 * b)
    return -1


@njit
def quantize_tq2_0(x, out, qw):
    """quantize_tq2_0 (quantize_row_tq2_0_ref): x float32 (rows, n) -> out uint8 (rows, n / 256 * 66)."""
    bad = _first_bad(x)
    if bad >= 0:
        return bad
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 256):
            _tq2_0_block(x[r, 256 * b:256 * b + 256], out, r, 66 * b)
    return -1


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


# -- IQ4_XS -------------------------------------------------------------------------------------------
_KV_INT = KVALUES_IQ4NL.astype(np.int64)


@njit
def _iq4_xs_block(x, qw, weighted, out, i, o, L, weight, scales):
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
    _put16(out, i, o, fp16_bits(d))
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
def quantize_iq4_xs(x, out, qw):
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
            _iq4_xs_block(x[r, 256 * b:256 * b + 256], q, weighted, out, r, 136 * b, L, weight, scales)
    return -1


@njit
def dot_iq4_xs(w, a, f16):
    """ggml_vec_dot_iq4_xs_q8_K_generic: one row of IQ4_XS blocks (136 bytes) . one row of Q8_K (292)."""
    nb = w.shape[0] // 136
    af = a.view(np.float32)
    sumf = _F0
    for ibl in range(nb):
        o, p = 136 * ibl, Q8_K_BYTES * ibl + 4
        d4d8 = F32(_f16_at(w, o, f16) * af[73 * ibl])
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



# -- IQ4_XS x Q8_K for many rows: packed weights and a vector tile ----------------------------------------
# The generic dot above looks each nibble up in kvalues, a loop no vectoriser turns into SIMD. For
# mat-vec speed the weights are unpacked once (``pack_iq4_xs``: the int8 levels themselves, 2x the
# bytes) into the interleaved layout of ggtool.kernels.simd: GROUP rows a group, their codes L rows
# side by side in quads (byte t of quad q of row r at ((chunk * 64 + q) * L + r % L) * 4 + t, chunk =
# r // L); per row and block d as float32 and the 8 sub-block scales ls - 32 as int8. The tile
# (``_tile_iq4_xs``: LLVM vector IR, no target intrinsics, so any x86 numba targets compiles it)
# multiplies int16 pairs of codes and activations into int32 (x86's pmaddwd) and then, per row and
# sub-block of 32, adds ``(d4d8 * float(ls - 32)) * float(sumi)`` to the row's sum exactly as
# ggml_vec_dot_iq4_xs_q8_K_generic does: the same numbers as dot_iq4_xs, bit for bit.
GROUP = 128          # weight rows a group
LANES = 16           # rows a vector (int32 / float32 lanes)
MT = simd.MT         # activation rows a tile (simd.switch_rows's)
_I16, _I32, _F32 = ir.IntType(16), ir.IntType(32), ir.FloatType()
_VW = ir.VectorType(_I16, 2 * LANES)
_VD = ir.VectorType(_I32, LANES)
_VF = ir.VectorType(_F32, LANES)


def _k(v, t=ir.IntType(64)):
    return ir.Constant(t, v)


def _tile_iq4_xs_codegen(context, builder, sig, args):
    from numba.core import cgutils

    names = ("codes", "co", "lsf", "lo", "d", "wo", "ap", "po", "da", "so", "acc", "ao", "mt")
    p = {}
    for name, ty, val in zip(names, sig.args, args):
        p[name] = context.make_array(ty)(context, builder, val).data if isinstance(ty, _types.Array) else val
    b = builder

    def load(name, off, vt=None, align=1):
        ptr = b.gep(p[name], [off])
        if vt is not None:
            ptr = b.bitcast(ptr, vt.as_pointer())
        return b.load(ptr, align=align)

    def body(mt, i0):
        so, po, ao = b.add(p["so"], i0), b.add(p["po"], b.mul(i0, _k(128))), b.add(p["ao"], b.mul(i0, _k(GROUP)))
        das = [load("da", b.add(so, _k(i))) for i in range(mt)]
        eight = ir.Constant(_VW, [8] * (2 * LANES))
        with cgutils.for_range(b, _k(GROUP // LANES)) as chunk:
            c = chunk.index
            r0 = b.mul(c, _k(LANES))
            dv = load("d", b.add(p["wo"], r0), _VF, align=4)
            d4d8 = [b.fmul(dv, simd.splat(b, das[i], LANES)) for i in range(mt)]
            accs = [cgutils.alloca_once_value(b, load("acc", b.add(b.add(ao, _k(i * GROUP)), r0), _VF, align=4))
                    for i in range(mt)]
            with cgutils.for_range(b, _k(8)) as sub:                      # sub-blocks of 32 values
                s = sub.index
                sumi = [ir.Constant(_VD, None)] * mt
                for q in range(8):
                    quad = b.add(b.mul(s, _k(8)), _k(q))
                    v = load("codes", b.add(p["co"], b.mul(b.add(b.mul(c, _k(64)), quad), _k(4 * LANES))), _VW)
                    xs = (b.ashr(b.shl(v, eight), eight), b.ashr(v, eight))
                    for i in range(mt):
                        for kk, x in enumerate(xs):
                            pair = load("ap", b.add(po, b.add(_k(i * 128 + kk), b.mul(quad, _k(2)))))
                            sumi[i] = simd.madd(b, sumi[i], x, pair)
                ls8 = load("lsf", b.add(p["lo"], b.add(b.mul(s, _k(GROUP)), r0)), ir.VectorType(ir.IntType(8), LANES))
                lv = b.sitofp(ls8, _VF)                                   # float(ls - 32): exact
                for i in range(mt):
                    t = b.fmul(b.fmul(d4d8[i], lv), b.sitofp(sumi[i], _VF))
                    b.store(b.fadd(b.load(accs[i]), t), accs[i])
            for i in range(mt):
                ptr = b.bitcast(b.gep(p["acc"], [b.add(b.add(ao, _k(i * GROUP)), r0)]), _VF.as_pointer())
                b.store(b.load(accs[i]), ptr, align=4)

    simd.switch_rows(b, p["mt"], body)
    return context.get_dummy_value()


@numba.extending.intrinsic
def _tile_iq4_xs(typingctx, codes, co, lsf, lo, d, wo, ap, po, da, so, acc, ao, mt):
    """One IQ4_XS block (256 values) of GROUP weight rows x mt (1..MT) activation rows, added into
    acc: codes (int8 quads at co), lsf (int8 ls - 32, [8][GROUP] at lo), d (float32 per row at wo),
    ap (mt x 128 int16 pairs at po), da (float32 per activation row at so), acc (mt rows of GROUP
    at ao). Arrays flat and C-contiguous; offsets in elements."""
    sig = _types.void(codes, co, lsf, lo, d, wo, ap, po, da, so, acc, ao, mt)
    for ty in sig.args:
        if isinstance(ty, _types.Array) and ty.layout != "C":
            return None
    return sig, _tile_iq4_xs_codegen


@njit
def pack_iq4_xs(w, f16):
    """IQ4_XS weight rows (uint8 (N, row bytes)) -> (codes int8, lsf int8 (ls - 32), d float32, N,
    blocks a row): the layout ``_tile_iq4_xs`` reads, rows padded to whole groups with zeros."""
    n, nb = w.shape[0], w.shape[1] // 136
    groups = (n + GROUP - 1) // GROUP
    codes = np.zeros(groups * nb * 256 * GROUP, np.int8)
    lsf = np.zeros(groups * nb * 8 * GROUP, np.int8)
    d = np.zeros(groups * nb * GROUP, np.float32)
    for r in range(n):
        g, rr = r // GROUP, r % GROUP
        c, lane = rr // LANES, rr % LANES
        for b in range(nb):
            o = 136 * b
            gb = g * nb + b
            d[gb * GROUP + rr] = _f16_at(w[r], o, f16)
            h = np.int64(w[r, o + 2]) | (np.int64(w[r, o + 3]) << 8)
            for ib in range(8):
                ls = ((np.int64(w[r, o + 4 + ib // 2]) >> (4 * (ib % 2))) & 15) | (((h >> (2 * ib)) & 3) << 4)
                lsf[(gb * 8 + ib) * GROUP + rr] = ls - 32
                for j in range(32):
                    q = np.int64(w[r, o + 8 + 16 * ib + j % 16])
                    code = q & 15 if j < 16 else q >> 4
                    v = 32 * ib + j
                    codes[gb * 256 * GROUP + ((c * 64 + v // 4) * LANES + lane) * 4 + v % 4] = _KV_INT[code]
    return codes, lsf, d, n, nb


@njit
def _q8_k_pairs(a):
    """Q8_K activation rows as the tile reads them, [block, row]: 128 int32 pairs of the 256 codes
    (pair 2q + k: codes 4q + k and 4q + k + 2), and d."""
    M, nb = a.shape[0], a.shape[1] // Q8_K_BYTES
    q8 = a.view(np.int8)
    ap = np.empty((nb, M, 128), np.int32)
    da = np.empty((nb, M), np.float32)
    for m in range(M):
        af = a[m].view(np.float32)
        for b in range(nb):
            o = b * Q8_K_BYTES + 4
            da[b, m] = af[73 * b]
            for pp in range(128):
                x = o + 4 * (pp // 2) + pp % 2
                ap[b, m, pp] = (np.int32(q8[m, x]) & 0xFFFF) | (np.int32(q8[m, x + 2]) << 16)
    return ap, da


@njit
def mul_mat_iq4_xs_packed(codes, lsf, d, n, nb, a, out):
    """out (M, n) = the packed weight rows . the Q8_K activation rows a (uint8 (M, row bytes)): the
    numbers of mul_mat_iq4_xs (GGML's generic order per row), GROUP rows x MT activations a tile."""
    M = a.shape[0]
    ap, da = _q8_k_pairs(a)
    apf = ap.reshape(-1)
    daf = da.reshape(-1)
    acc = np.empty((M, GROUP), np.float32)
    accf = acc.reshape(-1)
    for g in range((n + GROUP - 1) // GROUP):
        accf[:] = 0
        for b in range(nb):
            gb = g * nb + b
            for m0 in range(0, M, MT):
                so = b * M + m0
                _tile_iq4_xs(codes, gb * 256 * GROUP, lsf, gb * 8 * GROUP, d, gb * GROUP, apf, so * 128, daf, so,
                             accf, m0 * GROUP, min(MT, M - m0))
        for m in range(M):
            for r in range(min(GROUP, n - g * GROUP)):
                out[m, g * GROUP + r] = acc[m, r]

# -- IQ1_S, IQ1_M -------------------------------------------------------------------------------------
_FLT_MAX = F32(3.4028234663852886e38)
_DELTA = F32(0.125)                                  # IQ1S_DELTA, IQ1M_DELTA
_EPS_S = F32(1e-12)                                  # GROUP_MAX_EPS_IQ1_S
_EPS_M = F32(1e-7)                                   # GROUP_MAX_EPS_IQ1_M
_XP = np.array([-1 + 0.125, 0.125, 1 + 0.125], np.float32)    # x_p: the levels shifted up
_XM = np.array([-1 - 0.125, -0.125, 1 - 0.125], np.float32)   # x_m: shifted down
_GRID = IQ1S_GRID.view(np.int8).reshape(2048, 8).astype(np.int64)   # the dots' table (16 KiB frozen)


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
def _iq1_s_block(x, qw, out, row, o, grid, kmap, nb, weight, sumx, sumw, idx, L, index, scales, shifts):
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
    _put16(out, row, o, fp16_bits(F32(d * F32(1.125))))
    id_ = F32(_F1 / d)
    for ib in range(8):
        l = nearest_int(F32(F32(0.5) * F32(F32(id_ * scales[ib]) - _F1)))
        l = max(0, min(7, l))
        if shifts[ib] == -1:
            l |= 8
        out[row, o + 35 + 2 * ib] |= np.uint8((l << 4) & 0xFF)
    return True


@njit
def quantize_iq1_s(x, out, qw, grid, kmap, nb):
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
            if not _iq1_s_block(x[r, 256 * b:256 * b + 256], qw[256 * b:256 * b + 256], out, r, 50 * b, grid, kmap,
                                nb, weight, sumx, sumw, idx, L, index, scales, shifts):
                return -2 - (r * nbl + b)
    return -1


# -- IQ1_M -------------------------------------------------------------------------------------------------
_MASKS = np.array([0x00, 0x80, 0x08, 0x88], np.int64)


@njit
def _iq1_m_block(x, qw, weighted, out, row, o, grid, kmap, nb, weight, px, pw, idx, L, index, scales, shifts):
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
    s = np.int64(fp16_bits(F32(d * F32(1.1125))))
    sc[0] |= (s & 0x000F) << 12
    sc[1] |= (s & 0x00F0) << 8
    sc[2] |= (s & 0x0F00) << 4
    sc[3] |= s & 0xF000
    for k in range(4):
        out[row, o + 48 + 2 * k] = np.uint8(sc[k] & 0xFF)
        out[row, o + 49 + 2 * k] = np.uint8((sc[k] >> 8) & 0xFF)
    return True


@njit
def quantize_iq1_m(x, out, qw, grid, kmap, nb):
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
            if not _iq1_m_block(x[r, 256 * b:256 * b + 256], q, weighted, out, r, 56 * b, grid, kmap, nb, weight,
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
        d = F32(_f16_at(w, o, f16) * af[73 * i])
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
