"""`ggtool tokenize --gguf MODEL [TEXT | -]`: a text's token ids, as llama.cpp's llama_tokenize gives them.

Also the text-in helpers `ggtool detokenize` shares (commands/detokenize.py)."""

from __future__ import annotations

import json
import sys

import click

from ggtool import json_input
from ggtool.errors import InputError

from ._json import compact, dumps
from ._streams import read_stdin

HELP = """Tokenize TEXT with the vocabulary of a GGUF model, exactly as llama.cpp does
(llama_tokenize), and print the ids as a JSON array.

The vocabulary is read from the model's tokenizer.* metadata: tokenizer.ggml.model "llama"
(SentencePiece: Llama 2, stories260K, Gemma 3) or "gpt2" (byte-level BPE with the pre-tokenizer
tokenizer.ggml.pre names: qwen2, smollm, llama-bpe, default, ...); a tensor-free vocab-only GGUF
will do. TEXT '-' (the default) reads all of stdin, as UTF-8 (a trailing newline is part of it).

\b
By default BOS/EOS are added as the model's metadata says (--no-add-special: not), and text that
looks like a CONTROL token (<s>, <|im_start|>, <start_of_turn>) is tokenized as plain text
(--parse-special: as the token). USER_DEFINED tokens are always matched, as llama.cpp does.

\b
--jsonl: stdin holds one JSON string per line; one JSON array per line is printed.
--pieces: one line per token, its id and its text ("-> " then a JSON string; special tokens
shown; an incomplete UTF-8 sequence as \\xNN).

\b
Examples:
  $ ggtool tokenize --gguf fixtures/stories260K.gguf 'Once upon a time'
  [1,403,407,261,378]
  $ printf '"Hello"\\n"Lily"\\n' | ggtool tokenize --gguf fixtures/stories260K.gguf --jsonl
  $ ggtool tokenize --gguf model.gguf --parse-special '<|im_start|>user' --pieces
"""


def load_vocab(path: str):
    from ggtool.tokenizer import Vocab

    return Vocab.from_gguf(path)


def read_text(text: str | None, what: str = "the text") -> str:
    """TEXT as given, or all of stdin ('-' or no TEXT), which must be UTF-8."""
    if text is not None and text != "-":
        _check_text(text, "TEXT")
        return text
    raw = read_stdin(what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise click.ClickException(f"stdin is not UTF-8 text (byte {e.start}: 0x{raw[e.start]:02x})") from None


def _check_text(text: str, where: str) -> None:
    """An argument the shell could not decode as UTF-8 holds surrogates: refuse it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise click.ClickException(f"{where} is not UTF-8 text (character {e.start})") from None


def jsonl_lines(kind: type, what: str) -> list:
    """(line number, value) for each non-blank stdin line, a JSON value of type `kind`; all are
    checked before any output is made."""
    return list(_jsonl_lines(kind, what))


def _jsonl_lines(kind: type, what: str):
    for no, line in enumerate(read_text("-", "the lines").splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json_input.loads(line)
        except json.JSONDecodeError as e:
            raise click.ClickException(f"stdin line {no}: not JSON ({e.msg}, column {e.colno})") from None
        except InputError as e:
            raise click.ClickException(f"stdin line {no}: {e}") from None
        if not isinstance(value, kind):
            raise click.ClickException(f"stdin line {no}: expected {what}, got {type(value).__name__}")
        yield no, value


def ids_json(ids: list[int]) -> str:
    return compact(ids)


def parse_ids(text: str, where: str, error: type[click.ClickException] = click.ClickException) -> list[int]:
    """Token ids from a JSON array (`[1,403,407]`) or numbers separated by spaces or commas: the one
    reader of ids, for detokenize's IDS and stdin and generate's --tokens."""
    s = text.strip()
    if not s:
        raise error(f"{where} is empty; give token ids, e.g. [1,403,407] ([] for none)")
    try:
        ids = json_input.loads(s) if s.startswith("[") else [int(t) for t in s.replace(",", " ").split()]
    except json.JSONDecodeError as e:
        raise error(f"{where} is not JSON ({e.msg}, column {e.colno}); give token ids, e.g. [1,403,407]") from None
    except InputError as e:
        raise error(f"{where}: {e}; give token ids, e.g. [1,403,407]") from None
    except ValueError:
        raise error(f"{where}: not a JSON array of token ids, e.g. [1,403,407]") from None
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise error(f"{where}: not a JSON array of token ids, e.g. [1,403,407]")
    return ids


def piece_lines(vocab, ids: list[int]) -> str:
    lines = []
    for t in ids:
        piece = vocab.token_to_piece(t, special=True).decode("utf-8", "backslashreplace")
        lines.append(f"{t:6d} -> {dumps(piece)}\n")
    return "".join(lines)


@click.command("tokenize", help=HELP, short_help="Text to token ids with a GGUF model's vocabulary (llama.cpp's).")
@click.argument("text", required=False, metavar="[TEXT | -]")
@click.option("--gguf", "model", required=True, metavar="MODEL", type=click.Path(exists=True, dir_okay=False),
              help="The GGUF file whose vocabulary to use.")
@click.option("--add-special/--no-add-special", default=True, show_default=True,
              help="Add BOS/EOS as the model's metadata says (llama_tokenize's add_special).")
@click.option("--parse-special", is_flag=True,
              help="Tokenize CONTROL tokens' text as those tokens (llama_tokenize's parse_special).")
@click.option("--jsonl", is_flag=True, help="stdin: one JSON string per line; print one JSON array per line.")
@click.option("--pieces", is_flag=True, help="Print each id with its text, one per line.")
def command(text, model, add_special, parse_special, jsonl, pieces):
    if jsonl and pieces:
        raise click.UsageError("--jsonl and --pieces cannot be used together")
    if jsonl and text not in (None, "-"):
        raise click.UsageError("with --jsonl the texts come from stdin: give no TEXT (or '-')")
    vocab = load_vocab(model)
    out = sys.stdout
    if jsonl:
        texts = jsonl_lines(str, "a JSON string")
        for no, s in texts:
            _check_text(s, f"stdin line {no}")
        out.write("".join(ids_json(vocab.tokenize(s, add_special, parse_special)) + "\n" for _, s in texts))
        return
    ids = vocab.tokenize(read_text(text), add_special, parse_special)
    out.write(piece_lines(vocab, ids) if pieces else ids_json(ids) + "\n")
