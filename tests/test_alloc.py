"""ggtool.alloc: GGML's graph allocator (ggml_gallocr). The free list, reuse after the last use,
views, inputs and outputs, in-place reuse, GGML's own numbers (tests/golden/alloc) and a property
test: tensors alive at the same time never share memory."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from random_graphs import graphs

import ggtool
from ggtool.alloc import INPLACE_OPS, TENSOR_ALIGNMENT, FreeList, GraphAllocator, allocate
from ggtool.ops import FUNCTIONS as F
from ggtool.tensor import FLAG_INPUT, FLAG_OUTPUT

GOLDEN = ROOT / "tests" / "golden" / "alloc" / "alloc.json"


def leaf(ctx, ne=(16, 4), name="x"):
    return ctx.new_tensor_from(np.ones(ne[::-1], np.float32), name=name)


def graph(*roots):
    g = ggtool.Graph(roots[0].ctx)
    for r in roots:
        g.expand(r)
    return g


# -- the free list (ggml_dyn_tallocr) ------------------------------------------------------------
def test_free_list_aligns_and_grows_at_the_end():
    fl = FreeList()
    assert [fl.alloc(1), fl.alloc(32), fl.alloc(33), fl.alloc(0)] == [0, 32, 64, 128]
    assert fl.max_size == 128


def test_free_list_best_fit_takes_the_smallest_block_that_fits():
    fl = FreeList(16)
    offs = [fl.alloc(n) for n in (64, 16, 32, 16, 48, 16)]   # 0, 64, 80, 112, 128, 176
    for i in (0, 2, 4):                                       # holes of 64 @0, 32 @80, 48 @128
        fl.free(offs[i], (64, 32, 48)[i // 2])
    assert fl.alloc(40) == 128        # the 48-byte hole, not the first one that fits (64 @0)
    assert fl.alloc(30) == 80         # the 32-byte hole
    assert fl.alloc(64) == 0
    assert fl.alloc(16) == 192 and fl.max_size == 208   # no hole left: the end block grows the buffer


def test_free_list_ties_go_to_the_last_block_and_the_end_is_the_last_resort():
    fl = FreeList(16)
    a, _, c, _ = fl.alloc(32), fl.alloc(16), fl.alloc(32), fl.alloc(16)
    fl.free(a, 32)
    fl.free(c, 32)
    assert fl.alloc(32) == c          # two 32-byte holes: GGML's `<=` keeps the last one
    assert fl.alloc(48) == 96         # too big for the hole at 0: carved from the end
    assert fl.max_size == 144


def test_free_list_merges_neighbours():
    fl = FreeList(16)
    offs = [fl.alloc(16) for _ in range(4)]
    fl.free(offs[0], 16)
    fl.free(offs[2], 16)
    assert fl.blocks[:2] == [[0, 16], [32, 16]]
    fl.free(offs[1], 16)              # joins the blocks before and after it
    assert fl.blocks[0] == [0, 48]
    fl.free(offs[3], 16)              # and everything merges into the end block
    assert len(fl.blocks) == 1 and fl.blocks[0][0] == 0


def test_alignment_must_be_a_power_of_two():
    with pytest.raises(ggtool.GGToolError, match="power of 2"):
        FreeList(24)


# -- the graph allocator ------------------------------------------------------------------------
def test_memory_is_reused_after_the_last_use():
    ctx = ggtool.Context()
    w, x = leaf(ctx, (16, 16), "w"), leaf(ctx, (16, 4))
    b = F["mul_mat"](ctx, w, x)       # mul_mat never computes in place
    c = F["mul_mat"](ctx, w, b)
    d = F["mul_mat"](ctx, w, c)
    e = F["mul_mat"](ctx, w, d)
    a = allocate(graph(e), [e])
    off = [a.offset(t) for t in (b, c, d, e)]
    assert off[0] == 0 and off[1] == 256   # both alive while c is computed
    assert off[2] == 0                     # b's memory, free once c (its last consumer) is done
    assert off[3] == 256
    assert a.size == 512 and a.intermediates_size == 4 * 256 and a.n_intermediates == 4


def test_views_never_get_memory_and_keep_their_source_alive():
    ctx = ggtool.Context()
    w, x = leaf(ctx, (16, 16), "w"), leaf(ctx, (16, 4))
    h = F["mul_mat"](ctx, w, x)                      # [16, 4]
    v = F["view_1d"](ctx, F["reshape_1d"](ctx, h, 64), 16, 64)
    t = F["transpose"](ctx, h)
    m1 = F["mul_mat"](ctx, w, x)                     # h must outlive these: its views are used later
    m2 = F["mul_mat"](ctx, w, m1)
    r = F["add"](ctx, F["cont"](ctx, F["transpose"](ctx, F["cont"](ctx, t))), F["mul_mat"](ctx, w, m2))
    s = F["mul"](ctx, r, F["repeat"](ctx, v, r))
    g = graph(s)
    a = allocate(g, [s])
    views = [n for n in g.nodes if n.view_src is not None]
    assert views and all(id(n) not in a.offsets for n in views)
    assert a.offset(v) == a.offset(h) + 64 and a.offset(t) == a.offset(h)
    held = (a.offset(h), a.offset(h) + h.nbytes)
    g_index = {id(n): i for i, n in enumerate(g.nodes)}
    assert g_index[id(h)] < g_index[id(m1)] < g_index[id(m2)] < g_index[id(s)]
    for n in (m1, m2):                               # nothing computed while h's views wait is put on h
        assert a.offset(n) + n.nbytes <= held[0] or a.offset(n) >= held[1]


def test_leafs_are_never_in_the_buffer():
    ctx = ggtool.Context()
    x = leaf(ctx)
    r = F["relu"](ctx, x)                            # could compute in place, but x is an input
    g = graph(F["relu"](ctx, r))
    a = allocate(g)
    assert all(id(t) not in a.offsets for t in g.leafs)
    assert a.offset(r) == 0 and a.inplace == {1: r}  # relu(relu(x)): the second takes the first's memory
    tv = F["transpose"](ctx, x)                      # a view of a leaf has no place in the buffer either
    a = allocate(graph(F["cont"](ctx, tv)))
    assert a.offset(tv) is None and a.node_offsets[0] is None


def test_inputs_flagged_input_are_placed_first():
    ctx = ggtool.Context()
    w, x = leaf(ctx, (16, 16), "w"), leaf(ctx, (16, 4))
    b = F["mul_mat"](ctx, w, x)
    c = F["mul_mat"](ctx, w, b)
    late = F["mul_mat"](ctx, w, x)
    late.flags |= FLAG_INPUT                         # e.g. a tensor a program fills before computing
    d = F["add"](ctx, c, late)
    a = allocate(graph(d), [d])
    assert a.offset(late) == 0 and a.offset(b) == 256


def test_outputs_are_never_freed_nor_taken_over():
    ctx = ggtool.Context()
    w, x = leaf(ctx, (16, 16), "w"), leaf(ctx, (16, 4))
    b = F["mul_mat"](ctx, w, x)
    c = F["relu"](ctx, b)                            # would take b's memory, b being its last use
    d = F["mul_mat"](ctx, w, c)
    e = F["mul_mat"](ctx, w, d)
    g = graph(e)
    plain = allocate(g, [e])
    assert plain.offset(c) == plain.offset(b) and plain.offset(e) == plain.offset(b)
    kept = allocate(g, [b, e])                       # b is an output now
    assert kept.offset(c) != kept.offset(b) and kept.inplace == {}
    later = [kept.offset(t) for t in (c, d, e)]
    assert all(o >= kept.offset(b) + b.nbytes or o + 256 <= kept.offset(b) for o in later)
    b.flags |= FLAG_OUTPUT                           # the OUTPUT flag does the same as outputs=
    assert allocate(g, [e]).offsets == kept.offsets


def test_an_output_view_keeps_its_source():
    ctx = ggtool.Context()
    w, x = leaf(ctx, (16, 16), "w"), leaf(ctx, (16, 4))
    b = F["mul_mat"](ctx, w, x)
    t = F["transpose"](ctx, b)
    c = F["mul_mat"](ctx, w, F["mul_mat"](ctx, w, b))
    a = allocate(graph(t, c), [t, c])
    assert a.offset(t) == a.offset(b)
    assert all(a.offset(n) >= 256 for n in c.src[1:] + [c])


@pytest.mark.parametrize("op, inplace", [("relu", True), ("silu", True), ("scale", True), ("rms_norm", True),
                                         ("soft_max", True), ("sqr", True), ("norm", False), ("cont", False),
                                         ("sum_rows", False), ("dup", False)])
def test_in_place_only_for_the_ops_ggml_allows(op, inplace):
    ctx = ggtool.Context()
    w, x = leaf(ctx, (16, 16), "w"), leaf(ctx, (16, 4))
    h = F["mul_mat"](ctx, w, x)
    args = {"scale": (0.5,), "rms_norm": (1e-5,), "norm": (1e-5,)}.get(op, ())
    r = F[op](ctx, h, *args)
    assert (r.op in INPLACE_OPS) == inplace
    a = allocate(graph(r), [r])
    assert (a.offset(r) == a.offset(h)) == (inplace and r.nbytes == h.nbytes)
    assert (1 in a.inplace) == (inplace and r.nbytes == h.nbytes)


def test_in_place_needs_the_last_consumer_and_the_same_layout():
    ctx = ggtool.Context()
    w, x = leaf(ctx, (16, 16), "w"), leaf(ctx, (16, 4))
    h = F["mul_mat"](ctx, w, x)
    r = F["relu"](ctx, h)                        # not h's last consumer: memory of its own
    s = F["add"](ctx, h, r)                      # the last consumer of both: takes src0's memory
    a = allocate(graph(s), [s])
    assert a.offset(r) != a.offset(h) and a.offset(s) == a.offset(h) and a.inplace == {2: h}
    s = F["add"](ctx, r, h)                      # sources are tried in order
    a = allocate(graph(s), [s])
    assert a.offset(s) == a.offset(r) and a.inplace == {2: r}
    y = F["mul"](ctx, h, h)                      # h twice: two consumers counted, no in place
    a = allocate(graph(y), [y])
    assert a.offset(y) != a.offset(h)
    z = F["add"](ctx, leaf(ctx, (4, 16)), F["transpose"](ctx, F["mul_mat"](ctx, w, x)))
    a = allocate(graph(z), [z])                  # a transposed view has other strides: not the same layout
    assert a.inplace == {}


def test_in_place_may_take_any_source():
    ctx = ggtool.Context()
    w, x = leaf(ctx, (16, 16), "w"), leaf(ctx, (16, 4))
    h = F["mul_mat"](ctx, w, x)
    s = F["add"](ctx, x, h)                      # src0 is a leaf: the node takes src1's memory
    a = allocate(graph(s), [s])
    assert a.offset(s) == a.offset(h) and a.inplace == {1: h}


def test_allocator_is_reusable_and_graph_allocate_is_the_same():
    ctx = ggtool.Context()
    x = leaf(ctx)
    r = F["silu"](ctx, F["mul_mat"](ctx, x, x))
    g = graph(r)
    galloc = GraphAllocator()
    first, second = galloc.allocate(g, [r]), galloc.allocate(g, [r])
    assert first.offsets == second.offsets == ggtool.allocate(g, [r]).offsets
    assert first.alignment == TENSOR_ALIGNMENT == 32


def test_plan_allocate_reports_the_compute_buffer():
    ctx = ggtool.Context()
    x = leaf(ctx)
    r = F["relu"](ctx, F["mul_mat"](ctx, x, x))
    g = graph(r)
    plan = ggtool.make_plan(g, 2)
    assert plan.compute_buffer_size is None
    a = plan.allocate(g, [r])
    assert plan.allocation is a and plan.compute_buffer_size == a.size == 64


# -- GGML's own numbers --------------------------------------------------------------------------
def _golden_cases():
    return json.loads(GOLDEN.read_text())["cases"]


@pytest.mark.parametrize("case", _golden_cases(), ids=lambda c: f"{c['program'][:12]}-{c['tensors'][0]}")
def test_offsets_equal_ggml_gallocr(case, monkeypatch):
    from ggtool.dsl import build, parse
    from ggtool.tensor_io import Inputs, parse_named_source

    monkeypatch.chdir(ROOT)
    src = case["program"]
    if src.startswith("@"):
        src = (ROOT / src[1:]).read_text()
    env = Inputs([parse_named_source(o) for o in case["tensors"]], case["gguf"], read_data=False)
    built = build(parse(src), ggtool.Context(), env, outputs=case["outputs"] or None)
    g = built.graph
    a = allocate(g, [t for _, t in built.outputs])
    assert [t.name for t in g.nodes] == case["node_names"]
    assert a.node_offsets == case["node_offsets"]
    assert a.size == case["compute_buffer_size"]


def test_llama_compute_buffer_is_far_smaller_than_the_intermediates(run):
    """(The figures themselves: `python bench/bench_alloc.py llama`.)"""
    from conftest import STORIES, ok

    for n in (16, 512):
        doc = json.loads(ok(run("plan", "-f", ROOT / "ggtool" / "programs" / "llama.gg", "--gguf", STORIES,
                                "--tensor", f"tokens=i32[{n}]", "--json", "--threads", "2")))
        assert doc["compute_buffer_size"] * 10 < doc["intermediates_size"]


# -- property: tensors alive at the same time never share memory ---------------------------------
def live_ranges(g, outputs):
    """id(root) -> (first, last) node index touching its memory: it is written by its node, read by
    its consumers and those of its views, written again by a cpy/clamp into it; outputs live to the end."""
    index = {id(t): i for i, t in enumerate(g.nodes)}
    ranges: dict[int, list[int]] = {}

    def touch(t, i):
        root = t.view_src if t.view_src is not None else t
        if id(root) in index:
            r = ranges.setdefault(id(root), [i, i])
            r[0], r[1] = min(r[0], i), max(r[1], i)

    for i, node in enumerate(g.nodes):
        touch(node, i)
        for s in node.src:
            if s is not None:
                touch(s, i)
    for t in outputs:
        root = t.view_src if t.view_src is not None else t
        if id(root) in ranges:
            ranges[id(root)][1] = len(g.nodes)
    return ranges


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(graphs())
def test_tensors_alive_together_never_overlap(case):
    ctx, g, roots, outputs = case
    a = allocate(g, outputs)
    nodes = {id(t): t for t in g.nodes}
    assert all(id(t) not in a.offsets for t in g.leafs)
    assert all(nodes[k].view_src is None and nodes[k].op != "NONE" for k in a.offsets)   # views: no memory
    assert all(t.view_src is not None or t.op == "NONE" or id(t) in a.offsets for t in g.nodes)
    for k, off in a.offsets.items():
        assert off % TENSOR_ALIGNMENT == 0 and off + nodes[k].nbytes <= a.size
    ranges = live_ranges(g, outputs)
    inputs = {k for k in a.offsets if nodes[k].flags & FLAG_INPUT}
    owned = sorted(a.offsets, key=lambda k: ranges[k][0])
    for i, k1 in enumerate(owned):
        t1, (d1, u1) = nodes[k1], ranges[k1]
        if k1 in inputs:                 # placed before anything runs (GGML allocates INPUT tensors first)
            d1 = 0
        for k2 in owned[i + 1:]:
            t2, (d2, u2) = nodes[k2], ranges[k2]
            if k2 in inputs:
                d2 = 0
            apart = a.offsets[k1] + t1.nbytes <= a.offsets[k2] or a.offsets[k2] + t2.nbytes <= a.offsets[k1]
            if apart or u1 < d2 or u2 < d1:
                continue
            # the one sharing allowed: a node computed in place of its source at the source's last use
            taken = a.inplace.get(g.nodes.index(t2))
            assert taken is t1 and u1 == d2 and t2.op in INPLACE_OPS and a.offsets[k1] == a.offsets[k2], \
                f"{t1.name} [{d1}, {u1}] and {t2.name} [{d2}, {u2}] share memory"
