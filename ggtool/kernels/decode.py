"""The pieces GGML's block layouts are made of, read in numpy from whole arrays of rows at a time:
blocks of a row, an fp16 field of every block, nibbles split in halves, a fifth bit, the
K-quants' 6-bit scales and mins. The type records (``ggtool.qtypes``: each classic type's
``decode_rows``) decode their blocks with them; no compiled code, so ``ggtool.kernels`` stays light.

What a record decodes, the packers (``dot``, ``dot_k``) interleave across rows and the numpy twins
(``twins``) multiply; tests/test_twins.py checks the two agree through the dot products' bits."""

from __future__ import annotations

import numpy as np


def blocks(w: np.ndarray, nbytes: int) -> np.ndarray:
    """Rows (n, row bytes) as their blocks (n, blocks a row, nbytes)."""
    n = w.shape[0]
    return np.ascontiguousarray(w).reshape(n, w.shape[1] // nbytes, nbytes)


def f16_at(b: np.ndarray, at: int) -> np.ndarray:
    """The fp16 at byte `at` of every block as float32 (numpy's cast: exact, as tables.F16_TO_F32)."""
    return np.ascontiguousarray(b[:, :, at:at + 2]).view(np.float16)[:, :, 0].astype(np.float32)


def nibbles(nib: np.ndarray) -> np.ndarray:
    """Codes of 32-value blocks from 16 nibble bytes: value j is byte j's low nibble, j + 16 its high one."""
    return np.concatenate([nib & 15, nib >> 4], axis=2)


def five(nib: np.ndarray, qh: np.ndarray) -> np.ndarray:
    """Codes 0..31: the nibble codes | bit j of qh << 4 (qh: the block's 4 bytes of fifth bits, a
    little-endian u32: bit j is bit j % 8 of byte j // 8)."""
    codes = nibbles(nib)
    codes |= np.unpackbits(qh, axis=-1, bitorder="little") << np.uint8(4)
    return codes


def scales_k4(s: np.ndarray) -> tuple:
    """GGML's get_scale_min_k4 for j = 0..7 of the 12 bytes s (n, nb, 12), each repeated for the
    two sub-blocks of 16 it covers: (scales, mins), (n, nb, 16) int32."""
    s = s.astype(np.int32)
    sc = np.concatenate([s[:, :, 0:4] & 63, (s[:, :, 8:12] & 15) | ((s[:, :, 0:4] >> 6) << 4)], axis=2)
    mn = np.concatenate([s[:, :, 4:8] & 63, (s[:, :, 8:12] >> 4) | ((s[:, :, 4:8] >> 6) << 4)], axis=2)
    return np.repeat(sc, 2, axis=2), np.repeat(mn, 2, axis=2)
