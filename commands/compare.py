"""`ggtool compare A B`: per-tensor error between two GGUF files (or two single tensors)."""

from __future__ import annotations

import math
import sys

import click

from ggtool.errors import GGToolError
from ggtool.gguf_io import inspect as I

from ._common import NPY_ORDER_HELP

HELP = f"""Compare the tensors of A and B after dequantizing both to f32: what quantization cost.

A and B are GGUF files (every tensor present in both is compared, by name; a split model by its
first shard), or single tensors:
FILE.gguf:TENSOR or a .npy file, in any pairing. B is measured against A:

\b
  nmse         sum((b - a)^2) / sum(a^2)   (GGML test-backend-ops' measure)
  max_abs_err  max |b - a|
  rel_rms      rms(b - a) / rms(a)
Tensors only in one file are listed; shape mismatches are reported, not compared. inf and NaN
are counted, never dropped: the same value on both sides is no error, any other pairing makes
the error measures inf.
--json: {{"a", "b", "tensors": [{{"name", "type_a", "type_b", "ne", "identical", "nmse",
"max_abs_error", "rel_rms", "rms_error", "nonfinite", "nonfinite_a", "nonfinite_b"}}],
"only_in_a", "only_in_b", "summary"}}.

\b
Examples:
  $ ggtool quantize model.gguf model-q4_0.gguf
  $ ggtool compare model.gguf model-q4_0.gguf
  $ ggtool compare model.gguf:output.weight out.npy --json
  $ ggtool compare model.gguf model-q4_0.gguf --max-nmse 0.01 > report.txt || echo "too lossy"

{NPY_ORDER_HELP}
"""


def _not_nan(ctx, param, value):
    if value is not None and math.isnan(value):
        raise click.BadParameter("a bound of NaN would pass every tensor: give a number", ctx=ctx, param=param)
    return value


@click.command("compare", help=HELP, short_help="Per-tensor NMSE / max error between two GGUF files or tensors.")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")
@click.option("--max-nmse", type=click.FloatRange(min=0), default=None, metavar="X", callback=_not_nan,
              help="Exit 1 if any tensor's NMSE exceeds X, is inf or NaN, or its shapes differ (the report "
                   "is printed either way): a quality gate for scripts and CI.")
def command(a, b, as_json, max_nmse):
    sa, sb = I.open_source(a), I.open_source(b)
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(total=I.compare_values(sa, sb), unit=" values", unit_scale=True, file=sys.stderr,
                   desc="compare", leave=False, dynamic_ncols=True)
    try:
        res = I.compare(sa, sb, on_bytes=bar.update if bar else None)
    finally:
        if bar is not None:
            bar.close()
    out = sys.stdout
    out.write(I.json_text(res) if as_json else I.format_compare(res))
    out.flush()
    if max_nmse is not None:
        worse = I.worse_than(res, max_nmse)
        if worse:
            w = worse[0]
            why = "shapes differ" if w.get("nmse") is None else f"nmse {w['nmse']:.6g}"
            raise GGToolError(f"{len(worse)} of {len(res['tensors'])} tensors fail --max-nmse {max_nmse:g} "
                              f"(worst: '{w['name']}', {why})")
