"""Q4_1, Q5_0, Q5_1 and IQ4_NL, and every importance-matrix path (ggtool.qtypes' records through
ggtool.quant.quantize): GGML's bytes exactly (golden/kquants/quants.npz, made by make_quants.py from
the llama.cpp llama-cpp-python 0.3.36 vendors), on every thread count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ggtool import quant as Q
from ggtool.errors import QuantizationError

GOLDEN = np.load(Path(__file__).parent / "golden" / "kquants" / "quants.npz")
NEW = ("q4_1", "q5_0", "q5_1", "iq4_nl")
WEIGHTED = ("q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K")
BYTES = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18,
         "q2_K": 84, "q3_K": 110, "q4_K": 144, "q5_K": 176, "q6_K": 210}


def _same(t, got, want, what):
    nb = BYTES[t]
    got, want = got.reshape(-1, nb), want.reshape(-1, nb)
    assert got.shape == want.shape
    bad = np.flatnonzero((got != want).any(axis=1))
    per_row = GOLDEN["x"].shape[1] // (256 if t.endswith("K") else 32)      # blocks per row of x
    cats = [str(GOLDEN["category"][i // per_row]) for i in bad[:8]] if what != "wide" else list(bad[:8])
    assert not bad.size, f"{t} {what}: blocks differ from GGML's: {cats}"


@pytest.mark.parametrize("t", NEW)
def test_reference_bytes_are_ggml(t):
    _same(t, Q.quantize(GOLDEN["x"], t), GOLDEN[t], "reference")


@pytest.mark.parametrize("t", WEIGHTED)
def test_imatrix_bytes_are_ggml(t):
    """Random positive importances, and the same with a quarter of them zero."""
    for k, w in enumerate(GOLDEN["imatrix"]):
        _same(t, Q.quantize(GOLDEN["x"], t, imatrix=w), GOLDEN[f"{t}_w"][k], f"imatrix {k}")


@pytest.mark.parametrize("t", WEIGHTED)
def test_imatrix_over_wide_rows(t):
    """Rows of 1024: the legacy paths' sigma2 is over a whole row, the importances are per column."""
    for k, w in enumerate(GOLDEN["imatrix_wide"]):
        _same(t, Q.quantize(GOLDEN["wide"], t, imatrix=w), GOLDEN[f"{t}_wide"][k], "wide")


@pytest.mark.parametrize("t", ("q5_1", "iq4_nl", "q4_0", "q4_K"))
def test_threads_and_shapes_do_not_change_bytes(t):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((2, 30, 512)) * rng.uniform(0.01, 10, (2, 30, 1))).astype(np.float32)
    w = rng.uniform(0, 5, 512).astype(np.float32)
    for imatrix in (None, w) if t != "q4_0" else (w,):
        with Q.threads_set_to(1):
            one = [Q.quantize(row[None], t, imatrix=imatrix) for row in x.reshape(-1, 512)]
        with Q.threads_set_to(3):
            many = Q.quantize(x, t, imatrix=imatrix)
        assert many.shape == (2, 30, one[0].shape[1])
        assert np.array_equal(many.reshape(60, -1), np.concatenate(one))


def test_imatrix_is_ignored_where_ggml_ignores_it():
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    w = np.ones(64, np.float32)
    for t in ("q8_0", "f16", "bf16", "f32"):
        assert np.array_equal(Q.quantize(x, t, imatrix=w), Q.quantize(x, t))
    assert not np.array_equal(Q.quantize(x, "q4_0", imatrix=w), Q.quantize(x, "q4_0"))


def test_bad_imatrix_and_values_name_the_tensor():
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(QuantizationError, match=r"tensor 'w': the importance matrix has 32 values for rows of 64"):
        Q.quantize(x, "q5_0", name="w", imatrix=np.ones(32, np.float32))
    bad = np.ones(64, np.float32)
    bad[40] = np.nan
    with pytest.raises(QuantizationError, match=r"tensor 'w': the importance matrix holds NaN or inf \(column 40\)"):
        Q.quantize(x, "q4_1", name="w", imatrix=bad)
    x[1, 33] = np.inf
    for imatrix in (None, np.ones(64, np.float32)):
        with pytest.raises(QuantizationError, match=r"tensor 'w': cannot quantize inf at index \(1, 33\)"):
            Q.quantize(x, "iq4_nl", name="w", imatrix=imatrix)
    with pytest.raises(QuantizationError, match=r"row length 48 is not a multiple of 32"):
        Q.quantize(np.zeros((1, 48), np.float32), "q5_1", name="w")


@pytest.mark.parametrize("t", NEW)
def test_values_read_back(t):
    """gguf-py's dequantizer (and ggtool's own IQ4_NL one, GGML's arithmetic) read the bytes back
    within a bound of each block's largest value."""
    import gguf

    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    raw = Q.quantize(x, t)
    gt = gguf.GGMLQuantizationType[t.upper()]
    y = np.asarray(gguf.quants.dequantize(raw, gt))
    assert np.array_equal(Q.dequantize(raw, t), y)
    err = np.abs(y - x).reshape(-1, 32).max(axis=1) / np.abs(x).reshape(-1, 32).max(axis=1)
    assert err.max() < {"q4_1": 0.07, "q5_0": 0.065, "q5_1": 0.035, "iq4_nl": 0.15}[t], float(err.max())


def test_iq4_nl_dequantizer_is_ggmls():
    """d * kvalues_iq4nl[q] in float32 for every code and a spread of scales (inf/NaN d included)."""
    from ggtool.qtypes._iq4nl_quantize import KVALUES

    rng = np.random.default_rng(4)
    d = np.concatenate([rng.integers(0, 0x10000, 500), [0x7C00, 0xFC00, 0x7E00, 0, 0x8000, 1]]).astype(np.uint16)
    blocks = np.zeros((len(d), 18), np.uint8)
    blocks[:, :2] = d.view(np.uint8).reshape(-1, 2)
    blocks[:, 2:] = rng.integers(0, 256, (len(d), 16))
    want = np.empty((len(d), 32), np.float32)
    df = d.view(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        want[:, :16] = df[:, None] * KVALUES[blocks[:, 2:] & 15]
        want[:, 16:] = df[:, None] * KVALUES[blocks[:, 2:] >> 4]
    got = Q.dequantize(blocks, "iq4_nl")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
