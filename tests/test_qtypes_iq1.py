"""IQ1_S and IQ1_M (ggtool.qtypes.iq1): llama.cpp's bytes on golden blocks with and without
importance matrices (and its aborts refused), the quantizers' neighbour lists, GGML's dequantizer
(and gguf-py's) and generic dot, bit for bit; the records complete."""

from __future__ import annotations

import numpy as np
import pytest

import iquants_small_golden as G
from ggtool import qtypes
from ggtool.errors import QuantizationError
from ggtool.qtypes import iq1

IQ1 = ("iq1_s", "iq1_m")
F32 = np.float32


@pytest.mark.parametrize("t,path", [(t, p) for t in IQ1 for p in G.paths(t)])
def test_bytes_are_llama_cpp(t, path):
    G.check_bytes(t, path)


def test_golden_covers_an_abort():
    """The golden rows hold blocks llama.cpp aborts on (IQ1_M's NaN scale), so the refusal is tested."""
    g = G.golden()
    assert g["iq1_m_aborts"].sum() >= 1 and g["iq1_m_w_aborts"].sum() >= 1


@pytest.mark.parametrize("t", IQ1)
def test_dequantize_is_ggml_and_gguf_py(t):
    G.check_dequantize(t)


def test_neighbour_tables_are_ggmls():
    """The quantizers' map and neighbour lists are iq2xs_init_impl's for IQ1 (golden digest of GGML's
    own tables, every code word, on the grid or off it), shared and read-only."""
    _, kmap, nb = iq1.quantizer_tables()
    assert G.sha256(np.concatenate([kmap.view(np.uint8), nb.view(np.uint8)])) == str(G.golden()["iq1_tables_sha256"])
    for a in iq1.quantizer_tables():
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 0


def test_grid_is_gguf_pys():
    import gguf

    gguf.quants.IQ1_S.init_grid()
    assert np.array_equal(iq1.GRID_VALUES.astype(F32), gguf.quants.IQ1_S.grid.reshape(2048, 8))


def test_neighbour_lists_are_ggml():
    """iq2xs_init_impl's lists for IQ1 (numpy, from its description): for a code word of 8 values in
    0..2 that is not on the grid, the grid points at its 3 smallest squared distances (positions
    2l + 1), ordered by distance, then index; a word on the grid maps to its index."""
    grid, kmap, nb = iq1.quantizer_tables()
    words = (np.arange(3 ** 8)[:, None] // 3 ** np.arange(8)) % 3          # every word of values 0..2
    u = (words << (2 * np.arange(8))).sum(1)
    on = kmap[u] >= 0
    assert on.sum() == 2048 and np.array_equal(np.sort(kmap[u[on]]), np.arange(2048))
    assert np.array_equal(grid[kmap[u[on]]], words[on])
    rng = np.random.default_rng(1)
    for w in rng.choice(np.flatnonzero(~on), 300, replace=False):
        d2 = (((2 * grid + 1) - (2 * words[w] + 1)) ** 2).sum(1)
        keep = np.isin(d2, np.unique(d2)[:3])
        want = np.lexsort((np.arange(2048), d2))
        want = want[keep[want]]
        o = -kmap[u[w]] - 1
        assert nb[o] == len(want) and np.array_equal(nb[o + 1:o + 1 + nb[o]], want)


def test_iq1_s_needs_an_importance_matrix_iq1_m_does_not():
    x = G.golden()["x"][:4]
    with pytest.raises(QuantizationError, match="iq1_s needs an importance matrix"):
        qtypes.get("iq1_s").quantize(x)
    assert np.array_equal(qtypes.get("iq1_m").quantize(x), G.golden()["iq1_m"][:4])
    assert qtypes.get("iq1_s").quantize_ref is None and qtypes.get("iq1_m").quantize_ref is None


# -- the dots: numpy oracles of ggml_vec_dot_iq1_{s,m}_q8_K_generic ----------------------------------------
def oracle_iq1_s(w, a):
    dy, q8, bsums = G.q8_k(a)
    sumf = F32(0)
    for i, b in enumerate(w.reshape(-1, 50)):
        qh = np.ascontiguousarray(b[34:50]).view("<u2").astype(np.int64)
        sumi = sumi1 = 0
        for ib in range(8):
            ls = 2 * ((qh[ib] >> 12) & 7) + 1
            delta = -1 if qh[ib] & 0x8000 else 1
            lsum = 0
            for l in range(4):
                idx = int(b[2 + 4 * ib + l]) | (((int(qh[ib]) >> (3 * l)) & 7) << 8)
                lsum += int((q8[i, 32 * ib + 8 * l:32 * ib + 8 * l + 8] * iq1.GRID_VALUES[idx]).sum())
            sumi += int(ls) * lsum
            sumi1 += int(ls) * delta * int(bsums[i, 2 * ib] + bsums[i, 2 * ib + 1])
        d = F32(G.f16(b[0:2]) * dy[i])
        sumf = F32(sumf + F32(d * F32(F32(sumi) + F32(F32(0.125) * F32(sumi1)))))
    return sumf


def oracle_iq1_m(w, a):
    dy, q8, _ = G.q8_k(a)
    sumf = F32(0)
    for i, b in enumerate(w.reshape(-1, 56)):
        sc = np.ascontiguousarray(b[48:56]).view("<u2").astype(np.int64)
        s16 = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000)
        d = np.array([s16], np.uint16).view(np.float16)[0]
        sumi1 = sumi2 = 0
        for ib in range(8):
            qh = [int(b[32 + 2 * ib]), int(b[33 + 2 * ib])]
            s1, s2 = [0, 0], [0, 0]
            for l in range(4):
                h = qh[l // 2]
                idx = int(b[4 * ib + l]) | ((h << (8 - 4 * (l % 2))) & 0x700)
                delta = -1 if h & (0x08 if l % 2 == 0 else 0x80) else 1
                q = q8[i, 32 * ib + 8 * l:32 * ib + 8 * l + 8]
                s1[l // 2] += int((q * iq1.GRID_VALUES[idx]).sum())
                s2[l // 2] += int(q.sum()) * delta
            ls1 = 2 * ((sc[ib // 2] >> (6 * (ib % 2))) & 7) + 1
            ls2 = 2 * ((sc[ib // 2] >> (6 * (ib % 2) + 3)) & 7) + 1
            sumi1 += s1[0] * int(ls1) + s1[1] * int(ls2)
            sumi2 += s2[0] * int(ls1) + s2[1] * int(ls2)
        sumf = F32(sumf + F32(F32(F32(d) * dy[i]) * F32(F32(sumi1) + F32(F32(0.125) * F32(sumi2)))))
    return sumf


@pytest.mark.parametrize("t,oracle", [("iq1_s", oracle_iq1_s), ("iq1_m", oracle_iq1_m)])
def test_dot_is_ggml_generic(t, oracle):
    G.check_dot(t, oracle)


@pytest.mark.parametrize("t", IQ1)
def test_bad_input_is_refused(t):
    G.check_errors(t)


@pytest.mark.parametrize("t", IQ1)
def test_threads_do_not_change_bytes(t):
    G.check_threads(t)
