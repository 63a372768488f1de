"""Reading GGUF files through gguf-py, with every defect turned into one clear InputError.

gguf-py parses; this layer checks what it trusts (type ids, shapes, offsets inside the file) so a
truncated or lying file is named precisely instead of surfacing as a reshape or index error.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField

from .. import types as T
from ..errors import InputError
from .storage import FileStorage


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file; `offset` is absolute in the file, `ne` in ggml order."""

    name: str
    type: T.GGMLType
    ne: tuple[int, ...]
    offset: int
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.ne, dtype=np.int64))


_NP_SCALAR = GGUFReader.gguf_scalar_to_np


class _LazyParts(Sequence):
    """`ReaderField.parts` of a big array, built on demand: the 5 leading parts (key length, key,
    value type, item type, count) are real, item parts are numpy views made when indexed."""

    __slots__ = ("head", "items", "lens", "mm", "starts")

    def __init__(self, head, items=None, starts=None, lens=None, mm=None):
        self.head, self.items, self.starts, self.lens, self.mm = head, items, starts, lens, mm

    def __len__(self) -> int:
        n = len(self.items) if self.items is not None else 2 * len(self.starts)
        return len(self.head) + n

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if k < 0:
            k += len(self)
        h = len(self.head)
        if k < h:
            return self.head[k]
        k -= h
        if self.items is not None:
            return self.items[k:k + 1]
        i, is_data = divmod(k, 2)
        st = int(self.starts[i])
        if not is_data:
            return self.mm[st:st + 8].view(np.uint64)
        return self.mm[st + 8:st + 8 + int(self.lens[i])]


class _ArrayField(ReaderField):
    """A ReaderField for an array of scalars or strings whose items are read only when asked for."""

    def contents(self, index_or_slice=slice(None)):
        parts = self.parts
        if parts.items is not None:
            sel = parts.items[index_or_slice]
            return sel.tolist() if isinstance(index_or_slice, slice) else sel.item()
        idx = range(len(parts.starts))[index_or_slice]
        mm, st, ln = parts.mm, parts.starts, parts.lens
        if isinstance(idx, int):
            return bytes(mm[int(st[idx]) + 8:int(st[idx]) + 8 + int(ln[idx])]).decode("utf-8")
        out = []
        for a, n in zip(st[idx.start:idx.stop:idx.step].tolist(), ln[idx.start:idx.stop:idx.step].tolist()):
            out.append(bytes(mm[a + 8:a + 8 + n]).decode("utf-8"))
        return out


_U64 = struct.Struct("<Q")


def _walk_strings(buf, p: int, n: int, size: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Start offsets and lengths of n GGUF strings (u64 length + bytes) stored back to back at p.

    Fast path: read only each length's low byte (a vocabulary's strings are short), then check with
    numpy that every length's 7 high bytes are zero; otherwise walk again reading full u64 lengths."""
    p0 = p
    starts = [0] * n
    try:
        for i in range(n):
            starts[i] = p
            p += 8 + buf[p]
    except IndexError:
        p = size + 1
    if p <= size and n:
        st = np.array(starts, np.int64)
        mm = np.frombuffer(buf, np.uint8)
        hi = mm[st[:, None] + np.arange(1, 8)]
        if not hi.any():
            return st, mm[st].astype(np.int64)
    p = p0
    unpack = _U64.unpack_from
    lens = [0] * n
    try:
        for i in range(n):
            ln = unpack(buf, p)[0]
            starts[i] = p
            lens[i] = ln
            p += 8 + ln
    except struct.error:
        p = size + 1
    if p > size:
        raise ValueError(f"string array '{name}' runs past the end of the file")
    return np.array(starts, np.int64), np.array(lens, np.int64)


class _CheckedReader(GGUFReader):
    """GGUFReader that validates every tensor info before gguf-py builds views of it.

    Metadata arrays (a vocabulary's 262,144 token strings, scores and types) are not split into one
    numpy view per item as gguf-py does (seconds for a big vocabulary): scalar arrays are one view,
    string arrays a walk over their length prefixes, and items are made on demand. `kv_spans`
    records each key/value's byte range (for copying metadata verbatim)."""

    def _get(self, offset, dtype, count=1, override_order=None):
        end = int(offset) + np.dtype(dtype).itemsize * int(count)
        if end > len(self.data):
            raise ValueError(f"the file ends at byte {len(self.data)} but the header needs bytes up to {end}")
        return super()._get(offset, dtype, count, override_order)

    def _build_fields(self, offs: int, count: int) -> int:
        self.kv_spans: dict[str, tuple[int, int]] = {}
        mm = self.data
        size = len(mm)
        buf = memoryview(mm)
        for _ in range(int(count)):
            orig = offs
            if offs + 8 > size:
                raise ValueError(f"metadata runs past the end of the file at byte {offs}")
            klen, kdata = self._get_str(offs)
            offs += 8 + int(klen[0])
            raw_type = self._get(offs, np.uint32)
            offs += 4
            if offs > size or len(kdata) != int(klen[0]):
                raise ValueError(f"metadata key at byte {orig} runs past the end of the file")
            name = bytes(kdata).decode("utf-8")
            head = [klen, kdata, raw_type]
            if int(raw_type[0]) == GGUFValueType.ARRAY and offs + 12 <= size and \
                    int(self._get(offs, np.uint32)[0]) != GGUFValueType.ARRAY:
                itype_arr = self._get(offs, np.uint32)
                alen = self._get(offs + 4, np.uint64)
                n = int(alen[0])
                itype = GGUFValueType(int(itype_arr[0]))
                p = offs + 12
                head += [itype_arr, alen]
                if itype == GGUFValueType.STRING:
                    starts, lens = _walk_strings(buf, p, n, size, name)
                    p = int(starts[-1]) + 8 + int(lens[-1]) if n else p
                    parts = _LazyParts(head, starts=starts, lens=lens, mm=mm)
                    data = range(len(head) + 1, len(head) + 2 * n, 2)
                else:
                    nptype = _NP_SCALAR.get(itype)
                    if nptype is None:
                        raise ValueError(f"Unknown/unhandled field type {itype}")
                    items = self._get(p, nptype, n)
                    if len(items) != n:
                        raise ValueError(f"array '{name}' runs past the end of the file")
                    p += items.nbytes
                    parts = _LazyParts(head, items=items)
                    data = range(len(head), len(head) + n)
                self._push_field(_ArrayField(orig, name, parts, data, [GGUFValueType.ARRAY, itype]),
                                 skip_sum=True)
                offs = p
            else:
                fsize, fparts, fidxs, ftypes = self._get_field_parts(offs, raw_type[0])
                self._push_field(ReaderField(orig, name, head + fparts, [i + 3 for i in fidxs], ftypes),
                                 skip_sum=True)
                offs += fsize
            if offs > size:
                raise ValueError(f"metadata value '{name}' runs past the end of the file")
            self.kv_spans[name] = (orig, offs)
        self.kv_end = offs
        return offs

    def _build_tensors(self, start_offs, fields):
        size = len(self.data)
        for field in fields:
            _, name_data, _, dims, raw_dtype, offset_tensor = field.parts
            name = bytes(name_data).decode("utf-8", errors="replace")
            raw = int(raw_dtype[0])
            try:
                t = T.GGMLType(raw)
                blck, tsize = T.block_size(t), T.type_size(t)
            except ValueError:
                raise InputError(f"tensor '{name}' has unknown or removed GGML type id {raw}") from None
            ne = [int(d) for d in dims]
            if ne and ne[0] % blck:
                raise InputError(f"tensor '{name}': {T.type_name(t)} row length {ne[0]} is not a "
                                 f"multiple of its block size {blck}")
            n_bytes = int(np.prod(ne, dtype=np.int64)) * tsize // blck
            start = int(start_offs + offset_tensor[0])
            if int(offset_tensor[0]) % self.alignment:
                raise InputError(f"tensor '{name}': data offset {int(offset_tensor[0])} is not a "
                                 f"multiple of the alignment {self.alignment}")
            if start + n_bytes > size:
                raise InputError(f"tensor '{name}' needs bytes {start}..{start + n_bytes} but the file "
                                 f"has only {size} bytes (truncated, or its offsets lie)")
        return super()._build_tensors(start_offs, fields)


class GGUFFile:
    """A GGUF file opened lazily: header and infos parsed, tensor data memory-mapped, nothing read."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            size = os.path.getsize(self.path)
        except OSError as e:
            raise InputError(f"{self.path}: {e.strerror}") from None
        if size < 24:
            raise InputError(f"{self.path}: not a GGUF file ({size} bytes, too short for a header)")
        with open(self.path, "rb") as f:
            magic = f.read(4)
            version = int.from_bytes(f.read(4), "little")
        if magic != b"GGUF":
            raise InputError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        if version in (1,) or (version & 0xFFFF and version not in (2, 3)):
            raise InputError(f"{self.path}: GGUF version {version} is not supported (versions 2 and 3 are)")
        try:
            self.reader = _CheckedReader(self.path)
        except InputError as e:
            raise InputError(f"{self.path}: {e}") from None
        except Exception as e:  # gguf-py reports truncation as reshape/index errors
            raise InputError(f"{self.path}: truncated or corrupt GGUF header or metadata "
                             f"({type(e).__name__}: {e})") from None
        if self.reader.byte_order != "I":
            raise InputError(f"{self.path}: big-endian GGUF files are not supported")

    @property
    def version(self) -> int:
        return int(self.reader.fields["GGUF.version"].parts[-1][0])

    @property
    def alignment(self) -> int:
        return int(self.reader.alignment)

    @property
    def data_offset(self) -> int:
        return int(self.reader.data_offset)

    @cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        return {t.name: TensorInfo(t.name, T.GGMLType(int(t.tensor_type)),
                                   tuple(int(d) for d in t.shape), int(t.data_offset), int(t.n_bytes))
                for t in self.reader.tensors}

    def keys(self) -> list[str]:
        return [k for k in self.reader.fields if not k.startswith("GGUF.")]

    def value_type(self, key: str) -> str:
        """The GGUF value type, e.g. 'UINT32', 'STRING' or 'ARRAY[FLOAT32]'."""
        types = self.reader.fields[key].types
        name = types[0].name
        return f"ARRAY[{types[1].name if len(types) > 1 else '?'}]" if types[0] == GGUFValueType.ARRAY else name

    def array_len(self, key: str) -> int | None:
        f = self.reader.fields[key]
        return len(f.data) if f.types and f.types[0] == GGUFValueType.ARRAY else None

    def metadata(self, key: str, default=KeyError):
        """A metadata value as Python (int, float, bool, str or list); KeyError if absent."""
        f = self.reader.fields.get(key)
        if f is None or key.startswith("GGUF."):
            if default is KeyError:
                raise KeyError(key)
            return default
        v = f.contents()
        if isinstance(v, (np.generic,)):
            v = v.item()
        return v

    def array(self, name: str) -> np.ndarray:
        """The tensor's raw data as gguf-py maps it (numpy order; quantized types as bytes)."""
        return self._reader_tensors[name].data

    @cached_property
    def _reader_tensors(self) -> dict:
        return {t.name: t for t in self.reader.tensors}

    def storage(self) -> FileStorage:
        return FileStorage(self.path)


_OPEN: dict[str, tuple[tuple[int, int], GGUFFile]] = {}  # path -> ((mtime, size), file): the newest only


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open (or reuse, while the file is unchanged) a GGUF file."""
    p = os.path.abspath(os.fspath(path))
    try:
        st = os.stat(p)
    except OSError as e:
        raise InputError(f"{os.fspath(path)}: {e.strerror}") from None
    version = (st.st_mtime_ns, st.st_size)
    cached = _OPEN.get(p)
    if cached is not None and cached[0] == version:
        return cached[1]
    f = GGUFFile(path)
    _OPEN[p] = (version, f)  # a rewritten file replaces its old reader (and lets its map go)
    return f
