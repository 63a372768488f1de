"""`ggtool inspect FILE.gguf`: header, metadata, tensor table and totals of a GGUF file."""

from __future__ import annotations

import click
import numpy as np

from ggtool.gguf_io import GGUFFile
from ggtool.gguf_io import inspect as I
from ggtool.gguf_io.format import quote_text
from ggtool.user_regex import RegexError, UserRegex

from ._common import GGML_ORDER_HELP, write_text
from ._json import document
from ._progress import progress_bar
from ._table import bracketed, table

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
        return UserRegex(value, "only")      # searched with a time bound
    except RegexError as e:
        raise click.BadParameter(f"{value!r} is not a regular expression: {e.problem}", ctx=ctx, param=param) from None


@click.command("inspect", help=HELP, short_help="Describe a GGUF file: metadata, tensors, totals.")
@click.argument("path", metavar="FILE.gguf", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")
@click.option("--diffable", is_flag=True, help="No offsets; sorted keys and tensors (for diff).")
@click.option("--full", is_flag=True, help="Do not shorten long strings and arrays.")
@click.option("--stats", is_flag=True, help="Add min/max/mean/std per tensor (dequantized).")
@click.option("--only", metavar="REGEX", callback=_regex,
              help="Only the metadata keys and tensors whose name matches REGEX (a search, as re.search; time-bounded), e.g. '^blk\\.0\\.' "
                   "or 'rope'; totals count those tensors.")
def command(path, as_json, diffable, full, stats, only):
    g = GGUFFile(path)
    d = I.describe(g, full=full, diffable=diffable, only=only.search if only is not None else None)
    st = None
    if stats:
        st = {}
        with progress_bar(d["totals"]["bytes"], "stats", "B", scale=1024) as bar:
            for t in d["tensors"]:
                st[t["name"]] = I.tensor_stats(g, t["name"], on_bytes=bar.update if bar else None)
        for t in d["tensors"]:
            t["stats"] = st[t["name"]]
    write_text([document(d) if as_json else describe_text(d, st)])


# -- the text report ---------------------------------------------------------------------------------
def _fmt_scalar(v, vtype: str) -> str:
    if isinstance(v, str):
        return quote_text(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return str(np.float32(v)) if "FLOAT32" in vtype else repr(v)
    return str(v)


def _value_text(item: dict) -> str:
    """A metadata value as the report shows it: arrays and long strings with what was left out."""
    vtype = item["type"]
    if "count" in item:
        inner = ", ".join(_fmt_scalar(x, vtype) for x in item["value"])
        more = f", ... ({item['count']} items)" if item.get("truncated") else ""
        return f"[{inner}{more}]"
    s = _fmt_scalar(item["value"], vtype)
    if item.get("truncated"):
        s = s[:-1] + f'..." ({item["length"]} chars)'
    return s


def _of(shown: int, total: int) -> str:
    return str(total) if shown == total else f"{shown} of {total}"


def describe_text(d: dict, stats: dict | None = None) -> str:
    """`inspect`'s report of a describe() record (and tensor_stats per tensor name)."""
    head = (f"{d['file']}: GGUF v{d['version']}, {d['n_kv']} metadata keys, {d['n_tensors']} tensors, "
            f"alignment {d['alignment']}")
    lines = [head]
    if "data_offset" in d:
        lines.append(f"data offset {d['data_offset']:,}, file size {d['file_size']:,} bytes")
    if "shards" in d:
        lines.append(f"split model, {len(d['shards'])} shards: " +
                     ", ".join(f"{s['file']} ({s['tensors']} tensors)" for s in d["shards"]))
    lines.append("")
    lines.append(f"metadata ({_of(len(d['metadata']), d['n_kv'])}):")
    lines += ["  " + ln for ln in table([[m["key"], m["type"], _value_text(m)] for m in d["metadata"]])]
    lines.append("")
    lines.append(f"tensors ({_of(len(d['tensors']), d['n_tensors'])}):")
    if d["tensors"]:
        head = ["#", "name", "type", "ne", "bytes", "bpw"] + (["offset"] if "offset" in d["tensors"][0] else [])
        head += ["shard"] if "shard" in d["tensors"][0] else []
        nonfinite = stats is not None and any(s["nonfinite"] for s in stats.values())
        if stats is not None:
            head += ["min", "max", "mean", "std"] + (["nonfinite"] if nonfinite else [])
        rows = [head]
        for i, t in enumerate(d["tensors"]):
            r = [str(i), t["name"], t["type"], bracketed(t["ne"]),
                 f"{t['bytes']:,}", f"{t['bpw']:.2f}"]
            if "offset" in t:
                r.append(f"{t['offset']:,}")
            if "shard" in t:
                r.append(str(t["shard"]))
            if stats is not None:
                s = stats[t["name"]]
                r += [_g(s["min"]), _g(s["max"]), _g(s["mean"]), _g(s["std"])]
                r += [f"{s['nonfinite']:,}"] if nonfinite else []
            rows.append(r)
        right = {i for i, h in enumerate(head) if h not in ("name", "type", "ne")}
        lines += ["  " + ln for ln in table(rows, right)]
    tot = d["totals"]
    lines.append("")
    lines.append(f"total: {tot['tensors']} tensors, {tot['elements']:,} elements, {tot['bytes']:,} bytes "
                 f"({tot['bytes'] / 1048576:.2f} MiB), {tot['bpw']:.2f} bits per weight")
    for name, bt in tot["by_type"].items():
        lines.append(f"  {name:<6} {bt['tensors']:5d} tensors  {bt['elements']:>14,} elements  {bt['bytes']:>14,} bytes")
    if stats is not None and any(s["nonfinite"] for s in stats.values()):
        n = sum(s["nonfinite"] for s in stats.values())
        lines.append(f"non-finite values (inf, NaN): {n:,}, left out of min/max/mean/std")
    return "\n".join(lines) + "\n"


def _g(v) -> str:
    if v is None:
        return "-"
    return f"{v:.6g}"
