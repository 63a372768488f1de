"""The thread policy's one home (ggtool.threads): the default-thread rule every layer uses, and a
participant of a compute on one thread (the quantizers' threads included)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ggtool
from ggtool import quant as Q
from ggtool.errors import GGToolError
from ggtool.ops import FUNCTIONS
from ggtool.plan import estimate_flops
from ggtool.quant.threads import MAX_THREADS
from ggtool.threads import PARTICIPANT_MIN_FLOPS, available_cpus, default_threads, one_thread, single_threaded


@pytest.fixture
def five_cpus(monkeypatch):
    monkeypatch.delenv("GGTOOL_THREADS", raising=False)
    monkeypatch.delenv("GGTOOL_QUANT_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})


def test_the_default_is_ggtool_threads_else_the_cpus_we_may_use(five_cpus, monkeypatch):
    assert available_cpus() == default_threads() == 5
    monkeypatch.setenv("GGTOOL_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.setenv("GGTOOL_THREADS", "zero")
    with pytest.raises(GGToolError, match="GGTOOL_THREADS must be a positive integer"):
        default_threads()


def test_a_graph_too_small_for_workers_computes_in_process(five_cpus, monkeypatch):
    """No thread count given: the CPUs, unless the graph is too small to gain from workers; an
    explicit GGTOOL_THREADS is obeyed whatever the size."""
    ctx = ggtool.Context(no_alloc=True)
    small = ggtool.Graph(ctx).expand(FUNCTIONS["add"](ctx, ctx.new_tensor("f32", [16]), ctx.new_tensor("f32", [16])))
    w, x = ctx.new_tensor("f32", [4096, 4096]), ctx.new_tensor("f32", [4096, 512])
    x8 = ctx.new_tensor("f32", [4096, 4096 * 6])
    big = ggtool.Graph(ctx).expand(FUNCTIONS["mul_mat"](ctx, w, x))    # 2*4096*4096*512 = 17 GFLOP
    huge = ggtool.Graph(ctx).expand(FUNCTIONS["mul_mat"](ctx, w, x8))  # 2*4096*4096*24576 = 825 GFLOP
    assert estimate_flops(small) < estimate_flops(big) < PARTICIPANT_MIN_FLOPS
    assert default_threads(estimate_flops(small)) == 1
    assert default_threads(estimate_flops(big)) == 1
    assert default_threads(estimate_flops(huge)) == 5
    monkeypatch.setenv("GGTOOL_THREADS", "3")
    assert default_threads(estimate_flops(small)) == 3


def test_the_default_adds_a_participant_per_share_of_work(five_cpus):
    """Each participant the default adds brings PARTICIPANT_MIN_FLOPS of work: a worker costs a
    fixed start-up and saves only its share (gemma-3-270m at 30 tokens, 16 GFLOP, is faster on one)."""
    m = PARTICIPANT_MIN_FLOPS
    assert [default_threads(f) for f in (0, m - 1, m, 2 * m - 1, 2 * m, 3 * m, 100 * m)] == [1, 1, 1, 1, 2, 3, 5]


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
    """--threads' shown default (commands/_common.BY_THE_WORK) says the share ggtool.threads uses."""
    from ggtool.commands._common import BY_THE_WORK
    from ggtool.threads import PARTICIPANT_MIN_FLOPS

    assert f"one per {PARTICIPANT_MIN_FLOPS // 10**9} GFLOP" in BY_THE_WORK


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
