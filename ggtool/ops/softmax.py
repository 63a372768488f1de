"""soft_max, soft_max_ext (mask, scale, ALiBi) and diag_mask_inf (ggml_soft_max_ext,
ggml_diag_mask_inf)."""

from __future__ import annotations

import math

import numpy as np

from .. import types as T
from ..kernels import portable_math as pm
from ..kernels.numerics import is_llama_cpp, wide
from .base import ALL, CompiledStep, check, fmt_ne, function, kernel, new_op, row_block
from .walk import chunks, plain, require, require_type, row_walk, walks_inside

f32 = np.float32


def _soft_max_tasks(node, n_threads: int) -> int:
    return min(n_threads, node.src[0].nrows)


def _alibi_slopes(rows: np.ndarray, ne1: int, ne2: int, max_bias: np.float32) -> np.ndarray:
    """Per-row slope: head h = (row/ne1) % ne2, powf(m0, h+1) or powf(m1, 2(h-nhl)+1), m0 =
    powf(2, -max_bias/nhl), m1 = powf(2, -(max_bias/2)/nhl): float32, each power correctly rounded."""
    if max_bias <= 0:
        return np.ones(len(rows), dtype=f32)
    nhl = 1 << math.floor(math.log2(ne2))
    m0 = pm.powf(2.0, -max_bias / f32(nhl))
    m1 = pm.powf(2.0, -(max_bias / f32(2)) / f32(nhl))
    slope = np.array([pm.powf(m0, h + 1) if h < nhl else pm.powf(m1, 2 * (h - nhl) + 1) for h in range(ne2)], f32)
    return slope[(rows // ne1) % ne2]


def _soft_max_compiled(node, numerics):
    """``soft_max_f32`` under GGML's numerics (portable_math's exp, as the forward's numpy), ``soft_max_x86``
    under llama.cpp's; ALiBi (max_bias > 0) and rows of no values stay in Python."""
    a = node.src[0]
    mask = node.src[1] if len(node.src) > 1 else None
    if not (a.type == node.type == T.F32 and plain(a, node) and walks_inside(a, node)
            and f32(node.param_f32(1)) <= 0 and a.ne[0] > 0):
        return None
    mkind = 0
    if mask is not None:
        if not (plain(mask) and mask.is_contiguous()):
            return None
        mkind = 1 if mask.type == T.F32 else 2
    scale = (float(f32(node.param_f32(0))),)
    if not is_llama_cpp(numerics):
        def bind_ggml(ith: int, nth: int, shared: dict):
            from ..kernels.tables import F16_TO_F32
            return (*(int(t.ctypes.data) for t in pm.EXP_CONSTS), int(F16_TO_F32.ctypes.data)), \
                (pm.EXP_CONSTS, F16_TO_F32), None
        return CompiledStep("soft_max_f32", (mkind,), scale, bind=bind_ggml)

    def bind(ith: int, nth: int, shared: dict):
        from ..kernels import x86
        from ..kernels.tables import F16_TO_F32
        return (int(x86.EXPF.ctypes.data), int(F16_TO_F32.ctypes.data)), (x86.EXPF, F16_TO_F32), None
    return CompiledStep("soft_max_x86", (int(wide(numerics)), mkind), scale, bind=bind)


@kernel("SOFT_MAX", n_tasks=_soft_max_tasks, work_size=lambda node, n_tasks: 4 * node.ne[0] * n_tasks,
        compiled=_soft_max_compiled)
def forward_soft_max(node, ith, nth, work):
    """Rows in blocks: w = x*scale (+ slope*mask row r % ne1); y = exp(w - max) / sum (sum in double)."""
    a = node.src[0]
    mask = node.src[1] if len(node.src) > 1 else None
    require_type(a, "soft_max", (T.F32,))
    scale, max_bias = f32(node.param_f32(0)), f32(node.param_f32(1))
    r0, r1 = row_block(a.nrows, ith, nth)
    if r0 >= r1:
        return
    x86 = None
    if is_llama_cpp(work.numerics):
        from ..kernels import x86
    m = None
    if mask is not None:
        m = mask.data.reshape(-1)[: mask.ne[0] * mask.ne[1]].reshape(-1, a.ne[0])  # packed rows of ne0
    x, y = row_walk(a), row_walk(node)
    for c0, c1 in chunks(r0, r1, 4 * a.ne[0]):
        y[c0:c1] = _soft_max_rows(a, x[c0:c1], m, c0, c1, scale, max_bias, x86, wide(work.numerics))


def _soft_max_rows(a, x, m, r0: int, r1: int, scale, max_bias, x86, wide_lanes: bool = True) -> np.ndarray:
    """Rows r0..r1 of the result from x (those rows of a) and the packed mask rows m (or None)."""
    w = x * scale if not np.isnan(scale) else keep_first_nan(x, x * scale)
    if m is not None:
        rows = np.arange(r0, r1)
        slope = _alibi_slopes(rows, a.ne[1], a.ne[2], max_bias)
        mr = m[rows % a.ne[1]].astype(f32)
        if x86 is not None:        # w += slope*mask, contracted to an FMA by the x86 build's compiler
            w = x86.fma(np.ascontiguousarray(np.broadcast_to(slope[:, None], w.shape)), mr, np.ascontiguousarray(w))
        else:
            w = keep_first_nan(w, w + slope[:, None] * mr)
    if x86 is not None:   # ggml_v_expf in 16-value (AVX-512) or 8-value (AVX2) chunks
        y = np.empty(w.shape, f32)
        x86.soft_max_rows(np.ascontiguousarray(w, dtype=f32), y, x86.EXPF, wide_lanes)
        return y
    with np.errstate(all="ignore"):
        e = pm.exp_f32(w - row_max(w))
        inv = (1.0 / pm.seq_sum(e)).astype(f32)         # ggml_float sum in order, then 1.0/sum as float
        return keep_first_nan(e, e * inv[:, None])


def keep_first_nan(a: np.ndarray, r: np.ndarray) -> np.ndarray:
    """r (a op b, float32) with a's NaN, made quiet, wherever a is NaN, as x86 gives it when both
    operands are NaN: numpy's loops may put a broadcast operand first (a row's NaN sum times its NaN
    values gave the sum's). ``kernels.nodes``' mul1/add1 keep the first operand's alike."""
    nan = np.isnan(a)
    if nan.any():
        r.view(np.uint32)[nan] = a.view(np.uint32)[nan] | np.uint32(0x400000)
    return r


def row_max(w: np.ndarray) -> np.ndarray:
    """Each row's max (a column) as GGML's ggml_vec_max_f32 takes it: max = MAX(max, x) from -inf, in
    order, so a NaN lasts only as a row's last value (then that NaN's bits) and otherwise the max is
    of the values after the last NaN. numpy's max picks among NaNs by its own SIMD loop (other bits by
    numpy version and CPU); ``kernels.nodes.soft_max_f32`` compiles the same rule."""
    with np.errstate(invalid="ignore"):
        mx = w.max(axis=1, keepdims=True)
    for r in np.flatnonzero(np.isnan(mx[:, 0])):
        row = w[r]
        j = int(np.flatnonzero(np.isnan(row))[-1])
        mx[r, 0] = row[j] if j == len(row) - 1 else row[j + 1:].max()
    return mx


def _soft_max(ctx, a, mask, scale, max_bias, name):
    check(a.is_contiguous(), name, f"a '{a.name}' {fmt_ne(a)} must be contiguous")
    if mask is not None:
        check(mask.type in (T.F16, T.F32), name, f"mask '{mask.name}' must be f16 or f32, not {T.type_name(mask.type)}")
        check(mask.is_contiguous(), name, f"mask '{mask.name}' must be contiguous")
        check(mask.is_matrix(), name, f"mask '{mask.name}' {fmt_ne(mask)} must be a matrix (ne2 = ne3 = 1)")
        check(mask.ne[0] == a.ne[0], name, f"mask '{mask.name}' {fmt_ne(mask)}: ne0 must equal a's ne0 ({a.ne[0]})")
        check(mask.ne[1] >= a.ne[1], name, f"mask '{mask.name}' {fmt_ne(mask)}: ne1 must be >= a's ne1 ({a.ne[1]})")
    check(not (max_bias > 0 and mask is None), name, "max_bias > 0 (ALiBi) needs a mask")
    srcs = (a,) if mask is None else (a, mask)
    return new_op(ctx, "SOFT_MAX", a.type, a.ne, srcs, params=(float(scale), float(max_bias)))


@function("soft_max", "ggml_soft_max(ctx, a)", "softmax of each row")
def soft_max(ctx, a):
    return _soft_max(ctx, a, None, 1.0, 0.0, "soft_max")


@function("soft_max_ext", "ggml_soft_max_ext(ctx, a, mask, scale, max_bias)",
          "softmax(a*scale + slope*mask) per row; mask rows repeat every a.ne1 rows; ALiBi when max_bias > 0")
def soft_max_ext(ctx, a, mask, scale, max_bias):
    return _soft_max(ctx, a, mask, scale, max_bias, "soft_max_ext")


@kernel("DIAG_MASK_INF", n_tasks=ALL)
def forward_diag_mask_inf(node, ith, nth, work):
    """Thread 0 copies a, everyone waits at the barrier, then rows j = ith, ith+nth, ... of every
    slice get -inf where column i > n_past + j."""
    a = node.src[0]
    require_type(a, "diag_mask_inf", (T.F32,))
    n_past = node.param_i32(0)
    require(n_past >= 0, "diag_mask_inf", f"n_past must be >= 0, got {n_past}")
    if node.data_offset != a.data_offset:  # not in place: copy first (checked by every thread)
        require(a.is_contiguous() and node.is_contiguous(), "diag_mask_inf", "a and the result must be contiguous")
        if ith == 0:
            node.data[...] = a.data
        work.barrier()
    nc, nr = a.ne[0], a.ne[1]
    y = node.data.reshape(-1, nr, nc)
    rows = y[:, ith::nth]
    for c0, c1 in chunks(0, rows.shape[1], nc):   # the mask of a chunk of rows, set in place
        j = np.arange(ith + c0 * nth, ith + c1 * nth, nth)
        masked = np.arange(nc)[None, :] > (n_past + j)[:, None]
        np.copyto(rows[:, c0:c1], -np.inf, where=masked)


@function("diag_mask_inf", "ggml_diag_mask_inf(ctx, a, n_past)",
          "causal mask: element i of row j becomes -inf where i > n_past + j")
def diag_mask_inf(ctx, a, n_past):
    return new_op(ctx, "DIAG_MASK_INF", a.type, a.ne, (a,), params=(int(n_past),))
