"""The worker pool: same results with 1-4 participants, clean failures, nothing left behind.

Test kernels live at module level here: the pool ships a kernel to its workers by reference, so a
worker imports this module (as `test_pool`, the tests folder being on the shared sys.path) to run
them. They are registered in the caller only for the duration of a test (fixture `registered_test_kernels`).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
from kernel_threads import compute_threaded
from replay import Replay, load_json, load_npz, nmse

import ggtool
from ggtool import types as T
from ggtool.errors import ComputeError, GGToolError
from ggtool.interrupts import signals_held
from ggtool.ops import FUNCTIONS, KERNELS, Kernel
from ggtool.ops.base import ALL, new_op
from ggtool.pool import WorkerPool, get_pool, shm
from ggtool.pool.placement import placement, spread, wake_on
from ggtool.threads import default_threads

TESTS = Path(__file__).resolve().parent
OPS = load_json("ops.json")["cases"]
GRAPHS = load_json("graphs.json")["graphs"]
TOLERANCE = {"MUL_MAT": 5e-4}


# -- test kernels (shipped to the workers by reference) --------------------------------------------
def fail_kernel(node, ith, nth, work):
    """Copies src0; participant op_params[0] raises."""
    src = node.src[0].data
    r = np.arange(node.nrows)[ith::nth]
    node.data.reshape(-1, node.ne[0])[r] = src.reshape(-1, node.ne[0])[r]
    if ith == node.op_params[0]:
        raise ValueError(f"boom in participant {ith}")


def sleep_kernel(node, ith, nth, work):
    """Participants >= op_params[0] sleep op_params[1] ms, in small steps."""
    if ith >= node.op_params[0]:
        end = time.monotonic() + node.op_params[1] / 1000
        while time.monotonic() < end:
            time.sleep(0.005)


def sleep_data_kernel(node, ith, nth, work):
    """Participants >= op_params[0] sleep as many ms as src0's first value says (the graph stays the
    same from one compute to the next: only its data changes), in small steps; copies src0."""
    if ith >= node.op_params[0]:
        end = time.monotonic() + float(node.src[0].data.reshape(-1)[0]) / 1000
        while time.monotonic() < end:
            time.sleep(0.005)
    if ith == 0:
        node.data[...] = node.src[0].data


def affinity_kernel(node, ith, nth, work):
    """Row ith of the output: how many CPUs participant ith may run on, and the lowest of them."""
    cpus = os.sched_getaffinity(0)
    node.data.reshape(-1, node.ne[0])[ith, :2] = (len(cpus), min(cpus))


def register_test_kernels() -> list[str]:
    new = {"TEST_POOL_FAIL": fail_kernel, "TEST_POOL_SLEEP": sleep_kernel, "TEST_POOL_SLEEP_DATA": sleep_data_kernel,
           "TEST_POOL_AFFINITY": affinity_kernel}
    for op, fn in new.items():
        KERNELS[op] = Kernel(op, fn, ALL, None)
    return list(new)


@pytest.fixture
def registered_test_kernels():
    ops = register_test_kernels()
    yield
    for op in ops:
        KERNELS.pop(op, None)


def custom(ctx, op, a, *params):
    return new_op(ctx, op, a.type, a.ne, (a,), params=params)


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pool():
    with WorkerPool(4) as p:
        yield p


def segments_of(pid: int) -> set[str]:
    return {n for n in shm.list_segments() if n.startswith(f"{shm.PREFIX}{pid}_")}


@pytest.fixture
def shm_clean():
    """Asserts that the test leaves no new segment of this process in /dev/shm."""
    before = segments_of(os.getpid())
    yield
    gc.collect()   # contexts are reference cycles (ctx <-> tensors): collect the dead ones
    assert segments_of(os.getpid()) - before == set()


def chain(ctx, n: int, width: int = 16, rows: int = 1):
    x = ctx.new_tensor("f32", [width, rows])
    b = ctx.new_tensor("f32", [width, rows])
    x.data[...] = np.arange(width * rows, dtype=np.float32).reshape(x.data.shape)
    b.data[...] = 0.5
    y = x
    for _ in range(n):
        y = FUNCTIONS["add"](ctx, y, b)
    g = ggtool.Graph(ctx, max(2048, 2 * n))
    g.expand(y)
    return g, y


# -- correctness: golden ops and graphs with 1..4 participants ------------------------------------
def _replay_op(case, nth, pool=None, serial=False):
    """The case's output after computing with nth participants: on the pool, or `serial`: the same
    (ith, nth) kernel calls made by threads of this process (what the pool must reproduce exactly)."""
    r = Replay(case["steps"], load_npz("ops.npz"))
    out = r.ids[case["output"]]
    g = ggtool.Graph(r.ctx)
    g.expand(out)
    if serial:
        compute_threaded(g, nth)
    else:
        ggtool.graph_compute(g, nth, pool=pool)
    return out.data.copy(), out


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("nth", [2, 3, 4])
@pytest.mark.parametrize("case", OPS, ids=lambda c: c["name"])
def test_golden_op_same_with_n_participants(case, nth, pool):
    one, out = _replay_op(case, 1)
    many, _ = _replay_op(case, nth, pool)
    # the pool adds nothing: exactly what the kernels' (ith, nth) calls give in threads of one process
    # (so that a failure below is the kernel's split, not the pool)
    assert _same_bits(many, _replay_op(case, nth, serial=True)[0])
    if out.type == T.F32:
        ref = load_npz("ops.npz")[case["result"]["key"]]
        assert nmse(many.reshape(ref.shape), ref) <= TOLERANCE.get(out.op, 1e-7)
    # GGML's split never changes the arithmetic (mul_mat included): bit for bit the one-process result
    assert _same_bits(many, one), f"{case['name']}: {nth} participants differ from 1"


@pytest.mark.parametrize("nth", [2, 3, 4])
@pytest.mark.parametrize("gcase", GRAPHS, ids=lambda g: g["name"])
def test_golden_graph_same_with_n_participants(gcase, nth, pool):
    results = {}
    for n, p in ((1, None), (nth, pool)):
        r = Replay(gcase["steps"], load_npz("graphs.npz"))
        ggtool.graph_compute(r.graph, n, pool=p)
        results[n] = {tid: r.ids[tid].data.copy() for tid in gcase["compute"]["results"]}
    npz = load_npz("graphs.npz")
    for tid, meta in gcase["compute"]["results"].items():
        if meta["type"] == "f32":
            ref = npz[meta["key"]]
            assert nmse(results[nth][tid].reshape(ref.shape), ref) <= 5e-4
        assert _same_bits(results[nth][tid], results[1][tid]), f"{gcase['name']}.{tid}"


def test_long_chain_bitwise_and_cached(pool):
    ctx = ggtool.Context()
    g, y = chain(ctx, 300, width=40, rows=7)
    plan = ggtool.graph_compute(g, 1)
    want = y.numpy()
    for nth in (2, 3, 4):
        y.data[...] = 0
        p = ggtool.graph_compute(g, nth, pool=pool)
        assert np.array_equal(y.numpy(), want)
        sent = pool.stats["graphs_sent"]
        ggtool.graph_compute(g, nth, pool=pool, plan=p)
        assert pool.stats["graphs_sent"] == sent  # the same graph again: only "run #k"
    assert plan.n_threads == 1


def test_progress_follows_participant_0(pool):
    from ggtool.compute import Progress

    ctx = ggtool.Context()
    g, y = chain(ctx, 50)
    for nth, p in ((1, None), (2, pool)):
        progress = Progress()
        ggtool.graph_compute(g, nth, pool=p, progress=progress)
        assert progress.node == g.n_nodes - 1


def test_plan_of_one_runs_in_process(pool):
    ctx = ggtool.Context()
    a = ctx.new_tensor("f32", [8, 3])
    a.data[...] = 2
    out = FUNCTIONS["sub"](ctx, a, a)  # SUB has n_tasks 1: the plan has one thread
    g = ggtool.Graph(ctx)
    g.expand(out)
    runs = pool.stats["runs"]
    plan = ggtool.graph_compute(g, 4, pool=pool)
    assert plan.n_threads == 1 and pool.stats["runs"] == runs
    assert np.all(out.numpy() == 0)


def test_changed_node_is_sent_again(pool):
    """A node mutated between computes (op_params here) is picked up: the cache never lies."""
    ctx = ggtool.Context()
    a = ctx.new_tensor("f32", [16, 8])
    a.data[...] = 1
    s = FUNCTIONS["scale"](ctx, FUNCTIONS["add"](ctx, a, a), 3.0)
    g = ggtool.Graph(ctx)
    g.expand(s)
    plan = ggtool.graph_compute(g, 2, pool=pool)
    assert np.all(s.numpy() == 6)
    s.set_params(5.0)
    ggtool.graph_compute(g, 2, pool=pool, plan=plan)
    assert np.all(s.numpy() == 10)


def test_frozen_graph_is_described_once_per_plan(pool):
    """A frozen graph (a generation step's) computed again with new input values is not described
    again, and its results stay the in-process ones; when its context grows into a new segment, or
    another plan computes it, it is described again."""
    ctx = ggtool.Context()
    g, y = chain(ctx, 40, width=40, rows=7)
    x = g.leafs[0]
    pool.freeze(g)
    plan = None
    for step in range(4):
        x.data[...] = step
        plan = ggtool.graph_compute(g, 2, pool=pool, plan=plan)
        got = y.numpy().copy()
        ggtool.graph_compute(g, 1)
        assert np.array_equal(got, y.numpy()), step
        if step == 0:
            described = pool.stats["described"]
    assert pool.stats["described"] == described
    ctx.new_tensor("f32", [1 << 20])               # the context outgrows its segment
    x.data[...] = 9
    ggtool.graph_compute(g, 2, pool=pool, plan=plan)
    got = y.numpy().copy()
    assert pool.stats["described"] == described + 1
    ggtool.graph_compute(g, 1)
    assert np.array_equal(got, y.numpy())
    ggtool.graph_compute(g, 2, pool=pool)           # a new plan
    assert pool.stats["described"] == described + 2


def test_frozen_graph_placed_anew_is_described_again(pool):
    """A compute that places the frozen graph's nodes anew (another alloc mode, other outputs:
    their data offsets move) describes it again: the workers must not write where the nodes were."""
    ctx = ggtool.Context()
    g, y = chain(ctx, 10, width=40, rows=7)
    x = g.leafs[0]
    pool.freeze(g)
    plan = ggtool.graph_compute(g, 2, pool=pool, alloc="graph", outputs=[y])
    for step, alloc in enumerate(("context", "graph")):
        x.data[...] = step + 3
        ggtool.graph_compute(g, 2, pool=pool, plan=plan, alloc=alloc, outputs=[y])
        got = y.numpy().copy()
        ggtool.graph_compute(g, 1, alloc=alloc, outputs=[y])
        assert np.array_equal(got, y.numpy()), alloc


def test_file_storage_and_second_context(pool, tmp_path):
    """Memory-mapped tensors are read by each worker from the file; weights in another context."""
    from ggtool.gguf_io import FileStorage

    vals = np.arange(64 * 6, dtype=np.float32).reshape(6, 64)
    path = tmp_path / "w.bin"
    path.write_bytes(b"\0" * 32 + vals.tobytes())
    wctx = ggtool.Context()
    w = wctx.new_tensor("f32", [64, 6], storage=FileStorage(path), data_offset=32)
    bias = wctx.new_tensor("f32", [64, 6])
    bias.data[...] = 0.25
    ctx = ggtool.Context()
    x = ctx.new_tensor("f32", [64, 6])
    x.data[...] = 1
    out = FUNCTIONS["add"](ctx, FUNCTIONS["add"](ctx, x, w), bias)
    g = ggtool.Graph(ctx)
    g.expand(out)
    ggtool.graph_compute(g, 3, pool=pool)
    assert np.array_equal(out.numpy()[0, 0], vals + 1.25)


def test_segment_fill():
    """Moving a context into shared memory: zero chunks (results not computed yet) are skipped,
    the rest copied exactly, whatever the alignment of the last chunk."""
    data = np.zeros((16 << 20) + 3, np.uint8)                # 16 chunks of 1 MiB and a 3-byte tail
    data[(4 << 20) + 5] = 1
    data[-3:] = 9
    seg = shm.Segment(len(data))
    try:
        seg.fill(data, chunk=1 << 20)
        assert np.array_equal(seg.array[: len(data)], data)
    finally:
        seg.unlink()


def test_context_that_grows_moves_again(pool, shm_clean):
    ctx = ggtool.Context()
    g, y = chain(ctx, 3)
    ggtool.graph_compute(g, 2, pool=pool)
    first = ctx.buffer
    big = ctx.new_tensor("f32", [1 << 20])  # grows the pool out of its segment
    assert ctx.buffer is not first
    big.data[...] = 1
    out = FUNCTIONS["add"](ctx, big, big)
    g2 = ggtool.Graph(ctx)
    g2.expand(out)
    ggtool.graph_compute(g2, 2, pool=pool)
    assert np.all(out.numpy() == 2)
    del ctx, g, y, g2, out, big, first


def test_segment_fill_copies_only_the_ranges_given():
    """Only the given ranges are written (and their pages allocated): what lies outside them stays
    zero in the segment, whatever the source holds there; ranges need not be page-aligned."""
    page = shm.PAGE
    data = np.arange(64 * page, dtype=np.uint64).view(np.uint8)[: 64 * page].copy() | 1   # no zero byte
    ranges = [(3, page + 5), (10 * page, 10 * page + 1), (20 * page + 7, 40 * page)]
    seg = shm.Segment(len(data))
    try:
        seg.fill(data, ranges, chunk=4096 * 3)
        # allocated: the pages the ranges touch (2 + 1 + 20), not the 64 of the whole (checked
        # first: reading a page of shared memory allocates it)
        assert 23 * page <= _allocated(seg) <= 24 * page
        want = np.zeros_like(data)
        for a, b in ranges:
            want[a:b] = data[a:b]
        assert np.array_equal(seg.array[: len(data)], want)
    finally:
        seg.unlink()


def _add_chain(ctx, n: int, width: int):
    """x + b + b + ...: n nodes of `width` floats each; with the graph allocator they all compute in
    one block (ADD in place), in context mode each has memory of its own."""
    x = ctx.new_tensor_from(np.arange(width, dtype=np.float32), name="x")
    b = ctx.new_tensor_from(np.full(width, 0.5, np.float32), name="b")
    y = x
    for _ in range(n):
        y = FUNCTIONS["add"](ctx, y, b)
    return ggtool.Graph(ctx).expand(y), y


def _allocated(seg) -> int:
    """Bytes of shared memory the segment holds (tmpfs counts the pages it allocated)."""
    return os.stat(f"/dev/shm/{seg.name}").st_blocks * 512


@pytest.mark.parametrize("alloc", ["graph", "context"])
def test_pool_moves_only_what_tensors_read_into_shared_memory(pool, shm_clean, alloc):
    """With the graph allocator, the nodes' own memory in the context (never used) does not go into
    the shared segment: the segment holds the inputs and the compute buffer, not a page per node.
    In context mode the nodes compute in their own memory, so that goes in. Same results."""
    from ggtool.pool.segments import share_context

    n, width = 12, 1 << 18                        # 12 nodes of 1 MiB; leafs 2 MiB
    want = np.arange(width, dtype=np.float32) + 0.5 * n
    ctx = ggtool.Context()
    g, y = _add_chain(ctx, n, width)
    ggtool.graph_compute(g, 2, pool=pool, alloc=alloc, outputs=[y])
    seg = share_context(ctx)                      # the segment the compute used
    assert ctx.buffer is seg.array
    mib = 1 << 20
    allocated = _allocated(seg)                   # before reading anything (a read allocates a page)
    assert np.array_equal(y.numpy().reshape(-1), want)
    if alloc == "graph":
        assert g.compute_buffer[1] == mib         # one block, every ADD in place
        assert allocated < 3 * mib + (1 << 17) < ctx.used_mem // 4
    else:
        assert allocated >= (n + 2) * mib
    from ggtool.pool.segments import shared_ranges

    moved = sum(b - a for a, b in shared_ranges(ctx))
    assert moved < 3 * mib + (1 << 17) if alloc == "graph" else moved >= (n + 2) * mib
    del ctx, g, y, seg


def test_shared_ranges_follow_the_binding():
    """What moves is what tensors point at now: a bound node's own memory is left out, the compute
    and work buffers are in; unbound, the nodes' own memory is in again. Headers never."""
    from ggtool.compute import bind, prepare, unbind
    from ggtool.pool.segments import shared_ranges

    page = shm.PAGE
    ctx = ggtool.Context()
    g, y = _add_chain(ctx, 4, 1 << 16)             # 256 KiB a tensor
    prepare(g, 2, alloc="context")

    def covered(t) -> bool:
        return any(a <= t.data_offset and t.data_offset + t.nbytes <= b for a, b in shared_ranges(ctx))

    def inside(off: int, size: int) -> bool:
        return any(a <= off and off + size <= b for a, b in shared_ranges(ctx))

    own = {id(t): t.data_offset for t in g.nodes}
    assert all(covered(t) for t in [*g.leafs, *g.nodes])
    bind(g, [y])
    off, size = g.compute_buffer
    assert inside(off, size) and all(covered(t) for t in [*g.leafs, *g.nodes])
    for t in g.nodes:                              # their own memory: no range reaches into it
        start = own[id(t)] // page * page + page
        assert not inside(start, page), t.name
    unbind(g)
    assert all(covered(t) for t in g.nodes)
    ranges = shared_ranges(ctx)
    assert ranges == sorted(ranges) and all(a % page == 0 and a < b for a, b in ranges)
    assert all(r1[1] < r2[0] for r1, r2 in zip(ranges, ranges[1:]))
    # with no gap allowed, the header of x (before its data, a page of its own here) is left out
    x = g.leafs[0]
    assert not any(a <= x.struct_offset < b for a, b in shared_ranges(ctx, gap=0) if x.struct_offset // page
                   != x.data_offset // page)


def test_stale_own_memory_is_not_moved_and_not_needed(pool, shm_clean):
    """A context computed in context mode in this process, then with the graph allocator on the
    pool: the nodes' earlier results in their own memory stay behind (they are not read); computing
    in context mode again on the pool recomputes them there. Every result as in one process."""
    n, width = 6, 1 << 16
    want = np.arange(width, dtype=np.float32) + 0.5 * n
    ctx = ggtool.Context()
    g, y = _add_chain(ctx, n, width)
    ggtool.graph_compute(g, 1)
    first = g.nodes[0]
    assert np.array_equal(first.numpy().reshape(-1), np.arange(width, dtype=np.float32) + 0.5)
    ggtool.graph_compute(g, 2, pool=pool, alloc="graph", outputs=[y])
    assert np.array_equal(y.numpy().reshape(-1), want)
    from ggtool.compute import unbind
    unbind(g)
    assert not first.data.reshape(-1)[width // 4:].any()   # its own memory was not moved (but for the
    #                                                  page it shares with b): zero in the segment
    ggtool.graph_compute(g, 2, pool=pool, alloc="context")
    assert np.array_equal(y.numpy().reshape(-1), want)
    assert np.array_equal(first.numpy().reshape(-1), np.arange(width, dtype=np.float32) + 0.5)
    del ctx, g, y, first


# -- failures ------------------------------------------------------------------------------------
@pytest.mark.parametrize("failing", [0, 2])
def test_kernel_error_names_node_and_pool_survives(pool, registered_test_kernels, failing):
    ctx = ggtool.Context()
    a = ctx.new_tensor("f32", [16, 8])
    a.data[...] = 1
    h = FUNCTIONS["add"](ctx, a, a)
    bad = custom(ctx, "TEST_POOL_FAIL", h, failing).set_name("the_bad_one")
    out = FUNCTIONS["add"](ctx, bad, a)
    g = ggtool.Graph(ctx)
    g.expand(out)
    pids = pool.pids
    with pytest.raises(ComputeError) as e:
        ggtool.graph_compute(g, 4, pool=pool)
    assert str(e.value) == f"node 1 'the_bad_one' (TEST_POOL_FAIL) failed: ValueError: boom in participant {failing}"
    assert pool.pids == pids  # the same workers, still usable
    g2, y = chain(ggtool.Context(), 5)
    ggtool.graph_compute(g2, 4, pool=pool)
    assert np.all(y.numpy()[0, 0, 0] == np.arange(16) + 2.5)


def test_kernel_workers_cannot_import_is_a_clear_error(pool):
    """A kernel the workers cannot import (a lambda, a function of __main__) fails cleanly."""
    KERNELS["TEST_POOL_LOCAL"] = Kernel("TEST_POOL_LOCAL", lambda node, ith, nth, work: None, ALL, None)
    try:
        ctx = ggtool.Context()
        a = ctx.new_tensor("f32", [16, 8])
        g = ggtool.Graph(ctx)
        g.expand(custom(ctx, "TEST_POOL_LOCAL", a))
        with pytest.raises(ComputeError, match=r"worker 1 \(pid \d+\) could not run the graph: the kernel of op "
                                               r"TEST_POOL_LOCAL \(test_pool\..*<lambda>\) is not registered in the worker"):
            ggtool.graph_compute(g, 2, pool=pool)
        g2, y = chain(ggtool.Context(), 2)
        ggtool.graph_compute(g2, 2, pool=pool)  # the pool is fine afterwards
        assert np.all(y.numpy()[0, 0, 0] == np.arange(16) + 1)
    finally:
        KERNELS.pop("TEST_POOL_LOCAL")


def _wait_dead(pid: int, timeout: float = 10.0) -> None:
    """Until the killed child has exited, every thread of it (waitid without reaping it: the pool
    reaps it). A fixed sleep is not enough on a loaded machine, and /proc's Z comes too early for a
    process with threads (its leader shows Z while the others still exit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} still runs {timeout} s after SIGKILL")


def test_worker_killed_between_graphs_is_replaced(shm_clean):
    with WorkerPool(2) as p:
        g, y = chain(ggtool.Context(), 4)
        ggtool.graph_compute(g, 2, pool=p)
        (pid,) = p.pids
        os.kill(pid, signal.SIGKILL)
        _wait_dead(pid)      # dead before the next graph, however loaded the machine
        y.data[...] = 0
        ggtool.graph_compute(g, 2, pool=p)  # rebuilt transparently
        assert p.pids != [pid] and np.all(y.numpy()[0, 0, 0] == np.arange(16) + 2)


def _proc_state(pid: int) -> str:
    """R (running or runnable), S (asleep), ... as /proc/PID/stat says."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _asleep_within(pid: int, seconds: float) -> bool:
    """Whether the process is asleep (S) at some point within `seconds` (however loaded the machine)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _proc_state(pid) == "S":
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def lingering(monkeypatch):
    """Computes on the compiled runner, every participant taken to have a core (the barrier's long
    spin), and workers that spin `LINGER_NS` (set by the test) for the next message."""
    from ggtool import compute, runner
    from ggtool.pool import barrier, caller

    monkeypatch.setattr(runner, "WORTH_NUMBA", 0)
    monkeypatch.setattr(compute, "COMPILED", True)
    monkeypatch.setattr(caller, "spin_ns", lambda nth: barrier.SPIN_FREE_NS)
    return lambda ns: monkeypatch.setattr(barrier, "LINGER_NS", ns)


def test_a_worker_spins_for_the_next_compute_then_sleeps(lingering, monkeypatch, shm_clean):
    """After a compute on the compiled runner where every participant has a core, a worker spins for
    the caller's next message (wire.rung) before it sleeps on its bell, as GGML's threads poll for the
    next graph: running just after the compute, asleep once Run.linger_ns is over, and not spinning
    at all where the machine is oversubscribed (asleep long before a linger of 30 s would end). Its
    line counts the caller's messages and its answers."""
    from ggtool.pool import barrier, caller, wire

    lingering(300_000_000)
    with WorkerPool(2) as p:
        g, y = chain(ggtool.Context(), 4)
        ggtool.graph_compute(g, 2, pool=p)
        ggtool.graph_compute(g, 2, pool=p)
        (w,) = p._state.workers
        assert _proc_state(w.pid) == "R"
        # two Runs sent, counted by the caller after each; two answered, counted by the worker just
        # before each is sent (the second compute was sent: an unfrozen graph's plan is made anew)
        deadline = time.monotonic() + 5.0
        while w.answered() < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert (w.ctl[wire.rung(1)], w.answered()) == (2, 2)
        assert _asleep_within(w.pid, 5.0)
        lingering(30_000_000_000)
        monkeypatch.setattr(caller, "spin_ns", lambda nth: barrier.SPIN_BUSY_NS)
        ggtool.graph_compute(g, 2, pool=p)
        assert _asleep_within(w.pid, 5.0) and np.all(y.numpy()[0, 0, 0] == np.arange(16) + 2)


def test_a_worker_spinning_for_the_next_compute_hears_exit_and_death_is_noticed(lingering, shm_clean):
    """A worker spinning for the next message takes the pool's Exit (rung moves: a graceful close,
    no kill after the 2 s grace, where its 10 s linger would outlast it); one killed while it spins
    is replaced at the next compute."""
    lingering(10_000_000_000)
    with WorkerPool(2) as p:
        g, y = chain(ggtool.Context(), 4)
        ggtool.graph_compute(g, 2, pool=p)
        (pid,) = p.pids
        os.kill(pid, signal.SIGKILL)
        _wait_dead(pid)
        y.data[...] = 0
        ggtool.graph_compute(g, 2, pool=p)
        assert p.pids != [pid] and np.all(y.numpy()[0, 0, 0] == np.arange(16) + 2)
        (w,) = p._state.workers
        assert _proc_state(w.pid) == "R"
        p.close()            # Exit heard within the close's 2 s grace: the worker exits 0, not killed
        assert w.proc.poll() == 0


def _frozen_chain(pool, n: int = 4, nth: int = 3):
    """A frozen chain of `n` adds and its plan for `nth` participants on `pool`, computed once (its
    Runs sent)."""
    from ggtool import compute

    g, y = chain(ggtool.Context(), n)
    compute.freeze(g)
    pool.freeze(g)
    return g, y, ggtool.graph_compute(g, nth, pool=pool)


def test_a_listening_worker_is_handed_the_next_compute(lingering, shm_clean):
    """A frozen graph computed again while its workers listen (wire.standby) is handed to them through
    the control segment: no message is sent (each worker's rung stays at the first compute's Run), no
    answer comes on a socket, and the results are those of a compute whose Runs were sent. Each
    handed compute returns once every participant has passed its last barrier; the workers' answers
    are counted before the next use of the pool (WorkerPool._settle)."""
    from ggtool.pool import wire

    lingering(5_000_000_000)
    with WorkerPool(3) as p:
        g, y, plan = _frozen_chain(p)
        for k in range(20):
            y.data[...] = -1
            ggtool.graph_compute(g, 3, pool=p, plan=plan)
            assert np.all(y.numpy()[0, 0, 0] == np.arange(16) + 2), k
            assert p._unsettled is not None and [c for c in p._unsettled[1]] == [k + 1, k + 1], k
        assert p.stats["handed"] == 2 * 20 and p.stats["runs"] == 21
        p._settle()
        assert p._unsettled is None
        for w in p._state.workers:
            assert w.ctl[wire.rung(w.slot)] == 1 and w.answered() == 21 and not w.conn.poll()
        assert p.stats["restarts"] == 0
    from ggtool.kernels import runner as kr
    assert (wire.ASLEEP, wire.LISTENING, wire.CLAIMED) == (kr.ASLEEP, kr.LISTENING, kr.CLAIMED)


def test_a_worker_with_something_to_drop_is_sent_a_run(lingering, shm_clean):
    """A compute is handed only to a worker with nothing to drop: once another graph's context is
    gone (its segment unlinked), the next compute of a handed graph is sent, its Run naming the
    segment and the graph to drop (the worker frees their memory), and the one after is handed again."""
    lingering(5_000_000_000)
    with WorkerPool(2) as p:
        g, y, plan = _frozen_chain(p, nth=2)
        ggtool.graph_compute(g, 2, pool=p, plan=plan)
        other = chain(ggtool.Context(), 2)[0]
        ggtool.graph_compute(other, 2, pool=p)
        (w,) = p._state.workers
        held = set(w.segs)
        del other
        gc.collect()
        assert not held <= set(shm.list_segments())     # the other graph's segment is gone
        handed = p.stats["handed"]
        ggtool.graph_compute(g, 2, pool=p, plan=plan)
        assert p.stats["handed"] == handed and set(w.segs) < held
        ggtool.graph_compute(g, 2, pool=p, plan=plan)
        assert p.stats["handed"] == handed + 1 and np.all(y.numpy()[0, 0, 0] == np.arange(16) + 2)


def test_a_handed_compute_that_fails_says_what_a_sent_one_says(lingering, registered_test_kernels, shm_clean):
    """A kernel that fails in a handed compute gives the ComputeError a sent compute gives (the worker's
    Failed comes on its socket: wire.outcome ON_SOCKET), and the pool hands the next compute again."""
    lingering(5_000_000_000)
    with WorkerPool(2) as p:
        ctx = ggtool.Context()
        a = ctx.new_tensor("f32", [16, 4])
        a.data[...] = 1
        bad = custom(ctx, "TEST_POOL_FAIL", a, 1).set_name("bad")
        g, y, plan = _frozen_chain(p, nth=2)
        gb = ggtool.Graph(ctx)
        gb.expand(bad)
        from ggtool import compute
        compute.freeze(gb)
        p.freeze(gb)
        plan_b = ggtool.make_plan(gb, 2)
        messages = []
        for _ in range(3):
            with pytest.raises(ComputeError) as e:
                ggtool.graph_compute(gb, 2, pool=p, plan=plan_b)
            messages.append(str(e.value))
        assert messages == ["node 0 'bad' (TEST_POOL_FAIL) failed: ValueError: boom in participant 1"] * 3
        assert p.stats["handed"] == 2
        handed = p.stats["handed"]
        ggtool.graph_compute(g, 2, pool=p, plan=plan)
        assert p.stats["handed"] == handed + 1 and np.all(y.numpy()[0, 0, 0] == np.arange(16) + 2)


def test_a_worker_killed_in_a_handed_compute_is_reported_at_once(lingering, registered_test_kernels, shm_clean):
    """A worker SIGKILLed in the middle of a compute handed to it is reported as a sent one's death is
    (the node it was at), within a second; the pool starts afresh at its next compute."""
    import threading

    lingering(5_000_000_000)
    with WorkerPool(3) as p:
        ctx = ggtool.Context()
        ms = ctx.new_tensor("f32", [16])
        ms.data[...] = 0
        out = custom(ctx, "TEST_POOL_SLEEP_DATA", ms, 1).set_name("nap")
        g = ggtool.Graph(ctx)
        g.expand(out)
        from ggtool import compute
        compute.freeze(g)
        p.freeze(g)
        plan = ggtool.graph_compute(g, 3, pool=p)         # sent: the workers listen after it
        ggtool.graph_compute(g, 3, pool=p, plan=plan)     # handed
        assert p.stats["handed"] == 2
        ms.data[...] = 20_000                            # the next compute's workers sleep 20 s
        victim = p.pids[1]
        killed = []

        def kill():
            time.sleep(0.3)
            killed.append(time.monotonic())
            os.kill(victim, signal.SIGKILL)

        threading.Thread(target=kill, daemon=True).start()
        with pytest.raises(ComputeError, match=rf"^worker 2 \(pid {victim}\) died \(killed by SIGKILL\) while "
                                               r"computing node 0 'nap' \(TEST_POOL_SLEEP_DATA\)"):
            ggtool.graph_compute(g, 3, pool=p, plan=plan)
        assert p.stats["handed"] == 4 and time.monotonic() - killed[0] < 1.0
        ms.data[...] = 0
        ggtool.graph_compute(g, 3, pool=p, plan=plan)
        assert p.stats["restarts"] == 1 and victim not in p.pids


def test_a_worker_that_dies_before_its_last_answer_is_counted_restarts_the_pool(lingering, shm_clean):
    """A handed compute returns once all have passed its last barrier, its answers left to count
    (WorkerPool._unsettled). A worker that dies before counting its answer, or after, is found at the
    pool's next use, which starts afresh as after a death between computes: its results are right,
    no compute is reported failed, nothing is left."""
    import threading

    lingering(5_000_000_000)
    with WorkerPool(3) as p:
        g, y, plan = _frozen_chain(p)
        ggtool.graph_compute(g, 3, pool=p, plan=plan)
        assert p._unsettled is not None
        victim = p.pids[0]
        os.kill(victim, signal.SIGKILL)                    # after its answer, most likely: still found
        while p._state.workers[0].proc.poll() is None:     # dead (else the next compute may meet it dying)
            time.sleep(0.01)
        y.data[...] = -1
        ggtool.graph_compute(g, 3, pool=p, plan=plan)
        assert np.all(y.numpy()[0, 0, 0] == np.arange(16) + 2)
        assert p.stats["restarts"] == 1 and victim not in p.pids
        # a count that never moves (as from a worker killed before it counted): _settle waits for it,
        # watching every worker, and starts afresh when one dies
        ggtool.graph_compute(g, 3, pool=p, plan=plan)
        workers, answers = p._unsettled
        p._settle()
        p._unsettled = (workers, [a + 1 for a in answers])
        victim = p.pids[1]
        threading.Timer(0.3, os.kill, (victim, signal.SIGKILL)).start()
        t = time.monotonic()
        y.data[...] = -1
        ggtool.graph_compute(g, 3, pool=p, plan=plan)
        assert 0.3 <= time.monotonic() - t < 1.5
        assert np.all(y.numpy()[0, 0, 0] == np.arange(16) + 2)
        assert p.stats["restarts"] == 2 and victim not in p.pids


def test_a_map_after_a_handed_compute_counts_its_answers_first(lingering, shm_clean):
    """pool.map right after a handed compute: the compute's answers are settled, then the map's
    results come back in order, and the next compute is handed again."""
    lingering(5_000_000_000)
    with WorkerPool(3) as p:
        g, y, plan = _frozen_chain(p)
        ggtool.graph_compute(g, 3, pool=p, plan=plan)
        assert p._unsettled is not None
        assert p.map(abs, range(-6, 0)) == [6, 5, 4, 3, 2, 1]
        assert p._unsettled is None
        handed = p.stats["handed"]
        for _ in range(2):          # sent (the workers slept after the map), then handed
            y.data[...] = -1
            ggtool.graph_compute(g, 3, pool=p, plan=plan)
            assert np.all(y.numpy()[0, 0, 0] == np.arange(16) + 2)
        assert p.stats["handed"] == handed + 2 and p.stats["restarts"] == 0


def test_a_handed_answer_waits_for_the_worker_or_its_death():
    """The caller's wait for a handed compute's answer (caller._await_change) ends when the worker
    counts it, and raises WorkerDied for a worker of the compute dead meanwhile (the one waited for or
    another), looking at the processes between sleeps; an answer counted already is not waited for."""
    import threading

    from ggtool.pool.caller import _await_change
    from ggtool.pool.procs import WorkerDied

    class Proc:
        def __init__(self, code):
            self.code = code

        def poll(self):
            return self.code

    w1, w2 = types.SimpleNamespace(proc=Proc(None)), types.SimpleNamespace(proc=Proc(None))
    mv = memoryview(np.zeros(8, np.int64)).cast("B").cast("q")
    threading.Timer(0.05, lambda: mv.__setitem__(3, 1)).start()
    t = time.monotonic()
    _await_change(mv, 3, 0, [w1, w2])
    assert mv[3] == 1 and 0.03 < time.monotonic() - t < 2.0
    for dead in (w1, w2):
        dead.proc = Proc(-9)
        t = time.monotonic()
        with pytest.raises(WorkerDied) as e:
            _await_change(mv, 3, 1, [w1, w2])
        assert (e.value.ith, e.value.w) == (1 + (dead is w2), dead) and time.monotonic() - t < 1.0
        dead.proc = Proc(None)
    w1.proc = Proc(-9)
    _await_change(mv, 3, 0, [w1, w2])      # counted already: dead or not, nothing to wait for


def test_one_call_hands_a_compute_to_every_listening_worker():
    """kernels.runner.hand writes the compute's fields in each worker's line and claims each listening
    one (LISTENING -> CLAIMED); a worker asleep or claimed already is left as it is, its fields
    written (it reads them only once claimed) but not claimed: it is sent a Run."""
    from ggtool.kernels import runner as kr
    from ggtool.pool import caller, wire

    ctl = np.zeros(wire.CTL_SIZE // 8, np.int64)
    states = {1: wire.LISTENING, 2: wire.ASLEEP, 3: wire.LISTENING, 4: wire.CLAIMED}
    for i, state in states.items():
        ctl[wire.standby(i)] = state
    lines = np.array([wire.standby(i) - wire.STANDBY for i in states], np.int64)
    claimed = np.zeros(len(states), np.bool_)
    kr.hand(ctl.ctypes.data, lines, caller._HANDED_FIELDS, np.array([7, 5, 11, 200, 3000], np.int64), claimed)
    assert claimed.tolist() == [True, False, True, False]
    assert [ctl[wire.standby(i)] for i in states] == [wire.CLAIMED, wire.ASLEEP, wire.CLAIMED, wire.CLAIMED]
    for i in states:
        assert [ctl[wire.handed(i, f)] for f in (wire.H_KEY, wire.H_NTH, wire.H_GENERATION, wire.H_SPIN,
                                                 wire.H_LINGER)] == [7, 5, 11, 200, 3000]
    assert ctl[wire.standby(0)] == ctl[wire.standby(5)] == 0 and np.count_nonzero(ctl) == 4 + 4 * 5 - 1


def test_listening_and_handing_never_cross(lingering, shm_clean):
    """Whether a worker stops listening (its linger over, a message come) or is claimed first, one side
    wins (a compare-and-swap on the standby word): computes handed for sure (a 5 s linger), then at the
    edge of a short one with maps and preloads between them, then sent for sure (long gaps), are each
    computed once and right and the pool never hangs. Each worker answers every compute and map once,
    and is sent a message for every compute not handed to it, every map and every preload."""
    import random

    from ggtool.pool import wire

    rnd = random.Random(7)
    lingering(5_000_000_000)
    with WorkerPool(3) as p:
        g, y, plan = _frozen_chain(p)
        counts = {"computes": 1, "maps": 0, "preloads": 0}

        def compute(k):
            y.data[...] = -1
            ggtool.graph_compute(g, 3, pool=p, plan=plan)
            assert np.all(y.numpy()[0, 0, 0] == np.arange(16) + 2), k
            counts["computes"] += 1

        for k in range(10):
            compute(k)
        assert p.stats["handed"] == 2 * 10
        lingering(300_000)                  # 0.3 ms
        for k in range(300):
            compute(k)
            r = rnd.random()
            if r < 0.05:
                assert p.map(abs, [-1, -2, -3]) == [1, 2, 3]
                counts["maps"] += 1
            elif r < 0.1:
                p.preload_kernels()
                counts["preloads"] += 1
            elif r < 0.6:
                end = time.perf_counter() + rnd.uniform(0, 0.0006)
                while time.perf_counter() < end:
                    pass
        handed = p.stats["handed"]
        for k in range(3):
            time.sleep(0.2)                 # past the linger: asleep
            compute(k)
        assert p.stats["handed"] == handed and p.stats["graphs_sent"] == 2 and p.stats["restarts"] == 0
        workers = p._state.workers
        for w in workers:                  # counted before sent: every answer read is counted
            assert w.answered() == counts["computes"] + counts["maps"]
        sent = sum(w.ctl[wire.rung(w.slot)] for w in workers)
        assert sent == 2 * (counts["computes"] + counts["maps"] + counts["preloads"]) - handed


def test_hundred_computes_leave_nothing():
    gc.collect()
    before = segments_of(os.getpid())   # the module's pool may hold some
    with WorkerPool(2) as p:
        for i in range(100):
            ctx = ggtool.Context()
            g, y = chain(ctx, 3, rows=2)
            ggtool.graph_compute(g, 2, pool=p)
            assert y.numpy()[0, 0, 1, 0] == 16 + 1.5
            if i % 10 == 9:
                gc.collect()
                assert len(segments_of(os.getpid())) <= 6  # control blocks + the live contexts
        assert p.stats["runs"] == 100 and p.stats["restarts"] == 0
        ctx2 = ggtool.Context()
        g, y = chain(ctx2, 3)
        plan = ggtool.graph_compute(g, 2, pool=p)
        for _ in range(100):
            ggtool.graph_compute(g, 2, pool=p, plan=plan)
    gc.collect()
    assert segments_of(os.getpid()) - before == set()


# -- map, BLAS, defaults -------------------------------------------------------------------------
def _env_and_blas(name):
    from ggtool import blas
    return os.environ.get(name), blas.get_threads(), os.getpid()


def _affinities(pool, nth: int) -> np.ndarray:
    """(CPU count, lowest CPU) of each participant's mask while computing on `pool`."""
    ctx = ggtool.Context()
    out = custom(ctx, "TEST_POOL_AFFINITY", ctx.new_tensor("f32", [2, nth]))
    g = ggtool.Graph(ctx)
    g.expand(out)
    out.data[...] = -1
    assert ggtool.graph_compute(g, nth, pool=pool).n_threads == nth
    return out.numpy().reshape(nth, 2).astype(int)


def test_placement(monkeypatch):
    monkeypatch.delenv("GGTOOL_PLACE", raising=False)
    allowed = sorted(os.sched_getaffinity(0))
    full = placement(len(allowed))
    assert sorted(full) == allowed                        # one CPU each, all distinct
    assert placement(1) == full[:1] and full[0] in allowed
    assert placement(len(allowed) + 1) is None           # more participants than CPUs: none placed
    monkeypatch.setenv("GGTOOL_PLACE", "0")
    assert placement(1) is None


def test_placement_spreads_over_cores_first():
    """With SMT, a worker on the caller's sibling would share its core: siblings come last."""
    cpus = [0, 1, 2, 3, 4, 5]

    def pairs(cpu):   # cores 0-1, 2-3, 4-5
        return f"{cpu - cpu % 2}-{cpu - cpu % 2 + 1}"

    assert spread(3, cpus, 3, pairs) == [3, 4, 0]
    assert spread(6, cpus, 3, pairs) == [3, 4, 0, 5, 1, 2]
    assert spread(2, cpus, None, pairs) == [0, 2]   # the caller's CPU unknown: from the first allowed CPU


def test_wake_on_pins_a_sleeping_process_until_it_releases():
    cpu = max(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", "import sys; from ggtool.pool.placement import Release; "
                              "r = Release(); print('ready', flush=True); sys.stdin.readline(); r(); print(sorted(r.home), flush=True); "
                              "sys.stdin.readline()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"    # it has read its own mask: now it sleeps on stdin
        wake_on(child.pid, cpu)
        assert os.sched_getaffinity(child.pid) == {cpu}
        child.stdin.write("\n")
        child.stdin.flush()
        home = set(json.loads(child.stdout.readline()))
        assert home == os.sched_getaffinity(0) and os.sched_getaffinity(child.pid) == home
    finally:
        child.stdin.close()
        child.wait(5)
    wake_on(child.pid, cpu)                               # a worker already gone: no error


def test_workers_woken_on_their_own_cpu(pool, registered_test_kernels, monkeypatch):
    """Each worker is woken on a CPU of its own, and computes with its whole mask (it released the pin of its wake)."""
    import ggtool.pool.caller as caller

    monkeypatch.delenv("GGTOOL_PLACE", raising=False)
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("one CPU: nothing to place")
    woken = []
    monkeypatch.setattr(caller, "wake_on", lambda pid, cpu: woken.append((pid, cpu)))
    got = _affinities(pool, 2)
    assert [pid for pid, _ in woken] == pool.pids[:1] and woken[0][1] in allowed
    assert list(got[:, 0]) == [len(allowed)] * 2         # nobody computes pinned
    assert os.sched_getaffinity(0) == allowed
    woken.clear()
    monkeypatch.setenv("GGTOOL_PLACE", "0")
    _affinities(pool, 2)
    monkeypatch.delenv("GGTOOL_PLACE")
    with WorkerPool(2, place=False) as unplaced:
        _affinities(unplaced, 2)
    assert woken == []
    if len(allowed) < 4:                                 # more participants than CPUs: nobody placed
        _affinities(pool, 4)
        assert woken == []


def test_bells_are_not_inherited(pool):
    """A worker's eventfd reaches that worker only, not every process this one starts later."""
    assert pool._state.workers and all(not os.get_inheritable(w.bell) for w in pool._state.workers)


def test_pool_without_eventfd(monkeypatch, shm_clean):
    """Where os.eventfd is missing, workers wake on their socket alone."""
    monkeypatch.delattr(os, "eventfd")
    ctx = ggtool.Context()
    g, y = chain(ctx, 20)
    ggtool.graph_compute(g, 1)
    want = y.numpy()
    with WorkerPool(2) as p:
        assert [w.bell for w in p._state.workers] == [-1]
        y.data[...] = 0
        ggtool.graph_compute(g, 2, pool=p)
        assert np.array_equal(y.numpy(), want) and p.map(abs, [-1, -2]) == [1, 2]


def _maybe_fail(x):
    if x == 7:
        raise KeyError(x)
    return x * x


def test_map(pool):
    assert pool.map(_maybe_fail, range(5)) == [0, 1, 4, 9, 16]
    with pytest.raises(KeyError):
        pool.map(_maybe_fail, range(10))
    out = pool.map(_env_and_blas, ["OPENBLAS_NUM_THREADS"] * 4)
    assert len({pid for _, _, pid in out}) == 4
    for env, threads, _pid in out[1:]:  # the workers: one BLAS thread, set before numpy loaded
        assert env == "1" and threads in (1, None)


def _module_of(name):
    import importlib

    return importlib.import_module(name)   # a module: it cannot be pickled back


def test_map_result_that_cannot_travel_is_an_error_not_a_dead_worker(pool):
    pids = pool.pids
    with pytest.raises(GGToolError, match="cannot be sent back from a worker"):
        pool.map(_module_of, ["json"] * 4)
    assert pool.pids == pids and pool.map(_maybe_fail, range(4)) == [0, 1, 4, 9]


def test_default_threads_and_shared_pool(monkeypatch):
    monkeypatch.setenv("GGTOOL_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.setenv("GGTOOL_THREADS", "zero")
    with pytest.raises(GGToolError, match="GGTOOL_THREADS"):
        default_threads()
    monkeypatch.delenv("GGTOOL_THREADS")
    from ggtool import threads
    monkeypatch.setattr(threads, "_read_others", lambda: 0)     # a quiet machine: every CPU free
    monkeypatch.setattr(threads, "_read_one", lambda: 0)
    monkeypatch.setattr(threads, "_seen", [])
    assert default_threads() == threads.available_cpus() == len(os.sched_getaffinity(0))
    p = get_pool(2)
    assert get_pool(2) is p
    p.close()
    assert get_pool(2) is not p
    get_pool().close()


# -- whole processes: kill, Ctrl-C, errors, exit (the CLI's handling, mimicked) ------------------
SCRIPT = """
import os, sys, time
sys.path.insert(0, {tests!r})
import numpy as np
import ggtool
from ggtool.errors import GGToolError
from ggtool.ops import FUNCTIONS
from ggtool.pool import get_pool
import test_pool

def main():
    test_pool.register_test_kernels()
    pool = get_pool({nth})
    ctx = ggtool.Context()
    a = ctx.new_tensor("f32", [1024, 64])
    a.data[...] = 1
    h = FUNCTIONS["add"](ctx, a, a)
    g0 = ggtool.Graph(ctx)
    g0.expand(test_pool.custom(ctx, "TEST_POOL_SLEEP", h, 0, 0))
    ggtool.graph_compute(g0, {nth}, pool=pool)      # starts the workers (and has them import this module)
    print("pids", *pool.pids, flush=True)
    {body}
    g = ggtool.Graph(ctx)
    g.expand(out)
    ggtool.graph_compute(g, {nth}, pool=pool)
    print("done", float(out.numpy().sum()), flush=True)

try:
    main()
except GGToolError as e:
    print(f"Error: {{e}}", file=sys.stderr)
    sys.exit(1)
except KeyboardInterrupt:
    sys.exit(130)
"""


class Run:
    """A finished script: exit code, output, the worker pids, what on_pids returned, its pid."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def run_script(body: str, nth: int = 2, on_pids=None, timeout: float = 60.0) -> Run:
    """Runs SCRIPT in its own session; on_pids(proc, pids) acts once the workers are up."""
    code = SCRIPT.format(tests=str(TESTS), nth=nth, body=body)
    # unbuffered: readline() must not read past the line that communicate() would then miss
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            bufsize=0, start_new_session=True)
    pids, acted = [], None
    line = proc.stdout.readline().decode()
    if line.startswith("pids"):
        pids = [int(x) for x in line.split()[1:]]
        if on_pids is not None:
            acted = on_pids(proc, pids)
    out, err = proc.communicate(timeout=timeout)
    return Run(rc=proc.returncode, out=line + out.decode(), err=err.decode(), pids=pids, acted=acted,
               pid=proc.pid)


def gone(pid: int, within: float = 2.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.01)
    return False


def assert_nothing_left(r: Run) -> None:
    assert r.pids and all(gone(p) for p in r.pids), "worker processes left behind"
    assert segments_of(r.pid) == set(), "shared-memory segments left in /dev/shm"
    assert "resource_tracker" not in r.err and "Traceback" not in r.err, r.err


SLOW = 'out = test_pool.custom(ctx, "TEST_POOL_SLEEP", h, 1, 20000)  # the workers sleep 20 s'


def test_sigkill_worker_mid_graph():
    def kill(proc, pids):
        time.sleep(0.3)   # the slow compute is under way: the workers are in the kernel
        t0 = time.monotonic()
        os.kill(pids[0], signal.SIGKILL)
        proc.wait(timeout=10)
        return time.monotonic() - t0

    r = run_script(SLOW, nth=3, on_pids=kill)
    assert r.rc == 1 and r.acted < 2.0, (r.rc, r.acted, r.err)
    assert r.err.startswith(f"Error: worker 1 (pid {r.pids[0]}) died (killed by SIGKILL) while computing node 1 "
                            "'node_1' (TEST_POOL_SLEEP)\n")
    assert len(r.err.splitlines()) == 1
    assert_nothing_left(r)


def test_ctrl_c_mid_graph():
    def interrupt(proc, pids):
        time.sleep(0.3)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)   # like a terminal: the whole process group
        proc.wait(timeout=10)
        return time.monotonic() - t0

    body = 'out = test_pool.custom(ctx, "TEST_POOL_SLEEP", h, 0, 20000)  # everyone sleeps 20 s'
    r = run_script(body, nth=3, on_pids=interrupt)
    assert r.rc == 130 and r.acted < 2.0, (r.rc, r.acted, r.err)
    assert r.err == "", r.err
    assert_nothing_left(r)


def test_kernel_error_in_subprocess_one_line():
    r = run_script('out = test_pool.custom(ctx, "TEST_POOL_FAIL", h, 1).set_name("bad")', nth=2)
    assert r.rc == 1
    assert r.err == "Error: node 1 'bad' (TEST_POOL_FAIL) failed: ValueError: boom in participant 1\n"
    assert_nothing_left(r)


def test_normal_exit_without_close_cleans_up():
    r = run_script("out = FUNCTIONS['add'](ctx, h, a)", nth=4)
    assert r.rc == 0 and r.err == "" and r.out.splitlines()[-1] == f"done {3.0 * 1024 * 64}"
    assert len(r.pids) == 3
    assert_nothing_left(r)


def test_exit_closes_the_default_pool_after_earlier_finalizers():
    """A weakref.finalize made before ggtool.pool is imported (a TemporaryDirectory here) puts
    weakref's exit hook before the segments' own: the default pool must still be closed, and every
    segment unlinked, before the end."""
    code = f"""
import sys, tempfile
d = tempfile.TemporaryDirectory()
sys.path.insert(0, {str(TESTS)!r})
import ggtool
from ggtool.ops import FUNCTIONS
from ggtool.pool import get_pool
ctx = ggtool.Context()
a = ctx.new_tensor("f32", [1024, 64])
a.data[...] = 1
out = FUNCTIONS["add"](ctx, a, a)
ggtool.graph_compute(ggtool.Graph(ctx).expand(out), 2, pool=get_pool(2))
print("done", float(out.numpy().sum()), *get_pool(2).pids, flush=True)
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and out.split()[:2] == ["done", str(2.0 * 1024 * 64)], (out, err)
    r = Run(rc=p.returncode, out=out, err=err, pids=[int(x) for x in out.split()[2:]], acted=None, pid=p.pid)
    assert_nothing_left(r)


def test_workers_follow_a_killed_caller():
    """If the caller itself is SIGKILLed, the workers notice and exit, and unlink the segments the
    caller had no chance to (shm.remove_orphans)."""
    def kill_caller(proc, pids):
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
        return [gone(p, within=3.0) for p in pids]

    r = run_script(SLOW, nth=2, on_pids=kill_caller)
    assert r.rc == -signal.SIGKILL and all(r.acted)
    deadline = time.monotonic() + 5
    while segments_of(r.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert segments_of(r.pid) == set()


# a script's start: computes on the compiled runner, every participant taken to have a core, and
# workers that listen 30 s for the next compute (as the `lingering` fixture sets them)
LISTENING_SCRIPT = r"""
import sys, time
sys.path.insert(0, {tests!r})
import ggtool
from ggtool import compute, runner
from ggtool.pool import WorkerPool, barrier, caller
runner.WORTH_NUMBA = 0
compute.COMPILED = True
caller.spin_ns = lambda nth: barrier.SPIN_FREE_NS
barrier.LINGER_NS = 30_000_000_000
"""

LINGERING_CALLER = LISTENING_SCRIPT + r"""
from test_pool import chain
pool = WorkerPool(2)
g, y = chain(ggtool.Context(), 4)
ggtool.graph_compute(g, 2, pool=pool)
print("pids", *pool.pids, flush=True)
time.sleep(60)
"""


HANDED_SLEEP = LISTENING_SCRIPT + r"""
import test_pool
test_pool.register_test_kernels()
try:
    pool = WorkerPool(3)
    ctx = ggtool.Context()
    ms = ctx.new_tensor("f32", [16])
    ms.data[...] = 0
    g = ggtool.Graph(ctx)
    g.expand(test_pool.custom(ctx, "TEST_POOL_SLEEP_DATA", ms, 0))
    compute.freeze(g)
    pool.freeze(g)
    plan = ggtool.graph_compute(g, 3, pool=pool)
    ggtool.graph_compute(g, 3, pool=pool, plan=plan)
    ms.data[...] = 20_000           # everyone sleeps 20 s in the next compute, handed as the one before
    print("pids", *pool.pids, "handed", pool.stats["handed"], flush=True)
    ggtool.graph_compute(g, 3, pool=pool, plan=plan)
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_ctrl_c_in_a_handed_compute():
    """Ctrl-C (the terminal's SIGINT to the whole group) while a compute handed to listening workers
    runs ends as a sent one does: exit 130 within 2 s, no worker and no segment left."""
    proc = subprocess.Popen([sys.executable, "-c", HANDED_SLEEP.format(tests=str(TESTS))], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, bufsize=0, start_new_session=True)
    line = proc.stdout.readline().decode().split()
    if not line or line[0] != "pids":
        proc.kill()
        raise AssertionError(proc.communicate(timeout=60)[1].decode()[-2000:])
    assert line[3:] == ["handed", "2"], line
    time.sleep(0.3)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 130 and time.monotonic() - t0 < 2.0, (proc.returncode, err)
    assert_nothing_left(Run(rc=proc.returncode, out="", err=err.decode(), pids=[int(x) for x in line[1:3]],
                            acted=None, pid=proc.pid))


def test_a_worker_spinning_for_the_next_compute_follows_a_killed_caller():
    """A worker spinning for its caller's next message (for 30 s here) still notices the caller's
    death within seconds (its watchdog thread reads EOF on the life pipe) and exits, removing the
    segments the caller had no chance to."""
    proc = subprocess.Popen([sys.executable, "-c", LINGERING_CALLER.format(tests=str(TESTS))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, start_new_session=True)
    line = proc.stdout.readline().decode()
    if not line.startswith("pids"):
        proc.kill()
        raise AssertionError(proc.communicate(timeout=60)[1].decode()[-2000:])
    (pid,) = [int(x) for x in line.split()[1:]]
    assert _proc_state(pid) == "R"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert gone(pid, within=3.0)
    deadline = time.monotonic() + 5
    while segments_of(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert segments_of(proc.pid) == set()


def test_segment_creation_is_not_cut_by_ctrl_c():
    """A Ctrl-C while a segment is being created and mapped is held until that is done, so the
    segment is never left behind half-known (it is raised right after, and the segment cleaned up)."""
    reached = []
    with pytest.raises(KeyboardInterrupt), signals_held():
        seg = shm.Segment(4096)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)   # the handler runs here: held
        reached.append(seg.name)
    assert reached and seg.name in shm.list_segments()
    seg.unlink()
    assert seg.name not in shm.list_segments()


def test_no_new_workers_once_ggtool_changed_on_disk(tmp_path, monkeypatch):
    """Workers started after a ggtool source file changed would compute with other code than the
    caller (a half-old, half-new split gives wrong numbers): refuse with a clear error instead."""
    f = tmp_path / "edited.py"
    f.write_text("")
    later = time.time() + 10
    os.utime(f, (later, later))
    mod = types.ModuleType("ggtool._edited_for_test")
    mod.__file__ = str(f)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    with pytest.raises(GGToolError, match=r"edited.py changed after this process started: new worker processes"):
        WorkerPool(2)


def test_a_weight_the_graph_writes_into_is_repacked_on_every_compute_in_the_workers_too():
    """cpy quantizes into a q4_0 leaf that mul_mat then uses: its repacked form (cached per weight)
    must be made anew each compute, by each participant, even with the graph and plan reused."""
    F = ggtool.ops.FUNCTIONS
    K, N, M = 256, 2048, 4
    xs = np.random.default_rng(0).standard_normal((M, K)).astype(np.float32)
    out = {}
    for threads in (1, 2):
        ctx = ggtool.Context()
        w = ctx.new_tensor("q4_0", [K, N])
        src = ctx.new_tensor("f32", [K, N])
        x = ctx.new_tensor("f32", [K, M]).set_data(xs)
        y = F["mul_mat"](ctx, F["cpy"](ctx, src, w), x)
        g = ggtool.Graph(ctx)
        g.expand(y)
        plan, out[threads] = None, []
        with ggtool.WorkerPool(threads) as pool:
            for seed in (1, 2):
                src.set_data(np.random.default_rng(seed).standard_normal((N, K)).astype(np.float32))
                plan = ggtool.graph_compute(g, threads, pool=pool, plan=plan)
                out[threads].append(y.numpy().tobytes())
    assert out[1][0] != out[1][1]
    assert out[2] == out[1]


def test_a_worker_removes_the_segments_of_a_dead_caller_only():
    """remove_orphans unlinks the segments named after one pid; a worker runs it when its life pipe
    closes and its caller is gone (it was handed to another parent), never for a caller alive."""
    from ggtool.pool.worker import _clean_up_after

    def make(pid: int, tag: str) -> str:
        name = f"{shm.PREFIX}{pid}_{tag}"
        os.close(shm._posixshmem.shm_open("/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode=0o600))
        return name

    alive, dead = os.getppid(), 4_000_000_000       # our parent; a pid no process has
    names = [make(alive, "a"), make(dead, "b"), make(dead, "c")]
    try:
        _clean_up_after(alive, wait=0.05)            # the parent is alive: nothing goes
        assert set(names) <= set(shm.list_segments())
        _clean_up_after(dead, wait=0.05)             # not our parent: its segments go, no others
        left = set(shm.list_segments())
        assert names[0] in left and not {names[1], names[2]} & left
    finally:
        for n in set(names) & set(shm.list_segments()):
            shm._posixshmem.shm_unlink("/" + n)


def _kernel_decision(name):
    from ggtool import role
    from ggtool.kernels import cache

    return role.LIBRARY_CALLER, cache.use_kernel(name)


def test_workers_of_a_library_caller_run_the_kernels_it_runs(pool):
    """A library's process runs every kernel compiled (compiling it at first use); its pool's workers
    must too, not the numpy twin a command line's workers run until the background compiler marks a
    kernel ready: a worker on a twin made every other participant wait for it (2 threads decoded at
    half the speed of one). The name has no ready mark in any cache."""
    from ggtool import role
    from ggtool.kernels import cache

    assert not role.COMMAND_LINE and cache.use_kernel("test:never-marked-ready")
    out = pool.map(_kernel_decision, ["test:never-marked-ready"] * 4)
    assert out[1:] == [(True, True)] * 3
