"""`ggtool inspect-graph`: a program's graph, nodes and leafs in GGML order, as a table, JSON or DOT."""

from __future__ import annotations

import re
from collections.abc import Iterator

import click

from ggtool.alloc import allocate
from ggtool.context import Context
from ggtool.errors import GGToolError
from ggtool.inspect_graph import Selection, SelectionError, describe_graph, select

from ._common import (
    NUMPY_ORDER_HELP,
    SOURCES_HELP,
    build_graph,
    input_options,
    make_inputs,
    program_options,
    read_program,
    warn_unused,
    write_text,
)
from ._json import record_lines
from ._table import bracketed, ggml_listing

HELP = f"""Show the graph PROGRAM builds, without computing it or reading any tensor data.

Nodes, then leafs, in GGML's order (post-order of build_forward_expand), each with its index,
op, name, type, ne, nb (byte strides), sources and view source, in a table modelled on
ggml_graph_print. --json gives {{"nodes": [...], "leafs": [...]}} (keys index, op, op_desc,
name, type, ne, nb, src, src_refs, view_src, view_offs, flags; op is GGML's name, e.g. MUL_MAT
or UNARY, op_desc names the unary op). --dot gives graphviz DOT modelled on ggml_graph_dump_dot.

\b
Example:
  $ ggtool inspect-graph 'mul_mat(a, b)' --tensor a=f32[2,4] --tensor b=f32[2,3]
  === GRAPH ===
  n_nodes = 1
     index  op       name    type  ne            nb               src   view_src
   -     0  MUL_MAT  node_0  f32   [4, 3, 1, 1]  [4, 16, 48, 48]  a, b
  n_leafs = 2
     index  op    name  type  ne            nb
   -     0  NONE  a     f32   [2, 4, 1, 1]  [4, 8, 32, 32]
   -     1  NONE  b     f32   [2, 3, 1, 1]  [4, 8, 24, 24]
  ========================================

\b
More:
  $ ggtool inspect-graph 'relu(x)' --tensor x='[[1,2,3],[4,5,6]]' --json | jq '.leafs[0].ne'
  [3, 2, 1, 1]        <- numpy shape (2, 3) is GGML ne [3, 2]
  $ ggtool inspect-graph -f llama.gg --gguf model.gguf --dot --only '^blk\\.0\\.' | dot -Tsvg > blk0.svg

--only REGEX keeps the nodes and leafs whose name matches (re.search) plus their direct
sources, so one layer of a big graph renders legibly; indices stay those of the whole graph.

{NUMPY_ORDER_HELP}

{SOURCES_HELP}
"""


@click.command("inspect-graph", help=HELP, short_help="Show a program's graph: nodes and leafs, JSON or DOT.")
@program_options
@input_options
@click.option("--json", "as_json", is_flag=True, help='JSON: {"nodes": [...], "leafs": [...]}.')
@click.option("--dot", "as_dot", is_flag=True, help="graphviz DOT (render with: dot -Tsvg).")
@click.option("--only", metavar="REGEX", help="Only tensors whose name matches REGEX, plus their direct sources.")
def command(program, program_file, output_names, graph_size, max_steps, tensor_sources, gguf_files, as_json, as_dot, only):
    if as_json and as_dot:
        raise click.UsageError("--json and --dot are alternatives; pick one")
    source, filename = read_program(program, program_file)
    inputs = make_inputs(tensor_sources, gguf_files, program_file, read_data=False)
    built = build_graph(source, filename, inputs, Context(measure=True), output_names, graph_size, max_steps)
    warn_unused(inputs)
    try:
        sel = select(built.graph, only)
    except SelectionError as e:
        raise GGToolError(f"--only {e}") from None
    if as_json:
        alloc = allocate(built.graph, [t for _, t in built.outputs])
        write_text(line + "\n" for line in record_lines(describe_graph(sel, alloc)))
    elif as_dot:
        write_text(line + "\n" for line in graph_dot(sel))
    else:
        write_text(line + "\n" for line in graph_table(sel))


# -- the text table, after ggml_graph_print ------------------------------------------------------------
_HEADER = ["index", "op", "name", "type", "ne", "nb", "src", "view_src"]


def graph_table(sel: Selection) -> Iterator[str]:
    """Lines of the graph, headed like ggml_graph_print: nodes, then leafs, in GGML order."""
    doc = describe_graph(sel)
    g = sel.graph
    shown = "" if len(sel.nodes) == g.n_nodes and len(sel.leafs) == g.n_leafs else \
        f" (showing {len(sel.nodes)} nodes, {len(sel.leafs)} leafs)"
    yield "=== GRAPH ===" + shown
    for kind, total in (("nodes", g.n_nodes), ("leafs", g.n_leafs)):
        yield f"n_{kind} = {total}"
        rows = []
        for r in doc[kind]:
            srcs = ", ".join("-" if s is None else s for s in r["src"])
            view = "" if r["view_src"] is None else f"{r['view_src']} +{r['view_offs']}"
            rows.append([str(r["index"]), r["op_desc"], r["name"], r["type"], bracketed(r["ne"]),
                         bracketed(r["nb"]), srcs, view])
        if rows:
            n_cols = len(_HEADER) if kind == "nodes" else 6  # leafs have no sources
            yield from ggml_listing([_HEADER[:n_cols]] + [r[:n_cols] for r in rows], right={0})
    yield "=" * 40


# -- DOT, after ggml_graph_dump_dot ---------------------------------------------------------------------
_DOT_SPECIAL = re.compile(r'([\\"{}|<>])')


def dot_escape(s: str) -> str:
    """Text inside a record label: escape the characters the record syntax gives meaning to."""
    return _DOT_SPECIAL.sub(r"\\\1", s)


def _dot_ne(ne: list[int]) -> str:
    return bracketed(ne[:2] if ne[2] == 1 and ne[3] == 1 else ne)   # a matrix shows two sizes


def _dot_id(ref: str) -> str:
    kind, index = ref.rstrip("]").split("[")   # "nodes[3]" -> "node_3"
    return f'"{kind[:-1]}_{index}"'


def _edge_label(j: int) -> str:
    return {0: "x", 1: "y"}.get(j, f"src {j}")


def graph_dot(sel: Selection) -> Iterator[str]:
    """graphviz DOT after ggml_graph_dump_dot: records for nodes (white; params yellow), pink leafs,
    edges from each source to its node labelled x (src0), y (src1), src 2, ...
    """
    doc = describe_graph(sel)
    shown = {f"{kind}[{r['index']}]" for kind in ("nodes", "leafs") for r in doc[kind]}

    def name(r: dict) -> str:
        return f"{dot_escape(r['name'])} ({r['type']})" if r["name"] else f"({r['type']})"

    yield "digraph G {"
    yield "  newrank = true;"
    yield "  rankdir = TB;"
    for r in doc["nodes"]:
        color = "yellow" if "param" in r["flags"] else "white"
        label = f"{name(r)}|{r['index']} {dot_escape(_dot_ne(r['ne']))} | <x>{dot_escape(r['op_desc'])}"
        ident = _dot_id(f"nodes[{r['index']}]")
        yield f'  {ident} [ style = filled; fillcolor = {color}; shape = record; label="{label}"; ]'
    for r in doc["leafs"]:
        label = f"<x>{name(r)}|CONST {r['index']} {dot_escape(_dot_ne(r['ne']))}"
        ident = _dot_id(f"leafs[{r['index']}]")
        yield f'  {ident} [ style = filled; fillcolor = pink; shape = record; label="{label}"; ]'
    for r in doc["nodes"]:
        ident = _dot_id(f"nodes[{r['index']}]")
        for j, ref in enumerate(r["src_refs"]):
            if ref is None or ref not in shown:
                continue
            style = "arrowhead = vee; style = solid; " if ref.startswith("nodes") else ""
            yield f'  {_dot_id(ref)}:x -> {ident}:x [ {style}label = "{_edge_label(j)}"; ]'
    yield "}"
