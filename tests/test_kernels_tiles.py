"""The vector tiles of the quantized dots (ggtool.kernels.simd): MT activation rows at a time and 16
weight rows a vector, with tails of both. Every element must come out as the scalar reference
computes it, whichever tile body (1..MT rows) and vector lane computes it."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from oracle_matmul import mul_mat_exact, random_blocks
from test_kernels_dot_k import BLOCK, _acts, _dequantized_acts

from ggtool import qtypes
from ggtool import quant as Q
from ggtool import types as T
from ggtool.kernels import dot, simd

M_TAILS = [1, 2, 3, 4, 5, 7, 8, 9, 63, 65]
ALL = ["q4_0", "q8_0", *BLOCK]


def _w(t: str, n: int, k: int, seed: int) -> np.ndarray:
    if t in ("q4_0", "q8_0"):
        return Q.quantize(np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32), t)
    return random_blocks(t, n, k, seed)


def _a(t: str, m: int, k: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)
    return Q.quantize_q8_0_cpu(x) if t in ("q4_0", "q8_0") else _acts(t, x)


def _dot(t: str, w: np.ndarray, a: np.ndarray) -> np.ndarray:
    out = np.full((a.shape[0], w.shape[0]), np.nan, np.float32)
    record = qtypes.get(t)
    record.mul_mat_packed_into(record.pack(w), a, out)
    return out


def test_tile_constants_match():
    assert dot.GROUP == simd.GROUP and simd.GROUP % simd.L == 0 and simd.MT >= 2


@pytest.mark.parametrize("wtype", ["q4_0", "q8_0"])
@pytest.mark.parametrize("m", M_TAILS)
@pytest.mark.parametrize("n", [1, 15, 17, 130, 257])
def test_q4_0_q8_0_every_tile_is_ggml_scalar_reference(wtype, m, n):
    w, a = _w(wtype, n, 96, n + m), _a(wtype, m, 96, m)
    assert _dot(wtype, w, a).tobytes() == mul_mat_exact(w, wtype, a).tobytes()


@pytest.mark.parametrize("t", ALL)
def test_rows_of_a_tile_equal_rows_alone(t):
    """Row m of an M-row product (computed in an MT-row tile or a tail tile) is the 1-row product of
    row m, bit for bit, for M of every remainder modulo MT."""
    k = 512
    w = _w(t, 40, k, 1)
    a = _a(t, 65, k, 2)
    alone = np.concatenate([_dot(t, w, a[i:i + 1]) for i in range(65)])
    for m in M_TAILS:
        assert _dot(t, w, a[:m]).tobytes() == alone[:m].tobytes(), f"M={m}"


@pytest.mark.parametrize("t", ALL)
def test_weight_row_position_does_not_matter(t):
    """A weight row gives the same bits in any lane, vector and row group (tail groups included)."""
    k = 256
    w = _w(t, 150, k, 3)
    a = _a(t, 6, k, 4)
    want = _dot(t, w, a)
    for shift in (1, 16 + 3, 128 - 5):
        pad = _w(t, shift, k, 5)
        got = _dot(t, np.concatenate([pad, w]), a)
        assert got[:, shift:].tobytes() == want.tobytes(), f"shifted by {shift}"


@pytest.mark.parametrize("t", BLOCK)
def test_extreme_activation_codes_match_float64_reference(t):
    """Activation codes all -128 or all 127 (with bsums to match) against weights of random codes:
    the integer parts must stay exact at their largest."""
    k, n = 512, 33
    w = random_blocks(t, n, k, 6)
    x = np.random.default_rng(7).standard_normal((4, k)).astype(np.float32)
    a = _acts(t, x).copy()
    if t in ("q5_0", "q4_1", "q5_1"):
        nbytes = 34 if t == "q5_0" else 36
        blk = a.reshape(4, -1, nbytes)
        blk[0::2, :, nbytes - 32:] = 0x80
        blk[1::2, :, nbytes - 32:] = 0x7F
        if nbytes == 36:       # Q8_1's s = d * sum(codes), as fp16
            d = blk[..., :2].copy().view(np.float16).astype(np.float32)[..., 0]
            s = d * blk[..., 4:].view(np.int8).astype(np.float32).sum(axis=-1)
            blk[..., 2:4] = s.astype(np.float16)[..., None].view(np.uint8)
    else:
        blk = a.reshape(4, -1, 292)
        blk[0::2, :, 4:260] = 0x80
        blk[1::2, :, 4:260] = 0x7F
        bsum = np.where(np.arange(4)[:, None, None] % 2 == 0, -128 * 16, 127 * 16).astype(np.int16)
        blk[:, :, 260:] = np.broadcast_to(bsum, (4, blk.shape[1], 16)).copy().view(np.uint8).reshape(4, -1, 32)
    got = Q.mul_mat_quantized(w, t, a)
    ref = _dequantized_acts(t, a) @ gguf.quants.dequantize(w, T.parse_type(t)).astype(np.float64).T
    tol = 1e-3 if t in ("q4_1", "q5_1") else 2e-6
    assert np.abs(got - ref).max() <= tol * np.abs(ref).max()
