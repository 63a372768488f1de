"""rope: rotary position embedding, normal (mode 0) and NEOX (mode 2) pairings (ggml_rope_ext;
ggml_compute_forward_rope_f32).

a is [head_dim, n_heads, n_tokens, batch]; b holds one I32 position per token. Angles follow
GGML's cache exactly: theta starts at (float)p and is multiplied by theta_scale once per pair,
in float32 (an iterative product, not a recomputed power).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import numpy as np

from .. import types as T
from ..kernels import portable_math as pm
from ..kernels.numerics import is_llama_cpp
from .base import ALL, CompiledStep, check, fmt_ne, function, kernel, new_op, row_block
from .walk import CHUNK_BYTES, chunks, plain, require, require_type, unravel_rows, with_shape

f32 = np.float32
ROPE_TYPE_NEOX = 2


# The caches of blocks of consecutive positions, per process and parameters, made once (one numpy call
# for a block costs what one position's does) and kept, least recently used out first: a decode
# step's one position, in every participant and every rope node, is then a row copied, not ~0.2 ms of
# numpy before the compute can start. A row depends on its position alone, so a block's rows are the
# bits a call for that position alone gives. Bounded: a block holds at most CACHE_VALUES pairs (256
# positions of a 128-wide head), TABLE_KEEP blocks are kept (2 MiB); rows of more than
# CACHE_VALUES / 16 pairs are computed each time.
_TABLES: OrderedDict = OrderedDict()
TABLE_KEEP, CACHE_VALUES = 16, 1 << 14


def block_len(pairs: int) -> int:
    """Positions a block holds for rows of `pairs` pairs (a power of two; 0: not kept)."""
    n = CACHE_VALUES // max(pairs, 1)
    return 1 << (n.bit_length() - 1) if n >= 16 else 0


def _cos_sin(pos: np.ndarray, ne0: int, n_dims: int, freq_base, freq_scale, attn_factor, x86: bool = False):
    """_cos_sin_uncached's result, its rows taken from the blocks of _TABLES."""
    pos = np.asarray(pos, np.int64).reshape(-1)
    n = block_len(ne0 // 2)
    if n == 0:
        return _cos_sin_uncached(pos, ne0, n_dims, freq_base, freq_scale, attn_factor, x86)
    params = (ne0, n_dims, float(freq_base), float(freq_scale), float(attn_factor), bool(x86))
    blocks = pos // n
    if len(pos) and (blocks == blocks[0]).all():            # a decode step's position, a short batch
        c, s = _block(params, int(blocks[0]), n)
        at = pos - int(blocks[0]) * n
        return c[at], s[at]
    cos, sin = np.empty((len(pos), ne0 // 2), f32), np.empty((len(pos), ne0 // 2), f32)
    for b in np.unique(blocks):
        c, s = _block(params, int(b), n)
        mine = blocks == b
        cos[mine], sin[mine] = c[pos[mine] - int(b) * n], s[pos[mine] - int(b) * n]
    return cos, sin


def _block(params: tuple, b: int, n: int):
    """The cos/sin caches of positions b*n .. b*n + n - 1, from _TABLES."""
    key = (*params, b)
    got = _TABLES.get(key)
    if got is None:
        got = _TABLES[key] = _cos_sin_uncached(np.arange(b * n, b * n + n, dtype=np.int64), *params)
        while len(_TABLES) > TABLE_KEEP:
            _TABLES.popitem(last=False)
    else:
        _TABLES.move_to_end(key)
    return got


def _cos_sin_uncached(pos: np.ndarray, ne0: int, n_dims: int, freq_base, freq_scale, attn_factor, x86: bool = False):
    """cos/sin caches, shape (len(pos), ne0/2): ggml_rope_cache_init with ext_factor = 0. GGML calls
    the C library's powf, cosf and sinf; by default ggtool takes ``portable_math``'s (correctly
    rounded floats, the same on every host, whatever the C library), llama.cpp's numerics the C
    library's, as its builds do."""
    exponent = f32(-2.0) / f32(n_dims)
    if x86:
        from ..kernels.x86 import rope_cache

        theta_scale = f32(freq_base) ** exponent          # numpy's float32 power: the C library's powf
        return rope_cache(pos.astype(np.int64), ne0 // 2, theta_scale, f32(freq_scale), f32(attn_factor))
    theta_scale = pm.powf(freq_base, exponent)
    steps = np.empty((len(pos), ne0 // 2), dtype=f32)
    steps[:, 0] = pos.astype(f32)
    steps[:, 1:] = theta_scale
    theta = np.cumprod(steps, axis=1, dtype=f32) * f32(freq_scale)   # sequential float32 products
    return pm.cos_f32(theta) * f32(attn_factor), pm.sin_f32(theta) * f32(attn_factor)


def _leaf(t) -> bool:
    """Whether t's data is an input of the graph (a leaf, or a view of one), not computed by it."""
    while t.view_src is not None:
        if t.op not in ("NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"):
            return False
        t = t.view_src
    return t.op == "NONE"


def _rope_compiled(node, numerics):
    """``rope_f32``: what the forward computes without refusing, f32 packed rows, positions that are
    an input (their cos/sin caches are made before each compute, by `_cos_sin` as the forward makes
    them, once for all rope nodes of one input and parameters)."""
    a, pos = node.src[0], node.src[1]
    p = node.op_params
    n_dims, mode = int(p[1]), int(p[2])
    freq_base, freq_scale, ext_factor, attn_factor = (node.param_f32(i) for i in (5, 6, 7, 8))
    if not (a.type == node.type == T.F32 and plain(a, node, pos) and a.nb[0] == node.nb[0] == 4
            and pos.type == T.I32 and pos.is_contiguous() and _leaf(pos) and n_dims <= a.ne[0]
            and n_dims % 2 == 0 and mode in (0, ROPE_TYPE_NEOX) and ext_factor == 0.0):
        return None
    x86 = is_llama_cpp(numerics)
    a_ne0 = a.ne[0]
    key = ("rope", id(pos), a_ne0, n_dims, freq_base, freq_scale, attn_factor, x86)

    def bind(ith: int, nth: int, shared: dict):
        got = shared.get(key)
        prologue = None
        if got is None:
            half = n_dims // 2
            cos, sin = np.zeros((pos.ne[0], half), f32), np.zeros((pos.ne[0], half), f32)
            positions = weakref.ref(pos)   # what keeps the bound steps keeps no tensor (nor its context) alive
            step = max(1, CHUNK_BYTES // (4 * a_ne0))
            params = (a_ne0, n_dims, float(freq_base), float(freq_scale), float(attn_factor), bool(x86))
            n = block_len(a_ne0 // 2)

            def prologue():
                p = positions()
                if p is None:
                    return
                every = p.data.reshape(-1)
                if n and len(every) == 1:    # a decode step: one row of a block (what _cos_sin takes), no more
                    q = int(every[0])        # Python (on every participant's way to the first barrier)
                    c, s = _block(params, q // n, n)
                    cos[0], sin[0] = c[q % n, :half], s[q % n, :half]
                    return
                for t0 in range(0, len(every), step):       # tokens a chunk at a time: small temporaries
                    c, s = _cos_sin(every[t0:t0 + step], a_ne0, n_dims, freq_base, freq_scale, attn_factor, x86)
                    cos[t0:t0 + step], sin[t0:t0 + step] = c[:, :half], s[:, :half]
            got = shared[key] = (cos, sin)
        cos, sin = got
        return (int(cos.ctypes.data), int(sin.ctypes.data), cos.shape[1]), got, prologue

    return CompiledStep("rope_f32", (int(mode == ROPE_TYPE_NEOX), n_dims, int(x86)), bind=bind)


@kernel("ROPE", n_tasks=ALL, work_size=lambda node, n_tasks: 4 * node.ne[0] * n_tasks, compiled=_rope_compiled)
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
    x2, y2 = with_shape(a.data, (node.nrows, ne0)), with_shape(node.data, (node.nrows, ne0))
    x86 = is_llama_cpp(work.numerics)
    positions, half = pos.data.reshape(-1), n_dims // 2
    for c0, c1 in chunks(r0, r1, 4 * ne0):                            # rows a chunk at a time
        i3, i2, i1 = unravel_rows(np.arange(c0, c1), ne1, ne2)
        x = x2[c0:c1] if x2 is not None else a.data[i3, i2, i1]     # (rows, ne0)
        p0, p1 = (c0 // ne1) % ne2, ((c1 - 1) // ne1) % ne2 + 1      # the caches of the chunk's tokens
        if c0 // (ne1 * ne2) != (c1 - 1) // (ne1 * ne2):               # (all, if it spans two i3)
            p0, p1 = 0, ne2
        cos, sin = _cos_sin(positions[p0:p1], ne0, n_dims, freq_base, freq_scale, attn_factor, x86)
        j = i2 - p0 if p0 else i2
        y = _rotate(x, cos[j, :half], sin[j, :half], n_dims, mode, x86)   # one cache per token
        if y2 is not None:
            y2[c0:c1] = y
        else:
            node.data[i3, i2, i1] = y


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_dims: int, mode: int, x86: bool) -> np.ndarray:
    """Rows x (rows, ne0) rotated by their tokens' caches (rows, n_dims/2); pairs past n_dims copied."""
    half = n_dims // 2
    if mode == ROPE_TYPE_NEOX:
        j0, j1 = slice(0, half), slice(half, n_dims)                 # element ic pairs with ic + n_dims/2
    else:
        j0, j1 = slice(0, n_dims, 2), slice(1, n_dims, 2)
    y = x.copy()
    x0, x1 = x[:, j0], x[:, j1]
    if x86:     # the products contracted to FMAs, as llama.cpp's x86 build compiles them
        from ..kernels.x86 import rotate

        y0, y1 = np.empty(x0.shape, f32), np.empty(x0.shape, f32)
        rotate(*(np.ascontiguousarray(v, dtype=f32) for v in (x0, x1, cos, sin)), y0, y1)
        y[:, j0], y[:, j1] = y0, y1
    else:
        y[:, j0] = x0 * cos - x1 * sin
        y[:, j1] = x0 * sin + x1 * cos
    return y


def _rope(ctx, op, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
          attn_factor, beta_fast, beta_slow):
    """ggml_rope_impl: the constructor behind rope and rope_ext (same asserts, same op_params)."""
    check((int(mode) & 1) == 0, op, "mode & 1 == 1 is no longer supported")
    check(b.is_vector(), op, f"positions b '{b.name}' {fmt_ne(b)} must be a vector")
    check(b.type == T.I32, op, f"positions b '{b.name}' must be i32, not {T.type_name(b.type)}")
    check(a.ne[2] == b.ne[0], op, f"a '{a.name}' {fmt_ne(a)} has {a.ne[2]} tokens (ne2) but b '{b.name}' has {b.ne[0]} positions")
    check(c is None, op, "frequency factors (c) are not supported; pass null")
    params = (0, int(n_dims), int(mode), 0, int(n_ctx_orig), float(freq_base), float(freq_scale),
              float(ext_factor), float(attn_factor), float(beta_fast), float(beta_slow), 0, 0, 0, 0)
    return new_op(ctx, "ROPE", a.type, a.ne, (a, b), params=params)


@function("rope", "ggml_rope(ctx, a, b, n_dims, mode)",
          "rotary embedding of a's first n_dims of each head; b = I32 positions, one per a.ne2 token")
def rope(ctx, a, b, n_dims, mode):
    return _rope(ctx, "rope", a, b, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)


@function("rope_ext", "ggml_rope_ext(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, "
          "ext_factor, attn_factor, beta_fast, beta_slow)",
          "rope with GGML's full parameters (freq_base, freq_scale, attn_factor; c and YaRN unsupported)")
def rope_ext(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
             beta_fast, beta_slow):
    return _rope(ctx, "rope_ext", a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale,
                 ext_factor, attn_factor, beta_fast, beta_slow)
