"""llama.cpp's x86-64 numerics: the sums of mul_mat, soft_max and rope in the order llama.cpp's
x86-64 CPU build (AVX-512, llamafile's tinyBLAS and the CPU_REPACK kernels on) adds them.

ggtool's default kernels follow GGML's scalar reference code. This build sums the same products in
other orders, and for a model as sensitive as gemma-3 the last bits show in the logits (tenths,
docs/gemma.md). These kernels compute what it computes, so that the x86 numerics (`numerics="x86"`) reproduce its
logits bit for bit. Each says which x86 code it follows; the integer parts are exact as everywhere,
only the float32 steps (FMA, lanes, horizontal sums) are placed as the SIMD code places them:

- ``dot_q0``: Q8_0 / Q5_0 / Q4_0 x Q8_0 (tinyBLAS_Q0_AVX, and ``ggml_vec_dot_q8_0_q8_0`` / ``_q5_0_`` /
  ``_q4_0_`` for one row, which sum alike; Q4_0 where the build does not repack it): per block 8
  lanes of 4 integer products, ``fma(d_w * d_a, lane, acc)``, then ``hsum_float_8``.
- ``dot_q4_0``: Q4_0 x Q8_0 through the repacked q4_0_8x8 kernels (2-D weights of 8k rows; gemm and
  gemv add alike): per block the exact sum, ``fma(float(sum), d_w * d_a, acc)``.
- ``dot_q6_k``: below 8 activation rows the AVX2 ``ggml_vec_dot_q6_K_q8_K`` (8 lanes of unsigned codes
  times scales, the -32 through the bsums, ``fma(d_a * d_w, lane, acc)``); from 8 rows ggml-cpu's tiled
  kernel (per block the exact sum, ``fma(float(sum) * d_w, d_a, acc)``).
- ``dot_q4_k``: the repacked q4_K_8x8 kernels: activation rows in groups of 4 through the gemm (one FMA
  per pair of 32-value sub-blocks, for the scales and for the mins), the rest through the gemv (one
  FMA per block); the result ``acc - acc_min``.
- ``dot_f32``: F32 x F32, src1 not contiguous: ``ggml_vec_dot_f32`` (4 accumulators of 16 lanes over
  steps of 64, then ``x0+x2, x1+x3, x0+x1`` and ``_mm512_reduce_add_ps``); contiguous: tinyBLAS<16,
  __m512> (16 FMA lanes over k, then the reduce).
- ``silu_rows``: ``ggml_v_silu`` on 16-value (AVX2: 8) chunks of a row, the C library's expf for the
  rest (silu, and the silu of llama.cpp's fused swiglu).
- ``soft_max_rows``: ``ggml_v_expf`` (the AVX-512 polynomial) on 16-value chunks, each chunk's sum
  reduced in float and added in double (llama.cpp's KV cache is padded to 256 cells, so every value
  goes through the polynomial).
- ``rope_cache`` / ``rotate``: the C library's ``cosf`` / ``sinf``; ``x0*c - x1*s`` and ``x0*s + x1*c``
  contracted to FMAs as the compiler does.

``fmaf`` is LLVM's ``llvm.fma.f32``: one rounding, on any CPU.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from .dot_k import Q8_K_BYTES, _scale_min_k4
from .jit import njit, numba
from .tables import KVALUES_IQ4NL

F32, F64 = np.float32, np.float64
_I = np.int32


@numba.core.extending.intrinsic
def fmaf(typingctx, a, b, c):
    """a * b + c rounded once (float32)."""
    f32 = numba.types.float32
    if not all(t == f32 for t in (a, b, c)):
        return None

    def codegen(context, builder, signature, args):
        f = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f], ir.FunctionType(f, [f, f, f]))
        return builder.call(fn, args)
    return f32(f32, f32, f32), codegen


@njit
def fma(a, b, c):
    """a * b + c element-wise, rounded once (float32 arrays of one shape)."""
    out = np.empty(a.shape, F32)
    fa, fb, fc, fo = a.reshape(-1), b.reshape(-1), c.reshape(-1), out.reshape(-1)
    for i in range(fo.shape[0]):
        fo[i] = fmaf(fa[i], fb[i], fc[i])
    return out


@njit
def hsum_float_8(c):
    """hsum_float_8: (l + 4) pairs, then (0 + 2) + (1 + 3)."""
    v0, v1, v2, v3 = c[4] + c[0], c[5] + c[1], c[6] + c[2], c[7] + c[3]
    return (v0 + v2) + (v1 + v3)


@njit
def _reduce16(c):
    """_mm512_reduce_add_ps: halves folded 8, 4, 2, 1."""
    t = np.empty(8, F32)
    for i in range(8):
        t[i] = c[i + 8] + c[i]
    for i in range(4):
        t[i] = t[i + 4] + t[i]
    return (t[2] + t[0]) + (t[3] + t[1])


@njit
def _f16(w, o, f16):
    return f16[np.int64(w[o]) | (np.int64(w[o + 1]) << 8)]


# -- activations ---------------------------------------------------------------------------------
@njit
def _act_q8_0(act, f16):
    """Q8_0 rows: d (M, nb) and the codes (M, nb * 32), as float32 (exact)."""
    M, nb = act.shape[0], act.shape[1] // 34
    d = np.empty((M, nb), F32)
    q = np.empty((M, nb * 32), F32)
    s = act.view(np.int8)
    for m in range(M):
        for b in range(nb):
            d[m, b] = _f16(act[m], 34 * b, f16)
            for k in range(32):
                q[m, 32 * b + k] = s[m, 34 * b + 2 + k]
    return d, q


@njit
def _act_q8_k(act):
    """Q8_K rows: d (M, nb), the codes (M, nb * 256) as float32 (exact), the bsums (M, nb * 16)."""
    M, nb = act.shape[0], act.shape[1] // Q8_K_BYTES
    d = np.empty((M, nb), F32)
    q = np.empty((M, nb * 256), F32)
    bs = np.empty((M, nb * 16), _I)
    s = act.view(np.int8)
    for m in range(M):
        for b in range(nb):
            o = b * Q8_K_BYTES
            d[m, b] = act[m, o:o + 4].copy().view(F32)[0]
            for k in range(256):
                q[m, 256 * b + k] = s[m, o + 4 + k]
            for j in range(16):
                x = o + 260 + 2 * j
                bs[m, 16 * b + j] = np.int16(np.int32(act[m, x]) | (np.int32(act[m, x + 1]) << 8))
    return d, q, bs


# -- Q8_0 and Q5_0 ---------------------------------------------------------------------------------
# Weights are decoded V rows at a time into columns (code k of the V rows side by side), and every
# inner loop runs across those rows, in float32 vectors. The integer sums are exact in the floats
# they are held in (bounds below); only the steps the x86 code takes in float32 round.
V0 = 64   # Q8_0 / Q5_0 rows side by side
VK = 32   # K-quant rows side by side (their blocks are longer)


# the block types dot_q0 takes: bytes per block
Q8_0_KIND, Q5_0_KIND, Q4_0_KIND, IQ4_NL_KIND = 0, 1, 2, 3
_Q0_BYTES = (34, 22, 18, 18)


@njit
def _decode_q0(w, n0, kind, nb, wq, wd, f16):
    """Rows n0 .. n0+V0 of Q8_0, Q5_0, Q4_0 or IQ4_NL (`kind`): codes (IQ4_NL: its levels) wq
    (nb * 32, V0) and d (nb, V0), as float32; rows past the end are zero."""
    nbytes = _Q0_BYTES[kind]
    wq[:, :] = 0
    wd[:, :] = 0
    s8 = w.view(np.int8)
    for r in range(min(V0, w.shape[0] - n0)):
        n = n0 + r
        for b in range(nb):
            o = b * nbytes
            wd[b, r] = _f16(w[n], o, f16)
            if kind == Q5_0_KIND:
                qh = (np.uint32(w[n, o + 2]) | (np.uint32(w[n, o + 3]) << 8) | (np.uint32(w[n, o + 4]) << 16)
                      | (np.uint32(w[n, o + 5]) << 24))
                for j in range(16):
                    x = np.int32(w[n, o + 6 + j])
                    wq[32 * b + j, r] = ((x & 15) | np.int32(((qh >> j) & 1) << 4)) - 16
                    wq[32 * b + 16 + j, r] = ((x >> 4) | np.int32(((qh >> (j + 16)) & 1) << 4)) - 16
            elif kind == Q4_0_KIND:
                for j in range(16):
                    x = np.int32(w[n, o + 2 + j])
                    wq[32 * b + j, r] = (x & 15) - 8
                    wq[32 * b + 16 + j, r] = (x >> 4) - 8
            elif kind == IQ4_NL_KIND:
                for j in range(16):
                    x = np.int32(w[n, o + 2 + j])
                    wq[32 * b + j, r] = KVALUES_IQ4NL[x & 15]
                    wq[32 * b + 16 + j, r] = KVALUES_IQ4NL[x >> 4]
            else:
                for k in range(32):
                    wq[32 * b + k, r] = s8[n, o + 2 + k]


@njit
def dot_q0(w, kind, act, out, f16):
    """out (M, N) = w (N rows of Q8_0, Q5_0, Q4_0 or IQ4_NL: `kind`) . act (M rows of Q8_0). A lane's
    four products and their sum stay below 2**16: exact in float32."""
    N, M = w.shape[0], act.shape[0]
    nb = w.shape[1] // _Q0_BYTES[kind]
    ad, af = _act_q8_0(act, f16)
    wq = np.empty((nb * 32, V0), F32)
    wd = np.empty((nb, V0), F32)
    c = np.empty((8, V0), F32)
    db = np.empty(V0, F32)
    for n0 in range(0, N, V0):
        _decode_q0(w, n0, kind, nb, wq, wd, f16)
        for m in range(M):
            c[:, :] = 0
            for b in range(nb):
                dm, wdb = ad[m, b], wd[b]
                for r in range(V0):
                    db[r] = wdb[r] * dm
                for lane in range(8):
                    k = 32 * b + 4 * lane
                    a0, a1, a2, a3 = af[m, k], af[m, k + 1], af[m, k + 2], af[m, k + 3]
                    w0, w1, w2, w3, cl = wq[k], wq[k + 1], wq[k + 2], wq[k + 3], c[lane]
                    for r in range(V0):
                        cl[r] = fmaf(db[r], w0[r] * a0 + w1[r] * a1 + w2[r] * a2 + w3[r] * a3, cl[r])
            for r in range(min(V0, N - n0)):
                out[m, n0 + r] = hsum_float_8(c[:, r])


@njit
def dot_q4_0(w, act, out, f16):
    """out (M, N) = w (N rows of Q4_0) . act (M rows of Q8_0) as the repacked q4_0_8x8 gemm/gemv:
    per block one FMA of the exact block sum (32 products below 2**10: below 2**15) and d_w * d_a."""
    dot_b32_repacked(w, Q4_0_KIND, act, out, f16)


@njit
def dot_b32_repacked(w, kind, act, out, f16):
    """dot_q4_0 for Q4_0 or IQ4_NL (`kind`): q4_0_8x8 and iq4_nl_8x8 are one template (its block sums
    below 2**19 for IQ4_NL's levels: exact)."""
    N, M = w.shape[0], act.shape[0]
    nb = w.shape[1] // 18
    ad, af = _act_q8_0(act, f16)
    wq = np.empty((nb * 32, V0), F32)
    wd = np.empty((nb, V0), F32)
    acc = np.empty(V0, F32)
    isum = np.empty(V0, F32)
    for n0 in range(0, N, V0):
        _decode_q0(w, n0, kind, nb, wq, wd, f16)
        for m in range(M):
            acc[:] = 0
            for b in range(nb):
                isum[:] = 0
                for k in range(32 * b, 32 * b + 32, 4):
                    _madd4(isum, wq, af, m, k)
                dm, wdb = ad[m, b], wd[b]
                for r in range(V0):
                    acc[r] = fmaf(isum[r], wdb[r] * dm, acc[r])
            for r in range(min(V0, N - n0)):
                out[m, n0 + r] = acc[r]


# -- K-quants ----------------------------------------------------------------------------------------
@njit
def _madd4(acc, q, af, m, k):
    """acc[r] += q[k..k+3, r] . af[m, k..k+3] (exact integer values)."""
    a0, a1, a2, a3 = af[m, k], af[m, k + 1], af[m, k + 2], af[m, k + 3]
    q0, q1, q2, q3 = q[k], q[k + 1], q[k + 2], q[k + 3]
    for r in range(acc.shape[0]):
        acc[r] += q0[r] * a0 + q1[r] * a1 + q2[r] * a2 + q3[r] * a3


@njit
def _decode_q4_k(w, n0, nb, q, sc, mn, wd, wm, f16):
    """Rows n0 .. n0+VK of Q4_K: codes 0..15 (nb * 256, VK), 6-bit scales and mins (nb * 8, VK), d
    and dmin (nb, VK), as float32; rows past the end are zero."""
    for a in (q, sc, mn, wd, wm):
        a[:, :] = 0
    for r in range(min(VK, w.shape[0] - n0)):
        n = n0 + r
        for b in range(nb):
            o = b * 144
            wd[b, r] = _f16(w[n], o, f16)
            wm[b, r] = _f16(w[n], o + 2, f16)
            for j in range(4):
                for k in range(32):
                    x = np.int32(w[n, o + 16 + 32 * j + k])
                    q[256 * b + 64 * j + k, r] = x & 15
                    q[256 * b + 64 * j + 32 + k, r] = x >> 4
            for j in range(8):
                sc[8 * b + j, r], mn[8 * b + j, r] = _scale_min_k4(w[n], o + 4, j)


@njit
def dot_q4_k(w, act, out, m_first, m_gemm, f16):
    """out (M, N) = w (N rows of Q4_K) . act (M rows of Q8_K). Activation row m is row m_first + m
    of its matrix; rows below m_gemm (a multiple of 4) go through the gemm's order. Bounds: a
    sub-block's scaled sum < 2**22, a pair's < 2**23 (float32 exact); a block's is summed in float64."""
    N, M, nb = w.shape[0], act.shape[0], w.shape[1] // 144
    ad, af, bs = _act_q8_k(act)
    q = np.empty((nb * 256, VK), F32)
    sc = np.empty((nb * 8, VK), F32)
    mn = np.empty((nb * 8, VK), F32)
    wd = np.empty((nb, VK), F32)
    wm = np.empty((nb, VK), F32)
    isub = np.empty((8, VK), F32)
    msub = np.empty((8, VK), F32)
    acc = np.empty(VK, F32)
    accm = np.empty(VK, F32)
    for n0 in range(0, N, VK):
        _decode_q4_k(w, n0, nb, q, sc, mn, wd, wm, f16)
        for m in range(M):
            acc[:] = 0
            accm[:] = 0
            gemm = m_first + m < m_gemm
            for b in range(nb):
                for j in range(8):
                    dot = isub[j]
                    dot[:] = 0
                    for k in range(256 * b + 32 * j, 256 * b + 32 * j + 32, 4):
                        _madd4(dot, q, af, m, k)
                    scj, mnj, ms = sc[8 * b + j], mn[8 * b + j], msub[j]
                    bsj = F32(bs[m, 16 * b + 2 * j] + bs[m, 16 * b + 2 * j + 1])
                    for r in range(VK):
                        dot[r] = dot[r] * scj[r]
                        ms[r] = mnj[r] * bsj
                dm, wdb, wmb = ad[m, b], wd[b], wm[b]
                for r in range(VK):
                    da, dmin = wdb[r] * dm, wmb[r] * dm
                    if gemm:
                        for p in range(4):
                            acc[r] = fmaf(isub[2 * p, r] + isub[2 * p + 1, r], da, acc[r])
                            accm[r] = fmaf(msub[2 * p, r] + msub[2 * p + 1, r], dmin, accm[r])
                    else:
                        si, sm = 0.0, 0.0
                        for j in range(8):
                            si += F64(isub[j, r])
                            sm += F64(msub[j, r])
                        acc[r] = fmaf(F32(si), da, acc[r])
                        accm[r] = fmaf(F32(sm), dmin, accm[r])
            for r in range(min(VK, N - n0)):
                out[m, n0 + r] = acc[r] - accm[r]


@njit
def _decode_q6_k(w, n0, nb, q, sc, wd, f16):
    """Rows n0 .. n0+VK of Q6_K: codes 0..63 (nb * 256, VK), int8 scales (nb * 16, VK), d (nb, VK),
    as float32; rows past the end are zero."""
    for a in (q, sc, wd):
        a[:, :] = 0
    for r in range(min(VK, w.shape[0] - n0)):
        n = n0 + r
        for b in range(nb):
            o = b * 210
            for h in range(2):
                for k in range(32):
                    l0, l1 = np.int32(w[n, o + 64 * h + k]), np.int32(w[n, o + 64 * h + 32 + k])
                    hh = np.int32(w[n, o + 128 + 32 * h + k])
                    base = 256 * b + 128 * h + k
                    q[base, r] = (l0 & 15) | ((hh & 3) << 4)
                    q[base + 32, r] = (l1 & 15) | (((hh >> 2) & 3) << 4)
                    q[base + 64, r] = (l0 >> 4) | (((hh >> 4) & 3) << 4)
                    q[base + 96, r] = (l1 >> 4) | (((hh >> 6) & 3) << 4)
            for j in range(16):
                sc[16 * b + j, r] = np.int8(w[n, o + 192 + j])
            wd[b, r] = _f16(w[n], o + 208, f16)


@njit
def dot_q6_k(w, act, out, tiled, f16):
    """out (M, N) = w (N rows of Q6_K) . act (M rows of Q8_K); `tiled` from 8 activation rows.
    Bounds: 16 products (tiled) or 4 (AVX2 lanes) times a scale stay below 2**24, float32 exact;
    longer sums are float64."""
    N, M, nb = w.shape[0], act.shape[0], w.shape[1] // 210
    ad, af, bs = _act_q8_k(act)
    q = np.empty((nb * 256, VK), F32)
    sc = np.empty((nb * 16, VK), F32)
    wd = np.empty((nb, VK), F32)
    part = np.empty(VK, F32)
    tot = np.empty(VK, F64)
    c = np.empty((8, VK), F32)
    for n0 in range(0, N, VK):
        _decode_q6_k(w, n0, nb, q, sc, wd, f16)
        for m in range(M):
            c[:, :] = 0
            for b in range(nb):
                dm, wdb = ad[m, b], wd[b]
                if tiled:       # per block: sum(sc * (q - 32) * a) exactly, then float(sum) * d_w
                    tot[:] = 0
                    for j in range(16):
                        part[:] = 0
                        sa = F32(0)
                        for k in range(256 * b + 16 * j, 256 * b + 16 * j + 16, 4):
                            _madd4(part, q, af, m, k)
                            sa += af[m, k] + af[m, k + 1] + af[m, k + 2] + af[m, k + 3]
                        scj = sc[16 * b + j]
                        for r in range(VK):   # sum (q - 32) a = sum q a - 32 sum a
                            tot[r] += F64((part[r] - F32(32) * sa) * scj[r])
                    c0 = c[0]
                    for r in range(VK):
                        c0[r] = fmaf(F32(tot[r]) * wdb[r], dm, c0[r])
                    continue
                for lane in range(8):   # bytes 4 lane .. 4 lane + 3 of each 32 values; -32 by bsums
                    tot[:] = 0
                    for g in range(8):
                        part[:] = 0
                        _madd4(part, q, af, m, 256 * b + 32 * g + 4 * lane)
                        scg = sc[16 * b + 2 * g + lane // 4]
                        for r in range(VK):
                            tot[r] += F64(part[r] * scg[r])
                    j = 16 * b + 2 * lane
                    b0, b1 = F64(bs[m, j]), F64(bs[m, j + 1])
                    s0, s1, cl = sc[j], sc[j + 1], c[lane]
                    for r in range(VK):
                        v = tot[r] - 32.0 * (b0 * F64(s0[r]) + b1 * F64(s1[r]))
                        cl[r] = fmaf(F32(dm * wdb[r]), F32(v), cl[r])
            for r in range(min(VK, N - n0)):
                out[m, n0 + r] = c[0, r] if tiled else hsum_float_8(c[:, r])


# -- F32 ---------------------------------------------------------------------------------------------
@njit
def _fold(acc, lanes, out_row, n0, count):
    """The per-row sums of acc (lanes, V0) into out_row[n0:n0+count]. AVX-512 (lanes 64 or 16):
    ggml_vec_dot_f32's x0+x2, x1+x3 over 4 x 16 lanes (64), then _mm512_reduce_add_ps's halves.
    AVX2 (lanes 32 or 8): the same over 4 x 8 lanes (32), then GGML_F32x8_REDUCE's low + high
    half and two hadds (lanes 32), or tinyBLAS's hsum, which is hsum_float_8 (lanes 8)."""
    width = 16 if lanes in (16, 64) else 8
    t = np.empty((16, V0), F32)
    for i in range(width):
        ti = t[i]
        if lanes > width:
            a0, a1, a2, a3 = acc[i], acc[width + i], acc[2 * width + i], acc[3 * width + i]
            for r in range(V0):
                ti[r] = (a0[r] + a2[r]) + (a1[r] + a3[r])
        else:
            ai = acc[i]
            for r in range(V0):
                ti[r] = ai[r]
    if width == 16:
        for h in (8, 4, 2, 1):
            for i in range(h):
                ti, tj = t[i], t[i + h]
                for r in range(V0):
                    ti[r] = tj[r] + ti[r]
        for r in range(count):
            out_row[n0 + r] = t[0, r]
        return
    for r in range(count):
        c = t[:, r]
        if lanes == 32:     # (l + h) per 4, then hadd, hadd: (0 + 1) + (2 + 3)
            s0, s1, s2, s3 = c[0] + c[4], c[1] + c[5], c[2] + c[6], c[3] + c[7]
            out_row[n0 + r] = (s0 + s1) + (s2 + s3)
        else:
            out_row[n0 + r] = hsum_float_8(c)


@njit
def dot_f32(a, b, out, tiny, wide):
    """out (M, N) = b (M, K) . a (N, K)^T: tinyBLAS's lanes if `tiny` (16, or 8 unless `wide`, over
    all of k), else ggml_vec_dot_f32's (64 over steps of 64, or 32 over steps of 32; the tail added
    after the reduce, its last K % 8 (AVX2: K % 4) products by FMA, the others each rounded). V0 rows of a at a time, transposed, so that every loop runs across them."""
    N, M, K = a.shape[0], b.shape[0], a.shape[1]
    if tiny:
        lanes = 16 if wide else 8
    else:
        lanes = 64 if wide else 32
    k_lanes = K if tiny else K - K % lanes
    at = np.empty((K, V0), F32)
    acc = np.empty((lanes, V0), F32)
    for n0 in range(0, N, V0):
        count = min(V0, N - n0)
        at[:, :] = 0
        for r in range(count):
            for k in range(K):
                at[k, r] = a[n0 + r, k]
        for m in range(M):
            acc[:, :] = 0
            bm = b[m]
            for k in range(k_lanes):
                al, ak, bk = acc[k % lanes], at[k], bm[k]
                for r in range(V0):
                    al[r] = fmaf(ak[r], bk, al[r])
            _fold(acc, lanes, out[m], n0, count)
            # vec_dot's tail, after the reduce, as GCC compiled `sumf += x[i]*y[i]`: vectorized in order
            # (each product rounded, then added) over 8 (AVX2: 4) values at a time, the rest contracted
            k_fma = K - (K - k_lanes) % (8 if wide else 4)
            for k in range(k_lanes, K):
                ak, bk = at[k], bm[k]
                for r in range(count):
                    if k < k_fma:
                        out[m, n0 + r] = out[m, n0 + r] + ak[r] * bk
                    else:
                        out[m, n0 + r] = fmaf(ak[r], bk, out[m, n0 + r])


# -- soft_max and rope -------------------------------------------------------------------------------
EXPF = np.array([float.fromhex(h) for h in ("0x1.8p23", "0x1.715476p+0", "0x1.62e4p-1", "0x1.7f7d1cp-20",
                                          "0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2",
                                          "0x1.ffffecp-1")], F32)


@njit
def _v_expf(x, e):
    r = e[0]
    z = fmaf(x, e[1], r)
    n = z - r
    b = fmaf(-n, e[3], fmaf(-n, e[2], x))
    u = b * b
    j = fmaf(fmaf(fmaf(e[4], b, e[5]), u, fmaf(e[6], b, e[7])), u, fmaf(e[8], b, F32(1.0)))
    if abs(n) > 192:
        return F32(0.0) if n <= 0 else F32(np.inf)
    return F32(F64(j) * 2.0 ** F64(n))


@njit
def _v_expf_avx2(x, e):
    """The AVX2 ggml_v_expf, one lane: another polynomial tail (c8 * b, then j*2^n + 2^n with 2^n
    made from z's bits), and for 126 < |n| <= 192 the result scaled in two steps."""
    r = e[0]
    z = fmaf(x, e[1], r)
    n = z - r
    b = fmaf(-n, e[3], fmaf(-n, e[2], x))
    u = b * b
    j = fmaf(fmaf(fmaf(e[4], b, e[5]), u, fmaf(e[6], b, e[7])), u, e[8] * b)
    an = abs(n)
    if an > 192:
        return F32(0.0) if n <= 0 else F32(np.inf)
    if an > 126:            # s1 = 2^127 or 2^-125, s2 = 2^n / s1: (s2 + s2 j) s1
        s1 = F32(2.0 ** 127) if n > 0 else F32(2.0 ** -125)
        s2 = F32(2.0 ** (F64(n) - 127.0)) if n > 0 else F32(2.0 ** (F64(n) + 125.0))
        return fmaf(s2, j, s2) * s1
    k = F32(2.0 ** F64(n))
    return fmaf(j, k, k)


@njit
def soft_max_rows(w, y, e, wide):
    """y[r] = softmax of w[r] (already scaled and masked), as ggml_vec_soft_max_f32: on AVX-512
    (`wide`) ggml_v_expf on 16-value chunks, each chunk's sum reduced by _mm512_reduce_add_ps; on
    AVX2 its AVX2 form on 8-value chunks, reduced as hsum_float_8; chunk sums added in double. e is
    ``EXPF``, the polynomial's constants."""
    R, n = w.shape
    width = 16 if wide else 8
    chunk = np.empty(width, F32)
    for r in range(R):
        mx = F32(-np.inf)
        for i in range(n):
            mx = max(mx, w[r, i])
        total = 0.0
        for i0 in range(0, n, width):
            chunk[:] = 0
            for i in range(i0, min(n, i0 + width)):
                v = _v_expf(w[r, i] - mx, e) if wide else _v_expf_avx2(w[r, i] - mx, e)
                y[r, i] = chunk[i - i0] = v
            total += F64(_reduce16(chunk) if wide else hsum_float_8(chunk))
        inv = F32(1.0 / total)
        for i in range(n):
            y[r, i] = y[r, i] * inv


@njit
def silu_rows(x, y, e, wide):
    """y = silu(x) row by row as ggml_vec_silu_f32 / ggml_vec_swiglu_f32's silu: ggml_v_silu
    (``x / (1 + ggml_v_expf(0 - x))``, the AVX-512 or AVX2 expf) on 16-value (AVX2: 8-value) chunks
    from the row's start, the rest ``x / (1 + expf(-x))`` with the C library's expf. e is ``EXPF``."""
    R, n = x.shape
    width = 16 if wide else 8
    for r in range(R):
        nv = n - n % width
        for i in range(n):
            v = x[r, i]
            if i < nv:
                ex = _v_expf(F32(0) - v, e) if wide else _v_expf_avx2(F32(0) - v, e)
            else:
                ex = np.exp(-v)
            y[r, i] = v / (F32(1) + ex)


@njit
def rope_cache(pos, half, theta_scale, freq_scale, attn_factor):
    """cos and sin (len(pos), half) as ggml_rope_cache_init: theta *= theta_scale in float32, the C
    library's cosf/sinf."""
    c = np.empty((pos.shape[0], half), F32)
    s = np.empty((pos.shape[0], half), F32)
    for r in range(pos.shape[0]):
        th = F32(pos[r])
        for i in range(half):
            t = freq_scale * th
            c[r, i] = F32(np.cos(t)) * attn_factor
            s[r, i] = F32(np.sin(t)) * attn_factor
            th = th * theta_scale
    return c, s


@njit
def rotate(x0, x1, c, s, y0, y1):
    """y0 = x0*c - x1*s, y1 = x0*s + x1*c, each contracted to one FMA (rows x pairs)."""
    for r in range(x0.shape[0]):
        for i in range(x0.shape[1]):
            y0[r, i] = fmaf(x0[r, i], c[r, i], -(x1[r, i] * s[r, i]))
            y1[r, i] = fmaf(x0[r, i], s[r, i], x1[r, i] * c[r, i])
