"""make_qx_quants with weights (``qtypes._weighted_quantize.make_qx_quants_w``: Q4_0's and Q5_0's
importance paths, Q3_K's and Q6_K's) sums its 19 trial scales side by side; against GGML's loop
written out one step after another in numpy float32 (ggml-quants.c's make_qx_quants, rmse_type 1),
codes and scale bit for bit, ties and a group of zeros included."""

from __future__ import annotations

import numpy as np
import pytest

from ggtool.qtypes import _weighted_quantize as W

f32 = np.float32


def nearest_int(v: np.float32) -> int:
    b = np.array([f32(v + f32(12582912.0))], f32).view(np.int32)[0]
    return int((b & 0x7FFFFF) - 0x400000)


def make_qx_quants(x, nmax, qw):
    """GGML's make_qx_quants(n, nmax, x, L, rmse_type=1, qw), one step at a time."""
    n = len(x)
    amax, mx = f32(0), f32(0)
    for v in x:
        if abs(v) > amax:
            amax, mx = abs(v), v
    if amax < f32(1e-15):
        return [0] * n, f32(0)
    iscale = f32(-f32(nmax) / mx)
    L, sumlx, suml2 = [], f32(0), f32(0)
    for v, w in zip(x, qw):
        l = max(-nmax, min(nmax - 1, nearest_int(f32(iscale * v))))
        L.append(l + nmax)
        sumlx = f32(sumlx + f32(f32(w * v) * f32(l)))
        suml2 = f32(suml2 + f32(f32(w * f32(l)) * f32(l)))
    scale = f32(sumlx / suml2) if suml2 != 0 else f32(0)
    best = f32(scale * sumlx)
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = f32(-f32(f32(nmax) + f32(f32(0.1) * f32(step))) / mx)
        ls = [max(-nmax, min(nmax - 1, nearest_int(f32(iscale * v)))) for v in x]
        sumlx, suml2 = f32(0), f32(0)
        for v, w, l in zip(x, qw, ls):
            sumlx = f32(sumlx + f32(f32(w * v) * f32(l)))
            suml2 = f32(suml2 + f32(f32(w * f32(l)) * f32(l)))
        if suml2 > 0 and f32(sumlx * sumlx) > f32(best * suml2):
            L = [l + nmax for l in ls]
            scale = f32(sumlx / suml2)
            best = f32(scale * sumlx)
    return L, scale


@pytest.mark.parametrize("n,nmax", [(32, 8), (32, 16), (16, 4), (16, 32)])
def test_side_by_side_steps_are_ggmls_loop(n, nmax):
    rng = np.random.default_rng(n * 100 + nmax)
    wx = np.zeros(n, f32)
    fl = np.zeros(W.SCRATCH, f32)
    for case in range(60):
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-4, 3)).astype(f32)
        qw = (rng.random(n) * 10.0 ** rng.integers(-3, 2)).astype(f32)
        if case % 6 == 1:
            x = np.round(x * 4 / np.abs(x).max()).astype(f32)       # values on the grid: equal sums, ties
        elif case % 6 == 2:
            x[: n // 2] = 0
        elif case % 6 == 3:
            x[:] = f32(1e-17)                                     # below GROUP_MAX_EPS: all zero codes
        elif case % 6 == 4:
            x[rng.integers(n)] = -np.abs(x).max() * 3             # the largest value negative
        L = np.zeros(n, np.int64)
        scale = W.make_qx_quants_w(x, n, nmax, L, qw, wx, fl)
        want_L, want_scale = make_qx_quants(x, nmax, qw)
        assert L.tolist() == want_L, case
        assert np.array([scale], f32).view(np.uint32)[0] == np.array([want_scale], f32).view(np.uint32)[0], case
