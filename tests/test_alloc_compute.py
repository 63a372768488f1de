"""Computing with the graph allocator (alloc="graph", `ggtool compute`'s default): results
byte-identical to context mode for the golden graphs and ops, for every op that computes in place
(on real threads too), for random graphs and on the worker pool, with the compute buffer poisoned
first (reused memory holds earlier tensors' bytes, never zeros)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT, STORIES, ok
from hypothesis import HealthCheck, given, reject, settings
from kernel_threads import compute_threaded
from random_graphs import graphs
from replay import Replay, load_json, load_npz
from test_golden_ops import assert_result, tolerance

import ggtool
from ggtool.compute import bind, prepare, unbind
from ggtool.ops import FUNCTIONS as F

GRAPHS = load_json("graphs.json")["graphs"]
GRAPHS_NPZ = load_npz("graphs.npz")
OPS = load_json("ops.json")["cases"]
OPS_NPZ = load_npz("ops.npz")


def poison(graph) -> None:
    """NaN bytes over the whole compute buffer: a kernel that relies on a zeroed result shows."""
    off, size = graph.compute_buffer
    graph.ctx.buffer[off:off + size] = 0xFF


def raw(t) -> bytes:
    return np.ascontiguousarray(t.data).tobytes()


def run_graph_mode(graph, outputs, nth: int) -> None:
    plan = prepare(graph, 1, alloc="graph", outputs=outputs)
    poison(graph)
    if nth == 1:
        ggtool.graph_compute(graph, 1, plan=plan, alloc="graph", outputs=outputs)
    else:
        compute_threaded(graph, nth, force=True)   # GGML's loop on threads, in the bound buffer


@pytest.mark.parametrize("nth", [1, 3])
@pytest.mark.parametrize("g", GRAPHS, ids=lambda g: g["name"])
def test_golden_graphs(g, nth):
    ref = Replay(g["steps"], GRAPHS_NPZ)
    ggtool.graph_compute(ref.graph, 1)
    r = Replay(g["steps"], GRAPHS_NPZ)
    outs = [r.ids[tid] for tid in g["compute"]["results"]]
    run_graph_mode(r.graph, outs, nth)
    assert r.graph.binding is not None
    for tid, res in g["compute"]["results"].items():
        assert raw(r.ids[tid]) == raw(ref.ids[tid]), tid
        tol = tolerance({t.op.lower() for t in r.graph.nodes})
        assert_result(np.array(r.ids[tid].data), GRAPHS_NPZ[res["key"]], max(tol, 5e-4) if tol else 0.0, tid)


@pytest.mark.parametrize("nth", [1, 3])
@pytest.mark.parametrize("case", OPS, ids=lambda c: c["name"])
def test_golden_ops(case, nth):
    def build():
        r = Replay(case["steps"], OPS_NPZ)
        out = r.ids[case["output"]]
        return r, ggtool.Graph(r.ctx).expand(out), out

    ref, g0, out0 = build()
    ggtool.graph_compute(g0, 1)
    r, g, out = build()
    run_graph_mode(g, [out], nth)
    assert raw(out) == raw(out0)


# every op GGML may compute in place, in place: src is a node whose last consumer is the op
INPLACE_CASES = {
    "add": lambda ctx, h, y: F["add"](ctx, h, y), "add_src1": lambda ctx, h, y: F["add"](ctx, y, h),
    "add_tiled": lambda ctx, h, y: F["add"](ctx, h, F["view_1d"](ctx, y, 8, 0)),
    "sub": lambda ctx, h, y: F["sub"](ctx, h, y), "mul": lambda ctx, h, y: F["mul"](ctx, h, y),
    "mul_src1": lambda ctx, h, y: F["mul"](ctx, y, h), "div": lambda ctx, h, y: F["div"](ctx, h, y),
    "scale": lambda ctx, h, y: F["scale"](ctx, h, 0.25), "sqr": lambda ctx, h, y: F["sqr"](ctx, h),
    "sqrt": lambda ctx, h, y: F["sqrt"](ctx, h), "log": lambda ctx, h, y: F["log"](ctx, h),
    "relu": lambda ctx, h, y: F["relu"](ctx, h), "gelu": lambda ctx, h, y: F["gelu"](ctx, h),
    "silu": lambda ctx, h, y: F["silu"](ctx, h), "exp": lambda ctx, h, y: F["exp"](ctx, h),
    "rms_norm": lambda ctx, h, y: F["rms_norm"](ctx, h, 1e-5),
    "soft_max": lambda ctx, h, y: F["soft_max"](ctx, h),
    "soft_max_ext": lambda ctx, h, y: F["soft_max_ext"](ctx, h, y, 0.5, 0.0),
    "soft_max_mask_in_place": lambda ctx, h, y: F["soft_max_ext"](ctx, y, h, 0.5, 0.0),
    "diag_mask_inf": lambda ctx, h, y: F["diag_mask_inf"](ctx, h, 1),
    "rope": lambda ctx, h, y: F["rope"](ctx, F["reshape_3d"](ctx, h, 4, 2, 8), ctx.new_tensor_from(
        np.arange(8, dtype=np.int32)), 4, 0),
}


@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.parametrize("name", INPLACE_CASES)
def test_in_place_ops(name, nth):
    def build():
        ctx = ggtool.Context()
        rng = np.random.default_rng(7)
        x = ctx.new_tensor_from(rng.uniform(0.5, 2.0, (8, 8)).astype(np.float32), name="x")
        y = ctx.new_tensor_from(rng.uniform(0.5, 2.0, (8, 8)).astype(np.float32), name="y")
        h = F["cont"](ctx, x)                        # a node: its memory can be taken over
        out = F["neg"](ctx, INPLACE_CASES[name](ctx, h, y))
        return ggtool.Graph(ctx).expand(out), out

    g0, out0 = build()
    ggtool.graph_compute(g0, 1)
    g, out = build()
    assert ggtool.allocate(g, [out]).inplace, "the case must compute in place"
    run_graph_mode(g, [out], nth)
    assert raw(out) == raw(out0)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(graphs(max_steps=16))
def test_random_graphs_byte_identical(case):
    ctx, g, roots, outputs = case
    leafs = [(t, np.array(t.data)) for t in g.leafs]   # cpy and clamp write into their sources, leafs too
    try:
        ggtool.graph_compute(g, 1)
    except ggtool.ComputeError:        # a graph GGML's kernels refuse too (e.g. add of a transposed a)
        reject()
    want = [raw(t) for t in outputs]
    for t, data in leafs:
        t.data[...] = data
    run_graph_mode(g, outputs, 1)
    assert [raw(t) for t in outputs] == want


def test_worker_pool_on_the_compute_buffer():
    from ggtool.pool import get_pool

    def build():
        ctx = ggtool.Context()
        rng = np.random.default_rng(3)
        w = ctx.new_tensor_from(rng.standard_normal((64, 64)).astype(np.float32))
        x = ctx.new_tensor_from(rng.standard_normal((16, 64)).astype(np.float32))
        h = x
        for _ in range(4):
            h = F["silu"](ctx, F["rms_norm"](ctx, F["mul_mat"](ctx, w, h), 1e-5))
        return ggtool.Graph(ctx).expand(h), h

    g0, out0 = build()
    ggtool.graph_compute(g0, 1)
    g, out = build()
    pool = get_pool(2)
    plan = prepare(g, 2, alloc="graph", outputs=[out])
    poison(g)
    ggtool.graph_compute(g, 2, pool=pool, plan=plan, alloc="graph", outputs=[out])
    assert raw(out) == raw(out0)


def test_bind_places_nodes_and_unbind_gives_their_memory_back():
    ctx = ggtool.Context()
    x = ctx.new_tensor_from(np.arange(64, dtype=np.float32).reshape(8, 8))
    h = F["mul_mat"](ctx, x, x)
    r = F["relu"](ctx, h)
    t = F["transpose"](ctx, r)
    out = F["cont"](ctx, t)
    g = ggtool.Graph(ctx).expand(out)
    mem = ggtool.make_plan(g, 1).mem_size(g)
    own = {id(n): n.data_offset for n in g.nodes}
    a = bind(g, [out])
    base = g.compute_buffer[0]
    assert h.data_offset == base + a.offsets[id(h)] and r.data_offset == h.data_offset   # relu in place
    assert t.data_offset == r.data_offset                                             # a view follows
    assert bind(g, [out]) is a                                # same outputs: same placement, same buffer
    ggtool.graph_compute(g, 1, alloc="graph", outputs=[out])
    assert ggtool.make_plan(g, 1).mem_size(g) == mem + 32                  # the new work buffer; the compute buffer not counted
    got = np.array(out.data)
    ggtool.graph_compute(g, 1)                                              # context mode: every node its own memory again
    assert {id(n): n.data_offset for n in g.nodes} == own and g.binding is None
    xs = np.arange(64, dtype=np.float32).reshape(8, 8)
    assert np.array_equal(out.data, got) and np.array_equal(h.data.reshape(8, 8), xs @ xs.T)
    unbind(g)                                                 # nothing bound: nothing to do
    used = ctx.used_mem
    a2 = bind(g, [out, h])                                    # other outputs: a new placement, and the
    assert a2.size == 768 > a.size                            # buffer grows (GGML reallocates it)
    assert ctx.used_mem == used + 32 + 768 and g.compute_buffer[1] == 768
    bind(g, [out])
    assert ctx.used_mem == used + 32 + 768                    # smaller: the same buffer serves


def test_bad_alloc_mode():
    ctx = ggtool.Context()
    g = ggtool.Graph(ctx).expand(F["relu"](ctx, ctx.new_tensor_from(np.ones(4, np.float32))))
    with pytest.raises(ggtool.GGToolError, match="alloc must be one of context, graph"):
        ggtool.graph_compute(g, 1, alloc="gallocr")


@pytest.mark.parametrize("threads", ["1", "2"])
def test_cli_llama_is_byte_identical_either_way(run, threads):
    args = ("compute", "-f", ROOT / "ggtool" / "programs" / "llama.gg", "--gguf", STORIES, "--tensor",
            "tokens=i32:[1,403,407,261,378,432,383,286]", "--threads", threads, "--output", "logits",
            "--output", "x-1")
    graph_mode = ok(run(*args))
    assert graph_mode == ok(run(*args, "--alloc", "context"))
    doc = json.loads(graph_mode)
    assert np.argmax(np.array(doc["logits"]), axis=1).tolist() == [403, 407, 261, 378, 432, 383, 286, 261]


def test_cli_verbose_reports_the_compute_buffer(run):
    r = run("compute", "relu(mul_mat(a, a))", "--tensor", "a=f32[8,8]", "-v")
    assert "compute buffer 256 bytes" in r.stderr
    r = run("compute", "relu(mul_mat(a, a))", "--tensor", "a=f32[8,8]", "-v", "--alloc", "context")
    assert "compute buffer" not in r.stderr
