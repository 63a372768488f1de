"""Describing a graph and its plan: a table modelled on ggml_graph_print, JSON, and graphviz DOT
modelled on ggml_graph_dump_dot. Nothing here reads tensor data.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

from . import types as T
from .alloc import Allocation
from .errors import GGToolError
from .graph import Graph
from .plan import Plan
from .tensor import FLAG_INPUT, FLAG_LOSS, FLAG_OUTPUT, FLAG_PARAM, Tensor

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


@dataclass
class Selection:
    """The part of a graph to show: all of it, or what `--only` picked (indices stay the graph's)."""

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
        pattern = re.compile(only)
    except re.error as e:
        raise GGToolError(f"--only {only!r} is not a valid regular expression: {e}") from None
    keep: set[int] = set()
    for e in nodes + leafs:
        if pattern.search(e.tensor.name):
            keep.add(id(e.tensor))
            keep.update(id(s) for s in e.tensor.src if s is not None)
    if not keep:
        raise GGToolError(f"--only {only!r} matches no tensor name of the graph "
                          f"({graph.n_nodes} nodes, {graph.n_leafs} leafs)")
    return Selection(graph, [e for e in nodes if id(e.tensor) in keep], [e for e in leafs if id(e.tensor) in keep])


# -- JSON -----------------------------------------------------------------------------------------
def tensor_record(entry: Entry, refs: dict[int, Entry], alloc: Allocation | None = None) -> dict:
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


def graph_json(sel: Selection, alloc: Allocation | None = None) -> dict:
    """`{"nodes": [...], "leafs": [...]}`; each with op (GGML's name, e.g. MUL_MAT), name, type, ne, nb, src.
    With `alloc` (the graph's Allocation) also `compute_buffer_size` and each record's
    `buffer_offset`: where its data starts in the compute buffer (null: not in it)."""
    refs = sel.refs()
    doc = {"nodes": [tensor_record(e, refs, alloc) for e in sel.nodes],
           "leafs": [tensor_record(e, refs, alloc) for e in sel.leafs]}
    if alloc is not None:
        doc["compute_buffer_size"] = alloc.size
    return doc


def json_text(doc: dict) -> Iterator[str]:
    """A JSON object with one line per record of its lists (readable, and still one document)."""
    items = list(doc.items())
    yield "{"
    for i, (key, value) in enumerate(items):
        tail = "," if i < len(items) - 1 else ""
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            yield f"{json.dumps(key)}: ["
            for j, v in enumerate(value):
                yield "  " + json.dumps(v) + ("," if j < len(value) - 1 else "")
            yield "]" + tail
        else:
            yield f"{json.dumps(key)}: {json.dumps(value)}{tail}"
    yield "}"


# -- the text table -----------------------------------------------------------------------------------
def _table(header: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> Iterator[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells):
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return (" - " + "  ".join(parts)).rstrip()

    yield line(header).replace(" - ", "   ", 1)
    for r in rows:
        yield line(r)


def _fmt_list(values) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def graph_table(sel: Selection) -> Iterator[str]:
    """Lines of the graph, headed like ggml_graph_print: nodes, then leafs, in GGML order."""
    refs = sel.refs()
    header = ["index", "op", "name", "type", "ne", "nb", "src", "view_src"]
    g = sel.graph
    shown = "" if len(sel.nodes) == g.n_nodes and len(sel.leafs) == g.n_leafs else \
        f" (showing {len(sel.nodes)} nodes, {len(sel.leafs)} leafs)"
    yield "=== GRAPH ===" + shown
    for kind, entries, total in (("nodes", sel.nodes, g.n_nodes), ("leafs", sel.leafs, g.n_leafs)):
        yield f"n_{kind} = {total}"
        rows = []
        for e in entries:
            r = tensor_record(e, refs)
            srcs = ", ".join("-" if s is None else s for s in r["src"])
            view = "" if r["view_src"] is None else f"{r['view_src']} +{r['view_offs']}"
            rows.append([str(e.index), r["op_desc"], r["name"], r["type"], _fmt_list(r["ne"]),
                         _fmt_list(r["nb"]), srcs, view])
        if rows:
            n_cols = len(header) if kind == "nodes" else 6  # leafs have no sources
            yield from _table(header[:n_cols], [r[:n_cols] for r in rows], right={0})
    yield "=" * 40


# -- DOT -------------------------------------------------------------------------------------------
_DOT_SPECIAL = re.compile(r'([\\"{}|<>])')


def _dot_escape(s: str) -> str:
    """Text inside a record label: escape the characters the record syntax gives meaning to."""
    return _DOT_SPECIAL.sub(r"\\\1", s)


def _dot_ne(t: Tensor) -> str:
    ne = t.ne[:2] if t.is_matrix() else t.ne
    return "[" + ", ".join(str(n) for n in ne) + "]"


def _edge_label(j: int) -> str:
    return {0: "x", 1: "y"}.get(j, f"src {j}")


def graph_dot(sel: Selection) -> Iterator[str]:
    """graphviz DOT after ggml_graph_dump_dot: records for nodes (white; params yellow), pink leafs,
    edges from each source to its node labelled x (src0), y (src1), src 2, ...
    """
    refs = sel.refs()
    shown = {id(e.tensor) for e in sel.nodes + sel.leafs}

    def ident(t: Tensor) -> str:
        e = refs[id(t)]
        return f'"{e.kind}_{e.index}"'

    yield "digraph G {"
    yield "  newrank = true;"
    yield "  rankdir = TB;"
    for e in sel.nodes:
        t = e.tensor
        color = "yellow" if t.flags & FLAG_PARAM else "white"
        name = f"{_dot_escape(t.name)} ({T.type_name(t.type)})" if t.name else f"({T.type_name(t.type)})"
        label = f"{name}|{e.index} {_dot_escape(_dot_ne(t))} | <x>{_dot_escape(t.op_desc)}"
        yield f'  {ident(t)} [ style = filled; fillcolor = {color}; shape = record; label="{label}"; ]'
    for e in sel.leafs:
        t = e.tensor
        name = f"{_dot_escape(t.name)} ({T.type_name(t.type)})" if t.name else f"({T.type_name(t.type)})"
        label = f"<x>{name}|CONST {e.index} {_dot_escape(_dot_ne(t))}"
        yield f'  {ident(t)} [ style = filled; fillcolor = pink; shape = record; label="{label}"; ]'
    for e in sel.nodes:
        for j, s in enumerate(e.tensor.src):
            if s is None or id(s) not in shown:
                continue
            style = "arrowhead = vee; style = solid; " if refs[id(s)].kind == "node" else ""
            yield f'  {ident(s)}:x -> {ident(e.tensor)}:x [ {style}label = "{_edge_label(j)}"; ]'
    yield "}"


# -- plans -----------------------------------------------------------------------------------------
def plan_json(graph: Graph, plan: Plan) -> dict:
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
                     "n_tasks": p.n_tasks, "work_size": p.work_size}
                    for i, p in enumerate(plan.nodes)]
    return doc


def plan_table(graph: Graph, plan: Plan) -> Iterator[str]:
    """Per node n_tasks and work bytes, then the plan's totals and the GGML context size."""
    rows = [[str(i), p.node.op_desc, p.node.name, str(p.n_tasks), str(p.work_size)]
            for i, p in enumerate(plan.nodes)]
    yield "=== PLAN ==="
    yield f"n_nodes = {len(plan.nodes)}"
    if rows:
        yield from _table(["index", "op", "name", "n_tasks", "work_size"], rows, right={0, 3, 4})
    yield f"n_threads = {plan.n_threads} (requested {plan.requested})"
    yield f"work_size = {plan.work_size}"
    yield f"mem_size  = {plan.mem_size(graph)} (GGML context size: tensors, graph and work buffer)"
    a = plan.allocation
    if a is not None:
        n = a.n_intermediates
        yield (f"compute_buffer_size = {a.size} ({a.size / 1024 / 1024:.2f} MiB; ggml_gallocr's buffer for "
               f"{n} intermediate tensor{'' if n == 1 else 's'} of {a.intermediates_size} bytes in all)")
    yield "=" * 40
