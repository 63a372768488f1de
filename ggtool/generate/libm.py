"""The C library's float functions as llama.cpp's sampler calls them, so that ggtool's draws are its draws.

llama.cpp's samplers compute in float: `expf` over every candidate (softmax, `dist`), `logf`, `log2f`
and `powf` on a few scalars. Their last bits decide, now and then, which token a draw lands on, so
ggtool computes them as glibc does on x86-64:

- `expf(x)` for a whole array, vectorised: glibc's algorithm (a 32-entry table of 2^(i/32) and a
  cubic in double, ARM's optimized-routines expf) with the one fused multiply-add that glibc's FMA
  build (the one every x86-64 CPU with FMA runs) makes where it matters, emulated exactly by
  splitting 1/ln2 so that both halves multiply a float without rounding; run only where e^x is
  near a rounding midpoint, numpy's exp rounded elsewhere (the same bits, 6x faster).
  `bench/check_sampling.py expf` compares it with the C library's expf on every float from -104 to
  88.7 (2.24e9 values: all equal on glibc 2.36).
- `logf`, `log2f`, `powf` of one value: the C library's own (ctypes), where there is one; else the
  double result rounded to float, which differs from glibc's in rare last bits.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
from fractions import Fraction
from functools import cache

import numpy as np

_N = 32                                        # EXP2F_TABLE_BITS = 5
_h = float.fromhex
_SHIFT = _h("0x1.8p+52")
_INV_LN2_N = _h("0x1.71547652b82fep+0") * _N
_C0 = _h("0x1.c6af84b912394p-5") / _N / _N / _N
_C1 = _h("0x1.ebfce50fac4f3p-3") / _N / _N
_C2 = _h("0x1.62e42ff0c52d6p-1") / _N
_OVER = np.float32(_h("0x1.62e42ep6"))        # above: inf (log(0x1p128))
_UNDER = np.float32(-_h("0x1.9fe368p6"))      # below: 0 (log(0x1p-150))
# 1/ln2*N split into 29 + 24 significant bits: each half times a float's 24 bits is exact in double,
# so (hi*x - k) + lo*x is the fused multiply-add fma(1/ln2*N, x, -k) rounded once


def _split_hi(v: float) -> float:
    bits = np.array([v], np.float64).view(np.uint64)
    return float((bits & np.uint64(~((1 << 24) - 1) & 0xFFFFFFFFFFFFFFFF)).view(np.float64)[0])


_HI = _split_hi(_INV_LN2_N)
_LO = _INV_LN2_N - _HI


@cache
def _table() -> np.ndarray:
    """tab[i] = bits(2^(i/N)) - (i << 47): 2^(i/32) rounded to the nearest double, computed exactly."""
    out = np.empty(_N, np.uint64)
    for i in range(_N):
        out[i] = (_bits(_root2(i)) - (i << (52 - 5))) & 0xFFFFFFFFFFFFFFFF
    return out


def _root2(i: int) -> float:
    """2^(i/32) correctly rounded to double (bisection on exact rationals: x^32 against 2^i)."""
    lo, hi = Fraction(1), Fraction(2)
    target = Fraction(2) ** i
    for _ in range(80):                        # far below a double's ulp
        mid = (lo + hi) / 2
        if mid ** 32 <= target:
            lo = mid
        else:
            hi = mid
    x = float(lo)                              # within one ulp: pick the nearer neighbour
    best = min((x, math.nextafter(x, 0), math.nextafter(x, 3)), key=lambda c: abs(Fraction(c) ** 32 - target)
               / (32 * Fraction(c) ** 31))
    return best


def _bits(x: float) -> int:
    return int(np.array([x], np.float64).view(np.uint64)[0])


def expf(x: np.ndarray) -> np.ndarray:
    """glibc's expf of each element of a float32 array (float32 out), bit for bit.

    glibc's result is within 0.502 ulp of e^x, so it is e^x rounded to the nearest float except
    where e^x lies within 0.002 ulp of a midpoint between two floats: numpy's exp in double (far
    below 0.001 float ulp off) rounded gives all but those, and glibc's algorithm (`_expf_glibc`)
    recomputes the few within 0.01 ulp of a midpoint, and the ends of the range."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        y = np.exp(x.astype(np.float64))
        out = y.astype(np.float32)
        # a normal float keeps a double's top 23 mantissa bits: the low 29 say how far y is from the
        # midpoint between two floats (2^28); within 0.01 ulp of it, or where the float would be
        # subnormal or infinite (|x| > 87), glibc's algorithm decides
        low = (y.view(np.uint64) & np.uint64((1 << 29) - 1)).view(np.int64) - (1 << 28)
        odd = (np.abs(low) < (1 << 29) // 100) | ~(np.abs(x) < np.float32(87.0))
    idx = np.flatnonzero(odd)
    if len(idx):
        out[idx] = _expf_glibc(x[idx])
    return out


def _expf_glibc(x: np.ndarray) -> np.ndarray:
    """glibc's algorithm itself, for any float32 array."""
    xd = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        z = _INV_LN2_N * xd
        kd = z + _SHIFT
        ki = kd.view(np.uint64)
        kd = kd - _SHIFT
        r = (_HI * xd - kd) + _LO * xd
        t = np.take(_table(), (ki & np.uint64(_N - 1)).astype(np.intp)) + (ki << np.uint64(52 - 5))
        s = t.view(np.float64)
        y = (_C0 * r + _C1) * (r * r) + (_C2 * r + 1.0)
        out = (y * s).astype(np.float32)
    # glibc's special cases: |x| >= 88 branches, NaN, infinities
    big = np.abs(x) >= np.float32(88.0)
    if big.any() or np.isnan(x).any():
        out = np.where(x > _OVER, np.float32(np.inf), out)
        out = np.where(x < _UNDER, np.float32(0.0), out)
        out = np.where(np.isnan(x), x, out)
    return out


def expf1(x: float) -> np.float32:
    """expf of one float."""
    return expf(np.array([x], np.float32))[0]


@cache
def _libm():
    """The C library's math functions (None where ctypes finds none)."""
    for name in (ctypes.util.find_library("m"), None):
        try:
            lib = ctypes.CDLL(name)
            for f, n in (("logf", 1), ("log2f", 1), ("powf", 2)):
                fn = getattr(lib, f)
                fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float] * n
            return lib
        except (OSError, AttributeError):
            continue
    return None   # pragma: no cover - every C library has them


def _f32(v) -> np.float32:
    return np.float32(v)


def logf(x) -> np.float32:
    lib = _libm()
    if lib is None:   # pragma: no cover
        return _f32(math.log(float(x))) if x > 0 else _f32(-np.inf if x == 0 else np.nan)
    return _f32(lib.logf(float(np.float32(x))))


def log2f(x) -> np.float32:
    lib = _libm()
    if lib is None:   # pragma: no cover
        return _f32(math.log2(float(x))) if x > 0 else _f32(-np.inf if x == 0 else np.nan)
    return _f32(lib.log2f(float(np.float32(x))))


def powf(x, y) -> np.float32:
    lib = _libm()
    if lib is None:   # pragma: no cover
        try:
            return _f32(math.pow(float(x), float(y)))
        except (OverflowError, ValueError):
            return _f32(np.inf if x > 1 else np.nan)
    return _f32(lib.powf(float(np.float32(x)), float(np.float32(y))))


def logf_array(x: np.ndarray) -> np.ndarray:
    """logf of each element (the C library's, one call each: for the few candidates a sampler keeps)."""
    return np.array([logf(v) for v in np.asarray(x, np.float32).tolist()], np.float32)
