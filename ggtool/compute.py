"""The graph driver (ggml_graph_compute): every node's forward, in order, with the plan's work buffer."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import numpy as np

from . import blas
from .errors import ComputeError, GGToolError
from .ops.base import kernel_for
from .plan import Plan, make_plan


class Work:
    """What a kernel gets besides its node: the work buffer and the barrier."""

    __slots__ = ("wdata", "_barrier")

    def __init__(self, wdata: np.ndarray, barrier=None):
        self.wdata = wdata
        self._barrier = barrier

    def barrier(self) -> None:
        if self._barrier is not None:
            self._barrier()


class Progress:
    """The index of the node participant 0 is computing (-1 before the first), written as it goes:
    a thread may watch a long compute through it (the CLI's progress bar does) at no cost to it."""

    __slots__ = ("node",)

    def __init__(self):
        self.node = -1


def work_view(graph, plan: Plan) -> np.ndarray:
    buf = graph.ctx.buffer
    return buf[plan.work_offset: plan.work_offset + plan.work_size]


def run_node(index: int, node, ith: int, nth: int, work: Work) -> None:
    """One node's kernel for participant ith of nth. Callers run nodes inside
    `np.errstate(all="ignore")`: as in GGML, inf and NaN are results, not errors."""
    forward = kernel_for(node).forward
    if forward is None or 0 in node.ne:  # NONE and views; empty tensors
        return
    try:
        forward(node, ith, nth, work)
    except Exception as e:  # a kernel failure is reported with its node, never as a traceback
        raise node_error(index, node, e) from e


def node_error(index: int, node, e: BaseException) -> ComputeError:
    msg = str(e) if isinstance(e, GGToolError) else f"{type(e).__name__}: {e}"
    return ComputeError(f"node {index} '{node.name}' ({node.op_desc}) failed: {msg}")


def prepare(graph, n_threads: int = 1, plan: Plan | None = None) -> Plan:
    """Plan the graph and allocate its work buffer in the pool (ggml_graph_compute_with_ctx)."""
    plan = plan or make_plan(graph, n_threads)
    if plan.work_offset is None:
        plan.work_offset = graph.ctx.new_buffer(plan.work_size)
    return plan


def compute(graph, n_threads: int = 1, pool=None, plan: Plan | None = None, progress: Progress | None = None) -> Plan:
    plan = prepare(graph, n_threads, plan)
    if pool is not None and plan.n_threads > 1:
        pool.run(graph, plan, progress)
    else:
        run_in_process(graph, plan, progress)
    return plan


def run_in_process(graph, plan: Plan, progress: Progress | None = None) -> None:
    """Every node in this process as participant 0 of 1."""
    work = Work(work_view(graph, plan))
    with single_threaded(), np.errstate(all="ignore"):
        for i, node in enumerate(graph.nodes):
            if progress is not None:
                progress.node = i
            run_node(i, node, 0, 1, work)


@contextmanager
def single_threaded():
    """A participant is one thread: BLAS and ggtool.quant's array functions on one thread
    meanwhile. Parallelism is the pool's job, and the same thread counts give the same bits."""
    quant = sys.modules.get("ggtool.quant")
    saved = getattr(quant, "_threads", None)
    with blas.limit(1):
        if quant is not None:
            quant.set_threads(1)
        try:
            yield
        finally:
            if quant is not None:
                quant.set_threads(saved)
