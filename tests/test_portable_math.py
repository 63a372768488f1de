"""ggtool.kernels.portable_math: the transcendentals of the default numerics, from IEEE operations only.

Accuracy against the decimal module at 50 digits (a reference independent of numpy and of the C
library): float64 results within 2 ulp, float32 results the correctly rounded ones for float32
inputs; the special values; and the host-independence the module exists for, checked where it
can fail: a subprocess whose numpy runs other SIMD code (NPY_DISABLE_CPU_FEATURES) gives the
same bits where numpy's own functions give others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from conftest import ROOT

from ggtool.kernels import portable_math as pm

RNG = np.random.default_rng(29)


def _dec_pi() -> Decimal:
    q = pm._pi(1400)
    return Decimal(q.numerator) / Decimal(q.denominator)


def _dec_sin_cos(x: Decimal) -> tuple[Decimal, Decimal]:
    """sin and cos by their series after a reduction by 2 pi in the context's digits (enough for x)."""
    two_pi = 2 * _dec_pi()
    x = x - two_pi * (x / two_pi).to_integral_value()
    x = +x
    s = c = Decimal(0)
    term, n = Decimal(1), 0                       # x**n / n!
    while True:
        if n % 4 == 0:
            c += term
        elif n % 4 == 1:
            s += term
        elif n % 4 == 2:
            c -= term
        else:
            s -= term
        n += 1
        term = term * x / n
        if n > 10 and abs(term) < Decimal(10) ** -70:
            return s, c


def reference(name: str, x: float) -> Fraction:
    with localcontext() as ctx:
        ctx.prec = 80 + max(0, Decimal(x).adjusted())       # digits for the reduction of a large x
        d = Decimal(x)
        if name == "exp":
            v = d.exp()
        elif name == "expm1":
            v = d.exp() - 1
        elif name == "log":
            v = d.ln()
        elif name == "tanh":
            e = (2 * d).exp()
            v = (e - 1) / (e + 1)
        elif name in ("sin", "cos"):
            v = _dec_sin_cos(d)[name == "cos"]
        return Fraction(v)


def ulps(got: float, want: Fraction) -> float:
    """|got - want| in units of the last place of want (float64)."""
    w = float(want)
    return float(abs(Fraction(got) - want) / Fraction(float(np.spacing(abs(w))))) if w != 0 else abs(got)


def samples(name: str, n: int) -> np.ndarray:
    """Float32-valued arguments over each function's range (as the ops give them)."""
    if name == "log":
        x = np.exp(RNG.uniform(-80, 80, n))
    elif name in ("exp", "expm1"):
        x = np.concatenate([RNG.uniform(-100, 88, n // 2), RNG.standard_normal(n // 2) * RNG.choice([1e-6, 0.01, 1], n // 2)])
    elif name == "tanh":
        x = np.concatenate([RNG.standard_normal(n // 2) * 3, RNG.standard_normal(n // 2) * 1e-3])
    else:   # rope angles: positions times frequencies
        x = np.concatenate([RNG.uniform(-4, 4, n // 2), RNG.uniform(0, 1e5, n // 2)])
    return x.astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("name", ["exp", "expm1", "log", "tanh", "sin", "cos"])
def test_float64_within_2_ulp_and_float32_correctly_rounded(name):
    x = samples(name, 400)
    got = getattr(pm, name)(x)
    worst = 0.0
    for xi, gi in zip(x.tolist(), got.tolist()):
        want = reference(name, xi)
        worst = max(worst, ulps(gi, want))
        assert np.float32(gi) == pm._round_f32(want), (name, xi)
    assert worst <= 2.0, (name, worst)


def test_reference_and_comparison_can_fail():
    """A one-ulp change of a result is seen (the tolerance is not a blanket)."""
    x = 0.7
    want = reference("exp", x)
    assert ulps(float(pm.exp(x) + 3 * np.spacing(pm.exp(x))), want) > 2.0


def test_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-310, 800.0, -800.0])
    with np.errstate(all="ignore"):
        for name in ("exp", "expm1", "tanh", "sin", "cos", "log"):
            got, want = getattr(pm, name)(x), getattr(np, name)(x)
            number = ~np.isnan(want)               # (a NaN's sign bit is the CPU's, not IEEE's)
            assert np.array_equal(np.signbit(got[number]), np.signbit(want[number])), name
            assert np.array_equal(got, want, equal_nan=True), (name, got, want)


def test_sin_cos_of_huge_arguments_reduce_exactly():
    """Beyond 2**19 pi/2 the argument is reduced in integers: sin(1e22) is a classic test value."""
    x = np.array([1e22, 2.0 ** 60, -3.4e38, 1e300])
    for name in ("sin", "cos"):
        got = getattr(pm, name)(x)
        for xi, gi in zip(x.tolist(), got.tolist()):
            assert ulps(gi, reference(name, xi)) <= 2.0, (name, xi)


def test_powf_correctly_rounded():
    """powf of the values GGML takes it of: rope's theta scale for common bases and head sizes,
    ALiBi's slopes; each the float32 nearest the exact power (decimal, 60 digits)."""
    for base in (10000.0, 500000.0, 1000000.0, 10000000.0):
        for n_dims in (32, 64, 80, 96, 128, 256):
            y = np.float32(-2.0) / np.float32(n_dims)
            got = pm.powf(base, y)
            with localcontext() as ctx:
                ctx.prec = 80
                want = pm._round_f32(Fraction((Decimal(float(y)) * Decimal(base).ln()).exp()))
            assert got == want and got.dtype == np.float32
    assert pm.powf(2.0, -1.0) == np.float32(0.5)
    assert pm.powf(0.5, 3.0) == np.float32(0.125)
    assert pm.powf(-2.0, 3.0) == np.float32(-8.0)
    assert np.isnan(pm.powf(-2.0, 0.5))
    assert pm.powf(0.0, -1.0) == np.inf


def test_float32_forms_round_once():
    x = np.array([0.5, -3.0, 88.7, 89.0, -104.0], np.float32)
    got = pm.exp_f32(x)
    assert got.dtype == np.float32
    with np.errstate(over="ignore"):
        assert np.array_equal(got, pm.exp(x.astype(np.float64)).astype(np.float32))
    assert got[3] == np.inf and got[4] == 0.0


PROBE = r"""
import hashlib, json, sys
import numpy as np
from ggtool.kernels import portable_math as pm
rng = np.random.default_rng(7)
x = np.concatenate([rng.standard_normal(50000) * s for s in (0.1, 1, 10, 100)]).astype(np.float32)
out = {}
for name in ("exp", "expm1", "log", "tanh", "sin", "cos"):
    arg = np.abs(x) if name == "log" else x
    with np.errstate(all="ignore"):
        out["ours." + name] = hashlib.sha1(getattr(pm, name)(arg.astype(np.float64)).tobytes()).hexdigest()
        out["numpy." + name] = hashlib.sha1(getattr(np, name)(arg.astype(np.float64)).tobytes()).hexdigest()
print(json.dumps(out))
"""


def _probe(env_extra: dict, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NPY_", "OPENBLAS_"))}
    env.update(env_extra, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + PROBE],
                       capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
    return json.loads(r.stdout)


# numpy >= 2.4 names its x86 feature groups X86_V3/X86_V4; older ones the single features
NO_AVX512 = "X86_V4 AVX512_ICL AVX512_SPR AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL"
NO_AVX2 = NO_AVX512 + " X86_V3 AVX2 FMA3 AVX512F"


def test_same_bits_whichever_simd_numpy_runs(tmp_path):
    """The point of the module: numpy with its AVX-512 code switched off, and with its AVX2 code off
    too (an x86-64-v2 CPU), gives ours the same bits (where it changes some of numpy's own, on a
    CPU that has the features: the check could fail)."""
    native = _probe({}, tmp_path)
    for off in (NO_AVX512, NO_AVX2):
        other = _probe({"NPY_DISABLE_CPU_FEATURES": off}, tmp_path)
        assert {k: v for k, v in other.items() if k.startswith("ours.")} == \
               {k: v for k, v in native.items() if k.startswith("ours.")}, off


def test_compiled_forms_give_the_numpy_forms_bits():
    """float_rows (numba) against portable_math's numpy forms, on the same values: every float32
    exponent range, the overflow and underflow edges, subnormal results, NaN and infinities; and
    sums in order against np.add.accumulate's, signed zeros included."""
    from ggtool.kernels import float_rows

    exp_f32 = pm.compiled("exp")
    bits = RNG.integers(0, 1 << 32, 200000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), np.float32([88.72, 88.73, -87.3, -103.9, -104.0, -0.0, 0.0,
                                                             np.inf, -np.inf, np.nan]),
                        np.linspace(-110, 90, 100001, dtype=np.float32)])
    with np.errstate(all="ignore"):
        want = pm.exp(x.astype(np.float64)).astype(np.float32)
    got = exp_f32(x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))

    # every float32 around float_rows.EXP_ZERO_BELOW (the compiled form's +0.0 without computing):
    # below it the float64 form rounds to +0.0 too, above it to float32's subnormals
    edge = np.float32(float_rows.EXP_ZERO_BELOW)
    lo, hi = np.float32(-110.0).view(np.uint32), np.float32(-103.0).view(np.uint32)
    x = np.concatenate([np.arange(hi, lo + 1, dtype=np.uint32).view(np.float32),
                        np.float32([-745.2, -1e30, -3.4e38, -np.inf])])
    with np.errstate(all="ignore"):
        want = pm.exp(x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(exp_f32(x).view(np.uint32), want.view(np.uint32))
    assert want[x >= edge].any() and not want[x < edge].any() and np.float32(-103.5) in x

    terms = (RNG.standard_normal((300, 257)) * 10.0 ** RNG.integers(-20, 20, (300, 257))).astype(np.float32)
    terms[0] = -0.0
    terms[1, :3] = [np.inf, -np.inf, 1.0]
    with np.errstate(invalid="ignore"):
        want = np.add.accumulate(terms.astype(np.float64), axis=-1)[..., -1] + 0.0
    got = float_rows.seq_sum(terms)
    assert np.array_equal(got[2:].view(np.uint64), want[2:].view(np.uint64))
    assert np.isnan(got[1]) and np.isnan(want[1])                  # inf + -inf
    assert got[0] == 0.0 and not np.signbit(got[0]) and not np.signbit(want[0])   # GGML's sum starts at +0.0
