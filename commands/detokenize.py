"""`ggtool detokenize --gguf MODEL [IDS | -]`: the text of token ids, as llama.cpp renders them."""

from __future__ import annotations

import sys

import click

from ._json import dumps
from .tokenize import jsonl_lines, load_vocab, parse_ids, read_text

HELP = """Turn token ids back into text with the vocabulary of a GGUF model, as llama.cpp does:
each id's llama_token_to_piece concatenated, one leading space dropped when the first id is BOS
(what llama-cpp-python's Llama.detokenize gives), invalid UTF-8 replaced by U+FFFD.

IDS is a JSON array of ids (whitespace- or comma-separated integers will do too); '-' (the
default) reads it from stdin. Special (CONTROL) tokens such as BOS render as nothing unless
--unparse-special. An id outside the vocabulary is an error.

\b
--jsonl: stdin holds one JSON array per line; one JSON string per line is printed.
--json: print the text as a JSON string (exact: no newline is added).

\b
Examples:
  $ ggtool detokenize --gguf fixtures/stories260K.gguf '[1,403,407,261,378]'
  Once upon a time
  $ ggtool tokenize --gguf fixtures/stories260K.gguf 'Lily' | ggtool detokenize --gguf fixtures/stories260K.gguf
  Lily
"""


@click.command("detokenize", help=HELP, short_help="Token ids to text with a GGUF model's vocabulary (llama.cpp's).")
@click.argument("ids", required=False, metavar="[IDS | -]")
@click.option("--gguf", "model", required=True, metavar="MODEL", type=click.Path(exists=True, dir_okay=False),
              help="The GGUF file whose vocabulary to use.")
@click.option("--unparse-special", is_flag=True, help="Render special tokens' text (<s>, <|im_end|>).")
@click.option("--jsonl", is_flag=True, help="stdin: one JSON array per line; print one JSON string per line.")
@click.option("--json", "as_json", is_flag=True, help="Print the text as a JSON string.")
def command(ids, model, unparse_special, jsonl, as_json):
    if jsonl and ids not in (None, "-"):
        raise click.UsageError("with --jsonl the ids come from stdin: give no IDS (or '-')")
    vocab = load_vocab(model)
    out = sys.stdout
    if jsonl:
        rows = [parse_ids(dumps(v), f"stdin line {no}") for no, v in jsonl_lines(list, "a JSON array")]
        out.write("".join(dumps(vocab.decode(ids, unparse_special)) + "\n" for ids in rows))
        return
    where = "IDS" if ids not in (None, "-") else "stdin"
    text = vocab.decode(parse_ids(read_text(ids, "the token ids"), where), unparse_special)
    out.write(dumps(text) + "\n" if as_json else text + "\n")
