"""Compiled forms of two of the default numerics' hot row maps: ``portable_math``'s exp of float32
values (soft_max's, silu's, sigmoid's, gelu_quick's) and GGML's in-order double sums (``seq_sum``:
soft_max's, the norms').

The same IEEE operations in the same order as the numpy forms in ``portable_math``, so the same
bits (tests/test_portable_math.py checks both on the same values, NaN and the extremes included):
no fast-math (no fused multiply-add, no reassociation; the sum's loop is not vectorised), the same
constants, rint for the reduction, exact powers of two for the scaling. The numpy forms stay the
twins (``kernels.cache``): a command line whose kernels are not compiled yet runs them, and so does
a process that has not loaded numba, for small arrays (``portable_math.use_compiled``).
"""

from __future__ import annotations

import numpy as np

from . import portable_math as pm
from .jit import njit

_INV, _HI, _LO = pm._EXP_INV, pm._EXP_HI, pm._EXP_LO
_C0, _C1, _C2, _C3, _C4 = pm._EXP_C
_T_HI, _T_LO = pm._T_HI, pm._T_LO                      # 32 entries each: frozen into the kernel
_POW2 = np.array([2.0 ** e for e in range(-600, 601)])  # 2**e, exactly, e in [-600, 600]


@njit
def _exp64(v):
    """portable_math.exp for one float64, operation for operation."""
    if v != v:
        return v
    xc = min(max(v, -800.0), 800.0)
    k = np.rint(xc * _INV)
    ki = np.int64(k)
    r = (xc - k * _HI) - k * _LO
    p = r + (r * r) * ((((_C4 * r + _C3) * r + _C2) * r + _C1) * r + _C0)
    j = ki & 31
    e = ki >> 5
    hi = _T_HI[j]
    y = hi + (_T_LO[j] + hi * p)
    e1 = e >> 1
    return (y * _POW2[e1 + 600]) * _POW2[e - e1 + 600]


@njit
def _exp_f32(x, out):
    xb, ob = x.view(np.uint32), out.view(np.uint32)
    for i in range(x.shape[0]):
        v = x[i]
        if v != v:              # NaN: itself, made quiet (as the numpy form's float64 round trip makes it;
            ob[i] = xb[i] | np.uint32(0x400000)   # LLVM folds that round trip away)
        else:
            out[i] = np.float32(_exp64(np.float64(v)))


@njit
def _seq_sum(x, out):
    """out[r] = +0.0 + x[r, 0] + x[r, 1] + ... in float64, in order (GGML's ggml_float sums)."""
    for r in range(x.shape[0]):
        s = 0.0
        for k in range(x.shape[1]):
            s += np.float64(x[r, k])
        out[r] = s


def _plain(x: np.ndarray) -> np.ndarray:
    """C-contiguous float32 and writable (numba compiles read-only arrays apart)."""
    x = np.ascontiguousarray(x, np.float32)
    return x if x.flags.writeable else x.copy()


def exp_f32(x) -> np.ndarray:
    """portable_math.exp_f32, compiled."""
    x = _plain(x)
    out = np.empty(x.shape, np.float32)
    _exp_f32(x.reshape(-1), out.reshape(-1))
    return out


def seq_sum(terms) -> np.ndarray:
    """portable_math.seq_sum of float32 terms, compiled."""
    x = _plain(terms)
    n = x.shape[-1] if x.ndim else 1
    out = np.empty(x.shape[:-1], np.float64)
    _seq_sum(x.reshape(-1, n), out.reshape(-1))
    return out
