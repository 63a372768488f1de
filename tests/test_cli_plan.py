"""`ggtool plan`: per-node n_tasks and work, threads, work_size and the GGML context size."""

from __future__ import annotations

import json

from conftest import ROOT, STORIES, ok

from ggtool import Context
from ggtool.dsl import build, parse
from ggtool.plan import make_plan
from ggtool.tensor_io import Inputs, parse_named_source

ARGS = ("mul_mat(w, x)", "--tensor", "w=q4_0[64,8]", "--tensor", "x=f32[64,3]")


def expected(threads: int):
    ctx = Context()
    env = Inputs([parse_named_source(o) for o in ("w=q4_0[64,8]", "x=f32[64,3]")], read_data=False)
    built = build(parse("mul_mat(w, x)"), ctx, env)
    return built.graph, make_plan(built.graph, threads)


def test_plan_json(run):
    doc = json.loads(ok(run("plan", *ARGS, "--threads", "4", "--json")))
    graph, plan = expected(4)
    assert {"n_threads", "work_size", "mem_size", "nodes"} <= set(doc)
    assert (doc["n_threads"], doc["work_size"], doc["requested"]) == (plan.n_threads, plan.work_size, 4)
    assert doc["mem_size"] == plan.mem_size(graph)
    assert doc["nodes"] == [{"index": 0, "op": "MUL_MAT", "op_desc": "MUL_MAT", "name": "node_0",
                             "n_tasks": plan.nodes[0].n_tasks, "work_size": plan.nodes[0].work_size, "split": "all"}]
    assert doc["work_size"] > 0  # q4_0 weights: x is converted to q8_0 in the work buffer


def test_plan_text(run):
    out = ok(run("plan", *ARGS, "--threads", "2"))
    graph, plan = expected(2)
    lines = out.splitlines()
    assert lines[0] == "=== PLAN ===" and lines[2].split() == ["index", "op", "name", "n_tasks", "work_size", "split"]
    assert lines[3].split() == ["-", "0", "MUL_MAT", "node_0", str(plan.nodes[0].n_tasks), str(plan.nodes[0].work_size),
                                "all"]
    assert f"n_threads = {plan.n_threads} (requested 2)" in lines
    assert f"work_size = {plan.work_size}" in lines
    assert any(line.startswith(f"mem_size  = {plan.mem_size(graph)} ") for line in lines)


def test_threads_from_environment(run, monkeypatch):
    monkeypatch.setenv("GGTOOL_THREADS", "3")
    assert json.loads(ok(run("plan", *ARGS, "--json")))["requested"] == 3


def test_default_threads_are_those_compute_would_use(run, monkeypatch):
    """ggtool.threads' rule (choose: the fastest count for the graph's work among the free CPUs),
    and why, in the table and the JSON; a given count is obeyed."""
    from ggtool import threads

    monkeypatch.delenv("GGTOOL_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    monkeypatch.setattr(threads, "CGROUP_CPU_MAX", "/nonexistent")
    monkeypatch.setattr(threads, "others_running", lambda: 0)
    doc = json.loads(ok(run("plan", *ARGS, "--json")))
    assert doc["requested"] == 1 and doc["threads_why"].startswith("1 thread: ")    # a small graph
    big = ("mul_mat(w, x)", "--tensor", "w=f32[8192,8192]", "--tensor", "x=f32[8192,1024]")  # 137 GFLOP
    doc = json.loads(ok(run("plan", *big, "--json")))
    want = threads.choose(threads.Work(flops=2 * 8192**3 // 8, weight_bytes=8192**2 * 4, params=8192**2, barriers=1))
    assert doc["requested"] == want.n == 5 and doc["threads_why"] == want.reason
    assert f"threads   = {want.reason}" in ok(run("plan", *big)).splitlines()
    monkeypatch.setattr(threads, "others_running", lambda: 3)     # others busy on 3 of the 5
    assert json.loads(ok(run("plan", *big, "--json")))["requested"] == 2
    monkeypatch.setenv("GGTOOL_THREADS", "4")
    doc = json.loads(ok(run("plan", *ARGS, "--json")))
    assert doc["requested"] == 4 and doc["threads_why"] == "4 given (--threads or GGTOOL_THREADS)"
    assert not any(line.startswith("threads ") for line in ok(run("plan", *ARGS)).splitlines())


def test_plan_counts_memory_mapped_weights(run):
    doc = json.loads(ok(run("plan", "mul_mat(output.weight, x)", "--gguf", STORIES, "--tensor", "x=f32[64,1]",
                            "--json", "--threads", "1")))
    assert doc["mem_size"] > 64 * 512 * 4  # output.weight's bytes count as if in the context


def test_plan_reports_the_compute_buffer(run):
    """ggml_gallocr's compute buffer for the program's graph, next to the sum of its intermediates."""
    prog = "h = mul_mat(w, x)\nr = relu(h)\nmul_mat(w, r)"
    args = (prog, "--tensor", "w=f32[64,64]", "--tensor", "x=f32[64,8]", "--threads", "2")
    doc = json.loads(ok(run("plan", *args, "--json")))
    assert (doc["compute_buffer_size"], doc["intermediates_size"]) == (4096, 3 * 2048)  # relu in place of h
    lines = ok(run("plan", *args)).splitlines()
    assert "compute_buffer_size = 4096 (0.00 MiB; ggml_gallocr's buffer for 3 intermediate tensors of 6144 bytes "\
           "in all)" in lines
    assert lines.index(next(ln for ln in lines if ln.startswith("mem_size "))) < len(lines) - 2


def test_plan_keeps_the_named_outputs(run):
    """--output names tensors the program keeps: the allocator never reuses their memory."""
    prog = "h = mul_mat(w, x)\nr = relu(h)\ny = mul_mat(w, r)"
    args = (prog, "--tensor", "w=f32[64,64]", "--tensor", "x=f32[64,8]", "--json")
    kept = json.loads(ok(run("plan", *args, "--output", "h", "--output", "y")))
    assert kept["compute_buffer_size"] == 6144   # h is an output: relu gets memory of its own


def test_plan_of_a_terabyte_allocates_nothing(run):
    """plan lays the context out without memory behind it: a 10^12-byte shape, and llama.gg's
    10^12-byte causal mask (500000 tokens), plan with GGML's numbers instead of running out of
    memory (as a pool holding every byte of the intermediates would)."""
    doc = json.loads(ok(run("plan", "abs(a)", "--tensor", "a=f32[1000000,250000]", "--json", "--threads", "1")))
    assert doc["compute_buffer_size"] == 10**12 and 2 * 10**12 < doc["mem_size"] < 2 * 10**12 + 10**6
    doc = json.loads(ok(run("plan", "-f", ROOT / "ggtool" / "programs" / "llama.gg", "--gguf", STORIES,
                            "--tensor", "tokens=i32[500000]", "--json", "--threads", "1")))
    assert doc["mem_size"] > 4 * 500000**2


def test_measuring_context_counts_what_a_real_one_lays_out():
    """Context(measure=True): the same objects at the same offsets, with no bytes behind them."""
    prog = 'x = input("x", f32, 64, 8)\nh = mul_mat(w, x)\nm = causal_mask(8)\np = arange_i32(8)\ny = relu(h)'
    env = Inputs([parse_named_source("w=f32[64,64]"), parse_named_source("x=f32[64,8]")], read_data=False)
    real, measured = Context(), Context(measure=True)
    a, b = build(parse(prog), real, env), build(parse(prog), measured, env)
    assert measured.objects == real.objects and measured.ggml_mem_size == real.ggml_mem_size
    assert len(measured.buffer) == 0 and not any(t.has_data for t in measured.tensors)
    assert make_plan(b.graph, 2).mem_size(b.graph) == make_plan(a.graph, 2).mem_size(a.graph)


def test_a_huge_graph_size_costs_no_memory_up_front(run):
    """--graph-size 10^8: the visited hash set held a list of its 2 * 10^8 slots (2.1 GB before the
    graph had a node); it holds the occupied slots only, and the plan is GGML's."""
    import tracemalloc

    tracemalloc.start()
    try:
        doc = json.loads(ok(run("plan", "abs(a)", "--tensor", "a=f32[4]", "--graph-size", 10**8, "--json")))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20, peak
    assert len(doc["nodes"]) == 1 and doc["mem_size"] > 10**8   # GGML's graph object is still counted
