"""`ggtool generate --gguf MODEL (--prompt TEXT | --tokens JSON | - | --chat ...)`: a model continues
a text, or answers in a conversation, token after token over a KV cache (ggtool.generate), sampled
as llama.cpp samples. Here: the options read, the engine called, the text or records printed."""

from __future__ import annotations

import sys

import click

from ggtool.generate.programs import shipped_names

from ._common import PROGRAM_FILE, log, numerics_option, pick_numerics, read_program, threads_option, warn_llama_cpp_gaps
from .tokenize import ids_json, parse_ids

HELP = f"""\b
Continue a prompt with a GGUF model, as llama.cpp's llama-completion does: the prompt is
evaluated in one batch, then each new token computes only its own row against the KV cache, and
each is chosen by llama.cpp's sampler chain, bit for bit (the same seed and logits give the same
tokens). The text is printed as it comes. Generation ends at the model's end-of-generation token
(unless --ignore-eos), at a --stop string, after -n tokens, or when the cache (--ctx-size) is full.

\b
The prompt: --prompt TEXT (tokenized as `ggtool tokenize` does: BOS as the model says), --tokens
JSON (the ids), or '-' (or nothing): the text on stdin.

\b
Chat (--chat): the prompt is the user's message, rendered with the model's chat template
(tokenizer.chat_template, or --chat-template FILE) after --system TEXT and the conversation of
--messages FILE.jsonl (one {{"role": ..., "content": ...}} per line); --dry-run prints the rendered
prompt and stops; -i talks: one message per line typed, the KV cache kept between turns.

\b
Sampling, llama.cpp's chain and defaults: the logit bias, penalties (--repeat-last-n 64,
--repeat-penalty 1 = off, --frequency-penalty, --presence-penalty), DRY (--dry-multiplier 0 =
off), top-n-sigma (off), --top-k 40, --typical 1 (off), --top-p 0.95, --min-p 0.05, XTC (off),
--temp 0.8, then a draw with std::mt19937 seeded by --seed (default: a random seed; -v shows it).
--temp 0 is greedy. --mirostat 1|2 replaces the chain.

\b
The program: -f PROGRAM, or the one shipped for the model's general.architecture
({shipped_names()}: ggtool/programs/). Another architecture needs a program of your own
(docs/dsl.md).

\b
Output: --format text (the new text as it comes), json (the new ids, one array at the end) or
jsonl (one record per token: id, piece, text; with --logprobs N its log-probability and the N most
likely tokens; the last record says why generation ended: eos, stop, length or context-full).

\b
Examples:
  $ ggtool generate --gguf fixtures/stories260K.gguf --prompt 'Once upon a time, there was' --temp 0 -n 16
  $ ggtool generate --gguf fixtures/stories260K.gguf --prompt 'Once upon a time' --seed 7 --stop '.'
  $ ggtool generate --gguf model.gguf --chat --system 'Answer briefly.' --prompt 'What is GGUF?'
"""

MAX_FILE_BYTES = 16 << 20   # --messages, --chat-template


def _float(name, default, help):
    return click.option(name, type=float, default=default, show_default=True, metavar="X", help=help)


def sampling_options(f):
    """llama.cpp's sampling options, with its names and defaults."""
    opts = [
        click.option("--seed", "-s", type=int, default=None, metavar="S",
                     help="The draws' seed, 0 to 4294967295 (default, -1 or 4294967295: a random one; -v shows it)."),
        _float("--temp", 0.8, "Temperature; 0 is greedy."),
        click.option("--top-k", type=int, default=40, show_default=True, metavar="K",
                     help="Keep the K most likely tokens (0: all)."),
        _float("--top-p", 0.95, "Then the fewest whose probabilities reach P (1: off)."),
        _float("--min-p", 0.05, "Then those at least P times the most likely's probability (0: off)."),
        _float("--typical", 1.0, "Locally typical sampling's P (1: off)."),
        _float("--top-n-sigma", -1.0, "Keep logits within N standard deviations of the largest (-1: off)."),
        _float("--xtc-probability", 0.0, "XTC: the chance of removing the top choices (0: off)."),
        _float("--xtc-threshold", 0.1, "XTC: the probability a top choice must reach (above 0.5: off)."),
        _float("--dynatemp-range", 0.0, "Dynamic temperature: temp +- this, by entropy (0: off)."),
        _float("--dynatemp-exp", 1.0, "Dynamic temperature's exponent."),
        click.option("--repeat-last-n", type=int, default=64, show_default=True, metavar="N",
                     help="Penalize the last N tokens, the prompt's too (0: off)."),
        _float("--repeat-penalty", 1.0, "Divide a repeated token's logit by this (1: off)."),
        _float("--frequency-penalty", 0.0, "Subtract this times a token's count (0: off)."),
        _float("--presence-penalty", 0.0, "Subtract this from a token seen (0: off)."),
        _float("--dry-multiplier", 0.0, "DRY: the penalty of a repetition (0: off)."),
        _float("--dry-base", 1.75, "DRY: its base, raised to the repetition's length."),
        click.option("--dry-allowed-length", type=int, default=2, show_default=True, metavar="N",
                     help="DRY: repetitions up to this long go free."),
        click.option("--dry-penalty-last-n", type=int, default=64, show_default=True, metavar="N",
                     help="DRY: how many tokens to scan (0: off)."),
        click.option("--dry-sequence-breaker", multiple=True, metavar="TEXT",
                     help="DRY: a text that ends a repetition (repeatable; replaces \\n : \" *; 'none': no breaker)."),
        click.option("--mirostat", type=int, default=0, show_default=True, metavar="N",
                     help="Mirostat sampling, version 1 or 2 (0: off; replaces the chain)."),
        _float("--mirostat-lr", 0.1, "Mirostat's learning rate (eta)."),
        _float("--mirostat-ent", 5.0, "Mirostat's target entropy (tau)."),
        click.option("--samplers", metavar="LIST", default=None,
                     help="The chain's order, names separated by ';' (default: penalties;dry;top_n_sigma;top_k;"
                          "typ_p;top_p;min_p;xtc;temperature)."),
        click.option("--logit-bias", "-l", multiple=True, metavar="ID(+|-)BIAS",
                     help="Add BIAS to token ID's logit, e.g. 15043+1 or 2-inf (repeatable)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@click.command("generate", help=HELP, short_help="Continue a prompt or chat with a model, sampled as llama.cpp.")
@click.argument("stdin_text", metavar="[-]", required=False)
@click.option("--gguf", "model_path", required=True, metavar="MODEL", type=click.Path(exists=True, dir_okay=False),
              help="The model (its weights, metadata and vocabulary).")
@click.option("-f", "--file", "program_file", type=PROGRAM_FILE,
              help="The model's program (default: the shipped one for its architecture).")
@click.option("--prompt", metavar="TEXT", help="The prompt as text (with --chat: the user's message).")
@click.option("--tokens", "tokens_json", metavar="JSON", help="The prompt as token ids, a JSON array.")
@click.option("--chat", is_flag=True, help="Render the prompt as a conversation with the model's chat template.")
@click.option("--system", metavar="TEXT", help="--chat: a system message first.")
@click.option("--messages", "messages_file", metavar="FILE.jsonl", type=click.Path(dir_okay=False, allow_dash=True),
              help="--chat: the conversation so far, one JSON message per line ('-': stdin).")
@click.option("--chat-template", "template_file", metavar="FILE", type=click.Path(exists=True, dir_okay=False),
              help="--chat: this Jinja template instead of the model's.")
@click.option("--dry-run", is_flag=True, help="--chat: print the prompt as it will be tokenized, and stop.")
@click.option("-i", "--interactive", is_flag=True, help="--chat: a conversation on the terminal, one message per line.")
@click.option("-n", "--n-predict", "n_predict", type=click.IntRange(min=0), default=None, metavar="N",
              help="Generate at most N tokens (default 128; -i: until the end of each turn).")
@click.option("--ctx-size", "-c", "ctx_size", type=click.IntRange(min=1), default=None, metavar="N",
              help="KV cache cells (default: the prompt's tokens plus N, at most the model's context; -i: 4096).")
@threads_option(help="Threads: this process and N-1 worker processes, kept for every step; by default a small "
                    "model computes in this process.")
@click.option("--ignore-eos", is_flag=True, help="Never end at an end-of-generation token (llama.cpp: they get -inf).")
@click.option("--stop", "stops", multiple=True, metavar="TEXT",
              help="End where this text appears; the text before it is printed (repeatable).")
@sampling_options
@numerics_option
@click.option("--format", "fmt", type=click.Choice(["text", "json", "jsonl"]), default="text", show_default=True,
              help="text: the new text as it comes; json: the new ids; jsonl: one record per token.")
@click.option("--logprobs", type=click.IntRange(min=0, max=100), default=None, metavar="N",
              help="--format jsonl: each token's log-probability and the N most likely tokens' (softmax of the "
                   "model's logits).")
@click.option("-v", "--verbose", is_flag=True, help="Report the seed, the chain and the speed on stderr.")
def command(stdin_text, model_path, program_file, prompt, tokens_json, chat, system, messages_file, template_file,
            dry_run, interactive, n_predict, ctx_size, n_threads, ignore_eos, stops, numerics, fmt, logprobs, verbose,
            **sampling_args):
    from ggtool.generate import open_model

    ctx = click.get_current_context()
    _check_usage(stdin_text, prompt, tokens_json, chat, system, messages_file, template_file, dry_run, interactive,
                 fmt, logprobs, stops)
    sampling = make_sampling(ctx, sampling_args, ignore_eos)
    numerics = pick_numerics(numerics, verbose)
    template_text = _read_file(template_file, "--chat-template") if template_file else None
    messages = _read_messages(messages_file) if messages_file else []
    piped = None
    if prompt is None and tokens_json is None and not interactive and (not chat or not messages_file):
        if sys.stdin.isatty():   # nothing would end the wait but the user's Ctrl-D
            raise click.UsageError("no prompt: give --prompt TEXT or --tokens JSON, or pipe the text to stdin")
        from .tokenize import read_text

        piped = read_text("-", "the prompt")
        if piped == "":
            raise click.UsageError("no prompt: stdin is empty (--prompt '' starts from the empty text)")

    program = None
    if program_file is not None:
        from ggtool.dsl import parse

        source, filename = read_program(None, program_file)
        program = parse(source, filename=filename)
    model = open_model(model_path, program)

    if chat:
        template = model.chat_template(template_text, template_file)
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        user = prompt if prompt is not None else piped
        if user is not None:
            messages.append({"role": "user", "content": user})
        if interactive:
            return _interactive(model, template, messages, sampling, n_predict, ctx_size, n_threads, numerics,
                                stops, ignore_eos, verbose)
        text, ids = model.chat_prompt(template.render(messages))
        if dry_run:
            sys.stdout.write(text)
            return
    elif tokens_json is not None:
        ids = parse_ids(tokens_json, "--tokens", click.UsageError)
        for t in ids:
            model.vocab.check_id(t)
    else:
        ids = model.tokenize(prompt if prompt is not None else piped)
    if not ids:
        raise click.UsageError("the prompt has no tokens")

    n_predict = 128 if n_predict is None else n_predict
    n_ctx, notes = model.context_size(ctx_size, len(ids), n_predict)
    if len(ids) > n_ctx:
        raise click.UsageError(f"the prompt has {len(ids)} tokens, more than the cache's {n_ctx} (--ctx-size)")
    _check_stops(model, stops, n_ctx - len(ids) + 1, n_predict)
    gen = model.generator(n_ctx, n_threads, numerics, steps=min(n_predict, n_ctx - len(ids) + 1) - 1)
    _warn(notes, gen, numerics)
    chain = model.sampler(sampling)
    if verbose:
        log(f"sampler seed: {chain.seed}; chain: {' -> '.join(chain.names)}")
    steps = gen.generate(ids, n_predict, chain, model.stop_ids(ignore_eos), stops, logprobs or 0)
    last, n_steps = _print(steps, model, fmt, logprobs, chain.seed)
    if verbose and last is not None:
        _speed(len(ids), last, n_steps, gen.n_threads)


def _check_usage(stdin_text, prompt, tokens_json, chat, system, messages_file, template_file, dry_run, interactive,
                 fmt, logprobs, stops):
    given = [x for x in (prompt, tokens_json, stdin_text) if x is not None]
    if len(given) > 1:
        raise click.UsageError("give the prompt once: --prompt TEXT, --tokens JSON or '-' (stdin)")
    if stdin_text is not None and stdin_text != "-":
        raise click.UsageError(f"unexpected argument {stdin_text!r}; the prompt is --prompt TEXT")
    chat_only = [n for n, v in (("--system", system), ("--messages", messages_file), ("--chat-template", template_file),
                                ("--dry-run", dry_run), ("-i", interactive)) if v]
    if chat_only and not chat:
        raise click.UsageError(f"{chat_only[0]} is for a conversation: add --chat")
    if chat and tokens_json is not None:
        raise click.UsageError("--chat renders text: give the user's message with --prompt TEXT (or stdin), not --tokens")
    if interactive:
        if not sys.stdin.isatty():
            raise click.UsageError("-i talks on a terminal, and stdin is not one (a conversation from a file: "
                                   "--messages FILE.jsonl)")
        if fmt != "text" or dry_run:
            raise click.UsageError("-i prints text: no --format json/jsonl, no --dry-run")
        if messages_file == "-":
            raise click.UsageError("-i reads the terminal: --messages cannot be '-'")
    if logprobs is not None and fmt != "jsonl":
        raise click.UsageError("--logprobs goes in the records of --format jsonl")
    for s in stops:
        if s == "":
            raise click.UsageError("--stop '': an empty text would stop before the first token")


def make_sampling(ctx: click.Context, args: dict, ignore_eos: bool):
    """The Sampling of the options given; a value out of range is a usage error naming its option."""
    from click.core import ParameterSource

    from ggtool.generate import Sampling, SamplingError, parse_logit_bias

    from .wording import SAMPLING_OPTIONS, cli_message

    given = frozenset(field for field, flag in SAMPLING_OPTIONS.items()
                      if ctx.get_parameter_source(flag.lstrip("-").replace("-", "_")) not in (None, ParameterSource.DEFAULT))
    seed = args["seed"]
    breakers = args["dry_sequence_breaker"]
    try:
        return Sampling(
            seed=seed, temperature=args["temp"], top_k=args["top_k"],
            top_p=args["top_p"], min_p=args["min_p"], typical_p=args["typical"], top_n_sigma=args["top_n_sigma"],
            xtc_probability=args["xtc_probability"], xtc_threshold=args["xtc_threshold"],
            dynatemp_range=args["dynatemp_range"], dynatemp_exponent=args["dynatemp_exp"],
            repeat_last_n=args["repeat_last_n"], repeat_penalty=args["repeat_penalty"],
            frequency_penalty=args["frequency_penalty"], presence_penalty=args["presence_penalty"],
            dry_multiplier=args["dry_multiplier"], dry_base=args["dry_base"],
            dry_allowed_length=args["dry_allowed_length"], dry_penalty_last_n=args["dry_penalty_last_n"],
            dry_sequence_breakers=(() if breakers == ("none",) else tuple(breakers)) if breakers
            else Sampling.dry_sequence_breakers,
            mirostat=args["mirostat"], mirostat_tau=args["mirostat_ent"], mirostat_eta=args["mirostat_lr"],
            order=tuple(args["samplers"].split(";")) if args["samplers"] is not None else Sampling.order,
            logit_bias=tuple(parse_logit_bias(b) for b in args["logit_bias"]),
            ignore_eos=ignore_eos, given=given)
    except SamplingError as e:
        raise click.UsageError(cli_message(e)) from None


def _read_file(path: str, option: str) -> str:
    """A text file of at most MAX_FILE_BYTES ('-': stdin), as UTF-8."""
    from ggtool.errors import GGToolError

    from ._streams import read_stdin

    if path == "-":
        raw = read_stdin(option, MAX_FILE_BYTES)
        name = "<stdin>"
    else:
        name = path
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
        except OSError as e:
            raise GGToolError(f"{option} {path}: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise GGToolError(f"{option} {name}: larger than {MAX_FILE_BYTES >> 20} MiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GGToolError(f"{option} {name}: not UTF-8 text (byte {e.start})") from None


def _read_messages(path: str) -> list[dict]:
    from ggtool.generate import read_messages

    return read_messages(_read_file(path, "--messages"), f"--messages {'<stdin>' if path == '-' else path}")


def _check_stops(model, stops, room: int, n_predict: int) -> None:
    """A stop string that the tokens this run may generate cannot spell is refused."""
    if not stops:
        return
    # a token's bytes are at most its text's in the vocabulary (SentencePiece's "▁" is 3 bytes for 1)
    most = max(1, min(room, n_predict)) * max(len(t.encode("utf-8", "surrogatepass")) for t in model.vocab.tokens)
    for s in stops:
        n = len(s.encode("utf-8", "surrogatepass"))
        if n > most:
            raise click.UsageError(f"--stop: a text of {n} bytes can never appear: the at most {min(room, n_predict)} "
                                   f"tokens this run generates (-n, --ctx-size) spell at most {most} bytes")


def _warn(notes, gen, numerics: str) -> None:
    for note in notes:
        if note.kind == "over-trained":
            d = note.details
            log(f"Warning: the model was trained on only {d['n_ctx_train']} tokens of context (--ctx-size "
                f"{d['n_ctx']}); {gen.cache_note().message}")
        else:
            log(f"Warning: {note.message}")
    for note in gen.notes:
        log(f"Warning: {note.message}")
    warn_llama_cpp_gaps(gen.session.llama_cpp_gaps(), numerics)


def _print(steps, model, fmt: str, logprobs, seed: int):
    from ._json import compact

    out = sys.stdout
    last, ids, text = None, [], []
    for step in steps:
        last = step
        ids.append(step.token)
        if fmt == "text":
            if step.text:
                out.write(step.text)
                out.flush()
        elif fmt == "jsonl":
            text.append(step.text)
            out.write(compact(_record(step, model, logprobs, seed, "".join(text) if step.end else None)) + "\n")
            out.flush()
    if fmt == "text":
        out.write("\n")
    elif fmt == "json":
        out.write(ids_json(ids) + "\n")
    elif fmt == "jsonl" and last is None:   # nothing generated (-n 0): the end alone
        out.write(compact({"end": "length", "seed": seed, "completion": ""}) + "\n")
    return last, len(ids)


def _record(step, model, logprobs, seed, text) -> dict:
    """One --format jsonl record."""
    r = {"id": step.token, "piece": step.piece.decode("utf-8", "replace"), "text": step.text}
    try:
        step.piece.decode("utf-8")
    except UnicodeDecodeError:
        r["bytes"] = list(step.piece)
    if logprobs is not None:
        r["logprob"] = step.logprob
        r["top"] = [{"id": t, "piece": model.vocab.token_to_piece(t, special=True).decode("utf-8", "replace"),
                     "logprob": lp} for t, lp in step.top]
    if step.end:
        r["end"] = step.end
        if step.stop is not None:
            r["stop"] = step.stop
        r["seed"] = seed
        r["completion"] = text
    return r


def _speed(n_prompt: int, last, n_steps: int, n_threads: int) -> None:
    if last.prompt_seconds > 0:
        log(f"prompt: {n_prompt} tokens in {last.prompt_seconds:.3f} s ({n_prompt / last.prompt_seconds:.1f} tokens/s)")
    steps = n_steps - 1          # the first token comes with the prompt's logits
    if steps > 0 and last.generate_seconds > 0:
        log(f"generated: {steps} tokens in {last.generate_seconds:.3f} s ({steps / last.generate_seconds:.1f} tokens/s; "
            f"{n_threads} thread{'s' if n_threads > 1 else ''})")


def _interactive(model, template, messages, sampling, n_predict, ctx_size, n_threads, numerics, stops, ignore_eos,
                 verbose):
    """A conversation on the terminal: each line typed is the user's message; the reply streams; the
    KV cache keeps what the next turn shares with this one. Ctrl-D (or an empty line twice) ends."""
    n_ctx, notes = model.context_size(ctx_size, 0, 0, conversation=True)
    gen = model.generator(n_ctx, n_threads, numerics, steps=n_ctx)   # a conversation: many steps
    _warn(notes, gen, numerics)
    chain = model.sampler(sampling)
    if verbose:
        log(f"sampler seed: {chain.seed}; chain: {' -> '.join(chain.names)}")
    log("Type a message and Enter; Ctrl-D ends the conversation.")
    pending = bool(messages) and messages[-1]["role"] == "user"
    while True:
        if not pending:
            sys.stderr.write("> ")     # the prompt goes where diagnostics go: stdout carries the replies only
            sys.stderr.flush()
            try:
                line = input()
            except EOFError:
                log("")
                return
            if not line.strip():
                continue
            messages.append({"role": "user", "content": line})
        pending = False
        _, ids = model.chat_prompt(template.render(messages))
        room = n_ctx - len(ids) + 1
        if room <= 1:
            log(f"The conversation fills the KV cache ({n_ctx} cells, --ctx-size): it ends here.")
            return
        limit = room if n_predict is None else min(n_predict, room)
        reply, end = [], None
        for step in gen.generate(ids, limit, chain, model.stop_ids(ignore_eos), stops):
            reply.append(step.text)
            sys.stdout.write(step.text)
            sys.stdout.flush()
            end = step.end
        sys.stdout.write("\n")
        sys.stdout.flush()
        if verbose:
            log(f"turn: {len(ids)} prompt tokens, {gen.reused} of them from the KV cache")
        messages.append({"role": "assistant", "content": "".join(reply)})
        if end == "context-full":
            log(f"The KV cache is full ({n_ctx} cells, --ctx-size): the conversation ends here.")
            return
