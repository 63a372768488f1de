"""rope_ext: GGML's full rope constructor (freq_base, freq_scale, attn_factor)."""

import numpy as np
import pytest

import ggtool
from ggtool.ops import FUNCTIONS as F


def _rope_ref(x, pos, n_dims, base, scale, attn):
    """numpy model of mode-0 rope: adjacent pairs rotated by pos * base^(-2i/n_dims)."""
    out = x.astype(np.float64).copy()
    i = np.arange(n_dims // 2)
    theta = pos[:, None] * scale * base ** (-2.0 * i / n_dims)          # (tokens, pairs)
    c, s = np.cos(theta)[:, None, :] * attn, np.sin(theta)[:, None, :] * attn
    x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
    out[..., 0:n_dims:2] = x0 * c - x1 * s
    out[..., 1:n_dims:2] = x0 * s + x1 * c
    return out


@pytest.mark.parametrize("base,scale,attn", [(10000.0, 1.0, 1.0), (500000.0, 0.5, 1.0), (10000.0, 1.0, 2.0)])
def test_rope_ext_matches_the_formula(base, scale, attn):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 3, 8), dtype=np.float32)   # ne = [8 head_dim, 3 heads, 5 tokens]
    pos = np.array([0, 1, 2, 7, 30], np.int32)
    ctx = ggtool.Context()
    a, b = ctx.new_tensor_from(x), ctx.new_tensor_from(pos)
    r = F["rope_ext"](ctx, a, b, None, 6, 0, 0, base, scale, 0.0, attn, 0.0, 0.0)
    ggtool.graph_compute(ggtool.Graph(ctx).expand(r))
    want = _rope_ref(x, pos.astype(np.float64), 6, base, scale, attn)
    np.testing.assert_allclose(r.data[0], want, rtol=2e-5, atol=2e-5)
    assert r.param_f32(5) == np.float32(base) and r.op_params[1] == 6


def test_rope_ext_with_default_base_is_rope():
    rng = np.random.default_rng(2)
    ctx = ggtool.Context()
    a = ctx.new_tensor_from(rng.standard_normal((4, 2, 16), dtype=np.float32))
    b = ctx.new_tensor_from(np.arange(4, dtype=np.int32))
    r1 = F["rope"](ctx, a, b, 16, 0)
    r2 = F["rope_ext"](ctx, a, b, None, 16, 0, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
    g = ggtool.Graph(ctx)
    g.expand(r1)
    g.expand(r2)
    ggtool.graph_compute(g)
    assert list(r1.op_params) == list(r2.op_params)
    assert np.array_equal(r1.data, r2.data)


def test_rope_ext_refuses_frequency_factors():
    ctx = ggtool.Context()
    a = ctx.new_tensor("f32", [8, 2, 3])
    b = ctx.new_tensor("i32", [3])
    c = ctx.new_tensor("f32", [4])
    with pytest.raises(ggtool.ShapeError, match="rope_ext: frequency factors"):
        F["rope_ext"](ctx, a, b, c, 8, 0, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)


@pytest.mark.parametrize("x86", [False, True], ids=["ggml", "llama.cpp"])
def test_cos_sin_caches_come_from_blocks_made_once(x86, monkeypatch):
    """The cos/sin caches of any positions (scattered, across blocks, negative, int32's extremes, none)
    are rows of per-process blocks of consecutive positions, with the bits a call for exactly those
    positions gives; a decode step's next position in a block already made computes nothing."""
    from ggtool.ops import rope

    monkeypatch.setattr(rope, "_TABLES", type(rope._TABLES)())
    rng = np.random.default_rng(3)
    for pos in (np.array([5]), rng.integers(-600, 3000, 700), np.array([2**31 - 1, -2**31]), np.arange(250, 262),
                np.array([], np.int64)):
        pos = pos.astype(np.int32)
        want = rope._cos_sin_uncached(pos, 96, 64, 10000.0, 0.5, 1.5, x86)
        got = rope._cos_sin(pos, 96, 64, 10000.0, 0.5, 1.5, x86)
        assert [g.shape for g in got] == [(len(pos), 48)] * 2
        assert [g.tobytes() for g in got] == [w.tobytes() for w in want]
    calls = []
    real = rope._cos_sin_uncached
    monkeypatch.setattr(rope, "_cos_sin_uncached", lambda *a: calls.append(a[0]) or real(*a))
    rope._cos_sin(np.array([5000], np.int32), 96, 64, 10000.0, 0.5, 1.5, x86)
    rope._cos_sin(np.array([5001], np.int32), 96, 64, 10000.0, 0.5, 1.5, x86)
    n = rope.block_len(48)
    assert n == 256 and [(c[0], len(c)) for c in calls] == [(5000 // n * n, n)]
    assert len(rope._TABLES) <= rope.TABLE_KEEP
    assert (rope.block_len(64), rope.block_len(128), rope.block_len(1024), rope.block_len(1025)) == (256, 128, 16, 0)
