"""`ggtool plan`: ggml_graph_plan for a program: per-node tasks and work, threads, work and context size,
and the compute buffer ggml_gallocr would plan."""

from __future__ import annotations

from collections.abc import Iterator

import click

from ggtool.context import Context
from ggtool.inspect_graph import describe_plan
from ggtool.plan import Plan, estimate_work, make_plan
from ggtool.threads import THREADS_ENV, choose

from ._common import (
    NUMPY_ORDER_HELP,
    SOURCES_HELP,
    build_graph,
    input_options,
    make_inputs,
    program_options,
    read_program,
    threads_option,
    warn_unused,
    write_text,
)
from ._json import record_lines
from ._table import ggml_listing

HELP = f"""Plan PROGRAM as ggml_graph_plan would, without computing it or reading tensor data.

Per node: n_tasks (ggml_graph_plan's count of the threads that work on it), its work buffer
bytes, and split: who computes it at run time, where every node runs on every thread as in
GGML: "all" (each thread its share of the rows, whatever n_tasks says), "one" (thread 0
alone) or "-" (a view: nothing to compute). Then
n_threads (the requested threads capped at the largest n_tasks), work_size (the largest
node's work plus a cache line per thread), mem_size: the GGML context size a C program
needs for the tensors, the graph and the work buffer (memory-mapped GGUF data counted as if
it lived in the context), and compute_buffer_size: the compute buffer GGML's graph allocator
(ggml_gallocr) plans, where intermediates reuse memory once their last consumer has run, as
llama.cpp logs it ("compute buffer size"), next to what the intermediates take on their own.
--json: {{"n_threads", "work_size", "mem_size", "compute_buffer_size", "intermediates_size",
"requested", "threads_why", "nodes": [{{"index", "op", "op_desc", "name", "n_tasks", "work_size", "split"}}, ...]}}.

Without --threads (or GGTOOL_THREADS), the thread count is ggtool's default for this graph, and a
`threads =` line says why: the count its cost model finds fastest for the graph's work (the
weights it streams, its arithmetic, the barriers between its nodes) among the CPUs free now.

\b
Example:
  $ ggtool plan 'mul_mat(w, x)' --tensor w=q4_0[64,64] --tensor x=f32[64,8] --threads 4
  === PLAN ===
  n_nodes = 1
     index  op       name    n_tasks  work_size  split
   -     0  MUL_MAT  node_0        4        544  all
  n_threads = 4 (requested 4)
  work_size = 800
  mem_size  = 74528 (GGML context size: tensors, graph and work buffer)
  compute_buffer_size = 2048 (0.00 MiB; ggml_gallocr's buffer for 1 intermediate tensor of 2048 bytes in all)
  ========================================

q4_0 weights make mul_mat convert x to q8_0 in the work buffer (544 bytes), plus a cache
line per thread.

\b
More:
  $ ggtool plan -f model.gg --gguf model.gguf --threads 8 --json | jq .mem_size

{NUMPY_ORDER_HELP}

{SOURCES_HELP}
"""


@click.command("plan", help=HELP, short_help="Plan a program: n_tasks and work per node, threads, sizes.")
@program_options
@input_options
@threads_option(help="Threads to plan for (GGML's n_threads passed to ggml_graph_plan); by default, "
                "those compute would use for this graph.")
@click.option("--json", "as_json", is_flag=True,
              help="JSON with n_threads, work_size, mem_size, compute_buffer_size and nodes.")
def command(program, program_file, output_names, graph_size, max_steps, tensor_sources, gguf_files, n_threads, as_json):
    source, filename = read_program(program, program_file)
    inputs = make_inputs(tensor_sources, gguf_files, program_file, read_data=False)
    built = build_graph(source, filename, inputs, Context(measure=True), output_names, graph_size, max_steps)
    warn_unused(inputs)
    given = n_threads is not None     # --threads N, or GGTOOL_THREADS (the option's envvar)
    if given:
        why = f"{n_threads} given (--threads or {THREADS_ENV})"
    else:
        choice = choose(estimate_work(built.graph))
        n_threads, why = choice.n, choice.reason
    plan = make_plan(built.graph, n_threads)
    plan.allocate(built.graph, [t for _, t in built.outputs])
    if as_json:
        doc = describe_plan(built.graph, plan)
        nodes = doc.pop("nodes")
        doc["threads_why"] = why
        doc["nodes"] = nodes
        write_text(line + "\n" for line in record_lines(doc))
    else:
        write_text(line + "\n" for line in plan_table(built.graph, plan, None if given else why))


def plan_table(graph, plan: Plan, why: str | None = None) -> Iterator[str]:
    """Per node n_tasks and work bytes, then the plan's totals and the GGML context size."""
    rows = [[str(i), p.node.op_desc, p.node.name, str(p.n_tasks), str(p.work_size), p.split]
            for i, p in enumerate(plan.nodes)]
    yield "=== PLAN ==="
    yield f"n_nodes = {len(plan.nodes)}"
    if rows:
        yield from ggml_listing([["index", "op", "name", "n_tasks", "work_size", "split"], *rows], right={0, 3, 4})
    yield f"n_threads = {plan.n_threads} (requested {plan.requested})"
    if why:
        yield f"threads   = {why}"
    yield f"work_size = {plan.work_size}"
    yield f"mem_size  = {plan.mem_size(graph)} (GGML context size: tensors, graph and work buffer)"
    a = plan.allocation
    if a is not None:
        n = a.n_intermediates
        yield (f"compute_buffer_size = {a.size} ({a.size / 1024 / 1024:.2f} MiB; ggml_gallocr's buffer for "
               f"{n} intermediate tensor{'' if n == 1 else 's'} of {a.intermediates_size} bytes in all)")
    yield "=" * 40
