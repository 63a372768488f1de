"""`ggtool inspect FILE.gguf`: header, metadata, tensor table and totals of a GGUF file."""

from __future__ import annotations

import re
import sys

import click

from ggtool.gguf_io import GGUFFile
from ggtool.gguf_io import inspect as I

from ._common import GGML_ORDER_HELP

HELP = f"""Describe a GGUF file: header, metadata key/values, tensor table and totals.

The file is memory-mapped and only its header is parsed, so even a large model opens at once;
long strings and arrays are shortened (first 60 characters / 8 items) unless --full.

\b
Tensor table: index, name, type, ne (GGML order, ne0 first), bytes, bits per weight and the
absolute offset of the data in the file. Totals per type follow.
--stats adds min/max/mean/std of every tensor's dequantized values (reads all the data; a
progress bar shows on a terminal).
--json: {{"file", "version", "alignment", "data_offset", "file_size", "n_kv", "n_tensors",
"metadata": [{{"key", "type", "value", "count"?, "truncated"?}}], "tensors": [{{"name", "type",
"ne", "bytes", "bpw", "offset", "stats"?}}], "totals": {{...}}}} with a trailing newline.
--diffable: no offsets, file size or directory, keys and tensors sorted by name, so the output of
two files can be diffed (e.g. a model and its quantized version).
A model split by gguf-split is described whole from its first shard (model-00001-of-00003.gguf):
a line (--json: "shards") lists its files, and each tensor's shard is the number in the name of
the file holding it (its offset is in that file). A later shard alone, or a missing one, is an
error.

\b
Examples:
  $ ggtool inspect model.gguf
  $ ggtool inspect model.gguf --json | jq '.tensors[] | select(.type == "q4_0") | .name'
  $ diff <(ggtool inspect a.gguf --diffable) <(ggtool inspect b.gguf --diffable)
  $ ggtool inspect model-q4_0.gguf --stats
  $ ggtool inspect model.gguf --only '^blk\\.0\\.|rope'

{GGML_ORDER_HELP}
"""


def _regex(ctx, param, value):
    if value is None:
        return None
    try:
        return re.compile(value)
    except re.error as e:
        raise click.BadParameter(f"{value!r} is not a regular expression: {e}", ctx=ctx, param=param) from None


@click.command("inspect", help=HELP, short_help="Describe a GGUF file: metadata, tensors, totals.")
@click.argument("path", metavar="FILE.gguf", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")
@click.option("--diffable", is_flag=True, help="No offsets; sorted keys and tensors (for diff).")
@click.option("--full", is_flag=True, help="Do not shorten long strings and arrays.")
@click.option("--stats", is_flag=True, help="Add min/max/mean/std per tensor (dequantized).")
@click.option("--only", metavar="REGEX", callback=_regex,
              help="Only the metadata keys and tensors whose name matches REGEX (re.search), e.g. '^blk\\.0\\.' "
                   "or 'rope'; totals count those tensors.")
def command(path, as_json, diffable, full, stats, only):
    g = GGUFFile(path)
    d = I.describe(g, full=full, diffable=diffable, only=only.search if only is not None else None)
    st = None
    if stats:
        st = {}
        bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm
            bar = tqdm(total=d["totals"]["bytes"], unit="B", unit_scale=True, unit_divisor=1024,
                       file=sys.stderr, desc="stats", leave=False, dynamic_ncols=True)
        try:
            for t in d["tensors"]:
                st[t["name"]] = I.tensor_stats(g, t["name"], on_bytes=bar.update if bar else None)
        finally:
            if bar is not None:
                bar.close()
        for t in d["tensors"]:
            t["stats"] = st[t["name"]]
    out = sys.stdout
    out.write(I.json_text(d) if as_json else I.format_describe(d, st))
    out.flush()
