"""norm and rms_norm: each row normalised on its own, no weight or bias (ggml_norm,
ggml_rms_norm).

Threads take dim-1 rows interleaved (i01 = ith, ith+nth, ...) inside every (i02, i03) slice.
Sums are GGML's: a float64 from +0.0, plus each float32 term in order (GGML sums `(ggml_float)(v*v)`,
the product in float), whatever the host (``portable_math.seq_sum``).
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..kernels.portable_math import seq_sum
from .base import ALL, CompiledStep, function, kernel, new_op
from .walk import grid_chunks, plain, require, require_type

f32 = np.float32


def _rows(node, ith, nth, op):
    a = node.src[0]
    require_type(a, op, (T.F32,))
    require(a.nb[0] == 4, op, f"a '{a.name}' needs nb0 == 4")
    eps = f32(node.param_f32(0))
    require(eps >= 0, op, f"eps must be >= 0, got {eps}")
    sel = (slice(None), slice(None), slice(ith, None, nth))
    return a.data[sel], node.data[sel], eps, a.ne[0]


def _by_chunks(node, ith, nth, op, rows_fn) -> None:
    """y = rows_fn(x, eps, n) over this thread's rows, in chunks (walk.CHUNK_BYTES)."""
    x, y, eps, n = _rows(node, ith, nth, op)
    for c in grid_chunks(x.shape[:-1], 4 * n):
        y[c] = rows_fn(x[c], eps, n)


def _norm_rows(x, eps, n):
    mean = (seq_sum(x) / n).astype(f32)
    v = x - mean[..., None]
    variance = (seq_sum(v * v) / n).astype(f32)
    return v * (f32(1) / np.sqrt(variance + eps))[..., None]


def _rms_norm_rows(x, eps, n):
    mean = (seq_sum(x * x) / n).astype(f32)
    return x * (f32(1) / np.sqrt(mean + eps))[..., None]


@kernel("NORM", n_tasks=ALL)
def forward_norm(node, ith, nth, work):
    _by_chunks(node, ith, nth, "norm", _norm_rows)


@function("norm", "ggml_norm(ctx, a, eps)", "each row to zero mean and unit variance: (x-mean)/sqrt(var+eps)")
def norm(ctx, a, eps):
    return new_op(ctx, "NORM", a.type, a.ne, (a,), params=(float(eps),))


def _rms_norm_compiled(node, numerics):
    """``rms_norm_f32``: f32, packed rows, eps >= 0 (else the forward says what is wrong)."""
    a = node.src[0]
    eps = f32(node.param_f32(0))
    if not (a.type == node.type == T.F32 and plain(a, node) and a.nb[0] == node.nb[0] == 4 and eps >= 0):
        return None
    return CompiledStep("rms_norm_f32", (0,), (float(eps),))


def _rms_norm_fuse(node, nxt, numerics):
    """RMS_NORM then MUL by an f32 row of its width, in one step as GGML's CPU backend fuses them
    (ggml_compute_forward_rms_norm_mul_fused): each row's (x * scale) * w, both products rounded as
    the two nodes round them; the norm's own result is not written."""
    if nxt.op != "MUL" or nxt.src[0] is not node:
        return None
    base = _rms_norm_compiled(node, numerics)
    w = nxt.src[1]
    if base is None or not (w.type == nxt.type == T.F32 and plain(w, nxt) and w.nb[0] == nxt.nb[0] == 4
                            and w.ne[0] == node.ne[0] and nxt.ne == node.ne):
        return None
    return CompiledStep("rms_norm_f32", (1,), base.floats, tensors=(node, node.src[0], w, nxt))


@kernel("RMS_NORM", n_tasks=ALL, compiled=_rms_norm_compiled, fuse=_rms_norm_fuse)
def forward_rms_norm(node, ith, nth, work):
    _by_chunks(node, ith, nth, "rms_norm", _rms_norm_rows)


@function("rms_norm", "ggml_rms_norm(ctx, a, eps)", "each row divided by its root mean square: x/sqrt(mean(x^2)+eps)")
def rms_norm(ctx, a, eps):
    return new_op(ctx, "RMS_NORM", a.type, a.ne, (a,), params=(float(eps),))
