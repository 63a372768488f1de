"""Random graphs for property tests: a hypothesis strategy building GGML graphs from ops on small
f32 tensors: unary ops, binary ops with tiling, norms, soft_max, mul_mat, views (transpose,
permute, reshape, view_1d), cont, cpy (a view of its destination), clamp (a view of its source),
concat, reductions and get_rows. Some tensors are picked as outputs (each expanded in turn, as
the DSL does), now and then one is flagged INPUT, so graphs have several roots and dead ends."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import ggtool
from ggtool.errors import GGToolError
from ggtool.ops import FUNCTIONS as F
from ggtool.tensor import FLAG_INPUT

SHAPES = ([4, 4], [8, 4], [4, 8], [4, 2], [4, 1], [32, 4], [2, 4, 2])
UNARY = ("relu", "silu", "gelu", "neg", "exp", "tanh", "sigmoid", "abs", "sqr", "sqrt", "log")
BINARY = ("add", "sub", "mul", "div")
OPS = (*UNARY, *BINARY, *BINARY, "scale", "rms_norm", "norm", "soft_max", "diag_mask_inf", "mul_mat",
       "mul_mat", "transpose", "permute", "reshape_1d", "view_1d", "cont", "cpy", "clamp", "concat", "sum_rows",
       "mean", "get_rows", "soft_max_ext")


def _apply(ctx, op: str, a, b, idx):
    if op in UNARY:
        return F[op](ctx, a)
    if op in BINARY:
        return F[op](ctx, a, b)
    if op == "scale":
        return F["scale"](ctx, a, 0.5)
    if op in ("rms_norm", "norm"):
        return F[op](ctx, a, 1e-5)
    if op == "soft_max":
        return F["soft_max"](ctx, a)
    if op == "soft_max_ext":
        return F["soft_max_ext"](ctx, a, b, 0.5, 0.0)
    if op == "diag_mask_inf":
        return F["diag_mask_inf"](ctx, a, 0)
    if op == "mul_mat":
        return F["mul_mat"](ctx, a, b)
    if op == "transpose":
        return F["transpose"](ctx, a)
    if op == "permute":
        return F["permute"](ctx, a, 1, 0, 2, 3)
    if op == "reshape_1d":
        return F["reshape_1d"](ctx, a, a.nelements)
    if op == "view_1d":
        n = max(1, a.ne[0] // 2)
        return F["view_1d"](ctx, a, n, (a.ne[0] - n) * 4 if a.is_contiguous() else 0)
    if op == "cont":
        return F["cont"](ctx, a)
    if op == "cpy":
        return F["cpy"](ctx, a, b)
    if op == "clamp":
        return F["clamp"](ctx, a, -1.0, 1.0)
    if op == "concat":
        return F["concat"](ctx, a, b, 1)
    if op in ("sum_rows", "mean"):
        return F[op](ctx, a)
    if op == "get_rows":
        if a.ne[1] < 2:               # the indices are 0 and 1
            raise ValueError("too few rows")
        return F["get_rows"](ctx, a, idx)
    raise AssertionError(op)


@st.composite
def graphs(draw, max_steps: int = 24):
    """(ctx, graph, roots, outputs): `roots` were expanded in order; `outputs` are the tensors the
    caller must keep (the roots and a few more, as `--output` would name)."""
    ctx = ggtool.Context()
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    pool = []
    for _ in range(draw(st.integers(1, 3))):
        ne = draw(st.sampled_from(SHAPES))
        pool.append(ctx.new_tensor_from(rng.standard_normal(ne[::-1]).astype(np.float32)))
    idx = ctx.new_tensor_from(np.array([1, 0, 1], np.int32))
    results = []
    for _ in range(draw(st.integers(1, max_steps))):
        op = draw(st.sampled_from(OPS))
        a = draw(st.sampled_from(pool))
        b = draw(st.sampled_from(pool))
        try:
            t = _apply(ctx, op, a, b, idx)
        except (GGToolError, ValueError):
            continue
        if draw(st.integers(0, 15)) == 0 and t.view_src is None:
            t.flags |= FLAG_INPUT
        pool.append(t)
        results.append(t)
    if not results:
        results.append(F["relu"](ctx, pool[0]))
    picks = [*draw(st.lists(st.sampled_from(results), max_size=2)), results[-1]]
    roots = list({id(t): t for t in picks}.values())       # distinct, in order
    g = ggtool.Graph(ctx)
    for r in roots:
        g.expand(r)
    extra = draw(st.lists(st.sampled_from(results), max_size=2))
    outputs = list({id(t): t for t in [*roots, *extra] if _in_graph(g, t)}.values())
    return ctx, g, roots, outputs


def _in_graph(g, t) -> bool:
    return any(x is t for x in g.nodes) or any(x is t for x in g.leafs)
