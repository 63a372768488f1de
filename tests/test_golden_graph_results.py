"""The computed outputs of every graph in graphs.json against what GGML computed (graphs.npz),
in process and with GGML's thread split on real threads."""

import numpy as np
import pytest
from kernel_threads import compute_threaded
from replay import Replay, load_json, load_npz
from test_golden_ops import assert_result, tolerance

import ggtool

GRAPHS = load_json("graphs.json")["graphs"]
NPZ = load_npz("graphs.npz")


def graph_ops(graph) -> set[str]:
    """DSL names of the ops a graph computes (views and leaves move no data)."""
    skip = {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}
    return {t.op_desc.lower() if t.op == "UNARY" else t.op.lower() for t in graph.nodes if t.op not in skip}


def check(r, g, what):
    tol = tolerance(graph_ops(r.graph))
    for tid, res in g["compute"]["results"].items():
        assert_result(np.array(r.ids[tid].data), NPZ[res["key"]], tol, f"{g['name']}.{tid} {what}")


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("g", GRAPHS, ids=lambda g: g["name"])
def test_graph_results_in_process(g, n_threads):
    r = Replay(g["steps"], NPZ)
    ggtool.graph_compute(r.graph, n_threads)
    check(r, g, f"compute({n_threads})")


@pytest.mark.parametrize("nth", [2, 3, 4])
@pytest.mark.parametrize("g", GRAPHS, ids=lambda g: g["name"])
def test_graph_results_on_threads(g, nth):
    r = Replay(g["steps"], NPZ)
    compute_threaded(r.graph, nth)
    check(r, g, f"{nth} threads")


def test_tolerances_follow_the_ops():
    by_name = {g["name"]: g for g in GRAPHS}
    exact = {"simple_ctx": 5e-4, "views_permute_cont": 0.0, "two_outputs": 1e-7, "q4_0_mlp": 5e-4,
             "param_view_two_expands": 0.0, "embed_rope": 1e-7}
    for name, tol in exact.items():
        r = Replay(by_name[name]["steps"], NPZ)
        assert tolerance(graph_ops(r.graph)) == tol, name
