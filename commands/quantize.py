"""`ggtool quantize INPUT OUTPUT`: a GGUF model (or .npy array) to a Q4_0/Q8_0 GGUF (or a pure
Q4_K/Q5_K/Q6_K one), as llama-quantize."""

from __future__ import annotations

import sys

import click

from ggtool import quantize_model as QM
from ggtool import types as T
from ggtool.threads import default_threads

from ._common import NPY_ORDER_HELP, log
from ._progress import progress_bar

HELP = f"""Quantize a GGUF model (or a .npy array) to a Q4_0 or Q8_0 GGUF file, as llama-quantize does
(or, with --pure, every weight to q4_K, q5_K or q6_K).

INPUT is a GGUF file with tensors of any type gguf-py can dequantize (f32, f16, bf16, q8_0, q4_K,
q5_0, q6_K, ...) or a .npy float array; OUTPUT is the GGUF file to write. A model split by
gguf-split is given by its first shard (model-00001-of-00003.gguf): every shard beside it is
read, and OUTPUT is one file, or with --keep-split as many shards as the input has
(OUTPUT out.gguf: out-00001-of-00003.gguf, ...), the same tensors in each, as llama-quantize.

\b
llama.cpp's rules for the Q4_0 (or Q8_0) file type:
  - only tensors named *weight with 2+ dims are quantized, never *_norm.weight;
    1-D tensors are copied as they are
  - rows that are not a multiple of 32 become f16
  - default mode: output.weight (token_embd.weight when the output is tied to it)
    gets q8_0 where llama.cpp gives it q8_0 (row not a multiple of 256); where
    llama.cpp writes q6_K, ggtool writes q8_0 and says so (no q6_K here yet)
  - a tensor whose chosen type is its source type is copied byte for byte
  - a tensor that is already quantized (q4_K, q5_0, ...) is not quantized again
    unless --allow-requantize (llama-quantize's rule and flag)
  - all metadata is copied; general.file_type and general.quantization_version
    are set as llama.cpp sets them
With --pure, --type also takes q4_K, q5_K and q6_K (llama-quantize --pure with Q4_K, Q5_K or
Q6_K): every eligible tensor gets the type, GGML's reference quantizer bit for bit; a row that is
not a multiple of 256 falls back as llama.cpp's does (q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0,
else f16). Their per-tensor mixes (Q4_K_M, ...) are not built yet.
Source tensors are dequantized to f32 exactly as gguf-py's dequantize does, so every Q4_0
tensor is byte-identical to llama.cpp's for the same source and mode.

The output is written to a temporary file beside OUTPUT and renamed at the end: an error or
Ctrl-C leaves no partial file (a symlink's target is replaced, the link kept; a FIFO or a device
is written in place). One line per tensor goes to stderr (--quiet silences it), with
a progress bar in bytes when stderr is a terminal, then a summary.

\b
Examples:
  $ ggtool quantize model-f16.gguf model-q4_0.gguf
  $ ggtool quantize model.gguf model-q8_0.gguf --type q8_0 --threads 4
  $ ggtool quantize model.gguf out.gguf --pure --dry-run
  $ ggtool quantize w.npy w-q4_0.gguf --name blk.0.ffn_up.weight
  $ ggtool quantize model-Q4_K_M.gguf model-q4_0.gguf --allow-requantize
  $ ggtool quantize model-f16-00001-of-00003.gguf model-q4_0.gguf --keep-split
  $ ggtool compare model.gguf model-q4_0.gguf     # what Q4_0 cost, per tensor

{NPY_ORDER_HELP}
"""


def _target_type(ctx, param, value):
    if value is None:
        return None
    try:
        return QM.parse_target_type(value)
    except QM.TargetTypeError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


def _shape(ne) -> str:
    ne = list(ne) + [1] * (4 - len(ne))
    return ", ".join(f"{n:5d}" for n in ne)


def _mib(n: int) -> float:
    return n / 1024.0 / 1024.0


def tensor_line(t: QM.TensorPlan, n: int) -> str:
    """llama-quantize's per-tensor line."""
    head = f"[{t.index + 1:4d}/{n:4d}] {t.name:>36s} - [{_shape(t.ne)}], type = {T.type_name(t.src_type):>6s}, "
    if t.copy:
        return head + f"size = {_mib(t.src_bytes):8.3f} MiB"
    return head + (f"converting to {T.type_name(t.dst_type)} .. "
                   f"size = {_mib(t.src_bytes):8.2f} MiB -> {_mib(t.dst_bytes):8.2f} MiB")


def _bpw(nbytes: int, n: int) -> float:
    return nbytes * 8.0 / n if n else 0.0


def summary_lines(plan: QM.QuantizePlan) -> list[str]:
    n = plan.n_elements
    return [f"model size  = {_mib(plan.src_bytes):8.2f} MiB ({_bpw(plan.src_bytes, n):.2f} bits per weight)",
            f"quant size  = {_mib(plan.dst_bytes):8.2f} MiB ({_bpw(plan.dst_bytes, n):.2f} bits per weight)"]


@click.command("quantize", help=HELP, short_help="Quantize a GGUF model or .npy array to Q4_0/Q8_0 (llama-quantize rules), or K-quants with --pure.")
@click.argument("input_path", metavar="INPUT", type=click.Path(exists=True, dir_okay=False))
@click.argument("output_path", metavar="OUTPUT", type=click.Path(dir_okay=False))
@click.option("--type", "qtype", type=click.Choice(["q4_0", "q8_0", "q4_K", "q5_K", "q6_K"], case_sensitive=False),
              default="q4_0", show_default=True, help="Target type (the file type; the K types with --pure only).")
@click.option("--pure", is_flag=True, help="Every eligible weight gets --type (no output/embedding rules).")
@click.option("--leave-output-tensor", is_flag=True, help="Copy output.weight unchanged.")
@click.option("--output-tensor-type", metavar="TYPE", callback=_target_type,
              help="Type for output.weight (f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0).")
@click.option("--token-embedding-type", metavar="TYPE", callback=_target_type,
              help="Type for token_embd.weight (same choices).")
@click.option("--threads", "-t", "n_threads", type=click.IntRange(min=1), default=default_threads,
              envvar="GGTOOL_THREADS", show_envvar=True, show_default="the CPUs this process may use", metavar="N",
              help="Threads converting pieces of tensors side by side (the compiled kernels release the GIL).")
@click.option("--keep-split", is_flag=True,
              help="A split INPUT gives as many OUTPUT shards, each with the same tensors as its input shard.")
@click.option("--allow-requantize", is_flag=True,
              help="Quantize tensors that are already quantized (each rounding adds to the last).")
@click.option("--name", "tensor_name", metavar="NAME", help="Tensor name for a .npy INPUT (default: its file stem).")
@click.option("--force", is_flag=True, help="Overwrite an existing OUTPUT.")
@click.option("--dry-run", is_flag=True, help="Print the plan and sizes (stdout); write nothing.")
@click.option("--quiet", "-q", is_flag=True, help="No per-tensor lines, no progress bar, no summary.")
def command(input_path, output_path, qtype, pure, leave_output_tensor, output_tensor_type, token_embedding_type,
            n_threads, keep_split, allow_requantize, tensor_name, force, dry_run, quiet):
    opts = QM.QuantizeOptions(type=T.parse_type(qtype), pure=pure, leave_output_tensor=leave_output_tensor,
                              output_tensor_type=output_tensor_type, token_embedding_type=token_embedding_type,
                              threads=n_threads, name=tensor_name, allow_requantize=allow_requantize,
                              keep_split=keep_split)
    plan = QM.plan_quantization(input_path, opts)   # a refusal a flag overrides: wording.py names it
    n = len(plan.tensors)
    if dry_run:
        out = sys.stdout
        for t in plan.tensors:
            out.write(tensor_line(t, n) + "\n")
        for w in plan.warnings:
            log(f"Warning: {w}")
        for line in summary_lines(plan):
            out.write(line + "\n")
        out.write(f"would write {plan.file_bytes():,} bytes to {', '.join(plan.output_paths(output_path))} (dry run)\n")
        return
    for w in plan.warnings:
        if not quiet:
            log(f"Warning: {w}")
    def emit(line: str) -> None:   # `bar` is bound by the `with` below, before any line is emitted
        if bar is not None:
            bar.write(line, file=sys.stderr)
        else:
            log(line)

    def on_start(t):
        if not quiet:
            emit(tensor_line(t, n))

    with progress_bar(plan.src_bytes, "quantize", "B", scale=1024, quiet=quiet) as bar:
        result = QM.run_quantization(plan, output_path, force=force, on_start=on_start,
                                     on_bytes=(bar.update if bar is not None else None))
    if not quiet:
        for line in summary_lines(plan):
            log(line)
        log(f"wrote {', '.join(result.outputs)} ({result.file_bytes:,} bytes) in {result.seconds:.2f} s")
