"""Native dequantizers for Q5_0, Q4_K and Q6_K (much faster than gguf-py's, and bit-identical to
its float32 arithmetic); other block types fall back to gguf-py in ``generic.dequantize``."""

from __future__ import annotations

import numpy as np

from .. import types as T
from .blocks import _F32, CHUNK_BLOCKS, QK, _gather, _raw_blocks
from .threads import _run_chunks

_NIB_LUT64 = np.stack([np.arange(256) & 15, np.arange(256) >> 4], axis=1).astype(_F32).view(np.uint64).reshape(256)
# byte -> its four 2-bit fields (shifts 0, 2, 4, 6) times 16, as float32
_Q6H_LUT = (((np.arange(256)[:, None] >> np.array([0, 2, 4, 6])) & 3) * 16).astype(_F32)
_Q6H_LUT128 = _Q6H_LUT.view(np.complex128).reshape(256)      # 16 bytes per entry, for a 1-D take


def _f16(col: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(col).view(np.float16).astype(_F32)


def _dq5_0_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    """Q5_0 (22 bytes: d, qh u32, qs[16]): x = (nibble | bit<<4) - 16, times d (all exact)."""
    n = blocks.shape[0]
    d = _f16(blocks[:, :2])                                              # (n, 1)
    bits = np.unpackbits(blocks[:, 2:6], axis=1, bitorder="little")     # (n, 32): element j's bit
    pairs = _gather(_NIB_LUT64, blocks[:, 6:]).view(_F32).reshape(n, 16, 2)   # (lo, hi) nibbles
    o3 = out.reshape(n, 2, 16)
    np.multiply(bits.reshape(n, 2, 16), _F32(16), out=o3)
    np.add(o3, pairs.transpose(0, 2, 1), out=o3)
    np.subtract(out, _F32(16), out=out)
    np.multiply(out, d, out=out)


def _dq4_k_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    """Q4_K (144 bytes): x = (d*sc) * q - (dmin*m) in float32, as gguf-py."""
    from gguf.quants import Q4_K as _G
    n = blocks.shape[0]
    d = _f16(blocks[:, 0:2])
    dmin = _f16(blocks[:, 2:4])
    sc, m = _G.get_scale_min(blocks[:, 4:16])
    a = (d * sc.astype(_F32))[:, :, None]                               # (n, 8, 1)
    b = (dmin * m.astype(_F32))[:, :, None]
    pairs = _gather(_NIB_LUT64, blocks[:, 16:]).view(_F32).reshape(n, 4, 32, 2)
    o3 = out.reshape(n, 4, 2, 32)
    np.multiply(pairs.transpose(0, 1, 3, 2), a.reshape(n, 4, 2, 1), out=o3)
    np.subtract(o3, b.reshape(n, 4, 2, 1), out=o3)


def _dq6_k_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    """Q6_K (210 bytes): x = (d*scale) * (ql | qh<<4 - 32) in float32, as gguf-py."""
    n = blocks.shape[0]
    scales = blocks[:, 192:208].view(np.int8).astype(_F32)
    d = _f16(blocks[:, 208:210])
    ds = (d * scales)                                                    # (n, 16)
    lo = _gather(_NIB_LUT64, blocks[:, :128]).view(_F32).reshape(n, 2, 64, 2)        # ql nibbles
    hi = _gather(_Q6H_LUT128, blocks[:, 128:192], "g1").view(_F32).reshape(n, 2, 32, 4)  # qh * 16
    o = out.reshape(n, 2, 2, 64)
    np.copyto(o, lo.transpose(0, 1, 3, 2))
    oh = out.reshape(n, 2, 4, 32)
    np.add(oh, hi.transpose(0, 1, 3, 2), out=oh)
    np.subtract(out, _F32(32), out=out)
    o16 = out.reshape(n, 16, 16)
    np.multiply(o16, ds[:, :, None], out=o16)


_NATIVE_DQ = {  # type -> (bytes per block, values per block, kernel)
    T.GGMLType.Q5_0: (22, 32, _dq5_0_blocks),
    T.GGMLType.Q4_K: (144, 256, _dq4_k_blocks),
    T.GGMLType.Q6_K: (210, 256, _dq6_k_blocks),
}


def _dequantize_native(raw, t) -> np.ndarray:
    nbytes, nval, kernel = _NATIVE_DQ[t]
    raw = _raw_blocks(raw, nbytes, T.type_name(t))
    shape = (*raw.shape[:-1], raw.shape[-1] // nbytes * nval)
    blocks = np.ascontiguousarray(raw).reshape(-1, nbytes)
    out = np.empty((blocks.shape[0], nval), _F32)
    step = max(1, CHUNK_BLOCKS * QK // nval)

    def work(b0, b1):
        with np.errstate(all="ignore"):
            kernel(blocks[b0:b1], out[b0:b1])

    _run_chunks(work, blocks.shape[0], step)
    return out.reshape(shape)
