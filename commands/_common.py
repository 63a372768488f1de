"""Options and helpers shared by the subcommands: the program, its inputs, threads, output streams."""

from __future__ import annotations

import errno
import io
import sys
import time
from collections.abc import Iterable

import click

from ggtool.context import Context
from ggtool.errors import GGToolError
from ggtool.tensor_io import Inputs, SourceSyntaxError, parse_named_source
from ggtool.threads import THREADS_ENV

from ._streams import read_stdin
from .wording import cli_message

UNUSED_SHOWN = 5   # unused GGUF tensors a warning names

NUMPY_ORDER_HELP = """\
Shapes: numpy shape (d3, d2, d1, d0) is GGML ne = [d0, d1, d2, d3]. The JSON [[1,2,3],[4,5,6]] is
numpy shape (2, 3), i.e. 2 rows of 3, and becomes a tensor with ne = [3, 2]. Shape-only sources
(f32[3,2]) and everything ggtool prints as ne are in GGML order; JSON and .npy data are in numpy
order."""

def _wrapped_types() -> str:
    """The types mul_mat multiplies as they are (ggtool.tensor_io.mmap_types: the registry's included),
    by name, wrapped as the help's lines."""
    import textwrap

    from ggtool import types as T
    from ggtool.tensor_io import mmap_types

    names = " ".join(T.type_name(t) for t in mmap_types() if t not in (T.F32, T.F16, T.I32))
    return "\n".join(textwrap.wrap(names, 96))


# For the commands that read files only (no --tensor: no JSON, no shape-only sources), what they print
# as ne; NPY_ORDER_HELP adds what a .npy file's shape means, for those that read one.
GGML_ORDER_HELP = """\
Shapes: numpy shape (d3, d2, d1, d0) is GGML ne = [d0, d1, d2, d3]: everything ggtool prints as ne is
in GGML order, ne0 first."""
NPY_ORDER_HELP = GGML_ORDER_HELP + """ A .npy array is in numpy order: shape (2, 3), 2 rows of 3, is a
tensor with ne = [3, 2]."""

SOURCES_HELP = f"""\
Tensor sources (--tensor NAME=SOURCE, repeatable):

\b
  w.npy                  a .npy file (no pickles); float32/float16/int32 kept,
                         float64 -> f32, other integers -> i32
  '[[1,2],[3,4]]'        inline JSON, rectangular; f32 unless prefixed
  model.gguf:TENSOR      one tensor of a GGUF file
  -                      stdin: a .npy stream or JSON (detected); one input at most
  f32[4,3]               a shape only (GGML order ne0,ne1,...), zero-filled
  i32:[1,2,3]            a type prefix converts on load: f32 f16 bf16 i32 q4_0 q8_0
  q4_0:model.gguf:TENSOR   (also f16:w.npy, ...)
  text:'Once upon a time'  the text's token ids (i32) in the --gguf model's vocabulary

--gguf FILE makes every tensor of FILE available under its own name (memory-mapped, read only
if the program uses it). A --tensor name shadows a --gguf tensor; a name found in two --gguf
files is an error when used. GGUF tensors are used in place, as their own type (f32, f16, i32
and the types mul_mat multiplies:
{_wrapped_types()});
a type ggtool does not compute with (nvfp4, q1_0, i8, f64, ...) is an error unless a prefix asks
for the conversion (f32:model.gguf:TENSOR)."""


# -- options ----------------------------------------------------------------------------------------
def _parse_named_sources(ctx, param, values):
    try:
        return [parse_named_source(v) for v in values]
    except SourceSyntaxError as e:
        raise click.BadParameter(cli_message(e), ctx=ctx, param=param) from None


# -f FILE: a path ('-': stdin), read by read_program (bounded, through _streams for stdin)
PROGRAM_FILE = click.Path(exists=True, dir_okay=False, allow_dash=True)


def program_options(f):
    """PROGRAM (or -f FILE / -f -), --output NAME, --graph-size and --max-steps."""
    # the default is ggtool.dsl.limits.MAX_STEPS, not imported here: the DSL loads when a program runs
    f = click.option("--max-steps", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Stop the program with an error after N steps, statements run and loop iterations "
                          "(default 1000000).")(f)
    f = click.option("--graph-size", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Graph size (max nodes, and max leafs); default GGML's 2048, grown if the program "
                          "needs more.")(f)
    f = click.option("--output", "output_names", multiple=True, metavar="NAME",
                     help="Output this tensor: a variable or input name (repeatable); default: the program's last "
                          "statement.")(f)
    f = click.option("-f", "--file", "program_file", type=PROGRAM_FILE,
                     help="Read the program from FILE ('-' for stdin) instead of PROGRAM.")(f)
    return click.argument("program", required=False)(f)


def input_options(f):
    """--tensor NAME=SOURCE and --gguf FILE (both repeatable)."""
    f = click.option("--gguf", "gguf_files", multiple=True, metavar="FILE",
                     type=click.Path(exists=True, dir_okay=False),
                     help="Make every tensor of this GGUF file available by its name (repeatable).")(f)
    return click.option("--tensor", "tensor_sources", multiple=True, metavar="NAME=SOURCE",
                        callback=_parse_named_sources,
                        help="An input tensor (repeatable); SOURCE forms are listed below.")(f)


BY_THE_WORK = "the count fastest for the graph's work among the free CPUs (`ggtool plan` says why)"   # ggtool.threads.choose


def threads_option(f=None, *, help: str = "Threads (GGML's n_threads): participants in the compute, "
                   "this process and N-1 worker processes; by default a small graph computes in this process.",
                   default: str = BY_THE_WORK):
    """--threads N; None when neither it nor GGTOOL_THREADS is given (then ggtool.threads.default_threads)."""
    option = click.option("--threads", "-t", "n_threads", type=click.IntRange(min=1), default=None,
                          envvar=THREADS_ENV, show_envvar=True, show_default=default, metavar="N", help=help)
    return option(f) if f is not None else option


NUMERICS_HELP = ("Order of float sums: GGML's reference (ggml), or a llama.cpp x86-64 build's, its exact "
                 "logits: llama.cpp is the build this CPU's flags make (llama.cpp-avx512 or llama.cpp-avx2); "
                 "x86 is llama.cpp-avx512.")


def numerics_option(f):
    """--numerics NAME (ggtool.kernels.numerics.NAMES)."""
    from ggtool.kernels.numerics import NAMES

    return click.option("--numerics", type=click.Choice(NAMES), default="ggml", show_default=True,
                        help=NUMERICS_HELP)(f)


def pick_numerics(name: str, verbose: bool) -> str:
    """The numerics the kernels will run for --numerics `name` (an error now, before any loading, if
    llama.cpp has no build ggtool follows on this CPU); with -v, which llama.cpp build that is."""
    from ggtool.kernels.numerics import host_flags, resolve

    resolved = resolve(name, host_flags())
    if verbose and resolved != name:
        log(f"numerics {name}: {resolved}" + (" (this CPU's llama.cpp build)" if name == "llama.cpp" else ""))
    return resolved


def warn_llama_cpp_gaps(gaps, numerics: str) -> None:
    """--numerics llama.cpp* (or x86) on a graph with nodes it has no llama.cpp order for
    (``ggtool.ops.llama_cpp_gaps``): one line on stderr saying which."""
    from ggtool.ops.matmul import x86_covered

    if not gaps:
        return
    parts = []
    for gap in gaps:
        n = len(gap.nodes)
        what = f"{gap.op.lower()} node{'' if n == 1 else 's'}"
        if gap.weight_type is not None:
            what += f" with {gap.weight_type} weights"
        parts.append(f"{n} {what} (first: '{gap.nodes[0].name}')")
    one = len(gaps) == 1 and len(gaps[0].nodes) == 1
    log(f"Warning: --numerics {numerics} follows llama.cpp's order for mul_mat with {x86_covered()} weights, "
        f"soft_max, rope, gelu and silu; {', '.join(parts)} {'computes' if one else 'compute'} in GGML's order and may "
        f"differ from llama.cpp's in the last bits")


# -- the program and its inputs ---------------------------------------------------------------------------
def read_program(program: str | None, program_file: str | None) -> tuple[str, str]:
    """(source, filename) from PROGRAM or -f FILE (a path, '-' for stdin); exactly one must be given."""
    if program is not None and program_file is not None:
        raise click.UsageError("give the program either as PROGRAM or with -f FILE, not both")
    if program_file is not None:
        from ggtool.dsl.limits import MAX_SOURCE_BYTES

        if _is_stdin(program_file):
            name, raw = "<stdin>", read_stdin("the program", MAX_SOURCE_BYTES)
        else:
            name = program_file
            try:
                with open(program_file, "rb") as f:
                    raw = f.read(MAX_SOURCE_BYTES + 1)   # never more: -f /dev/zero
            except OSError as e:
                raise GGToolError(f"{name}: {e.strerror or e}") from None
        if len(raw) > MAX_SOURCE_BYTES:
            raise GGToolError(f"{name}: a program is at most {MAX_SOURCE_BYTES} bytes; this one is larger")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGToolError(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        return text.replace("\r\n", "\n").replace("\r", "\n"), name   # as a text file reads it
    if program is None:
        raise click.UsageError("no program: give it as PROGRAM (e.g. 'mul_mat(a, b)') or with -f FILE")
    return program, "<program>"


def _is_stdin(program_file: str) -> bool:
    return program_file == "-"


def make_inputs(tensor_sources, gguf_files, program_file=None, read_data: bool = True,
                verbose: bool = False) -> Inputs:
    """The DSL environment. stdin may feed the program (-f -) or one tensor, not both."""
    reads_stdin = [s.name for s in tensor_sources if s.kind == "stdin"]
    if reads_stdin and program_file is not None and _is_stdin(program_file):
        raise click.UsageError(f"-f - and --tensor {reads_stdin[0]}=- both read stdin; save one of them to a file")
    on_load = (lambda name, what: log(f"load {name}: {what}")) if verbose else None
    stdin = io.BytesIO(read_stdin(f"--tensor {reads_stdin[0]}")) if reads_stdin else None
    try:
        return Inputs(tensor_sources, gguf_files, stdin=stdin, read_data=read_data, on_load=on_load)
    except SourceSyntaxError as e:
        raise click.UsageError(cli_message(e)) from None


def build_graph(source: str, filename: str, inputs: Inputs, ctx: Context, output_names=(),
                graph_size: int | None = None, max_steps: int | None = None):
    """Parse and build the program in `ctx`; returns the DSL's Built (graph, outputs, tensors).
    max_steps None is the DSL's own limit (ggtool.dsl.limits.MAX_STEPS). Its errors reach the
    user through wording.cli_message, which adds the flags that fix them."""
    from ggtool.dsl import build, parse
    from ggtool.dsl.limits import MAX_STEPS

    program = parse(source, filename=filename)
    built = build(program, ctx, inputs, outputs=list(output_names) or None, graph_size=graph_size,
                  max_steps=MAX_STEPS if max_steps is None else max_steps)
    for note in built.notes:
        log(f"Note: {note}")
    return built


def warn_unused(inputs: Inputs) -> None:
    """A warning for each --tensor the program never used, and one line for the weights of the
    --gguf files it never used (a program for another model would otherwise pass quietly)."""
    for name in inputs.unused():
        log(f"Warning: --tensor {name} is not used by the program")
    weights = inputs.unused_weights()
    if weights:
        files = sorted({path for _, path in weights})
        where = f"--gguf {files[0]}" if len(files) == 1 else "the --gguf files"
        names = ", ".join(n for n, _ in weights[:UNUSED_SHOWN])
        more = f", ... ({len(weights) - UNUSED_SHOWN} more)" if len(weights) > UNUSED_SHOWN else ""
        s = "" if len(weights) == 1 else "s"
        log(f"Warning: the program does not use {len(weights)} tensor{s} of {where}: {names}{more}")


def open_pool(n_threads: int):
    """The process-wide worker pool for n_threads participants, or None to compute in this
    process. Workers start in the background; the first compute waits for them."""
    if n_threads <= 1:
        return None
    from ggtool.pool import get_pool

    return get_pool(n_threads)


# -- streams ------------------------------------------------------------------------------------------------
def log(message: str) -> None:
    """Diagnostics go to stderr; stdout carries data only."""
    click.echo(message, err=True)


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()


def refuse_binary_to_tty(fmt: str) -> None:
    if stdout_is_tty():
        raise click.UsageError(f"refusing to write {fmt} bytes to a terminal; redirect stdout "
                               f"(> out.{fmt}, | ggtool ...) or use -o FILE")


def write_text(chunks: Iterable[str]) -> None:
    out = sys.stdout
    for c in chunks:
        out.write(c)
    out.flush()


def _binary(stream):
    """The byte stream under a text stream (sys.stdin.buffer), or the stream if it is one already."""
    return getattr(stream, "buffer", stream)


class _ByteWriter:
    """stdout's bytes, written with plain write() calls. numpy writes an array to a real file with
    C's fwrite (`tofile`), whose failure on a closed pipe is an OSError without errno ("131072
    requested and 15360 written"); through write() it is a BrokenPipeError, which the command
    line ends quietly (exit 141)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, data) -> int:
        # A raw stream (stdout under PYTHONUNBUFFERED or -u) may write less than asked: a pipe
        # whose reader left mid-write. Write the rest, so that the next write reports EPIPE
        # instead of the output being cut short in silence.
        view = memoryview(data).cast("B")
        total = len(view)
        while view:
            n = self._stream.write(view)
            if n is None:   # pragma: no cover (a non-blocking stdout that would block)
                raise BlockingIOError(errno.EAGAIN, "stdout would block")
            view = view[n:]
        return total

    def flush(self) -> None:
        self._stream.flush()


def binary_stdout():
    """stdout for bytes (.npy, .gguf); text written before is flushed first."""
    sys.stdout.flush()
    return _ByteWriter(_binary(sys.stdout))


class Timer:
    """Wall-clock phases, reported on stderr with --time."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.phases: list[tuple[str, float]] = []
        self._t = time.perf_counter()

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases.append((phase, now - self._t))
        self._t = now

    def report(self) -> None:
        if self.enabled:
            total = sum(s for _, s in self.phases)
            parts = ", ".join(f"{p} {s * 1000:.1f} ms" for p, s in self.phases)
            log(f"time: {parts} (total {total * 1000:.1f} ms)")


# -- clusters ---------------------------------------------------------------------------------------------
def ray_options(f):
    """--ray ADDRESS (or RAY_ADDRESS) and --ray-ship, for the commands whose work splits into tasks."""
    f = click.option("--ray-ship", "ray_ship", type=click.Choice(["auto", "shared", "ship"]), default="auto",
                     show_default=True,
                     help="How files reach the Ray nodes: asked per node (auto), a shared file system, or Ray's object store.")(f)
    return click.option("--ray", "ray_address", metavar="ADDRESS", envvar="RAY_ADDRESS", show_envvar=True, default=None,
                        help="Run each chunk as a task on the Ray cluster at HOST:PORT (pip install 'ggtool[cluster]').")(f)


def open_cluster(address: str | None, ship: str, command: str):
    """The Ray executor for --ray ADDRESS, or None (ggtool.evaluate.cluster: Ray imported only there)."""
    from ggtool.evaluate.cluster import executor_for

    ex = executor_for(address, ship=ship)
    if ex is not None:
        log(f"{command}: on the Ray cluster at {address} ({ex.workers} CPU{'' if ex.workers == 1 else 's'})")
    return ex
