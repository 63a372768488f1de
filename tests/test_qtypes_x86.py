"""llama.cpp's x86 orders for the types of ggtool.qtypes' records: `--numerics llama.cpp-avx2` gives
llama.cpp's own mul_mat bit for bit (tests/golden/llama/llama-cpp-qtypes.npz, made by
make_llama_cpp_qtypes.py through ctypes in the AVX2 build: the vec_dots for 1, 2 and 5 activation
rows, the tiled kernel for 9, MXFP4's repacked gemv/gemm for weight rows in eights); and the odd last
block of IQ4_NL's and MXFP4's vec_dot, fused by the AVX2 build and not by the AVX-512 one
(llama-cpp-tails.npz, make_llama_cpp_tails.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ggtool
from ggtool.ops import FUNCTIONS as F

GOLD = Path(__file__).parent / "golden" / "llama" / "llama-cpp-qtypes.npz"
TAILS = GOLD.with_name("llama-cpp-tails.npz")


def _cases(path=GOLD):
    with np.load(path) as z:
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


@pytest.mark.parametrize("i", range(len(_cases(TAILS))))
def test_an_odd_last_block_is_fused_by_the_avx2_build_alone(i):
    """y_avx2: the generic AVX2 build (GCC fuses ``sumf += d * sumi`` into an FMA); y_zen: GCC's native
    build for an AMD Zen, whose float operations in these vec_dots are the AVX-512 native build's
    (bench/check_x86_forms.py: the same optimized dataflow). Every case has values where they part."""
    with np.load(TAILS) as z:
        case = str(z[f"case_{i}"])
        fused, unfused = z[f"y_avx2_{i}"], z[f"y_zen_{i}"]
        assert (fused != unfused).any()
        assert _mul_mat(z, case, "llama.cpp-avx2").tobytes() == fused.tobytes()
        assert _mul_mat(z, case, "llama.cpp-avx512").tobytes() == unfused.tobytes()


def _check_x86_forms():
    import importlib.util
    path = Path(__file__).resolve().parents[1] / "bench" / "check_x86_forms.py"
    spec = importlib.util.spec_from_file_location("check_x86_forms", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_TAIL = """  float sumf;
  float _4;
  float _5;
  int _7;
  int _8;
  int _9;
  <bb 2> [local count: 1]:
  {ints}
  # sumf_1 = PHI <sumf_3(3), 0.0(2)>
  _4 = (float) _9;
  _5 = MEM[(float *)x_2(D) + {off}B];
  {tail}
  *s_6(D) = sumf_3;
"""


def test_the_forms_check_tells_a_fused_tail_and_ignores_integer_code():
    """bench/check_x86_forms.py's comparison (what docs/engine.md's AVX-512 statement rests on): a
    multiply-add contracted to an FMA is another dataflow; integer code (another reassociation, other
    SSA numbers, another load address form) is not."""
    flow = _check_x86_forms().float_dataflow
    fused = flow(_TAIL.format(ints="_9 = _7 + _8;", off=4, tail="sumf_3 = .FMA (_5, _4, sumf_1);").splitlines())
    split = flow(_TAIL.format(ints="_9 = _7 + _8;", off=4, tail="_10 = _5 * _4;\n  sumf_3 = sumf_1 + _10;")
                 .replace("float _5;", "float _5;\n  float _10;").splitlines())
    other_ints = flow(_TAIL.format(ints="_11 = _8 + _7;\n  _9 = _11 + 0;", off=68,
                                   tail="sumf_3 = .FMA (_5, _4, sumf_1);").replace("_4", "_41").splitlines())
    assert fused != split
    assert fused == other_ints
    assert fused.count("\n") == 3          # sumf_1, _4, _5, sumf_3: four float values
