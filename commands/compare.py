"""`ggtool compare A B`: per-tensor error between two GGUF files (or two single tensors)."""

from __future__ import annotations

import math

import click

from ggtool.errors import GGToolError
from ggtool.gguf_io import inspect as I

from ._common import NPY_ORDER_HELP, write_text
from ._json import document
from ._progress import progress_bar
from ._table import bracketed, table

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
    with progress_bar(I.compare_values(sa, sb), "compare", " values", scale=1000) as bar:
        res = I.compare(sa, sb, on_bytes=bar.update if bar else None)
    write_text([document(res) if as_json else compare_text(res)])
    if max_nmse is not None:
        worse = I.worse_than(res, max_nmse)
        if worse:
            w = worse[0]
            why = "shapes differ" if w.get("nmse") is None else f"nmse {w['nmse']:.6g}"
            raise GGToolError(f"{len(worse)} of {len(res['tensors'])} tensors fail --max-nmse {max_nmse:g} "
                              f"(worst: '{w['name']}', {why})")


# -- the text report ---------------------------------------------------------------------------------
def _e(v: float) -> str:
    if v is None:
        return "-"
    if v == 0:
        return "0"
    if not math.isfinite(v):
        return str(v)
    return f"{v:.3e}"


def compare_text(res: dict) -> str:
    """`compare`'s report of a compare() record: a row per tensor, then the summary."""
    lines = [f"A: {res['a']}", f"B: {res['b']}", ""]
    rows = [["name", "type A", "type B", "ne", "nmse", "max_abs_err", "rel_rms"]]
    for r in res["tensors"]:
        ne = bracketed(r["ne"])
        if "error" in r:
            rows.append([r["name"], r["type_a"], r["type_b"], ne, r["error"], "", ""])
        elif r["identical"]:
            rows.append([r["name"], r["type_a"], r["type_b"], ne, "identical", "0", "0"])
        else:
            rows.append([r["name"], r["type_a"], r["type_b"], ne, _e(r["nmse"]), _e(r["max_abs_error"]),
                         _e(r["rel_rms"])])
    if len(rows) > 1:
        lines += table(rows, {4, 5, 6})
        lines.append("")
    s = res["summary"]
    lines.append(f"{s['compared']} tensors compared ({s['identical']} identical), "
                 f"{len(res['only_in_a'])} only in A, {len(res['only_in_b'])} only in B"
                 + (f", {s['shape_mismatch']} with different shapes" if s["shape_mismatch"] else ""))
    if s["compared"]:
        lines.append(f"overall: nmse {_e(s['nmse'])}, max abs error {_e(s['max_abs_error'])}, "
                     f"rel rms {_e(s['rel_rms'])}")
    if s.get("nonfinite"):
        bad = [r["name"] for r in res["tensors"] if r.get("nonfinite")]
        lines.append(f"non-finite values: {s['nonfinite_a']} in A, {s['nonfinite_b']} in B ({', '.join(bad[:4])}"
                     f"{', ...' if len(bad) > 4 else ''}); where A and B differ there, the error is infinite")
    for n in res["only_in_a"]:
        lines.append(f"only in A: {n}")
    for n in res["only_in_b"]:
        lines.append(f"only in B: {n}")
    return "\n".join(lines) + "\n"
