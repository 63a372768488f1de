"""add, sub, mul, div: element-wise with GGML's modulo (tiling) broadcast of b over a
(ggml_add, ggml_sub, ggml_mul, ggml_div; ggml_can_repeat(b, a)).

Row r = (i1, i2, i3) of a meets row (i1 % ne11, i2 % ne12, i3 % ne13) of b, and element i0
meets b element i0 % ne10: numpy's `a op np.tile(b, reps)`. Splitting every dim of a into
(repeats, b's size) turns that into plain broadcasting, so nothing is copied.

Math is float32. ADD and SUB take blocks of rows, MUL and DIV interleave rows, as
ggml_compute_forward_add/sub/mul/div split them.
Types: F32 everywhere; ADD also F16 (+F16/F32) and Q4_0/Q8_0 + F32 (dequantize, add,
requantize row by row, which is why ADD has a work size for quantized a).
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from .base import ALL, SPLIT_ALL, CompiledStep, check, fmt_ne, function, kernel, new_op, row_block
from .walk import chunks, cpu_from_float, plain, require, require_type, unravel_rows, with_shape


def _tiled(ufunc, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = a op tile(b) with every dim split as (a.shape // b.shape, b.shape): no copies."""
    split_a = [x for n, m in zip(a.shape, b.shape) for x in (n // m, m)]
    split_b = [x for m in b.shape for x in (1, m)]
    ufunc(with_shape(a, split_a), with_shape(b, split_b), out=with_shape(out, split_a),
          dtype=np.float32, casting="unsafe")


def _same_shape_f32(node, ith: int, nth: int, ufunc, interleaved: bool) -> bool:
    """The common case (f32, b of a's shape, packed rows) without the general path's bookkeeping:
    it is most of a small graph's per-node cost. False if the case does not apply."""
    a, b = node.src
    if not (a.type is b.type is node.type is T.F32 and a.ne == b.ne and a.nb[0] == node.nb[0] == 4):
        return False
    x, y, out = a.data, b.data, node.data
    if nth > 1:
        if not (x.flags.c_contiguous and y.flags.c_contiguous and out.flags.c_contiguous):
            return False
        nr = node.nrows
        sel = slice(ith, nr, nth) if interleaved else slice(*row_block(nr, ith, nth))
        x, y, out = x.reshape(nr, -1)[sel], y.reshape(nr, -1)[sel], out.reshape(nr, -1)[sel]
    ufunc(x, y, out=out)  # the driver runs kernels under np.errstate(all="ignore")
    return True


def _forward(node, ith: int, nth: int, ufunc, interleaved: bool) -> None:
    a, b = node.src
    op = node.op.lower()
    require(node.nb[0] == T.type_size(node.type) and a.nb[0] == T.type_size(a.type), op,
            "a and the result need packed rows (nb0 == type size)")
    nr, ne0 = node.nrows, node.ne[0]
    if T.is_quantized(a.type):
        return _add_quantized(node, a, b, *row_block(nr, ith, nth))
    if nth == 1:
        with np.errstate(all="ignore"):
            _tiled(ufunc, a.data, b.data, node.data)
        return
    sel = slice(ith, nr, nth) if interleaved else slice(*row_block(nr, ith, nth))
    if not len(range(nr)[sel]):
        return
    rows_a, rows_d = with_shape(a.data, (nr, ne0)), with_shape(node.data, (nr, ne0))
    if b.nrows == 1:                       # one b row for every row of a
        rows_b, sel_b = with_shape(b.data, (1, b.ne[0])), slice(None)
    else:                                  # b row r for row r of a, if b has a's rows
        rows_b, sel_b = (with_shape(b.data, (nr, b.ne[0])), sel) if b.ne[1:] == a.ne[1:] else (None, sel)
    with np.errstate(all="ignore"):
        if rows_a is not None and rows_d is not None and rows_b is not None:  # plain row slices
            _tiled(ufunc, rows_a[sel], rows_b[sel_b], rows_d[sel])
            return
        i3, i2, i1 = unravel_rows(np.arange(nr)[sel], node.ne[1], node.ne[2])
        for c0, c1 in chunks(0, len(i1), 4 * ne0):      # gathered and scattered a chunk at a time
            j3, j2, j1 = i3[c0:c1], i2[c0:c1], i1[c0:c1]
            out = np.empty((len(j1), ne0), dtype=node.data.dtype)
            _tiled(ufunc, a.data[j3, j2, j1], b.data[j3 % b.ne[3], j2 % b.ne[2], j1 % b.ne[1]], out)
            node.data[j3, j2, j1] = out


def _add_quantized(node, a, b, r0: int, r1: int) -> None:
    """Q + F32 -> Q: dequantize a's rows, add b's, quantize with the CPU from_float."""
    from .. import quant

    require(a.ne == b.ne == node.ne, "add", "a quantized a needs b of the same shape")
    require(b.type == T.F32 and b.nb[0] == 4, "add", "with a quantized a, b must be f32 with packed rows")
    for c0, c1 in chunks(r0, r1, 4 * a.ne[0]):
        i3, i2, i1 = unravel_rows(np.arange(c0, c1), a.ne[1], a.ne[2])
        x = quant.dequantize(np.ascontiguousarray(a.data[i3, i2, i1]), a.type).reshape(len(i1), -1)
        node.data[i3, i2, i1] = cpu_from_float(x + b.data[i3, i2, i1], node.type)


_OPS = {"ADD": 0, "SUB": 1, "MUL": 2, "DIV": 3}   # kernels.nodes' OP_ADD, ...


def _compiled(node, numerics):
    """f32 throughout, packed rows of a and the result (what the forward requires): ``binary_f32``,
    rows in blocks (ADD, SUB) or interleaved (MUL, DIV) as the forward takes them."""
    a, b = node.src
    if not (node.type == a.type == b.type == T.F32 and plain(node, a, b) and node.nb[0] == a.nb[0] == 4):
        return None
    return CompiledStep("binary_f32", (_OPS[node.op], int(node.op in ("MUL", "DIV"))))


def _quantized_src0_work(node, n_tasks: int) -> int:
    a = node.src[0]
    return 4 * a.ne[0] * n_tasks if T.is_quantized(a.type) else 0


@kernel("ADD", n_tasks=ALL, work_size=_quantized_src0_work, compiled=_compiled)
def forward_add(node, ith, nth, work):
    if _same_shape_f32(node, ith, nth, np.add, interleaved=False):
        return
    a, b = node.src
    require_type(a, "add", (T.F32, T.F16, T.Q4_0, T.Q8_0))
    require_type(b, "add", (T.F32, T.F16) if a.type == T.F16 else (T.F32,), "b")
    require(not (a.type == T.F16 and b.type == T.F32 and a.ne != b.ne), "add", "f16 + f32 needs b of a's shape")
    _forward(node, ith, nth, np.add, interleaved=False)


@kernel("SUB", n_tasks=1, split=SPLIT_ALL, compiled=_compiled)
def forward_sub(node, ith, nth, work):
    """n_tasks is 1 (ggml_get_n_tasks), yet every thread takes its block of rows (ggml_compute_forward_sub_f32)."""
    if _same_shape_f32(node, ith, nth, np.subtract, interleaved=False):
        return
    _f32_only(node, "sub")
    _forward(node, ith, nth, np.subtract, interleaved=False)


@kernel("MUL", n_tasks=ALL, compiled=_compiled)
def forward_mul(node, ith, nth, work):
    if _same_shape_f32(node, ith, nth, np.multiply, interleaved=True):
        return
    _f32_only(node, "mul")
    _forward(node, ith, nth, np.multiply, interleaved=True)


@kernel("DIV", n_tasks=ALL, compiled=_compiled)
def forward_div(node, ith, nth, work):
    if _same_shape_f32(node, ith, nth, np.divide, interleaved=True):
        return
    _f32_only(node, "div")
    _forward(node, ith, nth, np.divide, interleaved=True)


def _f32_only(node, op: str) -> None:
    require_type(node.src[0], op, (T.F32,))
    require_type(node.src[1], op, (T.F32,), "b")


def _binary(ctx, op: str, a, b):
    check(b.can_repeat(a), op.lower(),
          f"b '{b.name}' {fmt_ne(b)} cannot be tiled over a '{a.name}' {fmt_ne(a)} (each a.ne[i] must be a multiple of b.ne[i])")
    return new_op(ctx, op, a.type, a.ne, (a, b))


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
