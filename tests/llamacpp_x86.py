"""llama.cpp's x86 CPU numerics (llama-cpp-python 0.3.36, AVX-512 or AVX2, REPACK and LLAMAFILE on),
written out in numpy: a test oracle, never used by ggtool itself.

`tests/golden/llama/gemma3-270m-top64.npz` was computed by that build. ggtool's default kernels
follow GGML's scalar reference; llama.cpp's x86 build sums in other orders, and gemma's 8-bit
activations make a last-bit difference show now and then (docs/gemma.md, "How close"). Patched into
ggtool in place of its kernels, these functions made `ggtool/programs/gemma3.gg` reproduce llama.cpp's
logits bit for bit; they are now the oracle of ggtool's compiled `numerics="x86"` kernels
(ggtool.kernels.x86, tests/test_kernels_x86.py). What each function follows:

- F32 mul_mat, src1 not contiguous (KQ): `ggml_vec_dot_f32`, AVX-512: 4 accumulators of 16 lanes
  over steps of 64, FMA, then `x0+x2, x1+x3, x0+x1` and `_mm512_reduce_add_ps`.
- F32 mul_mat, src1 contiguous (KQV): llamafile's tinyBLAS<16, __m512>: per output 16 FMA lanes
  over K (llama.cpp's KV cache is padded to 256 cells: zero cells add nothing), then the reduce.
- Q8_0, Q5_0 (and unpacked Q4_0) weights: llamafile's tinyBLAS_Q0_AVX (and for one row the vec_dot,
  which sums alike): per block, 8 lanes of 4
  integer products, `fma(dw*da, lane, acc)`, then hsum (`(l+4), (l+2), (l+1)` pairs).
- Q4_0 repacked (q4_0_8x8: 2-D weights of 8k rows, a tied output projection included; gemm and
  gemv alike): per block the exact integer sum, `acc = fma(float(isum), dw*da, acc)`. Q4_0 not
  repacked: as Q8_0 below.
- Q6_K: below 8 rows the AVX2 `ggml_vec_dot_q6_K_q8_K` (8 lanes, the -32 through bsums); from 8
  rows ggml-cpu's tiled kernel: per 256-block `acc = fma(float(isum) * dw, da, acc)`.
- Q4_K (repacked q4_K_8x8): rows in groups of 4 through the gemm (one FMA per pair of 32-value
  sub-blocks, for the scales and for the mins), the rest through the gemv (one FMA per block);
  result `acc - acc_min`.
- soft_max: `ggml_v_expf` (AVX-512 polynomial) on 16-lane chunks over 256 cells, chunk sums
  reduced in float, added in double.
- rope: the cache from the C library's cosf/sinf; `x0*c - x1*s` and `x0*s + x1*c` contracted by the
  compiler to `fms(x0, c, x1*s)` and `fma(x0, s, x1*c)`.
- gelu's fp16 table: `S*x*(1 + A*x*x)` with `1 + (A*x)*x` contracted to an FMA.

The AVX2 build (`numerics="llama.cpp-avx2"`; `wide=False` below) differs only where the F32 lanes
are: `ggml_vec_dot_f32` with 4 accumulators of 8 lanes over steps of 32, then `x0+x2, x1+x3,
x0+x1`, the low plus the high half and two hadds (`(0+1) + (2+3)`); tinyBLAS<8, __m256> (8 lanes,
then hsum_float_8's order); soft_max with the AVX2 `ggml_v_expf` (`c8*b` instead of an FMA with 1,
`j*k + k` with k = 2^n, the two-step scaling for 126 < |n| <= 192) on 8-value chunks reduced as
hsum_float_8. Its quantized kernels (tinyBLAS_Q0_AVX, the vec_dots, the repacked q4_0_8x8 and
q4_K_8x8 gemm/gemv, the tiled K-quant kernel) sum each output alike in both builds, and so do rope
and gelu.

FMA is emulated as float32(float64(a)*float64(b) + float64(c)) (the product is exact; the double
rounding this leaves is too rare to matter here).
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

from ggtool.quant import quantize_q8_0_cpu, quantize_q8_k

f32, f64 = np.float32, np.float64
H = float.fromhex


def fma(a, b, c):
    return (np.asarray(a, f64) * np.asarray(b, f64) + np.asarray(c, f64)).astype(f32)

def reduce16(v):  # v (..., 16) float32 -> (...) _mm512_reduce_add_ps
    t = (v[..., 8:] + v[..., :8]).astype(f32)
    t = (t[..., 4:] + t[..., :4]).astype(f32)
    t = (t[..., 2:] + t[..., :2]).astype(f32)
    return (t[..., 0] + t[..., 1]).astype(f32)

def reduce8_hadd(v):  # v (..., 8) -> (...): GGML_F32x8_REDUCE's tail (low + high, hadd, hadd)
    t = (v[..., :4] + v[..., 4:]).astype(f32)
    return ((t[..., 0] + t[..., 1]).astype(f32) + (t[..., 2] + t[..., 3]).astype(f32)).astype(f32)

def vec_dot_f32(x, y, wide=True):
    """x (M, n), y (N, n) -> (N, M): ggml_vec_dot_f32, AVX512 (STEP 64: 4 accumulators of 16) or
    AVX2 (STEP 32: 4 of 8)."""
    n = x.shape[-1]
    epr = 16 if wide else 8
    step = 4 * epr
    np_ = n - n % step
    M, N = x.shape[0], y.shape[0]
    acc = np.zeros((N, M, 4, epr), f32)
    for i in range(0, np_, step):
        xs = x[:, i:i+step].reshape(M, 4, epr)
        ys = y[:, i:i+step].reshape(N, 4, epr)
        acc = fma(xs[None], ys[:, None], acc)
    a = acc
    a01 = (a[:, :, 0] + a[:, :, 2]).astype(f32)
    a11 = (a[:, :, 1] + a[:, :, 3]).astype(f32)
    s = (reduce16 if wide else reduce8_hadd)((a01 + a11).astype(f32))
    # the tail, as GCC compiled `sumf += x[i]*y[i]`: vectorized over 8 (AVX2: 4) values at a time, in
    # order, each product rounded then added; the last n % 8 (4) contracted to FMAs
    n_fma = n - (n - np_) % (8 if wide else 4)
    for i in range(np_, n):
        if i < n_fma:
            s = (s + (x[None, :, i] * y[:, None, i]).astype(f32)).astype(f32)
        else:
            s = fma(x[None, :, i], y[:, None, i], s)
    return s

def sgemm_f32(A, B, wide=True):
    """A (M, k), B (N, k) -> (N, M): tinyBLAS AVX512 (16 lanes of fma over l, then
    _mm512_reduce_add_ps) or AVX2 (8 lanes, then hsum_float_8). k padded with zeros."""
    kn = 16 if wide else 8
    k = A.shape[-1]
    kp = (k + kn - 1) // kn * kn
    if kp != k:
        A = np.concatenate([A, np.zeros((A.shape[0], kp - k), f32)], 1)
        B = np.concatenate([B, np.zeros((B.shape[0], kp - k), f32)], 1)
    M, N = A.shape[0], B.shape[0]
    acc = np.zeros((N, M, kn), f32)
    for k0 in range(0, kp, kn):
        acc = fma(A[None, :, k0:k0 + kn], B[:, None, k0:k0 + kn], acc)
    return reduce16(acc) if wide else h8(acc)

C = [H(s) for s in ('0x1.8p23', '0x1.715476p+0', '0x1.62e4p-1', '0x1.7f7d1cp-20', '0x1.0e4020p-7',
                     '0x1.573e2ep-5', '0x1.555e66p-3', '0x1.fffdb6p-2', '0x1.ffffecp-1')]
def v_expf(x):
    x = np.asarray(x, f32)
    with np.errstate(all='ignore'):
        r = f32(C[0])
        z = fma(x, C[1], r)
        n = (z - r).astype(f32)
        b = fma(-n, C[3], fma(-n, C[2], x))
        d = np.abs(n) > 192
        u = (b * b).astype(f32)
        j = fma(fma(fma(C[4], b, C[5]), u, fma(C[6], b, C[7])), u, fma(C[8], b, f32(1.0)))
        res = np.ldexp(j.astype(f64), np.where(d, 0, n).astype(np.int64)).astype(f32)
        alt = np.where(n <= 0, f32(0), f32(np.inf))
        return np.where(d, alt, res).astype(f32)

def v_expf_avx2(x):
    """The AVX2 ggml_v_expf, lane by lane."""
    x = np.asarray(x, f32)
    with np.errstate(all='ignore'):
        r = f32(C[0])
        z = fma(x, C[1], r)
        n = (z - r).astype(f32)
        b = fma(-n, C[3], fma(-n, C[2], x))
        u = (b * b).astype(f32)
        j = fma(fma(fma(C[4], b, C[5]), u, fma(C[6], b, C[7])), u, (f32(C[8]) * b).astype(f32))
        nn = np.where(np.isfinite(n), n, 0).astype(np.int64)
        k = np.ldexp(f32(1), np.clip(nn, -126, 127)).astype(f32)
        plain = fma(j, k, k)
        s1 = np.where(n > 0, f32(2.0 ** 127), f32(2.0 ** -125))
        s2 = np.ldexp(f32(1), np.clip(np.where(n > 0, nn - 127, nn + 125), -126, 127)).astype(f32)
        scaled = (fma(s2, j, s2) * s1).astype(f32)
        big = np.where(n <= 0, f32(0), f32(np.inf))
        an = np.abs(n)
        return np.where(an > 192, big, np.where(an > 126, scaled, plain)).astype(f32)

def soft_max_rows(w, n_kv=256, wide=True):
    """softmax of rows w (R, n), already scaled and masked, over llama.cpp's KV cache of n_kv cells
    (the cells past n hold -inf): ggml_vec_soft_max_f32's AVX-512 loop (16-value chunks) or AVX2
    loop (8), sums in double."""
    R, n = w.shape
    width = 16 if wide else 8
    npad = max(n_kv, (n + width - 1) // width * width)
    wp = np.full((R, npad), -np.inf, f32)
    wp[:, :n] = w
    mx = wp.max(axis=1)
    with np.errstate(all="ignore"):
        e = (v_expf if wide else v_expf_avx2)((wp - mx[:, None]).astype(f32))
        chunks = (reduce16(e.reshape(R, -1, 16)) if wide else h8(e.reshape(R, -1, 8))).astype(f64)
    s = np.zeros(R, f64)
    for c in range(chunks.shape[1]):
        s += chunks[:, c]
    inv = (1.0 / s).astype(f32)
    return (e[:, :n] * inv[:, None]).astype(f32)

# -- quantized products ----
def h8(C):  # hsum of 8 lanes (..., 8)
    v = (C[..., 4:] + C[..., :4]).astype(f32)
    x0 = (v[..., 0] + v[..., 2]).astype(f32)
    x1 = (v[..., 1] + v[..., 3]).astype(f32)
    return (x0 + x1).astype(f32)
def fp16(b):  # uint8 (..., 2) -> f32
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(f32)

def dec_q8_0(w):  # (N, nb*34) -> d (N, nb), q (N, nb, 32)
    w = w.reshape(w.shape[0], -1, 34)
    return fp16(w[..., 0:2]), w[..., 2:34].view(np.int8).astype(np.int32)
def dec_q5_0(w):
    w = w.reshape(w.shape[0], -1, 22)
    d = fp16(w[..., 0:2])
    qh = np.ascontiguousarray(w[..., 2:6]).view(np.uint32)[..., 0]
    qs = w[..., 6:22].astype(np.int32)
    j = np.arange(16)
    lo = (qs & 15) | (((qh[..., None] >> j) & 1) << 4)
    hi = (qs >> 4) | (((qh[..., None] >> (j + 16)) & 1) << 4)
    return d, np.concatenate([lo, hi], -1) - 16
def dec_q4_0(w):
    w = w.reshape(w.shape[0], -1, 18)
    qs = w[..., 2:18].astype(np.int32)
    return fp16(w[..., 0:2]), np.concatenate([qs & 15, qs >> 4], -1) - 8
def repack_q4_0(wd, wq, ad, aq):
    """weights d (N, nb), q (N, nb, 32); acts d (M, nb), q (M, nb, 32) -> (M, N)."""
    C = np.zeros((aq.shape[0], wq.shape[0]), f32)
    for b in range(wq.shape[1]):
        S = aq[:, b] @ wq[:, b].T                       # exact integer sums (M, N)
        C = fma(S.astype(f32), (wd[None, :, b] * ad[:, None, b]).astype(f32), C)
    return C
def dec_act_q8_0(a):  # (M, nb*34)
    return dec_q8_0(a)

def tinyblas_q0(wd, wq, ad, aq):
    """weights d (N, nb), q (N, nb, 32); acts d (M, nb), q (M, nb, 32) -> (M, N)."""
    M, N, nb = aq.shape[0], wq.shape[0], wq.shape[1]
    out = np.empty((M, N), f32)
    for n0 in range(0, N, 4096):
        q = wq[n0:n0+4096]
        d = wd[n0:n0+4096]
        C = np.zeros((M, q.shape[0], 8), f32)
        for b in range(nb):
            S = (aq[:, None, b, :] * q[None, :, b, :]).reshape(M, q.shape[0], 8, 4).sum(-1)
            db = (d[None, :, b] * ad[:, None, b]).astype(f32)
            C = fma(db[..., None], S.astype(f32), C)
        out[:, n0:n0+4096] = h8(C)
    return out

def dec_q8_k(a):  # (M, nb*292)
    a = a.reshape(a.shape[0], -1, 292)
    d = np.ascontiguousarray(a[..., 0:4]).view(np.float32)[..., 0]
    q = a[..., 4:260].view(np.int8).astype(np.int32)
    bs = np.ascontiguousarray(a[..., 260:292]).view(np.int16).astype(np.int32)
    return d, q, bs

def dec_q6_k(w):
    w = w.reshape(w.shape[0], -1, 210)
    ql = w[..., 0:128].astype(np.int32)
    qh = w[..., 128:192].astype(np.int32)
    sc = w[..., 192:208].view(np.int8).astype(np.int32)
    d = fp16(w[..., 208:210])
    q = np.empty(w.shape[:2] + (256,), np.int32)
    for h in range(2):
        lo = ql[..., 64*h:64*h+64]
        hh = qh[..., 32*h:32*h+32]
        q[..., 128*h+0:128*h+32] = (lo[..., :32] & 15) | ((hh & 3) << 4)
        q[..., 128*h+32:128*h+64] = (lo[..., 32:] & 15) | (((hh >> 2) & 3) << 4)
        q[..., 128*h+64:128*h+96] = (lo[..., :32] >> 4) | (((hh >> 4) & 3) << 4)
        q[..., 128*h+96:128*h+128] = (lo[..., 32:] >> 4) | (((hh >> 6) & 3) << 4)
    return d, sc, q   # q unsigned 0..63

def vecdot_q6_k(w, a):
    """AVX2 ggml_vec_dot_q6_K_q8_K: lane l of a block sums bytes 4l..4l+3 of each 32-value group
    (unsigned codes times scales), minus 32 * (bsums 2l, 2l+1 times their scales)."""
    wd, sc, q = dec_q6_k(w)
    ad, aq, bs = dec_q8_k(a)
    M, N, nb = aq.shape[0], q.shape[0], q.shape[1]
    scale_e = np.repeat(sc, 16, axis=-1)      # (N, nb, 256) scale per element
    out = np.empty((M, N), f32)
    for n0 in range(0, N, 1024):
        qq, se, scc, dd = q[n0:n0 + 1024], scale_e[n0:n0 + 1024], sc[n0:n0 + 1024], wd[n0:n0 + 1024]
        nn = qq.shape[0]
        C = np.zeros((M, nn, 8), f32)
        for b in range(nb):
            prod = se[None, :, b, :] * qq[None, :, b, :] * aq[:, None, b, :]
            S = prod.reshape(M, nn, 8, 8, 4).sum(axis=(-3, -1))
            S = S - 32 * (bs[:, None, b, :] * scc[None, :, b, :]).reshape(M, nn, 8, 2).sum(-1)
            db = (ad[:, None, b] * dd[None, :, b]).astype(f32)
            C = fma(db[..., None], S.astype(f32), C)
        out[:, n0:n0 + nn] = h8(C)
    return out


def tiled_q6_k(w, a):
    """ggml-cpu tiled/ (>= 8 rows): per 256-block exact int sum, r = float(s1) * dW, buf += r * dA."""
    wd, sc, q = dec_q6_k(w)
    ad, aq, bs = dec_q8_k(a)
    M, N, nb = aq.shape[0], q.shape[0], q.shape[1]
    scale_e = np.repeat(sc, 16, axis=-1)
    out = np.empty((M, N), f32)
    for n0 in range(0, N, 1024):
        qq = q[n0:n0+1024] - 32
        se = scale_e[n0:n0+1024]
        dd = wd[n0:n0+1024]
        nn = qq.shape[0]
        buf = np.zeros((M, nn), f32)
        for b in range(nb):
            s1 = (se[None, :, b, :] * qq[None, :, b, :] * aq[:, None, b, :]).sum(-1)
            r = (s1.astype(np.int32).astype(f32) * dd[None, :, b]).astype(f32)
            buf = fma(r, ad[:, None, b], buf)
        out[:, n0:n0+nn] = buf
    return out

def dec_q4_k(w):
    w = w.reshape(w.shape[0], -1, 144)
    d = fp16(w[..., 0:2])
    dmin = fp16(w[..., 2:4])
    s = w[..., 4:16].astype(np.int32)
    qs = w[..., 16:144].astype(np.int32)
    sc = np.empty(w.shape[:2] + (8,), np.int32)
    mn = np.empty_like(sc)
    for j in range(8):
        if j < 4:
            sc[..., j] = s[..., j] & 63
            mn[..., j] = s[..., j + 4] & 63
        else:
            sc[..., j] = (s[..., j + 4] & 15) | ((s[..., j - 4] >> 6) << 4)
            mn[..., j] = (s[..., j + 4] >> 4) | ((s[..., j] >> 6) << 4)
    q = np.empty(w.shape[:2] + (256,), np.int32)
    for j in range(4):
        c = qs[..., 32*j:32*j+32]
        q[..., 64*j:64*j+32] = c & 15
        q[..., 64*j+32:64*j+64] = c >> 4
    return d, dmin, sc, mn, q

def repack_q4_k(w, a):
    """llama.cpp's CPU_REPACK q4_K_8x8: rows in groups of 4 through the gemm (one fma per pair of
    sub-blocks), the remaining rows through the gemv (one fma per block)."""
    wd, wdm, sc, mn, q = dec_q4_k(w)
    ad, aq, bs = dec_q8_k(a)
    M, N, nb = aq.shape[0], q.shape[0], q.shape[1]
    out = np.empty((M, N), f32)
    mg = M - M % 4
    for n0 in range(0, N, 1024):
        qq = q[n0:n0+1024]
        s_ = sc[n0:n0+1024]
        m_ = mn[n0:n0+1024]
        nn = qq.shape[0]
        acc = np.zeros((M, nn), f32)
        accm = np.zeros((M, nn), f32)
        for b in range(nb):
            dots = (qq[None, :, b, :] * aq[:, None, b, :]).reshape(M, nn, 8, 32).sum(-1)   # (M, nn, 8)
            isub = dots * s_[None, :, b, :]
            bsj = bs[:, b, :].reshape(M, 8, 2).sum(-1)          # (M, 8)
            msub = m_[None, :, b, :] * bsj[:, None, :]
            dA = (wd[n0:n0+nn, b][None] * ad[:, None, b]).astype(f32)
            dM = (wdm[n0:n0+nn, b][None] * ad[:, None, b]).astype(f32)
            # gemm rows: per pair of sub-blocks
            if mg:
                for sb in range(4):
                    i2 = isub[:mg, :, 2*sb] + isub[:mg, :, 2*sb+1]
                    m2 = msub[:mg, :, 2*sb] + msub[:mg, :, 2*sb+1]
                    acc[:mg] = fma(i2.astype(np.int32).astype(f32), dA[:mg], acc[:mg])
                    accm[:mg] = fma(m2.astype(np.int32).astype(f32), dM[:mg], accm[:mg])
            if mg < M:
                acc[mg:] = fma(isub[mg:].sum(-1).astype(np.int32).astype(f32), dA[mg:], acc[mg:])
                accm[mg:] = fma(msub[mg:].sum(-1).astype(np.int32).astype(f32), dM[mg:], accm[mg:])
        out[:, n0:n0+nn] = (acc - accm).astype(f32)
    return out

def mul_mat(wtype, wraw, x, repacked=True):
    """wraw (N, row_bytes) uint8, x (M, K) f32 -> (M, N); `repacked`: whether the build repacked
    these Q4_0 weights (2-D, rows in eights)."""
    name = wtype
    if name in ('Q8_0', 'Q5_0', 'Q4_0'):
        ad, aq = dec_act_q8_0(quantize_q8_0_cpu(np.ascontiguousarray(x)))
        wd, wq = {'Q8_0': dec_q8_0, 'Q5_0': dec_q5_0, 'Q4_0': dec_q4_0}[name](wraw)
        if name == 'Q4_0' and repacked:
            return repack_q4_0(wd, wq, ad, aq)
        return tinyblas_q0(wd, wq, ad, aq)
    a = quantize_q8_k(np.ascontiguousarray(x)).reshape(x.shape[0], -1)
    if name == 'Q6_K':
        return tiled_q6_k(wraw, a) if x.shape[0] >= 8 else vecdot_q6_k(wraw, a)
    if name == 'Q4_K':
        return repack_q4_k(wraw, a)
    raise NotImplementedError(name)


# -- rope and gelu ---------------------------------------------------------------------------------
def _libm():
    name = ctypes.util.find_library("m")
    lib = ctypes.CDLL(name) if name else None
    if lib is None or not hasattr(lib, "cosf"):
        return None
    for fn in ("cosf", "sinf"):
        getattr(lib, fn).restype = ctypes.c_float
        getattr(lib, fn).argtypes = [ctypes.c_float]
    return lib


LIBM = _libm()


def rope_cache(pos, ne0, n_dims, freq_base, freq_scale, attn_factor):
    """ggml_rope_cache_init (ext_factor 0): theta *= theta_scale in float32, the C library's cosf/sinf."""
    ts = f32(freq_base) ** (f32(-2.0) / f32(n_dims))
    cos = np.empty((len(pos), ne0 // 2), f32)
    sin = np.empty_like(cos)
    for r, p in enumerate(pos):
        th = f32(p)
        for i in range(ne0 // 2):
            t = float(f32(f32(freq_scale) * th))
            cos[r, i] = f32(LIBM.cosf(t)) * f32(attn_factor)
            sin[r, i] = f32(LIBM.sinf(t)) * f32(attn_factor)
            th = f32(th * ts)
    return cos, sin


def gelu_table():
    """GGML's fp16 gelu table with 1 + GELU_COEF_A*x*x contracted to an FMA, as GCC compiles it."""
    s, a = f32(0.79788456080286535587989211986876), f32(0.044715)
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(f32)
    with np.errstate(all="ignore"):
        inner = (s * h) * fma(a * h, h, f32(1))
        t = np.tanh(inner.astype(f64)).astype(f32)
        table = ((f32(0.5) * h) * (f32(1) + t)).astype(np.float16).astype(f32)
    # NaN entries as F16C makes them: vcvtph2ps quiets h keeping its payload, every operation keeps
    # the first NaN operand's, vcvtps2ph keeps the top 10 bits (numpy's conversions vary by version)
    i = np.arange(1 << 16, dtype=np.uint32)
    nan = ((i & 0x7C00) == 0x7C00) & ((i & 0x3FF) != 0)
    table[nan] = (((i & 0x8000) << 16) | np.uint32(0x7FC00000) | ((i & 0x3FF) << 13))[nan].view(f32)
    return table
