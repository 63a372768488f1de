"""Q4_0 (18-byte blocks: fp16 d, 16 bytes of nibbles), quantized as ``quantize_row_q4_0_ref``
and dequantized, byte-exact with GGML."""

from __future__ import annotations

import numpy as np

from .blocks import _F32, Q4_0_BYTES, _dequantize_blocks, _gather, _quantize_blocks, _row_max_min


def _q4_0_blocks(xb: np.ndarray, out: np.ndarray, s) -> int:
    """Quantize (n, 32) float32 blocks into out (n, 18). Returns -1, or the flat index of a NaN/inf."""
    n = xb.shape[0]
    flat = xb.reshape(-1)
    mx, mn = _row_max_min(xb, s)                              # NaN propagates, inf shows
    neg = np.negative(mn, out=s.t1[:n])
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(mx).all() and np.isfinite(neg).all()
    if not ok:
        bad = ~np.isfinite(flat)
        return int(np.argmax(bad))
    # signed value of largest magnitude; ties in magnitude between +a and -a: the first one wins
    tie = np.equal(neg, mx, out=s.b2[:n])
    m = mx
    np.copyto(m, mn, where=np.greater(neg, mx, out=s.b1[:n]))
    m += _F32(0.0)  # a block of +-0.0 has max +0.0 (GGML's scan starts at +0 and keeps it)
    if tie.any():
        tie = np.flatnonzero(tie & (m != 0))
        if tie.size:
            sub = xb[tie]
            j = np.argmax(np.abs(sub), axis=1)
            m[tie] = sub[np.arange(tie.size), j]
    d = np.multiply(m, _F32(-0.125), out=s.d[:n])              # == m / -8 exactly
    with np.errstate(divide="ignore", over="ignore"):
        idv = np.divide(_F32(1.0), d, out=s.id[:n])
    np.copyto(idv, _F32(0.0), where=(d == 0))
    v = s.v[:n]
    np.multiply(xb, idv[:, None], out=v)
    np.add(v, _F32(8.5), out=v)
    q = s.q[:n]
    with np.errstate(invalid="ignore", over="ignore"):
        np.copyto(q, v, casting="unsafe")        # trunc toward zero; v is in [0, 16.5]
    inf_id = np.flatnonzero(~np.isfinite(idv))
    if inf_id.size:                              # 1/d overflowed (fp32-subnormal block): x86 gives 0
        q[inf_id] = 0
    np.minimum(q, s.c15[:n], out=q)             # (an array operand: numpy's scalar path is slow)
    # pack: codes are <= 15, so shifting whole 64-bit words by 4 moves each code into its own
    # byte's high nibble; words 0-1 of a block hold elements 0..15, words 2-3 elements 16..31
    q64 = q.view(np.uint64)
    hi = s.h64[:n]
    np.left_shift(q64[:, 2:], np.uint64(4), out=hi)
    np.bitwise_or(hi, q64[:, :2], out=hi)
    out[:, 2:] = hi.view(np.uint8)
    with np.errstate(over="ignore"):
        out.view(np.uint16)[:, 0] = d.astype(np.float16).view(np.uint16)   # d is not NaN here
    return -1


def quantize_q4_0(x, name: str = "tensor") -> np.ndarray:
    """Q4_0 bytes of x: uint8 of shape (*x.shape[:-1], x.shape[-1] // 32 * 18)."""
    return _quantize_blocks(x, name, "Q4_0", Q4_0_BYTES, _q4_0_blocks)


_Q4_LUT = np.stack([(np.arange(256) & 15) - 8, (np.arange(256) >> 4) - 8], axis=1).astype(_F32)
_Q4_LUT64 = _Q4_LUT.view(np.uint64).reshape(256)


def _dq4_0_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    d = np.ascontiguousarray(blocks[:, :2]).view(np.float16).astype(_F32)   # (n, 1)
    pairs = _gather(_Q4_LUT64, blocks[:, 2:]).view(_F32).reshape(n, 16, 2)  # [j] = (lo_j-8, hi_j-8)
    np.multiply(pairs.transpose(0, 2, 1), d[:, :, None], out=out.reshape(n, 2, 16))


def dequantize_q4_0(raw) -> np.ndarray:
    """float32 values of Q4_0 bytes (rows of 18-byte blocks): shape (..., row_bytes/18*32)."""
    return _dequantize_blocks(raw, Q4_0_BYTES, "Q4_0", _dq4_0_blocks)
