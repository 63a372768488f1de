"""Checked numpy arrays from user data: nested JSON, .npy files (pickles refused), a tensor of a GGUF
file, and conversions to a tensor type that never lose values silently.

These know no input names: an error says what is wrong (InputError, pointing at the bad element),
and the caller adds where (`InputError.at`). numpy shape `(d3, d2, d1, d0)` is GGML
`ne = [d0, d1, d2, d3]`: a (2, 3) array has 2 rows of 3 elements, `ne = [3, 2]`.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

import numpy as np

from .. import types as T
from ..errors import InputError, QuantizationError
from ..tensor import MAX_DIMS

if TYPE_CHECKING:
    from ..gguf_io import GGUFFile

NPY_MAGIC = b"\x93NUMPY"

# GGUF types gguf-py maps as typed numpy arrays; the others are dequantized with gguf.quants.
PLAIN_GGUF_TYPES = (T.F32, T.F16, T.I32, T.GGMLType.I8, T.GGMLType.I16, T.GGMLType.I64, T.GGMLType.F64)


# -- JSON ---------------------------------------------------------------------------------------
# Non-finite numbers as strict JSON spells them (the strings ggtool's JSON output writes), read as numbers.
JSON_NONFINITE = ("NaN", "Infinity", "-Infinity")


def parse_json_array(text: str) -> np.ndarray:
    """Nested JSON lists of numbers -> a float64 (or int64, if all are integers) array. NaN,
    Infinity and -Infinity are accepted bare (as Python writes them) or as the strings ggtool's own
    JSON output writes (JSON_NONFINITE); booleans, other strings, null, ragged lists and nesting
    deeper than json_input.MAX_DEPTH are not."""
    import json  # not for .npy or GGUF inputs

    from .. import json_input

    try:
        value = json_input.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}", kind="json") from None
    shape = _json_shape(value, ())
    if len(shape) > MAX_DIMS:
        raise InputError(f"JSON array has {len(shape)} dimensions; GGML tensors have at most {MAX_DIMS}", kind="json")
    flat = list(_flatten(value))
    if all(type(v) is int for v in flat) and all(-(2**63) <= v < 2**63 for v in flat):
        return np.array(flat, dtype=np.int64).reshape(shape)
    try:
        return np.array([float(v) for v in flat], dtype=np.float64).reshape(shape)
    except OverflowError:
        raise InputError("a JSON number is too large for a float", kind="json") from None


def _json_shape(value, path: tuple[int, ...]) -> tuple[int, ...]:
    if isinstance(value, list):
        if len(path) >= MAX_DIMS + 1:
            raise InputError(f"JSON array has more than {MAX_DIMS + 1} dimensions; GGML tensors have at most "
                             f"{MAX_DIMS}", kind="json")
        if not value:
            return (0,)
        shapes = [_json_shape(v, path + (i,)) for i, v in enumerate(value)]
        for i, s in enumerate(shapes[1:], 1):
            if s != shapes[0]:
                raise InputError(f"JSON is not rectangular: {_describe(value, path, i, shapes)}", kind="json")
        return (len(value), *shapes[0])
    if isinstance(value, str) and value in JSON_NONFINITE:
        return ()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kinds = {bool: "a boolean", str: "a string", dict: "an object", type(None): "null"}
        kind = kinds.get(type(value), "not a number")
        at = f"element {_fmt_path(path)}" if path else "value"
        raise InputError(f"JSON {at} is {kind}; expected a number or nested lists of numbers", kind="json")
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


# -- .npy ---------------------------------------------------------------------------------------
def read_npy_header(f, size: int) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """(shape, dtype, Fortran order, data offset) of the .npy open in `f` (`size` bytes long)
    without reading its data; checks the dtype, dimensions and length."""
    try:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
    except ValueError as e:
        raise InputError(f"not a valid .npy file ({e})", kind="npy") from None
    if dtype.hasobject:
        raise InputError("the .npy holds Python objects (a pickled array); ggtool loads numeric .npy files only "
                         "(allow_pickle=False)", kind="npy")
    if len(shape) > MAX_DIMS:
        raise InputError(f"the .npy array has {len(shape)} dimensions {shape}; GGML tensors have at most {MAX_DIMS}",
                         kind="npy")
    default_type(dtype)
    offset = f.tell()
    need = offset + math.prod(shape) * dtype.itemsize
    if size < need:
        raise InputError(f"the .npy file is truncated ({size} bytes, its header promises {need})", kind="npy")
    return tuple(shape), dtype, bool(fortran), offset


def open_npy(path: str) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """read_npy_header of the file at `path`: a file that is not a .npy (an .npz, text) or cannot
    be opened is an InputError naming it."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            magic = f.read(len(NPY_MAGIC))
            f.seek(0)
            if magic != NPY_MAGIC:
                hint = " (a .npz archive: save one array with np.save)" if magic[:2] == b"PK" else ""
                raise InputError(f"{path} is not a .npy file{hint}", kind="npy")
            try:
                return read_npy_header(f, size)
            except InputError as e:
                raise e.at(within=path) from None
    except OSError as e:
        raise InputError(f"{path}: {os_message(e)}", kind="os") from None


def read_npy(path: str) -> np.ndarray:
    """The array of a .npy file, checked as read_npy_header does and memory-mapped (read only)."""
    open_npy(path)
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise InputError(f"{path}: cannot read the .npy data ({e})", kind="npy") from None


# -- GGUF ---------------------------------------------------------------------------------------
def gguf_array(g: GGUFFile, name: str, type_: T.GGMLType | None = None) -> np.ndarray:
    """The tensor `name` of an open GGUF file as a numpy array in numpy order: dequantized (as
    gguf-py does, compiled where ggtool has a kernel) when its type is a block type, then converted
    to `type_` (convert_array) if given."""
    info = g.tensors.get(name)
    if info is None:
        raise InputError(f"{g.path} has no tensor '{name}'", kind="no-such-tensor")
    raw = np.asarray(g.array(name))
    if info.type not in PLAIN_GGUF_TYPES:
        from ..quant import dequantize  # compiled where ggtool has a kernel, else gguf-py's
        try:
            raw = dequantize(raw, info.type)
        except QuantizationError as e:
            raise InputError(str(e), kind="quantization") from None
    arr = raw.reshape(info.ne[::-1])
    return arr if type_ is None else convert_array(arr, type_)


# -- types --------------------------------------------------------------------------------------
def default_type(dtype: np.dtype) -> T.GGMLType:
    """The tensor type an array of `dtype` becomes without a type prefix."""
    kind, size = dtype.kind, dtype.itemsize
    if dtype.fields is not None or dtype.subdtype is not None:
        raise InputError(f"structured dtype {dtype} is not supported", kind="dtype")
    if kind == "f" and size == 2:
        return T.F16
    if kind == "f" and size in (4, 8):
        return T.F32
    if kind == "i" and size <= 8 or kind == "u" and size <= 8:
        return T.I32
    if kind == "b":
        raise InputError("boolean arrays are not supported; convert to int32 or float32", kind="dtype")
    raise InputError(f"dtype {dtype} is not supported (use float32, float16 or int32; float64 and other integer "
                     "types are converted)", kind="dtype")


def convert_array(arr: np.ndarray, type_: T.GGMLType) -> np.ndarray:
    """`arr` as the numpy dtype of `type_` (float32 for quantized types; bf16 as its uint16 bits,
    rounded as GGML_FP32_TO_BF16 does), refusing lossy casts.

    Floats to i32 must be whole and in range; integers to i32 must fit; values that are finite in
    the source must stay finite (1e40 does not fit in f32, 70000 does not fit in f16, 3.4e38 does
    not fit in bf16, whose largest value is 3.3895e38).
    """
    arr = np.asarray(arr)
    if arr.dtype.kind not in "fiu":
        default_type(arr.dtype)  # raises with the right message
    if type_ == T.BF16:
        from ..quant.bf16 import bf16_to_fp32, fp32_to_bf16
        vals = convert_array(arr, T.F32)
        bits = fp32_to_bf16(vals)
        bad = np.isfinite(vals) & ~np.isfinite(bf16_to_fp32(bits))
        if bad.any():
            raise InputError(f"element {_index(bad)} = {_first(arr, bad)} is too large for bf16", kind="conversion")
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
                raise InputError(f"{name} needs whole numbers; element {_index(bad)} is {_first(arr, bad)}",
                                 kind="conversion")
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            bad = (arr < info.min) | (arr > info.max)
            raise InputError(f"element {_index(bad)} = {_first(arr, bad)} does not fit in {name}", kind="conversion")
        return arr.astype(dst)
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(dst)
    bad = np.isfinite(arr) & ~np.isfinite(out)
    if bad.any():
        raise InputError(f"element {_index(bad)} = {_first(arr, bad)} is too large for {name}", kind="conversion")
    return out


def _first(arr: np.ndarray, mask: np.ndarray):
    return repr(arr[mask].flat[0].item())


def _index(mask: np.ndarray) -> str:
    """The first True position of `mask`, in numpy order, e.g. [1][0]."""
    idx = np.unravel_index(int(np.flatnonzero(mask)[0]), mask.shape) if mask.ndim else ()
    return _fmt_path(tuple(int(i) for i in idx)) or "[]"


def os_message(e: Exception) -> str:
    """An OSError's own words ("No such file or directory"), without Python's decoration."""
    return getattr(e, "strerror", None) or str(e)
