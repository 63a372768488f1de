"""llama.cpp's x86 orders for the types of ggtool.qtypes' records: `--numerics llama.cpp-avx2` gives
llama.cpp's own mul_mat bit for bit (tests/golden/llama/llama-cpp-qtypes.npz, made by
make_llama_cpp_qtypes.py through ctypes in the AVX2 build: the vec_dots for 1, 2 and 5 activation
rows, the tiled kernel for 9, MXFP4's repacked gemv/gemm for weight rows in eights)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ggtool
from ggtool.ops import FUNCTIONS as F

GOLD = Path(__file__).parent / "golden" / "llama" / "llama-cpp-qtypes.npz"


def _cases():
    with np.load(GOLD) as z:
        n = sum(f.startswith("op_") for f in z.files)
        return [str(z[f"case_{i}"]) for i in range(n)]


CASES = _cases()


def _mul_mat(z, case: str, numerics: str) -> np.ndarray:
    t, k, n, m = case.split()
    ctx = ggtool.Context()
    a = ctx.new_tensor(t, [int(k), int(n)]).set_data(z[f"w_{t}_{k}_{n}"])
    b = ctx.new_tensor("f32", [int(k), int(m)]).set_data(z[f"x_{m}_{k}"])
    y = F["mul_mat"](ctx, a, b)
    g = ggtool.Graph(ctx)
    g.expand(y)
    ggtool.graph_compute(g, 1, numerics=numerics)
    return y.numpy().reshape(int(m), int(n))


@pytest.mark.parametrize("case", sorted({c.split()[0] for c in CASES}))
def test_every_record_type_is_llama_cpps_own_on_avx2(case):
    bad = []
    with np.load(GOLD) as z:
        for i, c in enumerate(CASES):
            if c.split()[0] != case:
                continue
            got, ref = _mul_mat(z, c, "llama.cpp-avx2"), z[f"y_avx2_{i}"]
            if got.tobytes() != ref.tobytes():
                bad.append((c, int((got != ref).sum()), float(np.abs(got - ref).max())))
    assert not bad, bad
