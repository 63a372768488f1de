"""Weight rows of GGML's block types decoded in numpy, whole arrays at a time: the codes of every
block in value order, its scales (and mins, for K-quants per sub-block of 16). The numpy twins of
the dot products (``twins``) multiply these; no compiled code, so ``ggtool.kernels`` stays light.

What the compiled packers (``dot``, ``dot_k``) store is these values interleaved across rows;
tests/test_twins.py checks the two agree through the dot products' bits."""

from __future__ import annotations

import numpy as np

from .. import types as T

def _blocks(w: np.ndarray, nbytes: int) -> np.ndarray:
    n = w.shape[0]
    return np.ascontiguousarray(w).reshape(n, w.shape[1] // nbytes, nbytes)


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The fp16 at byte `at` of every block as float32 (numpy's cast: exact, as tables.F16_TO_F32)."""
    return np.ascontiguousarray(b[:, :, at:at + 2]).view(np.float16)[:, :, 0].astype(np.float32)


def _nibbles(nib: np.ndarray) -> np.ndarray:
    """Codes of 32-value blocks from 16 nibble bytes: value j is byte j's low nibble, j + 16 its high one."""
    return np.concatenate([nib & 15, nib >> 4], axis=2)


def _five(nib: np.ndarray, qh: np.ndarray) -> np.ndarray:
    """Codes 0..31: the nibble codes | bit j of qh << 4."""
    bits = (qh[:, :, None] >> np.arange(32, dtype=np.uint32)) & 1
    return _nibbles(nib) | (bits << 4).astype(np.uint8)


def _u32(b: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, :, at:at + 4]).view("<u4")[:, :, 0].astype(np.uint32)


# -- decoders: rows -> codes in value order, scales (and mins) --------------------------------------
def decode_q4_0(w):
    b = _blocks(w, 18)
    return (_nibbles(b[:, :, 2:18]).view(np.int8) - np.int8(8)), _f16(b, 0), None


def decode_q8_0(w):
    b = _blocks(w, 34)
    return b[:, :, 2:34].view(np.int8), _f16(b, 0), None


def decode_q5_0(w):
    b = _blocks(w, 22)
    return (_five(b[:, :, 6:22], _u32(b, 2)).view(np.int8) - np.int8(16)), _f16(b, 0), None


def decode_q4_1(w):
    b = _blocks(w, 20)
    return _nibbles(b[:, :, 4:20]).view(np.int8), _f16(b, 0), _f16(b, 2)


def decode_q5_1(w):
    b = _blocks(w, 24)
    return _five(b[:, :, 8:24], _u32(b, 4)).view(np.int8), _f16(b, 0), _f16(b, 2)


def _scales_k4(s: np.ndarray) -> tuple:
    """GGML's get_scale_min_k4 for j = 0..7 of the 12 bytes s (n, nb, 12), each repeated for the
    two sub-blocks of 16 it covers: (scales, mins), (n, nb, 16) int32."""
    s = s.astype(np.int32)
    sc = np.concatenate([s[:, :, 0:4] & 63, (s[:, :, 8:12] & 15) | ((s[:, :, 0:4] >> 6) << 4)], axis=2)
    mn = np.concatenate([s[:, :, 4:8] & 63, (s[:, :, 8:12] >> 4) | ((s[:, :, 4:8] >> 6) << 4)], axis=2)
    return np.repeat(sc, 2, axis=2), np.repeat(mn, 2, axis=2)


def _decode_q45_k(w, five: bool):
    nbytes, q0 = (176, 48) if five else (144, 16)
    b = _blocks(w, nbytes)
    q = b[:, :, q0:q0 + 128].reshape(*b.shape[:2], 4, 32)                   # [c][k]
    codes = np.stack([q & 15, q >> 4], axis=3)                                # [c][half][k]: value 64c + 32half + k
    if five:
        h = b[:, :, 16:48]
        shifts = np.arange(8, dtype=np.uint8).reshape(4, 2, 1)               # bit 2c + half
        codes = codes | (((h[:, :, None, None, :] >> shifts) & 1) << 4)
    sc, mn = _scales_k4(b[:, :, 4:16])
    return codes.reshape(*b.shape[:2], 256).view(np.int8), sc, mn, _f16(b, 0), _f16(b, 2)


def decode_q4_k(w):
    """Q4_K (d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles)."""
    return _decode_q45_k(w, False)


def decode_q5_k(w):
    """Q5_K: Q4_K with qh[32] before the nibbles, a fifth bit per value."""
    return _decode_q45_k(w, True)


def decode_q6_k(w):
    """Q6_K (ql[128], qh[64], int8 scales[16], d): codes (ql nibble | qh 2 bits << 4) - 32."""
    b = _blocks(w, 210)
    n, nb = b.shape[:2]
    ql = b[:, :, 0:128].reshape(n, nb, 2, 2, 32)                            # [half][g4 & 1][k]
    qh = b[:, :, 128:192].reshape(n, nb, 2, 32)                             # [half][k]
    codes = np.empty((n, nb, 2, 4, 32), np.uint8)                           # [half][g4][k]
    for g4 in range(4):     # low nibble of ql[g4 & 1] (g4 < 2) or its high one, and bits 2*g4.. of qh
        lo = ql[:, :, :, g4 & 1] & np.uint8(15) if g4 < 2 else ql[:, :, :, g4 & 1] >> np.uint8(4)
        np.bitwise_or(lo, ((qh >> np.uint8(2 * g4)) & np.uint8(3)) << np.uint8(4), out=codes[:, :, :, g4])
    codes -= np.uint8(32)                                                   # 0..63 - 32, as int8 below
    codes = codes.view(np.int8).reshape(n, nb, 256)
    sc = b[:, :, 192:208].view(np.int8).astype(np.int32)
    return codes, sc, np.zeros((n, nb, 16), np.int32), _f16(b, 208), np.zeros((n, nb), np.float32)


def decode_q2_k(w):
    """Q2_K (scales[16]: 4-bit scale | 4-bit min << 4, qs[64] of 2-bit codes, d, dmin)."""
    b = _blocks(w, 84)
    n, nb = b.shape[:2]
    qs = b[:, :, 16:80].reshape(n, nb, 2, 1, 32)
    j = np.arange(4, dtype=np.uint8).reshape(4, 1)
    codes = ((qs >> (2 * j)) & 3).reshape(n, nb, 256).view(np.int8)
    s = b[:, :, 0:16].astype(np.int32)
    return codes, s & 15, s >> 4, _f16(b, 80), _f16(b, 82)


def decode_q3_k(w):
    """Q3_K (hmask[32], qs[64] of 2-bit codes, 12 bytes of 6-bit scales, d): codes are the 2 bits
    minus 4 where the hmask bit is clear; scales the 6 bits minus 32."""
    b = _blocks(w, 110)
    n, nb = b.shape[:2]
    qs = b[:, :, 32:96].reshape(n, nb, 2, 1, 32).astype(np.int16)
    hm = b[:, :, 0:32].reshape(n, nb, 1, 1, 32).astype(np.int16)
    j = np.arange(4, dtype=np.int16).reshape(4, 1)
    half = np.arange(2, dtype=np.int16).reshape(2, 1, 1)
    h = (hm >> (4 * half + j)) & 1
    codes = (((qs >> (2 * j)) & 3) - 4 * (1 - h)).astype(np.int8).reshape(n, nb, 256)
    s = b[:, :, 96:108].astype(np.int32)
    lo, hi, top = s[:, :, 0:4], s[:, :, 4:8], s[:, :, 8:12]
    sc = np.concatenate([(lo & 15) | ((top & 3) << 4), (hi & 15) | (((top >> 2) & 3) << 4),
                         (lo >> 4) | (((top >> 4) & 3) << 4), (hi >> 4) | (((top >> 6) & 3) << 4)], axis=2) - 32
    return codes, sc, np.zeros((n, nb, 16), np.int32), _f16(b, 108), np.zeros((n, nb), np.float32)


DECODERS = {T.Q4_0: decode_q4_0, T.Q8_0: decode_q8_0, T.GGMLType.Q5_0: decode_q5_0,
            T.GGMLType.Q4_1: decode_q4_1, T.GGMLType.Q5_1: decode_q5_1,
            T.GGMLType.Q2_K: decode_q2_k, T.GGMLType.Q3_K: decode_q3_k, T.GGMLType.Q4_K: decode_q4_k,
            T.GGMLType.Q5_K: decode_q5_k, T.GGMLType.Q6_K: decode_q6_k}
MIN_TYPES = (T.GGMLType.Q4_1, T.GGMLType.Q5_1)        # x Q8_1: d * code + m
K_TYPES = (T.GGMLType.Q2_K, T.GGMLType.Q3_K, T.GGMLType.Q4_K, T.GGMLType.Q5_K, T.GGMLType.Q6_K)
