"""The tensors a program may use, by name: `Inputs`, the DSL's environment over named sources and
GGUF files offered whole.

Every source is parsed and checked up front (a typo or a bad file is reported before anything
runs), but a tensor is only created, and its data only read, when a program uses its name:
`Inputs.tensor(name, ctx)` is what the DSL calls. So a whole GGUF model costs one header parse
however large it is. The source language is `ggtool.tensor_io.sources`, the array readers
`ggtool.tensor_io.arrays`. Errors are InputErrors located at the input (`input`) or at the GGUF
file given whole (`file`, `tensor`).
"""

from __future__ import annotations

import io
import math
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import types as T
from ..context import Context
from ..errors import GGToolError, InputError, did_you_mean
from ..tensor import Tensor
from .arrays import NPY_MAGIC, convert_array, default_type, gguf_array, open_npy, os_message, parse_json_array, read_npy_header
from .sources import Source, SourceSyntaxError

if TYPE_CHECKING:
    from ..gguf_io import GGUFFile, TensorInfo

__all__ = ["NO_DATA", "Inputs", "mmap_types"]


def mmap_types() -> tuple:
    """The types a GGUF tensor keeps when loaded (memory-mapped, zero-copy, GGML's type, ne, nb and
    row size): F32, F16, I32 and every type mul_mat multiplies as it is (``quant.matmul.dot_types``);
    the rest only through a type prefix."""
    from ..quant.matmul import dot_types
    return (T.F32, T.F16, T.I32, *dot_types())


class _NoData:
    """Storage of a shape-only tensor in a graph that is only inspected or planned, never computed."""

    @property
    def array(self):
        raise InputError("this tensor's data was not loaded (the inputs were opened without reading data)")


NO_DATA = _NoData()


@dataclass
class _Prepared:
    """A source after its up-front checks: its type and shape, and how to get its data."""

    source: Source
    type: T.GGMLType
    ne: tuple[int, ...]
    whole_file: bool = False                 # a tensor of a GGUF file given whole, not a named source
    array: np.ndarray | None = None          # json/stdin: parsed; npy: loaded lazily
    gguf: GGUFFile | None = None
    info: TensorInfo | None = None
    npy: bool = False                        # data in the .npy file at source.path
    npy_layout: tuple | None = None          # npy: (dtype, Fortran order, data offset) from its header

    def located(self, e: InputError) -> InputError:
        """`e` as raised while loading this input, located at it."""
        s = self.source
        if self.whole_file:
            return InputError(f"tensor '{s.name}': {e}", file=s.path, tensor=s.name, kind=e.kind, **e.details)
        return e.at(input=s.name)


class Inputs:
    """The tensors a program may use, by name: named sources, then every tensor of GGUF files
    given whole.

    This is the DSL's environment: `tensor(name, ctx)` creates the tensor in `ctx` on first use
    (cached per context), `names()` lists what exists (for "did you mean"), `metadata(key)` reads
    GGUF metadata. With `read_data=False` (to inspect or plan a graph) no tensor data is ever
    read: tensors get their type and shape only, and GGUF weights are memory-mapped but not touched.

    A named source shadows a GGUF tensor of the same name (to substitute one weight); a name found
    in two of the GGUF files is ambiguous and an error when used.
    """

    def __init__(self, sources: list[Source] = (), gguf_paths: list[str] = (), stdin=None,
                 read_data: bool = True, on_load: Callable[[str, str], None] | None = None):
        self.read_data = read_data
        self.on_load = on_load
        seen: dict[str, Source] = {}
        stdin_users = [s for s in sources if s.kind == "stdin"]
        for s in sources:
            if s.name in seen:
                raise SourceSyntaxError("given twice", input=s.name, kind="duplicate-input")
            seen[s.name] = s
        if len(stdin_users) > 1:
            names = [s.name for s in stdin_users]
            raise SourceSyntaxError(f"only one input can read stdin ('-'); {', '.join(names)} all do",
                                    kind="stdin-shared", names=names)
        self.ggufs: list[GGUFFile] = []
        for p in gguf_paths:
            try:
                self.ggufs.append(_open_gguf(p))
            except InputError as e:
                raise InputError(_strip_path(e, p), file=p, kind=e.kind, **e.details) from None
        self._gguf_names: dict[str, list[GGUFFile]] = {}
        for g in self.ggufs:
            for n in g.tensors:
                owners = self._gguf_names.setdefault(n, [])
                if g not in owners:
                    owners.append(g)
        stdin_bytes = None
        if stdin_users:
            stdin_bytes = stdin.read() if stdin is not None else b""
        self._prepared = {}
        for s in sources:
            try:
                self._prepared[s.name] = self._prepare(s, stdin_bytes)
            except InputError as e:
                raise e.at(input=s.name) from None
        self._used: set[str] = set()
        self._cache: weakref.WeakKeyDictionary[Context, dict[str, Tensor]] = weakref.WeakKeyDictionary()

    # -- the DSL environment ---------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self._prepared) + [n for n in self._gguf_names if n not in self._prepared]

    def metadata(self, key: str):
        """GGUF metadata from the GGUF files given whole (in order), then from files named in sources."""
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
                files = [g.path for g in owners]
                raise InputError(f"tensor '{name}' is in {' and '.join(files)}",
                                 hint=f"; pick one by naming its file: {name}={files[0]}:{name}", tensor=name,
                                 kind="ambiguous-tensor", files=files)
            g, info = owners[0], owners[0].tensors[name]
            src = Source(name, "gguf", path=g.path, tensor=name)
            p = _Prepared(src, _gguf_load_type(info, None, src, whole_file=True), info.ne, whole_file=True, gguf=g,
                          info=info)
        try:
            t = self._create(p, ctx)
        except InputError as e:
            raise p.located(e) from None
        except GGToolError as e:
            raise p.located(InputError(str(e))) from None
        t.name = name
        cache[name] = t
        self._used.add(name)
        return t

    def unused(self) -> list[str]:
        """Names of sources the program never asked for (worth a warning)."""
        return [n for n in self._prepared if n not in self._used]

    def unused_weights(self) -> list[tuple[str, str]]:
        """(name, file) of every tensor of the GGUF files given whole that the program never asked
        for, in file order; a named source of the same name replaces one and is not listed. A
        program meant for another model leaves some (llama.gg on qwen2 leaves the q/k/v biases)."""
        seen, out = set(self._prepared) | self._used, []
        for g in self.ggufs:
            for n in g.tensors:
                if n not in seen:
                    seen.add(n)
                    out.append((n, g.path))
        return out

    def files(self) -> list[str]:
        """Absolute paths of every file the inputs read (to refuse overwriting one)."""
        paths = [f for g in self.ggufs for f in g.paths] + [p.source.path for p in self._prepared.values() if p.source.path]
        paths += [f for p in self._prepared.values() if p.gguf is not None for f in p.gguf.paths]
        return [os.path.realpath(p) for p in paths]

    def quantized(self) -> bool:
        """Whether a quantized tensor may be used: one of a GGUF file's, or a named source's (a GGUF
        tensor, or a conversion such as q4_0:w.npy). Known before any data is read, so that the
        worker pool can load its compiled kernels while the graph is built."""
        if any(T.is_quantized(p.type) for p in self._prepared.values()):
            return True
        return any(T.is_quantized(i.type) for g in self.ggufs for i in g.tensors.values())

    # -- up-front checks (errors located at the input by __init__) -------------------------------------
    def _prepare(self, s: Source, stdin_bytes: bytes | None) -> _Prepared:
        if s.kind == "shape":
            ne = s.ne
            blck = T.block_size(s.type)
            if ne[0] % blck:
                raise InputError(f"{T.type_name(s.type)} rows hold blocks of {blck}: ne0={ne[0]} is not a multiple "
                                 f"of {blck}", kind="block-size")
            return _Prepared(s, s.type, ne)
        if s.kind == "json":
            if s.path is not None:
                try:
                    with open(s.path, encoding="utf-8") as f:
                        text = f.read()
                except (OSError, UnicodeDecodeError) as e:
                    raise InputError(f"{s.path}: {os_message(e)}", kind="os") from None
                try:
                    return self._from_array(s, parse_json_array(text), json_source=True)
                except InputError as e:
                    raise e.at(within=s.path) from None
            return self._from_array(s, parse_json_array(s.json), json_source=True)
        if s.kind == "stdin":
            return self._from_stdin(s, stdin_bytes)
        if s.kind == "text":
            return self._from_text(s)
        if s.kind == "npy":
            shape, dtype, fortran, offset = open_npy(s.path)
            return _Prepared(s, s.type or default_type(dtype), shape[::-1] or (1,), npy=True,
                             npy_layout=(dtype, fortran, offset))
        # gguf
        g = _open_gguf(s.path)
        info = g.tensors.get(s.tensor)
        if info is None:
            close = did_you_mean(s.tensor, g.tensors)
            hint = f"; {close}" if close else f" (it has {len(g.tensors)} tensors)"
            raise InputError(f"{s.path} has no tensor '{s.tensor}'", hint=hint, kind="no-such-tensor").at(
                s.name, file=s.path, tensor=s.tensor)
        return _Prepared(s, _gguf_load_type(info, s.type, s), info.ne, gguf=g, info=info)

    def _from_text(self, s: Source) -> _Prepared:
        """text:TEXT -> its token ids in the vocabulary of the first GGUF file given whole that has one."""
        from ..tokenizer import Vocab, VocabError

        g = next((g for g in self.ggufs if _has_vocabulary(g)), None)
        if g is None:
            files = [x.path for x in self.ggufs]
            what = f"none of {', '.join(files)} has one (tokenizer.ggml.tokens)" if files else "no model is given"
            raise InputError(f"a text source is tokenized with a GGUF model's vocabulary; {what}",
                             kind="text-needs-vocab", models=files)
        try:
            ids = Vocab.from_gguf(g.path).tokenize(s.text)
        except VocabError as e:
            raise InputError(_strip_path(e, g.path), file=g.path, kind="vocab") from None
        return self._from_array(s, np.asarray(ids, np.int32))

    def _from_stdin(self, s: Source, stdin_bytes: bytes | None) -> _Prepared:
        if not stdin_bytes:
            raise InputError("stdin is empty", kind="stdin")
        if stdin_bytes.startswith(NPY_MAGIC):
            try:
                read_npy_header(io.BytesIO(stdin_bytes), len(stdin_bytes))
            except InputError as e:
                raise e.at(within="stdin") from None
            try:
                arr = np.load(io.BytesIO(stdin_bytes), allow_pickle=False)
            except (ValueError, EOFError, OSError) as e:
                raise InputError(f"stdin is not a valid .npy stream ({e})", kind="stdin") from None
            return self._from_array(s, arr)
        if stdin_bytes.startswith(b"GGUF"):
            raise InputError("stdin is a GGUF file", hint="; save it and read it from the file", kind="stdin-gguf")
        try:
            text = stdin_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError("stdin is neither a .npy stream nor JSON text", kind="stdin") from None
        try:
            arr = parse_json_array(text)
        except InputError as e:
            raise e.at(within="stdin") from None
        return self._from_array(s, arr, json_source=True)

    def _from_array(self, s: Source, arr: np.ndarray, json_source: bool = False) -> _Prepared:
        # at most MAX_DIMS dimensions: parse_json_array and read_npy_header checked
        type_ = s.type or (T.F32 if json_source else default_type(arr.dtype))
        arr = convert_array(arr, type_)
        return _Prepared(s, type_, tuple(arr.shape[::-1]) or (1,), array=arr)

    # -- creating tensors --------------------------------------------------------------------------
    def _create(self, p: _Prepared, ctx: Context) -> Tensor:
        s = p.source
        if p.info is not None and p.type == p.info.type and p.type in mmap_types():
            self._log(s.name, f"{s.path}:{s.tensor} ({T.type_name(p.type)}, memory-mapped)")
            return ctx.new_tensor(p.type, p.ne, storage=p.gguf.storage(p.info.name), data_offset=p.info.offset)
        if not self.read_data:
            return ctx.new_tensor(p.type, p.ne, storage=NO_DATA)
        if s.kind == "shape":
            return ctx.new_tensor(p.type, p.ne)  # zeros: the pool is zero-filled
        arr = p.array
        if arr is None:
            if p.npy:
                mapped = self._map_npy(p, ctx)
                if mapped is not None:
                    return mapped
            arr = self._read(p)
        if T.is_quantized(p.type):
            return ctx.new_tensor_from(arr, p.type, s.name)
        t = ctx.new_tensor(p.type, p.ne)
        t.set_data(arr)
        return t

    def _map_npy(self, p: _Prepared, ctx: Context) -> Tensor | None:
        """A .npy file whose data is already the tensor's (its dtype, C order) joins the context
        memory-mapped, as a GGUF weight does (gguf_io.FileStorage): nothing is copied into the pool,
        and the worker pool's processes map the file themselves. Else None (it is read and
        converted)."""
        dtype, fortran, offset = p.npy_layout
        if (T.is_quantized(p.type) or p.type == T.BF16 or dtype != T.np_dtype(p.type) or fortran
                or math.prod(p.ne) == 0):
            return None
        from ..gguf_io.storage import FileStorage

        s = p.source
        self._log(s.name, f"{s.path} ({dtype}{list(p.ne[::-1])}, memory-mapped)")
        return ctx.new_tensor(p.type, p.ne, storage=FileStorage(s.path), data_offset=offset)

    def _read(self, p: _Prepared) -> np.ndarray:
        s = p.source
        if p.npy:
            try:
                arr = np.load(s.path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError, EOFError) as e:
                raise InputError(f"{s.path}: cannot read the .npy data ({e})", kind="npy") from None
            self._log(s.name, f"{s.path} ({arr.dtype}{list(arr.shape)} -> {T.type_name(p.type)})")
            return convert_array(arr, p.type)
        arr = gguf_array(p.gguf, p.info.name, p.type)
        self._log(s.name, f"{s.path}:{s.tensor} ({T.type_name(p.info.type)} -> {T.type_name(p.type)})")
        return arr

    def _log(self, name: str, what: str) -> None:
        if self.on_load is not None:
            self.on_load(name, what)


def _open_gguf(path) -> GGUFFile:
    from ..gguf_io import open_gguf  # gguf-py loads only when a GGUF file is read

    return open_gguf(path)


def _gguf_load_type(info: TensorInfo, prefix: T.GGMLType | None, s: Source, whole_file: bool = False) -> T.GGMLType:
    """What a GGUF tensor becomes: the prefix's type, else its own if ggtool computes with it. Any
    other type is refused (InputError): a conversion, lossy or not, is the user's to ask for, with
    a type prefix (`details["spec"]`, the source that asks)."""
    if prefix is not None:
        return prefix
    if info.type in mmap_types():
        return info.type
    integer = info.type in (T.GGMLType.I8, T.GGMLType.I16, T.GGMLType.I64)
    target = "i32" if integer else "f32"
    spec = f"{target}:{s.path}:{s.tensor}"
    what = f"tensor '{s.tensor}'" if whole_file else f"{s.path}:{s.tensor}"
    error = InputError(f"{what} is {T.type_name(info.type)}, a type ggtool does not compute with",
                       hint=f"; to use it converted to {target}, say so: {s.name}={spec}", kind="needs-conversion",
                       name=s.name, target=target, spec=spec)
    raise error.at(None if whole_file else s.name, file=s.path, tensor=s.tensor)


def _has_vocabulary(g: GGUFFile) -> bool:
    return "tokenizer.ggml.tokens" in g.keys()


def _strip_path(e: Exception, path: str) -> str:
    msg = str(e)
    return msg[len(path) + 2:] if msg.startswith(f"{path}: ") else msg
