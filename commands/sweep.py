"""`ggtool sweep --gguf MODEL --types ... -f TEXT -o DIR`: a model quantized to several file types,
each evaluated against the source (ggtool.evaluate.sweep), a table, a record and a chart."""

from __future__ import annotations

import sys

import click

from ._common import log, numerics_option, open_cluster, pick_numerics, ray_options
from ._json import document
from ._progress import progress_bar
from ._table import table

HELP = """Quantize a model to several file types and measure what each costs: its size, bits
per weight, and on a text the perplexity and the KL divergence of its predictions from the
source model's (or --base's), as `ggtool perplexity` measures them.

\b
The source's log-probabilities on the text (-f TEXT, chunks of -c N tokens) are computed once
into DIR/base.bin; each type is written to DIR/TYPE.gguf by ggtool's quantizer (llama-quantize's
file, byte for byte) and read against them. At the end: a table (stdout; --json or --csv for a
record instead), DIR/results.json and DIR/results.csv, and a chart of mean KLD against file
size with the Pareto front marked (the types no other type beats on both), DIR/kld-vs-size.png
and .svg.

\b
Resumable: every finished step is kept in DIR (a type's file, its record), so the same command
after an interruption does only what is left, and adding types to --types does only those. A
record that is damaged, of other settings, or of a file that is not the one there is redone
(one line says so); a DIR that holds a sweep of another model, text or settings is refused.

\b
--base FILE: evaluate against another model (a GGUF, e.g. the F16 when MODEL is a BF16), or
against a base-logits file made by `ggtool perplexity` or llama-perplexity
(its chunks are the text's; -c must be its n_ctx).

\b
--ray ADDRESS (or RAY_ADDRESS): run each quantization and each chunk of each evaluation as a
task on a Ray cluster (pip install 'ggtool[cluster]'; docs/cluster.md). The chunks' values are
added in chunk order as one process adds them: the numbers equal a run without --ray, bit for
bit. --ray-ship says how the files reach the nodes: auto (each node is asked whether it sees the
paths), shared (a file system every node sees: DIR too), ship (through Ray's object store).

\b
Examples:
  $ ggtool sweep --gguf model-f16.gguf --types q4_0,q4_k_m,q5_k_m,q8_0 -f fixtures/genesis.txt -o sweep/
  $ ggtool sweep --gguf model-f16.gguf --types q2_k,q3_k_m -f wiki.test.raw -o sweep/ --chunks 20 --csv
  $ ggtool sweep --gguf model-f16.gguf --types q4_k_m,q6_k -f text.txt -o sweep/ --ray 10.0.0.1:6379
"""


@click.command("sweep", help=HELP, short_help="Quantize to several file types and measure each (size, PPL, KL divergence).")
@click.option("--gguf", "model", required=True, metavar="MODEL", type=click.Path(exists=True, dir_okay=False),
              help="The source model (F16, BF16, F32, Q8_0...).")
@click.option("--types", "types", required=True, metavar="T1,T2,...",
              help="File types, as `ggtool quantize` names them (q4_0,q4_k_m,q8_0,...).")
@click.option("-f", "--file", "text_file", required=True, metavar="TEXT", type=click.Path(exists=True, dir_okay=False),
              help="The text (UTF-8).")
@click.option("-o", "--output-dir", "out_dir", required=True, metavar="DIR", type=click.Path(),
              help="Where the files, records, table and chart go (made if missing; kept for resuming).")
@click.option("--imatrix", "imatrix", metavar="FILE", type=click.Path(exists=True, dir_okay=False),
              help="Importance matrix for the quantizations (as ggtool quantize --imatrix).")
@click.option("--base", "base", metavar="FILE", type=click.Path(exists=True, dir_okay=False),
              help="Evaluate against this model, or this base-logits file, not the source.")
@click.option("-c", "--ctx-size", "n_ctx", type=click.IntRange(min=4), default=512, show_default=True, metavar="N",
              help="Tokens per chunk.")
@click.option("--chunks", "n_chunks", type=click.IntRange(min=1), default=None, metavar="N",
              help="At most N chunks (default: all the text holds).")
@click.option("-b", "--batch-size", "n_batch", type=click.IntRange(min=1), default=2048, show_default=True,
              metavar="N", help="llama-perplexity's -b.")
@click.option("-ub", "--ubatch-size", "n_ubatch", type=click.IntRange(min=1), default=512, show_default=True,
              metavar="N", help="llama-perplexity's -ub.")
@click.option("--kl-top-k", "top_k", type=click.IntRange(min=1), default=None, metavar="K",
              help="Keep each row's K largest base log-probabilities (a small base file; KLD a lower bound).")
@click.option("--allow-requantize", is_flag=True, help="MODEL is quantized already: quantize it again anyway.")
@ray_options
@click.option("--threads", "-t", "n_threads", type=click.IntRange(min=1), default=None, metavar="N",
              help="Threads on this machine (without --ray): quantizing, and evaluating (this process and N-1 workers).")
@numerics_option
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON on stdout (not the table).")
@click.option("--csv", "as_csv", is_flag=True, help="Print the rows as CSV on stdout (not the table).")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
@click.option("-v", "--verbose", is_flag=True, help="Say which llama.cpp build --numerics llama.cpp follows.")
def command(model, types, text_file, out_dir, imatrix, base, n_ctx, n_chunks, n_batch, n_ubatch, top_k,
            allow_requantize, ray_address, ray_ship, n_threads, numerics, as_json, as_csv, quiet, verbose):
    from ggtool.evaluate.sweep import Sweep, SweepOptions, csv_text, parse_types
    from ggtool.quantize_model import FileTypeError

    if as_json and as_csv:
        raise click.UsageError("--json and --csv both print on stdout: choose one")
    numerics = pick_numerics(numerics, verbose)
    try:
        parse_types(types)
    except FileTypeError as e:
        raise click.BadParameter(str(e), param_hint="--types") from None
    executor = open_cluster(ray_address, ray_ship, "sweep")
    try:
        sweep = Sweep(SweepOptions(model, types, text_file, out_dir, imatrix=imatrix, base=base, n_ctx=n_ctx,
                                   n_chunks=n_chunks, n_batch=n_batch, n_ubatch=n_ubatch, top_k=top_k,
                                   numerics=numerics, allow_requantize=allow_requantize, threads=n_threads),
                      executor)
        _run(sweep, quiet)
    finally:
        if executor is not None:
            executor.close()
    res = sweep.result
    rows = ([res.base] if res.base else []) + res.rows
    if as_json:
        import json

        with open(res.outputs["json"], encoding="utf-8") as f:
            sys.stdout.write(document(json.load(f)))
    elif as_csv:
        sys.stdout.write(csv_text(rows))
    else:
        sys.stdout.write("\n".join(table_lines(rows)) + "\n")
    log(f"sweep: {len(res.rows)} types in {res.seconds:.1f} s; {res.outputs['json']}, {res.outputs['csv']}, "
        f"{res.outputs['png']}, {res.outputs['svg']}")


def _run(sweep, quiet: bool) -> None:
    n = len(sweep.types)
    with progress_bar(n, "types", " type", quiet=quiet) as bar:
        def say(text: str) -> None:
            if bar is not None:
                bar.write(text, file=sys.stderr)
            elif not quiet:
                log(text)

        done = 0
        for e in sweep.run():
            if e.what == "note":
                log(f"Warning: {e.message}")
            elif e.what == "start":
                if bar is not None:
                    bar.set_postfix_str(f"{e.type}: {e.step}", refresh=True)
                if e.step == "base":
                    say(f"sweep: the base's log-probabilities ({sweep.n_chunk} chunks of {sweep.opts.n_ctx})")
                elif e.step == "quantize":
                    say(f"sweep: {e.type}: quantizing")
            elif e.what == "chunk" and bar is not None:
                bar.set_postfix_str(f"{e.type}: chunk {e.report.index}/{e.report.n_chunk}", refresh=True)
            elif e.what == "cell":
                done += 1
                if bar is not None:
                    bar.update(1)
                r = e.row
                say(f"sweep: {e.type}: {r['bytes']:,} bytes, {r['bpw']:.3f} bpw, PPL {r['ppl']:.4f}, "
                    f"mean KLD {r['kld']:.6f}" + (" (kept from an earlier run)" if e.kept else ""))


def _num(v, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def table_lines(rows: list[dict]) -> list[str]:
    head = ["type", "MiB", "bpw", "PPL", "mean KLD", "same top p", "quantize s", "evaluate s", "Pareto"]
    body = [[r["type"], _num(r["bytes"] / (1 << 20), ".2f"), _num(r["bpw"], ".3f"),
             _num(r["ppl"], ".4f") + ("" if r["ppl_unc"] is None else f" ± {r['ppl_unc']:.4f}"),
             _num(r["kld"], ".6f") + (f" ± {r['kld_unc']:.6f}" if r["kld_unc"] else ""),
             _num(100 * r["same_top"], ".2f") + " %", _num(r["quantize_seconds"], ".1f"), _num(r["eval_seconds"], ".1f"),
             {True: "*", False: "", None: ""}[r["pareto"]]] for r in rows]
    return table([head] + body, right=range(1, 8))
