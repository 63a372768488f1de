"""Data movement by rows and tiles: get_rows, set_rows, repeat, concat (ggml_get_rows,
ggml_set_rows, ggml_repeat, ggml_concat)."""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..quant.matmul import dot_types
from .base import ALL, SPLIT_ALL, CompiledStep, check, fmt_ne, function, kernel, new_op, row_block, view_tensor
from .walk import chunks, cpu_from_float, f16_table, plain, require, require_type, unravel_rows, with_shape


# get_rows' source kinds in kernels.nodes (K_F32, ...): the types its compiled kernel converts
_ROWS_KIND = {T.F32: 0, T.F16: 1, T.I32: 2, T.Q4_0: 3, T.Q8_0: 4}


def _get_rows_compiled(node, numerics):
    """``get_rows``: f32, f16, i32, q4_0 and q8_0 rows (packed), i32 indices, packed result rows."""
    a, idx = node.src
    kind = _ROWS_KIND.get(a.type)
    if kind is None or not (a.has_data and a.nb[0] == T.type_size(a.type) and plain(node, idx) and node.nb[0] == 4):
        return None
    if T.is_quantized(a.type):
        if a.data_offset % 2 or any(nb % 2 for nb in a.nb):   # the block's f16 scale is read as bytes
            return None
    elif not plain(a):
        return None
    return CompiledStep("get_rows", (kind,), bind=f16_table)


@kernel("GET_ROWS", n_tasks=1, split=SPLIT_ALL, compiled=_get_rows_compiled)
def forward_get_rows(node, ith, nth, work):
    """out[:, i10, i11, i12] = a[:, idx[i10, i11, i12], i11, i12], converted to F32 (I32 stays).
    The nelements(idx) output rows are split in blocks over every thread although n_tasks is 1."""
    from .. import quant

    a, idx = node.src
    require_type(a, "get_rows", (T.F32, T.F16, T.I32, *dot_types()))
    nr = idx.nelements
    r0, r1 = row_block(nr, ith, nth)
    if r0 >= r1:
        return
    ne10, ne11 = idx.ne[0], idx.ne[1]
    i12, i11, i10 = unravel_rows(np.arange(r0, r1), ne10, ne11)
    rows = idx.data[0, i12, i11, i10].astype(np.int64)
    bad = rows[(rows < 0) | (rows >= a.ne[1])]
    require(bad.size == 0, "get_rows", f"index {bad[0] if bad.size else 0} is outside 0..{a.ne[1] - 1} (a's rows)")
    for c0, c1 in chunks(0, r1 - r0, 4 * a.ne[0]):  # the rows picked (and converted) a chunk at a time
        c = slice(c0, c1)
        src = a.data[i12[c], i11[c], rows[c]]     # (n, ne0) elements, or (n, row_bytes) for quantized
        if T.is_quantized(a.type):
            src = quant.dequantize(np.ascontiguousarray(src), a.type)
        elif a.type == T.BF16:                    # GGML's to_float: the bits widened, exact
            src = quant.bf16_to_fp32(src)
        node.data[i12[c], i11[c], i10[c]] = src


@function("get_rows", "ggml_get_rows(ctx, a, b)",
          "rows of a picked by the I32 indices in b (F32 result; I32 a stays I32; f16, bf16 and block types are dequantized)")
def get_rows(ctx, a, b):
    check(a.ne[2] == b.ne[1], "get_rows", f"a '{a.name}' {fmt_ne(a)}: ne2 must equal b's ne1 (b '{b.name}' {fmt_ne(b)})")
    check(b.ne[3] == 1, "get_rows", f"indices b '{b.name}' {fmt_ne(b)} must have ne3 == 1")
    check(b.type == T.I32, "get_rows", f"indices b '{b.name}' must be i32, not {T.type_name(b.type)}")
    check(b.ne[2] <= a.ne[3], "get_rows", f"b '{b.name}' {fmt_ne(b)}: ne2 exceeds a's ne3 (GGML would read past a)")
    out_type = T.I32 if a.type == T.I32 else T.F32
    return new_op(ctx, "GET_ROWS", out_type, [a.ne[0], b.ne[0], b.ne[1], b.ne[2]], (a, b))


def _set_rows_work(node, n_tasks: int) -> int:
    """ggml_graph_plan's rule: an f32 row per thread when f16 rows go into a tensor of another type."""
    b = node.src[0]
    return 4 * b.ne[0] * n_tasks if b.type == T.F16 and node.type != T.F16 else 0


# element conversions of kernels.nodes (C_COPY4, ...) by (source type, destination type)
CONVERSIONS = {(T.F32, T.F32): 0, (T.I32, T.I32): 0, (T.F16, T.F16): 1, (T.BF16, T.BF16): 1,
               (T.F32, T.F16): 2, (T.F16, T.F32): 3}


def _set_rows_compiled(node, numerics):
    """``set_rows``: f32/f16 rows into f32/f16, i32 or i64 indices."""
    b, idx = node.src[0], node.src[1]
    conv = CONVERSIONS.get((b.type, node.type))
    if conv is None or not (plain(b, idx, node) and b.nb[0] == T.type_size(b.type) and
                            node.nb[0] == T.type_size(node.type)):
        return None
    return CompiledStep("set_rows", (conv, T.type_size(idx.type)), bind=f16_table)


@kernel("SET_ROWS", n_tasks=1, work_size=_set_rows_work, split=SPLIT_ALL, compiled=_set_rows_compiled)
def forward_set_rows(node, ith, nth, work):
    """dst[:, idx[i, i02 % ne11, i03 % ne12], i02, i03] = from_float(b[:, i, i02, i03]): b's rows
    (split in blocks over the threads, for every i02, i03) written into the result, a view of a, at
    the rows the I32/I64 indices name, converted to its type as the CPU's from_float does."""
    b, idx = node.src[0], node.src[1]
    require_type(b, "set_rows", (T.F32, T.F16), "b")
    r0, r1 = row_block(b.ne[1], ith, nth)
    if r0 >= r1:
        return
    if idx.ne[1] == idx.ne[2] == 1 and b.type == node.type == T.F32:
        # a KV cache's write (K's rows, or V's one-element rows of every column): the same indices
        # for every (i02, i03), one plain copy
        rows = idx.data[0, 0, 0, r0:r1]
        if rows.min() < 0 or rows.max() >= node.ne[1]:     # (the message only when it is needed)
            bad = rows[(rows < 0) | (rows >= node.ne[1])][0]
            require(False, "set_rows", f"index {bad} is outside 0..{node.ne[1] - 1} (the rows of '{node.src[2].name}')")
        node.data[:, :, rows] = b.data[:, :, r0:r1]
        return
    ne11, ne12 = idx.ne[1], idx.ne[2]
    i03 = np.arange(b.ne[3])[:, None, None]
    i02 = np.arange(b.ne[2])[None, :, None]
    for c0, c1 in chunks(r0, r1, 4 * b.ne[0] * b.ne[2] * b.ne[3]):   # rows c0..c1 of every (i02, i03)
        rows = idx.data[0][i03 % ne12, i02 % ne11, np.arange(c0, c1)[None, None, :]].astype(np.int64)
        bad = rows[(rows < 0) | (rows >= node.ne[1])]
        require(bad.size == 0, "set_rows", f"index {bad[0] if bad.size else 0} is outside 0..{node.ne[1] - 1} "
                f"(the rows of '{node.src[2].name}')")
        values = b.data[:, :, c0:c1]
        if b.type != node.type:               # f16 widened exactly, then from_float; same type: GGML's memcpy
            values = cpu_from_float(values.astype(np.float32), node.type)
        node.data[i03, i02, rows] = values


@function("set_rows", "ggml_set_rows(ctx, a, b, c)",
          "b's rows written into a at the rows the I32/I64 indices c name (b F32 or F16, converted to a's type); "
          "the result is a view of a, written in place")
def set_rows(ctx, a, b, c):
    def shapes():
        return f"a '{a.name}' {fmt_ne(a)}, b '{b.name}' {fmt_ne(b)}, c '{c.name}' {fmt_ne(c)}"
    check(a.ne[0] == b.ne[0] and a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3], "set_rows",
          f"a and b must agree in ne0, ne2 and ne3 ({shapes()})")
    check(b.ne[1] == c.ne[0], "set_rows", f"c must hold one index per row of b (b's ne1 == c's ne0: {shapes()})")
    check(b.ne[2] % c.ne[1] == 0 and b.ne[3] % c.ne[2] == 0 and c.ne[3] == 1, "set_rows",
          f"c's ne1, ne2 must divide b's ne2, ne3, and c's ne3 be 1 ({shapes()})")
    check(b.type in (T.F32, T.F16), "set_rows", f"b '{b.name}' must be f32 or f16, not {T.type_name(b.type)}")
    check(c.type in (T.I32, T.GGMLType.I64), "set_rows", f"indices c '{c.name}' must be i32 or i64, not {T.type_name(c.type)}")
    for t in (a, b):
        check(t.ne[0] == T.block_size(t.type) or t.nb[0] == T.type_size(t.type), "set_rows",
              f"'{t.name}' {fmt_ne(t)} needs packed rows (ggml_is_contiguous_rows)")
    check(not T.is_quantized(a.type) or a.type in (T.Q4_0, T.Q8_0), "set_rows",
          f"a '{a.name}' is {T.type_name(a.type)}: ggtool converts rows to f32, f16, bf16, q4_0 and q8_0 only")
    check(a.root is not b.root, "set_rows",
          f"b '{b.name}' is a view of a's tensor '{a.root.name}': the rows would be read while written")
    t = view_tensor(ctx, a)
    t.op, t.src = "SET_ROWS", [b, c, a]       # GGML's order: src[2] is a
    return t


@kernel("REPEAT", n_tasks=1)
def forward_repeat(node, ith, nth, work):
    """np.tile of a to the result's shape (thread 0)."""
    if ith != 0:
        return
    a = node.src[0]
    require_type(a, "repeat", (T.F32, T.I32, T.F16, T.BF16, T.GGMLType.I16))
    size = T.type_size(a.type)
    require(a.nb[0] == size and node.nb[0] == size, "repeat", "a and the result need packed rows (nb0 == type size)")
    # np.tile without its full-size temporary: every dim of the result split as (repeats, a's size)
    split = [x for n, m in zip(node.shape, a.shape) for x in (n // m, m)]
    out, src = with_shape(node.data, split), with_shape(a.data, [x for m in a.shape for x in (1, m)])
    if out is None or src is None:
        node.data[...] = np.tile(a.data, [n // m for n, m in zip(node.shape, a.shape)])
        return
    out[...] = src


@function("repeat", "ggml_repeat(ctx, a, b)", "a tiled (np.tile) to b's shape; b only gives the shape")
def repeat(ctx, a, b):
    check(a.can_repeat(b), "repeat",
          f"a '{a.name}' {fmt_ne(a)} cannot be tiled to b '{b.name}' {fmt_ne(b)} (each b.ne[i] must be a multiple of a.ne[i])")
    return new_op(ctx, "REPEAT", a.type, b.ne, (a,))


@kernel("CONCAT", n_tasks=ALL)
def forward_concat(node, ith, nth, work):
    """np.concatenate along ggml dim `dim`; threads take i2 = ith, ith+nth, ... (any strides)."""
    a, b = node.src
    require(not T.is_quantized(a.type), "concat", "quantized tensors cannot be concatenated element-wise")
    dim = node.param_i32(0)
    axis = 3 - dim
    y = node.data
    if dim != 2:                           # a's part, then b's, written in place
        sel = (slice(None), slice(ith, None, nth))
        n_a = a.shape[axis]
        y[sel][(slice(None),) * axis + (slice(0, n_a),)] = a.data[sel]
        y[sel][(slice(None),) * axis + (slice(n_a, None),)] = b.data[sel]
        return
    n_a = a.ne[2]
    y[:, ith:n_a:nth] = a.data[:, ith::nth]
    first_b = ith if ith >= n_a else ith + -(-(n_a - ith) // nth) * nth   # first i2 >= n_a of this thread
    y[:, first_b::nth] = b.data[:, first_b - n_a::nth]


@function("concat", "ggml_concat(ctx, a, b, dim)", "a and b joined along ggml dim `dim` (0..3)")
def concat(ctx, a, b, dim):
    dim = int(dim)
    check(0 <= dim < 4, "concat", f"dim must be 0..3, got {dim}")
    check(a.type == b.type, "concat", f"a '{a.name}' is {T.type_name(a.type)} but b '{b.name}' is {T.type_name(b.type)}")
    for d in range(4):
        check(d == dim or a.ne[d] == b.ne[d], "concat",
              f"a '{a.name}' {fmt_ne(a)} and b '{b.name}' {fmt_ne(b)} differ in dim {d} (only dim {dim} may)")
    ne = [a.ne[d] + b.ne[d] if d == dim else a.ne[d] for d in range(4)]
    return new_op(ctx, "CONCAT", a.type, ne, (a, b), params=(dim,))
