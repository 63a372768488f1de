"""`ggtool perplexity --gguf MODEL -f TEXT`: llama-perplexity's perplexity, base-logits files and KL
divergence (ggtool.evaluate), printed as llama-perplexity prints them."""

from __future__ import annotations

import sys

import click

from ._common import log, numerics_option, open_cluster, open_pool, pick_numerics, ray_options, threads_option
from ._json import document
from ._progress import progress_bar

HELP = """Measure what a model makes of a text, as llama.cpp's llama-perplexity does: the
perplexity, or with a base model's logits the KL divergence of this model's predictions from them.

\b
The text (-f TEXT, UTF-8) is tokenized once (BOS as the model says) and cut into chunks of
-c N_CTX tokens (default 512; the text needs at least 2 * N_CTX). Each chunk is evaluated in a
fresh KV cache, its first token replaced by BOS, and scored on its second half: at positions
N_CTX/2 .. N_CTX-2, -log p(next token). PPL = exp(the mean), with llama-perplexity's +/-.
Each chunk is computed in the pieces llama-perplexity computes it in (-b, -ub: its batch
sizes), so with --numerics llama.cpp the sums are its own.

\b
KL divergence, in two runs:
  1. the base model (F16, BF16, Q8_0...) writes its log-probabilities:
       --kl-divergence-base BASE.bin          (llama-perplexity's file: it reads it too)
       --kl-divergence-base BASE.bin --kl-top-k 32   (ggtool's: each row's 32 largest and
                                              the rest's mass, a few percent of the size)
  2. the quantized model reads them, with the same -c (the text and chunks are the file's):
       --kl-divergence-base BASE.bin --kl-divergence
  and prints llama-perplexity's statistics: mean KLD and its percentiles, "Same top p", the
  probability differences, PPL(Q), PPL(base), their ratio, difference and correlation.

\b
--resume: a run that writes a file (a base file, or -o RECORD.json) keeps its progress beside
it (.NAME.ggtool-journal, .NAME.ggtool-partial); stopped (Ctrl-C, a crash), it is continued
with the same command and --resume, and ends with the numbers an uninterrupted run gives.
Memory holds one evaluation's logits at a time, never a whole chunk's or text's.

\b
--ray ADDRESS (or RAY_ADDRESS): each chunk is a task on a Ray cluster (docs/cluster.md); the
chunks' values are added here in chunk order, so the numbers equal a run without --ray.

\b
Progress goes to stderr with llama-perplexity's lines ([1]5.1234,[2]... and "Final estimate:
PPL = ... +/- ..."); --json prints the record on stdout, -o FILE writes it to a file.

\b
Examples:
  $ ggtool perplexity --gguf model-q4_0.gguf -f wiki.test.raw --chunks 20
  $ ggtool perplexity --gguf model-f16.gguf -f text.txt --kl-divergence-base base.bin
  $ ggtool perplexity --gguf model-q4_0.gguf --kl-divergence-base base.bin --kl-divergence --json
"""


@click.command("perplexity", help=HELP, short_help="Perplexity and KL divergence of a model on a text (llama-perplexity).")
@click.option("--gguf", "model", required=True, metavar="MODEL", type=click.Path(exists=True, dir_okay=False),
              help="The model.")
@click.option("-f", "--file", "text_file", metavar="TEXT", type=click.Path(dir_okay=False),
              help="The text (UTF-8); not needed to read a base file, which holds its tokens.")
@click.option("-c", "--ctx-size", "n_ctx", type=click.IntRange(min=4), default=None, metavar="N",
              help="Tokens per chunk (default 512; reading a base file, its own).")
@click.option("--chunks", "n_chunks", type=click.IntRange(min=1), default=None, metavar="N",
              help="At most N chunks (default: all the text holds).")
@click.option("-b", "--batch-size", "n_batch", type=click.IntRange(min=1), default=2048, show_default=True,
              metavar="N", help="llama-perplexity's -b: chunks per batch are N / N_CTX.")
@click.option("-ub", "--ubatch-size", "n_ubatch", type=click.IntRange(min=1), default=512, show_default=True,
              metavar="N", help="llama-perplexity's -ub: tokens per evaluation, shared by a batch's chunks.")
@click.option("--kl-divergence-base", "base_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="Write the base model's log-probabilities to FILE (or, with --kl-divergence, read them).")
@click.option("--kl-divergence", "kl", is_flag=True, help="Read the base file and compare with it.")
@click.option("--kl-top-k", "top_k", type=click.IntRange(min=1), default=None, metavar="K",
              help="Write the base file keeping each row's K largest log-probabilities and the rest's mass.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run that writes the same file.")
@click.option("--program", "program_file", type=click.File("r", encoding="utf-8"), metavar="PROGRAM",
              help="The model's DSL program (default: the one shipped for its architecture).")
@threads_option(help="Threads: this process and N-1 worker processes.")
@numerics_option
@ray_options
@click.option("--json", "as_json", is_flag=True, help="Print the final record as JSON on stdout.")
@click.option("-o", "--output", "out_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="Write the final record as JSON to FILE.")
@click.option("--force", is_flag=True, help="Replace the file written (the base file, -o FILE) if it exists.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr (the final lines still come).")
@click.option("-v", "--verbose", is_flag=True, help="Say which llama.cpp build --numerics llama.cpp follows.")
def command(model, text_file, n_ctx, n_chunks, n_batch, n_ubatch, base_file, kl, top_k, resume, program_file,
            n_threads, numerics, ray_address, ray_ship, as_json, out_file, force, quiet, verbose):
    from ggtool.evaluate import BaseFile, EvaluateError, Model, Perplexity, Schedule, read_text, tokenize_text
    from ggtool.gguf_io.write import check_output_paths
    from ggtool.plan import estimate_work
    from ggtool.threads import default_threads

    numerics = pick_numerics(numerics, verbose)
    if kl and base_file is None:
        raise click.UsageError("--kl-divergence needs --kl-divergence-base FILE (the base model's log-probabilities)")
    if kl and top_k is not None:
        raise click.UsageError("--kl-top-k is for writing a base file; a top-K file says its own K")
    if not kl and text_file is None:
        raise click.UsageError("give the text with -f TEXT")
    if top_k is not None and base_file is None:
        raise click.UsageError("--kl-top-k K needs --kl-divergence-base FILE to write")
    writes = [p for p in (base_file if not kl else None, out_file) if p is not None]
    if resume and not writes:
        raise click.UsageError("--resume needs a file this run writes: --kl-divergence-base FILE or -o FILE")
    if writes:
        check_output_paths([model] + ([text_file] if text_file else []) + ([base_file] if kl else []), writes, force)
    base = BaseFile(base_file) if kl else None
    executor = None
    try:
        executor = open_cluster(ray_address, ray_ship, "perplexity")
        if base is not None and n_ctx is None:
            n_ctx = base.header.n_ctx
        n_ctx = n_ctx or 512
        program = (program_file.read(), program_file.name) if program_file is not None else None
        m = Model(model, n_ctx, program=program, numerics=numerics)
        tokens = tokenize_text(m.vocab, read_text(text_file)) if text_file is not None else None
        run = Perplexity(m, tokens=tokens, n_chunks=n_chunks, schedule=Schedule(n_ctx, n_batch, n_ubatch),
                         write_base=None if kl else base_file, top_k=top_k, read_base=base,
                         anchor=out_file, resume=resume, text_file=text_file, executor=executor)
        if executor is None:
            if n_threads is None:      # the engine's rule, for the evaluation that repeats
                n_threads = default_threads(estimate_work(run.first_graph()))
            m.use_threads(n_threads, open_pool(n_threads))
        _run(run, quiet)
    except EvaluateError as e:
        if e.kind == "short-text":
            raise click.ClickException(f"{e} (a smaller -c, or a longer text)") from None
        raise
    finally:
        if base is not None:
            base.close()
        if executor is not None:
            executor.close()
    rec = run.result
    _final_lines(rec)
    if out_file is not None:
        from ggtool.tensor_io.outputs import write_text_atomic

        write_text_atomic(out_file, [document(rec)])
    if as_json:
        sys.stdout.write(document(rec))


def _run(run, quiet: bool) -> None:
    run.open()
    s = run.schedule
    what = "kl_divergence: computing" if run.mode == "kld" else "perplexity: calculating perplexity"
    log(f"{what} over {run.n_chunk} chunks, n_ctx={s.n_ctx}, batch_size={min(s.n_batch, s.n_seq * s.n_ctx)}, "
        f"n_seq={s.n_seq}")
    if run.mode == "base":
        log(f"perplexity: saving {'the top ' + str(run.top_k) + ' log-probabilities' if run.top_k else 'all logits'} "
            f"to {run.anchor}")
    tty = sys.stderr.isatty()
    line, headed = [], False
    with progress_bar(run.n_chunk, "chunks", " chunk", quiet=quiet) as bar:
        for r in run:
            if bar is not None:
                bar.n = r.index
                bar.set_postfix_str(f"PPL {r.ppl:.4f}", refresh=True)
            if run.mode == "kld":
                if not headed:
                    headed = True
                    _say(bar, "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
                              "              Δp RMS            Same top p")
                k = r.kld
                _say(bar, f"{r.index:4d}    {k['ppl']:9.4f} ± {k['ppl_unc']:9.4f}    {k['ln_ratio']:10.5f} ± "
                          f"{k['ln_ratio_unc']:10.5f}    {k['kld']:10.5f} ± {k['kld_unc']:10.5f}    "
                          f"{100 * k['rms_dp']:6.3f} ± {100 * k['rms_dp_unc']:6.3f} %    "
                          f"{100 * k['same_top']:6.3f} ± {100 * k['same_top_unc']:6.3f} %")
            else:
                line.append(f"[{r.index}]{r.ppl:.4f},")
                if not tty and not quiet:
                    sys.stderr.write(line[-1])
                    sys.stderr.flush()
    if run.mode != "kld" and (tty or quiet):
        sys.stderr.write("".join(line))
    if run.mode != "kld":
        sys.stderr.write("\n")


def _say(bar, text: str) -> None:
    if bar is not None:
        bar.write(text, file=sys.stderr)
    else:
        log(text)


def _final_lines(rec: dict) -> None:
    """llama-perplexity's closing lines."""
    if rec["kind"] == "perplexity":
        if rec["ppl_unc"] is not None:
            log(f"Final estimate: PPL = {rec['ppl']:.4f} +/- {rec['ppl_unc']:.5f}")
        else:
            log(f"Final estimate: PPL = {rec['ppl']:.4f} (too few tokens for its +/-)")
        _speed(rec)
        return
    p, k, d = rec["ppl"], rec["kld"], rec["dp"]
    out = ["", "====== Perplexity statistics ======",
           f"Mean PPL(Q)                   : {p['q']:10.6f} ± {p['q_unc']:10.6f}",
           f"Mean PPL(base)                : {p['base']:10.6f} ± {p['base_unc']:10.6f}",
           f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * p['cor']:6.2f}%",
           f"Mean ln(PPL(Q)/PPL(base))     : {p['ln_ratio']:10.6f} ± {p['ln_ratio_unc']:10.6f}",
           f"Mean PPL(Q)/PPL(base)         : {p['ratio']:10.6f} ± {p['ratio_unc']:10.6f}",
           f"Mean PPL(Q)-PPL(base)         : {p['diff']:10.6f} ± {p['diff_unc']:10.6f}",
           "", "====== KL divergence statistics ======",
           f"Mean    KLD: {k['mean']:10.6f} ± {k['mean_unc']:10.6f}"]
    names = {"maximum": "Maximum", "median": "Median ", "minimum": "Minimum"}
    for key, v in k["percentiles"].items():
        label = names.get(key) or f"{float(key):4.1f}%  "
        out.append(f"{label} KLD: {v:10.6f}")
    if "top_k" in k:
        t = k["top_k"]
        out.append(f"(top-K base: the rest's mass averages {t['rest_mean']:.6f}; the full KLD exceeds the mean above "
                   f"by at most {t['bound_mean']:.6f})")
    out += ["", "====== Token probability statistics ======",
            f"Mean    Δp: {100 * d['mean']:6.3f} ± {100 * d['mean_unc']:5.3f} %"]
    for key, v in d["percentiles"].items():
        label = names.get(key) or f"{float(key):4.1f}%  "
        out.append(f"{label} Δp: {100 * v:6.3f}%")
    out += [f"RMS Δp    : {100 * d['rms']:6.3f} ± {100 * d['rms_unc']:5.3f} %",
            f"Same top p: {100 * rec['same_top']['p']:6.3f} ± {100 * rec['same_top']['unc']:5.3f} %"]
    for line in out:
        log(line)
    _speed(rec)


def _speed(rec: dict) -> None:
    if rec.get("tokens_per_second"):
        log(f"{rec['n_chunk'] * rec['n_ctx']} tokens in {rec['seconds']:.2f} s ({rec['tokens_per_second']:.1f} "
            "tokens/s)")
