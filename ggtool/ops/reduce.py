"""Reductions over rows: ggml_sum, ggml_sum_rows, ggml_mean, ggml_argmax. All run on thread 0.

F32 rows are summed in double, as GGML's ggml_float accumulators do, and rounded once.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from .base import check, fmt_ne, function, kernel, new_op
from .walk import chunks, grid_chunks, packed_rows, require_type, row_walk


def _row_sums(a) -> np.ndarray:
    """Per-row sums in float64, shape (ne3, ne2, ne1)."""
    return packed_rows(a).sum(axis=-1, dtype=np.float64)


@kernel("SUM", n_tasks=1)
def forward_sum(node, ith, nth, work):
    """F32: rows in double, added in double, stored as float. F16: float accumulation, as GGML."""
    if ith != 0:
        return
    a = node.src[0]
    require_type(a, "sum", (T.F32, T.F16))
    if a.type == T.F32:
        node.data.reshape(-1)[0] = np.float32(_row_sums(a).sum())
    else:  # ggml_vec_sum_f16_ggf: sequential float sums per row, then a float total
        x = packed_rows(a)
        rows = np.empty(x.shape[:-1], np.float32)
        for c in grid_chunks(x.shape[:-1], 4 * x.shape[-1]):
            rows[c] = np.cumsum(x[c].astype(np.float32), axis=-1, dtype=np.float32)[..., -1]
        total = np.cumsum(rows.reshape(-1), dtype=np.float32)[-1] if rows.size else np.float32(0)
        node.data.reshape(-1)[0] = np.float16(total)


@function("sum", "ggml_sum(ctx, a)", "sum of all elements: a 1-element tensor of a's type")
def sum_all(ctx, a):
    return new_op(ctx, "SUM", a.type, [1], (a,))


@kernel("SUM_ROWS", n_tasks=1)
def forward_sum_rows(node, ith, nth, work):
    if ith != 0:
        return
    a = node.src[0]
    require_type(a, "sum_rows", (T.F32,))
    node.data[..., 0] = _row_sums(a).astype(np.float32)


@function("sum_rows", "ggml_sum_rows(ctx, a)", "sum of each row: ne = [1, ne1, ne2, ne3]")
def sum_rows(ctx, a):
    return new_op(ctx, "SUM_ROWS", a.type, [1, *a.ne[1:]], (a,))


@kernel("MEAN", n_tasks=1)
def forward_mean(node, ith, nth, work):
    """(float)row_sum / (float)ne0, in float32."""
    if ith != 0:
        return
    a = node.src[0]
    require_type(a, "mean", (T.F32,))
    node.data[..., 0] = _row_sums(a).astype(np.float32) / np.float32(a.ne[0])


@function("mean", "ggml_mean(ctx, a)", "mean of each row (F32): ne = [1, ne1, ne2, ne3]")
def mean(ctx, a):
    return new_op(ctx, "MEAN", T.F32, [1, *a.ne[1:]], (a,))


def _argmax_scalar(row: np.ndarray) -> int:
    """ggml_vec_argmax_f32 literally: max = MAX(max, x); if max == x: idx = i (NaN rows only)."""
    mx, idx = np.float32(-np.inf), 0
    for i, v in enumerate(row):
        mx = mx if mx > v else v  # noqa: FURB136 - C's MAX(a, b): a NaN x resets it
        if mx == v:
            idx = i
    return idx


@kernel("ARGMAX", n_tasks=1)
def forward_argmax(node, ith, nth, work):
    """Index of the row maximum; ties give the LAST index (GGML's scan keeps updating on ==)."""
    if ith != 0:
        return
    a = node.src[0]
    require_type(a, "argmax", (T.F32,))
    x = row_walk(a)                                    # (ne1, ne0): argmax asserts a is a matrix
    out = node.data.reshape(-1)
    for c0, c1 in chunks(0, x.shape[0], 4 * x.shape[1]):
        rows = x[c0:c1]
        last = rows.shape[1] - 1 - np.argmax(rows[:, ::-1], axis=1)
        for r in np.nonzero(np.isnan(rows).any(axis=1))[0]:
            last[r] = _argmax_scalar(rows[r])
        out[c0:c1] = last.astype(np.int32)


@function("argmax", "ggml_argmax(ctx, a)", "index of each row's maximum (I32, ties give the last index)")
def argmax(ctx, a):
    check(a.is_matrix(), "argmax", f"a '{a.name}' {fmt_ne(a)} must be a matrix (ne2 = ne3 = 1)")
    check(a.ne[0] <= 2**31 - 1, "argmax", f"a '{a.name}' rows of {a.ne[0]} elements exceed INT32_MAX")
    return new_op(ctx, "ARGMAX", T.I32, [a.ne[1]], (a,))
