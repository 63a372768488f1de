"""add, sub, mul, div: element-wise with GGML's modulo (tiling) broadcast of b over a."""

from __future__ import annotations

import numpy as np

from .. import types as T
from .base import ALL, check, fmt_ne, function, kernel, new_op, row_block

_UFUNC = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide}


def _binary(ctx, op: str, a, b):
    check(b.can_repeat(a), op.lower(),
          f"b {fmt_ne(b)} cannot be tiled over a {fmt_ne(a)} (each a.ne[i] must be a multiple of b.ne[i])")
    return new_op(ctx, op, a.type, a.ne, (a, b))


def _tiled(b: np.ndarray, shape) -> np.ndarray:
    """b repeated (np.tile) up to `shape`: GGML's i % ne1x indexing, as a broadcastable view."""
    if b.shape == tuple(shape):
        return b
    reps = [s // n for s, n in zip(shape, b.shape)]
    if all(r == 1 or n == 1 for r, n in zip(reps, b.shape)):
        return b  # plain numpy broadcasting gives the same elements
    return np.tile(b, reps)


def _forward(node, ith: int, nth: int, work, split: str) -> None:
    a, b = node.src
    dst = node.data
    ne1, ne2, ne3 = node.ne[1], node.ne[2], node.ne[3]
    nr = ne1 * ne2 * ne3
    # ADD and SUB take a contiguous block of rows, MUL and DIV interleave rows (spec 9.3)
    if split == "block":
        ir0, ir1 = row_block(nr, ith, nth)
        sel = slice(ir0, ir1)
    else:
        sel = slice(ith, nr, nth)
    av = a.data.astype(np.float32, copy=False) if a.type != T.F32 else a.data
    bv = _tiled(b.data, a.shape)
    bv = np.broadcast_to(bv, a.shape)
    ufunc = _UFUNC[node.op]
    if nth == 1:
        with np.errstate(all="ignore"):
            ufunc(av, bv, out=dst, dtype=np.float32, casting="unsafe")
        return
    d2 = dst.reshape(-1, dst.shape[-1]) if dst.flags.c_contiguous else None
    if d2 is not None and av.flags.c_contiguous:
        a2 = av.reshape(-1, av.shape[-1])
        b2 = np.ascontiguousarray(bv).reshape(-1, bv.shape[-1]) if not bv.flags.c_contiguous else bv.reshape(-1, bv.shape[-1])
        with np.errstate(all="ignore"):
            ufunc(a2[sel], b2[sel], out=d2[sel], dtype=np.float32, casting="unsafe")
        return
    idx = np.arange(nr)[sel]
    i3, rem = np.divmod(idx, ne1 * ne2)
    i2, i1 = np.divmod(rem, ne1)
    with np.errstate(all="ignore"):
        dst[i3, i2, i1] = ufunc(av[i3, i2, i1], bv[i3, i2, i1], dtype=np.float32)


def _quantized_src0_work(node, n_tasks: int) -> int:
    a = node.src[0]
    return 4 * a.ne[0] * n_tasks if T.is_quantized(a.type) else 0


@kernel("ADD", n_tasks=ALL, work_size=_quantized_src0_work)
def forward_add(node, ith, nth, work):
    _forward(node, ith, nth, work, "block")


@kernel("SUB", n_tasks=1)
def forward_sub(node, ith, nth, work):
    _forward(node, ith, nth, work, "block")


@kernel("MUL", n_tasks=ALL)
def forward_mul(node, ith, nth, work):
    _forward(node, ith, nth, work, "interleaved")


@kernel("DIV", n_tasks=ALL)
def forward_div(node, ith, nth, work):
    _forward(node, ith, nth, work, "interleaved")


@function("add", "ggml_add(ctx, a, b)", "a + b; b is tiled (modulo) over a")
def add(ctx, a, b):
    return _binary(ctx, "ADD", a, b)


@function("sub", "ggml_sub(ctx, a, b)", "a - b; b is tiled (modulo) over a")
def sub(ctx, a, b):
    return _binary(ctx, "SUB", a, b)


@function("mul", "ggml_mul(ctx, a, b)", "a * b element-wise; b is tiled (modulo) over a")
def mul(ctx, a, b):
    return _binary(ctx, "MUL", a, b)


@function("div", "ggml_div(ctx, a, b)", "a / b element-wise; b is tiled (modulo) over a")
def div(ctx, a, b):
    return _binary(ctx, "DIV", a, b)
