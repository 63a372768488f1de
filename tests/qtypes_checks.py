"""The checks every ggtool.qtypes record gets that need no golden file (used through
tests/iquants_golden.py and tests/iquants_small_golden.py): bad input refused with one clear
error, threaded chunks equal to the serial bytes, and the parts of a Q8_K row the dot oracles read."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ggtool import qtypes
from ggtool.errors import QuantizationError


def check_errors(t: str) -> None:
    """Bad input: one clear QuantizationError each, nothing written."""
    rec = qtypes.get(t)
    bs = rec.block_size
    x = np.random.default_rng(3).standard_normal((3, 512)).astype(np.float32)
    qw = np.ones(512, np.float32)
    bad = x.copy()
    bad[2, 300] = np.nan
    bad[2, 400] = np.inf
    with pytest.raises(QuantizationError, match=r"tensor 'w': cannot quantize NaN at index \(2, 300\)"):
        rec.quantize(bad, qw, name="w")
    bad[2, 300] = 0
    with pytest.raises(QuantizationError, match=r"cannot quantize inf at index \(2, 400\)"):
        rec.quantize(bad, qw, name="w")
    with pytest.raises(QuantizationError, match=f"row length {bs + 8} is not a multiple of {bs} \\({t} block size\\)"):
        rec.quantize(x[:, :bs + 8], qw[:bs + 8])
    with pytest.raises(QuantizationError, match="importance matrix has 256 values for rows of 512"):
        rec.quantize(x, qw[:256])
    q = qw.copy()
    q[7] = np.nan
    with pytest.raises(QuantizationError, match=r"importance matrix holds NaN or inf \(column 7\)"):
        rec.quantize(x, q)
    row_bytes = 512 // bs * rec.type_size
    if rec.ggml_requires_imatrix:
        with pytest.raises(QuantizationError, match=f"{t} needs an importance matrix"):
            rec.quantize(x)
    elif rec.quantize_ref is not None:
        assert rec.quantize_ref(x).shape == (3, row_bytes)
    assert rec.quantize(np.zeros((0, 512), np.float32), qw).shape == (0, row_bytes)


def check_threads(t: str) -> None:
    """Rows on threads, one a work item (ggtool.quant's runner shape: run(fn, n_items, chunk)),
    give the serial bytes."""
    rec = qtypes.get(t)
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((2, 40, 1024)) * rng.uniform(0.01, 10, (2, 40, 1))).astype(np.float32)
    qw = (10.0 ** rng.uniform(-2, 2, 1024)).astype(np.float32)

    def threaded(fn, n, chunk):
        with ThreadPoolExecutor(3) as ex:
            list(ex.map(lambda s: fn(s, s + 1), range(n)))

    serial = np.concatenate([rec.quantize(x[e, r:r + 1], qw) for e in range(2) for r in range(40)])
    many = rec.quantize(x, qw, run=threaded)
    assert many.shape == (2, 40, 1024 // rec.block_size * rec.type_size)
    assert np.array_equal(many.reshape(80, -1), serial)


def q8_k(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d float32 (nb,), qs int64 (nb, 256), bsums int64 (nb, 16)) of a row of Q8_K blocks."""
    b = a.reshape(-1, 292)
    return (np.ascontiguousarray(b[:, :4]).view(np.float32)[:, 0], b[:, 4:260].view(np.int8).astype(np.int64),
            np.ascontiguousarray(b[:, 260:292]).view("<i2").astype(np.int64))
