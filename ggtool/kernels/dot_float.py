"""F32 and F16 dot products in GGML's scalar order: mul_mat with f32 or f16 weights, compiled.

Numerics: GGML's ``ggml_vec_dot_f32`` / ``ggml_vec_dot_f16`` without SIMD (ggml-cpu/vec.cpp's scalar
branch), bit for bit. Per output element, with ``x`` a weight row and ``y`` an activation row:
``sumf`` is a double (``ggml_float``) starting at +0.0, ``sumf += (double)(x[i] * y[i])`` for
i = 0..K-1 in order, the product a float32 multiplication, and the result is ``(float)sumf``. For
F16 both rows are widened exactly to float32 first (GGML_CPU_FP16_TO_FP32), and the product of two
fp16 values is exact in float32. The order is the same on every CPU: the lanes of the vector tile
below are outputs (16 weight rows side by side), never parts of one sum, and no fused multiply-add
or reassociation is allowed (no fast-math; the float product is widened before the add, so LLVM
has nothing to fuse). So the bits depend on neither the CPU numba compiles for (AVX-512, AVX2, SSE2:
the same IR in wider or narrower halves), nor on BLAS, nor on how rows are split between
participants.

How: weights are transposed ``L`` rows at a time into a small buffer (``NC`` chunks of ``L`` rows,
each ``K`` x ``L`` float32: the k-th values of 16 rows side by side; F16 widened on the way), and a
register tile (``_tile``, portable LLVM vector IR as ``simd``'s tiles) keeps ``<16 x double>``
accumulators for up to ``MT`` activation rows x ``NC`` chunks over the whole of k: per k one
``<16 x float>`` product per pair, widened and added. No repacked copy of the weights is kept (an
attention's K and V change every step; the transposition costs O(n K) against the dot's O(M n K)).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from .. import types as T
from . import simd
from .dot_base import register
from .jit import njit, numba
from .native import view_as

L = 16        # weight rows per vector (float32 lanes of one product)
MT = 4        # activation rows per register tile
NC = 4        # chunks of L weight rows a one-row tile takes at once
X_BYTES = 64 * 1024   # activation rows a block of work keeps in the cache while every chunk passes

_F32, _F64 = ir.FloatType(), ir.DoubleType()
_VF = ir.VectorType(_F32, L)
_VD = ir.VectorType(_F64, L)
_VD8 = ir.VectorType(_F64, L // 2)
_LO8 = ir.Constant(ir.VectorType(ir.IntType(32), L // 2), list(range(L // 2)))
_HI8 = ir.Constant(ir.VectorType(ir.IntType(32), L // 2), list(range(L // 2, L)))
_ALL16 = ir.Constant(ir.VectorType(ir.IntType(32), L), list(range(L)))
_SHAPES = ((1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (3, 1), (4, 1))   # (activation rows, chunks) bodies
_NAMES = ("wt", "xf", "xo", "k", "res", "mt", "nc")


def _tile_codegen(context, builder, sig, args):
    A = simd._Args(context, builder, sig, args, _NAMES)
    xo, K = A.p["xo"], A.p["k"]
    c = simd._c
    shape = builder.add(builder.mul(A.p["mt"], c(8)), A.p["nc"])
    end = builder.append_basic_block("tile.end")
    blocks = [builder.append_basic_block(f"tile.{m}x{n}") for m, n in _SHAPES]
    sw = builder.switch(shape, end)
    for (m, n), blk in zip(_SHAPES, blocks):
        sw.add_case(c(m * 8 + n), blk)
    zero = ir.Constant(_VD, None)
    for (mt, nc), blk in zip(_SHAPES, blocks):
        builder.position_at_end(blk)
        b = builder
        accs = [[numba.core.cgutils.alloca_once_value(b, zero) for _ in range(nc)] for _ in range(mt)]
        for row in accs:
            for acc in row:
                b.store(zero, acc)
        # base pointers: chunk j's k-th vector, activation row i's k-th value
        wj = [b.bitcast(A.at("wt", b.mul(b.mul(c(j), K), c(L))), _VF.as_pointer()) for j in range(nc)]
        xi = [A.at("xf", b.add(xo, b.mul(c(i), K))) for i in range(mt)]
        with numba.core.cgutils.for_range(b, K) as loop:
            k = loop.index
            ws = [b.load(b.gep(wj[j], [k]), align=4) for j in range(nc)]
            halves = [(b.shuffle_vector(v, v, _LO8), b.shuffle_vector(v, v, _HI8)) for v in ws]
            for i in range(mt):
                xv = simd.splat(b, b.load(b.gep(xi[i], [k])), L // 2)
                for j in range(nc):
                    lo = b.fpext(b.fmul(halves[j][0], xv), _VD8)        # (double)(x[k] * y[k]), 8 rows
                    hi = b.fpext(b.fmul(halves[j][1], xv), _VD8)
                    acc = b.load(accs[i][j])
                    both = b.shuffle_vector(lo, hi, _ALL16)
                    b.store(b.fadd(acc, both), accs[i][j])
        for i in range(mt):
            for j in range(nc):
                A.store("res", c((i * NC + j) * L), b.fptrunc(b.load(accs[i][j]), _VF))
        b.branch(end)
    builder.position_at_end(end)
    return context.get_dummy_value()


@numba.core.extending.intrinsic
def _tile(typingctx, wt, xf, xo, k, res, mt, nc):
    """res[i*NC*L + j*L + r] = float(sum over k of double(wt[(j*K + k)*L + r] * xf[xo + i*K + k])),
    added in k order from +0.0, for i < mt activation rows and j < nc chunks ((mt, nc) in _SHAPES)."""
    sig = numba.types.void(wt, xf, xo, k, res, mt, nc)
    simd._check(sig.args, _NAMES)
    return sig, _tile_codegen


def _transpose_codegen(half: bool):
    """16 weight rows x 16 values from w (rows `stride` elements apart, from element wo; fp16 widened
    if `half`) into 16 vectors of 16 float32 bits at buf[bo + 16 k + r]: 16 vector loads, the 4
    butterfly stages of shuffles (stage s swaps bit s of the row and of the value index), 16 stores."""
    i16, i32 = ir.IntType(16), ir.IntType(32)
    vin = ir.VectorType(i16 if half else i32, L)
    vh = ir.VectorType(ir.HalfType(), L)
    vi = ir.VectorType(i32, L)
    masks = {s: (ir.Constant(ir.VectorType(i32, L), [k if not k & s else L + k - s for k in range(L)]),
                 ir.Constant(ir.VectorType(i32, L), [k + s if not k & s else L + k for k in range(L)]))
             for s in (1, 2, 4, 8)}

    def codegen(context, builder, sig, args):
        A = simd._Args(context, builder, sig, args, ("w", "wo", "stride", "buf", "bo"))
        b = builder
        rows = []
        for r in range(L):
            v = A.load("w", b.add(A.p["wo"], b.mul(simd._c(r), A.p["stride"])), vin, align=2 if half else 4)
            if half:
                v = b.bitcast(b.fpext(b.bitcast(v, vh), _VF), vi)    # exact widening (F16C's vcvtph2ps)
            rows.append(v)
        for s in (1, 2, 4, 8):
            lo, hi = masks[s]
            for i in range(L):
                if not i & s:
                    rows[i], rows[i + s] = (b.shuffle_vector(rows[i], rows[i + s], lo),
                                            b.shuffle_vector(rows[i], rows[i + s], hi))
        for k in range(L):
            A.store("buf", b.add(A.p["bo"], simd._c(k * L)), rows[k])
        return context.get_dummy_value()
    return codegen


@numba.core.extending.intrinsic
def _transpose16(typingctx, w, wo, stride, buf, bo):
    """buf[bo + 16 k + r] = w[wo + r*stride + k] (float32 bits, fp16 widened), r, k < 16; w is the
    weight rows flat (uint32 float32 bits or uint16 fp16 bits), buf uint32."""
    sig = numba.types.void(w, wo, stride, buf, bo)
    simd._check(sig.args, ("w", "wo", "stride", "buf", "bo"))
    return sig, _transpose_codegen(w.dtype == numba.types.uint16)


@njit
def _transpose(w, base, stride, n, K, bits, wide, n0, nc, buf):
    """buf[(j*K + k)*L + r] = the float32 bits of weight row n0 + j*L + r's value k (0 past the
    last of n rows): row r's K values are w[base + r*stride + k] (w flat: float32 bits, uint32, or
    fp16 bits, uint16, widened through `bits` (float32 bits of every fp16) if `wide`). Both kinds
    compile the same function."""
    full = K - K % L
    for j in range(nc):
        if n0 + (j + 1) * L <= n:             # a whole chunk: 16 x 16 blocks in registers, then the tail
            for k0 in range(0, full, L):
                _transpose16(w, base + (n0 + j * L) * stride + k0, stride, buf, (j * K + k0) * L)
            for r in range(L):
                row, o = base + (n0 + j * L + r) * stride, j * K * L + r
                for k in range(full, K):
                    buf[o + k * L] = bits[w[row + k]] if wide else w[row + k]
            continue
        for r in range(L):
            row = base + (n0 + j * L + r) * stride
            o = j * K * L + r
            if n0 + j * L + r >= n:
                for k in range(K):
                    buf[o + k * L] = 0
            elif wide:
                for k in range(K):
                    buf[o + k * L] = bits[w[row + k]]
            else:
                for k in range(K):
                    buf[o + k * L] = w[row + k]


@njit
def _dot(w, bits, wide, xf, out):
    """out (M, n) = weight rows w (n, K: float32 or fp16 bits, see _transpose) . activation rows
    xf (M, K) float32, GGML's scalar order."""
    _dot_rows(w.reshape(-1), np.int64(0), w.shape[1], w.shape[0], bits, wide, xf, out)


@njit
def _dot_rows(w, base, stride, n, bits, wide, xf, out):
    """_dot of the n weight rows w[base + r*stride:][:K] (w flat; K = xf's columns): rows read where
    they lie (an attention's K or V, a view into the cache), never gathered first. One compiled form
    for ``_dot`` and the runner's ``nodes_mm.mm_f32``: w read-only, base and wide values (np.int64,
    np.bool_), not constants (numba compiles a form apart for each; ``dot._act_pairs``)."""
    K, M = xf.shape[1], xf.shape[0]
    G = (n + NC * L - 1) // (NC * L)
    wb = np.empty(G * NC * K * L, np.uint32)
    buf = view_as(wb, np.float32)
    for g in range(G):                        # every chunk transposed once
        _transpose(w, base, stride, n, K, bits, wide, g * NC * L, min(NC, (n - g * NC * L + L - 1) // L),
                   wb[g * NC * K * L:])
    res = np.empty(MT * NC * L, np.float32)
    flat = xf.reshape(-1)
    mb = max(MT, X_BYTES // (4 * MT * max(K, 1)) * MT)   # activation rows that stay in the cache
    for b0 in range(0, M, mb):
        for g in range(G):
            n0 = g * NC * L
            nc = min(NC, (n - n0 + L - 1) // L)
            for m0 in range(b0, min(b0 + mb, M), MT):
                mt = min(MT, M - m0, b0 + mb - m0)
                if mt == 1:                   # one row: every chunk at once (independent sums)
                    _tile(buf[n0 * K:], flat, m0 * K, K, res, 1, nc)
                    for j in range(nc):
                        for r in range(min(L, n - n0 - j * L)):
                            out[m0, n0 + j * L + r] = res[j * L + r]
                else:
                    for j in range(nc):
                        _tile(buf[(n0 + j * L) * K:], flat, m0 * K, K, res, mt, 1)
                        for i in range(mt):
                            for r in range(min(L, n - n0 - j * L)):
                                out[m0 + i, n0 + j * L + r] = res[i * NC * L + r]


@njit
def _widen(x, f16):
    """fp16 bits (M, K) -> float32, exactly."""
    y = np.empty(x.shape, np.float32)
    for m in range(x.shape[0]):
        for k in range(x.shape[1]):
            y[m, k] = f16[x[m, k]]
    return y


def _as(a: np.ndarray, dtype, writable: bool = False) -> np.ndarray:
    """Rows as `dtype` (M, K): already of it, or their bytes (uint8 (M, K * itemsize)) viewed; a copy
    where `writable` asks for one of read-only rows (numba compiles read-only arrays apart)."""
    a = np.ascontiguousarray(a)
    if writable and not a.flags.writeable:
        a = a.copy()
    return a if a.dtype == dtype else a.view(dtype)


def _read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of weight rows. numba compiles a function anew for read-only arrays, and
    weights mapped from a file are read-only while a context's or the KV cache's are not: viewed
    read-only, every weight takes one compiled form, which halves what compiling a float dot costs
    (~2.5 s CPU of ~7 s for F32's, which a first-ever run pays)."""
    v = a.view()
    v.flags.writeable = False
    return v


def pack_f32(w, f16=None):
    """F32 weights need no repacking (the kernel transposes them as it goes): their rows' bits,
    uint32 (n, K), read-only (`_read_only`)."""
    return (_read_only(_as(w, np.uint32)),)


def dot_f32(w, act, f16, out) -> None:
    """out (M, n) float32 = f32 weight rows (bits, uint32 (n, K)) . f32 activation rows act (M, K)."""
    _dot(w, f16.view(np.uint32), False, _as(act, np.float32, True), out)


def pack_f16(w, f16=None):
    """F16 weights stay fp16 bits (uint16 (n, K), read-only: `_read_only`); widened as the kernel
    transposes them."""
    return (_read_only(_as(w, np.uint16)),)


def dot_f16(w, act, f16, out) -> None:
    """out (M, n) float32 = f16 weight rows (uint16 bits (n, K)) . f16 activation rows (M, K)."""
    _dot(w, f16.view(np.uint32), True, _widen(_as(act, np.uint16), f16), out)


register(T.F32, 4, pack_f32, dot_f32)
register(T.F16, 2, pack_f16, dot_f16)
