"""IQ4_XS (ggtool.qtypes.iq4xs): llama.cpp's bytes on golden blocks with and without importance
matrices, GGML's dequantizer (and gguf-py's) and generic dot, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import iquants_small_golden as G
from ggtool import qtypes
from ggtool.kernels.tables import KVALUES_IQ4NL

F32 = np.float32


@pytest.mark.parametrize("path", G.paths("iq4_xs"))
def test_bytes_are_llama_cpp(path):
    G.check_bytes("iq4_xs", path)


def test_dequantize_is_ggml_and_gguf_py():
    G.check_dequantize("iq4_xs")


def test_reference_row_is_quantize_without_weights():
    x = G.golden()["x"][:40]
    rec = qtypes.get("iq4_xs")
    assert np.array_equal(rec.quantize_ref(x), G.golden()["iq4_xs"][:40])


def test_reuses_iq4_nl_search_and_table():
    """IQ4_XS shares IQ4_NL's levels and per-32 search (qtypes._iq4nl_quantize), not a copy."""
    from ggtool.qtypes import _iq4nl_quantize as legacy
    from ggtool.qtypes import _lowbit_kernels as k

    assert k.iq4_nl_block is legacy.iq4_nl_block and k.best_index is legacy.best_index
    assert qtypes.get("iq4_xs").grids()["kvalues_iq4nl"] is KVALUES_IQ4NL


def oracle_iq4_xs(w, a):
    """ggml_vec_dot_iq4_xs_q8_K_generic in numpy: per 32 values sumf += (d4d8 * (ls - 32)) * sumi."""
    dy, q8, _ = G.q8_k(a)
    kv = KVALUES_IQ4NL.astype(np.int64)
    sumf = F32(0)
    for i, b in enumerate(w.reshape(-1, 136)):
        d4d8 = F32(G.f16(b[0:2]) * dy[i])
        h = int(b[2]) | (int(b[3]) << 8)
        for ib in range(8):
            ls = ((int(b[4 + ib // 2]) >> (4 * (ib % 2))) & 15) | (((h >> (2 * ib)) & 3) << 4)
            qs = b[8 + 16 * ib:24 + 16 * ib].astype(np.int64)
            codes = np.concatenate([qs & 15, qs >> 4])
            sumi = int((q8[i, 32 * ib:32 * ib + 32] * kv[codes]).sum())
            sumf = F32(sumf + F32(F32(d4d8 * F32(ls - 32)) * F32(sumi)))
    return sumf


def test_dot_is_ggml_generic():
    G.check_dot("iq4_xs", oracle_iq4_xs)


def test_bad_input_is_refused():
    G.check_errors("iq4_xs")


def test_threads_do_not_change_bytes():
    G.check_threads("iq4_xs")


@pytest.mark.parametrize("rows,cols,m", [(1, 256, 1), (130, 512, 1), (130, 512, 3), (257, 1024, 5), (128, 256, 7),
                                        (128, 256, 9)])
def test_packed_mul_mat_is_the_generic_dot(rows, cols, m):
    """The packed vector tile (mat-vec speed) gives mul_mat's numbers bit for bit: rows padded to
    whole groups of 128, activation rows in tiles of 4 and a remainder of 1 to 3 (a row at a time),
    the golden bytes too."""
    from ggtool import quant as Q

    rec = qtypes.get("iq4_xs")
    rng = np.random.default_rng(rows)
    x = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 10, (rows, 1))).astype(F32)
    w = rec.quantize(x)
    a = Q.quantize_q8_k((rng.standard_normal((m, cols)) * 3).astype(F32))
    got = rec.mul_mat_packed(rec.pack(w), a)
    assert got.shape == (m, rows)
    assert np.array_equal(got.view(np.uint32), rec.mul_mat(w, a).view(np.uint32))


def test_packed_mul_mat_on_golden_rows():
    g = G.golden()
    rec = qtypes.get("iq4_xs")
    w, a = g["iq4_xs"], g["q8_K"][:7]
    assert np.array_equal(rec.mul_mat_packed(rec.pack(w), a).view(np.uint32), rec.mul_mat(w, a).view(np.uint32))
