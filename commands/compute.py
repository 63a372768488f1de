"""`ggtool compute`: build a program's graph over the given tensors, compute it, write the outputs."""

from __future__ import annotations

import os

import click

from ggtool.context import Context
from ggtool.plan import estimate_work
from ggtool.tensor_io import (
    FORMATS,
    copy_gguf,
    format_for_path,
    tensor_array,
    write_gguf_atomic,
    write_npy,
    write_npy_atomic,
    write_text_atomic,
)
from ggtool.threads import default_threads

from ._common import (
    NUMPY_ORDER_HELP,
    SOURCES_HELP,
    Timer,
    binary_stdout,
    build_graph,
    input_options,
    log,
    make_inputs,
    numerics_option,
    open_pool,
    pick_numerics,
    program_options,
    read_program,
    refuse_binary_to_tty,
    threads_option,
    warn_llama_cpp_gaps,
    warn_unused,
    write_text,
)
from ._json import arrays_document
from ._progress import compute_progress

HELP = f"""Compute PROGRAM and print its outputs (JSON in numpy order by default).

\b
Example: GGML's seed example. mul_mat(a, b) dots every row of b with every row of a:
  $ ggtool compute 'mul_mat(a, b)' \\
        --tensor a='[[2,8],[5,1],[4,2],[8,6]]' --tensor b='[[10,5],[9,9],[5,4]]'
  [[60,55,50,110],[90,54,54,126],[42,29,28,64]]

a is numpy shape (4, 2), GGML ne = [2, 4]; b is (3, 2), ne = [2, 3]; the result has ne = [4, 3]
and prints as numpy shape (3, 4): the numpy b @ a.T.

\b
More:
  $ ggtool compute 'relu(x)' --tensor x=w.npy -o y.npy
  $ ggtool compute -f model.gg --gguf model.gguf --tensor tok=i32:[1,2,3] -o out.gguf
  $ ggtool compute 'mul_mat(a, b)' --tensor a=a.npy --tensor b=b.npy --format npy \\
        | ggtool compute 'relu(x)' --tensor x=-

Outputs: one output prints as a bare array; several as {{"name": array, ...}}. -o FILE takes
its format from the extension (.json, .npy for one output, .gguf for all outputs as named
tensors) and is replaced atomically: a failed run leaves no file (a symlink's target is replaced,
the link kept; a FIFO or a device such as /dev/null is written in place). --format npy|gguf to stdout
is refused when stdout is a terminal. JSON writes NaN and infinities as the strings "NaN",
"Infinity" and "-Infinity" (strict JSON; --tensor reads them back). A compute that runs over a
second shows a progress bar in nodes on stderr when stderr is a terminal.

--alloc graph (the default) computes as GGML programs that use its graph allocator do: the
intermediates share one compute buffer (ggml_gallocr's plan, the size `ggtool plan` reports),
each place reused once its tensor's last consumer has run. --alloc context gives every tensor
memory of its own for the whole run (GGML's context mode). The results are byte-identical.

--numerics ggml (the default) sums as GGML's reference code does. --numerics llama.cpp sums mul_mat
(every weight type: F32, F16, BF16, Q4_0 ... Q8_0, IQ4_NL, Q2_K ... Q6_K), soft_max, rope, gelu and
silu in the order of the llama.cpp x86-64 CPU build this CPU's flags make (llamafile's tinyBLAS, the
repacked Q4_0/Q4_K/IQ4_NL kernels, the tiled K-quant kernel, the vec_dots, and AVX-512's 16-float lanes
or AVX2's 8): gemma-3's and stories260K's logits then equal that build's bit for bit
(docs/gemma.md, docs/engine.md). llama.cpp-avx512 and llama.cpp-avx2 name a build whatever the CPU; x86 is
llama.cpp-avx512. A node it had no llama.cpp order for would sum as by default, with a warning. Its
products are slower than the default's on large matrices (about the
same time for a whole gemma-3-270m pass).

{NUMPY_ORDER_HELP}

{SOURCES_HELP}
"""


@click.command("compute", help=HELP, short_help="Compute a program and print or save its outputs.")
@program_options
@input_options
@threads_option
@click.option("-o", "--out", "out_path", type=click.Path(dir_okay=False, allow_dash=True), metavar="FILE",
              help="Write the outputs to FILE (.json, .npy or .gguf; '-' for stdout).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="Output format (default: from -o's extension, else json).")
@click.option("--alloc", "alloc", type=click.Choice(["graph", "context"]), default="graph", show_default=True,
              help="graph: intermediates share ggml_gallocr's compute buffer; context: each keeps its own memory.")
@numerics_option
@click.option("--time", "show_time", is_flag=True, help="Report timings on stderr.")
@click.option("-v", "--verbose", is_flag=True, help="Report loads and timings on stderr.")
def command(program, program_file, output_names, graph_size, max_steps, tensor_sources, gguf_files, n_threads,
            out_path, fmt, alloc, numerics, show_time, verbose):
    timer = Timer(show_time or verbose)
    resolved = pick_numerics(numerics, verbose)
    to_file = out_path is not None and out_path != "-"
    fmt = resolve_format(out_path, fmt)
    if not to_file and fmt != "json":
        refuse_binary_to_tty(fmt)

    early_pool = None
    if n_threads is not None and n_threads > 1:
        early_pool = open_pool(n_threads)  # workers start while the inputs load and the graph builds
    source, filename = read_program(program, program_file)
    inputs = make_inputs(tensor_sources, gguf_files, program_file, read_data=True, verbose=verbose)
    if early_pool is not None and inputs.quantized():
        early_pool.preload_kernels()   # the workers load the compiled kernels while the graph builds
    if to_file:
        check_destination(out_path, inputs.files())
    ctx = Context()
    built = build_graph(source, filename, inputs, ctx, output_names, graph_size, max_steps)
    warn_unused(inputs)
    outputs = list(built.outputs)
    if fmt == "npy" and len(outputs) != 1:
        names = ", ".join(n for n, _ in outputs)
        raise click.UsageError(f"a .npy holds one array but the program has {len(outputs)} outputs ({names}); "
                               "pick one with --output NAME, or use .json or .gguf")
    if resolved != "ggml":
        from ggtool.ops import llama_cpp_gaps

        warn_llama_cpp_gaps(llama_cpp_gaps(built.graph.nodes), numerics)
    timer.mark("build")

    if n_threads is None:   # not given: the engine's default for a graph of this size
        n_threads = default_threads(estimate_work(built.graph))
    pool = open_pool(n_threads)
    from ggtool.compute import graph_compute

    with compute_progress(built.graph.n_nodes) as progress:
        plan = graph_compute(built.graph, n_threads, pool=pool, progress=progress, alloc=alloc,
                             outputs=[t for _, t in outputs], numerics=resolved)
    timer.mark("compute")
    if verbose:
        buffer = "" if plan.allocation is None else f", compute buffer {plan.allocation.size} bytes"
        log(f"computed {built.graph.n_nodes} nodes with {plan.n_threads} threads "
            f"(work buffer {plan.work_size} bytes{buffer}, GGML context {plan.mem_size(built.graph)} bytes)")

    write_outputs(outputs, fmt, out_path if to_file else None, source)
    timer.mark("write")
    if verbose and to_file:
        log(f"wrote {out_path} ({fmt}, {len(outputs)} output{'s' if len(outputs) != 1 else ''})")
    timer.report()


def resolve_format(out_path: str | None, fmt: str | None) -> str:
    if fmt is not None:
        return fmt
    if out_path is None or out_path == "-":
        return "json"
    guessed = format_for_path(out_path)
    if guessed is None:
        raise click.UsageError(f"cannot tell the format of -o {out_path} from its extension; "
                               "name it .json, .npy or .gguf, or pass --format")
    return guessed


def check_destination(out_path: str, input_files: list[str]) -> None:
    """Fail before computing if the output cannot be written or would replace an input."""
    directory = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(directory):
        raise click.UsageError(f"cannot write -o {out_path}: directory {directory} does not exist")
    if os.path.realpath(out_path) in input_files:
        raise click.UsageError(f"-o {out_path} is also an input; write the result to another file")


def write_outputs(outputs, fmt: str, path: str | None, source: str) -> None:
    """Write (name, Tensor) outputs as fmt to `path`, or to stdout when path is None."""
    if fmt == "gguf":
        metadata = {"ggtool.program": source}
        if path is not None:
            write_gguf_atomic(path, outputs, metadata)
        else:
            copy_gguf(binary_stdout(), outputs, metadata)
        return
    named = [(name, tensor_array(t)) for name, t in outputs]
    if fmt == "npy":
        if path is not None:
            write_npy_atomic(path, named[0][1])
        else:
            out = binary_stdout()
            write_npy(out, named[0][1])
            out.flush()
        return
    if path is not None:
        write_text_atomic(path, arrays_document(named))
    else:
        write_text(arrays_document(named))
