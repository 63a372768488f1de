"""`ggtool generate --gguf MODEL (--prompt TEXT | --tokens JSON | -)`: a model continues a text, token
after token over a KV cache (ggtool.generate), printing the text as it comes."""

from __future__ import annotations

import codecs
import sys

import click

from ._common import PROGRAM_FILE, log, numerics_option, open_pool, pick_numerics, read_program, threads_option, warn_llama_cpp_gaps
from .tokenize import ids_json, parse_ids

HELP = """Continue a prompt with a GGUF model: the prompt is evaluated in one batch, then each new
token computes only its own row against the KV cache (F32 K and V of every earlier token), on a
graph built once per batch size. The text is printed as the tokens come (--format json: the new
token ids, as one JSON array, at the end). Generation stops at the model's end-of-generation token
(unless --ignore-eos), after -n tokens, or when the cache (--ctx-size) is full.

\b
The prompt: --prompt TEXT, tokenized with the model's vocabulary as `ggtool tokenize` does (BOS
added as the model says); --tokens JSON, the ids themselves; or '-' (or nothing): the text on stdin.

\b
The program: -f PROGRAM, or the one shipped for the model's general.architecture: llama
(fixtures/llama.gg; tied embeddings use token_embd.weight as llama.cpp does) and gemma3
(fixtures/gemma3.gg). Another architecture needs a program of your own (docs/dsl.md, "Persistent
state": the inputs and state a program uses to continue from a cache).

\b
Sampling: greedy (--temp 0, the default: the most likely token, as llama.cpp's greedy sampler);
with --temp T > 0, the --top-k most likely, then the smallest set reaching --top-p, drawn from
softmax(logits / T) with --seed (numpy's generator: not llama.cpp's draws).

\b
Examples:
  $ ggtool generate --gguf fixtures/stories260K.gguf --prompt 'Once upon a time, there was' -n 16
  $ ggtool generate --gguf fixtures/stories260K.gguf --tokens '[1,403,407,261,378]' --format json
"""


@click.command("generate", help=HELP, short_help="Continue a prompt with a model, token by token (KV cache).")
@click.argument("stdin_text", metavar="[-]", required=False)
@click.option("--gguf", "model", required=True, metavar="MODEL", type=click.Path(exists=True, dir_okay=False),
              help="The model (its weights, metadata and vocabulary).")
@click.option("-f", "--file", "program_file", type=PROGRAM_FILE,
              help="The model's program (default: the shipped one for its architecture).")
@click.option("--prompt", metavar="TEXT", help="The prompt as text.")
@click.option("--tokens", "tokens_json", metavar="JSON", help="The prompt as token ids, a JSON array.")
@click.option("-n", "--n-predict", "n_predict", type=click.IntRange(min=0), default=128, show_default=True,
              metavar="N", help="Generate at most N tokens.")
@click.option("--ctx-size", "-c", "ctx_size", type=click.IntRange(min=1), default=None, metavar="N",
              help="KV cache cells (default: the prompt's tokens plus N, at most the model's context length).")
@threads_option(help="Threads: this process and N-1 worker processes, kept for every step; by default a small "
                    "model computes in this process.")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at the end-of-generation token.")
@click.option("--temp", "temperature", type=click.FloatRange(min=0), default=0.0, show_default=True, metavar="T",
              help="Sampling temperature; 0 is greedy.")
@click.option("--top-k", type=click.IntRange(min=0), default=40, show_default=True, metavar="K",
              help="Sample among the K most likely tokens (0: all).")
@click.option("--top-p", type=click.FloatRange(min=0, max=1), default=0.95, show_default=True, metavar="P",
              help="Then among the fewest whose probabilities reach P.")
@click.option("--seed", type=int, default=None, metavar="S", help="Seed of the sampler's generator.")
@numerics_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: the new text as it comes; json: the new token ids.")
@click.option("-v", "--verbose", is_flag=True, help="Report the prompt's and the generation's speed on stderr.")
def command(stdin_text, model, program_file, prompt, tokens_json, n_predict, ctx_size, n_threads, ignore_eos,
            temperature, top_k, top_p, seed, numerics, fmt, verbose):
    from ggtool.dsl import parse
    from ggtool.generate import NoProgramError, Sampling, Session, generate, shipped_program
    from ggtool.plan import estimate_work
    from ggtool.threads import default_threads

    from .tokenize import load_vocab, read_text

    numerics = pick_numerics(numerics, verbose)
    given = [x for x in (prompt, tokens_json, stdin_text) if x is not None]
    if len(given) > 1:
        raise click.UsageError("give the prompt once: --prompt TEXT, --tokens JSON or '-' (stdin)")
    if stdin_text is not None and stdin_text != "-":
        raise click.UsageError(f"unexpected argument {stdin_text!r}; the prompt is --prompt TEXT")
    if not given and sys.stdin.isatty():   # nothing would end the wait but the user's Ctrl-D
        raise click.UsageError("no prompt: give --prompt TEXT or --tokens JSON, or pipe the text to stdin")
    piped = read_text("-", "the prompt") if prompt is None and tokens_json is None else None
    if piped == "":
        raise click.UsageError("no prompt: stdin is empty (--prompt '' starts from the empty text)")
    if program_file is not None:
        source, filename = read_program(None, program_file)
    else:
        from ggtool.gguf_io import open_gguf

        arch = open_gguf(model).metadata("general.architecture", "")
        try:
            path = shipped_program(arch)
        except NoProgramError as e:
            raise click.ClickException(f"{model}: {e} with -f PROGRAM") from None
        source, filename = path.read_text(encoding="utf-8"), str(path)
    program = parse(source, filename=filename)
    vocab = load_vocab(model)
    if tokens_json is not None:
        ids = parse_ids(tokens_json, "--tokens", click.UsageError)
        for t in ids:
            vocab.check_id(t)
    else:
        ids = vocab.tokenize(prompt if prompt is not None else piped)
    if not ids:
        raise click.UsageError("the prompt has no tokens")


    n_ctx = ctx_size or len(ids) + n_predict
    if ctx_size is None:
        from ggtool.gguf_io import open_gguf

        g = open_gguf(model)
        limit = g.metadata(f"{g.metadata('general.architecture', '')}.context_length", None)
        if isinstance(limit, int) and limit > 0:
            n_ctx = min(n_ctx, limit)
    if len(ids) > n_ctx:
        raise click.UsageError(f"the prompt has {len(ids)} tokens, more than the cache's {n_ctx} (--ctx-size)")
    n_predict = min(n_predict, n_ctx - len(ids) + 1)   # the last token is sampled, never evaluated

    session = Session(model, program, n_ctx=n_ctx, numerics=numerics)
    session.prepare(len(ids), 1)
    warn_llama_cpp_gaps(session.llama_cpp_gaps(), numerics)
    if n_threads is None:   # the engine's rule, for the step that repeats
        n_threads = default_threads(estimate_work(session.graph(1)), steps=max(1, n_predict - 1))
    session.n_threads, session.pool = n_threads, open_pool(n_threads)

    sampler = Sampling(temperature, top_k, top_p, seed).sampler()
    stop = frozenset() if ignore_eos else vocab.eog_ids
    out = sys.stdout
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    new, event = [], None
    for event in generate(session, ids, n_predict, sampler, stop):
        new.append(event.token)
        if fmt == "text":
            out.write(decoder.decode(vocab.token_to_piece(event.token)))
            out.flush()
    if fmt == "text":
        out.write(decoder.decode(b"", final=True) + "\n")
    else:
        out.write(ids_json(new) + "\n")
    if verbose and event is not None:
        log(f"prompt: {len(ids)} tokens in {event.prompt_seconds:.3f} s ({len(ids) / event.prompt_seconds:.1f} tokens/s)")
        steps = len(new) - 1
        if steps > 0:
            log(f"generated: {steps} tokens in {event.generate_seconds:.3f} s "
                f"({steps / event.generate_seconds:.1f} tokens/s; {n_threads} thread{'s' if n_threads > 1 else ''})")
