"""The one text-table renderer of the command line: columns padded to their widest cell."""

from __future__ import annotations

from collections.abc import Collection, Mapping


def table(rows: list[list[str]], right: Collection[int] = (), max_width: Mapping[int, int] | None = None) -> list[str]:
    """Lines of `rows` (the header, if any, is a row like the others), columns two spaces apart, trailing
    spaces dropped. Columns in `right` are right-aligned; `max_width` caps a column's padding (a longer
    cell overflows it rather than widening every line)."""
    if not rows:
        return []
    caps = max_width or {}
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    widths = [min(w, caps.get(i, w)) for i, w in enumerate(widths)]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def ggml_listing(rows: list[list[str]], right: Collection[int] = ()) -> list[str]:
    """`table` as ggml_graph_print lists tensors: the header (first row) indented, each row after ` - `."""
    head, *body = table(rows, right)
    return ["   " + head] + [" - " + line for line in body]


def bracketed(values) -> str:
    """A list as the tables show ne and nb: `[4, 3, 1, 1]`."""
    return "[" + ", ".join(str(v) for v in values) + "]"
