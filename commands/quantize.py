"""`ggtool quantize INPUT OUTPUT`: a GGUF model (or .npy array) to any of llama-quantize's file types
(Q4_0 ... Q6_K, the K mixes, the IQ, TQ and MXFP4_MOE types, Q8_0, F16, BF16, F32, COPY), the file
llama.cpp writes."""

from __future__ import annotations

import sys
import textwrap

import click

from ggtool import quantize_model as QM
from ggtool import types as T
from ggtool.imatrix import read_imatrix
from ggtool.threads import THREADS_ENV, default_threads

from ._common import NPY_ORDER_HELP, log
from ._json import document
from ._progress import progress_bar
from .wording import cli_message

_TYPE_NAMES = [f.name for f in QM.FILE_TYPES] + list(QM.ALIASES)
# the size target's types, as the help lists them (derived: quantize_model.target.candidate_types)
_TARGET_TYPES = textwrap.fill(
    ", ".join(T.type_name(t) for t in QM.CANDIDATES[:-1]) + f" and {T.type_name(QM.CANDIDATES[-1])} "
    "(llama.cpp's fallbacks where the rows need them; "
    + ", ".join(T.type_name(t) for t in QM.CANDIDATES if t not in QM.candidate_types(imatrix=False))
    + " only with --imatrix, for the tensors it has an entry of) by measured sensitivity:", 79)

HELP = f"""Quantize a GGUF model (or a .npy array) to one of llama-quantize's file types, writing
the file llama.cpp's llama-quantize writes, byte for byte.

INPUT is a GGUF file with tensors of any type gguf-py can dequantize (f32, f16, bf16, q8_0, q4_K,
q5_0, q6_K, ...) or a .npy float array; OUTPUT is the GGUF file to write. A model split by
gguf-split is given by its first shard (model-00001-of-00003.gguf): every shard beside it is
read, and OUTPUT is one file, or with --keep-split as many shards as the input has
(OUTPUT out.gguf: out-00001-of-00003.gguf, ...), the same tensors in each, as llama-quantize.

--type is the file type (any case): {", ".join(f.name for f in QM.FILE_TYPES)}
(Q3_K, Q4_K, Q5_K: aliases of the _M types; COPY copies every tensor unchanged).

\b
llama.cpp's rules choose each tensor's type:
  - only tensors named *weight with 2+ dims are quantized, never *_norm.weight;
    1-D tensors are copied as they are
  - the K mixes: attn_v and ffn_down get more bits in some layers (Q4_K_M: q6_K
    where use_more_bits), the output (or the tied embedding) q6_K, ...
  - rows that the chosen type's blocks do not divide fall back (q4_K -> q5_0,
    q5_K -> q5_1, q6_K -> q8_0, q2_K/q3_K -> q4_0, then f16); --verbose says so
  - a tensor whose chosen type is its source type is copied byte for byte
  - a tensor that is already quantized (q4_K, q5_0, ...) is not quantized again
    unless --allow-requantize (llama-quantize's rule and flag)
  - all metadata is copied; general.file_type and general.quantization_version
    are set as llama.cpp sets them, then each --override-kv

\b
--imatrix FILE (llama-imatrix's output) quantizes with GGML's weighted paths,
as llama-quantize --imatrix does. IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M,
IQ3_XXS, IQ3_XS and Q2_K_S need one (llama.cpp refuses their iq1/iq2/iq3_xxs
and Q2_K_S's q2_K tensors without: one error line, nothing written).
--include-weights NAME / --exclude-weights NAME (repeatable, not together)
use only, or all but, the entries whose name contains NAME.
--pure gives every eligible tensor the file type's own type (no mix, no output rule).
--tensor-type PATTERN=TYPE (repeatable; the first regular expression found in
a tensor's name wins) sets the type of the tensors it matches (a pattern that
backtracks for more than 1 s of CPU is refused; one that gives no tensor its
type is warned about). --tensor-type-file FILE reads such rules from a file
(separated by spaces or newlines; at most 1 MiB of text), after the
--tensor-type ones. --prune-layers 3,7 leaves out layers 3 and 7 (blk.3.*,
blk.7.*), numbers the rest without gaps and sets block_count, as llama-quantize.

A mix for a size: --target-bpw B (bits per weight of the whole file: header,
metadata and padding counted, so 4.5 means file bytes <= 4.5 * weights / 8) or
--target-size N (bytes; K/M/G or KiB/MiB/GiB) chooses each tensor's type from
{_TARGET_TYPES}
a sample of each tensor's rows is quantized to each type and its error weighted
by the --imatrix importances (plain squared error without one) relative to the
tensor's own; the sum of these errors is minimised under the size (largest
error removed per byte first). The file is no larger than the target; a target
below the smallest mix is refused, saying the smallest size. INPUT should be
F32, F16 or BF16: an already quantized one is refused (--allow-requantize
measures and requantizes it anyway). The choice is written as --tensor-type
rules, recorded in the file under quantize.tensor_types (a string array) and
printed by --dry-run, so llama-quantize given them (its tensor type file) and
the same importance matrix writes the same tensors. --type, --pure and the
other type options cannot be given with a target. See docs/quantize.md.
--dry-run prints each tensor's type and why (the rule or fallback that moved
it), the file size and bits per weight, writing nothing; where the real run
would refuse before writing (OUTPUT exists, a tensor needs an importance
matrix), it then ends with the same error, exit 1. It reads no tensor data:
values that do not fit their type are found by the real run.
Source tensors are dequantized to f32 exactly as GGML does; each block is
GGML's reference quantizer bit for bit. Every byte of tensor data, converted
or copied, is checked before it is written as llama.cpp's
ggml_validate_row_data checks it (no NaN or inf in a value or a block's
scale); a tensor that fails is an error naming it, the block and the cause.
--override-kv refuses what set-metadata refuses (split keys, GGUF.version,
general.architecture other than a string, an empty or non-UTF-8 key, a
value its type cannot hold); general.alignment=int:N (a power of two up to
65536) lays the tensors out for N.

The output is written to a temporary file beside OUTPUT and renamed at the end: an error or
Ctrl-C leaves no partial file (a symlink's target is replaced, the link kept; a FIFO or a device
is written in place). One line per tensor goes to stderr (--quiet silences it), with
a progress bar in bytes when stderr is a terminal, then a summary.

\b
Examples:
  $ ggtool quantize model-f16.gguf model-q4_0.gguf
  $ ggtool quantize model-f16.gguf model-q4_k_m.gguf --type Q4_K_M --threads 4
  $ ggtool quantize model.gguf out.gguf --type q5_k_m --dry-run
  $ ggtool quantize model.gguf out.gguf --type q4_k_m --tensor-type 'ffn_down=q8_0'
  $ ggtool quantize w.npy w-q4_0.gguf --name blk.0.ffn_up.weight
  $ ggtool quantize model-Q4_K_M.gguf model-f16.gguf --type f16 --allow-requantize
  $ ggtool quantize model-f16.gguf model-q2_k_s.gguf --type q2_k_s --imatrix imatrix.gguf
  $ ggtool quantize model-f16.gguf model-iq2_xxs.gguf --type iq2_xxs --imatrix imatrix.gguf
  $ ggtool quantize model-f16.gguf model-q4_k_m.gguf --type q4_k_m --tensor-type-file types.txt
  $ ggtool quantize model-f16.gguf mix.gguf --target-bpw 4.5 --imatrix imatrix.gguf
  $ ggtool quantize model-f16-00001-of-00003.gguf model-q4_0.gguf --keep-split
  $ ggtool compare model.gguf model-q4_0.gguf     # what Q4_0 cost, per tensor

{NPY_ORDER_HELP}
"""


def _file_type(ctx, param, value):
    try:
        return QM.file_type(value)
    except QM.FileTypeError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


def _overrides(parse):
    def callback(ctx, param, values):
        try:
            return [parse(v) for v in values]
        except (QM.OverrideSyntaxError, QM.TargetTypeError) as e:
            raise click.BadParameter(str(e), ctx=ctx, param=param) from None
    return callback


def _tensor_type_files(ctx, param, values):
    try:
        return [QM.read_tensor_type_file(v) for v in values]
    except QM.TensorTypeFileError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


def _prune_layers(ctx, param, value):
    if value is None:
        return ()
    try:
        return QM.parse_prune_layers(value)
    except QM.PruneLayersError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


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


def tensor_line(t: QM.TensorPlan, n: int, *, why: bool = False) -> str:
    """llama-quantize's per-tensor line (with `why`: what moved the type, and the fallback)."""
    head = f"[{t.index + 1:4d}/{n:4d}] {t.name:>36s} - [{_shape(t.ne)}], type = {T.type_name(t.src_type):>6s}, "
    if t.copy:
        line = head + f"size = {_mib(t.src_bytes):8.3f} MiB"
    else:
        line = head + (f"converting to {T.type_name(t.dst_type)} .. "
                       f"size = {_mib(t.src_bytes):8.2f} MiB -> {_mib(t.dst_bytes):8.2f} MiB")
    notes = list(t.reasons) + (["fallback: " + _fallback_note(t)] if t.fallback else [])
    return line + (f"  ({'; '.join(notes)})" if why and notes else "")


def _fallback_note(t: QM.TensorPlan) -> str:
    return " ".join(t.fallback.split())


def _bpw(nbytes: int, n: int) -> float:
    return nbytes * 8.0 / n if n else 0.0


def summary_lines(plan: QM.QuantizePlan) -> list[str]:
    n = plan.n_elements
    lines = [f"model size  = {_mib(plan.src_bytes):8.2f} MiB ({_bpw(plan.src_bytes, n):.2f} bits per weight)",
             f"quant size  = {_mib(plan.dst_bytes):8.2f} MiB ({_bpw(plan.dst_bytes, n):.2f} bits per weight)"]
    if plan.n_fallback:
        lines.append(f"{plan.n_fallback} of {len(plan.tensors)} tensor(s) required fallback quantization")
    return lines


def plan_json(plan: QM.QuantizePlan, outputs: list[str]) -> dict:
    """--dry-run --json: the file type, every tensor's type and why, sizes and bits per weight."""
    n = plan.n_elements
    return {"file_type": plan.options.type.name, "general.file_type": plan.file_type_id,
            "outputs": outputs, "file_bytes": plan.file_bytes(),
            "model_bytes": plan.src_bytes, "quant_bytes": plan.dst_bytes,
            "model_bits_per_weight": _bpw(plan.src_bytes, n), "quant_bits_per_weight": _bpw(plan.dst_bytes, n),
            "n_fallback": plan.n_fallback,
            "tensors": [{"name": t.name, "ne": list(t.ne), "src_type": T.type_name(t.src_type),
                         "type": T.type_name(t.dst_type), "src_bytes": t.src_bytes, "bytes": t.dst_bytes,
                         "reasons": list(t.reasons), "fallback": _fallback_note(t) if t.fallback else None}
                        for t in plan.tensors],
            **({"tensor_type_rules": list(plan.options.recorded_tensor_types)}
               if plan.options.recorded_tensor_types else {})}


@click.command("quantize", help=HELP,
               short_help="Quantize a GGUF model or .npy array to a llama-quantize file type (Q4_K_M, Q8_0, F16, ...), byte for byte.")
@click.argument("input_path", metavar="INPUT", type=click.Path(exists=True, dir_okay=False))
@click.argument("output_path", metavar="OUTPUT", type=click.Path(dir_okay=False))
@click.option("--type", "ftype", metavar="TYPE", callback=_file_type, default="Q4_0", show_default=True,
              help="The file type: " + ", ".join(_TYPE_NAMES) + " (any case).")
@click.option("--pure", is_flag=True, help="Every eligible weight gets the file type's own type (no mix, no output rule).")
@click.option("--leave-output-tensor", is_flag=True, help="Copy output.weight unchanged.")
@click.option("--output-tensor-type", metavar="TYPE", callback=_target_type,
              help="Type for output.weight (" + " ".join(QM.TargetTypeError.CHOICES) + ").")
@click.option("--token-embedding-type", metavar="TYPE", callback=_target_type,
              help="Type for token_embd.weight (same choices).")
@click.option("--tensor-type", "tensor_types", metavar="PATTERN=TYPE", multiple=True,
              callback=_overrides(QM.parse_tensor_type_override),
              help="Tensors whose name the regular expression PATTERN matches get TYPE (repeatable; the first match wins).")
@click.option("--tensor-type-file", "tensor_type_files", metavar="FILE", multiple=True, callback=_tensor_type_files,
              help="PATTERN=TYPE rules from FILE (separated by spaces or newlines), after the --tensor-type ones (repeatable).")
@click.option("--override-kv", "kv_overrides", metavar="KEY=TYPE:VALUE", multiple=True,
              callback=_overrides(QM.parse_kv_override),
              help="Set a metadata value in OUTPUT (TYPE int, float, bool or str; repeatable), as llama-quantize.")
@click.option("--imatrix", "imatrix_path", metavar="FILE", type=click.Path(exists=True, dir_okay=False),
              help="Importance matrix (llama-imatrix's GGUF or legacy .dat): GGML's weighted quantizers, as llama-quantize.")
@click.option("--include-weights", "include_weights", metavar="NAME", multiple=True,
              help="Use the --imatrix entries whose name contains NAME, only (repeatable), as llama-quantize.")
@click.option("--exclude-weights", "exclude_weights", metavar="NAME", multiple=True,
              help="Do not use the --imatrix entries whose name contains NAME (repeatable).")
@click.option("--threads", "-t", "n_threads", type=click.IntRange(min=1), default=default_threads,
              envvar=THREADS_ENV, show_envvar=True, show_default="the CPUs this process may use", metavar="N",
              help="Threads converting pieces of tensors side by side (the compiled kernels release the GIL).")
@click.option("--prune-layers", "prune", metavar="L0,L1,...", callback=_prune_layers,
              help="Remove these layers (blk.N.* tensors) and number the rest without gaps; block_count follows.")
@click.option("--keep-split", is_flag=True,
              help="OUTPUT as shards named OUT-0000k-of-0000n.gguf, one per INPUT shard (a single file: one), each with its input shard's tensors.")
@click.option("--allow-requantize", is_flag=True,
              help="Quantize tensors that are already quantized (each rounding adds to the last).")
@click.option("--name", "tensor_name", metavar="NAME", help="Tensor name for a .npy INPUT (default: its file stem).")
@click.option("--force", is_flag=True, help="Overwrite an existing OUTPUT.")
@click.option("--target-bpw", metavar="B",
              help="Choose each tensor's type by measured sensitivity so the whole file is at most B bits per weight.")
@click.option("--target-size", metavar="SIZE",
              help="The same for a file of at most SIZE bytes (K/M/G: 1000s; KiB/MiB/GiB: 1024s).")
@click.option("--dry-run", is_flag=True, help="Print each tensor's type and why, the sizes (stdout); write nothing.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: the plan as JSON on stdout.")
@click.option("--verbose", "-v", is_flag=True, help="Say why each tensor got its type, and each fallback (stderr).")
@click.option("--quiet", "-q", is_flag=True, help="No per-tensor lines, no progress bar, no summary.")
@click.pass_context
def command(ctx, input_path, output_path, ftype, pure, leave_output_tensor, output_tensor_type, token_embedding_type,
            tensor_types, tensor_type_files, kv_overrides, imatrix_path, include_weights, exclude_weights, n_threads,
            prune, keep_split, allow_requantize, tensor_name, force, target_bpw, target_size, dry_run, as_json, verbose, quiet):
    if as_json and not dry_run:
        raise click.UsageError("--json describes the plan: use it with --dry-run")
    target = None
    if target_bpw is not None or target_size is not None:
        if target_bpw is not None and target_size is not None:
            raise click.UsageError("--target-bpw and --target-size: give one of them, not both")
        try:
            target = QM.parse_target(target_bpw, target_size)
        except QM.TargetSizeError as e:      # a value no model could meet: a usage error (exit 2)
            raise click.UsageError(cli_message(e)) from None
        given = [f for f, v in (("--type", ctx.get_parameter_source("ftype") == click.core.ParameterSource.COMMANDLINE),
                                ("--pure", pure), ("--tensor-type", tensor_types),
                                ("--tensor-type-file", tensor_type_files),
                                ("--output-tensor-type", output_tensor_type),
                                ("--token-embedding-type", token_embedding_type)) if v]
        if given:
            raise click.UsageError(f"{given[0]} chooses types itself: a size target chooses every tensor's type")
        if prune:
            raise click.UsageError("--prune-layers cannot be given with a size target (it measures the model as it is)")
    if include_weights and exclude_weights:
        raise click.UsageError("--include-weights and --exclude-weights cannot be given together")
    if (include_weights or exclude_weights) and not imatrix_path:
        raise click.UsageError(f"{'--include-weights' if include_weights else '--exclude-weights'} selects entries of "
                               "the importance matrix: give one with --imatrix FILE")
    imatrix = read_imatrix(imatrix_path) if imatrix_path else None   # its errors: wording.py names --imatrix
    if imatrix is not None and (include_weights or exclude_weights):
        imatrix = imatrix.select(include_weights, exclude_weights)
        if imatrix is None and not quiet:
            log("Warning: no entry of the importance matrix is left: quantizing without one (as llama-quantize)")
    opts = QM.QuantizeOptions(type=ftype, pure=pure, leave_output_tensor=leave_output_tensor,
                              output_tensor_type=output_tensor_type, token_embedding_type=token_embedding_type,
                              tensor_types=list(tensor_types) + [r for rules in tensor_type_files for r in rules],
                              kv_overrides=list(kv_overrides),
                              threads=n_threads, name=tensor_name, allow_requantize=allow_requantize,
                              keep_split=keep_split, imatrix=imatrix, dry_run=dry_run, prune_layers=prune)
    if target is None:
        plan = QM.plan_quantization(input_path, opts)   # a refusal a flag overrides: wording.py names it
        rules = []
    else:
        with progress_bar(0, "measure", "tensor", quiet=quiet) as mbar:
            def measured(k, total, name):
                if mbar is not None:
                    mbar.total = total
                    mbar.update(1)
                elif verbose:
                    log(f"measuring [{k + 1}/{total}] {name}")
            # OUTPUT checked before the measuring (minutes on a large model), as the run checks it
            mix = QM.plan_for_target(input_path, opts, target, on_tensor=measured,
                                     output_path=None if dry_run else output_path, force=force)
        plan, rules = mix.plan, mix.rules
        if not quiet:
            log(f"{'target' if target.what == 'bpw' else 'target size'} {target.shown}"
                f"{' bits per weight' if target.what == 'bpw' else ''}: "
                f"{mix.file_bytes:,} bytes ({mix.bits_per_weight:.4f} bits per weight, whole file), "
                f"{len(rules)} tensor-type rules (recorded under {QM.RECORD_KEY})")
        if verbose and not dry_run:
            for r in rules:
                log(f"  --tensor-type {r}")
    n = len(plan.tensors)
    for w in plan.warnings:
        if not quiet:
            log(f"Warning: {w}")
    if dry_run:
        if as_json:
            sys.stdout.write(document(plan_json(plan, plan.output_paths(output_path))))
        else:
            out = sys.stdout
            for t in plan.tensors:
                out.write(tensor_line(t, n, why=True) + "\n")
            for line in summary_lines(plan):
                out.write(line + "\n")
            for r in rules:
                out.write(f"tensor-type {r}\n")
        # what the real run would refuse before writing, refused here in its words (exit 1)
        QM.preflight(plan, output_path, force=force)
        if not as_json:
            out.write(f"would write {plan.file_bytes():,} bytes to {', '.join(plan.output_paths(output_path))} (dry run)\n")
        return
    def emit(line: str) -> None:   # `bar` is bound by the `with` below, before any line is emitted
        if bar is not None:
            bar.write(line, file=sys.stderr)
        else:
            log(line)

    def on_start(t):
        if verbose and t.fallback:     # llama.cpp's warning, as llama-quantize prints it
            emit(f"warning: {t.name:<36s} - {t.fallback}")
        if not quiet:
            emit(tensor_line(t, n, why=verbose))

    with progress_bar(plan.src_bytes, "quantize", "B", scale=1024, quiet=quiet) as bar:
        result = QM.run_quantization(plan, output_path, force=force, on_start=on_start,
                                     on_bytes=(bar.update if bar is not None else None))
    if not quiet:
        for line in summary_lines(plan):
            log(line)
        log(f"wrote {', '.join(result.outputs)} ({result.file_bytes:,} bytes) in {result.seconds:.2f} s")
