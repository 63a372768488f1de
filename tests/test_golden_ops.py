"""Every op case of tests/golden/ops.json, replayed and compared with what GGML produced:
tensor records, node/leaf order, the plan, and the computed result (bit-exact where the golden
README says GGML's own result is exact, NMSE otherwise), computed in process and with the
(ith, nth) split on real threads."""

import numpy as np
import pytest
from kernel_threads import compute_threaded, thread_writes
from replay import Replay, load_json, load_npz, nmse

import ggtool

OPS = load_json("ops.json")
CASES = OPS["cases"]
NPZ = load_npz("ops.npz")

# results the golden README lists as exact in practice (data movement, exactly rounded float32 math)
EXACT = {"add", "sub", "mul", "div", "scale", "sqr", "sqrt", "neg", "abs", "relu", "clamp", "repeat",
         "concat", "get_rows", "cont", "reshape", "cpy", "diag_mask_inf", "argmax"}


def tolerance(ops) -> float:
    """0 for exact results; 5e-4 NMSE when a mul_mat is involved; 1e-7 otherwise."""
    ops = set(ops)
    if "mul_mat" in ops:
        return 5e-4
    return 0.0 if ops <= EXACT else 1e-7


def assert_result(got: np.ndarray, ref: np.ndarray, tol: float, what: str) -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype, what
    if got.dtype == np.float16:  # exact bits
        assert np.array_equal(got.view(np.uint16), ref.view(np.uint16)), what
    elif got.dtype != np.float32 or tol == 0:
        assert np.array_equal(got.view(np.uint8), ref.view(np.uint8)), what
    else:
        err = nmse(got, ref)
        assert err <= tol, f"{what}: nmse {err:.3g} > {tol:g}"


def build(case):
    r = Replay(case["steps"], NPZ)
    graph = ggtool.Graph(r.ctx)
    graph.expand(r.ids[case["output"]])
    return r, graph


def check_result(r, case, what):
    out = r.ids[case["output"]]
    assert_result(np.array(out.data), NPZ[case["result"]["key"]], tolerance([case["op"]]), f"{case['name']} {what}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_records_order_and_plan(case):
    r, graph = build(case)
    assert [r.id_of(t) for t in graph.nodes] == case["graph_nodes"]
    assert [r.id_of(t) for t in graph.leafs] == case["graph_leafs"]
    plan = ggtool.make_plan(graph, case["n_threads"])
    assert {"n_threads": plan.n_threads, "work_size": plan.work_size} == case["plan"]
    for tid, want in case["tensors"].items():
        got = r.record(r.ids[tid])
        assert got == {k: want[k] for k in got}, tid
        assert set(want) <= set(got), f"{tid}: record fields {set(want) - set(got)} not compared"


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_result_in_process(case, n_threads):
    r, graph = build(case)
    ggtool.graph_compute(graph, n_threads)
    check_result(r, case, f"compute({n_threads})")


@pytest.mark.parametrize("nth", [2, 3])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_result_on_threads(case, nth):
    """GGML's worker loop with nth threads (forced, so single-task ops are split too)."""
    r, graph = build(case)
    compute_threaded(graph, nth, force=True)
    check_result(r, case, f"{nth} threads")


@pytest.mark.parametrize("nth", [2, 3, 5])
@pytest.mark.parametrize("case", [c for c in CASES if c["op"] not in ("clamp", "diag_mask_inf")],
                         ids=lambda c: c["name"])
def test_every_element_written_by_exactly_one_thread(case, nth):
    """Each thread's slice, run alone on a poisoned output: together they cover it once.
    (clamp writes into its input; diag_mask_inf's thread 0 copies everything before masking.)"""
    _, graph = build(case)
    plan = ggtool.make_plan(graph, nth)
    for i, node in enumerate(graph.nodes):
        if node.op in ("NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"):
            continue
        count = thread_writes(i, node, nth, plan.work_size)
        assert count.min() == 1 and count.max() == 1, f"{node.op_desc}: writes per element {np.unique(count)}"


def test_tolerance_classes_cover_every_case():
    ops = {c["op"] for c in CASES}
    assert ops - EXACT == {"log", "gelu", "silu", "tanh", "exp", "sum", "sum_rows", "mean", "norm", "rms_norm",
                           "mul_mat", "soft_max", "soft_max_ext", "rope"}


def test_results_can_fail():
    """The comparison catches a one-ulp change, a wrong element and a shape change."""
    ref = NPZ["scale.result"]
    bumped = ref.copy()
    bumped.view(np.uint32)[0, 0, 0, 0] += 1
    with pytest.raises(AssertionError):
        assert_result(bumped, ref, 0.0, "bit")
    wrong = ref.copy()
    wrong[0, 0, 0, 0] += 1
    with pytest.raises(AssertionError):
        assert_result(wrong, ref, 1e-7, "nmse")
    with pytest.raises(AssertionError):
        assert_result(ref.reshape(1, 1, -1, 4), ref, 0.0, "shape")
