"""numpy twins of the compiled kernels the command line's first runs call: the Q4_0/Q8_0 quantizers
and fp32 -> fp16 (``quantize``), the activation quantizers (Q8_0 and Q8_1 as the x86 CPU makes
them, Q8_K), the dot products of the classic block types (``block_dot``, on the blocks their
records decode) and of F32/F16 (``float_dot``, GGML's scalar order as ``dot_float``, its double
sums in order one k at a time across the outputs), and
the Q4_0/Q8_0 dequantizers (which the kernels themselves run for small inputs, SMALL_BLOCKS). They
give the kernels' bits, and they need no compiling: a process whose kernels are not in the cache
yet runs them instead (``cache``), while the kernels compile for next time.

How the bits come out equal: the integer sums of a block are computed as float sums of integer
values by BLAS (float32 for the 32-value blocks: every partial sum stays below 2**24; float64 for the
K-quants' scaled sums, below 2**28), which are exact in any order, with or without fused
multiply-adds: so neither BLAS's kernel set (which OpenBLAS picks by CPU) nor its threads change a bit; then
the float32 epilogue is the kernels' own, operation for operation and block after block, in numpy's
elementwise float32 arithmetic (no fusing, no reordering). tests/test_twins.py checks every type
against the kernels.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from . import decode

_F32 = np.float32
ROWS = 2048          # weight rows decoded at a time: the float copies stay a few MiB


# A dequantizer's numpy twin runs inputs of at most this many blocks (get_rows picking a few token
# embeddings, a copy's task): as fast there as the kernel, and a process that needs no more never
# compiles it (~1-1.5 s of a first-ever run of the README's Q4_0 example or gemma). Same float32
# products, so the same bits (tests/test_kernels.py checks both sides of the line).
SMALL_BLOCKS = 4096


def _scales(blocks):
    """The fp16 scale of each block as float32 (numpy's cast: exact, as the kernels' table)."""
    return np.ascontiguousarray(blocks[:, :2]).view(np.float16)[:, 0].astype(np.float32)[:, None]


def q4_0_dequantize(blocks, out) -> None:
    """(n, 18) Q4_0 blocks -> (n, 32) float32: (code - 8) * d."""
    q = blocks[:, 2:18]
    d = _scales(blocks)
    with np.errstate(all="ignore"):    # a NaN or inf scale gives NaN/inf values, as the kernel's
        np.multiply((q & 15).astype(np.int8) - np.int8(8), d, out=out[:, :16], dtype=np.float32)
        np.multiply((q >> 4).astype(np.int8) - np.int8(8), d, out=out[:, 16:], dtype=np.float32)


def q8_0_dequantize(blocks, out) -> None:
    """(n, 34) Q8_0 blocks -> (n, 32) float32: code * d."""
    with np.errstate(all="ignore"):
        np.multiply(blocks[:, 2:34].view(np.int8), _scales(blocks), out=out, dtype=np.float32)


# -- quantizers ---------------------------------------------------------------------------------------
def fp32_to_fp16(x: np.ndarray, out: np.ndarray) -> None:
    """GGML_FP32_TO_FP16 of float32 x into the uint16 out (1-D): numpy's cast (round to nearest
    even, overflow to inf, subnormals kept), NaN -> 0x7e00 | sign."""
    with np.errstate(over="ignore", invalid="ignore"):
        out[...] = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = np.uint16(0x7E00) | ((x.view(np.uint32)[nan] >> 16).astype(np.uint16) & np.uint16(0x8000))


def q4_0_quantize(xb: np.ndarray, out: np.ndarray) -> int:
    """quantize_row_q4_0_ref over (n, 32) blocks into (n, 18): d = m / -8 (m the signed value of
    largest magnitude, the first one on ties, +0.0 for a block of +-0.0), id = 1/d (0 if d == 0),
    code = min(15, trunc(x*id + 8.5)), codes 0 where 1/d overflows (x86); -1 or the first NaN/inf."""
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    mx, mn = xb.max(axis=1), xb.min(axis=1)
    m = np.where(-mn > mx, mn, mx) + _F32(0.0)
    tie = np.flatnonzero((-mn == mx) & (m != 0))
    if tie.size:
        sub = xb[tie]
        m[tie] = sub[np.arange(tie.size), np.argmax(np.abs(sub), axis=1)]
    d = m * _F32(-0.125)                                   # == m / -8 exactly
    with np.errstate(divide="ignore", over="ignore"):
        idv = np.where(d == 0, _F32(0.0), _F32(1.0) / d).astype(_F32)
    with np.errstate(invalid="ignore", over="ignore"):
        q = (xb * idv[:, None] + _F32(8.5)).astype(np.uint8)     # trunc toward zero; in [0, 16.5]
    q[~np.isfinite(idv)] = 0
    q = np.minimum(q, 15)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    out[:, :2] = _f16_bytes(d)
    return -1


def q8_0_quantize(xb: np.ndarray, out: np.ndarray) -> int:
    """quantize_row_q8_0_ref over (n, 32) blocks into (n, 34): d = amax/127, id = 1/d (0 if d == 0),
    roundf (half away from zero); codes 0 where 1/d overflows; -1 or the first NaN/inf."""
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    amax = np.abs(xb).max(axis=1)
    d = amax / _F32(127.0)
    with np.errstate(divide="ignore", over="ignore"):
        idv = np.where(d == 0, _F32(0.0), _F32(1.0) / d).astype(_F32)
    with np.errstate(invalid="ignore", over="ignore"):
        v = xb * idv[:, None]
        t = np.trunc(v)
        q = (t + np.trunc((v - t) * _F32(2.0))).astype(np.int8)
    q[~np.isfinite(idv)] = 0
    out[:, 2:] = q.view(np.uint8)
    out[:, :2] = _f16_bytes(d)
    return -1


# -- activations -----------------------------------------------------------------------------------
def _first_bad(xb: np.ndarray) -> int:
    ok = np.isfinite(xb)
    if ok.all():
        return -1
    return int(np.argmin(ok.reshape(-1)))


def _f16_bytes(d: np.ndarray) -> np.ndarray:
    """GGML_FP32_TO_FP16 of finite float32 d as 2 bytes each (numpy's cast: round to nearest even,
    overflow to inf, subnormals kept)."""
    with np.errstate(over="ignore"):
        return d.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _q8_cpu(xb: np.ndarray):
    """d (unrounded float32) and int8 codes of the x86 AVX2 from_float: id = 127/amax, half to even;
    codes -128 where 1/d overflows (AVX2's saturating packs)."""
    amax = np.abs(xb).max(axis=1)
    d = amax / _F32(127.0)
    with np.errstate(divide="ignore", over="ignore"):
        idv = np.where(amax == 0, _F32(0.0), _F32(127.0) / amax).astype(_F32)
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.rint(xb * idv[:, None]).astype(np.int8)
    q[~np.isfinite(idv)] = -128
    return d, q


def q8_0_quantize_cpu(xb: np.ndarray, out: np.ndarray) -> int:
    """kernels.quantize.q8_0_quantize_cpu: (n, 32) float32 -> (n, 34) bytes; -1 or the flat index
    of the first NaN/inf."""
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    d, q = _q8_cpu(xb)
    out[:, 2:] = q.view(np.uint8)
    out[:, :2] = _f16_bytes(d)
    return -1


def q8_1_quantize_cpu(xb: np.ndarray, out: np.ndarray) -> int:
    """kernels.quantize.q8_1_quantize_cpu: fp16 d, fp16 s = d * sum(qs), int8 qs[32] (n, 36)."""
    bad = _first_bad(xb)
    if bad >= 0:
        return bad
    d, q = _q8_cpu(xb)
    out[:, 4:] = q.view(np.uint8)
    out[:, :2] = _f16_bytes(d)
    out[:, 2:4] = _f16_bytes(d * q.sum(axis=1, dtype=np.int32).astype(_F32))
    return -1


def quantize_q8_k(x: np.ndarray, out: np.ndarray) -> int:
    """kernels.quantize.quantize_q8_k (quantize_row_q8_K_ref): (n, 256) float32 -> (n, 292) bytes:
    float32 d, int8 qs[256], int16 bsums[16]."""
    bad = _first_bad(x)
    if bad >= 0:
        return bad
    n = x.shape[0]
    a = np.abs(x)
    mx = x[np.arange(n), np.argmax(a, axis=1)]          # the signed value of largest |x|, the first one
    zero = a.max(axis=1) == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(zero, _F32(1.0), _F32(-127.0) / np.where(zero, _F32(1.0), mx)).astype(_F32)
        q = np.minimum(np.rint(x * iscale[:, None]), _F32(127.0)).astype(np.int8)
    q[zero] = 0
    out[:, 4:260] = q.view(np.uint8)
    out[:, 260:292] = q.reshape(n, 16, 16).sum(axis=2, dtype=np.int16).astype("<i2").view(np.uint8)
    d = (_F32(1.0) / iscale).astype(_F32)
    d[zero] = 0
    out[:, 0:4] = d.astype("<f4").view(np.uint8).reshape(n, 4)
    return -1


# -- dot products ------------------------------------------------------------------------------------
def _act_32(act: np.ndarray, nbytes: int):
    """Q8_0 (34-byte) or Q8_1 (36-byte) rows: codes (nb, 32, M) float32, d and s (nb, M) float32."""
    M = act.shape[0]
    b = act.reshape(M, -1, nbytes).transpose(1, 0, 2)
    q = np.ascontiguousarray(b[:, :, nbytes - 32:].view(np.int8).transpose(0, 2, 1), _F32)
    s = decode.f16_at(b, 2) if nbytes == 36 else None
    return q, decode.f16_at(b, 0), s


def _act_k(act: np.ndarray):
    """Q8_K rows: codes (nb, M, 256) float64, bsums (nb, M, 16) float64, d (nb, M) float32."""
    M = act.shape[0]
    b = act.reshape(M, -1, 292).transpose(1, 0, 2)
    q = b[:, :, 4:260].view(np.int8).astype(np.float64)
    bs = np.ascontiguousarray(b[:, :, 260:292]).view("<i2").astype(np.float64)
    d = np.ascontiguousarray(b[:, :, 0:4]).view("<f4")[:, :, 0].astype(_F32)
    return q, bs, d


def block_dot(decode_rows, act_bytes: int, w: np.ndarray, act: np.ndarray, out: np.ndarray) -> None:
    """out (M, N) = weight rows w (uint8 (N, row_bytes)) of a classic block type, decoded by its
    record's decode_rows (``ggtool.qtypes``), . activation rows act of its vec_dot_type (blocks of
    `act_bytes`: Q8_0 34, Q8_1 36, Q8_K 292), bit for bit as the record's packed tile."""
    k = act_bytes == 292
    a = _act_k(act) if k else _act_32(act, act_bytes)
    for r0 in range(0, w.shape[0], ROWS):
        rows = decode_rows(np.ascontiguousarray(w[r0:r0 + ROWS]))
        (_dot_k if k else _dot_32)(rows, a, out[:, r0:r0 + ROWS])


def dot(type_, w: np.ndarray, act: np.ndarray, out: np.ndarray) -> None:
    """out (M, N) = F32/F16 weight rows w (their values, or bytes) . activation rows act of the same
    type, bit for bit as ``dot.dot`` on ``dot.pack(type_, w)`` (GGML's scalar order)."""
    float_dot(_float_rows(w, _FLOAT[type_]), _float_rows(act, _FLOAT[type_]), out)


def _dot_32(rows, a, out) -> None:
    codes, d, m = rows                                   # (n, nb, 32) int8, (n, nb) float32, mins or None
    qa, da, sa = a
    # (nb, n, M): exact integers. The codes are cast in their own order (a transposing cast costs twice
    # as much); BLAS reads each block's (n, 32) rows through its leading dimension.
    sumi = np.matmul(codes.astype(_F32).transpose(1, 0, 2), qa)
    dw = np.ascontiguousarray(d.T)[:, :, None]
    if m is None:          # (float(sumi) * d_w) * d_a
        sumi *= dw
        sumi *= da[:, None, :]
    else:                  # (d_w * d_a) * float(sumi) + m_w * s_a
        sumi *= dw * da[:, None, :]
        sumi += np.ascontiguousarray(m.T)[:, :, None] * sa[:, None, :]
    acc = np.zeros(sumi.shape[1:], _F32)
    for term in sumi:      # block after block, as the kernels' acc +=
        acc += term
    out[...] = acc.T


def _dot_k(rows, a, out) -> None:
    codes, sc, mn, d, dmin = rows                        # (n, nb, 256), (n, nb, 16) x2, (n, nb) x2
    qa, bs, da = a
    n, nb = codes.shape[:2]
    scaled = np.empty((nb, 16, 16, n), np.float64)       # contiguous, as _dot_32's
    scaled[...] = codes.reshape(n, nb, 16, 16).transpose(1, 2, 3, 0)
    scaled *= sc.transpose(1, 2, 0)[:, :, None, :]
    sumi = np.matmul(qa, scaled.reshape(nb, 256, n)).astype(_F32)                     # exact, then rounded
    summ = np.matmul(bs, np.ascontiguousarray(mn.transpose(1, 2, 0), np.float64)).astype(_F32)
    dw, dmw = np.ascontiguousarray(d.T), np.ascontiguousarray(dmin.T)
    acc = np.zeros(out.shape, _F32)
    t = np.empty(out.shape, _F32)
    for b in range(nb):    # acc += (d_w * d_a) * sumi; acc -= (dmin_w * d_a) * summ
        np.multiply(dw[b][None, :], da[b][:, None], out=t)
        t *= sumi[b]
        acc += t
        np.multiply(dmw[b][None, :], da[b][:, None], out=t)
        t *= summ[b]
        acc -= t
    out[...] = acc


# -- F32 and F16: GGML's scalar ggml_vec_dot_f32 / _f16 ---------------------------------------------
_FLOAT = {T.F32: np.float32, T.F16: np.float16}     # the types dot_float computes
FLOAT_CHUNK = 1 << 18                       # products held at once by the short-row path (2 MiB in float64)


def _float_rows(a: np.ndarray, dtype) -> np.ndarray:
    """Rows of `dtype` (M, K) as float32: already float, or their bytes (uint8) viewed; fp16 widened
    exactly."""
    a = np.asarray(a)
    if a.dtype != dtype:
        a = np.ascontiguousarray(a).view(dtype)
    return a.astype(_F32, copy=False)


def float_dot(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out (M, N) = w (N, K) . x (M, K), float32 rows, in GGML's scalar order: per output a double
    from +0.0, plus (double)(w[k] * x[k]) (a float32 product) for k in order, rounded once: as
    ``dot_float`` computes it. Many outputs: one k at a time over all of them (a float32 product,
    added into float64 accumulators); few: the products of a chunk of outputs at once, summed by
    ``np.add.accumulate`` along k (a running sum, in order by definition)."""
    N, K = w.shape
    M = x.shape[0]
    if M * N >= 4096:
        acc = np.zeros((M, N), np.float64)
        prod = np.empty((M, N), _F32)
        wt = np.ascontiguousarray(w.T)
        with np.errstate(all="ignore"):
            for k in range(K):
                np.multiply(x[:, k:k + 1], wt[k], out=prod)
                np.add(acc, prod, out=acc)
        out[...] = acc
        return
    rows = max(1, FLOAT_CHUNK // max(K, 1))
    with np.errstate(all="ignore"):
        for m in range(M):
            for n0 in range(0, N, rows):
                prod = (w[n0:n0 + rows] * x[m]).astype(np.float64)        # float32 products, exact in double
                s = np.add.accumulate(prod, axis=1)[:, -1] if K else np.zeros(len(prod))
                out[m, n0:n0 + rows] = s + 0.0     # +0.0 as GGML's sum starts: -0.0 becomes +0.0
