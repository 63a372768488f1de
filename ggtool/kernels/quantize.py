"""Compiled Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 block quantizers, Q4_0 / Q8_0 dequantizers and fp32 <->
fp16, byte-exact with GGML.

The float32 arithmetic is GGML's, operation for operation (see ``ggtool.quant``); only the shape
of the loops is ours, so that LLVM vectorises them:

* max |x| of a block is an integer max over the float bits with the sign cleared (for finite
  floats the bit order is the magnitude order; bits >= 0x7f800000 are NaN/inf), which needs no
  NaN-aware float max and flags a non-finite block for free;
* Q4_0's signed maximum is +amax or -amax, whichever bit pattern occurs first (two integer min
  reductions over the indices: no data-dependent load, which stalled the loop 3x);
* a chunk goes through passes over all its blocks (scales, then codes, then fp16 scales) rather
  than one long dependency chain per block; per-element loops have no branches, and the rare
  blocks whose 1/d overflows (x86 gives code 0, or -128 from AVX2's saturating packs) are patched
  per block, since LLVM's float -> int of inf/NaN is undefined;
* the inner trip count is read from the array (always 32): with a literal 32 LLVM unrolls the
  loops fully and then fails to vectorise them;
* numba widens integer arithmetic to 64 bits, so results are cast back to 32 bits to keep 8 or
  16 lanes per vector; bit casts go through uint32 views of float32 arrays.

Each public kernel is compiled (or loaded from the cache) for one signature at its first call,
C-contiguous (n, 32) float32 / (n, nbytes) uint8 arrays: ~6 ms each warm, seconds cold.
"""

from __future__ import annotations

import threading

import numpy as np

from . import twins
from .jit import njit, numba
from .native import view_as
from .twins import SMALL_BLOCKS

_T = numba.types
_F32_IN = _T.Array(_T.float32, 2, "C", readonly=True)
_U8_IN = _T.Array(_T.uint8, 2, "C", readonly=True)
_QUANT_SIG = (_F32_IN, _T.uint8[:, ::1])


class _Pinned:
    """A kernel with exactly one specialization: compiled (or loaded from the disk cache) for
    `argtypes` at its first call, never for other types, and then called through its compiled
    entry point. Writable and read-only arrays alike run it, so whatever its callers pass it never
    compiles again; an array of another dtype, rank or layout is a TypeError. Loading at the first
    call, not at import, spares a process the kernels it never runs (~6 ms each); the entry point
    spares it numba's dispatch, which types a read-only array (a memory-mapped .npy) in Python and
    imports numpy.ma to do it (~7 ms of a `ggtool quantize x.npy`)."""

    __slots__ = ("argtypes", "dispatcher", "small", "_fn", "_expect")
    _lock = threading.Lock()

    def __init__(self, dispatcher, argtypes, small=None):
        self.dispatcher, self.argtypes, self.small, self._fn = dispatcher, argtypes, small, None
        self._expect = tuple((np.dtype(str(t.dtype)), t.ndim, t.mutable) for t in argtypes)

    def _load(self):
        with self._lock:   # the quantizer's threads may all arrive first
            if self._fn is None:
                self.dispatcher.compile(self.argtypes)
                self.dispatcher.disable_compile()
                self._fn = self.dispatcher.overloads[self.argtypes].entry_point
        return self._fn

    def __call__(self, *args):
        if self.small is not None and len(args) == 2 and isinstance(args[0], np.ndarray) \
                and args[0].ndim == 2 and args[0].shape[0] <= SMALL_BLOCKS:
            fn = self.small
        else:
            fn = self._fn or self._load()
        if len(args) != len(self._expect):
            raise TypeError(f"{self.dispatcher.__name__} takes {len(self._expect)} arrays, not {len(args)}")
        for i, (a, (dtype, ndim, out)) in enumerate(zip(args, self._expect)):
            if not (isinstance(a, np.ndarray) and a.dtype == dtype and a.ndim == ndim and a.flags.c_contiguous
                    and a.flags.aligned and (a.flags.writeable or not out)):
                what = f"a C-contiguous, aligned{', writable' if out else ''} {ndim}-D {dtype} array"
                got = (f"{a.dtype}, {a.ndim}-D, flags {a.flags.c_contiguous, a.flags.aligned, a.flags.writeable} "
                       "(C-contiguous, aligned, writable)") if isinstance(a, np.ndarray) else type(a).__name__
                raise TypeError(f"{self.dispatcher.__name__}: argument {i} must be {what}, not {got}")
        return fn(*args)

    @property
    def signatures(self) -> list:
        return self.dispatcher.signatures


def _only(*argtypes, small=None):
    return lambda fn: _Pinned(fn, argtypes, small)




_U = np.uint32
_ABS = _U(0x7FFFFFFF)
_SIGN = _U(0x80000000)
_INF = _U(0x7F800000)
_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_F127 = np.float32(127.0)
_M0125 = np.float32(-0.125)
_M00625 = np.float32(-0.0625)
_F8_5 = np.float32(8.5)
_HALF = np.float32(0.5)
_RNE = np.float32(12582912.0)       # 1.5 * 2**23: (v + _RNE) - _RNE rounds |v| < 2**22 half to even
_I15 = np.int32(15)
_I8 = np.int32(8)


@njit
def _f16_bits(w):
    """fp16 bits (uint32) of the float32 with bits w: RNE, overflow to inf, NaN -> 0x7e00 | sign."""
    a = _U(w & _ABS)
    sign = _U((w >> _U(16)) & _U(0x8000))
    # normal results: rebias the exponent (127 -> 15) and round the 13 dropped bits to even; a
    # carry out of the mantissa bumps the exponent, at most up to inf (clamped)
    nrm = min(_U((a - _U(0x38000000) + _U(0xFFF) + ((a >> _U(13)) & _U(1))) >> _U(13)), _U(0x7C00))
    # subnormal results: the mantissa with its implicit bit, shifted right by 126 - exponent
    # (clamped to 1..31; >= 25 gives 0, and the clamps only matter where nrm is chosen)
    sh = _U(_U(126) - min(_U(a >> _U(23)), _U(125)))
    sh = min(sh, _U(31))
    m = _U((a & _U(0x7FFFFF)) | _U(0x800000))
    sub = _U((m + (_U(1) << (sh - _U(1))) - _U(1) + ((m >> sh) & _U(1))) >> sh)
    h = nrm if a >= _U(0x38800000) else sub
    h = _U(0x7E00) if a > _INF else h
    return _U(sign | h)


@njit
def _f32_bits(h):
    """float32 bits of the fp16 bits h: exact, NaN payloads kept (as numpy's cast)."""
    sign = _U((h & _U(0x8000)) << _U(16))
    e = _U((h >> _U(10)) & _U(0x1F))
    m = _U(h & _U(0x3FF))
    if e == _U(0x1F):
        return _U(sign | _INF | (m << _U(13)))
    if e != _U(0):
        return _U(sign | ((e + _U(112)) << _U(23)) | (m << _U(13)))
    if m == _U(0):
        return sign
    s = _U(0)                                   # subnormal: normalise (m < 2**10)
    while (m & _U(0x400)) == _U(0):
        m = _U(m << _U(1))
        s = _U(s + _U(1))
    return _U(sign | ((_U(113) - s) << _U(23)) | ((m & _U(0x3FF)) << _U(13)))


@_only(_T.Array(_T.float32, 1, "C", readonly=True), _T.uint16[::1])
@njit
def fp32_to_fp16(x, out):
    """GGML_FP32_TO_FP16 of float32 x (1-D) into the uint16 out (1-D)."""
    xi = view_as(x, np.uint32)
    for k in range(x.shape[0]):
        out[k] = np.uint16(_f16_bits(xi[k]))


@njit
def _amax_bits(xi, i, nj):
    amax = _U(0)
    for j in range(nj):
        a = _U(xi[i, j] & _ABS)
        amax = a if a > amax else amax
    return amax


@njit
def _first_bad(xi, i, nj):
    for j in range(nj):
        if _U(xi[i, j] & _ABS) >= _INF:
            return i * nj + j
    return i * nj


@njit
def _put_scales(out, ds, at=0):
    """fp16 bits of the float32 scales ds into bytes at, at+1 of every block."""
    di = view_as(ds, np.uint32)
    for i in range(ds.shape[0]):
        h = _f16_bits(di[i])
        out[i, at] = np.uint8(h & _U(0xFF))
        out[i, at + 1] = np.uint8(h >> _U(8))


@njit
def _signed_max(xi, i, nj, amax):
    """Bits of the signed value of largest magnitude amax in block i, the first one on ties (+0.0
    for a block of +-0.0): two integer min reductions over the indices, no data-dependent load."""
    neg = _U(amax | _SIGN)
    kp = nj
    kn = nj
    for j in range(nj):
        w = xi[i, j]
        kp = min(kp, j if w == amax else nj)
        kn = min(kn, j if w == neg else nj)
    return neg if (kn < kp and amax != _U(0)) else amax


@_only(*_QUANT_SIG)
@njit
def q4_0_quantize(xb, out):
    """quantize_row_q4_0_ref over (n, 32) blocks into (n, 18); -1 or the flat index of a NaN/inf."""
    n, nj = xb.shape
    h = nj // 2
    xi = view_as(xb, np.uint32)
    ds = np.empty(n, np.float32)
    ids = np.empty(n, np.float32)
    mi = view_as(ds, np.uint32)
    for i in range(n):
        amax = _amax_bits(xi, i, nj)
        if amax >= _INF:
            return _first_bad(xi, i, nj)
        mi[i] = _signed_max(xi, i, nj, amax)
    for i in range(n):
        d = ds[i] * _M0125                      # == m / -8 exactly
        ds[i] = d
        ids[i] = _F1 / d if d != _F0 else _F0
    for i in range(n):
        idv = ids[i]
        if np.isinf(idv):                       # 1/d overflowed: x86's conversion gives 0
            for j in range(h):
                out[i, 2 + j] = 0
            continue
        for j in range(h):
            c0 = min(np.int32(xb[i, j] * idv + _F8_5), _I15)
            c1 = min(np.int32(xb[i, j + h] * idv + _F8_5), _I15)
            out[i, 2 + j] = np.uint8(c0 | (c1 << 4))
    _put_scales(out, ds)
    return -1


@njit
def _min_max(xi, i, nj, lo, hi):
    """(min, max) of block i as q4_1/q5_1_ref find them (``if (v < min)``, ``if (v > max)``: a zero
    extreme is the first zero, with its sign), into lo[i], hi[i] (float32 views): integer min and
    max over order-preserving keys (sign-magnitude to two's complement: -0.0 sorts just below
    +0.0), so the loop vectorises."""
    kmin = np.int32(0x7FFFFFFF)
    kmax = np.int32(-0x80000000)
    for j in range(nj):
        b = np.int32(xi[i, j])
        k = np.int32(b ^ ((b >> np.int32(31)) & np.int32(0x7FFFFFFF)))
        kmin = min(kmin, k)
        kmax = max(kmax, k)
    view_as(lo, np.int32)[i] = _key_bits(xi, i, nj, kmin)
    view_as(hi, np.int32)[i] = _key_bits(xi, i, nj, kmax)


@njit
def _key_bits(xi, i, nj, k):
    """The float bits of key k (its own inverse), a zero being the block's first zero."""
    if k == np.int32(0) or k == np.int32(-1):
        for j in range(nj):
            if (xi[i, j] & _ABS) == _U(0):
                return np.int32(xi[i, j])
    return np.int32(k ^ ((k >> np.int32(31)) & np.int32(0x7FFFFFFF)))


@njit
def _q_min(xb, out, nmax, qh_at):
    """quantize_row_q4_1_ref (nmax 15, codes min(15, (int8_t)v)) and q5_1_ref (nmax 31, codes
    (uint8_t)v, the 5th bits to qh at qh_at) over (n, 32) blocks: fp16 d and m, then the nibbles."""
    n, nj = xb.shape
    h = nj // 2
    xi = view_as(xb, np.uint32)
    ds = np.empty(n, np.float32)
    ms = np.empty(n, np.float32)
    ids = np.empty(n, np.float32)
    his = np.empty(n, np.float32)
    for i in range(n):
        if _amax_bits(xi, i, nj) >= _INF:
            return _first_bad(xi, i, nj)
        _min_max(xi, i, nj, ms, his)
    fmax = np.float32(nmax)
    for i in range(n):
        d = (his[i] - ms[i]) / fmax
        ds[i] = d
        ids[i] = _F1 / d if d != _F0 else _F0
    qs_at = qh_at + 4 if qh_at >= 0 else 4
    for i in range(n):
        idv = ids[i]
        mn = ms[i]
        if np.isinf(idv) or np.isinf(ds[i]):   # (x - min) * id is inf/NaN (or 0 * inf): x86 gives code 0
            for j in range(h):
                out[i, qs_at + j] = 0
            if qh_at >= 0:
                for k in range(4):
                    out[i, qh_at + k] = 0
            continue
        qh = _U(0)
        for j in range(h):
            c0 = np.int32((xb[i, j] - mn) * idv + _HALF)
            c1 = np.int32((xb[i, j + h] - mn) * idv + _HALF)
            if qh_at < 0:
                c0 = min(c0, _I15)
                c1 = min(c1, _I15)
            out[i, qs_at + j] = np.uint8((c0 & _I15) | ((c1 & _I15) << 4))
            qh |= _U((c0 >> 4) & 1) << _U(j)
            qh |= _U((c1 >> 4) & 1) << _U(j + h)
        if qh_at >= 0:
            for k in range(4):
                out[i, qh_at + k] = np.uint8((qh >> _U(8 * k)) & _U(0xFF))
    _put_scales(out, ds)
    _put_scales(out, ms, 2)
    return -1


@_only(*_QUANT_SIG)
@njit
def q4_1_quantize(xb, out):
    """quantize_row_q4_1_ref over (n, 32) blocks into (n, 20): fp16 d, fp16 m, nibbles."""
    return _q_min(xb, out, 15, -1)


@_only(*_QUANT_SIG)
@njit
def q5_1_quantize(xb, out):
    """quantize_row_q5_1_ref over (n, 32) blocks into (n, 24): fp16 d, fp16 m, qh, nibbles."""
    return _q_min(xb, out, 31, 4)


@_only(*_QUANT_SIG)
@njit
def q5_0_quantize(xb, out):
    """quantize_row_q5_0_ref over (n, 32) blocks into (n, 22): d = max / -16, codes
    min(31, (int8_t)(x*id + 16.5)), fp16 d, qh (5th bits), nibbles."""
    n, nj = xb.shape
    h = nj // 2
    xi = view_as(xb, np.uint32)
    ds = np.empty(n, np.float32)
    ids = np.empty(n, np.float32)
    mi = view_as(ds, np.uint32)
    for i in range(n):
        amax = _amax_bits(xi, i, nj)
        if amax >= _INF:
            return _first_bad(xi, i, nj)
        mi[i] = _signed_max(xi, i, nj, amax)
    for i in range(n):
        d = ds[i] * _M00625                     # == m / -16 exactly
        ds[i] = d
        ids[i] = _F1 / d if d != _F0 else _F0
    f165 = np.float32(16.5)
    i31 = np.int32(31)
    for i in range(n):
        idv = ids[i]
        if np.isinf(idv):                       # 1/d overflowed: x86's conversion gives 0
            for j in range(4 + h):
                out[i, 2 + j] = 0
            continue
        qh = _U(0)
        for j in range(h):
            c0 = min(np.int32(xb[i, j] * idv + f165), i31)
            c1 = min(np.int32(xb[i, j + h] * idv + f165), i31)
            out[i, 6 + j] = np.uint8((c0 & _I15) | ((c1 & _I15) << 4))
            qh |= _U((c0 >> 4) & 1) << _U(j)
            qh |= _U((c1 >> 4) & 1) << _U(j + h)
        for k in range(4):
            out[i, 2 + k] = np.uint8((qh >> _U(8 * k)) & _U(0xFF))
    _put_scales(out, ds)
    return -1


@njit
def _q8_0(xb, out, cpu):
    n, nj = xb.shape
    xi = view_as(xb, np.uint32)
    ds = np.empty(n, np.float32)
    ids = np.empty(n, np.float32)
    ai = view_as(ids, np.uint32)
    for i in range(n):
        amax = _amax_bits(xi, i, nj)
        if amax >= _INF:
            return _first_bad(xi, i, nj)
        ai[i] = amax
    for i in range(n):
        amax = ids[i]
        d = amax / _F127
        ds[i] = d
        if cpu:
            ids[i] = _F127 / amax if amax != _F0 else _F0
        else:
            ids[i] = _F1 / d if d != _F0 else _F0
    for i in range(n):
        idv = ids[i]
        if np.isinf(idv):           # x86 gives 0 (roundf, cvttss2si); AVX2's packs saturate to -128
            fill = np.uint8(0x80) if cpu else np.uint8(0)
            for j in range(nj):
                out[i, 2 + j] = fill
            continue
        if cpu:                     # _mm256_round_ps(NEAREST): half to even
            for j in range(nj):
                v = xb[i, j] * idv
                out[i, 2 + j] = np.uint8(np.int32((v + _RNE) - _RNE) & np.int32(0xFF))
        else:                       # roundf: half away from zero (|v| <= 127.00003)
            for j in range(nj):
                v = xb[i, j] * idv
                t = np.int32(v)
                f = v - np.float32(t)
                r = np.int32(t + np.int32(f >= _HALF) - np.int32(f <= -_HALF))
                out[i, 2 + j] = np.uint8(r & np.int32(0xFF))
    _put_scales(out, ds)
    return -1


@_only(*_QUANT_SIG)
@njit
def q8_0_quantize(xb, out):
    """quantize_row_q8_0_ref (d = amax/127, id = 1/d, roundf) over (n, 32) blocks into (n, 34)."""
    return _q8_0(xb, out, False)


@_only(*_QUANT_SIG)
@njit
def q8_0_quantize_cpu(xb, out):
    """The x86 AVX2 from_float (id = 127/amax, round half to even) over (n, 32) blocks into (n, 34)."""
    return _q8_0(xb, out, True)


@_only(_F32_IN, _T.uint8[:, ::1])
@njit
def q8_1_quantize_cpu(xb, out):
    """The x86 AVX2 from_float of Q8_1 over (n, 32) blocks into (n, 36): fp16 d, fp16 s, int8 qs[32];
    d and qs exactly as q8_0_quantize_cpu, s = fp16(d * sum(qs)) from the unrounded float32 d."""
    n, nj = xb.shape
    q8 = np.empty((n, 2 + nj), np.uint8)
    r = _q8_0(xb, q8, True)
    if r >= 0:
        return r
    xi = view_as(xb, np.uint32)
    bits = np.empty(1, np.uint32)
    f = view_as(bits, np.float32)
    for i in range(n):
        bits[0] = _amax_bits(xi, i, nj)
        d = f[0] / _F127
        t = np.int32(0)
        for j in range(nj):
            t += np.int32(np.int8(q8[i, 2 + j]))
        f[0] = d * np.float32(t)
        sb = _f16_bits(bits[0])
        out[i, 0] = q8[i, 0]
        out[i, 1] = q8[i, 1]
        out[i, 2] = np.uint8(sb & _U(0xFF))
        out[i, 3] = np.uint8(sb >> _U(8))
        for j in range(nj):
            out[i, 4 + j] = q8[i, 2 + j]
    return -1


@njit
def _get_scales(blocks):
    n = blocks.shape[0]
    ds = np.empty(n, np.float32)
    di = view_as(ds, np.uint32)
    for i in range(n):
        di[i] = _f32_bits(_U(blocks[i, 0]) | (_U(blocks[i, 1]) << _U(8)))
    return ds


@_only(_U8_IN, _T.float32[:, ::1], small=twins.q4_0_dequantize)
@njit
def q4_0_dequantize(blocks, out):
    """(n, 18) Q4_0 blocks -> (n, 32) float32: (code - 8) * d."""
    ds = _get_scales(blocks)
    h = out.shape[1] // 2
    for i in range(blocks.shape[0]):
        d = ds[i]
        for j in range(h):
            b = np.int32(blocks[i, 2 + j])
            out[i, j] = np.float32(np.int32((b & _I15) - _I8)) * d
            out[i, j + h] = np.float32(np.int32((b >> 4) - _I8)) * d


@_only(_U8_IN, _T.float32[:, ::1], small=twins.q8_0_dequantize)
@njit
def q8_0_dequantize(blocks, out):
    """(n, 34) Q8_0 blocks -> (n, 32) float32: code * d."""
    ds = _get_scales(blocks)
    nj = out.shape[1]
    for i in range(blocks.shape[0]):
        d = ds[i]
        for j in range(nj):
            out[i, j] = np.float32(np.int8(blocks[i, 2 + j])) * d


# -- Q8_K: the activations K-quant weights are multiplied with -------------------------------------
@njit
def quantize_q8_k(x, out):
    """quantize_row_q8_K_ref (also the CPU from_float): block of 256 -> float32 d, int8 qs[256],
    int16 bsums[16] (292 bytes). Returns -1, or the flat index in x of the first NaN/inf."""
    bits = np.empty(1, np.uint32)       # d's bits, written at byte 0 of each 292-byte row (numba compiles
    d = view_as(bits, np.float32)       # ``out.view(np.float32)`` apart: ~0.1-0.3 s CPU; view_as costs nothing)
    for i in range(x.shape[0]):
        amax = np.float32(0.0)
        mx = np.float32(0.0)
        for j in range(256):
            v = x[i, j]
            if not np.isfinite(v):
                return i * 256 + j
            a = abs(v)
            if a > amax:
                amax = a
                mx = v
        if amax == 0:
            out[i, :] = 0
            continue
        iscale = np.float32(-127.0) / mx
        for j in range(256):
            q = np.int32((iscale * x[i, j] + _RNE) - _RNE)
            out[i, 4 + j] = np.uint8(np.int8(min(q, 127)) & 0xFF)
        for j in range(16):
            s = 0
            for k in range(16):
                s += np.int32(np.int8(out[i, 4 + 16 * j + k]))
            out[i, 260 + 2 * j] = np.uint8(s & 0xFF)
            out[i, 261 + 2 * j] = np.uint8((s >> 8) & 0xFF)
        d[0] = np.float32(1.0) / iscale
        for k in range(4):
            out[i, k] = np.uint8((bits[0] >> np.uint32(8 * k)) & np.uint32(0xFF))
    return -1
