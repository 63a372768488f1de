"""cpy, cont, cont_1d..4d, dup: copies in source logical order with type conversion
(ggml_cpy, ggml_cont, ggml_dup; ggml_compute_forward_dup).

One kernel serves DUP, CPY and CONT, like ggml_compute_forward_dup. The path follows the types:
- same type, both packed: a byte copy split by elements (blocks) over the threads;
- same type otherwise: src dim-1 rows in blocks (for each i02, i03); when ne0 and element strides
  agree, GGML copies row (i01, i02, i03) to the SAME indices of dst even if dims 1..3 differ
  (its "copy by rows" shortcut), which this reproduces as long as it stays inside dst;
- F32/F16/BF16 source: converted through f32 (F16 and BF16 round to nearest even, BF16 as
  GGML_FP32_TO_BF16; Q4_0/Q8_0 by the CPU from_float), as GGML's dup_flt / dup_to_q do;
- Q4_0/Q8_0 source into F32 (cpy only): dequantized in blocks of 32 elements.
Elements land at the destination positions with the same linear (logical) index.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..errors import GGToolError
from .base import ALL, CompiledStep, check, fmt_ne, function, kernel, new_op, row_block, view_tensor
from .rows import CONVERSIONS
from .walk import chunks, cpu_from_float, f16_table, plain, require, strided_as, with_shape, write_linear


def _flat(t) -> np.ndarray | None:
    return with_shape(t.data, (t.data.size,))


def _same_type(node, src, ith, nth) -> None:
    if src.is_contiguous() and node.is_contiguous():
        size = T.type_size(src.type)
        k0, k1 = row_block(src.nelements // T.block_size(src.type), ith, nth)
        dst_b, src_b = _flat(node).view(np.uint8), _flat(src).view(np.uint8)
        dst_b[k0 * size:k1 * size] = src_b[k0 * size:k1 * size]
        return
    r0, r1 = row_block(src.ne[1], ith, nth)
    if r0 >= r1:
        return
    size = T.type_size(src.type)
    if src.ne[0] == node.ne[0] and src.nb[0] == size and node.nb[0] == size:
        if node.ne == src.ne:
            dst = node.data
        else:  # GGML's "copy by rows" assumes equal shapes: src row (i1, i2, i3) -> dst row (i1, i2, i3)
            end = sum((src.ne[i] - 1) * node.nb[i] for i in (1, 2, 3)) + T.row_size(src.type, src.ne[0])
            require(end <= node.nbytes, node.op.lower(),
                    f"GGML copies row (i1, i2, i3) of {fmt_ne(src)} to the same indices of {fmt_ne(node)}, "
                    f"which would write past '{node.name}'")
            dst = strided_as(node, src.data.shape)
        dst[:, :, r0:r1] = src.data[:, :, r0:r1]
        return
    require(not T.is_quantized(src.type), "cpy", "quantized rows must keep their length and packing")
    for c0, c1 in chunks(r0, r1, src.ne[0] * src.ne[2] * src.ne[3] * size):
        write_linear(node, src.shape, src.data[:, :, c0:c1], slice(c0, c1))


def _convert(node, src, ith, nth) -> None:
    r0, r1 = row_block(src.ne[1], ith, nth)
    slab = 4 * src.ne[0] * src.ne[2] * src.ne[3]      # f32 bytes of one dim-1 row across dims 2, 3
    for c0, c1 in chunks(r0, r1, slab):
        _convert_rows(node, src, c0, c1)


def _convert_rows(node, src, r0: int, r1: int) -> None:
    """Dim-1 rows r0..r1 of src (for every i2, i3) converted into node."""
    if src.type == T.BF16:
        from ..quant import bf16_to_fp32
        values = bf16_to_fp32(src.data[:, :, r0:r1])
    else:
        values = src.data[:, :, r0:r1].astype(np.float32)
    if not T.is_quantized(node.type):
        write_linear(node, src.shape, cpu_from_float(values, node.type), slice(r0, r1))
        return
    blck = T.block_size(node.type)
    require(node.is_contiguous(), "cpy", f"a quantized destination must be contiguous ('{node.name}' is not)")
    require(src.nb[0] == T.type_size(src.type), "cpy", "quantizing needs source rows with packed elements")
    require(src.ne[0] % blck == 0, "cpy", f"source rows of {src.ne[0]} are not a multiple of the block size {blck}")
    rows = _flat(node).reshape(*src.shape[:3], T.row_size(node.type, src.ne[0]))
    rows[:, :, r0:r1] = cpu_from_float(values, node.type)


def _dequantize(node, src, ith, nth) -> None:
    from .. import quant

    qk, size = T.block_size(src.type), T.type_size(src.type)
    require(node.nb[0] == 4, "cpy", "the F32 destination needs nb0 == 4")
    require(node.ne[0] % qk == 0 or node.is_contiguous(), "cpy",
            f"the destination rows ({node.ne[0]}) must hold whole blocks of {qk}, or be contiguous")
    k0, k1 = row_block(node.nelements // qk, ith, nth)
    if k0 >= k1:
        return
    all_blocks = np.ascontiguousarray(src.data).reshape(-1, size)
    flat = _flat(node)
    for b0, b1 in chunks(k0, k1, 4 * qk):            # blocks dequantized a chunk at a time
        values = quant.dequantize(all_blocks[b0:b1], src.type).reshape(-1)
        if flat is not None:
            flat[b0 * qk:b1 * qk] = values
        else:
            node.data[np.unravel_index(np.arange(b0 * qk, b1 * qk), node.shape)] = values


def _forward_dup(node, ith, nth, work):
    src = node.src[0]
    require(src.nelements == node.nelements, node.op.lower(), "element counts differ")
    if src.type == node.type:
        _same_type(node, src, ith, nth)
    elif src.type in (T.F32, T.F16, T.BF16):
        _convert(node, src, ith, nth)
    elif src.type in (T.Q4_0, T.Q8_0) and node.type == T.F32:
        _dequantize(node, src, ith, nth)
    else:
        raise GGToolError(f"{node.op.lower()}: GGML has no copy from {T.type_name(src.type)} to {T.type_name(node.type)}")


def _copy_work(node, n_tasks: int) -> int:
    """A float row per thread when the destination is quantized (ggml_graph_plan's work size for CPY and DUP), or when cpy goes
    between f16 and bf16 (through f32: ggml_graph_plan's rule, which looks at cpy's b, so not dup)."""
    b = node.src[1] if len(node.src) > 1 else None
    through_f32 = b is not None and {node.src[0].type, b.type} == {T.F16, T.BF16}
    return 4 * node.ne[0] * n_tasks if T.is_quantized(node.type) or through_f32 else 0


def _copy_compiled(node, numerics):
    """``copy``: f32, f16 and i32 elements (f32 <-> f16 converted), any strides, each element to the
    destination element of its linear index, or where the forward copies by rows, to its own indices."""
    src = node.src[0]
    conv = CONVERSIONS.get((src.type, node.type))
    if conv is None or src.nelements != node.nelements or not plain(src, node):
        return None
    by_rows = 0
    if src.type == node.type and not (src.is_contiguous() and node.is_contiguous()):
        size = T.type_size(src.type)
        if src.ne[0] == node.ne[0] and src.nb[0] == size and node.nb[0] == size:
            end = sum((src.ne[i] - 1) * node.nb[i] for i in (1, 2, 3)) + T.row_size(src.type, src.ne[0])
            if node.ne != src.ne and end > node.nbytes:
                return None                       # the forward refuses it
            by_rows = 1
    return CompiledStep("copy", (conv, by_rows), bind=f16_table)


kernel("DUP", n_tasks=ALL, work_size=_copy_work, compiled=_copy_compiled)(_forward_dup)
kernel("CPY", n_tasks=ALL, work_size=_copy_work, compiled=_copy_compiled)(_forward_dup)
kernel("CONT", n_tasks=ALL, compiled=_copy_compiled)(_forward_dup)


@function("cpy", "ggml_cpy(ctx, a, b)",
          "copy a into b's memory, converting to b's type; the result is a view of b")
def cpy(ctx, a, b):
    check(a.nelements == b.nelements, "cpy",
          f"a '{a.name}' {fmt_ne(a)} has {a.nelements} elements, b '{b.name}' {fmt_ne(b)} has {b.nelements}")
    check(not _overlap(a, b), "cpy",
          f"a '{a.name}' and b '{b.name}' overlap in '{a.root.name}': GGML's threads would race, and the "
          "result would depend on the thread count (copy from cont(a) instead)")
    t = view_tensor(ctx, b)
    t.name = f"{b.name} (copy of {a.name})" if b.name else f"{a.name} (copy)"
    t.op, t.src = "CPY", [a, b]
    return t


def _overlap(a, b) -> bool:
    """a and b are views of one tensor whose byte ranges meet, other than as the same layout (which
    copies every element onto itself)."""
    if a.root is not b.root:
        return False
    if (a.view_offs, a.ne, a.nb, a.type) == (b.view_offs, b.ne, b.nb, b.type):
        return False
    return a.view_offs < b.view_offs + b.extent and b.view_offs < a.view_offs + a.extent


@function("dup", "ggml_dup(ctx, a)", "a copy of a in a new packed tensor (unnamed)")
def dup(ctx, a):
    return new_op(ctx, "DUP", a.type, a.ne, (a,))


def _cont(ctx, a, ne):
    n = int(np.prod(ne))
    check(n == a.nelements, "cont", f"a '{a.name}' {fmt_ne(a)} has {a.nelements} elements, the shape {list(ne)} has {n}")
    t = new_op(ctx, "CONT", a.type, ne, (a,))
    t.name = f"{a.name} (cont)"
    return t


@function("cont", "ggml_cont(ctx, a)", "a packed copy of a (e.g. after permute/transpose/view)")
def cont(ctx, a):
    return _cont(ctx, a, a.ne)


@function("cont_1d", "ggml_cont_1d(ctx, a, ne0)", "a packed copy of a with a new shape")
def cont_1d(ctx, a, ne0):
    return _cont(ctx, a, [ne0, 1, 1, 1])


@function("cont_2d", "ggml_cont_2d(ctx, a, ne0, ne1)", "a packed copy of a with a new shape")
def cont_2d(ctx, a, ne0, ne1):
    return _cont(ctx, a, [ne0, ne1, 1, 1])


@function("cont_3d", "ggml_cont_3d(ctx, a, ne0, ne1, ne2)", "a packed copy of a with a new shape")
def cont_3d(ctx, a, ne0, ne1, ne2):
    return _cont(ctx, a, [ne0, ne1, ne2, 1])


@function("cont_4d", "ggml_cont_4d(ctx, a, ne0, ne1, ne2, ne3)", "a packed copy of a with a new shape")
def cont_4d(ctx, a, ne0, ne1, ne2, ne3):
    return _cont(ctx, a, [ne0, ne1, ne2, ne3])
