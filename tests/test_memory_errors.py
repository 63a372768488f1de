"""A tensor or a graph too big for memory: one clear error saying how many bytes it needed, never a
bare "out of memory", a MemoryError traceback or the kernel's OOM killer."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import fails, ok

import ggtool
from ggtool import compute as compute_module
from ggtool import context as context_module
from ggtool.errors import OutOfMemoryError, human_bytes
from ggtool.ops import FUNCTIONS as F

HUGE = "x=f32[10000000,10000000]"          # 10^14 elements: 4 * 10^14 bytes
HUGE_BYTES = "400000000000000 bytes (363.8 TiB)"


def test_a_huge_tensor_says_what_it_needs(run):
    """compute needs the bytes; plan and inspect-graph only lay them out (a measuring context), so
    they show the graph and GGML's sizes instead (tests/test_cli_plan.py)."""
    err = fails(run("compute", "relu(x)", "--tensor", HUGE), "out of memory",
                "f32 tensor of ne [10000000, 10000000, 1, 1]", f"needs {HUGE_BYTES}")
    assert "this machine has" in err
    assert "compute_buffer_size = 400000000000000 " in ok(run("plan", "relu(x)", "--tensor", HUGE))
    assert "[10000000, 10000000, 1, 1]" in ok(run("inspect-graph", "relu(x)", "--tensor", HUGE))


def test_a_huge_result_says_what_it_needs(run):
    fails(run("compute", "mul_mat(a, b)", "--tensor", "a=f32[4,10000000]", "--tensor", "b=f32[4,10000000]"),
          "line 1, column 1: out of memory", f"needs {HUGE_BYTES}")


def test_engine_raises_out_of_memory_error():
    ctx = ggtool.Context()
    with pytest.raises(OutOfMemoryError) as e:
        ctx.new_tensor(ggtool.GGMLType.F32, [10**7, 10**7])
    assert e.value.needed == 4 * 10**14 and e.value.total > e.value.needed
    assert isinstance(e.value, ggtool.GGToolError)
    assert ctx.used_mem == 0                      # nothing was added
    with pytest.raises(ggtool.ShapeError, match=r"hold 4" + "0" * 38 + r" bytes, more than GGML's sizes \(int64\)"):
        ctx.new_tensor(ggtool.GGMLType.F32, [10**10, 10**9, 10**9, 10**10])   # GGML's int64 sizes would wrap


def test_growing_past_the_memory_refuses_to_copy(monkeypatch):
    """Growing the pool out of its reserved address space copies it; a copy larger than the machine's
    memory would be killed, so it is refused first."""
    monkeypatch.setattr(context_module, "memory_limit", lambda: 30_000)
    ctx = ggtool.Context()
    ctx.new_tensor(ggtool.GGMLType.F32, [10_000])          # fits the first 64 KiB
    with pytest.raises(OutOfMemoryError, match="f32 tensor of ne .10000, 1, 1, 1. needs 40000 bytes"):
        ctx.new_tensor(ggtool.GGMLType.F32, [10_000])


def test_a_graph_too_big_to_compute_says_so_before_computing(monkeypatch):
    ctx = ggtool.Context()
    x = ctx.new_tensor_from(np.ones((64, 64), np.float32))
    r = F["relu"](ctx, F["mul_mat"](ctx, x, x))
    g = ggtool.Graph(ctx).expand(r)
    monkeypatch.setattr(compute_module, "memory_limit", lambda: 20_000)
    with pytest.raises(OutOfMemoryError, match=r"computing the graph \(inputs 16384, intermediates 32768, work "
                                               r"buffer 0\) needs 49152 bytes \(48\.0 KiB\)"):
        ggtool.graph_compute(g, 1)
    assert not r.data.any()                      # nothing ran
    monkeypatch.setattr(compute_module, "memory_limit", lambda: 60_000)
    ggtool.graph_compute(g, 1)
    assert r.data.all()


def test_cli_graph_too_big(run, monkeypatch):
    """relu(relu(x)) on 40000 bytes: 120000 in context mode, 80000 with the graph allocator (the
    second relu computes in place of the first)."""
    monkeypatch.setattr(compute_module, "memory_limit", lambda: 100_000)
    args = ("compute", "relu(relu(x))", "--tensor", "x=f32[100,100]")
    fails(run(*args, "--alloc", "context"), "out of memory: computing the graph (inputs 40000, intermediates 80000",
          "needs 120000 bytes")
    assert run(*args).exit_code == 0
    monkeypatch.setattr(compute_module, "memory_limit", lambda: 70_000)
    fails(run(*args), "out of memory: computing the graph (inputs 40000, compute buffer 40000", "needs 80000 bytes")


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 1023, 1536, 3 << 30)] == ["0 bytes", "1023 bytes", "1.5 KiB", "3.0 GiB"]
