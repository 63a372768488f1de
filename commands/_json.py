"""The one JSON writer of the command line, and its one policy for numbers JSON has no word for.

JSON (RFC 8259) has no NaN or infinity. ggtool writes them as the strings "NaN", "Infinity" and
"-Infinity" wherever it writes JSON (compute's arrays, inspect's stats, compare's errors): its output
is then strict JSON that jq, JavaScript and every other JSON parser read, no value is lost, and the
spellings are those `float()` in Python, `Number()` in JavaScript and numpy's float conversion
read. ggtool's own JSON input (`--tensor NAME=-`, inline JSON) reads them back, so compute's JSON
round-trips. docs/cli.md (Output formats) says the same for users.

Array numbers are the shortest text that reads back to the same float32 (or float16) value, with
integral values written as integers (`60`, not `60.0`), so the seed example prints
`[[60,55,50,110],...]`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import numpy as np

NONFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}   # numpy's str() -> the JSON string
# Below these magnitudes every integer is exact, so an integral value prints as a plain integer.
_EXACT_INT = {np.dtype(np.float32): 2**24, np.dtype(np.float16): 2**11}


def nonfinite_text(x: float) -> str:
    """The string ggtool writes for a NaN or an infinity."""
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def plain(o):
    """`o` with numpy scalars as Python values, non-finite floats as their strings, bytes as hex."""
    if isinstance(o, dict):
        return {k: plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [plain(v) for v in o]
    if isinstance(o, np.generic):
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return nonfinite_text(o)
    if isinstance(o, bytes):
        return o.hex()
    return o


def dumps(obj, *, indent: int | None = None, ascii: bool = False) -> str:
    """Strict JSON text of `obj`, keys in the order built, no trailing newline; non-ASCII text kept
    as it is unless `ascii` (then escaped, as inspect-graph's and plan's one-line records are)."""
    return json.dumps(plain(obj), indent=indent, ensure_ascii=ascii, allow_nan=False)


def compact(obj) -> str:
    """`dumps` without spaces (`[1,403,407]`), as compute prints arrays: token ids, one per line."""
    return json.dumps(plain(obj), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def document(obj, *, indent: int | None = 2) -> str:
    """A whole JSON document on stdout: `dumps` and a trailing newline."""
    return dumps(obj, indent=indent) + "\n"


def record_lines(doc: dict) -> Iterator[str]:
    """A JSON object with one line per record of its lists (readable, and still one document)."""
    items = list(doc.items())
    yield "{"
    for i, (key, value) in enumerate(items):
        tail = "," if i < len(items) - 1 else ""
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            yield f"{dumps(key, ascii=True)}: ["
            for j, v in enumerate(value):
                yield "  " + dumps(v, ascii=True) + ("," if j < len(value) - 1 else "")
            yield "]" + tail
        else:
            yield f"{dumps(key, ascii=True)}: {dumps(value, ascii=True)}{tail}"
    yield "}"


# -- arrays -------------------------------------------------------------------------------------------
def format_numbers(flat: np.ndarray) -> list[str]:
    """Each element as the shortest JSON text that reads back to the same value of its dtype."""
    flat = np.asarray(flat).ravel()
    if flat.dtype.kind in "iub":
        return [str(v) for v in flat.tolist()]
    if flat.dtype not in _EXACT_INT:
        flat = flat.astype(np.float32)
    with np.errstate(invalid="ignore"):
        integral = np.isfinite(flat) & (np.abs(flat) < _EXACT_INT[flat.dtype]) & (flat == np.round(flat))
    if integral.all() and not (np.signbit(flat) & (flat == 0)).any():
        return [str(v) for v in flat.astype(np.int64).tolist()]
    out = []
    for v in flat:  # numpy scalars: str() is the shortest round-trip repr of the dtype
        s = str(v)
        if s in NONFINITE:
            out.append(f'"{NONFINITE[s]}"')
        else:
            out.append(s[:-2] if s.endswith(".0") else s)
    return out


def array_chunks(arr: np.ndarray) -> Iterator[str]:
    """One array as compact nested JSON lists in numpy order, a row at a time (so `| head` stops early)."""
    arr = np.asarray(arr)
    if arr.ndim == 0:
        yield format_numbers(arr.reshape(1))[0]
        return
    outer = arr.shape[:-1]
    if not outer:
        yield "[" + ",".join(format_numbers(arr)) + "]"
        return
    n_rows = int(np.prod(outer))
    if n_rows == 0:
        yield _empty_nested(outer)
        return
    rows = arr.reshape(n_rows, arr.shape[-1])
    for r in range(n_rows):
        idx = np.unravel_index(r, outer)
        opening = 0  # how many enclosing lists open at this row (trailing zero indices)
        for i in reversed(idx):
            if i:
                break
            opening += 1
        closing = 0
        for i, n in zip(reversed(idx), reversed(outer)):
            if i != n - 1:
                break
            closing += 1
        sep = "" if r == 0 else ","
        yield sep + "[" * opening + "[" + ",".join(format_numbers(rows[r])) + "]" + "]" * closing


def _empty_nested(shape: tuple[int, ...]) -> str:
    if not shape or shape[0] == 0:
        return "[]"
    inner = _empty_nested(shape[1:]) if len(shape) > 1 else "[]"
    return "[" + ",".join([inner] * shape[0]) + "]"


def arrays_document(named: list[tuple[str, np.ndarray]]) -> Iterator[str]:
    """One output: the bare array. Several: {"name": array, ...}. Ends with a newline."""
    if len(named) == 1:
        yield from array_chunks(named[0][1])
    else:
        for i, (name, arr) in enumerate(named):
            yield ("{" if i == 0 else ",") + json.dumps(name) + ":"
            yield from array_chunks(arr)
        yield "}"
    yield "\n"
