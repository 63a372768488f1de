"""Tensor sources: the engine's little language for where a named input's data comes from.

    w.npy   w.json   '[[1,2],[3,4]]'   -   f32[4,3]   model.gguf:TENSOR   TYPE:SOURCE   text:TEXT

`parse_source(name, text)` turns one into a `Source` and `parse_named_source("x=...")` a
`NAME=SOURCE` binding; `Inputs` (ggtool.tensor_io.inputs) loads them. It lives in the engine, not
with the command line, because it is not about options: a library user, a bench or a test names
inputs the same way (`Inputs([parse_named_source("tokens=i32:[1,2,3]")], [model])`), and
`FILE.gguf:TENSOR` is the one spelling of a GGUF tensor that `compare` takes too
(ggtool.gguf_io.spec). Malformed text is a `SourceSyntaxError` whose `input` is the name (the
command line reports it as a usage error and says which option it came from).

Shape-only sources (`f32[3,2]`) are written in GGML order (ne0 first); data in numpy order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import types as T
from ..errors import GGToolError, InputError
from ..gguf_io.spec import split_gguf_tensor
from ..tensor import MAX_DIMS

TEXT_PREFIX = "text:"   # text:TEXT, token ids from the model's vocabulary

# Types a source can be converted to with a prefix (`f16:w.npy`).
TARGET_TYPES = T.COMPUTE_TYPES

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
_PREFIX_RE = re.compile(r"([A-Za-z][A-Za-z0-9_]*):(.*)\Z", re.S)
_SHAPE_RE = re.compile(r"([A-Za-z][A-Za-z0-9_]*)\[([^\]]*)\]\Z")
_NUMBER_RE = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|-?Infinity|NaN")


class SourceSyntaxError(InputError):
    """A source, or a NAME=SOURCE binding, malformed as written. `input` is the name when it is
    known; a binding that has none keeps its text in `details["text"]` (and starts the message)."""


@dataclass(frozen=True)
class Source:
    """One parsed source of the input `name`; `kind` is npy, json, gguf, stdin, shape or text."""

    name: str
    kind: str
    type: T.GGMLType | None = None     # the type prefix: convert on load
    path: str | None = None            # npy/json/gguf file
    tensor: str | None = None          # tensor name inside a GGUF file
    ne: tuple[int, ...] | None = None  # shape-only sources
    json: str | None = None            # inline JSON text
    text: str | None = None            # text to tokenize (kind "text")


def _known_type(name: str) -> T.GGMLType | None:
    try:
        return T.parse_type(name)
    except GGToolError:
        return None


def _target_type(name: str, input: str) -> T.GGMLType:
    t = _known_type(name)
    if t not in TARGET_TYPES:
        known = ", ".join(T.type_name(x) for x in TARGET_TYPES)
        what = "unknown type" if t is None else "cannot convert to"
        raise SourceSyntaxError(f"{what} {name!r}; the type prefix must be one of {known}", input=input,
                                kind="bad-type")
    return t


def parse_named_source(text: str) -> Source:
    """`NAME=SOURCE` -> Source. Raises SourceSyntaxError for anything malformed as written."""
    name, eq, spec = text.partition("=")
    name = name.strip()
    if not eq:
        raise SourceSyntaxError(f"{text!r}: expected NAME=SOURCE, e.g. x=w.npy or x='[[1,2],[3,4]]'",
                                kind="not-a-binding", text=text)
    if not _NAME_RE.match(name):
        raise SourceSyntaxError(f"{text!r}: {name!r} is not a tensor name (letters, digits, '_' and '.', not "
                                "starting with a digit)", kind="bad-name", text=text)
    return parse_source(name, spec)


def parse_source(name: str, text: str) -> Source:
    """The source `text` of the input `name` -> Source (files are not opened: see Inputs)."""
    if not text.strip():
        raise SourceSyntaxError("empty source", input=name, kind="empty")
    if text.startswith(TEXT_PREFIX):   # before the type prefix: `text` is no type, the rest is verbatim
        return Source(name, "text", T.I32, text=text[len(TEXT_PREFIX):])
    type_ = None
    body = text
    m = _PREFIX_RE.match(text)
    if m and _known_type(m.group(1)) is not None:
        type_ = _target_type(m.group(1), name)
        body = m.group(2)
        if not body.strip():
            raise SourceSyntaxError(f"nothing after the type prefix {m.group(1)}:", input=name, kind="empty")
    stripped = body.strip()

    if stripped == "-":
        return Source(name, "stdin", type_)
    m = _SHAPE_RE.match(stripped)
    if m and _known_type(m.group(1)) is not None:
        if type_ is not None:
            raise SourceSyntaxError(f"a shape-only source names its own type; write {m.group(1)}[...] without a "
                                    "prefix", input=name, kind="bad-shape")
        shape_type = _target_type(m.group(1), name)
        try:
            ne = tuple(int(n) for n in m.group(2).split(",")) if m.group(2).strip() else ()
        except ValueError:
            raise SourceSyntaxError(f"bad shape {stripped!r}; expected TYPE[ne0,ne1,...], e.g. f32[4,3]",
                                    input=name, kind="bad-shape") from None
        if not 1 <= len(ne) <= MAX_DIMS or any(n < 0 for n in ne):
            raise SourceSyntaxError(f"bad shape {stripped!r}: 1 to {MAX_DIMS} non-negative sizes in GGML order "
                                    "(ne0 first)", input=name, kind="bad-shape")
        return Source(name, "shape", shape_type, ne=ne)
    if stripped[:1] in "[{" or _NUMBER_RE.fullmatch(stripped):
        return Source(name, "json", type_, json=body)
    split = split_gguf_tensor(body)
    if split is not None:
        path, tensor = split
        if not tensor:
            raise SourceSyntaxError(f"no tensor name after {path}:", input=name, file=path, kind="no-tensor-name")
        return Source(name, "gguf", type_, path=path, tensor=tensor)
    if body.endswith(".gguf"):
        raise SourceSyntaxError(f"name the tensor: {body}:TENSOR", input=name, file=body, kind="whole-gguf")
    return Source(name, "json" if body.lower().endswith(".json") else "npy", type_, path=body)
