"""Tensor sources for the command line: .npy files, inline JSON, GGUF tensors, stdin and bare shapes.

Every `--tensor NAME=SOURCE` is parsed and checked up front (a typo or a bad file is reported
before anything runs), but a tensor is only created, and its data only read, when a program uses
its name: `Inputs.tensor(name, ctx)` is what the DSL calls. So `--gguf model.gguf` costs one
header parse however large the model is.

numpy shape `(d3, d2, d1, d0)` is GGML `ne = [d0, d1, d2, d3]`: a (2, 3) array has 2 rows of
3 elements, `ne = [3, 2]`. Shape-only sources (`f32[3,2]`) are written in GGML order.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import types as T
from .context import Context
from .errors import GGToolError, InputError
from .gguf_file import GGUFFile, TensorInfo, open_gguf
from .tensor import MAX_DIMS, Tensor

NPY_MAGIC = b"\x93NUMPY"

# Types a GGUF tensor keeps when loaded (memory-mapped, zero-copy); the rest are dequantized to f32.
MMAP_TYPES = (T.F32, T.F16, T.I32, T.Q4_0, T.Q8_0)
# GGUF types gguf-py maps as typed numpy arrays; the others are dequantized with gguf.quants.
PLAIN_GGUF_TYPES = (T.F32, T.F16, T.I32, T.GGMLType.I8, T.GGMLType.I16, T.GGMLType.I64, T.GGMLType.F64)
# Types a source can be converted to with a prefix (`f16:w.npy`).
TARGET_TYPES = T.COMPUTE_TYPES

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
_PREFIX_RE = re.compile(r"([A-Za-z][A-Za-z0-9_]*):(.*)\Z", re.S)
_SHAPE_RE = re.compile(r"([A-Za-z][A-Za-z0-9_]*)\[([^\]]*)\]\Z")
_NUMBER_RE = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|-?Infinity|NaN")


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
    """Nested JSON lists of numbers -> a float64 (or int64, if all are integers) array."""
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


def read_npy_header(f, where: str, size: int) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of a .npy without reading its data; checks the dtype, dimensions and length."""
    try:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(f)
    except ValueError as e:
        raise InputError(f"{where}: not a valid .npy file ({e})") from None
    if dtype.hasobject:
        raise InputError(f"{where}: the .npy holds Python objects (a pickled array); ggtool loads numeric "
                         ".npy files only (allow_pickle=False)")
    if len(shape) > MAX_DIMS:
        raise InputError(f"{where}: the .npy array has {len(shape)} dimensions {shape}; GGML tensors have at "
                         f"most {MAX_DIMS}")
    default_type(dtype, where)
    need = f.tell() + math.prod(shape) * dtype.itemsize
    if size < need:
        raise InputError(f"{where}: the .npy file is truncated ({size} bytes, its header promises {need})")
    return tuple(shape), dtype


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
    """`arr` as the numpy dtype of `type_` (float32 for quantized types), refusing lossy casts.

    Floats to i32 must be whole and in range; integers to i32 must fit; values that are finite in
    the source must stay finite (1e40 does not fit in f32, 70000 does not fit in f16).
    """
    arr = np.asarray(arr)
    if arr.dtype.kind not in "fiu":
        default_type(arr.dtype, where)  # raises with the right message
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


# -- inputs ------------------------------------------------------------------------------------
class _NoData:
    """Storage of a shape-only tensor in a graph that is only inspected or planned, never computed."""

    @property
    def array(self):
        raise InputError("this tensor's data was not loaded (inspect-graph and plan read no data)")


NO_DATA = _NoData()


@dataclass
class _Prepared:
    """A source after its up-front checks: its type and shape, and how to get its data."""

    source: Source
    type: T.GGMLType
    ne: tuple[int, ...]
    where: str                               # for messages: "--tensor x" or "--gguf FILE: tensor 'x'"
    array: np.ndarray | None = None          # json/stdin: parsed; npy: loaded lazily
    gguf: GGUFFile | None = None
    info: TensorInfo | None = None
    npy: bool = False                        # data in the .npy file at source.path


class Inputs:
    """The tensors a program may use, by name: `--tensor` sources, then every tensor of `--gguf` files.

    This is the DSL's environment: `tensor(name, ctx)` creates the tensor in `ctx` on first use
    (cached per context), `names()` lists what exists (for "did you mean"), `metadata(key)` reads
    GGUF metadata. With `read_data=False` (inspect-graph, plan) no tensor data is ever read: tensors
    get their type and shape only, and GGUF weights are memory-mapped but not touched.

    A `--tensor` name shadows a `--gguf` tensor of the same name (to substitute one weight); a name
    found in two `--gguf` files is ambiguous and an error when used.
    """

    def __init__(self, sources: list[Source] = (), gguf_paths: list[str] = (), stdin=None,
                 read_data: bool = True, on_load: Callable[[str, str], None] | None = None):
        self.read_data = read_data
        self.on_load = on_load
        seen: dict[str, Source] = {}
        stdin_users = [s for s in sources if s.kind == "stdin"]
        for s in sources:
            if s.name in seen:
                raise SourceSyntaxError(f"--tensor {s.name} is given twice")
            seen[s.name] = s
        if len(stdin_users) > 1:
            names = ", ".join(s.name for s in stdin_users)
            raise SourceSyntaxError(f"only one --tensor can read stdin ('-'); {names} all do")
        self.ggufs: list[GGUFFile] = []
        for p in gguf_paths:
            try:
                self.ggufs.append(open_gguf(p))
            except InputError as e:
                raise InputError(f"--gguf {p}: {_strip_path(e, p)}") from None
        self._gguf_names: dict[str, list[GGUFFile]] = {}
        for g in self.ggufs:
            for n in g.tensors:
                owners = self._gguf_names.setdefault(n, [])
                if g not in owners:
                    owners.append(g)
        stdin_bytes = None
        if stdin_users:
            stdin_bytes = stdin.read() if stdin is not None else b""
        self._prepared = {s.name: self._prepare(s, stdin_bytes) for s in sources}
        self._used: set[str] = set()
        self._cache: weakref.WeakKeyDictionary[Context, dict[str, Tensor]] = weakref.WeakKeyDictionary()

    # -- the DSL environment ---------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self._prepared) + [n for n in self._gguf_names if n not in self._prepared]

    def metadata(self, key: str):
        """GGUF metadata from the --gguf files (in order), then files named in --tensor sources."""
        files = self.ggufs + [p.gguf for p in self._prepared.values() if p.gguf is not None]
        for g in files:
            try:
                return g.metadata(key)
            except KeyError:
                continue
        raise KeyError(key)

    def tensor(self, name: str, ctx: Context) -> Tensor | None:
        cache = self._cache.setdefault(ctx, {})
        t = cache.get(name)
        if t is not None:
            return t
        p = self._prepared.get(name)
        if p is None:
            owners = self._gguf_names.get(name)
            if not owners:
                return None
            if len(owners) > 1:
                files = " and ".join(g.path for g in owners)
                raise InputError(f"tensor '{name}' is in {files}; "
                                 f"pick one with --tensor {name}={owners[0].path}:{name}")
            g, info = owners[0], owners[0].tensors[name]
            p = _Prepared(Source(name, "gguf", path=g.path, tensor=name), _gguf_load_type(info, None), info.ne,
                          f"--gguf {g.path}: tensor '{name}'", gguf=g, info=info)
        try:
            t = self._create(p, ctx)
        except InputError:
            raise
        except GGToolError as e:
            raise InputError(f"{p.where}: {e}") from None
        t.name = name
        cache[name] = t
        self._used.add(name)
        return t

    def unused(self) -> list[str]:
        """--tensor names the program never asked for (worth a warning)."""
        return [n for n in self._prepared if n not in self._used]

    def files(self) -> list[str]:
        """Absolute paths of every file the inputs read (to refuse overwriting one)."""
        paths = [g.path for g in self.ggufs] + [p.source.path for p in self._prepared.values() if p.source.path]
        return [os.path.realpath(p) for p in paths]

    # -- up-front checks ---------------------------------------------------------------------------
    def _prepare(self, s: Source, stdin_bytes: bytes | None) -> _Prepared:
        where = s.where
        if s.kind == "shape":
            ne = s.ne
            blck = T.block_size(s.type)
            if ne[0] % blck:
                raise InputError(f"{where}: {T.type_name(s.type)} rows hold blocks of {blck}: ne0={ne[0]} is not a "
                                 f"multiple of {blck}")
            return _Prepared(s, s.type, ne, where)
        if s.kind == "json":
            if s.path is not None:
                try:
                    with open(s.path, encoding="utf-8") as f:
                        text = f.read()
                except (OSError, UnicodeDecodeError) as e:
                    raise InputError(f"{where}: {s.path}: {_os_message(e)}") from None
            else:
                text = s.json
            return self._from_array(s, parse_json_array(text, where), json_source=True)
        if s.kind == "stdin":
            if not stdin_bytes:
                raise InputError(f"{where}: stdin is empty")
            if stdin_bytes.startswith(NPY_MAGIC):
                read_npy_header(io.BytesIO(stdin_bytes), f"{where} (stdin)", len(stdin_bytes))
                try:
                    arr = np.load(io.BytesIO(stdin_bytes), allow_pickle=False)
                except (ValueError, EOFError, OSError) as e:
                    raise InputError(f"{where}: stdin is not a valid .npy stream ({e})") from None
                return self._from_array(s, arr)
            if stdin_bytes.startswith(b"GGUF"):
                raise InputError(f"{where}: stdin is a GGUF file; save it and use --gguf FILE or FILE.gguf:TENSOR")
            try:
                text = stdin_bytes.decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(f"{where}: stdin is neither a .npy stream nor JSON text") from None
            return self._from_array(s, parse_json_array(text, f"{where} (stdin)"), json_source=True)
        if s.kind == "npy":
            try:
                size = os.path.getsize(s.path)
                with open(s.path, "rb") as f:
                    magic = f.read(len(NPY_MAGIC))
                    f.seek(0)
                    if magic != NPY_MAGIC:
                        hint = " (a .npz archive: save one array with np.save)" if magic[:2] == b"PK" else ""
                        raise InputError(f"{where}: {s.path} is not a .npy file{hint}")
                    shape, dtype = read_npy_header(f, f"{where}: {s.path}", size)
            except OSError as e:
                raise InputError(f"{where}: {s.path}: {_os_message(e)}") from None
            return _Prepared(s, s.type or default_type(dtype, where), shape[::-1] or (1,), where, npy=True)
        # gguf
        try:
            g = open_gguf(s.path)
        except InputError as e:
            raise InputError(f"{where}: {e}") from None
        info = g.tensors.get(s.tensor)
        if info is None:
            close = _close_matches(s.tensor, list(g.tensors))
            hint = f"; did you mean {close}?" if close else f" (it has {len(g.tensors)} tensors)"
            raise InputError(f"{where}: {s.path} has no tensor '{s.tensor}'{hint}")
        return _Prepared(s, _gguf_load_type(info, s.type), info.ne, where, gguf=g, info=info)

    def _from_array(self, s: Source, arr: np.ndarray, json_source: bool = False) -> _Prepared:
        where = s.where
        if arr.ndim > MAX_DIMS:
            raise InputError(f"{where}: array has {arr.ndim} dimensions; GGML tensors have at most {MAX_DIMS}")
        type_ = s.type or (T.F32 if json_source else default_type(arr.dtype, where))
        arr = convert_array(arr, type_, where)
        return _Prepared(s, type_, tuple(arr.shape[::-1]) or (1,), where, array=arr)

    # -- creating tensors --------------------------------------------------------------------------
    def _create(self, p: _Prepared, ctx: Context) -> Tensor:
        s = p.source
        if p.info is not None and p.type == p.info.type and p.type in MMAP_TYPES:
            self._log(s.name, f"{s.path}:{s.tensor} ({T.type_name(p.type)}, memory-mapped)")
            return ctx.new_tensor(p.type, p.ne, storage=p.gguf.storage(), data_offset=p.info.offset)
        if not self.read_data:
            return ctx.new_tensor(p.type, p.ne, storage=NO_DATA)
        if s.kind == "shape":
            return ctx.new_tensor(p.type, p.ne)  # zeros: the pool is zero-filled
        arr = p.array
        if arr is None:
            arr = self._read(p)
        if T.is_quantized(p.type):
            return ctx.new_tensor_from(arr, p.type, s.name)
        t = ctx.new_tensor(p.type, p.ne)
        t.set_data(arr)
        return t

    def _read(self, p: _Prepared) -> np.ndarray:
        s, where = p.source, p.where
        if p.npy:
            try:
                arr = np.load(s.path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError, EOFError) as e:
                raise InputError(f"{where}: {s.path}: cannot read the .npy data ({e})") from None
            self._log(s.name, f"{s.path} ({arr.dtype}{list(arr.shape)} -> {T.type_name(p.type)})")
            return convert_array(arr, p.type, where)
        info = p.info
        raw = np.asarray(p.gguf.array(info.name))
        if info.type not in PLAIN_GGUF_TYPES:
            from gguf.quants import dequantize
            try:
                raw = dequantize(raw, info.type)
            except NotImplementedError:
                raise InputError(f"{where}: cannot dequantize {T.type_name(info.type)} "
                                 "(gguf-py has no dequantizer for it)") from None
        arr = raw.reshape(info.ne[::-1])
        self._log(s.name, f"{s.path}:{s.tensor} ({T.type_name(info.type)} -> {T.type_name(p.type)})")
        return convert_array(arr, p.type, where)

    def _log(self, name: str, what: str) -> None:
        if self.on_load is not None:
            self.on_load(name, what)


def _gguf_load_type(info: TensorInfo, prefix: T.GGMLType | None) -> T.GGMLType:
    """What a GGUF tensor becomes: the prefix, else its own type if ggtool computes with it, else f32."""
    if prefix is not None:
        return prefix
    if info.type in MMAP_TYPES:
        return info.type
    if info.type in (T.GGMLType.I8, T.GGMLType.I16, T.GGMLType.I64):
        return T.I32
    return T.F32


def _strip_path(e: Exception, path: str) -> str:
    msg = str(e)
    return msg[len(path) + 2:] if msg.startswith(f"{path}: ") else msg


def _os_message(e: Exception) -> str:
    return getattr(e, "strerror", None) or str(e)


def _close_matches(name: str, names: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return ", ".join(f"'{c}'" for c in close)
