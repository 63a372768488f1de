"""scale and clamp: F32 maps with scalar op_params (ggml_scale, ggml_clamp).

clamp is GGML's oddity: its result is a view of `a` (op CLAMP), so computing it overwrites a.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from .base import SPLIT_ALL, CompiledStep, check, fmt_ne, function, kernel, new_op, row_block, view_tensor
from .walk import map_rows, plain, require, require_type, row_walk


def _scale_compiled(node, numerics):
    a = node.src[0]
    if not (a.type == node.type == T.F32 and plain(a, node) and a.is_contiguous() and node.is_contiguous()):
        return None
    return CompiledStep("scale_f32", floats=(float(np.float32(node.param_f32(0))),))


@kernel("SCALE", n_tasks=1, split=SPLIT_ALL, compiled=_scale_compiled)
def forward_scale(node, ith, nth, work):
    """y = x*s in float32; rows in blocks over every thread although n_tasks is 1
    (ggml_get_n_tasks; ggml_compute_forward_scale_f32 splits anyway)."""
    a = node.src[0]
    require_type(a, "scale", (T.F32,))
    require(a.is_contiguous() and node.is_contiguous(), "scale", "a and the result must be contiguous")
    r0, r1 = row_block(node.nrows, ith, nth)
    s = np.float32(node.param_f32(0))
    map_rows(lambda x: x * s, row_walk(a), row_walk(node), r0, r1)


@function("scale", "ggml_scale(ctx, a, s)", "a*s (s a float)")
def scale(ctx, a, s):
    check(a.is_padded_1d(), "scale", f"a '{a.name}' {fmt_ne(a)} nb={list(a.nb)} must be padded 1-d (ggml_is_padded_1d)")
    return new_op(ctx, "SCALE", a.type, a.ne, (a,), params=(float(s),))


@kernel("CLAMP", n_tasks=1)
def forward_clamp(node, ith, nth, work):
    """MAX(MIN(x, max), min), thread 0 only; the result is a's memory, so this writes into a."""
    if ith != 0:
        return
    a = node.src[0]
    require_type(a, "clamp", (T.F32,))
    require(a.nb[0] == 4 and node.nb[0] == 4, "clamp", "a and the result need nb0 == 4")
    lo, hi = np.float32(node.param_f32(0)), np.float32(node.param_f32(1))
    def clamp_values(x):
        y = np.where(x < hi, x, hi)           # C's MIN(x, max): NaN x gives max
        return np.where(y > lo, y, lo)        # C's MAX(., min)
    map_rows(clamp_values, row_walk(a), row_walk(node), 0, node.nrows)


@function("clamp", "ggml_clamp(ctx, a, min, max)",
          "min(max(a, min), max) computed INTO a: the result is a view of a")
def clamp(ctx, a, min, max):
    t = view_tensor(ctx, a)
    t.op, t.src = "CLAMP", [a]
    t.set_params(float(min), float(max))
    return t
