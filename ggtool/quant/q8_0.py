"""Q8_0 (34-byte blocks: fp16 d, 32 int8), quantized both as the reference
(``quantize_row_q8_0_ref``, roundf) and as the x86 AVX2 CPU ``from_float`` mul_mat uses for its
activations (id = 127/amax, ties to even), and dequantized; byte-exact with GGML."""

from __future__ import annotations

import numpy as np

from .blocks import _F32, Q8_0_BYTES, _dequantize_blocks, _quantize_blocks, _row_max_min
from .f16 import fp32_to_fp16


def _amax(xb: np.ndarray, s) -> np.ndarray:
    a = s.v[:xb.shape[0]]
    np.abs(xb, out=a)
    return _row_max_min(a, s, want_min=False)[0]


def _q8_0_blocks(xb: np.ndarray, out: np.ndarray, s, cpu: bool) -> int:
    n = xb.shape[0]
    amax = _amax(xb, s)
    if not np.isfinite(amax).all():
        return int(np.argmax(~np.isfinite(xb.reshape(-1))))
    d = np.divide(amax, _F32(127.0))
    with np.errstate(divide="ignore", over="ignore"):
        if cpu:
            idv = np.divide(_F32(127.0), amax)
            idv[amax == 0] = 0
        else:
            idv = np.divide(_F32(1.0), d)
            idv[d == 0] = 0
    v = s.v[:n]
    np.multiply(xb, idv[:, None], out=v)
    inf_id = np.flatnonzero(~np.isfinite(idv))
    with np.errstate(invalid="ignore", over="ignore"):
        if cpu:
            np.rint(v, out=v)                      # _mm256_round_ps(NEAREST): half to even
        else:                                      # roundf: half away from zero, exactly
            t = np.trunc(v)
            f = np.subtract(v, t)                  # exact
            np.add(f, f, out=f)
            np.trunc(f, out=f)                     # +-1 where |frac| >= 0.5
            np.add(t, f, out=v)
        q = out[:, 2:].view(np.int8)
        np.copyto(q, v, casting="unsafe")
    out.view(np.uint16)[:, 0] = fp32_to_fp16(d).view(np.uint16)
    if inf_id.size:   # id overflowed (fp32-subnormal amax): x86 gives 0 (ref) or -128 (AVX2 packs)
        sub = q[inf_id]
        sub[~np.isfinite(v[inf_id])] = -128 if cpu else 0
        q[inf_id] = sub
    return -1


def quantize_q8_0(x, name: str = "tensor") -> np.ndarray:
    """Reference Q8_0 bytes (quantize_row_q8_0_ref: roundf), shape (..., row/32*34)."""
    return _quantize_blocks(x, name, "Q8_0", Q8_0_BYTES, lambda xb, o, s: _q8_0_blocks(xb, o, s, False))


def quantize_q8_0_cpu(x, name: str = "tensor") -> np.ndarray:
    """Q8_0 bytes as the x86 AVX2 CPU from_float makes them for mul_mat (id=127/amax, ties even)."""
    return _quantize_blocks(x, name, "Q8_0", Q8_0_BYTES, lambda xb, o, s: _q8_0_blocks(xb, o, s, True))


def _dq8_0_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    d = np.ascontiguousarray(blocks[:, :2]).view(np.float16).astype(_F32)
    np.multiply(blocks[:, 2:].view(np.int8), d, out=out)


def dequantize_q8_0(raw) -> np.ndarray:
    """float32 values of Q8_0 bytes (rows of 34-byte blocks): shape (..., row_bytes/34*32)."""
    return _dequantize_blocks(raw, Q8_0_BYTES, "Q8_0", _dq8_0_blocks)
