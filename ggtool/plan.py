"""ggml_graph_plan: n_tasks and work size per node, the thread count and the work buffer
(ggml_get_n_tasks per node)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .context import OBJECT_SIZE, pad
from .tensor import Tensor

if TYPE_CHECKING:
    from .alloc import Allocation

DEFAULT_N_THREADS = 4
CACHE_LINE_SIZE = 64


SPLIT_ALL, SPLIT_ONE, SPLIT_NONE = "all", "one", "-"


@dataclass
class NodePlan:
    """A node's n_tasks and work bytes (ggml_graph_plan's), and `split`: who computes it at run time,
    where GGML runs every node on every thread: "all" (each participant its rows, its share of the
    op's work: the op's forward splits, as ADD's and GET_ROWS's do whatever their n_tasks), "one"
    (participant 0 alone: the forward returns unless ith == 0) or "-" (nothing to compute: a view,
    an empty tensor)."""
    node: Tensor
    n_tasks: int
    work_size: int
    split: str = SPLIT_ALL


@dataclass
class Plan:
    requested: int
    n_threads: int
    work_size: int
    nodes: list[NodePlan] = field(default_factory=list)
    work_offset: int | None = None  # payload offset of the work buffer once allocated in the pool
    allocation: Allocation | None = None  # the graph allocator's compute buffer, once `allocate`d
    numerics: str = "ggml"       # the kernels' order of float operations (ggtool.compute.Work)

    def allocate(self, graph, outputs: Iterable[Tensor] = ()) -> Allocation:
        """Plan the compute buffer as ggml_gallocr_reserve does (ggtool.alloc); `outputs` are kept
        to the end. Sets and returns `allocation` (`allocation.size`: the compute buffer bytes)."""
        from .alloc import allocate

        self.allocation = allocate(graph, outputs)
        return self.allocation

    @property
    def compute_buffer_size(self) -> int | None:
        """ggml_gallocr_get_buffer_size after `allocate` (None before): llama.cpp's "compute buffer
        size". GGML's CPU backend keeps the work buffer (`work_size`) apart from it."""
        return None if self.allocation is None else self.allocation.size

    def mem_size(self, graph) -> int:
        """Bytes a GGML program's context needs: tensors, graph object and the work buffer.

        That is `ggml_used_mem` after `ggml_graph_compute_with_ctx`, with memory-mapped tensors
        counted as if their data lived in the pool.
        """
        extra = 0 if self.work_offset is not None else OBJECT_SIZE + pad(self.work_size)
        return graph.ctx.ggml_mem_size + extra


def make_plan(graph, n_threads: int = 0) -> Plan:
    """ggml_graph_plan: each node's n_tasks and work size from its op, for n_threads (<= 0: 4)."""
    from .ops import kernel_for

    if n_threads <= 0:
        n_threads = DEFAULT_N_THREADS
    max_tasks, work_size, nodes = 1, 0, []
    for node in graph.nodes:
        k = kernel_for(node)
        n_tasks = 1 if node.is_empty() else k.n_tasks(node, n_threads)
        cur = k.work_size(node, n_tasks)
        max_tasks = max(max_tasks, n_tasks)
        work_size = max(work_size, cur)
        if node.op == "NONE" or node.is_empty() or k.forward is None:
            split = SPLIT_NONE
        else:
            split = SPLIT_ALL if k.splits() else SPLIT_ONE
        nodes.append(NodePlan(node, n_tasks, cur, split))
    if work_size > 0:
        work_size += CACHE_LINE_SIZE * n_threads
    return Plan(n_threads, min(max_tasks, n_threads), work_size, nodes)


NO_COMPUTE = ("NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE")   # ops that only name memory


def estimate_flops(graph) -> int:
    """Rough arithmetic of one compute: 2·K per mul_mat output element, one per other element."""
    total = 0
    for node in graph.nodes:
        if node.op in NO_COMPUTE:
            continue
        per = 2 * node.src[0].ne[0] if node.op == "MUL_MAT" else 1
        total += per * node.nelements
    return total


def estimate_work(graph):
    """What one compute of `graph` does, for the thread rule (ggtool.threads.Work): its arithmetic
    (estimate_flops), the bytes and elements of the weights its matrix products read (each leaf
    once, a view's bytes where it is one), and the nodes that compute (each meets a barrier when
    it splits between participants; a mul_mat that converts its activations meets one more)."""
    from . import types as T
    from .threads import Work

    seen, wbytes, params, barriers = set(), 0, 0, 0
    for node in graph.nodes:
        if node.op in NO_COMPUTE:
            continue
        barriers += 1
        if node.op != "MUL_MAT":
            continue
        a, b = node.src[0], node.src[1]
        if b.type != T.vec_dot_type(a.type):
            barriers += 1
        root = a
        while root.view_src is not None:
            root = root.view_src
        if root.op == "NONE" and id(a) not in seen:
            seen.add(id(a))
            wbytes += a.nbytes
            params += a.nelements
    return Work(flops=estimate_flops(graph), weight_bytes=wbytes, params=params, barriers=barriers)
