"""Kernels compute in chunks of rows (ggtool.ops.walk.CHUNK_BYTES): their temporaries stay a few
MiB whatever the tensor's size, so a compute's peak memory follows its planned buffers,
and the chunks change no bit of any result."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import ggtool
from ggtool import types as T
from ggtool.ops import FUNCTIONS as F
from ggtool.ops import walk

MiB = 1 << 20
UNARY = ["abs", "sgn", "neg", "step", "tanh", "elu", "relu", "sigmoid", "gelu", "gelu_quick", "silu",
         "hardswish", "hardsigmoid", "exp", "sqr", "sqrt", "log", "sin", "cos"]


def _t(ctx, x, type=None):
    return ctx.new_tensor_from(np.ascontiguousarray(x), type=type)


def _soft_max_ext(max_bias):
    def build(ctx, x):
        rows = np.arange(x.shape[0])[:, None] < np.arange(x.shape[1])[None, :] - 7
        mask = np.where(rows, np.float32(-np.inf), np.float32(0)) if max_bias == 0 else np.zeros(x.shape, np.float32)
        return F["soft_max_ext"](ctx, _t(ctx, x), _t(ctx, mask), 0.125, max_bias)
    return build


def _rope(ctx, x):
    n_tok, heads = x.shape[0], 8
    a = _t(ctx, x.reshape(n_tok, heads, -1))
    pos = _t(ctx, np.arange(n_tok, dtype=np.int32) * 3 + 1)
    return F["rope_ext"](ctx, a, pos, None, x.shape[1] // heads - 4, 0, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)


# name -> (build(ctx, x) -> result, numerics); x is a float32 (rows, cols) array
CASES = {u: ((lambda u: lambda c, x: F[u](c, _t(c, x)))(u), "ggml") for u in UNARY}
CASES |= {
    "gelu x86": (lambda c, x: F["gelu"](c, _t(c, x)), "x86"),
    "scale": (lambda c, x: F["scale"](c, _t(c, x), 0.5), "ggml"),
    "clamp": (lambda c, x: F["clamp"](c, _t(c, x), -0.5, 0.75), "ggml"),
    "soft_max": (lambda c, x: F["soft_max"](c, _t(c, x)), "ggml"),
    "soft_max x86": (lambda c, x: F["soft_max"](c, _t(c, x)), "x86"),
    "soft_max_ext": (_soft_max_ext(0.0), "ggml"),
    "soft_max_ext x86": (_soft_max_ext(0.0), "x86"),
    "soft_max_ext alibi": (_soft_max_ext(8.0), "ggml"),
    "diag_mask_inf": (lambda c, x: F["diag_mask_inf"](c, _t(c, x), 3), "ggml"),
    "norm": (lambda c, x: F["norm"](c, _t(c, x), 1e-5), "ggml"),
    "rms_norm": (lambda c, x: F["rms_norm"](c, _t(c, x), 1e-5), "ggml"),
    "argmax": (lambda c, x: F["argmax"](c, _t(c, x)), "ggml"),
    "sum f16": (lambda c, x: F["sum"](c, _t(c, x.astype(np.float16))), "ggml"),
    "get_rows": (lambda c, x: F["get_rows"](c, _t(c, x), _t(c, np.arange(x.shape[0], dtype=np.int32)[::-1])), "ggml"),
    "repeat": (lambda c, x: F["repeat"](c, _t(c, x[: x.shape[0] // 4]), _t(c, x)), "ggml"),
    "concat 0": (lambda c, x: F["concat"](c, _t(c, x[:, ::2]), _t(c, x[:, 1::2]), 0), "ggml"),
    "concat 1": (lambda c, x: F["concat"](c, _t(c, x[::2]), _t(c, x[1::2]), 1), "ggml"),
    "rope": (_rope, "ggml"),
    "rope x86": (_rope, "x86"),
    "cpy f16": (lambda c, x: F["cpy"](c, _t(c, x), c.new_tensor(T.F16, x.shape[::-1])), "ggml"),
    "cpy q8_0": (lambda c, x: F["cpy"](c, _t(c, x), c.new_tensor(T.Q8_0, x.shape[::-1])), "ggml"),
    "cpy f16 -> f32": (lambda c, x: F["cpy"](c, _t(c, x.astype(np.float16)), c.new_tensor(T.F32, x.shape[::-1])), "ggml"),
    "cpy q8_0 -> f32": (lambda c, x: F["cpy"](c, _t(c, x, "q8_0"), c.new_tensor(T.F32, x.shape[::-1])), "ggml"),
    "add q8_0": (lambda c, x: F["add"](c, _t(c, x, "q8_0"), _t(c, x[::-1])), "ggml"),
}
for _w in ("f16", "q8_0", "q4_1", "bf16"):      # mul_mat's activations converted to the weights' vec_dot_type
    CASES[f"mul_mat {_w}"] = ((lambda w: lambda c, x: F["mul_mat"](c, _t(c, x[:16, :1024] if x.shape[1] >= 1024 else x[:16], w),
                                                                  _t(c, x.reshape(-1, 1024) if x.shape[1] >= 1024 else x)))(_w), "ggml")


def _compute(build, x, numerics):
    ctx = ggtool.Context()
    r = build(ctx, x)
    ggtool.graph_compute(ggtool.Graph(ctx).expand(r), 1, numerics=numerics)
    return r


@pytest.fixture(scope="module")
def big():
    """A 32 MiB float32 input, 2048 rows of 4096."""
    return np.random.default_rng(23).standard_normal((2048, 4096), dtype=np.float32)


@pytest.mark.parametrize("name", list(CASES))
def test_temporaries_stay_bounded(name, big):
    """The kernel's allocations (numpy reports them to tracemalloc; the result lives in the
    context's pool) stay under 8 MiB for a 32 MiB input: a whole-tensor numpy expression would
    take at least 32."""
    build, numerics = CASES[name]
    _compute(build, big[:16], numerics)          # compiled kernels and tables loaded first
    ctx = ggtool.Context()
    r = build(ctx, big)
    g = ggtool.Graph(ctx).expand(r)
    tracemalloc.start()
    try:
        ggtool.graph_compute(g, 1, numerics=numerics)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * MiB, f"{name}: {peak / MiB:.1f} MiB of temporaries"


@pytest.mark.parametrize("name", list(CASES))
def test_chunks_change_no_bit(name, monkeypatch):
    """Every kernel's result is the same, byte for byte, computed in one chunk or in chunks of a
    row (and rows in pieces of 40 elements)."""
    build, numerics = CASES[name]
    x = np.random.default_rng(5).standard_normal((48, 96), dtype=np.float32) * 4
    whole = _compute(build, x, numerics).data.tobytes()
    monkeypatch.setattr(walk, "CHUNK_BYTES", 160)
    assert _compute(build, x, numerics).data.tobytes() == whole
