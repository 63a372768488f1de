"""exp, expm1, log, tanh, sin, cos and powf with the same bits on every host: built from IEEE-754
operations that every CPU rounds alike (+, -, *, /, rint, ldexp, frexp, comparisons), in numpy.

Why not numpy's or the C library's: their results depend on the host. numpy dispatches float64
exp/log/expm1 (and float32 expm1, log1p, exp2, power) to AVX-512 code on AVX-512 CPUs and to other
code elsewhere, its float32 exp/log/tanh/sin/cos to AVX2 code where there is AVX2 and to the C
library below it; the C library (glibc) picks FMA or SSE2 builds of its own functions by CPU and
changes them between versions. Each gives other last bits, and a model as sensitive as gemma-3
then predicts other tokens on another machine. The functions here compute in float64 from
constants derived at import by exact integer arithmetic (ln 2, pi, 2**(j/32): nothing typed in), so
the same input gives the same bits wherever numpy runs.

Accuracy: within two ulps of float64 (exp and log about half of one) (a float32 result, rounded once from it, is the correctly
rounded value unless the exact one lies within about 2**-52 of a float32 rounding boundary;
tests/test_portable_math.py checks against the decimal module at 50 digits). ``powf`` is correctly
rounded to float32 (decimal arithmetic; for the scalars GGML takes ``powf`` of: rope's theta scale,
ALiBi's slopes).

Arrays are computed a chunk at a time by the callers (ops' row chunks); every function takes float64
and returns float64, except the ``*_f32`` forms (float32 in, float32 out: float64 inside, one
rounding at the end), as GGML's ``expf``, ``tanhf``, ``sinf``, ... are used on float32 values.
"""

from __future__ import annotations

from decimal import Decimal, localcontext
from fractions import Fraction
from functools import cache, lru_cache

import numpy as np

F64, F32 = np.float64, np.float32
_P = 256                       # bits of the fixed-point constants below


# -- constants, by exact integer arithmetic -------------------------------------------------------------
def _atan_inv(n: int, bits: int) -> int:
    """arctan(1/n) * 2**bits (truncated series, error below the number of terms)."""
    total, term, k, sign = 0, (1 << bits) // n, 1, 1
    while term:
        total += sign * (term // k)
        term //= n * n
        k += 2
        sign = -sign
    return total


def _pi(bits: int) -> Fraction:
    """pi to `bits` bits (Machin: pi/4 = 4 arctan(1/5) - arctan(1/239)), 64 guard bits dropped."""
    g = bits + 64
    return Fraction(4 * (4 * _atan_inv(5, g) - _atan_inv(239, g)) >> 64, 1 << bits)


def _ln2(bits: int) -> Fraction:
    """ln 2 = sum of 1/(k 2**k), k >= 1, to `bits` bits."""
    g, total, k = bits + 64, 0, 1
    while True:
        term = (1 << g) // (k << k)
        if not term:
            break
        total += term
        k += 1
    return Fraction(total >> 64, 1 << bits)


def _root2(j: int, n: int, bits: int) -> Fraction:
    """2**(j/n) to `bits` bits: the integer n-th root of 2**(j + n*bits), by Newton's method."""
    a = 1 << (j + n * bits)
    x = 1 << ((a.bit_length() + n - 1) // n)
    if bits >= 53:          # start just above the root (a double's 2**(j/n) is within 2**-51 of it):
        x = min(x, (int(2.0 ** (j / n) * 2.0 ** 53) + 8) << (bits - 53))   # a few steps, not hundreds
    while True:
        y = ((n - 1) * x + a // x ** (n - 1)) // n
        if y >= x:
            return Fraction(x, 1 << bits)
        x = y


def _double(q: Fraction) -> float:
    return q.numerator / q.denominator                  # int / int: correctly rounded


def _split(q: Fraction, keep: int) -> tuple[float, float]:
    """q as hi + lo: hi its first `keep` significant bits (so small multiples of it are exact), lo the
    double nearest the rest."""
    m, e = np.frexp(_double(q))
    hi = float(np.ldexp(round(float(np.ldexp(m, keep))), int(e) - keep))
    return hi, _double(q - Fraction(hi))


_LN2 = _ln2(_P)
_PI = _pi(_P)
N = 32                                                  # exp's table: 2**(j/32)
_EXP_INV = _double(N / _LN2)                            # 32 / ln 2
_EXP_HI, _EXP_LO = _split(_LN2 / N, 36)                 # ln2/32: |k| < 2**17, k*hi exact
_T = [_root2(j, N, _P) for j in range(N)]
_T_HI = np.array([_double(t) for t in _T])
_T_LO = np.array([_double(t - Fraction(_double(t))) for t in _T])
_EXPM1_K = 64                                           # expm1's table: 2**(k/32) - 1, |k| <= 64
_D = [_T[k % N] * Fraction(2) ** (k // N) - 1 for k in range(-_EXPM1_K, _EXPM1_K + 1)]   # _T: the same roots
_D_HI = np.array([_double(d) for d in _D])
_D_LO = np.array([_double(d - Fraction(_double(d))) for d in _D])
_LOG_HI, _LOG_LO = _split(_LN2, 36)                     # ln 2: |e| < 2**11, e*hi exact
_SQRT_HALF = _double(_root2(-N // 2, N, _P))            # 2**-0.5
_P1 = _split(_PI / 2, 33)[0]                             # pi/2 in parts of 33, 33 and 53 bits:
_P2 = _split(_PI / 2 - Fraction(_P1), 33)[0]             # k*p1 and k*p2 exact for |k| < 2**20
_P3 = _double(_PI / 2 - Fraction(_P1) - Fraction(_P2))
_TWO_OVER_PI = _double(2 / _PI)
_TRIG_MAX = float(2 ** 19) * _double(_PI / 2)           # beyond: exact reduction (_reduce_big)


def _fact(n: int) -> int:
    r = 1
    for i in range(2, n + 1):
        r *= i
    return r


_EXP_C = [_double(Fraction(1, _fact(n))) for n in range(2, 7)]                # 1/2! .. 1/6!
_EXPM1_C = [_double(Fraction(1, _fact(n))) for n in range(2, 12)]             # 1/2! .. 1/11!
_SIN_C = [_double(Fraction((-1) ** n, _fact(2 * n + 1))) for n in range(1, 9)]  # -1/3! .. 1/17!
_COS_C = [_double(Fraction((-1) ** n, _fact(2 * n))) for n in range(2, 10)]     # 1/4! .. 1/18!
_LOG_C = [_double(Fraction(2, 2 * n + 1)) for n in range(1, 12)]                # 2/3 .. 2/23


def _horner(z, coefs):
    p = coefs[-1]
    for c in coefs[-2::-1]:
        p = p * z + c
    return p


# -- exp and expm1 ------------------------------------------------------------------------------------
def _exp_parts(x):
    """k and the reduced argument: x = k ln2/32 + r, |r| <= ln2/64 (x finite, |x| < 2**16)."""
    k = np.rint(x * _EXP_INV)
    r = (x - k * _EXP_HI) - k * _EXP_LO                 # x - k*hi is exact
    p = r + (r * r) * _horner(r, _EXP_C)                # expm1(r), |error| < 2**-60 |r|
    return k, p


_SHIFT = 6755399441055744.0                              # 1.5 * 2**52: v + _SHIFT is v rounded to an integer
_SHIFT_BITS = int(np.float64(_SHIFT).view(np.int64))    # (ties to even), held in its low bits


def _pow2(e):
    """2**e as float64 from its bits, for integer arrays e in [-1022, 1023]."""
    return ((e + 1023) << 52).view(F64)


def exp(x) -> np.ndarray:
    """e**x, float64: x = (32 m + j) ln2/32 + r, e**x = 2**m 2**(j/32) (1 + expm1(r)), 2**m applied
    in two exact halves (so the one rounding of a subnormal result is the last multiplication's)."""
    x = np.asarray(x, F64)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        xc = np.clip(x, -800.0, 800.0)                  # NaN stays NaN: answered at the end
        t = xc * _EXP_INV + _SHIFT
        k = t - _SHIFT                                  # rint(x * 32/ln2)
        ki = np.asarray(t).view(np.int64) - _SHIFT_BITS
        r = (xc - k * _EXP_HI) - k * _EXP_LO            # x - k*hi is exact
        p = r + (r * r) * _horner(r, _EXP_C)            # expm1(r), |r| <= ln2/64
        j = ki & (N - 1)
        e = ki >> 5
        hi = _T_HI[j]
        y = hi + (_T_LO[j] + hi * p)
        e1 = e >> 1
        y = (y * _pow2(e1)) * _pow2(e - e1)
    return np.where(np.isnan(x), x, y)


def expm1(x) -> np.ndarray:
    """e**x - 1, float64, accurate near 0: below |x| = 2.5 ln2/32 its Taylor series, up to 64 ln2/32
    ~ 1.39 from the table of d = 2**(k/32) - 1 (in two parts) as d + (1 + d) expm1(r), beyond it
    exp(x) - 1."""
    x = np.asarray(x, F64)
    near = np.abs(x) <= _EXPM1_K * _EXP_HI * 1.0
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        k, p = _exp_parts(np.where(near, x, 0.0))
        i = np.clip(k.astype(np.int32) + _EXPM1_K, 0, 2 * _EXPM1_K)
        d = _D_HI[i]
        small = d + (p + (_D_LO[i] + d * p))              # d + (1 + d) p
        xt = np.where(np.abs(k) <= 2, x, 0.0)             # |x| < 0.055: its own series, no cancellation
        tiny = xt + (xt * xt) * _horner(xt, _EXPM1_C)
        y = np.where(near, np.where(np.abs(k) <= 2, tiny, small), exp(x) - 1.0)
    return np.where(x == 0, x, y)                       # -0.0 stays -0.0


# -- log ----------------------------------------------------------------------------------------------
def log(x) -> np.ndarray:
    """Natural log, float64: x = 2**e m, m in [sqrt(1/2), sqrt(2)), f = m - 1 (exact),
    log(1+f) = f - (f^2/2 - s (f^2/2 + R)), s = f/(2+f), R = 2 (s^2/3 + s^4/5 + ...)."""
    x = np.asarray(x, F64)
    ok = np.isfinite(x) & (x > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        m, e = np.frexp(np.where(ok, x, 1.0))
        low = m < _SQRT_HALF
        m = np.where(low, m * 2.0, m)
        e = (e - low).astype(F64)
        f = m - 1.0
        s = f / (2.0 + f)
        z = s * s
        hfsq = 0.5 * f * f
        r = z * _horner(z, _LOG_C)
        log1p = f - (hfsq - s * (hfsq + r))
        y = e * _LOG_HI + (e * _LOG_LO + log1p)
        special = np.where(x == 0, -np.inf, np.where(x < 0, np.nan, x))   # +inf, nan stay
    return np.where(ok, y, special)


# -- tanh ---------------------------------------------------------------------------------------------
def tanh(x) -> np.ndarray:
    """tanh, float64: 1 - 2/(e**2|x| + 1) from |x| = ln(3)/2 on, expm1(2|x|)/(expm1(2|x|) + 2)
    below it; the sign of x (and of -0.0) kept."""
    x = np.asarray(x, F64)
    ax = np.abs(x)
    with np.errstate(invalid="ignore", over="ignore"):
        big = ax >= 0.5493061443340549                 # > atanh(1/2)
        t_big = 1.0 - 2.0 / (exp(np.minimum(2.0 * ax, 100.0)) + 1.0)
        u = expm1(np.where(big, 0.0, 2.0 * ax))
        t_small = u / (u + 2.0)
        t = np.where(big, t_big, t_small)
    return np.where(np.isnan(x), x, np.copysign(t, x))


# -- sin and cos --------------------------------------------------------------------------------------
@cache
def _half_pi(bits: int) -> Fraction:
    return _pi(bits) / 2


def _reduce_big(x: np.ndarray):
    """(k mod 4, r) for |x| beyond _TRIG_MAX, exactly: x - k pi/2 with pi to the bits x's exponent
    needs, in integers (x is m 2**e, exactly)."""
    n = np.zeros(x.shape, np.int64)
    r = np.zeros(x.shape, F64)
    for i, v in enumerate(x.tolist()):
        q = Fraction(v)
        bits = (max(0, q.numerator.bit_length() - q.denominator.bit_length()) // 256 + 1) * 256 + 128
        half = _half_pi(bits)
        k = round(q / half)
        n[i] = k % 4
        r[i] = _double(q - k * half)
    return n, r


def _sin_cos_reduced(x: np.ndarray):
    """n (quadrant, 0..3) and r with x = k pi/2 + r, |r| <= pi/4 (+ a rounding); non-finite x give
    r = nan."""
    finite = np.isfinite(x)
    big = finite & (np.abs(x) > _TRIG_MAX)
    xs = np.where(finite & ~big, x, 0.0)
    k = np.rint(xs * _TWO_OVER_PI)
    r = ((xs - k * _P1) - k * _P2) - k * _P3           # x - k*p1 exact; k*p1, k*p2 exact
    n = k.astype(np.int64) & 3
    if big.any():
        n[big], r[big] = _reduce_big(x[big])
    r = np.where(finite, r, np.nan)
    return n, r


def _sin_poly(r):
    z = r * r
    return r + (r * z) * _horner(z, _SIN_C)


def _cos_poly(r):
    z = r * r
    hz = 0.5 * z
    w = 1.0 - hz
    return w + (((1.0 - w) - hz) + (z * z) * _horner(z, _COS_C))


def sin(x) -> np.ndarray:
    """sine, float64 (-0.0 kept)."""
    x = np.asarray(x, F64)
    with np.errstate(invalid="ignore"):
        n, r = _sin_cos_reduced(x)
        s, c = _sin_poly(r), _cos_poly(r)
        y = np.where(n & 1, c, s)
        y = np.where(n & 2, -y, y)
    return np.where(x == 0, x, y)


def cos(x) -> np.ndarray:
    """cosine, float64."""
    x = np.asarray(x, F64)
    with np.errstate(invalid="ignore"):
        n, r = _sin_cos_reduced(x)
        s, c = _sin_poly(r), _cos_poly(r)
        y = np.where(n & 1, s, c)
        y = np.where((n + 1) & 2, -y, y)
    return y


# -- float32 forms ------------------------------------------------------------------------------------
def _f32(fn, x) -> np.ndarray:
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return fn(np.asarray(x, F32).astype(F64)).astype(F32)


def exp_f32(x) -> np.ndarray:
    """expf: float32 in and out (compiled, ``float_rows``, where ``use_compiled`` says so: the same bits)."""
    if use_compiled("exp", np.size(x)):
        return compiled("exp")(x)
    return _f32(exp, x)


def expm1_f32(x) -> np.ndarray:
    return _f32(expm1, x)


def log_f32(x) -> np.ndarray:
    return _f32(log, x)


def tanh_f32(x) -> np.ndarray:
    return _f32(tanh, x)


def sin_f32(x) -> np.ndarray:
    return _f32(sin, x)


def cos_f32(x) -> np.ndarray:
    return _f32(cos, x)


# -- sums in order --------------------------------------------------------------------------------------
def seq_sum(terms) -> np.ndarray:
    """GGML's ggml_float sum over the last axis: a double from +0.0, plus each (float32) term in order.
    numpy's own sum adds pairwise (other roundings); np.add.accumulate is a running sum by definition."""
    terms = np.asarray(terms)
    if terms.shape[-1] == 0:
        return np.zeros(terms.shape[:-1])
    if terms.dtype == F32 and use_compiled("seq_sum", terms.size):
        return compiled("seq_sum")(terms)
    with np.errstate(invalid="ignore", over="ignore"):                   # inf - inf: NaN, as GGML's
        return np.add.accumulate(terms.astype(F64), axis=-1)[..., -1] + 0.0   # -0.0 -> +0.0, as from +0.0


# The compiled forms (``float_rows``) pay off from about this many values when numba is not loaded yet
# (0.3-0.9 s to load it); where it is (a quantized model's process), from the first value.
COMPILED_MIN = 1 << 20


def use_compiled(name: str, size: int) -> bool:
    """Whether ``float_rows``' compiled form of `name` runs (else the numpy form here, the same bits):
    numba loaded or the array large, and the kernel compiled (or compiling allowed: ``kernels.cache``)."""
    import sys

    if size < COMPILED_MIN and "numba" not in sys.modules:
        return False
    from . import cache

    return cache.use_kernel(f"float_rows:{name}")


# exp's constants and tables, as float_rows' compiled exp takes them
EXP_CONSTS = (np.array([_EXP_INV, _EXP_HI, _EXP_LO, *_EXP_C]), _T_HI, _T_LO,
              np.array([float(Fraction(2) ** e) for e in range(-600, 601)]))


def compiled(name: str):
    """float_rows' compiled form of `name` ("exp": x -> expf(x), "seq_sum": terms -> sums), numba
    loaded (the same bits as the numpy forms here)."""
    from . import float_rows

    if name == "exp":
        return lambda x: float_rows.exp_f32(x, EXP_CONSTS)
    return {"seq_sum": float_rows.seq_sum}[name]


# -- powf, for scalars -------------------------------------------------------------------------------
def _round_f32(q: Fraction) -> np.float32:
    """The float32 nearest q (ties to even; inf beyond the largest float32 by half a step or more)."""
    f = np.float32(_double(q))                         # within one float32 step of the answer
    if not np.isfinite(f):
        f = np.float32(np.finfo(F32).max) * np.float32(np.sign(q))
    best, dbest = None, None
    for g in (np.nextafter(f, F32(-np.inf)), f, np.nextafter(f, F32(np.inf))):
        d = abs(Fraction(float(g)) - q) if np.isfinite(g) else None
        if d is None:
            continue
        if best is None or d < dbest or (d == dbest and int(np.array(g).view(np.uint32)) % 2 == 0):
            best, dbest = g, d
    top = Fraction(float(np.finfo(F32).max))
    if abs(q) >= top + (top - Fraction(float(np.nextafter(F32(np.finfo(F32).max), F32(0))))) / 2:
        return F32(np.inf) * F32(np.sign(q))
    return F32(best)


@lru_cache(maxsize=1024)
def powf(x, y) -> np.float32:
    """x**y for float32 scalars x and y, correctly rounded to float32 (C's powf, as GGML calls it
    for rope's theta scale and ALiBi's slopes; libm's last bit differs between C libraries). The
    special values (0, inf, nan, a negative x with a non-integer y) as C's powf gives them."""
    return _powf(F32(x), F32(y))


def _powf(x: np.float32, y: np.float32) -> np.float32:
    qy = Fraction(float(y)) if np.isfinite(y) else None
    integer = qy is not None and qy.denominator == 1
    if not np.isfinite(x) or qy is None or x == 0 or y == 0 or (x < 0 and not integer):
        with np.errstate(all="ignore"):                # IEEE's special cases, exact everywhere
            return F32(np.power(F64(x), F64(y)))
    sign = -1 if x < 0 and qy.numerator % 2 else 1
    qx = abs(Fraction(float(x)))
    if integer and abs(qy.numerator) <= 256:
        return F32(sign) * _round_f32(qx ** qy.numerator)    # an exact rational
    with localcontext() as ctx:
        ctx.prec = 60
        v = (Decimal(float(y)) * Decimal(float(abs(x))).ln()).exp()
    return F32(sign) * _round_f32(Fraction(v))
