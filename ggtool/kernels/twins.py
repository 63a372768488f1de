"""numpy twins of the compiled kernels a quantized model's forward pass calls: the activation
quantizers (Q8_0 and Q8_1 as the x86 CPU makes them, Q8_K) and the quantized dot products of every
type ``dot`` registers. They give the kernels' bits, and they need no compiling: a process whose
kernels are not in the cache yet runs them instead (``cache``), while the kernels compile for next
time.

How the bits come out equal: the integer sums of a block are computed as float sums of integer
values by BLAS (float32 for the 32-value blocks: every partial sum stays below 2**24; float64 for the
K-quants' scaled sums), which are exact in any order, with or without fused multiply-adds; then
the float32 epilogue is the kernels' own, operation for operation and block after block, in numpy's
elementwise float32 arithmetic (no fusing, no reordering). tests/test_twins.py checks every type
against the kernels.
"""

from __future__ import annotations

import numpy as np

from . import decode

_F32 = np.float32
ROWS = 2048          # weight rows decoded at a time: the float copies stay a few MiB


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
    """kernels.kquants.quantize_q8_k (quantize_row_q8_K_ref): (n, 256) float32 -> (n, 292) bytes:
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
    """Q8_0 (34-byte) or Q8_1 (36-byte) rows: codes (nb, M, 32) float32, d and s (nb, M) float32."""
    M = act.shape[0]
    b = act.reshape(M, -1, nbytes).transpose(1, 0, 2)
    q = b[:, :, nbytes - 32:].view(np.int8).astype(_F32)
    s = decode._f16(b, 2) if nbytes == 36 else None
    return q, decode._f16(b, 0), s


def _act_k(act: np.ndarray):
    """Q8_K rows: codes (nb, M, 256) float64, bsums (nb, M, 16) float64, d (nb, M) float32."""
    M = act.shape[0]
    b = act.reshape(M, -1, 292).transpose(1, 0, 2)
    q = b[:, :, 4:260].view(np.int8).astype(np.float64)
    bs = np.ascontiguousarray(b[:, :, 260:292]).view("<i2").astype(np.float64)
    d = np.ascontiguousarray(b[:, :, 0:4]).view("<f4")[:, :, 0].astype(_F32)
    return q, bs, d


def dot(type_, w: np.ndarray, act: np.ndarray, out: np.ndarray) -> None:
    """out (M, N) = weight rows w (uint8 (N, row_bytes) of type_) . activation rows act (its
    vec_dot_type), bit for bit as ``dot.dot`` on ``dot.pack(type_, w)``."""
    decoder = decode.DECODERS[type_]
    k = type_ in decode.K_TYPES
    a = _act_k(act) if k else _act_32(act, 36 if type_ in decode.MIN_TYPES else 34)
    for r0 in range(0, w.shape[0], ROWS):
        rows = decoder(np.ascontiguousarray(w[r0:r0 + ROWS]))
        (_dot_k if k else _dot_32)(rows, a, out[:, r0:r0 + ROWS])


def _dot_32(rows, a, out) -> None:
    codes, d, m = rows                                   # (n, nb, 32) int8, (n, nb) float32, mins or None
    qa, da, sa = a
    sumi = np.matmul(qa, codes.astype(_F32).transpose(1, 2, 0))       # (nb, M, n): exact integers
    acc = np.zeros(out.shape, _F32)
    for b in range(sumi.shape[0]):
        if m is None:      # (float(sumi) * d_w) * d_a
            acc += (sumi[b] * d[None, :, b]) * da[b][:, None]
        else:              # (d_w * d_a) * float(sumi) + m_w * s_a
            acc += (d[None, :, b] * da[b][:, None]) * sumi[b] + m[None, :, b] * sa[b][:, None]
    out[...] = acc


def _dot_k(rows, a, out) -> None:
    codes, sc, mn, d, dmin = rows                        # (n, nb, 256), (n, nb, 16) x2, (n, nb) x2
    qa, bs, da = a
    n, nb = codes.shape[:2]
    scaled = codes.reshape(n, nb, 16, 16).astype(np.float64) * sc[:, :, :, None]
    sumi = np.matmul(qa, scaled.reshape(n, nb, 256).transpose(1, 2, 0)).astype(_F32)   # exact, then rounded
    summ = np.matmul(bs, mn.astype(np.float64).transpose(1, 2, 0)).astype(_F32)
    acc = np.zeros(out.shape, _F32)
    for b in range(nb):
        dd = d[None, :, b] * da[b][:, None]
        acc += dd * sumi[b]
        acc -= (dmin[None, :, b] * da[b][:, None]) * summ[b]
    out[...] = acc
