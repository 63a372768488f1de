"""The compiled graph runner (ggtool.runner, ggtool.kernels.runner/nodes/nodes_mm): every compiled kernel
gives the bits of its op's Python forward, for 1..3 participants and each numerics; the barrier holds
under oversubscription; a crash, Ctrl-C or a kernel's error in the middle of a compiled stretch ends
as before the runner.

Each comparison first checks that the graph really runs compiled (`compiled_kernels`), so that a
graph silently left to Python cannot pass."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from random_graphs import graphs

import ggtool
from ggtool import compute, quant, runner
from ggtool import types as T
from ggtool.errors import ComputeError
from ggtool.kernels.numerics import host_flags, resolve
from ggtool.ops import FUNCTIONS as F
from ggtool.pool import WorkerPool

ROOT = Path(__file__).resolve().parent.parent
STORIES = ROOT / "fixtures" / "stories260K.gguf"
rng = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def small_graphs_compiled(monkeypatch):
    """Graphs of any size run on the compiled runner (a small f32 graph would otherwise stay in
    Python where numba is not loaded yet: runner.worth)."""
    monkeypatch.setattr(runner, "WORTH_NUMBA", 0)
    monkeypatch.setattr(compute, "COMPILED", True)


@pytest.fixture(scope="module")
def pool3():
    with WorkerPool(3) as p:
        yield p


def compiled_kernels(g, numerics="ggml", nth=1, fuse=False) -> list:
    """The kernel of every step of g's program (None: a step in Python)."""
    program = runner.make_program(g.nodes, nth, resolve(numerics, host_flags()), fuse=fuse)
    assert program is not None, "the compiled runner is not available"
    return [s[0] for s in program.steps]


def bits(t) -> bytes:
    return np.ascontiguousarray(t.data).tobytes()


def python_path(g, nth=1, **kw):
    """g computed node after node from Python, as before the runner."""
    compute.COMPILED = False
    try:
        ggtool.graph_compute(g, nth, **kw)
    finally:
        compute.COMPILED = True


class Inputs:
    """The graph's leafs as they are now, to put back before each compute (a graph may write into
    its inputs: a cpy into a leaf, set_rows into a cache)."""

    def __init__(self, g):
        self.saved = [(t, np.array(t.data)) for t in g.leafs if t.has_data and t.view_src is None]

    def restore(self, tensors=()):
        for t, v in self.saved:
            t.data[...] = v
        for t in tensors:
            t.data[...] = 0


def same_as_python(g, tensors, numerics="ggml", pools=(), **kw):
    """Every tensor of `tensors` after a compute on the compiled runner (one process, then each pool)
    holds the bytes the Python path gives."""
    inputs = Inputs(g)
    python_path(g, numerics=numerics, **kw)
    want = [bits(t) for t in tensors]
    inputs.restore(tensors)
    ggtool.graph_compute(g, 1, numerics=numerics, **kw)
    got = [bits(t) for t in tensors]
    assert got == want, [t.name for t, a, b in zip(tensors, got, want) if a != b]
    for pool in pools:
        for nth in range(2, pool.n_threads + 1):
            inputs.restore(tensors)
            ggtool.graph_compute(g, nth, pool=pool, numerics=numerics, **kw)
            got = [bits(t) for t in tensors]
            assert got == want, (nth, [t.name for t, a, b in zip(tensors, got, want) if a != b])


SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-42, 3.4e38, 65504.0, 65520.0,
                    1e-8, 6e-8, 10.0, -10.0, 9.999999, -9.999999, -1.999], np.float32)


def values(shape, special: bool = True) -> np.ndarray:
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    if special:
        flat = x.reshape(-1)
        k = min(len(SPECIAL), flat.size)
        flat[rng.choice(flat.size, k, replace=False)] = SPECIAL[:k]
        payload = np.array([0x7F800001, 0xFFC00123, 0x7F802000], np.uint32).view(np.float32)
        flat[: min(3, flat.size)] = payload[: min(3, flat.size)]
    return x


def leaf(ctx, x, type_="f32", name=""):
    t = ctx.new_tensor(type_, list(x.shape[::-1]))
    with np.errstate(over="ignore"):       # 3.4e38 to f16: inf, on purpose
        t.set_data(x if type_ in ("f32", "i32") else x.astype(np.float16) if type_ == "f16" else x)
    t.name = name
    return t


# -- element-wise, norm, scale ----------------------------------------------------------------------
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("b_shape", [(3, 5, 64), (1, 1, 64), (3, 1, 64), (1, 5, 16)])
def test_binary_ops_tile_b_as_the_forward(op, b_shape, pool3):
    ctx = ggtool.Context()
    a = leaf(ctx, values((3, 5, 64)))
    b = leaf(ctx, values(b_shape))
    y = F[op](ctx, a, b)
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g) == ["binary_f32"]
    same_as_python(g, [y], pools=[pool3])


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "scale", "silu", "gelu"])
def test_elementwise_rows_fewer_than_participants_are_shared_within(op, rows, pool3):
    """A decode step's single row of an element-wise op (fewer rows than participants) is split
    within the row (nodes.elementwise_share: whole cache lines, the last share short), the results
    those of the forward, which computes it on one participant; b tiled over a row as GGML tiles it."""
    from ggtool.kernels.nodes import elementwise_share

    assert [elementwise_share(rows, 1000, i, 3) for i in range(3)] == \
        [(0, rows, 0, 336), (0, rows, 336, 672), (0, rows, 672, 1000)]
    ctx = ggtool.Context()
    a = leaf(ctx, values((rows, 1000)))
    if op in ("add", "sub", "mul", "div"):
        y = F[op](ctx, a, leaf(ctx, values((1, 40))))
    elif op == "scale":
        y = F["scale"](ctx, a, 0.37)
    else:
        y = F[op](ctx, a)
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g) == [f"{'binary' if op in ('add', 'sub', 'mul', 'div') else op}_f32"]
    same_as_python(g, [y], pools=[pool3])


def test_binary_op_of_a_permuted_b():
    ctx = ggtool.Context()
    a = leaf(ctx, values((4, 6, 8)))
    b = F["permute"](ctx, leaf(ctx, values((8, 6, 4))), 2, 1, 0, 3)
    y = F["mul"](ctx, a, b)
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g) == ["binary_f32"]
    same_as_python(g, [y])


@pytest.mark.parametrize("n", [1, 7, 8, 129, 640, 2048, 8193, 20000])
def test_rms_norm_sums_in_ggml_order(n):
    """GGML's ggml_float sum of float32 squares: a double from +0.0, each term in order (the forward's
    ``portable_math.seq_sum``), whatever the row's length."""
    ctx = ggtool.Context()
    x = leaf(ctx, values((3, n), special=False) * rng.uniform(1e-3, 1e3, (3, 1)).astype(np.float32))
    y = F["rms_norm"](ctx, x, 1e-6)
    s = F["scale"](ctx, y, 0.37)
    g = ggtool.Graph(ctx).expand(s)
    assert compiled_kernels(g) == ["rms_norm_f32", "scale_f32"]
    same_as_python(g, [y, s])


def test_rms_norm_then_mul_fused_as_ggml_fuses_them(pool3):
    """In the graph allocator's buffer (only outputs kept) RMS_NORM and its MUL are one step, with the
    unfused bits; in context mode (every node kept) they stay two. Finite values: a row holding a NaN
    makes the norm's scale NaN, and which payload NaN x NaN keeps is numpy's loop's choice (2.2 and
    2.5 differ) as it is the compiler's in GGML, so no order defines those bits."""
    ctx = ggtool.Context()
    x = leaf(ctx, values((5, 64), special=False))
    w = leaf(ctx, values((1, 64), special=False))
    y = F["mul"](ctx, F["rms_norm"](ctx, x, 1e-5), w)
    z = F["add"](ctx, y, x)
    g = ggtool.Graph(ctx).expand(z)
    assert compiled_kernels(g, fuse=True) == ["rms_norm_f32", "binary_f32"]
    assert compiled_kernels(g) == ["rms_norm_f32", "binary_f32", "binary_f32"]
    same_as_python(g, [z], pools=[pool3], alloc="graph", outputs=[z])


def test_a_norm_asked_for_is_not_fused_away(pool3):
    """An output of the compute (graph allocator, outputs=[norm, z]) is written even where GGML's
    fusion would skip it: the norm's bytes are the Python path's, on 1..3 participants (finite values,
    as above)."""
    ctx = ggtool.Context()
    x = leaf(ctx, values((5, 64), special=False))
    w = leaf(ctx, values((1, 64), special=False))
    n = F["rms_norm"](ctx, x, 1e-5)
    z = F["add"](ctx, F["mul"](ctx, n, w), x)
    g = ggtool.Graph(ctx).expand(z)
    assert compiled_kernels(g, fuse=True) == ["rms_norm_f32", "binary_f32"]     # fused where not asked for
    same_as_python(g, [n, z], pools=[pool3], alloc="graph", outputs=[n, z])


# -- rows, copies ------------------------------------------------------------------------------------
@pytest.mark.parametrize("type_", ["f32", "f16", "i32", "q4_0", "q8_0"])
def test_get_rows_of_every_type_it_compiles(type_, pool3):
    ctx = ggtool.Context()
    x = values((2, 7, 64), special=type_ in ("f32", "f16"))
    if type_ == "i32":
        src = leaf(ctx, rng.integers(-1000, 1000, (2, 7, 64)).astype(np.int32), "i32")
    elif type_ in ("q4_0", "q8_0"):
        src = ctx.new_tensor(type_, [64, 7, 2])
        src.set_data(quant.quantize(x, type_))
    else:
        src = leaf(ctx, x, type_)
    idx = leaf(ctx, rng.integers(0, 7, (2, 5)).astype(np.int32), "i32")
    y = F["get_rows"](ctx, src, idx)
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g) == ["get_rows"]
    same_as_python(g, [y], pools=[pool3])


@pytest.mark.parametrize("src_type,dst_type,idx_type", [("f32", "f32", "i32"), ("f32", "f16", "i64"),
                                                        ("f16", "f32", "i32"), ("f16", "f16", "i64")])
def test_set_rows_converts_as_the_forward(src_type, dst_type, idx_type, pool3):
    ctx = ggtool.Context()
    cache = leaf(ctx, np.zeros((2, 9, 32), np.float32), dst_type)
    b = leaf(ctx, values((2, 4, 32)), src_type)
    idx = ctx.new_tensor(idx_type, [4, 1, 1])
    idx.set_data(np.array([[[7, 0, 3, 8]]], np.int64 if idx_type == "i64" else np.int32))
    y = F["set_rows"](ctx, cache, b, idx)
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g) == ["set_rows"]
    same_as_python(g, [cache], pools=[pool3])


def _copies(ctx):
    a = leaf(ctx, values((3, 4, 6, 8)))
    p = F["permute"](ctx, a, 1, 0, 3, 2)                     # strided source
    yield "cont of a permutation", F["cont"](ctx, p)
    yield "cont_2d of a permutation", F["cont_2d"](ctx, p, 8 * 6, 12)
    yield "f32 to f16", F["cpy"](ctx, p, leaf(ctx, np.zeros((3, 4, 8, 6), np.float32), "f16"))
    h = leaf(ctx, values((4, 10)), "f16")
    yield "f16 to f32", F["cpy"](ctx, h, leaf(ctx, np.zeros((4, 10), np.float32)))
    dst = leaf(ctx, np.zeros((6, 9, 8), np.float32))
    yield "copy by rows into a view", F["cpy"](ctx, F["view_3d"](ctx, a, 8, 6, 3, a.nb[1], a.nb[2], 0),
                                               F["view_3d"](ctx, dst, 8, 6, 3, dst.nb[1], dst.nb[2], 4 * 8))


@pytest.mark.parametrize("case", range(5))
def test_copies_land_where_the_forward_puts_them(case, pool3):
    ctx = ggtool.Context()
    name, y = list(_copies(ctx))[case]
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g) == ["copy"], name
    same_as_python(g, [y.view_src or y], pools=[pool3])


# -- rope, gelu, soft_max ----------------------------------------------------------------------------
@pytest.mark.parametrize("numerics", ["ggml", "llama.cpp-avx2", "llama.cpp-avx512"])
@pytest.mark.parametrize("mode,n_dims", [(0, 16), (2, 16), (0, 8), (2, 12)])
def test_rope_with_caches_made_before_the_compute(numerics, mode, n_dims, pool3):
    ctx = ggtool.Context()
    x = leaf(ctx, values((3, 4, 16), special=False))
    pos = leaf(ctx, np.array([5, 900, 3], np.int32), "i32")
    y = F["rope_ext"](ctx, x, pos, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
    y2 = F["rope_ext"](ctx, F["scale"](ctx, x, 2.0), pos, None, n_dims, mode, 0, 1e6, 1.0, 0.0, 1.0, 0.0, 0.0)
    g = ggtool.Graph(ctx).expand(F["add"](ctx, y, y2))
    assert compiled_kernels(g, numerics).count("rope_f32") == 2
    same_as_python(g, [y, y2], numerics, pools=[pool3])
    pos.set_data(np.array([1, 2, 40000], np.int32))        # new positions: new caches
    same_as_python(g, [y, y2], numerics)


@pytest.mark.parametrize("numerics", ["ggml", "llama.cpp-avx2"])
def test_gelu_through_the_table_nan_payloads_and_clamps_included(numerics, pool3):
    ctx = ggtool.Context()
    x = np.concatenate([values((7, 64)).reshape(-1), SPECIAL,
                        np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0x7F802000, 0x7FA00000, 0xFFFFFFFF],
                                 np.uint32).view(np.float32)])
    x = np.pad(x, (0, -len(x) % 32)).reshape(-1, 32)
    y = F["gelu"](ctx, leaf(ctx, x))
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g, numerics) == ["gelu_f32"]
    same_as_python(g, [y], numerics, pools=[pool3])


@pytest.mark.parametrize("mask_type", [None, "f32", "f16"])
@pytest.mark.parametrize("numerics", ["llama.cpp-avx2", "llama.cpp-avx512"])
def test_soft_max_in_llama_cpp_numerics(mask_type, numerics, pool3):
    ctx = ggtool.Context()
    a = leaf(ctx, values((4, 3, 40), special=False))
    mask = None if mask_type is None else leaf(ctx, np.where(rng.random((5, 40)) < 0.3, -np.inf, 0).astype(np.float32),
                                                mask_type)
    y = F["soft_max_ext"](ctx, a, mask, 0.125, 0.0) if mask is not None else F["soft_max"](ctx, a)
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g, numerics) == ["soft_max_x86"]
    same_as_python(g, [y], numerics, pools=[pool3])


@pytest.mark.parametrize("mask_type", [None, "f32", "f16"])
@pytest.mark.parametrize("n", [40, 130])
def test_soft_max_in_ggml_numerics_nan_payloads_included(mask_type, n, pool3):
    """soft_max under GGML's numerics is a compiled step (soft_max_f32): the forward's bits, NaN payloads
    (several NaNs in a row, one last), infinities and rows masked whole included."""
    ctx = ggtool.Context()
    x = values((4, 3, n))
    nans = np.array([0x7FC00011, 0xFFC00022, 0x7F800033], np.uint32).view(np.float32)
    x[1, 0, [2, 7, n - 1]] = nans
    x[1, 1, [0, n // 2]] = nans[:2]
    x[2, 2, :] = nans[1]
    x[3, 0] = values(n, special=False)
    a = leaf(ctx, x)
    m = np.where(rng.random((5, n)) < 0.3, -np.inf, 0).astype(np.float32)
    m[1] = -np.inf
    m[2, 3] = nans[0]
    mask = None if mask_type is None else leaf(ctx, m, mask_type)
    y = F["soft_max_ext"](ctx, a, mask, 0.125, 0.0) if mask is not None else F["soft_max"](ctx, a)
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g) == ["soft_max_f32"]
    same_as_python(g, [y], pools=[pool3])
    out = y.numpy().reshape(x.shape)
    assert np.isnan(out[1, 0]).all() and np.isnan(out[2, 2]).all()
    assert abs(out[3, 0].astype(np.float64).sum() - 1) < 1e-5      # finite values, mask row 0


def test_soft_max_with_alibi_stays_in_python():
    ctx = ggtool.Context()
    a = leaf(ctx, values((2, 4, 16), special=False))
    mask = leaf(ctx, np.zeros((4, 16), np.float32))
    y = F["soft_max_ext"](ctx, a, mask, 1.0, 8.0)
    assert compiled_kernels(ggtool.Graph(ctx).expand(y)) == [None]


# -- mul_mat ----------------------------------------------------------------------------------------------
QUANT = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"]


def _product(wtype: str, m: int, k: int = 256, rows: int = 1300):
    """(graph, y) of y = mul_mat(a, b): `rows` weight rows of `wtype` (1300: two tiles, a partial row
    group), m activation rows."""
    ctx = ggtool.Context()
    a = ctx.new_tensor(wtype, [k, rows])
    a.set_data(quant.quantize(values((rows, k), special=False), wtype))
    b = leaf(ctx, values((m, k), special=False))
    y = F["mul_mat"](ctx, a, b)
    return ggtool.Graph(ctx).expand(y), y


@pytest.mark.parametrize("wtype", QUANT)
@pytest.mark.parametrize("m", [1, 3, 300])
def test_mul_mat_of_every_block_type(wtype, m, pool3):
    """src1 converted in the work buffer (each row's blocks split between participants), then each
    participant's row groups of the repacked tiles; 1300 weight rows: two tiles, a partial group."""
    g, y = _product(wtype, m)
    kernel = "mm_k6" if wtype in ("q3_K", "q6_K") else "mm_k" if wtype.endswith("K") else "mm_q32"
    assert compiled_kernels(g) == ["mm_convert", kernel]
    same_as_python(g, [y], pools=[pool3])


# the qtypes records whose dot has the K-quants' form: the K tile without mins, then the final factor
K_FORM = ["iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m", "tq1_0", "tq2_0"]


@pytest.mark.parametrize("wtype", K_FORM)
@pytest.mark.parametrize("m", [1, 5])
def test_mul_mat_of_the_records_k_forms(wtype, m, pool3):
    """IQ1_*, IQ2_*, IQ3_*, TQ* run on the compiled runner's K step (mm_k: their K form, hm 0, then
    dot_final), the bits of the Python path (the record's generic dot) for 1..3 participants; under
    llama.cpp's numerics they stay Python steps (their x86 forms)."""
    from ggtool import qtypes

    ctx = ggtool.Context()
    k = 512
    x = values((300, k), special=False)
    qw = np.random.default_rng(3).uniform(0.2, 3, k).astype(np.float32)
    a = ctx.new_tensor(wtype, [k, 300])
    a.set_data(qtypes.get(wtype).quantize(x, qw))
    b = leaf(ctx, values((m, k), special=False))
    y = F["mul_mat"](ctx, a, b)
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g) == ["mm_convert", "mm_k"]
    assert compiled_kernels(g, "llama.cpp-avx2") == [None]
    same_as_python(g, [y], pools=[pool3])


@pytest.mark.parametrize("wtype", ["iq4_nl", "mxfp4"])
@pytest.mark.parametrize("m", [1, 5])
def test_mul_mat_of_the_records_levels(wtype, m, pool3):
    """IQ4_NL and MXFP4 (int8 levels, fp16 and float32 scales) run on the compiled runner's 32-value
    step (mm_q32's levels kinds), the bits of the Python path for 1..3 participants."""
    from ggtool import qtypes

    ctx = ggtool.Context()
    k = 256
    a = ctx.new_tensor(wtype, [k, 300])
    a.set_data(qtypes.get(wtype).quantize(values((300, k), special=False)))
    b = leaf(ctx, values((m, k), special=False))
    y = F["mul_mat"](ctx, a, b)
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g) == ["mm_convert", "mm_q32"]
    same_as_python(g, [y], pools=[pool3])


def _runner_x86_types() -> list:
    """F32 and the records with a runner kernel for llama.cpp's x86 order (``runner_x86``, ``runner_x86_repacked``)."""
    from ggtool import qtypes

    return ["f32"] + [T.type_name(t) for t, r in qtypes.REGISTRY.items() if r.runner_x86 or r.runner_x86_repacked]


@pytest.mark.parametrize("wtype", _runner_x86_types())
@pytest.mark.parametrize("numerics", ["llama.cpp-avx2", "llama.cpp-avx512"])
@pytest.mark.parametrize("m", [1, 9])
def test_mul_mat_in_llama_cpp_numerics(wtype, numerics, m, pool3):
    ctx = ggtool.Context()
    k = 256
    w = values((264, k), special=False)
    a = ctx.new_tensor(wtype, [k, 264])
    a.set_data(w if wtype == "f32" else quant.quantize(w, wtype))
    b = leaf(ctx, values((m, k), special=False))
    y = F["mul_mat"](ctx, a, b)
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g, numerics)[-1] == "mm_x86"
    same_as_python(g, [y], numerics, pools=[pool3])


@pytest.mark.parametrize("wtype", ["f32", "q8_0", "q4_0"])
def test_units_dealt_out_from_one_counter_reset_at_every_barrier(wtype, pool3):
    """Under llama.cpp's numerics every participant deals out mm_x86's units (a row group each) from
    the barrier block's chunk counter, as GGML deals out chunks. Three products of one activation in
    a row (no conversion before the last two: only the barrier resets the counter), and, for F32, a
    compute whose first step deals (the counter the last compute left is reset by the caller) give
    the forward's bits for 1..3 participants, one compute after another."""
    from ggtool.ops import matmul

    ctx = ggtool.Context()
    k = 256
    b = leaf(ctx, values((3, k), special=False))
    ys = []
    for rows in (1032, 264, 520):           # 9, 3 and 5 row groups of 128, the last ones partial
        a = ctx.new_tensor(wtype, [k, rows])
        w = values((rows, k), special=False)
        a.set_data(w if wtype == "f32" else quant.quantize(w, wtype))
        ys.append(F["mul_mat"](ctx, a, b))
    g = ggtool.Graph(ctx)
    for y in ys:
        g.expand(y)
    kernels = compiled_kernels(g, "llama.cpp-avx2")
    assert kernels.count("mm_x86") == 3 and kernels.count("mm_convert") == (0 if wtype == "f32" else 1)
    assert all(matmul._mul_mat_compiled(y, "llama.cpp-avx2")[-1].deals for y in ys)
    same_as_python(g, ys, "llama.cpp-avx2", pools=[pool3])


@pytest.mark.parametrize("wtype", ["q4_0", "q4_K", "q6_K", "iq4_nl", "tq2_0"])
@pytest.mark.parametrize("m", [1, 300])
def test_units_dealt_out_by_some_participants_alone(wtype, m, pool3, monkeypatch):
    """Whether a step deals out its units is each process's to decide (the default kernels' do where
    the weights' repacked tiles are mapped from the cache); here the caller deals (its table: every
    unit, a row group each) and the workers, which do not see the patch, take their own shares. A
    dealer takes its first unit from the counter too, so every unit is computed, the shares twice
    (the same bits): the forward's, for 1..3 participants."""
    from ggtool.ops import matmul
    from ggtool.quant import matmul as qm

    monkeypatch.setattr(qm, "packs_shared", lambda a: True)
    g, y = _product(wtype, m)
    assert matmul._mul_mat_compiled(y, "ggml")[-1].deals
    same_as_python(g, [y], pools=[pool3])


def test_a_dealt_out_tile_is_looked_up_once_for_its_row_groups(monkeypatch):
    """Where a step deals out its units (a row group each), the row groups of one repacked tile read
    one pack: binding looks it up once per tile and weight matrix (gemma-3-270m: 418 lookups, not
    3020), and every unit holds its own matrix's tile: here two weight matrices broadcast over four
    activation matrices (mul_mat's r2 = 2), each of 1300 rows (tiles of 1024 and 276 rows: 8 + 3 row
    groups)."""
    from ggtool.kernels import nodes_mm as nm
    from ggtool.ops import matmul
    from ggtool.quant import matmul as qm

    monkeypatch.setattr(qm, "packs_shared", lambda a: True)
    looked_up = []
    weight_pack = qm.weight_pack
    monkeypatch.setattr(qm, "weight_pack", lambda a, key, *rest: looked_up.append(key) or weight_pack(a, key, *rest))
    ctx = ggtool.Context()
    a = ctx.new_tensor("q4_0", [256, 1300, 2])
    a.set_data(quant.quantize(values((2, 1300, 256), special=False), "q4_0"))
    y = F["mul_mat"](ctx, a, leaf(ctx, values((4, 1, 256), special=False)))
    step = matmul._mul_mat_compiled(y, "ggml")[-1]
    (addr, count, *_), _keep, _ = step.bind(0, 1, {})
    assert sorted(looked_up) == [(0, m2, c0, c1) for m2 in (0, 1) for c0, c1 in ((0, 1024), (1024, 1300))]
    units = np.ctypeslib.as_array(ctypes.cast(addr, ctypes.POINTER(ctypes.c_int64)), (count, nm.UNIT))
    assert count == 4 * 11 and list(units[:11, nm.U_G0]) == [*range(8), *range(3)]
    arrays: dict = {}
    for u in units:
        assert u[nm.U_M2] == u[nm.U_I12] // 2
        arrays.setdefault((u[nm.U_M2], u[nm.U_COL0]), set()).add(tuple(u[nm.U_P:nm.UNIT]))
    assert len(arrays) == 4 and all(len(a) == 1 for a in arrays.values())     # one tile's arrays each
    assert len({next(iter(a)) for a in arrays.values()}) == 4                   # and no two alike


@pytest.mark.parametrize("wtype, rows", [("q4_1", 264), ("q5_1", 264), ("q4_K", 260), ("q3_K", 264)])
def test_mul_mat_in_llama_cpp_numerics_from_python(wtype, rows, pool3):
    """Weights whose llama.cpp x86 order has no runner kernel (Q4_1, Q5_1, Q3_K; Q4_K whose rows are
    not in eights, so not repacked) stay a Python step under llama.cpp's numerics, with the same bits."""
    ctx = ggtool.Context()
    k = 256
    a = ctx.new_tensor(wtype, [k, rows])
    a.set_data(quant.quantize(values((rows, k), special=False), wtype))
    b = leaf(ctx, values((3, k), special=False))
    y = F["mul_mat"](ctx, a, b)
    g = ggtool.Graph(ctx).expand(y)
    assert "mm_x86" not in compiled_kernels(g, "llama.cpp-avx2")
    same_as_python(g, [y], "llama.cpp-avx2", pools=[pool3])


def test_mul_mat_broadcasts_weights_over_batches():
    ctx = ggtool.Context()
    a = ctx.new_tensor("q8_0", [64, 40, 2])
    a.set_data(quant.quantize(values((2, 40, 64), special=False), "q8_0"))
    b = leaf(ctx, values((6, 3, 64), special=False))
    y = F["mul_mat"](ctx, a, b)
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g) == ["mm_convert", "mm_q32"]
    same_as_python(g, [y])


def test_weights_the_graph_writes_are_left_to_python():
    """Repacked weights are made when the steps are bound: a weight the graph computes (here a cpy
    into a q4_0 tensor) is multiplied from Python, which repacks it each time."""
    ctx = ggtool.Context()
    w = ctx.new_tensor("q4_0", [64, 8])
    src = leaf(ctx, values((8, 64), special=False))
    y = F["mul_mat"](ctx, F["cpy"](ctx, src, w), leaf(ctx, values((3, 64), special=False)))
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g)[-1] is None
    same_as_python(g, [y])


# -- whole graphs -------------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_every_node_as_the_python_path(drawn):
    ctx, g, roots, outputs = drawn
    nodes = [t for t in g.nodes if t.view_src is None and t.has_data]
    inputs = Inputs(g)
    try:
        python_path(g)
    except ComputeError as e:            # a graph its forward refuses: the same words from the runner
        inputs.restore(nodes)
        with pytest.raises(ComputeError) as got:
            ggtool.graph_compute(g, 1)
        assert str(got.value) == str(e)
        return
    want = [bits(t) for t in nodes]
    inputs.restore(nodes)
    ggtool.graph_compute(g, 1)
    assert [bits(t) for t in nodes] == want


def _logits(numerics: str, nth: int, pool=None, compiled: bool = True):
    from ggtool.dsl import build, parse
    from ggtool.tensor_io import Inputs, parse_named_source

    path = ROOT / "ggtool" / "programs" / "llama.gg"
    ctx = ggtool.Context()
    inputs = Inputs([parse_named_source("tokens=i32:[1,403,407,261,378,26]")], gguf_paths=[str(STORIES)])
    built = build(parse(path.read_text(), str(path)), ctx, inputs)
    logits = built.outputs[0][1]
    compute.COMPILED = compiled
    try:
        if compiled:      # stories260K's weights are f32: under GGML's numerics its products stay in Python
            kernels = compiled_kernels(built.graph, numerics, nth)
            assert kernels.count(None) <= len(kernels) // (2 if numerics == "ggml" else 4)
        ggtool.graph_compute(built.graph, nth, pool=pool, numerics=numerics, alloc="graph", outputs=[logits])
    finally:
        compute.COMPILED = True
    return logits.numpy().tobytes()


@pytest.mark.parametrize("numerics", ["ggml", "llama.cpp-avx2"])
def test_stories260k_logits_bit_for_bit_for_1_2_3_participants(numerics, pool3):
    want = _logits(numerics, 1, compiled=False)
    assert _logits(numerics, 1) == want
    for nth in (2, 3):
        assert _logits(numerics, nth, pool3) == want, nth


# -- errors ---------------------------------------------------------------------------------------------------
def _error(g, nth=1, pool=None) -> str:
    with pytest.raises(ComputeError) as e:
        ggtool.graph_compute(g, nth, pool=pool)
    return str(e.value)


def test_a_compiled_kernels_error_is_its_forwards(pool3):
    ctx = ggtool.Context()
    src = leaf(ctx, values((7, 32)))
    idx = leaf(ctx, np.array([1, 9, 2, 3], np.int32), "i32")
    y = F["get_rows"](ctx, src, idx)
    y.name = "picked"
    g = ggtool.Graph(ctx).expand(F["add"](ctx, y, y))
    assert compiled_kernels(g) == ["get_rows", "binary_f32"]
    compute.COMPILED = False
    try:
        want = _error(g)
    finally:
        compute.COMPILED = True
    assert "get_rows: index 9 is outside 0..6" in want
    assert _error(g) == want
    assert _error(g, 3, pool3) == want


@pytest.mark.parametrize("row", [0, 1])
def test_a_nan_the_activation_quantizer_refuses(pool3, row):
    """The same line on 1..3 participants, wherever the NaN is: mm_convert shares a row's blocks out,
    the Python forward whole rows, so the participant that meets it may hold none of its row there."""
    ctx = ggtool.Context()
    a = ctx.new_tensor("q8_0", [64, 16])
    a.set_data(quant.quantize(values((16, 64), special=False), "q8_0"))
    x = values((2, 64), special=False)
    x[row, 40] = np.nan
    y = F["mul_mat"](ctx, a, leaf(ctx, x))
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g) == ["mm_convert", "mm_q32"]
    compute.COMPILED = False
    try:
        want = _error(g)
    finally:
        compute.COMPILED = True
    assert want.endswith(f"failed: mul_mat: b 'leaf_1' holds NaN at [40, {row}, 0, 0] (ne order), which cannot be "
                         "converted to q8_0, the weights' vec_dot_type")
    assert _error(g) == want
    assert _error(g, 2, pool3) == want
    assert _error(g, 3, pool3) == want


# -- the barrier ------------------------------------------------------------------------------------------------
def test_barrier_when_every_waiter_sleeps(monkeypatch, pool3):
    """Spinning nothing, every wait goes to the futex and is woken by the last arrival: 600 barriers
    on 3 participants, the result right."""
    from ggtool.pool import barrier

    monkeypatch.setattr(barrier, "spin_ns", lambda nth: 0)
    ctx = ggtool.Context()
    x = leaf(ctx, np.arange(96, dtype=np.float32).reshape(3, 32))
    b = leaf(ctx, np.full((3, 32), 0.5, np.float32))
    y = x
    for _ in range(600):
        y = F["add"](ctx, y, b)
    g = ggtool.Graph(ctx, 2048).expand(y)
    for _ in range(3):
        ggtool.graph_compute(g, 3, pool=pool3)
        assert np.array_equal(y.numpy(), np.arange(96, dtype=np.float32).reshape(1, 1, 3, 32) + 300)


def test_spin_bound_from_the_free_cpus(monkeypatch):
    from ggtool.pool import barrier

    monkeypatch.setattr(barrier, "free_cpus", lambda: 4)
    assert barrier.spin_ns(4) == barrier.SPIN_FREE_NS
    assert barrier.spin_ns(5) == barrier.SPIN_BUSY_NS
    monkeypatch.undo()
    assert barrier.free_cpus() <= len(os.sched_getaffinity(0))


def test_the_spin_reads_the_load_as_the_thread_rule_does(monkeypatch):
    """The barrier's free CPUs are the thread rule's (the median of several reads: a task running
    for a moment does not turn a 2-thread decode's barriers into sleeps)."""
    from ggtool import threads
    from ggtool.pool import barrier

    monkeypatch.setattr(threads, "available_cpus", lambda: 2)
    monkeypatch.setattr(threads, "others_running", lambda: 1)
    assert barrier.spin_ns(2) == barrier.SPIN_BUSY_NS
    monkeypatch.setattr(threads, "others_running", lambda: 0)
    assert barrier.spin_ns(2) == barrier.SPIN_FREE_NS


def test_program_barriers_and_participant_0_steps():
    """A barrier after each step, none between two steps participant 0 runs alone; after the last
    one where more than one participates (passing it, each knows all have finished: pool._settle)."""
    ctx = ggtool.Context()
    a = leaf(ctx, values((4, 16), special=False))
    s = F["sum_rows"](ctx, F["sqr"](ctx, a))      # n_tasks 1: participant 0 alone
    y = F["add"](ctx, F["mean"](ctx, s), s)
    g = ggtool.Graph(ctx).expand(y)
    program = runner.make_program(g.nodes, 2, "ggml")
    flags = [(k, f) for k, _, f, _ in program.steps]
    assert flags == [(None, runner.ONLY0), (None, runner.ONLY0), (None, runner.ONLY0 | runner.BARRIER),
                     ("binary_f32", runner.BARRIER)]
    alone = runner.make_program(g.nodes, 1, "ggml")
    assert [f for _, _, f, _ in alone.steps] == [runner.ONLY0, runner.ONLY0, runner.ONLY0 | runner.BARRIER, 0]


# -- a crash, Ctrl-C, in the middle of a compiled stretch --------------------------------------------------------
SCRIPT = """
import os, signal, sys, threading, time
import numpy as np
import ggtool
import ggtool.pool.caller as caller
from ggtool.errors import ComputeError
from ggtool.ops import FUNCTIONS as F
from ggtool.pool import WorkerPool
from ggtool.pool.wire import at_node

seen = []                                  # when the caller saw it: the dead worker, the signal
check = caller._check_alive
def check_alive(workers):
    try:
        check(workers)
    except BaseException:
        seen.append(time.monotonic())
        raise
caller._check_alive = check_alive
def on_sigint(signum, frame):
    seen.append(time.monotonic())
    raise KeyboardInterrupt
signal.signal(signal.SIGINT, on_sigint)

ctx = ggtool.Context()
numerics = "ggml"
if sys.argv[1:] == ["mul_mat"]:       # products whose units every participant deals out (llama.cpp's order)
    numerics = "llama.cpp-avx2"
    a = ctx.new_tensor("f32", [512, 512]); a.data[...] = np.eye(512, dtype=np.float32)
    y = ctx.new_tensor("f32", [512, 1]); y.data[...] = 1
    for _ in range(4000):
        y = F["mul_mat"](ctx, a, y)
else:
    x = ctx.new_tensor("f32", [1 << 16, 4]); x.data[...] = 1
    b = ctx.new_tensor("f32", [1 << 16, 4]); b.data[...] = 0.5
    y = x
    for _ in range(4000):                             # ~1 s on 2 cores: all compiled adds and barriers
        y = F["add"](ctx, y, b)
g = ggtool.Graph(ctx, 8192).expand(y)
pool = WorkerPool(3)
ggtool.graph_compute(g, 3, pool=pool, alloc="graph", outputs=[y], numerics=numerics)   # bound, compiled, warm
ctl = memoryview(pool._state.ctl.array).cast("q")

def tell():   # the pids, once every participant is well inside a compute's compiled steps
    while not all(100 <= ctl[at_node(i)] < 3000 for i in range(3)):
        time.sleep(0.001)
    print(os.getpid(), *pool.pids, flush=True)

threading.Thread(target=tell, daemon=True).start()
try:
    while True:
        ggtool.graph_compute(g, 3, pool=pool, alloc="graph", outputs=[y], numerics=numerics)
except ComputeError as e:
    print(seen[0], time.monotonic(), e, flush=True)
    pool.close()
    sys.exit(1)
except KeyboardInterrupt:
    print(seen[0], time.monotonic(), "interrupted", flush=True)
    sys.exit(130)
"""


def _segments(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"ggtool_{pid}_")]


def _mid_stretch(act, *args):
    """Run SCRIPT (its graph: compiled adds, or with "mul_mat" products whose units are dealt out),
    act on it (kill a worker, interrupt it) while every participant is in its compiled steps, and
    return its exit code, its last line, the seconds from the act to the caller seeing it and to the
    error (the pool stopped, its segments unlinked), stderr and the pids."""
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=ROOT, start_new_session=True)
    try:
        pids = [int(v) for v in p.stdout.readline().split()]
        assert len(pids) == 3, p.stderr.read()
        t0 = time.monotonic()
        act(pids)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    seen, done, line = out.strip().splitlines()[-1].split(" ", 2)
    return p.returncode, line, float(seen) - t0, float(done) - t0, err, pids


# The caller sees a dead worker or a signal within milliseconds (its compiled steps come back to Python
# every 5 ms); stopping the pool then kills and reaps the other workers. On a 2-core machine other
# processes load, a dying worker's exit, and the caller itself, may wait tens of milliseconds for a
# core: the bound on the whole is looser.
SEEN_WITHIN, DONE_WITHIN = 0.1, 1.0


@pytest.mark.parametrize("graph", ["add", "mul_mat"])
def test_a_worker_killed_mid_stretch_is_reported_within_100_ms(graph):
    """(mul_mat: the others take the units it would have taken, and wait for it at the barrier, where
    its death is seen: a unit it had taken and not computed is never left as a result.)"""
    rc, line, seen, done, err, pids = _mid_stretch(lambda pids: os.kill(pids[1], signal.SIGKILL), graph)
    assert rc == 1, err
    assert line.startswith(f"worker 1 (pid {pids[1]}) died (killed by SIGKILL) while computing node "), line
    assert seen < SEEN_WITHIN and done < DONE_WITHIN, (seen, done)
    assert _segments(pids[0]) == []


def test_ctrl_c_mid_stretch_stops_within_100_ms():
    rc, line, seen, done, err, pids = _mid_stretch(lambda pids: os.kill(pids[0], signal.SIGINT))
    assert (rc, line) == (130, "interrupted"), err
    assert seen < SEEN_WITHIN and done < DONE_WITHIN, (seen, done)
    assert _segments(pids[0]) == []


def test_the_runners_cache_entries_follow_the_modules_compiled_into_them(tmp_path, monkeypatch):
    """numba stamps a cached function with its own file; the runner's kernels compile other modules'
    functions into theirs, so their stamp covers those modules too (an edit of one is a new stamp)."""
    from numba.core import caching

    from ggtool.kernels import native, nodes

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    assert impl._locator_classes[0].__name__ == "RunnerLocator"
    fn = nodes.binary_f32
    locator = impl._locator_classes[0].from_function(fn, fn.__code__.co_filename)
    before = locator.get_source_stamp()
    assert before[1] == native._deps_stamp()
    x86 = Path(native.__file__).with_name("x86.py")
    st = os.stat(x86)
    try:
        os.utime(x86, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        assert locator.get_source_stamp() != before
    finally:
        os.utime(x86, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert locator.get_source_stamp() == before
    assert impl._locator_classes[0].from_function(quant.quantize, quant.__file__) is None   # others: numba's own


def test_compiled_runner_named_in_docs():
    """docs/engine.md describes the runner and its barrier (the module names a reader greps for)."""
    text = (ROOT / "docs" / "engine.md").read_text()
    for name in ("ggtool.runner", "kernels/runner.py", "kernels/nodes.py", "futex"):
        assert name in text, name


# -- the background compiler (compiling.warm) -----------------------------------------------------------------
def test_the_background_compiler_knows_the_runner_and_every_node_kernel(tmp_path, monkeypatch):
    """What ``ggtool.runner`` wishes for in the command line ("runner", "node:<kernel>") is a kind the
    background compiler keeps and compiles (else its queue drops the wish and a runner is never cached);
    a node kernel that does not exist is dropped like any stray name."""
    from ggtool.compiling import warm
    from ggtool.kernels import cache, nodes

    assert warm.known("runner") and not warm.known("runner:x") and not warm.known("node:no_such_kernel")
    assert {k for k in nodes.KERNELS} >= {"mm_convert", "mm_q32", "mm_k", "mm_k6", "mm_x86", "rms_norm_f32"}
    assert all(warm.known(f"node:{k}") for k in nodes.KERNELS)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "_dirs", {})
    tag = sys.implementation.cache_tag
    (tmp_path / "wanted").mkdir()
    for name in ("runner", "node:scale_f32", "node:no_such_kernel"):
        (tmp_path / "wanted" / f"{name}.{tag}").touch()
    assert warm._pending(str(tmp_path)) == ["node:scale_f32", "runner"]
    monkeypatch.setattr(sys, "stdin", type("In", (), {"buffer": type("B", (), {"read": lambda self: b""})()})())
    warm.main()
    assert sorted(os.listdir(tmp_path / "ready")) == [f"node:scale_f32.{tag}", f"runner.{tag}"]
    assert not (tmp_path / "failed").exists() and os.listdir(tmp_path / "wanted") == []


@pytest.mark.parametrize("case", ["plain", "heads", "views", "cut"])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_f32_products_on_the_runner_sum_as_ggml(case, m, pool3):
    """F32 x F32 under GGML's numerics (a decode step's attention) is one compiled step, mm_f32: every
    output a double sum in order, as kernels.dot_float's tiles give it, NaN payloads, infinities and
    subnormals included; weights broadcast over heads (grouped-query attention) and read through views
    of a larger cache, as attention reads its K and V. "cut": 150 weight rows, 3 tiles of 64 rows
    (ops.matmul.float_cols), one a participant at 3, NaNs of two payloads in every tile, the same bits.
    Left open: where a sum meets two NaNs, which one's payload it keeps can differ between a kernel
    compiled in this process and the same kernel loaded from numba's cache (150 rows of values() with
    its NaNs in every activation, after `touch ggtool/kernels/nodes_mm.py`: true before 64-row tiles too)."""
    ctx = ggtool.Context()
    k = 40
    if case == "plain":
        a = leaf(ctx, values((19, k)))
        b = leaf(ctx, values((m, k)))
    elif case == "cut":     # one NaN or infinity a sum at most (a NaN meeting a NaN: see below)
        w = values((150, k), special=False)
        w[::9, 5] = np.array([0x7F800007, 0xFFC00042], np.uint32).view(np.float32)[np.arange(17) % 2]
        w[4::9, 7] = np.inf
        a = leaf(ctx, w)
        b = leaf(ctx, values((m, k), special=False))
    elif case == "heads":
        a = leaf(ctx, values((1, 2, 13, k)))                                      # 2 KV heads
        b = F["permute"](ctx, leaf(ctx, values((1, m, 6, k))), 0, 2, 1, 3)       # 6 query heads
    else:
        cache = leaf(ctx, values((3, 50, k + 8)))                               # cells of 48 values a head
        a = F["view_3d"](ctx, cache, k, 21, 3, cache.nb[1], cache.nb[2], 4 * 8)  # 21 cells, 3 heads
        b = F["permute"](ctx, leaf(ctx, values((m, 3, k))), 0, 2, 1, 3)
    y = F["mul_mat"](ctx, a, b)
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g)[-1] == "mm_f32"
    same_as_python(g, [y], pools=[pool3])


def test_a_decode_steps_attention_is_cut_between_the_participants():
    """One K of 102 cells (gemma-3's decode step: 1 KV head, 4 query heads) was one TILE_FLOAT tile,
    which left every participant but one waiting: where mm_f32 takes the product its tiles are one
    register tile of kernels.dot_float (64 rows), whatever the participants (so the bits stay:
    test_f32_products_on_the_runner_sum_as_ggml); a prompt's keep TILE_FLOAT's."""
    from ggtool.kernels import dot_float
    from ggtool.ops.base import kernel_for
    from ggtool.ops.matmul import FLOAT_GROUP, MM_F32_ROWS, TILE_FLOAT, _float_tiles, float_cols

    assert FLOAT_GROUP == dot_float.NC * dot_float.L
    assert float_cols(T.F32, 1) == float_cols(T.F32, MM_F32_ROWS) == FLOAT_GROUP
    assert float_cols(T.F32, MM_F32_ROWS + 1) == float_cols(T.F16, 1) == TILE_FLOAT[1]    # F16: Python's
    ctx = ggtool.Context()
    k_cache = ctx.new_tensor("f32", [256, 102])
    assert [(t[4], t[5]) for t in _float_tiles(k_cache, 1, 4, 1)] == [(0, 64), (64, 102)]
    assert [(t[4], t[5]) for t in _float_tiles(k_cache, 30, 4, 1)] == [(0, 102)]
    kq = F["mul_mat"](ctx, k_cache, ctx.new_tensor("f32", [256, 1, 4]))   # one token's 4 query heads
    (mm,) = kernel_for(kq).steps(kq, "ggml")
    assert (mm.kernel, mm.ints) == ("mm_f32", (TILE_FLOAT[0], FLOAT_GROUP))   # the runner's tiles alike


def test_many_f32_rows_stay_on_the_tiles():
    """From MM_F32_ROWS + 1 activation rows (a prompt's attention) the Python path's 16-lane tiles win."""
    from ggtool.ops.matmul import MM_F32_ROWS

    ctx = ggtool.Context()
    y = F["mul_mat"](ctx, leaf(ctx, values((16, 32))), leaf(ctx, values((MM_F32_ROWS + 1, 32))))
    assert compiled_kernels(ggtool.Graph(ctx).expand(y))[-1] is None


@pytest.mark.parametrize("numerics", ["ggml", "llama.cpp-avx2"])
def test_silu_on_the_runner_as_the_forward_nan_payloads_included(numerics, pool3):
    """SILU under GGML's numerics is a compiled step (silu_f32: portable_math's exp, as the forward's
    numpy); under llama.cpp's (ggml_v_silu's lanes) it stays a Python step."""
    ctx = ggtool.Context()
    x = np.concatenate([values((7, 64)).reshape(-1), SPECIAL, np.float32([88.8, -88.8, 104.0, -104.0, 1e-30]),
                        np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0x7F802000, 0x7FA00000, 0xFFFFFFFF],
                                 np.uint32).view(np.float32)])
    x = np.pad(x, (0, -len(x) % 32)).reshape(-1, 32)
    y = F["silu"](ctx, leaf(ctx, x))
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g, numerics) == ["silu_f32" if numerics == "ggml" else None]
    same_as_python(g, [y], numerics, pools=[pool3])


def test_empty_rows_of_f32_products_give_zeros_as_the_forward(pool3):
    """Rows of no values (ne0 = 0) sum to zero: the Python path writes them; mm_f32 leaves them to it."""
    ctx = ggtool.Context()
    a, b = leaf(ctx, values((5, 4))), leaf(ctx, values((2, 4)))
    y = F["mul_mat"](ctx, F["view_2d"](ctx, a, 0, 5, a.nb[1], 0), F["view_2d"](ctx, b, 0, 2, b.nb[1], 0))
    g = ggtool.Graph(ctx).expand(y)
    assert compiled_kernels(g)[-1] is None
    y.data[...] = 7
    ggtool.graph_compute(g, 1)
    assert y.ne[:2] == (5, 2) and not y.numpy().any()


@pytest.mark.parametrize("wtype", ["q4_0", "q6_K", "bf16", "f32"])
def test_the_tiles_repacked_ahead_are_those_the_python_path_reads(wtype, monkeypatch):
    """A first-ever generation repacks its products' weight tiles while their dot compiles
    (``ops.matmul.tile_packers``, ``compiling.first_run.meanwhile``): the same tiles under the same
    keys, so that the product repacks nothing more and gives the same bits; here two weight
    matrices broadcast over four activation matrices, of 1300 rows each (tiles of 1024 and 276).
    F32 weights have tiles of their own: none ahead; nor for a dot not compiling ahead, nor under
    llama.cpp's numerics."""
    from ggtool.generate import loop
    from ggtool.quant import matmul as qm

    def product():
        ctx = ggtool.Context()
        a = ctx.new_tensor(wtype, [256, 1300, 2])
        x = np.random.default_rng(5).standard_normal((2, 1300, 256)).astype(np.float32)
        a.set_data(x if wtype == "f32" else quant.quantize(x, wtype))
        b = np.random.default_rng(6).standard_normal((4, 1, 256)).astype(np.float32)
        y = F["mul_mat"](ctx, a, leaf(ctx, b))
        return ggtool.Graph(ctx).expand(y), y

    g, y = product()
    python_path(g)
    want = bits(y)
    packed = []
    pack_rows = qm.pack_rows
    monkeypatch.setattr(qm, "pack_rows", lambda t, w: packed.append(w.shape) or pack_rows(t, w))
    g, y = product()
    dots = {f"dot:{wtype}"}
    assert list(loop.tile_packers(g, "llama.cpp", dots)) == []   # its products read other blocks
    assert list(loop.tile_packers(g, "ggml", {"dot:q8_0"})) == []  # its dot is not compiling ahead: a twin
    pieces = list(loop.tile_packers(g, "ggml", dots))
    for piece in pieces:
        piece()
    assert len(pieces) == (0 if wtype == "f32" else 4) == len(packed)
    python_path(g)
    assert len(packed) == len(pieces) and bits(y) == want
