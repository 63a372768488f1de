"""view_1d..4d, reshape_1d..4d, permute, transpose: views that allocate no data (ggml_view_*,
ggml_reshape_*, ggml_permute, ggml_transpose)."""

from __future__ import annotations

import numpy as np

from .. import types as T
from .base import check, fmt_ne, function, new_op, noop_kernel

for _op in ("VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"):
    noop_kernel(_op)  # GGML's compute_forward does nothing for these
noop_kernel("NONE")


def _view(ctx, a, ne, nb, offset: int):
    """A VIEW of `a`; nb = [nb1, nb2, nb3] (None: packed). Context.new_tensor checks that every
    element it reaches lies inside a's bytes."""
    offset = int(offset)
    check(offset >= 0, "view", f"offset must be >= 0, got {offset}")
    if nb is not None:
        nb = [T.type_size(a.type), *[int(x) for x in nb]]
    t = new_op(ctx, "VIEW", a.type, ne, (a,), view_of=a, view_offs=offset, nb=nb)
    t.op_params.view(np.uint64)[0] = offset
    t.name = f"{a.name} (view)"
    return t


@function("view_1d", "ggml_view_1d(ctx, a, ne0, offset)", "1-D view of ne0 elements at a byte offset")
def view_1d(ctx, a, ne0, offset=0):
    return _view(ctx, a, [ne0], None, offset)


@function("view_2d", "ggml_view_2d(ctx, a, ne0, ne1, nb1, offset)",
          "2-D view: ne0 x ne1 with row stride nb1 (bytes) at a byte offset")
def view_2d(ctx, a, ne0, ne1, nb1, offset=0):
    return _view(ctx, a, [ne0, ne1], [nb1, nb1 * ne1, nb1 * ne1], offset)


@function("view_3d", "ggml_view_3d(ctx, a, ne0, ne1, ne2, nb1, nb2, offset)",
          "3-D view with byte strides nb1, nb2 at a byte offset")
def view_3d(ctx, a, ne0, ne1, ne2, nb1, nb2, offset=0):
    return _view(ctx, a, [ne0, ne1, ne2], [nb1, nb2, nb2 * ne2], offset)


@function("view_4d", "ggml_view_4d(ctx, a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset)",
          "4-D view with byte strides nb1, nb2, nb3 at a byte offset")
def view_4d(ctx, a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset=0):
    return _view(ctx, a, [ne0, ne1, ne2, ne3], [nb1, nb2, nb3], offset)


def _reshape(ctx, a, ne):
    n = int(np.prod(ne))
    check(a.is_contiguous(), "reshape", f"a '{a.name}' {fmt_ne(a)} is not contiguous (use cont first)")
    check(n == a.nelements, "reshape",
          f"a '{a.name}' {fmt_ne(a)} has {a.nelements} elements, the new shape {list(ne)} has {n}")
    t = new_op(ctx, "RESHAPE", a.type, ne, (a,), view_of=a, view_offs=0)
    t.name = f"{a.name} (reshaped)"
    return t


@function("reshape_1d", "ggml_reshape_1d(ctx, a, ne0)", "same data, new shape (a must be contiguous)")
def reshape_1d(ctx, a, ne0):
    return _reshape(ctx, a, [ne0])


@function("reshape_2d", "ggml_reshape_2d(ctx, a, ne0, ne1)", "same data, new shape (a must be contiguous)")
def reshape_2d(ctx, a, ne0, ne1):
    return _reshape(ctx, a, [ne0, ne1])


@function("reshape_3d", "ggml_reshape_3d(ctx, a, ne0, ne1, ne2)", "same data, new shape (a must be contiguous)")
def reshape_3d(ctx, a, ne0, ne1, ne2):
    return _reshape(ctx, a, [ne0, ne1, ne2])


@function("reshape_4d", "ggml_reshape_4d(ctx, a, ne0, ne1, ne2, ne3)", "same data, new shape (a must be contiguous)")
def reshape_4d(ctx, a, ne0, ne1, ne2, ne3):
    return _reshape(ctx, a, [ne0, ne1, ne2, ne3])


@function("reshape", "ggml_reshape(ctx, a, b)", "a's data with b's shape (a must be contiguous)")
def reshape(ctx, a, b):
    return _reshape(ctx, a, list(b.ne))


@function("permute", "ggml_permute(ctx, a, axis0, axis1, axis2, axis3)",
          "source dim i goes to position axis_i (a view; the inverse of numpy's transpose axes)")
def permute(ctx, a, axis0, axis1, axis2, axis3):
    axes = [int(axis0), int(axis1), int(axis2), int(axis3)]
    check(sorted(axes) == [0, 1, 2, 3], "permute", f"axes {axes} are not a permutation of 0, 1, 2, 3")
    # made with a's layout, then permuted (as GGML does): a quantized tensor's permuted ne0 need not hold
    # whole blocks, and a permutation of a's ne and nb reaches exactly the bytes a reaches
    t = new_op(ctx, "PERMUTE", a.type, a.ne, (a,), params=axes, view_of=a, view_offs=0, nb=a.nb)
    t.name = f"{a.name} (permuted)"
    ne, nb = [0] * 4, [0] * 4
    for i, p in enumerate(axes):
        ne[p], nb[p] = a.ne[i], a.nb[i]
    t.ne, t.nb = tuple(ne), tuple(nb)
    return t


@function("transpose", "ggml_transpose(ctx, a)", "swap dims 0 and 1 (a view)")
def transpose(ctx, a):
    t = new_op(ctx, "TRANSPOSE", a.type, a.ne, (a,), view_of=a, view_offs=0, nb=a.nb)
    t.name = f"{a.name} (transposed)"
    t.ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])   # a permutation of a's layout, as in permute
    t.nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
    return t



