"""MXFP4 (ggtool.qtypes.mxfp4): llama.cpp's bytes on golden blocks (quant_weights ignored), the E8M0
exponent at its edges, GGML's dequantizer (and gguf-py's) and generic dot against Q8_0, bit for bit."""

from __future__ import annotations

import numpy as np

import iquants_small_golden as G
from ggtool import qtypes
from ggtool.qtypes import grids, mxfp4

F32 = np.float32


def test_bytes_are_llama_cpp():
    G.check_bytes("mxfp4", "ref")


def test_importance_is_ignored():
    G.check_weights_ignored("mxfp4")


def test_exponent_edges():
    """e = floor(log2f(amax)) - 2 + 127 as x86 truncates it to uint8: amax 1 gives 125, the largest
    float 253 (log2f rounds it up to 128), amax 1e-45 wraps round to 232, zeros give 0."""
    rec = qtypes.get("mxfp4")
    x = np.zeros((5, 32), F32)
    x[0, 3] = 1.0
    x[1, 0] = np.finfo(F32).max
    x[2, 9] = -1e-45
    x[4, 31] = 0.75
    assert list(rec.quantize(x)[:, 0]) == [125, 253, 232, 0, 124]


def test_e8m0_half():
    e = np.arange(256)
    want = np.ldexp(1.0, e - 128).astype(F32)
    assert np.array_equal(mxfp4.e8m0_half(e), want)
    assert list(grids.KVALUES_MXFP4) == [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]


def test_dequantize_is_ggml_and_gguf_py():
    G.check_dequantize("mxfp4")


def oracle_mxfp4(w, a):
    dy, q8 = G.q8_0(a)
    kv = grids.KVALUES_MXFP4.astype(np.int64)
    sumf = F32(0)
    for i, b in enumerate(w.reshape(-1, 17)):
        qs = b[1:17].astype(np.int64)
        s = int((q8[i, :16] * kv[qs & 15]).sum() + (q8[i, 16:] * kv[qs >> 4]).sum())
        d = F32(dy[i] * F32(np.ldexp(1.0, int(b[0]) - 128)))
        sumf = F32(sumf + F32(d * F32(s)))
    return sumf


def test_dot_is_ggml_generic():
    G.check_dot("mxfp4", oracle_mxfp4)


def test_bad_input_is_refused():
    G.check_errors("mxfp4")


def test_threads_do_not_change_bytes():
    G.check_threads("mxfp4")
