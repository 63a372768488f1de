"""Element-wise F32 maps: the UNARY family (op UNARY, the sub-op in op_params[0]: abs ... exp,
gelu, silu) and the stand-alone ops sqr, sqrt, log, sin, cos (ggml_unary, ggml_sqr, ...).

GELU and GELU_QUICK go through GGML's fp16 lookup tables, so their outputs are fp16 values.
The transcendentals (exp, expm1, log, tanh, sin, cos, and those inside the tables) are
``ggtool.kernels.portable_math``'s: correctly rounded float32 results (computed in float64 and
rounded once, as a good C library's expf, tanhf, ... give them), with the same bits on every host.
Which threads work follows GGML's kernels (ggml_compute_forward_gelu_f32 and its neighbours):
GELU, GELU_QUICK and SILU split rows in blocks, every other op here runs on thread 0 alone.
Rows are read the way GGML walks them (row i at i*nb1).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from .. import types as T
from ..kernels import portable_math as pm
from ..kernels.numerics import is_llama_cpp, wide
from ..tensor import UNARY_OPS
from .base import ALL, CompiledStep, check, fmt_ne, function, kernel, new_op, row_block
from .walk import map_rows, plain, require_type, row_walk, walks_inside

f32 = np.float32

# -- GGML's fp16 tables (ggml_cpu_init) --------------------------------------------------------
SQRT_2_OVER_PI = f32(0.79788456080286535587989211986876)
GELU_COEF_A = f32(0.044715)
GELU_QUICK_COEF = f32(-1.702)


def _gelu_f32(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_f32, float32 in C's evaluation order (tanhf correctly rounded via float64)."""
    inner = SQRT_2_OVER_PI * x * (f32(1) + GELU_COEF_A * x * x)
    return f32(0.5) * x * (f32(1) + pm.tanh_f32(inner))


def _gelu_f32_x86(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_f32 as llama.cpp's x86-64 build compiles it: 1 + GELU_COEF_A*x*x contracted to
    an FMA (one fp16 entry of the table differs, at x = -1.999)."""
    from ..kernels.x86 import fma

    inner = SQRT_2_OVER_PI * x * fma(GELU_COEF_A * x, x, np.ones_like(x))
    return f32(0.5) * x * (f32(1) + pm.tanh_f32(inner))


def _gelu_quick_f32(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_quick_f32: x * (1 / (1 + expf(GELU_QUICK_COEF * x)))."""
    return x * (f32(1) / (f32(1) + pm.exp_f32(GELU_QUICK_COEF * x)))


_TABLES: dict[str, np.ndarray] = {}


def _quiet_nan_entries(table: np.ndarray) -> np.ndarray:
    """Sets a table's NaN entries (index h a NaN's fp16 bits) to h quieted and widened, as GGML's
    tables hold them on x86-64: F16C's conversions quiet a NaN and keep its payload, and every
    function of x here keeps x's payload. numpy's own fp16 conversions of a NaN differ between its
    versions and CPU paths, so these entries are set from the bits, the same on every host."""
    h = np.arange(1 << 16, dtype=np.uint32)
    nan = ((h & 0x7C00) == 0x7C00) & ((h & 0x3FF) != 0)
    bits = ((h & 0x8000) << 16) | np.uint32(0x7FC00000) | ((h & 0x3FF) << 13)
    table[nan] = bits[nan].view(f32)
    return table


def _table(name: str, fn: Callable) -> np.ndarray:
    """TABLE[h] = fp16(fn(fp32(h))) for all 65,536 fp16 bit patterns, kept as float32."""
    if name not in _TABLES:
        h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(f32)
        with np.errstate(all="ignore"):
            _TABLES[name] = _quiet_nan_entries(fn(h).astype(np.float16).astype(f32))
    return _TABLES[name]


def gelu_table(numerics: str = "ggml") -> np.ndarray:
    """GGML's fp16 GELU table (ggml_cpu_init), as the reference computes it or ("x86") as
    llama.cpp's x86-64 build does: the values gelu reads."""
    return _table("gelu_x86", _gelu_f32_x86) if is_llama_cpp(numerics) else _table("gelu", _gelu_f32)


def _fp16_bits(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint16)  # RNE, like GGML_FP32_TO_FP16


def _gelu(x: np.ndarray, table: str = "gelu", fn: Callable = _gelu_f32) -> np.ndarray:
    y = np.take(_table(table, fn), _fp16_bits(x))
    np.copyto(y, x, where=x >= 10)
    np.copyto(y, f32(0), where=x <= -10)
    return y


def _gelu_x86(x: np.ndarray) -> np.ndarray:
    return _gelu(x, "gelu_x86", _gelu_f32_x86)


def _gelu_quick(x: np.ndarray) -> np.ndarray:
    return np.take(_table("gelu_quick", _gelu_quick_f32), _fp16_bits(x))


def _relu_like(x, pos, other):
    return np.where(x > 0, pos, other).astype(f32)


def _hardsigmoid(x):
    return np.fmin(f32(1), np.fmax(f32(0), (x + f32(3)) / f32(6)))


# -- the table of ops ---------------------------------------------------------------------------
# dsl name: (op, unary?, split, formula on float32 rows, one-line doc)
#   split "block": rows in contiguous blocks over all threads; "thread0": thread 0 does all
_OPS: dict[str, tuple[str, bool, str, Callable, str]] = {
    "abs": ("ABS", True, "thread0", np.abs, "|a|"),
    "sgn": ("SGN", True, "thread0", lambda x: _relu_like(x, f32(1), np.where(x < 0, f32(-1), f32(0))),
            "sign of a: -1, 0 or 1 (NaN gives 0)"),
    "neg": ("NEG", True, "thread0", np.negative, "-a"),
    "step": ("STEP", True, "thread0", lambda x: _relu_like(x, f32(1), f32(0)), "1 where a > 0, else 0"),
    "tanh": ("TANH", True, "thread0", pm.tanh_f32, "tanh(a)"),
    "elu": ("ELU", True, "thread0", lambda x: _relu_like(x, x, pm.expm1_f32(x)), "a if a > 0 else expm1(a)"),
    "relu": ("RELU", True, "thread0", lambda x: _relu_like(x, x, f32(0)), "a if a > 0 else 0"),
    "sigmoid": ("SIGMOID", True, "thread0", lambda x: f32(1) / (f32(1) + pm.exp_f32(-x)), "1/(1+exp(-a))"),
    "gelu": ("GELU", True, "block", _gelu,
             "GELU (tanh approximation) looked up through GGML's fp16 table; 0 below -10, a above 10"),
    "gelu_quick": ("GELU_QUICK", True, "block", _gelu_quick,
                   "a*sigmoid(1.702a) looked up through GGML's fp16 table"),
    "silu": ("SILU", True, "block", lambda x: x / (f32(1) + pm.exp_f32(-x)), "a/(1+exp(-a))"),
    "hardswish": ("HARDSWISH", True, "thread0", lambda x: x * _hardsigmoid(x), "a*min(1, max(0, (a+3)/6))"),
    "hardsigmoid": ("HARDSIGMOID", True, "thread0", _hardsigmoid, "min(1, max(0, (a+3)/6))"),
    "exp": ("EXP", True, "thread0", pm.exp_f32, "exp(a)"),
    "sqr": ("SQR", False, "thread0", np.square, "a*a"),
    "sqrt": ("SQRT", False, "thread0", np.sqrt, "sqrt(a)"),
    "log": ("LOG", False, "thread0", pm.log_f32, "natural log of a"),
    "sin": ("SIN", False, "thread0", pm.sin_f32, "sin(a)"),
    "cos": ("COS", False, "thread0", pm.cos_f32, "cos(a)"),
}


def _silu_x86(x: np.ndarray, wide_lanes: bool) -> np.ndarray:
    """llama.cpp's silu (ggml_vec_silu_f32, and the silu of its fused swiglu): ggml_v_silu in 16 (AVX2: 8)
    lanes from each row's start, the C library's expf for the tail (ggtool.kernels.x86.silu_rows)."""
    from ..kernels import x86

    y = np.empty(x.shape, f32)
    x86.silu_rows(np.ascontiguousarray(x), y, x86.EXPF, wide_lanes)
    return y


# the formulas llama.cpp's x86-64 builds evaluate differently (its numerics, AVX2 and AVX-512 alike),
# and those whose lanes differ between the two builds (called with wide: the AVX-512 build)
_X86: dict[str, Callable] = {"GELU": _gelu_x86}
_X86_LANES: dict[str, Callable] = {"SILU": _silu_x86}
# and those it evaluates differently that ggtool does not model (they would compute as by default under
# llama.cpp's numerics): none since silu follows ggml_v_silu (_silu_x86)
X86_UNMODELLED: tuple[str, ...] = ()


def without_x86_form(nodes) -> list:
    """The unary nodes among `nodes` that llama.cpp's x86 build computes otherwise and ggtool's
    llama.cpp numerics do not model (X86_UNMODELLED)."""
    return [n for n in nodes if n.op == "UNARY" and n.op_desc in X86_UNMODELLED]


def _make_kernel(op: str, split: str, fn: Callable):
    def forward(node, ith, nth, work):
        if split == "thread0":
            if ith != 0:
                return
            r0, r1 = 0, node.nrows
        else:
            r0, r1 = row_block(node.nrows, ith, nth)
        src = node.src[0]
        require_type(src, op.lower(), (T.F32,))
        x, y = row_walk(src), row_walk(node)
        f = fn
        if is_llama_cpp(work.numerics):
            f = _X86.get(op, fn)
            if op in _X86_LANES:
                f = functools.partial(_X86_LANES[op], wide_lanes=wide(work.numerics))
        with np.errstate(all="ignore"):
            map_rows(f, x, y, r0, r1)
    forward.__name__ = f"forward_{op.lower()}"
    forward.__doc__ = f"{op}: float32 rows, {'row blocks' if split == 'block' else 'thread 0 only'}."
    return forward


def _make_builder(name: str, op: str, unary: bool):
    if unary:
        def build(ctx, a):
            check(a.is_contiguous(1), name,
                  f"a '{a.name}' {fmt_ne(a)} nb={list(a.nb)} needs packed rows (ggml_is_contiguous_1); use cont first")
            return new_op(ctx, "UNARY", a.type, a.ne, (a,), unary=op)
    else:
        def build(ctx, a):
            return new_op(ctx, op, a.type, a.ne, (a,))
    build.__name__ = name
    return build


def _gelu_compiled(node, numerics):
    """``gelu_f32``: the lookup in `gelu_table(numerics)` (its address, per process) as `_gelu` does it."""
    src = node.src[0]
    if not (src.type == node.type == T.F32 and plain(src, node) and walks_inside(src, node)):
        return None

    def bind(ith: int, nth: int, shared: dict):
        table = gelu_table(numerics)
        return (int(table.ctypes.data),), table, None
    return CompiledStep("gelu_f32", bind=bind)


def _silu_compiled(node, numerics):
    """``silu_f32`` under GGML's numerics (portable_math's exp, the addresses of its tables per
    process); llama.cpp's silu (ggml_v_silu's lanes) stays in Python."""
    src = node.src[0]
    if is_llama_cpp(numerics) or not (src.type == node.type == T.F32 and plain(src, node) and walks_inside(src, node)):
        return None

    def bind(ith: int, nth: int, shared: dict):
        return tuple(int(a.ctypes.data) for a in pm.EXP_CONSTS), pm.EXP_CONSTS, None
    return CompiledStep("silu_f32", bind=bind)


_COMPILED: dict[str, Callable] = {"GELU": _gelu_compiled, "SILU": _silu_compiled}   # the compiled runner's (ggtool.runner)

for _name, (_op, _unary, _split, _fn, _doc) in _OPS.items():
    assert not _unary or _op in UNARY_OPS
    kernel(_op, n_tasks=ALL if _split == "block" else 1, compiled=_COMPILED.get(_op))(_make_kernel(_op, _split, _fn))
    function(_name, f"ggml_{_name}(ctx, a)", _doc)(_make_builder(_name, _op, _unary))
