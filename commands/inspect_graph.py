"""`ggtool inspect-graph`: a program's graph, nodes and leafs in GGML order, as a table, JSON or DOT."""

from __future__ import annotations

import click

from ggtool.alloc import allocate
from ggtool.context import Context
from ggtool.inspect_graph import graph_dot, graph_json, graph_table, json_text, select

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
    sel = select(built.graph, only)
    if as_json:
        alloc = allocate(built.graph, [t for _, t in built.outputs])
        write_text(line + "\n" for line in json_text(graph_json(sel, alloc)))
    elif as_dot:
        write_text(line + "\n" for line in graph_dot(sel))
    else:
        write_text(line + "\n" for line in graph_table(sel))
