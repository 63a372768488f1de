"""The `--tensor NAME=SOURCE` syntax, and turning JSON text and .npy files into checked numpy arrays.

This is the part of the command-line inputs that needs no context, tensor or GGUF file: it parses a
source as written (`SourceSyntaxError` for anything malformed), reads JSON and .npy headers with
messages that point at the bad element, and converts arrays to a tensor type without silent loss.
`ggtool.tensor_io.inputs` builds the DSL's environment on top of it.

numpy shape `(d3, d2, d1, d0)` is GGML `ne = [d0, d1, d2, d3]`: a (2, 3) array has 2 rows of
3 elements, `ne = [3, 2]`. Shape-only sources (`f32[3,2]`) are written in GGML order.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import numpy as np

from .. import types as T
from ..errors import GGToolError, InputError
from ..tensor import MAX_DIMS

NPY_MAGIC = b"\x93NUMPY"

# Types a source can be converted to with a prefix (`f16:w.npy`).
TARGET_TYPES = T.COMPUTE_TYPES

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
_PREFIX_RE = re.compile(r"([A-Za-z][A-Za-z0-9_]*):(.*)\Z", re.S)
_SHAPE_RE = re.compile(r"([A-Za-z][A-Za-z0-9_]*)\[([^\]]*)\]\Z")
_NUMBER_RE = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|-?Infinity|NaN")
# Non-finite numbers as strict JSON spells them (the strings ggtool's JSON output writes), read as numbers.
JSON_NONFINITE = ("NaN", "Infinity", "-Infinity")


class SourceSyntaxError(GGToolError):
    """A `--tensor` option that is malformed as written (the CLI reports it as a usage error)."""


@dataclass(frozen=True)
class Source:
    """One parsed `--tensor NAME=SOURCE`; `kind` is npy, json, gguf, stdin or shape."""

    name: str
    kind: str
    type: T.GGMLType | None = None     # the type prefix: convert on load
    path: str | None = None            # npy/json/gguf file
    tensor: str | None = None          # tensor name inside a GGUF file
    ne: tuple[int, ...] | None = None  # shape-only sources
    json: str | None = None            # inline JSON text

    @property
    def where(self) -> str:
        return f"--tensor {self.name}"


def _known_type(name: str) -> T.GGMLType | None:
    try:
        return T.parse_type(name)
    except GGToolError:
        return None


def _target_type(name: str, where: str) -> T.GGMLType:
    t = _known_type(name)
    if t not in TARGET_TYPES:
        known = ", ".join(T.type_name(x) for x in TARGET_TYPES)
        what = "unknown type" if t is None else "cannot convert to"
        raise SourceSyntaxError(f"{where}: {what} {name!r}; the type prefix must be one of {known}")
    return t


def parse_tensor_option(option: str) -> Source:
    """`NAME=SOURCE` -> Source. Raises SourceSyntaxError for anything malformed as written."""
    name, eq, text = option.partition("=")
    name = name.strip()
    if not eq:
        raise SourceSyntaxError(f"--tensor {option!r}: expected NAME=SOURCE, e.g. x=w.npy or x='[[1,2],[3,4]]'")
    if not _NAME_RE.match(name):
        raise SourceSyntaxError(f"--tensor {option!r}: {name!r} is not a tensor name "
                                "(letters, digits, '_' and '.', not starting with a digit)")
    return parse_source(name, text)


def parse_source(name: str, text: str) -> Source:
    where = f"--tensor {name}"
    if not text.strip():
        raise SourceSyntaxError(f"{where}: empty source")
    type_ = None
    body = text
    m = _PREFIX_RE.match(text)
    if m and _known_type(m.group(1)) is not None:
        type_ = _target_type(m.group(1), where)
        body = m.group(2)
        if not body.strip():
            raise SourceSyntaxError(f"{where}: nothing after the type prefix {m.group(1)}:")
    stripped = body.strip()

    if stripped == "-":
        return Source(name, "stdin", type_)
    m = _SHAPE_RE.match(stripped)
    if m and _known_type(m.group(1)) is not None:
        if type_ is not None:
            raise SourceSyntaxError(f"{where}: a shape-only source names its own type; write {m.group(1)}[...] "
                                    "without a prefix")
        shape_type = _target_type(m.group(1), where)
        try:
            ne = tuple(int(n) for n in m.group(2).split(",")) if m.group(2).strip() else ()
        except ValueError:
            raise SourceSyntaxError(f"{where}: bad shape {stripped!r}; expected TYPE[ne0,ne1,...], "
                                    "e.g. f32[4,3]") from None
        if not 1 <= len(ne) <= MAX_DIMS or any(n < 0 for n in ne):
            raise SourceSyntaxError(f"{where}: bad shape {stripped!r}: 1 to {MAX_DIMS} non-negative sizes "
                                    "in GGML order (ne0 first)")
        return Source(name, "shape", shape_type, ne=ne)
    if stripped[:1] in "[{" or _NUMBER_RE.fullmatch(stripped):
        return Source(name, "json", type_, json=body)
    i = body.find(".gguf:")
    while i >= 0:  # FILE.gguf:TENSOR; the first split whose file exists (paths may contain '.gguf:')
        path, tensor = body[: i + 5], body[i + 6:]
        if os.path.exists(path) or body.find(".gguf:", i + 1) < 0:
            if not tensor:
                raise SourceSyntaxError(f"{where}: no tensor name after {path}:")
            return Source(name, "gguf", type_, path=path, tensor=tensor)
        i = body.find(".gguf:", i + 1)
    if body.endswith(".gguf"):
        raise SourceSyntaxError(f"{where}: name the tensor: {body}:TENSOR (or use --gguf {body} to make "
                                "all of its tensors available)")
    return Source(name, "json" if body.lower().endswith(".json") else "npy", type_, path=body)



# -- reading arrays ---------------------------------------------------------------------------
def parse_json_array(text: str, where: str) -> np.ndarray:
    """Nested JSON lists of numbers -> a float64 (or int64, if all are integers) array. NaN and
    infinities may be bare (`NaN`, `Infinity`, `-Infinity`, as Python writes them) or strings."""
    import json  # not for .npy or GGUF inputs

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise InputError(f"{where}: JSON is nested too deeply") from None
    shape = _json_shape(value, where, ())
    if len(shape) > MAX_DIMS:
        raise InputError(f"{where}: JSON array has {len(shape)} dimensions; GGML tensors have at most {MAX_DIMS}")
    flat = list(_flatten(value))
    if all(type(v) is int for v in flat) and all(-(2**63) <= v < 2**63 for v in flat):
        return np.array(flat, dtype=np.int64).reshape(shape)
    try:
        return np.array([float(v) for v in flat], dtype=np.float64).reshape(shape)
    except OverflowError:
        raise InputError(f"{where}: a JSON number is too large for a float") from None


def _json_shape(value, where: str, path: tuple[int, ...]) -> tuple[int, ...]:
    if isinstance(value, list):
        if len(path) >= MAX_DIMS + 1:
            raise InputError(f"{where}: JSON array has more than {MAX_DIMS + 1} dimensions; GGML tensors have at "
                             f"most {MAX_DIMS}")
        if not value:
            return (0,)
        shapes = [_json_shape(v, where, path + (i,)) for i, v in enumerate(value)]
        for i, s in enumerate(shapes[1:], 1):
            if s != shapes[0]:
                raise InputError(f"{where}: JSON is not rectangular: {_describe(value, path, i, shapes)}")
        return (len(value), *shapes[0])
    if isinstance(value, str) and value in JSON_NONFINITE:
        return ()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kinds = {bool: "a boolean", str: "a string", dict: "an object", type(None): "null"}
        kind = kinds.get(type(value), "not a number")
        at = f"element {_fmt_path(path)}" if path else "value"
        raise InputError(f"{where}: JSON {at} is {kind}; expected a number or nested lists of numbers")
    return ()


def _fmt_path(path: tuple[int, ...]) -> str:
    return "".join(f"[{i}]" for i in path)


def _describe(value: list, path: tuple[int, ...], i: int, shapes) -> str:
    a, b = value[0], value[i]
    row = "row" if path or isinstance(a, list) or isinstance(b, list) else "element"
    pi, p0 = _fmt_path(path + (i,)), _fmt_path(path + (0,))
    if not path:
        pi, p0 = str(i), "0"
    if isinstance(a, list) != isinstance(b, list):
        def kind(v):
            return "a list" if isinstance(v, list) else "a number"
        return f"{row} {pi} is {kind(b)}, {row} {p0} is {kind(a)}"
    if len(a) != len(b):
        return f"{row} {pi} has {len(b)} elements, {row} {p0} has {len(a)}"
    return f"{row} {pi} has shape {list(shapes[i])}, {row} {p0} has shape {list(shapes[0])}"


def _flatten(value):
    if isinstance(value, list):
        for v in value:
            yield from _flatten(v)
    else:
        yield value


def read_npy_header(f, where: str, size: int) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """(shape, dtype, Fortran order, data offset) of a .npy without reading its data; checks the
    dtype, dimensions and length."""
    try:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
    except ValueError as e:
        raise InputError(f"{where}: not a valid .npy file ({e})") from None
    if dtype.hasobject:
        raise InputError(f"{where}: the .npy holds Python objects (a pickled array); ggtool loads numeric "
                         ".npy files only (allow_pickle=False)")
    if len(shape) > MAX_DIMS:
        raise InputError(f"{where}: the .npy array has {len(shape)} dimensions {shape}; GGML tensors have at "
                         f"most {MAX_DIMS}")
    default_type(dtype, where)
    offset = f.tell()
    need = offset + math.prod(shape) * dtype.itemsize
    if size < need:
        raise InputError(f"{where}: the .npy file is truncated ({size} bytes, its header promises {need})")
    return tuple(shape), dtype, bool(fortran), offset


def default_type(dtype: np.dtype, where: str) -> T.GGMLType:
    """The tensor type an array of `dtype` becomes without a type prefix."""
    kind, size = dtype.kind, dtype.itemsize
    if dtype.fields is not None or dtype.subdtype is not None:
        raise InputError(f"{where}: structured dtype {dtype} is not supported")
    if kind == "f" and size == 2:
        return T.F16
    if kind == "f" and size in (4, 8):
        return T.F32
    if kind == "i" and size <= 8 or kind == "u" and size <= 8:
        return T.I32
    if kind == "b":
        raise InputError(f"{where}: boolean arrays are not supported; convert to int32 or float32")
    raise InputError(f"{where}: dtype {dtype} is not supported (use float32, float16 or int32; float64 and "
                     "other integer types are converted)")


def convert_array(arr: np.ndarray, type_: T.GGMLType, where: str) -> np.ndarray:
    """`arr` as the numpy dtype of `type_` (float32 for quantized types; bf16 as its uint16 bits,
    rounded as GGML_FP32_TO_BF16 does), refusing lossy casts.

    Floats to i32 must be whole and in range; integers to i32 must fit; values that are finite in
    the source must stay finite (1e40 does not fit in f32, 70000 does not fit in f16, 3.4e38 does
    not fit in bf16, whose largest value is 3.3895e38).
    """
    arr = np.asarray(arr)
    if arr.dtype.kind not in "fiu":
        default_type(arr.dtype, where)  # raises with the right message
    if type_ == T.BF16:
        from ..quant.bf16 import bf16_to_fp32, fp32_to_bf16
        vals = convert_array(arr, T.F32, where)
        bits = fp32_to_bf16(vals)
        bad = np.isfinite(vals) & ~np.isfinite(bf16_to_fp32(bits))
        if bad.any():
            raise InputError(f"{where}: element {_index(bad)} = {_first(arr, bad)} is too large for bf16")
        return bits
    dst = np.dtype(np.float32) if T.is_quantized(type_) else T.np_dtype(type_)
    if arr.dtype == dst:
        return arr
    name = T.type_name(type_)
    if dst.kind == "i":
        info = np.iinfo(dst)
        if arr.dtype.kind == "f":
            bad = ~np.isfinite(arr) | (arr != np.round(arr))
            if bad.any():
                raise InputError(f"{where}: {name} needs whole numbers; element {_index(bad)} is {_first(arr, bad)}")
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            bad = (arr < info.min) | (arr > info.max)
            raise InputError(f"{where}: element {_index(bad)} = {_first(arr, bad)} does not fit in {name}")
        return arr.astype(dst)
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(dst)
    bad = np.isfinite(arr) & ~np.isfinite(out)
    if bad.any():
        raise InputError(f"{where}: element {_index(bad)} = {_first(arr, bad)} is too large for {name}")
    return out


def _first(arr: np.ndarray, mask: np.ndarray):
    return repr(arr[mask].flat[0].item())


def _index(mask: np.ndarray) -> str:
    """The first True position of `mask`, in numpy order, e.g. [1][0]."""
    idx = np.unravel_index(int(np.flatnonzero(mask)[0]), mask.shape) if mask.ndim else ()
    return _fmt_path(tuple(int(i) for i in idx)) or "[]"

