"""The former numpy implementations of Q4_0 / Q8_0 / fp16, kept as test oracles for the compiled
kernels (ggtool.kernels.quantize): plain whole-array numpy, GGML's float32 arithmetic step by step.

Inputs are finite float32 arrays (..., 32k); outputs are the block bytes (..., k * 18 or 34).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def _blocks(x) -> np.ndarray:
    x = np.asarray(x, dtype=F32)
    assert np.isfinite(x).all(), "the oracles take finite data only"
    return x.reshape(-1, 32)


def _shaped(out: np.ndarray, x) -> np.ndarray:
    x = np.asarray(x)
    return out.reshape(*x.shape[:-1], x.shape[-1] // 32 * out.shape[1])


def first_bad(x) -> int:
    """Flat index of the first NaN/inf of x (numpy order), or -1."""
    bad = ~np.isfinite(np.asarray(x).reshape(-1))
    return int(np.argmax(bad)) if bad.any() else -1


def fp32_to_fp16(x) -> np.ndarray:
    """GGML_FP32_TO_FP16: numpy's RNE cast (overflow to inf, subnormals kept), NaN -> 0x7e00 | sign."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16)
    nan = np.isnan(x)
    if nan.any():
        bits = h.view(np.uint16)
        sign = (x.view(np.uint32)[nan] >> 16).astype(np.uint16) & np.uint16(0x8000)
        bits[nan] = np.uint16(0x7E00) | sign
    return h


def quantize_q4_0(x) -> np.ndarray:
    """quantize_row_q4_0_ref: d = m / -8 (m the signed value of largest magnitude, the first one
    on ties, +0.0 for a block of +-0.0), id = 1/d (0 if d == 0), code = min(15, trunc(x*id + 8.5)),
    codes 0 where 1/d overflows (x86); nibbles: element j low, j + 16 high; d as fp16."""
    xb = _blocks(x)
    n = xb.shape[0]
    mx, mn = xb.max(axis=1), xb.min(axis=1)
    neg = -mn
    m = np.where(neg > mx, mn, mx) + F32(0.0)
    tie = np.flatnonzero((neg == mx) & (m != 0))
    if tie.size:
        sub = xb[tie]
        m[tie] = sub[np.arange(tie.size), np.argmax(np.abs(sub), axis=1)]
    d = m * F32(-0.125)                                   # == m / -8 exactly
    with np.errstate(divide="ignore", over="ignore"):
        idv = np.where(d == 0, F32(0.0), F32(1.0) / d).astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        v = xb * idv[:, None] + F32(8.5)
        q = v.astype(np.uint8)                            # trunc toward zero; v is in [0, 16.5]
    q[~np.isfinite(idv)] = 0
    q = np.minimum(q, 15)
    out = np.empty((n, 18), np.uint8)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    out[:, :2] = fp32_to_fp16(d).view(np.uint8).reshape(n, 2)
    return _shaped(out, x)


def _q8_0(x, cpu: bool) -> np.ndarray:
    xb = _blocks(x)
    n = xb.shape[0]
    amax = np.abs(xb).max(axis=1)
    d = amax / F32(127.0)
    with np.errstate(divide="ignore", over="ignore"):
        if cpu:
            idv = np.where(amax == 0, F32(0.0), F32(127.0) / amax).astype(F32)
        else:
            idv = np.where(d == 0, F32(0.0), F32(1.0) / d).astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        v = xb * idv[:, None]
        if cpu:
            r = np.rint(v)                                # _mm256_round_ps(NEAREST): half to even
        else:                                             # roundf: half away from zero, exactly
            t = np.trunc(v)
            r = t + np.trunc((v - t) * F32(2.0))
        q = r.astype(np.int8)
    q[~np.isfinite(idv)] = -128 if cpu else 0            # x86: AVX2's packs saturate, cvttss2si -> 0
    out = np.empty((n, 34), np.uint8)
    out[:, 2:] = q.view(np.uint8)
    out[:, :2] = fp32_to_fp16(d).view(np.uint8).reshape(n, 2)
    return _shaped(out, x)


def quantize_q8_0(x) -> np.ndarray:
    """quantize_row_q8_0_ref: d = amax/127, id = 1/d (0 if d == 0), roundf(x*id)."""
    return _q8_0(x, False)


def quantize_q8_0_cpu(x) -> np.ndarray:
    """The x86 AVX2 from_float: d = amax/127, id = 127/amax (0 if amax == 0), round half to even."""
    return _q8_0(x, True)


def _dequantize(raw, nbytes: int, codes) -> np.ndarray:
    raw = np.asarray(raw, dtype=np.uint8)
    blocks = raw.reshape(-1, nbytes)
    d = np.ascontiguousarray(blocks[:, :2]).view(np.float16).astype(F32)      # (n, 1), exact
    with np.errstate(invalid="ignore"):
        out = codes(blocks[:, 2:]).astype(F32) * d
    return out.reshape(*raw.shape[:-1], raw.shape[-1] // nbytes * 32)


def dequantize_q4_0(raw) -> np.ndarray:
    """(code - 8) * d in float32; element j is the low nibble of byte j, j + 16 the high one."""
    return _dequantize(raw, 18, lambda q: np.concatenate([q & 15, q >> 4], axis=1).astype(np.int8) - 8)


def dequantize_q8_0(raw) -> np.ndarray:
    """code * d in float32."""
    return _dequantize(raw, 34, lambda q: q.view(np.int8))
