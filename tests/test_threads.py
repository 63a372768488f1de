"""The thread policy's one home (ggtool.threads): the default-thread rule every layer uses, and a
participant of a compute on one thread (the quantizers' threads included)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import ggtool
from ggtool import quant as Q
from ggtool.errors import GGToolError
from ggtool.ops import FUNCTIONS
from ggtool.plan import estimate_flops, estimate_work
from ggtool.quant.threads import MAX_THREADS
from ggtool import threads
from ggtool.threads import Work, available_cpus, choose, default_threads, one_thread, predict, single_threaded


@pytest.fixture
def five_cpus(monkeypatch):
    """Five CPUs this process may use, none busy with another process (a quiet machine)."""
    monkeypatch.delenv("GGTOOL_THREADS", raising=False)
    monkeypatch.delenv("GGTOOL_QUANT_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    monkeypatch.setattr(threads, "CGROUP_CPU_MAX", "/nonexistent/cpu.max")
    monkeypatch.setattr(threads, "_quota", [])
    monkeypatch.setattr(threads, "_read_others", lambda: 0)
    monkeypatch.setattr(threads, "_read_one", lambda: 0)     # the later readings too (a slow test's)
    threads._seen.clear()
    yield
    threads._seen.clear()


def busy(monkeypatch, n: int) -> None:
    """n other processes running now."""
    monkeypatch.setattr(threads, "_read_others", lambda: n)
    monkeypatch.setattr(threads, "_read_one", lambda: n)
    threads._seen.clear()


def test_the_default_is_ggtool_threads_else_the_free_cpus(five_cpus, monkeypatch):
    assert available_cpus() == default_threads() == 5
    busy(monkeypatch, 2)
    assert default_threads() == 3
    monkeypatch.setenv("GGTOOL_THREADS", "3")
    assert default_threads() == 3
    c = choose(Work(flops=10**15))
    assert c.given and c.n == 3 and "GGTOOL_THREADS=3" in c.reason
    monkeypatch.setenv("GGTOOL_THREADS", "zero")
    with pytest.raises(GGToolError, match="GGTOOL_THREADS must be a positive integer"):
        default_threads()


def graphs():
    ctx = ggtool.Context(no_alloc=True)
    small = ggtool.Graph(ctx).expand(FUNCTIONS["add"](ctx, ctx.new_tensor("f32", [16]), ctx.new_tensor("f32", [16])))
    w, x = ctx.new_tensor("f32", [4096, 4096]), ctx.new_tensor("f32", [4096, 512])
    x8 = ctx.new_tensor("f32", [4096, 4096 * 6])
    big = ggtool.Graph(ctx).expand(FUNCTIONS["mul_mat"](ctx, w, x))    # 2*4096*4096*512 = 17 GFLOP
    huge = ggtool.Graph(ctx).expand(FUNCTIONS["mul_mat"](ctx, w, x8))  # 2*4096*4096*24576 = 825 GFLOP
    return small, big, huge


def test_a_graph_too_small_for_workers_computes_in_process(five_cpus, monkeypatch):
    """No thread count given: the count the cost model finds fastest. A small graph computes in
    this process (a worker costs more to start than it saves); 825 GFLOP use every CPU; an
    explicit GGTOOL_THREADS is obeyed whatever the size."""
    small, big, huge = (estimate_work(g) for g in graphs())
    assert default_threads(small) == 1
    assert default_threads(big) == 1          # 0.17 s of work: half of it saves less than a worker costs to start
    assert default_threads(huge) == 5
    monkeypatch.setenv("GGTOOL_THREADS", "3")
    assert default_threads(small) == 3


def test_the_count_is_the_fastest_the_model_predicts(five_cpus):
    """choose() picks the n of least predicted time (ties to fewer) and says why; the model's terms
    move it the way the pool's costs do."""
    work = Work(flops=2 * 300 * 10**6, weight_bytes=170 * 2**20, params=300 * 10**6, barriers=120)
    one_shot, steps = choose(work), choose(work, steps=128)
    assert one_shot.n == 1 and "starting a worker" in one_shot.reason      # ~20 ms of work: not worth a start
    assert steps.n == 5 and steps.reason.startswith("5 threads: 300M weights (170 MiB)")
    for c, s in ((one_shot, 1), (steps, 128)):
        assert list(c.predicted) == [predict(work, k, s) for k in range(1, 6)]
        assert c.predicted[c.n - 1] == min(c.predicted)
    assert choose(work, steps=128, started=True).n == 5
    tiny = Work(flops=10**6, weight_bytes=2**20, params=2**18, barriers=120)   # a step's barriers cost more than its work
    assert choose(tiny, steps=10**6, started=True).n == 1
    assert predict(tiny, 2, 1, started=True) > predict(tiny, 1)
    assert predict(work, 1) == work.seconds() == work.weight_bytes / threads.BYTE_RATE   # a mat-vec: memory-bound


def test_busy_cpus_are_not_counted(five_cpus, monkeypatch):
    """Other processes running now take CPUs from the count: an oversubscribed pool waits on every
    barrier for a participant the scheduler has put aside."""
    work = Work(flops=10**13, weight_bytes=2**30, params=10**9, barriers=100)
    assert choose(work, steps=64).n == 5
    busy(monkeypatch, 3)
    c = choose(work, steps=64)
    assert (c.n, c.free) == (2, 2) and "2 of 5 CPUs free" in c.reason
    busy(monkeypatch, 9)
    c = choose(work, steps=64)
    assert (c.n, c.free) == (1, 1) and "others are busy" in c.reason


def test_the_running_count_is_read_from_proc_loadavg(five_cpus, monkeypatch, tmp_path):
    """The median of a few reads of /proc/loadavg's running count, less this process; an unreadable
    or malformed file counts nobody (the rule then falls back to the CPUs it may use)."""
    monkeypatch.undo()
    monkeypatch.setattr(threads, "SAMPLE_GAP", 0)
    monkeypatch.setattr(threads, "HELPERS", set())      # a pool of other tests may be running: not read here
    f = tmp_path / "loadavg"
    monkeypatch.setattr(threads, "LOADAVG", str(f))
    for text, others in (("0.50 0.40 0.30 4/180 12345\n", 3), ("1.0 1.0 1.0 1/99 7\n", 0), ("garbage", 0),
                         ("", 0), ("1 2 3 x/y 4", 0)):
        f.write_text(text)
        assert threads._read_others() == others, text
    f.unlink()
    assert threads._read_others() == 0
    reads = iter(["0 0 0 9/9 1", "0 0 0 2/9 1", "0 0 0 3/9 1", "0 0 0 9/9 1", "0 0 0 2/9 1"])
    monkeypatch.setattr("builtins.open", lambda *a, **k: __import__("io").StringIO(next(reads)))
    assert threads._read_others() == 2      # median 3, less this process


def test_the_running_count_is_a_rolling_median_read_without_sleeping(five_cpus, monkeypatch):
    """After its first reading (SAMPLES reads, SAMPLE_GAP apart), others_running reads once where the
    newest reading is SEEN_FOR / SAMPLES old, never sleeping (it is on every compute's way), and
    answers the median of the last SAMPLES: a moment's task is not a busy machine, a lasting one is
    seen within a second; after SEEN_FOR without a call, the window starts afresh."""
    import types

    clock = [100.0]

    def no_sleep(s):
        raise AssertionError("slept")

    monkeypatch.setattr(threads, "time", types.SimpleNamespace(monotonic=lambda: clock[0], sleep=no_sleep))
    monkeypatch.setattr(threads, "_read_others", lambda: 1)
    reads = iter([5, 0, 5, 5, None, 7])
    monkeypatch.setattr(threads, "_read_one", lambda: next(reads))
    seen = []
    for t in (100.0, 100.1, 100.25, 100.5, 100.75, 101.0, 101.1, 101.25, 101.5):
        clock[0] = t
        seen.append(threads.others_running())
    assert seen == [1, 1, 1, 1, 1, 5, 5, 5, 5]      # the reads: -, -, 5, 0, 5, 5, -, None (0), 7
    assert [n for _, n in threads._seen] == [0, 5, 5, 0, 7]
    monkeypatch.setattr(threads, "_read_others", lambda: 2)
    clock[0] = 102.6
    assert threads.others_running() == 2 and len(threads._seen) == threads.SAMPLES


def test_the_pools_own_workers_running_are_not_others(five_cpus, monkeypatch, tmp_path):
    """A pool's workers (threads.HELPERS) computing or spinning for the next compute are this
    process's work: each one running is taken off the running count; one asleep, one gone, or a
    pid that is no process counts as nothing. Read for real: this test's own process is running
    while it reads its /proc stat, a sleeping child is not."""
    import subprocess
    import sys

    monkeypatch.undo()
    monkeypatch.setattr(threads, "SAMPLE_GAP", 0)
    f = tmp_path / "loadavg"
    monkeypatch.setattr(threads, "LOADAVG", str(f))
    f.write_text("0.50 0.40 0.30 4/180 12345\n")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while open(f"/proc/{sleeper.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "S":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        monkeypatch.setattr(threads, "HELPERS", {sleeper.pid, 2 ** 22 + 12345})
        assert threads._read_others() == 3          # asleep, and no such process: nobody
        monkeypatch.setattr(threads, "HELPERS", {sleeper.pid, os.getpid()})
        assert threads._read_others() == 2          # this process stands in for a worker computing
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_pool_counts_its_workers_as_its_own_while_they_live():
    """pool.procs adds each worker it starts to threads.HELPERS and takes it off once reaped."""
    from ggtool.pool import WorkerPool

    with WorkerPool(3) as p:
        pids = set(p.pids)
        assert len(pids) == 2 and pids <= threads.HELPERS
    assert not pids & threads.HELPERS


def test_a_forked_child_does_not_take_its_parents_workers_for_its_own():
    """After os.fork the parent's pool workers are others to the child: its HELPERS start empty.
    (Python 3.12+ warns of a fork in a process with threads, as the suite's is by then: the child
    here only reads a set and exits, which no lock another thread held can block.)"""
    import warnings

    threads.HELPERS.add(2 ** 22 + 4321)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os._exit(0 if not threads.HELPERS else 1)
        assert os.waitpid(pid, 0)[1] == 0 and 2 ** 22 + 4321 in threads.HELPERS
    finally:
        threads.HELPERS.discard(2 ** 22 + 4321)


def test_a_cgroup_quota_caps_the_cpus(five_cpus, monkeypatch, tmp_path):
    f = tmp_path / "cpu.max"
    monkeypatch.setattr(threads, "CGROUP_CPU_MAX", str(f))
    for text, cpus in (("max 100000\n", 5), ("250000 100000\n", 2), ("50000 100000\n", 1),
                       ("1000000 100000\n", 5), ("nonsense", 5)):
        f.write_text(text)
        threads._quota.clear()              # read once a process: a new process reads it anew
        assert available_cpus() == cpus, text


def test_the_work_of_a_graph(five_cpus):
    """estimate_work: the weights each mul_mat reads (a leaf once), the arithmetic, and a barrier per
    computing node (one more for a mul_mat that converts its activations)."""
    ctx = ggtool.Context(no_alloc=True)
    w, x = ctx.new_tensor("q4_0", [64, 32]), ctx.new_tensor("f32", [64, 3])
    F = FUNCTIONS
    h = F["mul_mat"](ctx, w, x)                                                   # [32, 3]
    r = F["relu"](ctx, F["cont"](ctx, F["transpose"](ctx, h)))                    # [3, 32]
    y = F["mul_mat"](ctx, w, F["mul_mat"](ctx, ctx.new_tensor("f32", [3, 64]), r))   # w . [64, 32]
    g = ggtool.Graph(ctx).expand(y)
    work = estimate_work(g)
    assert (work.weight_bytes, work.params) == (w.nbytes + 3 * 64 * 4, 64 * 32 + 3 * 64)
    assert work.flops == estimate_flops(g)
    # mul_mat (+1: q8_0), cont, relu, mul_mat (f32), mul_mat (+1); transpose is a view
    assert work.barriers == 7


def test_the_quantizers_follow_the_rule(five_cpus, monkeypatch):
    """quant's threads: set_threads, else GGTOOL_QUANT_THREADS, else the one rule (at most the
    executor's MAX_THREADS); one inside a participant of a compute."""
    Q.set_threads(None)
    assert Q.get_threads() == 5
    monkeypatch.setenv("GGTOOL_THREADS", "2")
    assert Q.get_threads() == 2
    monkeypatch.setenv("GGTOOL_THREADS", "64")
    assert Q.get_threads() == MAX_THREADS
    monkeypatch.setenv("GGTOOL_QUANT_THREADS", "3")
    assert Q.get_threads() == 3
    Q.set_threads(4)
    try:
        assert Q.get_threads() == 4
        assert not one_thread()
        with single_threaded():
            assert one_thread() and Q.get_threads() == 1
        assert Q.get_threads() == 4
    finally:
        Q.set_threads(None)


def test_single_threaded_quantizes_the_same_bytes():
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    with single_threaded():
        one = Q.quantize_q4_0(x)
    assert np.array_equal(one, Q.quantize_q4_0(x))


def test_the_help_states_the_rule_of_ggtool_threads():
    """--threads' shown default (commands/_common.BY_THE_WORK) says what ggtool.threads.choose does."""
    from ggtool.commands._common import BY_THE_WORK

    assert "fastest for the graph's work among the free CPUs" in BY_THE_WORK


@pytest.mark.parametrize("name", ["GGTOOL_THREADS", "GGTOOL_QUANT_THREADS"])
def test_a_bad_thread_count_in_the_environment_is_an_error(monkeypatch, name):
    """Both variables are read by one rule (ggtool.threads.env_threads): 'two' or 0 is refused by
    name, never silently replaced by the default."""
    from ggtool.quant.threads import get_threads, threads_set_to

    monkeypatch.delenv("GGTOOL_THREADS", raising=False)
    monkeypatch.delenv("GGTOOL_QUANT_THREADS", raising=False)
    count = default_threads if name == "GGTOOL_THREADS" else get_threads
    with threads_set_to(None):   # no count set in this process: the environment decides
        for bad in ("two", "0"):
            monkeypatch.setenv(name, bad)
            with pytest.raises(GGToolError, match=f"{name} must be a positive integer, got '{bad}'"):
                count()
        monkeypatch.setenv(name, "3")
        assert count() == 3
