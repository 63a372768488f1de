"""`ggtool imatrix --gguf MODEL -f TEXT -o OUT.gguf`: llama-imatrix's importance matrix (ggtool.evaluate
.collect), the GGUF file `ggtool quantize --imatrix` and llama-quantize read."""

from __future__ import annotations

import sys

import click

from ._common import log, numerics_option, open_cluster, open_pool, pick_numerics, ray_options, threads_option
from ._json import document
from ._progress import progress_bar

HELP = """Compute an importance matrix from a text, as llama.cpp's llama-imatrix does, for the
low-bit quantizations: `ggtool quantize` takes it, and so does llama-quantize.

\b
The text (-f TEXT) is cut into chunks of -c N tokens (default 512; at least 2 * N) and run
through the model as llama-imatrix runs it. For every matrix product with a weight of the
model's blocks (blk.*; and output.weight with --process-output) over 16 or more rows of F32
activations, each input column's squared activations are summed, and the rows counted. The file
is llama-imatrix's GGUF: <weight>.in_sum2 and <weight>.counts tensors, general.type imatrix,
imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size. With --numerics llama.cpp the sums
are llama-imatrix's own, to the bit where the model's logits are.

\b
--in-file F (repeatable) adds the sums of earlier files first (llama-imatrix's GGUF or .dat);
with no -f TEXT the files are only merged. An --in-file made for another model is refused.
The per-chunk PPL is printed as llama-imatrix prints it (--no-ppl: not computed).

\b
--ray ADDRESS (or RAY_ADDRESS): each batch of chunks is a task on a Ray cluster
(docs/cluster.md); the batches' sums are added in chunk order (float32, as --in-file adds
files): the same bits on any cluster, within float32 rounding of a run without --ray.

\b
Examples:
  $ ggtool imatrix --gguf model-f16.gguf -f calibration.txt -o imatrix.gguf --chunks 100
  $ ggtool imatrix --in-file a.gguf --in-file b.gguf -o merged.gguf
"""


@click.command("imatrix", help=HELP, short_help="An importance matrix from a text (llama-imatrix).")
@click.option("--gguf", "model", metavar="MODEL", type=click.Path(exists=True, dir_okay=False),
              help="The model (not needed to merge --in-file matrices only).")
@click.option("-f", "--file", "text_file", metavar="TEXT", type=click.Path(dir_okay=False), help="The text (UTF-8).")
@click.option("-o", "--output", "out_file", metavar="OUT.gguf", required=True, type=click.Path(dir_okay=False),
              help="The importance matrix to write.")
@click.option("-c", "--ctx-size", "n_ctx", type=click.IntRange(min=4), default=512, show_default=True, metavar="N",
              help="Tokens per chunk.")
@click.option("--chunks", "n_chunks", type=click.IntRange(min=1), default=None, metavar="N", help="At most N chunks.")
@click.option("-b", "--batch-size", "n_batch", type=click.IntRange(min=1), default=2048, show_default=True,
              metavar="N", help="llama-imatrix's -b: chunks per batch are N / N_CTX.")
@click.option("-ub", "--ubatch-size", "n_ubatch", type=click.IntRange(min=1), default=512, show_default=True,
              metavar="N", help="llama-imatrix's -ub.")
@click.option("--process-output", is_flag=True, help="Collect output.weight's activations too.")
@click.option("--in-file", "in_files", multiple=True, metavar="F", type=click.Path(exists=True, dir_okay=False),
              help="Add this importance matrix's sums first (repeatable).")
@click.option("--no-ppl", is_flag=True, help="Do not compute the perplexity.")
@click.option("--program", "program_file", type=click.File("r", encoding="utf-8"), metavar="PROGRAM",
              help="The model's DSL program (default: the one shipped for its architecture).")
@threads_option(help="Threads: this process and N-1 worker processes.")
@numerics_option
@ray_options
@click.option("--force", is_flag=True, help="Replace OUT.gguf if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print a record of the run as JSON on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
@click.option("-v", "--verbose", is_flag=True, help="Say which llama.cpp build --numerics llama.cpp follows.")
def command(model, text_file, out_file, n_ctx, n_chunks, n_batch, n_ubatch, process_output, in_files, no_ppl,
            program_file, n_threads, numerics, ray_address, ray_ship, force, as_json, quiet, verbose):
    from ggtool.errors import ImatrixError
    from ggtool.evaluate import Model, Schedule, read_text, tokenize_text
    from ggtool.evaluate.collect import ImatrixRun, check_against_model, load_in_files, write_imatrix
    from ggtool.gguf_io.write import check_output_paths
    from ggtool.plan import estimate_work
    from ggtool.threads import default_threads

    numerics = pick_numerics(numerics, verbose)
    if text_file is not None and model is None:
        raise click.UsageError("give the model with --gguf MODEL")
    if text_file is None and not in_files:
        raise click.UsageError("give a text (-f TEXT, with --gguf MODEL) or importance matrices to merge (--in-file F)")
    inputs = [p for p in (model, text_file, *in_files) if p]
    check_output_paths(inputs, [out_file], force)
    try:
        start = load_in_files(list(in_files), n_ctx) if in_files else None
        if start is not None and model is not None:
            for p in in_files:    # which file is at fault
                from ggtool.imatrix import read_imatrix_sums

                check_against_model(read_imatrix_sums(p, n_ctx), model, p)
    except ImatrixError as e:
        raise click.ClickException(e.worded(file_label=lambda path: f"--in-file {path}")) from None
    if text_file is None:
        n = write_imatrix(out_file, start, _chunk_count(start, n_ctx), n_ctx)
        log(f"imatrix: merged {len(in_files)} files ({len(start.sums)} entries) into {out_file} ({n} bytes)")
        if as_json:
            sys.stdout.write(document({"kind": "imatrix", "entries": len(start.sums), "in_files": list(in_files),
                                       "datasets": start.datasets, "chunk_count": _chunk_count(start, n_ctx),
                                       "output": out_file, "bytes": n}))
        return
    program = (program_file.read(), program_file.name) if program_file is not None else None
    m = Model(model, n_ctx, program=program, numerics=numerics)
    tokens = tokenize_text(m.vocab, read_text(text_file))
    executor = open_cluster(ray_address, ray_ship, "imatrix")
    run = ImatrixRun(m, tokens, dataset=text_file, n_chunks=n_chunks, schedule=Schedule(n_ctx, n_batch, n_ubatch),
                     process_output=process_output, start=start, ppl=not no_ppl, text_file=text_file,
                     executor=executor)
    if executor is None:
        if n_threads is None:
            n_threads = default_threads(estimate_work(run.first_graph()))
        m.use_threads(n_threads, open_pool(n_threads))
    s = run.schedule
    log(f"compute_imatrix: computing over {run.n_chunk} chunks, n_ctx={n_ctx}, "
        f"batch_size={min(s.n_batch, s.n_seq * n_ctx)}, n_seq={s.n_seq}")
    try:
        _collect(run, quiet, no_ppl)
    finally:
        if executor is not None:
            executor.close()
    rec = run.result
    if rec.get("ppl") is not None and rec.get("ppl_unc") is not None:
        log(f"Final estimate: PPL = {rec['ppl']:.4f} +/- {rec['ppl_unc']:.5f}")
    n = write_imatrix(out_file, run.collector.stats, run.collector.chunk_count, n_ctx)
    rec.update(output=out_file, bytes=n)
    log(f"imatrix: {rec['entries']} entries, {rec['chunk_count']} chunks of {n_ctx} written to {out_file}; "
        f"{run.n_chunk * n_ctx} tokens in {rec['seconds']:.2f} s ({rec['tokens_per_second']:.1f} tokens/s)")
    if as_json:
        sys.stdout.write(document(rec))


def _chunk_count(stats, chunk_size: int) -> int:
    most = max((int(c.max()) for c in stats.counts.values() if c.size), default=0)
    return most // chunk_size


def _collect(run, quiet: bool, no_ppl: bool) -> None:
    """The run, with llama-imatrix's per-chunk PPL line and a progress bar."""
    line = []
    tty = sys.stderr.isatty()
    with progress_bar(run.n_chunk, "chunks", " chunk", quiet=quiet) as bar:
        for r in run:
            if bar is not None:
                bar.n = r.index
                bar.set_postfix_str(f"PPL {r.ppl:.4f}" if not no_ppl else "", refresh=True)
            if not no_ppl:
                line.append(f"[{r.index}]{r.ppl:.4f},")
                if not tty and not quiet:
                    sys.stderr.write(line[-1])
                    sys.stderr.flush()
    if not no_ppl and (tty or quiet):
        sys.stderr.write("".join(line))
    sys.stderr.write("\n")
