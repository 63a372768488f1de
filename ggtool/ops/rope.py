"""rope: rotary position embedding, normal (mode 0) and NEOX (mode 2) pairings (spec 6.12).

a is [head_dim, n_heads, n_tokens, batch]; b holds one I32 position per token. Angles follow
GGML's cache exactly: theta starts at (float)p and is multiplied by theta_scale once per pair,
in float32 (an iterative product, not a recomputed power).
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from .base import ALL, check, fmt_ne, function, kernel, new_op, row_block
from .walk import require, require_type, unravel_rows

f32 = np.float32
ROPE_TYPE_NEOX = 2


def _cos_sin(pos: np.ndarray, ne0: int, n_dims: int, freq_base, freq_scale, attn_factor):
    """cos/sin caches, shape (len(pos), ne0/2): ggml_rope_cache_init with ext_factor = 0."""
    theta_scale = f32(freq_base) ** (f32(-2.0) / f32(n_dims))
    steps = np.empty((len(pos), ne0 // 2), dtype=f32)
    steps[:, 0] = pos.astype(f32)
    steps[:, 1:] = theta_scale
    theta = np.cumprod(steps, axis=1, dtype=f32) * f32(freq_scale)   # sequential float32 products
    t64 = theta.astype(np.float64)
    return (np.cos(t64).astype(f32) * f32(attn_factor), np.sin(t64).astype(f32) * f32(attn_factor))


@kernel("ROPE", n_tasks=ALL, work_size=lambda node, n_tasks: 4 * node.ne[0] * n_tasks)
def forward_rope(node, ith, nth, work):
    """Rows (i1 fastest, then i2, i3) in blocks; pairs below n_dims rotate, the rest are copied."""
    a, pos = node.src[0], node.src[1]
    require_type(a, "rope", (T.F32,))
    require(a.nb[0] == 4, "rope", f"a '{a.name}' needs nb0 == 4")
    p = node.op_params
    n_dims, mode = int(p[1]), int(p[2])
    freq_base, freq_scale, ext_factor, attn_factor = (node.param_f32(i) for i in (5, 6, 7, 8))
    ne0, ne1, ne2, _ = a.ne
    require(n_dims <= ne0 and n_dims % 2 == 0, "rope", f"n_dims ({n_dims}) must be even and <= ne0 ({ne0})")
    require(mode in (0, ROPE_TYPE_NEOX), "rope", f"mode {mode} is not supported (normal 0 and NEOX 2 are)")
    require(ext_factor == 0.0, "rope", "YaRN (ext_factor != 0) is not supported")
    r0, r1 = row_block(node.nrows, ith, nth)
    if r0 >= r1:
        return
    i3, i2, i1 = unravel_rows(np.arange(r0, r1), ne1, ne2)
    x = a.data[i3, i2, i1]                                  # (rows, ne0)
    positions = pos.data.reshape(-1)[i2]
    cos, sin = _cos_sin(positions, ne0, n_dims, freq_base, freq_scale, attn_factor)
    half = n_dims // 2
    cos, sin = cos[:, :half], sin[:, :half]
    if mode == ROPE_TYPE_NEOX:
        j0, j1 = np.arange(half), np.arange(half) + half     # element ic pairs with ic + n_dims/2
    else:
        j0, j1 = np.arange(0, n_dims, 2), np.arange(1, n_dims, 2)
    y = x.copy()
    x0, x1 = x[:, j0], x[:, j1]
    y[:, j0] = x0 * cos - x1 * sin
    y[:, j1] = x0 * sin + x1 * cos
    node.data[i3, i2, i1] = y


@function("rope", "ggml_rope(ctx, a, b, n_dims, mode)",
          "rotary embedding of a's first n_dims of each head; b = I32 positions, one per a.ne2 token")
def rope(ctx, a, b, n_dims, mode):
    check((int(mode) & 1) == 0, "rope", "mode & 1 == 1 is no longer supported")
    check(b.is_vector(), "rope", f"positions b '{b.name}' {fmt_ne(b)} must be a vector")
    check(b.type == T.I32, "rope", f"positions b '{b.name}' must be i32, not {T.type_name(b.type)}")
    check(a.ne[2] == b.ne[0], "rope", f"a '{a.name}' {fmt_ne(a)} has {a.ne[2]} tokens (ne2) but b '{b.name}' has {b.ne[0]} positions")
    params = (0, int(n_dims), int(mode), 0, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0, 0, 0, 0)
    return new_op(ctx, "ROPE", a.type, a.ne, (a, b), params=params)
