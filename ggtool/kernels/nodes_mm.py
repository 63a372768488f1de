"""mul_mat's node kernels for the compiled runner (``nodes``' calling convention), in two steps as GGML
runs it:

- ``mm_convert``: src1's f32 rows to the weights' vec_dot_type (Q8_0, Q8_1, Q8_K, F16) in the work
  buffer (packed rows at i13*nbw3 + i12*nbw2 + i11*nbw1, as ``ops.matmul`` lays them out), each row's
  blocks split between the participants as ggml_compute_forward_mul_mat splits them (a decode row is
  shared by all of them); the quantizers are ``kernels.quantize``'s, block
  by block the bytes ``ops.matmul._convert_src1`` writes. Then the barrier.
- ``mm_q32``, ``mm_k``, ``mm_k6`` (GGML's scalar order, on ``dot``'s repacked
  weights: the tiles of ``simd``) and ``mm_x86`` (llama.cpp's x86 orders, ``x86``): the participant's
  units of work, a table made by ``ops.matmul`` in its process (``UNIT`` words each: which
  activation rows, which weight rows as row groups of one repacked tile, and that tile's arrays):
  its own share, or, where the step deals them out (``CHUNK_ADDR`` in its row), every unit, each
  participant taking the next one no one has taken, as GGML deals out chunks, so that a
  participant held up (another process on its core) leaves its units to the others.
  A unit computes each of its outputs exactly as the kernel the Python forward calls does (the same
  tile per row group and block, in the same order), so the bits are the forward's, whoever computes
  the unit.
- ``mm_f32``: F32 weights and activations under GGML's numerics (attention's products with the KV
  cache) in one step (no conversion): the Python path's tiles through ``dot_float``'s kernel.
"""

from __future__ import annotations

import numpy as np

from . import quantize, simd, x86
from .dot import _act_pairs
from .dot_base import GROUP
from .dot_float import _dot_rows
from .dot_k import _act_pairs_k
from .jit import njit, numba
from .nodes import _BIG, CHUNK_ADDR, DST, E_VALUE, NB, NE, P, ROW, SRC0, SRC1, A, f32s, f64s, i64s, register, words
from .native import atomic_add, read_only, voidptr

# -- mm_convert ---------------------------------------------------------------------------------------
CV_Q8_0, CV_Q8_1, CV_Q8_K, CV_F16 = 0, 1, 2, 3
_CV_BLOCK = (32, 32, 256, 1)            # values per block
_CV_BYTES = (34, 36, 292, 2)            # bytes per block

carray = numba.carray
_q8_1 = quantize.q8_1_quantize_cpu.dispatcher


@njit(inline="always")
def _convert_blocks(kind, src, dst, n):
    """n blocks of f32 at src into the vec_dot_type's bytes at dst: -1, or the first bad value's index."""
    if kind == CV_F16:          # GGML_FP32_TO_FP16, value by value (no bad value to report)
        xi = carray(voidptr(src), (n,), np.uint32)
        o = carray(voidptr(dst), (n,), np.uint16)
        for k in range(n):
            o[k] = np.uint16(quantize._f16_bits(xi[k]))
        return -1
    bs, nbytes = _CV_BLOCK[kind], _CV_BYTES[kind]
    x = carray(voidptr(src), (n, bs), np.float32)
    out = carray(voidptr(dst), (n, nbytes), np.uint8)
    if kind == CV_Q8_0:
        return quantize._q8_0(read_only(x), out, True)
    if kind == CV_Q8_1:
        return _q8_1(read_only(x), out)
    return quantize.quantize_q8_k(x, out)


def mm_convert(row, frow, ith, nth, wdata):
    """src1 (SRC1, f32 rows packed) to the vec_dot_type (P: the kind, nbw1) in the work buffer; each
    row's blocks [ith*nb/nth, (ith+1)*nb/nth) here."""
    w = words(row, ROW)
    kind, nbw1 = w[P], w[P + 1]
    ne10, ne11, ne12, ne13 = w[SRC1 + NE], w[SRC1 + NE + 1], w[SRC1 + NE + 2], w[SRC1 + NE + 3]
    bs, nbytes = _CV_BLOCK[kind], _CV_BYTES[kind]
    nb = ne10 // bs
    k0, k1 = ith * nb // nth, (ith + 1) * nb // nth
    if k1 <= k0:
        return 0
    for i13 in range(ne13):
        for i12 in range(ne12):
            for i11 in range(ne11):
                src = w[SRC1 + A] + i11 * w[SRC1 + NB + 1] + i12 * w[SRC1 + NB + 2] + i13 * w[SRC1 + NB + 3]
                dst = wdata + ((i13 * ne12 + i12) * ne11 + i11) * nbw1
                if _convert_blocks(kind, src + k0 * bs * 4, dst + k0 * nbytes, k1 - k0) >= 0:
                    return E_VALUE
    return 0


# -- the units of the dot step ----------------------------------------------------------------------------
# a unit: activation rows r0..r1 of matrix (i12, i13), weight row groups g0..g1 of the repacked tile that
# starts at weight row col0 (n rows, nb blocks), its arrays at p0..p4 (the weight matrix m2, m3)
U_I13, U_I12, U_R0, U_R1, U_COL0, U_G0, U_G1, U_N, U_NB, U_M2, U_M3, U_P = range(12)
UNIT = 16
# the dot step's parameters in the row: the units' address and count, the f16 table, the activations
# (address, 0: the work buffer; row, matrix and batch strides), then a kernel's own
M_UNITS, M_COUNT, M_F16, M_ACT, M_ANB1, M_ANB2, M_ANB3, M_ARG = P, P + 1, P + 2, P + 3, P + 4, P + 5, P + 6, P + 7


@njit(inline="always")
def _act(w, u, wdata, rb):
    """The unit's activation rows as (M, rb) bytes."""
    base = w[M_ACT] if w[M_ACT] != 0 else wdata
    a = base + u[U_I13] * w[M_ANB3] + u[U_I12] * w[M_ANB2] + u[U_R0] * w[M_ANB1]
    return carray(voidptr(a), (u[U_R1] - u[U_R0], rb), np.uint8)


@njit(inline="always")
def _out(w, u):
    """Address of the unit's first output row (column 0) and the row stride in floats."""
    o = w[DST + A] + u[U_I13] * w[DST + NB + 3] + u[U_I12] * w[DST + NB + 2] + u[U_R0] * w[DST + NB + 1]
    return o, w[DST + NB + 1] // 4


@njit(inline="always")
def _store(acc, out, stride, g, n, col):
    """Row group g's results (acc: (M, GROUP)) into the outputs at weight rows col + g*GROUP + r."""
    c = col + g * GROUP
    for m in range(acc.shape[0]):
        for r in range(min(GROUP, n - g * GROUP)):
            out[m * stride + c + r] = acc[m, r]


@njit(inline="always")
def _arr(addr, dtype):
    return carray(voidptr(addr), (1 << 40,), dtype)


@njit(inline="always")
def _first(w):
    """The first unit this participant computes: where the step deals its units out (a chunk counter
    in the row), the first no participant has taken, else its table's first."""
    chunk = w[CHUNK_ADDR]
    return 0 if chunk == 0 else atomic_add(chunk, 1)


@njit(inline="always")
def _next(w, k):
    """The unit after k: where the units are dealt out, the next no participant has taken (GGML's
    current_chunk, the counter 0 from the barrier before the step; unlike GGML's, a participant's
    first unit is taken from it too, so that each is computed whoever deals and whoever does not),
    else k + 1."""
    chunk = w[CHUNK_ADDR]
    return k + 1 if chunk == 0 else atomic_add(chunk, 1)


@njit(inline="always")
def _same(u, prev):
    return prev[U_I13] == u[U_I13] and prev[U_I12] == u[U_I12] and prev[U_R0] == u[U_R0] and prev[U_R1] == u[U_R1]


Q32_Q4_0, Q32_Q8_0, Q32_Q8_1 = 0, 1, 2      # mm_q32's kinds: Q4_0; Q8_0 and Q5_0; Q4_1 and Q5_1
# and the qtypes records' int8 levels (``kernels.dot.pack_levels``, ``simd.tile_levels``): d as fp16
# bits (IQ4_NL) or float32 (MXFP4)
Q32_LEVELS, Q32_LEVELS_F32 = 3, 4


def mm_q32(row, frow, ith, nth, wdata):
    """The dot step of the 32-value block types (P args: the activations' row bytes, the kind): per
    unit and row group, ``dot``'s tile over every block, as ``dot._run_*`` runs it."""
    w = words(row, ROW)
    units, count = i64s(w[M_UNITS]), w[M_COUNT]
    k = prev = _first(w)
    if k >= count:
        return 0
    f16 = carray(voidptr(w[M_F16]), (65536,), np.float32)
    rb, kind = w[M_ARG], w[M_ARG + 1]
    nbytes = 36 if kind == Q32_Q8_1 else 34
    nibbles = kind == Q32_Q4_0
    ap, off, da, sa = _act_pairs(_act(w, units[k * UNIT:(k + 1) * UNIT], wdata, rb), f16, nbytes, nibbles, nibbles)
    acc = np.empty((ap.shape[1], GROUP), np.float32)
    while k < count:
        u = units[k * UNIT:(k + 1) * UNIT]
        if not _same(u, units[prev * UNIT:(prev + 1) * UNIT]):
            ap, off, da, sa = _act_pairs(_act(w, u, wdata, rb), f16, nbytes, nibbles, nibbles)
            acc = np.empty((ap.shape[1], GROUP), np.float32)
        M, nb, n = ap.shape[1], u[U_NB], u[U_N]
        out, stride = _out(w, u)
        o = f32s(out)
        d = _arr(u[U_P + 1], np.uint16)           # fp16 bits: the tile widens them
        for g in range(u[U_G0], u[U_G1]):
            acc[:, :] = 0
            for b in range(nb):
                wo = (g * nb + b) * GROUP
                for m0 in range(0, M, simd.MT):
                    so = b * M + m0
                    mt = min(simd.MT, M - m0)
                    if kind == Q32_Q4_0:
                        simd.tile_q4_0(_arr(u[U_P], np.uint8), wo * 16, d, d, wo, ap, so * 16, off, da, da, so, acc,
                                       m0 * GROUP, mt)
                    elif kind == Q32_Q8_0:
                        simd.tile_q8_0(_arr(u[U_P], np.int8), wo * 32, d, d, wo, ap, so * 16, off, da, da, so, acc,
                                       m0 * GROUP, mt)
                    elif kind == Q32_LEVELS:
                        simd.tile_levels(_arr(u[U_P], np.int8), wo * 32, d, d, wo, ap, so * 16, off, da, da, so, acc,
                                         m0 * GROUP, mt)
                    elif kind == Q32_LEVELS_F32:
                        df = _arr(u[U_P + 1], np.float32)
                        simd.tile_levels(_arr(u[U_P], np.int8), wo * 32, df, df, wo, ap, so * 16, off, da, da, so, acc,
                                         m0 * GROUP, mt)
                    else:
                        simd.tile_q8_1(_arr(u[U_P], np.int8), wo * 32, d, _arr(u[U_P + 2], np.uint16), wo, ap, so * 16,
                                       off, da, sa, so, acc, m0 * GROUP, mt)
            _store(acc, o, stride, g, n, u[U_COL0])
        prev, k = k, _next(w, k)
    return 0


def mm_k(row, frow, ith, nth, wdata):
    """The dot step of the K-quants with mins (Q2_K, Q4_K, Q5_K: ``dot_k._pack_k``'s form and
    ``simd.tile_k``, as ``dot_k._dot_k`` runs it; P args: the activations' row bytes, hm), and of the
    qtypes records' K forms (hm 0, no mins; their final factor, the one float, multiplies each sum
    as ``quant.matmul._record_mul_mat`` does)."""
    w = words(row, ROW)
    units, count = i64s(w[M_UNITS]), w[M_COUNT]
    k = prev = _first(w)
    if k >= count:
        return 0
    rb, hm = w[M_ARG], w[M_ARG + 1]
    factor = np.float32(f64s(frow)[0])
    scaled = hm == 0
    ap, bp, da = _act_pairs_k(_act(w, units[k * UNIT:(k + 1) * UNIT], wdata, rb), np.bool_(False))
    acc = np.empty((ap.shape[1], GROUP), np.float32)
    while k < count:
        u = units[k * UNIT:(k + 1) * UNIT]
        if not _same(u, units[prev * UNIT:(prev + 1) * UNIT]):
            ap, bp, da = _act_pairs_k(_act(w, u, wdata, rb), np.bool_(False))
            acc = np.empty((ap.shape[1], GROUP), np.float32)
        M, nb, n = ap.shape[1], u[U_NB], u[U_N]
        out, stride = _out(w, u)
        o = f32s(out)
        codes, sc, mn = _arr(u[U_P], np.int8), _arr(u[U_P + 1], np.int8), _arr(u[U_P + 2], np.int8)
        dw, dmw = _arr(u[U_P + 3], np.float32), _arr(u[U_P + 4], np.float32)
        for g in range(u[U_G0], u[U_G1]):
            acc[:, :] = 0
            for b in range(nb):
                gb = g * nb + b
                for m0 in range(0, M, simd.MT):
                    so = b * M + m0
                    simd.tile_k(codes, gb * 256 * GROUP, sc, mn, gb * 16 * GROUP, dw, dmw, gb * GROUP, ap, so * 128,
                                bp, so * 8, da, so, acc, m0 * GROUP, min(simd.MT, M - m0), hm)
            if scaled:
                for m in range(M):
                    for r in range(GROUP):
                        acc[m, r] = acc[m, r] * factor
            _store(acc, o, stride, g, n, u[U_COL0])
        prev, k = k, _next(w, k)
    return 0


def mm_k6(row, frow, ith, nth, wdata):
    """The dot step of Q6_K and Q3_K (packed in 6 bits: ``dot_k._pack_k6``'s form and ``simd.tile_k6``,
    as ``dot_k._dot_k6`` runs it; P args: the activations' row bytes)."""
    w = words(row, ROW)
    units, count = i64s(w[M_UNITS]), w[M_COUNT]
    k = prev = _first(w)
    if k >= count:
        return 0
    rb = w[M_ARG]
    ap, _, da = _act_pairs_k(_act(w, units[k * UNIT:(k + 1) * UNIT], wdata, rb), np.bool_(True))
    acc = np.empty((ap.shape[1], GROUP), np.float32)
    while k < count:
        u = units[k * UNIT:(k + 1) * UNIT]
        if not _same(u, units[prev * UNIT:(prev + 1) * UNIT]):
            ap, _, da = _act_pairs_k(_act(w, u, wdata, rb), np.bool_(True))
            acc = np.empty((ap.shape[1], GROUP), np.float32)
        M, nb, n = ap.shape[1], u[U_NB], u[U_N]
        out, stride = _out(w, u)
        o = f32s(out)
        codes, hi = _arr(u[U_P], np.uint8), _arr(u[U_P + 1], np.uint16)
        sc, dw = _arr(u[U_P + 2], np.int8), _arr(u[U_P + 3], np.float32)
        for g in range(u[U_G0], u[U_G1]):
            acc[:, :] = 0
            for b in range(nb):
                gb = g * nb + b
                for m0 in range(0, M, simd.MT):
                    so = b * M + m0
                    simd.tile_k6(codes, gb * 128 * GROUP, hi, gb * 32 * GROUP, sc, gb * 16 * GROUP, dw, gb * GROUP,
                                 ap, so * 128, da, so, acc, m0 * GROUP, min(simd.MT, M - m0))
            _store(acc, o, stride, g, n, u[U_COL0])
        prev, k = k, _next(w, k)
    return 0


# -- llama.cpp's x86 orders -------------------------------------------------------------------------------
X_Q0, X_Q4_0, X_Q4_K, X_Q6_K, X_F32 = 0, 1, 2, 3, 4


def mm_x86(row, frow, ith, nth, wdata):
    """The dot step under llama.cpp's numerics (P args: the kernel, its sub-kind, the weights' row
    bytes; for F32 tiny and wide, for Q4_K the rows through its gemm): ``x86``'s kernels on the unit's
    weight rows (gathered where they are not packed) and activation rows."""
    w = words(row, ROW)
    units, count = i64s(w[M_UNITS]), w[M_COUNT]
    f16 = carray(voidptr(w[M_F16]), (65536,), np.float32)
    rb, which, sub, wrb = w[M_ARG], w[M_ARG + 1], w[M_ARG + 2], w[M_ARG + 3]
    a1, a2, a3 = w[SRC0 + NB + 1], w[SRC0 + NB + 2], w[SRC0 + NB + 3]
    ne00 = w[SRC0 + NE]
    k = _first(w)
    while k < count:
        u = units[k * UNIT:(k + 1) * UNIT]
        c0 = u[U_COL0] + u[U_G0] * GROUP
        c1 = min(u[U_COL0] + u[U_G1] * GROUP, u[U_COL0] + u[U_N])
        nrow, M = c1 - c0, u[U_R1] - u[U_R0]
        base = w[SRC0 + A] + u[U_M3] * a3 + u[U_M2] * a2 + c0 * a1
        tmp = np.empty((M, nrow), np.float32)
        if which == X_F32:
            wa = np.empty((nrow, ne00), np.float32)
            for r in range(nrow):
                s = f32s(base + r * a1)
                for i in range(ne00):
                    wa[r, i] = s[i]
            xa = np.empty((M, ne00), np.float32)
            ab = (w[M_ACT] + u[U_I13] * w[M_ANB3] + u[U_I12] * w[M_ANB2] + u[U_R0] * w[M_ANB1])
            for m in range(M):
                s = f32s(ab + m * w[M_ANB1])
                for i in range(ne00):
                    xa[m, i] = s[i]
            x86.dot_f32(wa, xa, tmp, sub & 1 != 0, sub & 2 != 0)
        else:
            if a1 == wrb:
                wq = carray(voidptr(base), (nrow, wrb), np.uint8)
            else:
                wq = np.empty((nrow, wrb), np.uint8)
                for r in range(nrow):
                    s = _arr(base + r * a1, np.uint8)
                    for i in range(wrb):
                        wq[r, i] = s[i]
            act = _act(w, u, wdata, rb)
            if which == X_Q0:
                x86.dot_q0(wq, sub, act, tmp, f16)
            elif which == X_Q4_0:
                x86.dot_q4_0(wq, act, tmp, f16)
            elif which == X_Q4_K:
                x86.dot_q4_k(wq, act, tmp, u[U_R0], sub, f16)
            else:
                x86.dot_q6_k(wq, act, tmp, sub != 0, f16)
        out, stride = _out(w, u)
        o = f32s(out)
        for m in range(M):
            for r in range(nrow):
                o[m * stride + c0 + r] = tmp[m, r]
        k = _next(w, k)
    return 0


# -- mm_f32 -------------------------------------------------------------------------------------------
def mm_f32(row, frow, ith, nth, wdata):
    """F32 weights times F32 activations under GGML's numerics (attention's K and V products), as
    ``ops.matmul._float_mul_mat`` computes them: the same tiles (P, P+1: TILE_FLOAT's activation rows
    and ``ops.matmul.float_cols``'s weight rows, 64: a K of a few hundred cells is shared out; the
    activation matrices that read one weight matrix, mul_mat's broadcast over ne2/ne3, form one run of
    rows), the participant's same contiguous share of them, each tile through
    ``dot_float``'s kernel (a's rows where they lie, transposed as it goes; b's gathered), so every
    output's bits are the Python path's, NaN payloads included. Rows are read at their nb; ne0 is
    packed and not empty (the op checks)."""
    w = words(row, ROW)
    rows, cols = w[P], w[P + 1]
    K, n = w[SRC0 + NE], w[SRC0 + NE + 1]
    ne02, ne03 = w[SRC0 + NE + 2], w[SRC0 + NE + 3]
    ne11, ne12, ne13 = w[SRC1 + NE + 1], w[SRC1 + NE + 2], w[SRC1 + NE + 3]
    r2, r3 = ne12 // ne02, ne13 // ne03
    a = carray(voidptr(w[SRC0 + A]), (_BIG,), np.uint32)
    b, d = f32s(w[SRC1 + A]), f32s(w[DST + A])
    f16 = carray(voidptr(w[P + 2]), (65536,), np.uint32)
    a1, a2, a3 = w[SRC0 + NB + 1] // 4, w[SRC0 + NB + 2] // 4, w[SRC0 + NB + 3] // 4
    b1, b2, b3 = w[SRC1 + NB + 1] // 4, w[SRC1 + NB + 2] // 4, w[SRC1 + NB + 3] // 4
    d1, d2, d3 = w[DST + NB + 1] // 4, w[DST + NB + 2] // 4, w[DST + NB + 3] // 4
    run = r3 * r2 * ne11
    tr, tc = (run + rows - 1) // rows, (n + cols - 1) // cols
    total = ne03 * ne02 * tr * tc
    t0, t1 = ith * total // nth, (ith + 1) * total // nth
    if t0 >= t1:
        return 0
    for t in range(t0, t1):
        c0 = (t % tc) * cols
        row0 = ((t // tc) % tr) * rows
        m2 = (t // (tc * tr)) % ne02
        m3 = t // (tc * tr * ne02)
        nr, nc = min(rows, run - row0), min(cols, n - c0)
        ao = m3 * a3 + m2 * a2
        xf = np.empty((nr, K), np.float32)
        out = np.empty((nr, nc), np.float32)
        for r in range(nr):
            u3, rem = divmod(row0 + r, r2 * ne11)
            u2, i11 = divmod(rem, ne11)
            xo = (m3 * r3 + u3) * b3 + (m2 * r2 + u2) * b2 + i11 * b1
            for k in range(K):
                xf[r, k] = b[xo + k]
        _dot_rows(read_only(a), ao + c0 * a1, a1, nc, f16, np.bool_(False), xf, out)     # a's rows where they lie
        for r in range(nr):
            u3, rem = divmod(row0 + r, r2 * ne11)
            u2, i11 = divmod(rem, ne11)
            do = (m3 * r3 + u3) * d3 + (m2 * r2 + u2) * d2 + i11 * d1
            for c in range(nc):
                d[do + c0 + c] = out[r, c]
    return 0


for _fn in (mm_convert, mm_q32, mm_k, mm_k6, mm_x86, mm_f32):
    register(_fn)
