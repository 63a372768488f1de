"""Compiled forms of two of the default numerics' hot row maps: ``portable_math``'s exp of float32
values (soft_max's, silu's, sigmoid's, gelu_quick's) and GGML's in-order double sums (``seq_sum``:
soft_max's, the norms').

The same IEEE operations in the same order as the numpy forms in ``portable_math``, so the same
bits (tests/test_portable_math.py checks both on the same values, NaN and the extremes included):
no fast-math (no fused multiply-add, no reassociation; the sum's loop is not vectorised), the same
constants (``portable_math`` passes them: this module imports nothing of it), rint for the
reduction, exact powers of two for the scaling. The numpy forms stay the
twins (``kernels.cache``): a command line whose kernels are not compiled yet runs them, and so does
a process that has not loaded numba, for small arrays (``portable_math.use_compiled``).
"""

from __future__ import annotations

import numpy as np

from .jit import njit
from .native import view_as


@njit
def _exp64(v, k0, t_hi, t_lo, pow2):
    """portable_math.exp for one float64, operation for operation; k0 holds its constants (32/ln2,
    ln2/32 in two parts, 1/2! .. 1/6!), t_hi/t_lo its table 2**(j/32), pow2[e + 600] = 2**e."""
    if v != v:
        return v
    xc = min(max(v, -800.0), 800.0)
    k = np.rint(xc * k0[0])
    ki = np.int64(k)
    r = (xc - k * k0[1]) - k * k0[2]
    p = r + (r * r) * ((((k0[7] * r + k0[6]) * r + k0[5]) * r + k0[4]) * r + k0[3])
    j = ki & 31
    e = ki >> 5
    hi = t_hi[j]
    y = hi + (t_lo[j] + hi * p)
    e1 = e >> 1
    return (y * pow2[e1 + 600]) * pow2[e - e1 + 600]


# Below this, exp(v) < 2**-150 (half float32's least subnormal): the float64 form's result rounds to
# +0.0, which is given at once. Its products would underflow float64 (v < ~-708, -inf a causal mask's
# half of every prompt soft_max row): x86 takes a microcode assist for each, ~19 ns a value against
# ~5 (the same bits: every float32 below -100 checked against the float64 form, 2026-12-03).
EXP_ZERO_BELOW = -105.0


@njit
def _exp_f32(x, out, k0, t_hi, t_lo, pow2):
    xb, ob = view_as(x, np.uint32), view_as(out, np.uint32)
    for i in range(x.shape[0]):
        v = x[i]
        if v != v:              # NaN: itself, made quiet (as the numpy form's float64 round trip makes it;
            ob[i] = xb[i] | np.uint32(0x400000)   # LLVM folds that round trip away)
        elif v < np.float32(EXP_ZERO_BELOW):
            out[i] = 0.0
        else:
            out[i] = np.float32(_exp64(np.float64(v), k0, t_hi, t_lo, pow2))


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


def exp_f32(x, consts: tuple) -> np.ndarray:
    """portable_math.exp_f32, compiled; `consts` is portable_math.EXP_CONSTS (its constants and tables)."""
    x = _plain(x)
    out = np.empty(x.shape, np.float32)
    _exp_f32(x.reshape(-1), out.reshape(-1), *consts)
    return out


def seq_sum(terms) -> np.ndarray:
    """portable_math.seq_sum of float32 terms, compiled."""
    x = _plain(terms)
    n = x.shape[-1] if x.ndim else 1
    out = np.empty(x.shape[:-1], np.float64)
    _seq_sum(x.reshape(-1, n), out.reshape(-1))
    return out
