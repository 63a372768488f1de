"""IQ3_XXS and IQ3_S (ggtool.qtypes.iq3): llama.cpp's bytes on golden blocks with and without
importance matrices, GGML's tables, dequantizer (and gguf-py's) and generic dot, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import iquants_golden as G
from ggtool import qtypes
from ggtool.qtypes import grids

IQ3 = ("iq3_xxs", "iq3_s")


@pytest.mark.parametrize("t,path", [(t, p) for t in IQ3 for p in G.paths(t)])
def test_bytes_are_llama_cpp(t, path):
    G.check_bytes(t, path)


@pytest.mark.parametrize("t", IQ3)
def test_quantizer_tables_are_ggml(t):
    G.check_tables(t)


@pytest.mark.parametrize("t", IQ3)
def test_dequantize_is_ggml_and_gguf_py(t):
    G.check_dequantize(t)
    G.check_gguf_py(t)


def _oracle(t: str):
    """ggml_vec_dot_iq3_*_q8_K_generic in numpy: exact integer bsum per block (a scale per 32
    values), then the float32 sum in order (IQ3_XXS times 0.25 at the end)."""
    grid = grids.IQ3XXS_GRID if t == "iq3_xxs" else grids.IQ3S_GRID
    g4 = grid.view(np.uint8).reshape(-1, 4).astype(np.int64)
    ks = grids.KSIGNS_IQ2XS.astype(np.int64)
    size = qtypes.get(t).type_size

    def dot(w, a):
        b = w.reshape(-1, size)
        nb = len(b)
        d_w = b[:, :2].copy().view(np.float16)[:, 0].astype(np.float32)
        d_a, q8, _ = G.q8_k(a)
        if t == "iq3_xxs":
            idx = b[:, 2:66].astype(np.int64).reshape(nb, 8, 4, 2)
            aux = b[:, 66:98].copy().view("<u4").astype(np.int64).reshape(nb, 8)
            signs = ks[(aux[:, :, None] >> (7 * np.arange(4))) & 127]
            ls = 2 * (aux >> 28) + 1
        else:
            qh = b[:, 66:74].astype(np.int64)[:, :, None]
            qs = b[:, 2:66].astype(np.int64).reshape(nb, 8, 4, 2)
            l4 = np.arange(4)
            idx = np.stack([qs[..., 0] | ((qh << (8 - 2 * l4)) & 256), qs[..., 1] | ((qh << (7 - 2 * l4)) & 256)], -1)
            signs = b[:, 74:106].astype(np.int64).reshape(nb, 8, 4)
            sc = b[:, 106:110].astype(np.int64)
            ls = np.stack([2 * (sc & 15) + 1, 2 * (sc >> 4) + 1], -1).reshape(nb, 8)
        mags = np.concatenate([g4[idx[..., 0]], g4[idx[..., 1]]], -1)                 # (nb, 8, 4, 8)
        neg = (signs[..., None] >> np.arange(8)) & 1
        vals = np.where(neg == 1, -mags, mags)
        sums = (vals.reshape(nb, 8, 32) * q8.reshape(nb, 8, 32)).sum(-1)
        bsum = (sums * ls).sum(-1)
        return G.generic_sum(d_w, d_a, bsum, 0.25 if t == "iq3_xxs" else 1.0)

    return dot


@pytest.mark.parametrize("t", IQ3)
def test_dot_is_ggml_generic(t):
    G.check_dot(t, _oracle(t))


@pytest.mark.parametrize("t", IQ3)
def test_dot_oracle_on_quantized_rows(t):
    rng = np.random.default_rng(23)
    rec = qtypes.get(t)
    x = (rng.standard_normal((3, 4096)) * 0.02).astype(np.float32)
    w = rec.quantize(x)
    a = G.random_q8_k(rng, 3 * 16).reshape(3, -1)
    oracle = _oracle(t)
    got = rec.mul_mat(w, a)
    for m in range(3):
        for r in range(3):
            assert got[m, r].view(np.uint32) == np.float32(oracle(w[r], a[m])).view(np.uint32)


@pytest.mark.parametrize("t", IQ3)
def test_bad_input_is_refused(t):
    G.check_errors(t)


@pytest.mark.parametrize("t", IQ3)
def test_threads_do_not_change_bytes(t):
    G.check_threads(t)


def test_reference_path_is_quantize_without_weights():
    """quantize_row_iq3_*_ref is the quantizer with no importance matrix (the weights are x*x)."""
    x = np.random.default_rng(4).standard_normal((2, 512)).astype(np.float32)
    for t in IQ3:
        rec = qtypes.get(t)
        assert np.array_equal(rec.quantize_ref(x), rec.quantize(x))
        assert not np.array_equal(rec.quantize(x, np.full(512, 1.0, np.float32)), rec.quantize(x))


def test_grids_are_the_quantizers_points():
    """IQ3's point lists (ggml-quants.c) are the dequantizers' grids: level l is 2l+1 (IQ3_S) or
    the magnitudes 4, 12, ..., 52, 62 (IQ3_XXS)."""
    mags = {"xxs": np.array([4, 12, 20, 28, 36, 44, 52, 62]), "s": 2 * np.arange(8) + 1}
    for kgrid, grid, m in ((grids.KGRID_3BIT_256, grids.IQ3XXS_GRID, mags["xxs"]),
                           (grids.KGRID_3BIT_512, grids.IQ3S_GRID, mags["s"])):
        levels = (kgrid[:, None].astype(np.int64) >> (3 * np.arange(4))) & 7
        assert np.array_equal(m[levels], grid.view(np.uint8).reshape(-1, 4))
