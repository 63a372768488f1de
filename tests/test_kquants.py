"""The K-quant quantizers (ggtool.qtypes' records through ggtool.quant.quantize): GGML's bytes exactly, on
every thread count, and values gguf-py reads back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ggtool import quant as Q
from ggtool.errors import QuantizationError

GOLDEN = np.load(Path(__file__).parent / "golden" / "kquants" / "kquants.npz")
K_TYPES = ("q2_K", "q3_K", "q4_K", "q5_K", "q6_K")
# largest |error| / max |x| of a block that gguf-py's dequantizer gives back, by type (normal rows)
ERROR = {"q2_K": 0.35, "q3_K": 0.3, "q4_K": 0.08, "q5_K": 0.06, "q6_K": 0.035}


@pytest.mark.parametrize("t", K_TYPES)
def test_bytes_are_ggml_reference(t):
    x, want = GOLDEN["x"], GOLDEN[t]
    got = Q.quantize(x, t)
    assert got.shape == want.shape
    bad = np.flatnonzero((got != want).any(axis=1))
    assert not bad.size, f"{t}: blocks differ from GGML's: {[str(GOLDEN['category'][i]) for i in bad[:8]]}"


@pytest.mark.parametrize("t", K_TYPES)
def test_threads_and_rows_do_not_change_bytes(t):
    """A 3-D array on 3 threads (chunks over rows) gives the bytes of its blocks one by one."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((2, 40, 1024)) * rng.uniform(0.01, 10, (2, 40, 1))).astype(np.float32)
    with Q.threads_set_to(1):
        one = Q.quantize(x.reshape(-1, 256), t)
    with Q.threads_set_to(3):
        many = Q.quantize(x, t)
    nbytes = one.shape[1]
    assert many.shape == (2, 40, 4 * nbytes)
    assert np.array_equal(many.reshape(-1, nbytes), one)


@pytest.mark.parametrize("t", K_TYPES)
def test_gguf_py_reads_the_values_back(t):
    """Within a bound per type of every block's largest value (normal, uniform and real rows)."""
    import gguf

    x = GOLDEN["x"]
    cats = GOLDEN["category"]
    rows = np.array([str(c).startswith(("normal", "uniform", "stories", "gemma")) for c in cats])
    y = np.asarray(gguf.quants.dequantize(Q.quantize(x[rows], t), gguf.GGMLQuantizationType[t.upper()]))
    assert y.shape == x[rows].shape
    rel = np.abs(y - x[rows]).max(axis=1) / np.abs(x[rows]).max(axis=1)
    assert rel.max() < ERROR[t], (t, float(rel.max()))
    zero = Q.quantize(np.zeros((1, 256), np.float32), t)
    assert not np.asarray(gguf.quants.dequantize(zero, gguf.GGMLQuantizationType[t.upper()])).any()


@pytest.mark.parametrize("t", ("q4_K", "q6_K"))
def test_native_dequantizer_agrees(t):
    """ggtool's own Q4_K/Q6_K dequantizers read the new bytes as gguf-py does (scales that
    overflow fp16 give inf/NaN there: those rows are left out)."""
    import gguf

    x = GOLDEN["x"][[not str(c).startswith("huge") for c in GOLDEN["category"]]]
    raw = Q.quantize(x, t)
    assert np.array_equal(Q.dequantize(raw, t), gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[t.upper()]))


def test_k_quant_errors_name_the_tensor():
    assert all(Q.can_quantize(t) for t in K_TYPES)
    with pytest.raises(QuantizationError, match=r"tensor 'w': row length 576 is not a multiple of 256"):
        Q.quantize(np.zeros((2, 576), np.float32), "q4_K", name="w")
    x = np.zeros((3, 512), np.float32)
    x[2, 300] = np.nan
    with pytest.raises(QuantizationError, match=r"tensor 'w': cannot quantize NaN at index \(2, 300\)"):
        Q.quantize(x, "q6_K", name="w")


def test_fp16_scales_round_as_ggml():
    """The kernels' fp16 rounding (a search of the exact F16_TO_F32 table) is GGML_FP32_TO_FP16:
    ties to even at every midpoint, subnormals, overflow to inf from 65520, signed zeros."""
    from ggtool.kernels.tables import F16_TO_F32
    from ggtool.qtypes._k_quantize import _fp16_round

    h = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = ((h[:-1] + h[1:]) / 2).astype(np.float32)              # exact in float32
    rng = np.random.default_rng(9)
    rand = (rng.standard_normal(2000) * 10.0 ** rng.uniform(-10, 6, 2000)).astype(np.float32)
    edge = np.array([0.0, -0.0, 65504.0, 65519.996, 65520.0, 1e30, 6.0e-8, 2.9e-8, 3.0e-8, 1e-45], np.float32)
    for v in np.concatenate([mids[::7], -mids[::11], rand, edge, -edge]):
        bits, val = _fp16_round(v, F16_TO_F32)
        want = int(Q.fp32_to_fp16(np.array([v], np.float32)).view(np.uint16)[0])
        assert (int(bits), np.float32(val).tobytes()) == (want, F16_TO_F32[want].tobytes()), float(v)
    for nan in np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF812345], np.uint32).view(np.float32):
        # NaN keeps its sign (x86's NaN from inf - inf is negative: GGML writes 0xfe00)
        assert int(_fp16_round(nan, F16_TO_F32)[0]) == int(Q.fp32_to_fp16(np.array([nan])).view(np.uint16)[0])
