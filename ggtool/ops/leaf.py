"""new_tensor_1d..4d: zero-filled leaf tensors (op NONE), e.g. a destination for cpy in the DSL."""

from __future__ import annotations

from .base import function


def _new(ctx, type, ne):
    t = ctx.new_tensor(type, [int(n) for n in ne])
    if t.has_data:
        t.data[...] = 0  # the pool may be reused memory; a new leaf starts at zero here
    return t


@function("new_tensor_1d", "ggml_new_tensor_1d(ctx, type, ne0)", "a new zero-filled tensor of a type (f32, f16, q4_0, ...)")
def new_tensor_1d(ctx, type, ne0):
    return _new(ctx, type, [ne0])


@function("new_tensor_2d", "ggml_new_tensor_2d(ctx, type, ne0, ne1)", "a new zero-filled tensor of a type")
def new_tensor_2d(ctx, type, ne0, ne1):
    return _new(ctx, type, [ne0, ne1])


@function("new_tensor_3d", "ggml_new_tensor_3d(ctx, type, ne0, ne1, ne2)", "a new zero-filled tensor of a type")
def new_tensor_3d(ctx, type, ne0, ne1, ne2):
    return _new(ctx, type, [ne0, ne1, ne2])


@function("new_tensor_4d", "ggml_new_tensor_4d(ctx, type, ne0, ne1, ne2, ne3)", "a new zero-filled tensor of a type")
def new_tensor_4d(ctx, type, ne0, ne1, ne2, ne3):
    return _new(ctx, type, [ne0, ne1, ne2, ne3])
