"""IQ2_XXS, IQ2_XS and IQ2_S (ggtool.qtypes.iq2): llama.cpp's bytes on golden blocks with and without
importance matrices, GGML's tables, dequantizer (and gguf-py's) and generic dot, bit for bit; and the
registry's records complete."""

from __future__ import annotations

import numpy as np
import pytest

import iquants_golden as G
from ggtool import qtypes
from ggtool import types as T
from ggtool.qtypes import grids

IQ2 = ("iq2_xxs", "iq2_xs", "iq2_s")


@pytest.mark.parametrize("t,path", [(t, p) for t in IQ2 for p in G.paths(t)])
def test_bytes_are_llama_cpp(t, path):
    G.check_bytes(t, path)


@pytest.mark.parametrize("t", IQ2)
def test_quantizer_tables_are_ggml(t):
    G.check_tables(t)


@pytest.mark.parametrize("t", IQ2)
def test_dequantize_is_ggml_and_gguf_py(t):
    G.check_dequantize(t)
    G.check_gguf_py(t)


def _signed(gridrows: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """int64 (..., 8): grid magnitudes with bit j of signs (...,) as a minus sign."""
    neg = (signs[..., None].astype(np.int64) >> np.arange(8)) & 1
    return np.where(neg == 1, -gridrows, gridrows)


def _oracle(t: str):
    """GGML's generic dot (ggml_vec_dot_iq2_*_q8_K_generic) in numpy: per block an exact integer
    bsum = sum over 16- or 32-value groups of scale * (values . q8), then the float32 sum in order."""
    grid = {"iq2_xxs": grids.IQ2XXS_GRID, "iq2_xs": grids.IQ2XS_GRID, "iq2_s": grids.IQ2S_GRID}[t]
    g8 = grid.view(np.uint8).reshape(-1, 8).astype(np.int64)
    ks = grids.KSIGNS_IQ2XS.astype(np.int64)
    size = qtypes.get(t).type_size

    def dot(w, a):
        b = w.reshape(-1, size)
        nb = len(b)
        d_w = b[:, :2].copy().view(np.float16)[:, 0].astype(np.float32)
        d_a, q8, _ = G.q8_k(a)
        if t == "iq2_xxs":
            q = b[:, 2:66].copy().view("<u4").astype(np.int64).reshape(nb, 8, 2)
            idx = b[:, 2:66].reshape(nb, 8, 8)[:, :, :4].astype(np.int64)
            signs = ks[(q[:, :, 1:2] >> (7 * np.arange(4))) & 127]
            ls = np.repeat(2 * (q[:, :, 1] >> 28) + 1, 4, axis=1)                   # (nb, 32 groups of 8)
        elif t == "iq2_xs":
            q = b[:, 2:66].copy().view("<u2").astype(np.int64).reshape(nb, 32)
            idx, signs = q & 511, ks[q >> 9]
            sc = b[:, 66:74].astype(np.int64)
            ls = np.repeat(np.stack([2 * (sc & 15) + 1, 2 * (sc >> 4) + 1], -1).reshape(nb, 16), 2, axis=1)
        else:
            qh = b[:, 66:74].astype(np.int64)
            idx = b[:, 2:34].astype(np.int64).reshape(nb, 8, 4) | ((qh[:, :, None] << (8 - 2 * np.arange(4))) & 0x300)
            signs = b[:, 34:66].astype(np.int64)
            sc = b[:, 74:82].astype(np.int64)
            ls = np.repeat(np.stack([2 * (sc & 15) + 1, 2 * (sc >> 4) + 1], -1).reshape(nb, 16), 2, axis=1)
        vals = _signed(g8[idx.reshape(nb, 32)], signs.reshape(nb, 32))                # (nb, 32, 8)
        sums = (vals * q8.reshape(nb, 32, 8)).sum(-1)                                  # per group of 8
        bsum = (sums * ls.reshape(nb, 32)).sum(-1)
        return G.generic_sum(d_w, d_a, bsum, 0.125)

    return dot


@pytest.mark.parametrize("t", IQ2)
def test_dot_is_ggml_generic(t):
    G.check_dot(t, _oracle(t))


@pytest.mark.parametrize("t", IQ2)
def test_dot_oracle_on_quantized_rows(t):
    """Rows quantized from real-looking data (scales spread over the block), 16 blocks a row."""
    rng = np.random.default_rng(21)
    rec = qtypes.get(t)
    x = (rng.standard_normal((3, 4096)) * 0.02).astype(np.float32)
    w = rec.quantize(x, (10.0 ** rng.uniform(-1, 1, 4096)).astype(np.float32))
    a = G.random_q8_k(rng, 3 * 16).reshape(3, -1)
    oracle = _oracle(t)
    got = rec.mul_mat(w, a)
    for m in range(3):
        for r in range(3):
            assert got[m, r].view(np.uint32) == np.float32(oracle(w[r], a[m])).view(np.uint32)


@pytest.mark.parametrize("t", IQ2)
def test_bad_input_is_refused(t):
    G.check_errors(t)


@pytest.mark.parametrize("t", IQ2)
def test_threads_do_not_change_bytes(t):
    G.check_threads(t)


def test_grids_are_the_quantizers_points():
    """The dequantizers' grids (ggml-common.h) and the quantizers' point lists (ggml-quants.c) are
    the same points: level 0, 1, 2 of a point is magnitude 8, 25, 43."""
    for kgrid, grid in ((grids.KGRID_2BIT_256, grids.IQ2XXS_GRID), (grids.KGRID_2BIT_512, grids.IQ2XS_GRID),
                        (grids.KGRID_2BIT_1024, grids.IQ2S_GRID)):
        levels = (kgrid[:, None].astype(np.int64) >> (2 * np.arange(8))) & 3
        assert np.array_equal(np.array([8, 25, 43])[levels], grid.view(np.uint8).reshape(-1, 8))
    assert np.array_equal(grids.KSIGNS_IQ2XS & 127, np.arange(128))
    assert all(bin(int(s)).count("1") % 2 == 0 for s in grids.KSIGNS_IQ2XS)


# -- the registry ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("t", sorted(qtypes.REGISTRY, key=int), ids=lambda t: T.type_name(t))
def test_every_record_is_complete(t):
    """Each record sets every field of QType.FIELDS itself (not the base's placeholder), with the
    sizes of types' table; its kernels and tables load."""
    rec = qtypes.REGISTRY[t]
    assert rec.ggml_type == t and rec.name == T.type_name(t)
    assert (rec.block_size, rec.type_size) == (T.block_size(t), T.type_size(t))
    assert rec.vec_dot_type == T.vec_dot_type(t)
    for field in qtypes.FIELDS:
        owner = next(c for c in rec.__mro__ if field in vars(c))
        assert owner is not qtypes.QType, f"{rec.name} does not set {field}"
    assert isinstance(rec.needs_imatrix, bool) and isinstance(rec.ggml_requires_imatrix, bool)
    assert rec.needs_imatrix or not rec.ggml_requires_imatrix
    assert isinstance(rec.llama_cpp, dict)
    g = rec.grids()                # {} for a type with no tables (TQ1_0, TQ2_0: trits are arithmetic)
    assert isinstance(g, dict) and all(isinstance(v, np.ndarray) for v in g.values())
    assert callable(rec.quantize_kernel) and callable(rec.dot_kernel) and callable(rec.mul_mat_kernel)
    assert rec.quantize_ref is None or callable(rec.quantize_ref)
    assert isinstance(rec.quantizer_tables(), tuple) and isinstance(rec.dot_args(), tuple)
    assert (rec.k_form is None) == (rec.dot_final is None)
    assert rec.k_form is None or (callable(rec.k_form) and isinstance(rec.dot_final, np.float32))
    if rec.packed_form is not None:  # a classic type: its decoded blocks take a packed form and a twin
        from ggtool.kernels import dot

        for field in rec.CLASSIC_FIELDS:
            owner = next((c for c in rec.__mro__ if field in vars(c)), None)
            assert owner is not None and owner.__name__ != "ClassicType", f"{rec.name} does not set {field}"
        assert rec.packed_form in dot.FORMS and rec.twin_decode_seconds > 0
        assert "decode_rows" in vars(rec), f"{rec.name} decodes with another type's decode_rows"
    # the compiled runner's x86 kernels: names nodes_mm and kernels.x86 have, only for a type with
    # llama.cpp's x86 forms, and a repacked one only where a build repacks the type
    from ggtool.kernels import nodes_mm, x86

    for form in (rec.runner_x86, rec.runner_x86_repacked):
        if form is not None:
            kernel, kind = form
            assert kernel.startswith("X_") and isinstance(getattr(nodes_mm, kernel), int), rec.name
            assert kind is None or isinstance(getattr(x86, kind), int), rec.name
            assert rec.llama_cpp, f"{rec.name} has a runner kernel but no llama.cpp forms"
    assert rec.runner_x86_repacked is None or rec.x86_repacked, rec.name


def test_registry_lookup():
    assert qtypes.get("IQ2_XXS") is qtypes.get(T.GGMLType.IQ2_XXS) is qtypes.get(16)
    assert qtypes.get("q4_K") is qtypes.get(T.GGMLType.Q4_K)        # every block type has one
    with pytest.raises(KeyError, match="no record for f16"):
        qtypes.get("f16")
    with pytest.raises(TypeError, match="iq2_xs has two records"):
        class Again(qtypes.QType, ggml_type=T.GGMLType.IQ2_XS):
            pass
