"""`ggtool ops`: the ops a program can call, with GGML's C signature and what each does."""

from __future__ import annotations

import click

from ._common import write_text
from ._json import document
from ._table import table

HELP = """List the ops a program can call: the DSL name, GGML's C signature and a one-line description.

Programs call ops by GGML's function name without the ggml_ prefix, positionally or with
GGML's parameter names as keywords.

\b
Example:
  $ ggtool ops mul
  mul      ggml_mul(ctx, a, b)      a * b element-wise; b is tiled (modulo) over a
  mul_mat  ggml_mul_mat(ctx, a, b)  a . b^T row by row: result ne = [a.ne1, b.ne1, ...
  $ ggtool ops --json | jq -r '.[].name'

PATTERN keeps the ops whose name contains it. --builtins lists the DSL's own functions instead
(input, meta, ne, arange_i32, scalar math...), which are not GGML ops.
"""


@click.command("ops", help=HELP, short_help="List the ops with their C signatures.")
@click.argument("pattern", required=False)
@click.option("--builtins", is_flag=True, help="List the DSL's functions that are not GGML ops.")
@click.option("--json", "as_json", is_flag=True,
              help='JSON: [{"name", "signature", "description", "params"}, ...].')
def command(pattern, builtins, as_json):
    if builtins:
        from ggtool.dsl import BUILTINS as registry
    else:
        from ggtool.ops import FUNCTIONS as registry

    funcs = [f for f in registry.values() if pattern is None or pattern.lower() in f.name.lower()]
    if as_json:
        records = [{"name": f.name, "signature": f.signature, "description": f.doc, "params": list(f.params)}
                   for f in funcs]
        write_text([document(records)])
        return
    if not funcs:
        what = "builtin" if builtins else "op"
        raise click.ClickException(f"no {what} name contains {pattern!r}; see ggtool ops{' --builtins' * builtins}")
    rows = [[f.name, f.signature, f.doc] for f in funcs]
    # a few very long signatures overflow their column
    write_text(line + "\n" for line in table(rows, max_width={1: 48}))
