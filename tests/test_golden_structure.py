"""Shapes, strides, names, node/leaf order, plans and memory offsets against GGML's own output."""

import pytest
from replay import Replay, load_json, load_npz

import ggtool
from ggtool.graph import graph_overhead

GRAPHS = load_json("graphs.json")["graphs"]
MEMORY = load_json("memory.json")


@pytest.mark.parametrize("g", GRAPHS, ids=lambda g: g["name"])
def test_graph_nodes_leafs_and_plans(g):
    r = Replay(g["steps"], load_npz("graphs.npz"))
    want = g["graph"]
    assert r.graph.size == want["size"] and r.graph.hash_size == want["hash_size"]
    for kind in ("nodes", "leafs"):
        got = [dict(id=r.id_of(t), name=t.name, op=t.op, op_desc=t.op_desc,
                    type=r.record(t)["type"], ne=list(t.ne), nb=list(t.nb), flags=t.flags)
               for t in getattr(r.graph, kind)]
        assert got == want[kind]
    for p in g["plans"]:
        plan = ggtool.make_plan(r.graph, p["requested"])
        assert (plan.n_threads, plan.work_size) == (p["n_threads"], p["work_size"])


@pytest.mark.parametrize("g", GRAPHS, ids=lambda g: g["name"])
def test_graph_tensor_records(g):
    r = Replay(g["steps"], load_npz("graphs.npz"))
    for tid, want in g["tensors"].items():
        got = r.record(r.ids[tid])
        assert got == {k: want[k] for k in got}, tid


@pytest.mark.parametrize("seq", MEMORY["sequences"], ids=lambda s: s["name"])
def test_memory_sequences(seq):
    r = Replay(seq["steps"], mem_size=seq["init"]["mem_size"], no_alloc=seq["init"]["no_alloc"])
    assert r.ctx.mem_size == seq["mem_size_after_init"]
    assert r.trace == seq["trace"]


@pytest.mark.parametrize("case", MEMORY["errors"], ids=lambda s: s["name"])
def test_memory_errors(case):
    from ggtool.errors import ContextMemoryError, GraphFullError

    steps = case["steps"]
    r = Replay(steps[: case["failing_step"]], mem_size=case["init"]["mem_size"])
    assert [{k: v for k, v in t.items() if k != "id"} for t in r.trace] == case["trace_before_failure"]
    with pytest.raises((ContextMemoryError, GraphFullError)) as e:
        r.step(case["failing_step"], steps[case["failing_step"]], None)
    outcome = case["outcome"]
    if outcome.get("log_warning"):
        assert str(e.value) in outcome["log_warning"]
        assert "needed" in str(e.value) and "available" in str(e.value)
    else:
        assert outcome["assert_message"] in str(e.value)


def test_constants():
    c = MEMORY["constants"]
    assert graph_overhead() == c["graph_overhead"]
    for g in c["graph_overhead_custom"]:
        assert graph_overhead(g["size"], g["grads"]) == g["bytes"]
    for m in MEMORY["mem_size_rounding"]:
        from ggtool import Context
        assert Context(m["mem_size"]).mem_size == m["ggml_get_mem_size"]


def test_layout_predicates_follow_ggml():
    """ggml_is_transposed, ggml_is_permuted, ggml_is_contiguous_n: permute(1,0,2,3) of a 3x4 F32
    tensor is transposed and permuted; view_2d(m,2,3,12,4) is contiguous_1 but not contiguous;
    permute(0,2,1,3) of [64,12,4] is contiguous_2 only."""
    from ggtool import Context
    from ggtool.ops import FUNCTIONS as F

    ctx = Context()
    m = ctx.new_tensor("f32", [3, 4])
    p = F["permute"](ctx, m, 1, 0, 2, 3)
    assert (p.ne, p.nb, p.is_transposed(), p.is_permuted()) == ((4, 3, 1, 1), (12, 4, 48, 48), True, True)
    assert not m.is_permuted() and m.is_contiguous()
    v = F["view_2d"](ctx, m, 2, 3, 12, 4)
    assert (v.is_contiguous(), v.is_contiguous(1), v.nbytes) == (False, True, 32)
    q = F["permute"](ctx, ctx.new_tensor("f32", [64, 12, 4]), 0, 2, 1, 3)
    assert (q.is_contiguous(0), q.is_contiguous(1), q.is_contiguous(2)) == (False, False, True)
