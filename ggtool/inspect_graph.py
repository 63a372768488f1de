"""A graph and its plan as plain records: per node and leaf its index, op, name, type, ne, nb,
sources, view and flags (and where it lies in the compute buffer); per planned node its n_tasks
and work. What a library user, or a renderer (the command line's tables, JSON and DOT), needs;
nothing here reads tensor data or formats text.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import types as T
from .alloc import Allocation
from .errors import GGToolError
from .graph import Graph
from .plan import Plan
from .tensor import FLAG_INPUT, FLAG_LOSS, FLAG_OUTPUT, FLAG_PARAM, Tensor
from .user_regex import RegexError, UserRegex

_FLAG_NAMES = ((FLAG_INPUT, "input"), (FLAG_OUTPUT, "output"), (FLAG_PARAM, "param"), (FLAG_LOSS, "loss"))


@dataclass(frozen=True)
class Entry:
    """A node or leaf with its index in the graph's `nodes` or `leafs`."""

    kind: str  # "node" or "leaf"
    index: int
    tensor: Tensor

    @property
    def ref(self) -> str:
        return f"{self.kind}s[{self.index}]"


class SelectionError(GGToolError):
    """A pattern that picks no part of the graph: not a regular expression (`problem` says why),
    or matching no tensor name (`problem` is None; the graph has `n_nodes` and `n_leafs`)."""

    def __init__(self, pattern: str, problem: str | None, n_nodes: int, n_leafs: int):
        self.pattern, self.problem, self.n_nodes, self.n_leafs = pattern, problem, n_nodes, n_leafs
        if problem is not None:
            super().__init__(f"{pattern!r} is not a valid regular expression: {problem}")
        else:
            super().__init__(f"{pattern!r} matches no tensor name of the graph ({n_nodes} nodes, {n_leafs} leafs)")


@dataclass
class Selection:
    """The part of a graph to show: all of it, or what a pattern picked (indices stay the graph's)."""

    graph: Graph
    nodes: list[Entry]
    leafs: list[Entry]

    def refs(self) -> dict[int, Entry]:
        """id(tensor) -> its entry, over the whole graph (sources may lie outside the selection)."""
        out = {id(t): Entry("leaf", i, t) for i, t in enumerate(self.graph.leafs)}
        out.update({id(t): Entry("node", i, t) for i, t in enumerate(self.graph.nodes)})
        return out


def select(graph: Graph, only: str | None = None) -> Selection:
    """Everything, or the tensors whose name matches the regex `only` plus their direct sources."""
    nodes = [Entry("node", i, t) for i, t in enumerate(graph.nodes)]
    leafs = [Entry("leaf", i, t) for i, t in enumerate(graph.leafs)]
    if only is None:
        return Selection(graph, nodes, leafs)
    try:
        pattern = UserRegex(only, "only")       # searched with a time bound
    except RegexError as e:
        raise SelectionError(only, e.problem, graph.n_nodes, graph.n_leafs) from None
    keep: set[int] = set()
    for e in nodes + leafs:
        if pattern.search(e.tensor.name):
            keep.add(id(e.tensor))
            keep.update(id(s) for s in e.tensor.src if s is not None)
    if not keep:
        raise SelectionError(only, None, graph.n_nodes, graph.n_leafs)
    return Selection(graph, [e for e in nodes if id(e.tensor) in keep], [e for e in leafs if id(e.tensor) in keep])


# -- records ----------------------------------------------------------------------------------------
def tensor_record(entry: Entry, refs: dict[int, Entry], alloc: Allocation | None = None) -> dict:
    """index, op, op_desc, name, type, ne, nb, src (names), src_refs ("nodes[i]"), view_src, view_offs,
    flags; with `alloc`, buffer_offset (None: not in the compute buffer)."""
    t = entry.tensor
    srcs = list(t.src)
    while srcs and srcs[-1] is None:
        srcs.pop()
    view = t.view_src
    return {
        "index": entry.index,
        "op": t.op,
        "op_desc": t.op_desc,
        "name": t.name,
        "type": T.type_name(t.type),
        "ne": list(t.ne),
        "nb": list(t.nb),
        "src": [None if s is None else s.name for s in srcs],
        "src_refs": [None if s is None or id(s) not in refs else refs[id(s)].ref for s in srcs],
        "view_src": None if view is None else view.name,
        "view_offs": t.view_offs if view is not None else None,
        "flags": [n for f, n in _FLAG_NAMES if t.flags & f],
    } | ({} if alloc is None else {"buffer_offset": alloc.offset(t)})


def describe_graph(sel: Selection, alloc: Allocation | None = None) -> dict:
    """`{"nodes": [...], "leafs": [...]}`; each with op (GGML's name, e.g. MUL_MAT), name, type, ne, nb, src.
    With `alloc` (the graph's Allocation) also `compute_buffer_size` and each record's
    `buffer_offset`: where its data starts in the compute buffer (null: not in it)."""
    refs = sel.refs()
    doc = {"nodes": [tensor_record(e, refs, alloc) for e in sel.nodes],
           "leafs": [tensor_record(e, refs, alloc) for e in sel.leafs]}
    if alloc is not None:
        doc["compute_buffer_size"] = alloc.size
    return doc


# -- plans -------------------------------------------------------------------------------------------
def describe_plan(graph: Graph, plan: Plan) -> dict:
    """n_threads, work_size, mem_size (the GGML context size), compute_buffer_size and
    intermediates_size (when the plan has an allocation), requested, and per node n_tasks, work and
    split (who computes it: "all", "one" or "-", plan.NodePlan)."""
    doc = {
        "n_threads": plan.n_threads,
        "work_size": plan.work_size,
        "mem_size": plan.mem_size(graph),
    }
    if plan.allocation is not None:
        doc["compute_buffer_size"] = plan.allocation.size
        doc["intermediates_size"] = plan.allocation.intermediates_size
    doc["requested"] = plan.requested
    doc["nodes"] = [{"index": i, "op": p.node.op, "op_desc": p.node.op_desc, "name": p.node.name,
                     "n_tasks": p.n_tasks, "work_size": p.work_size, "split": p.split}
                    for i, p in enumerate(plan.nodes)]
    return doc
