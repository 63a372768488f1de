"""Reading GGUF files through gguf-py, distrusting the file: every defect is one clear InputError.

gguf-py parses; this layer checks what it would trust. Every count (metadata keys, tensors, array
items, string lengths) is checked against the bytes left in the file before anything is made
for it, so a 224-byte file cannot ask for gigabytes; sizes and offsets are summed in Python
integers (a uint64 offset cannot wrap around to the header); GGML's limits are enforced as
gguf.cpp does (`format`: 4 dimensions, names under 64 bytes, no name twice, a power-of-two
alignment, each tensor's data right after the one before it); strings that are not UTF-8 are
read escaped, never raised on. A model split by gguf-split is opened whole from its first shard.
"""

from __future__ import annotations

import math
import os
import struct
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .. import role


class _YamlOnFirstUse(types.ModuleType):
    """`yaml` in ggtool's command line until something uses it: PyYAML, imported at the first
    attribute asked for, then this module holds its names. (importlib's LazyLoader would not do: the
    next `import yaml` reads the module's __spec__, which loads it.)"""

    def __getattr__(self, name: str):
        if sys.modules.get("yaml") is self:
            del sys.modules["yaml"]
        import importlib

        try:
            real = importlib.import_module("yaml")
        finally:
            sys.modules.setdefault("yaml", self)
        self.__dict__.update({k: v for k, v in vars(real).items() if k != "__class__"})
        sys.modules["yaml"] = real
        return getattr(real, name)


def _yaml_on_first_use() -> None:
    """Called before gguf-py is imported, below. gguf-py imports PyYAML with itself, for the model
    cards of gguf.metadata, which ggtool never reads: ~20 ms of every GGUF command's start. In
    ggtool's own command line (role.COMMAND_LINE) `yaml` is a stand-in that imports it when first
    used, if ever; `import yaml` and `from yaml import ...` work as before."""
    if not role.COMMAND_LINE or "yaml" in sys.modules or "gguf" in sys.modules:
        return
    import importlib.util

    try:
        spec = importlib.util.find_spec("yaml")
    except (ImportError, ValueError):
        return
    if spec is None:
        return               # gguf-py's own import then says what is missing
    module = _YamlOnFirstUse("yaml")
    module.__spec__ = spec
    sys.modules["yaml"] = module


_yaml_on_first_use()

from gguf import GGUFReader, GGUFValueType  # noqa: E402 - after yaml's stand-in
from gguf.gguf_reader import ReaderField, ReaderTensor  # noqa: E402

from .. import types as T  # noqa: E402
from ..errors import InputError  # noqa: E402
from .format import (  # noqa: E402
    MAX_DIMS,
    MAX_ITEMS,
    MAX_NAME,
    MAX_STRING,
    SPLIT_COUNT,
    SPLIT_NO,
    SPLIT_TENSORS,
    decode_name,
    decode_text,
    shard_path,
    shard_prefix,
    short,
)
from .storage import FileStorage  # noqa: E402


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF model; `offset` is absolute in `path` (the file, or the shard of a
    split model, holding its data), `ne` in ggml order."""

    name: str
    type: T.GGMLType
    ne: tuple[int, ...]
    offset: int
    n_bytes: int
    path: str = ""

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)


_NP_SCALAR = GGUFReader.gguf_scalar_to_np
_VALUE_TYPES = {int(t) for t in GGUFValueType}
_HEADER_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")   # gguf-py's names, not keys
_MIN_KV = 8 + 1 + 4 + 1            # key length, a 1-byte key (GGML refuses empty ones), type, a 1-byte value
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8   # name length (of an empty name), n_dims (0), type, offset
_INT64_MAX = (1 << 63) - 1


class _Field(ReaderField):
    """A scalar ReaderField whose string value never fails to decode (format.decode_text)."""

    __slots__ = ()

    def contents(self, index_or_slice=slice(None)):
        if self.types and self.types[0] == GGUFValueType.STRING:
            return decode_text(bytes(self.parts[-1]))
        return super().contents(index_or_slice)


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
        mv, st, ln = memoryview(parts.mm), parts.starts, parts.lens   # slicing a memoryview, not the
        if isinstance(idx, int):                                      # memmap: 5x faster on a vocabulary
            return decode_text(bytes(mv[int(st[idx]) + 8:int(st[idx]) + 8 + int(ln[idx])]))
        return [decode_text(bytes(mv[a + 8:a + 8 + n]))
                for a, n in zip(st[idx.start:idx.stop:idx.step].tolist(), ln[idx.start:idx.stop:idx.step].tolist())]


_U64 = struct.Struct("<Q")


_SCAN_BYTES = 1 << 20   # a string array is scanned in pieces of at most this many bytes (~30x that in memory)
_MAX_JUMPS = 64         # places that look like a string's start but are not, stepped over (and one per 1024 strings)


def _short_strings(mm: np.ndarray, p: int, n: int, size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Start offsets and lengths of the n strings at p, found with numpy where every length is under
    256 (a vocabulary's): each start's 7 high length bytes are zero, so the starts are among the
    places followed by 7 zero bytes (the candidates); from p each start is the one before + 8 + its
    length, followed from candidate to candidate, stepping over those that are not starts (an
    empty string makes one). What it returns is that chain itself, so it cannot be wrong; None where
    it breaks (a length of 256 or more, a run past the file, too many false starts): the caller
    walks the lengths. ~10 ms for 262,144 tokens where a Python loop over them takes ~40. It reads
    the array in pieces of at most _SCAN_BYTES, so a hostile one costs bounded memory."""
    pieces, count, jumps, q = [], 0, _MAX_JUMPS + n // 1024, p    # q: the next string's start
    while True:
        end = min(size, q + min(_SCAN_BYTES, 24 * (n - count) + 64))   # ~17 bytes a vocabulary's string
        seg = mm[q:end]
        z = seg == 0
        m = len(z) - 7
        if m <= 0:
            return None
        run = z[1:1 + m].copy()
        for k in range(2, 8):
            run &= z[k:k + m]
        cand = np.flatnonzero(run)                     # positions (from q) followed by 7 zero bytes
        if not len(cand) or cand[0] != 0:
            return None
        nxt = cand + 8 + seg[cand]                     # where the next string starts if this one is a start
        at = np.searchsorted(cand, nxt)
        linked = at < len(cand)
        linked[linked] = cand[at[linked]] == nxt[linked]
        breaks = np.flatnonzero(~linked | (at != np.arange(1, len(cand) + 1)))   # the chain leaves j + 1
        j = 0
        while True:
            k = int(breaks[np.searchsorted(breaks, j)])   # the last candidate of this stretch
            take = min(k - j + 1, n - count)
            pieces.append(cand[j:j + take] + q)
            count += take
            if count == n:
                starts = np.concatenate(pieces)
                lens = mm[starts].astype(np.int64)
                return (starts, lens) if int(starts[-1]) + 8 + int(lens[-1]) <= size else None
            if not linked[k]:
                break          # the next start is past this piece (or not a candidate: a long string)
            jumps -= 1
            if jumps < 0:
                return None
            j = int(at[k])      # step over the candidates that are not starts
        if nxt[k] + 8 <= len(seg) or end >= size:
            return None         # its length's high bytes are not zero, or the file ends
        q += int(nxt[k])


def _walk_strings(buf, p: int, n: int, size: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Start offsets and lengths of n GGUF strings (u64 length + bytes) stored back to back at p;
    the caller has checked that n length prefixes fit in the bytes left. Short strings are found
    with numpy (``_short_strings``), else (many empty ones) by a walk over each length's low byte,
    checked with numpy to have 7 zero high bytes; otherwise each u64 length is read in turn."""
    if n:
        mm = np.frombuffer(buf, np.uint8)
        found = _short_strings(mm, p, n, size)
        if found is not None:
            return found
        starts = [0] * n
        q = p
        try:
            for i in range(n):
                starts[i] = q
                q += 8 + buf[q]
        except IndexError:
            q = size + 1
        if q <= size:
            st = np.array(starts, np.int64)
            if not mm[st[:, None] + np.arange(1, 8)].any():
                return st, mm[st].astype(np.int64)
    starts = [0] * n
    unpack = _U64.unpack_from
    lens = [0] * n
    try:
        for i in range(n):
            ln = unpack(buf, p)[0]
            if ln > MAX_STRING:
                raise InputError(f"string {i} of array '{name}' (at byte {p}) claims {ln} bytes, over GGUF's "
                                 f"limit of {MAX_STRING}")
            starts[i] = p
            lens[i] = ln
            p += 8 + ln
    except struct.error:
        p = size + 1
    if p > size:
        raise InputError(f"string array '{name}' runs past the end of the file")
    return np.array(starts, np.int64), np.array(lens, np.int64)


class _CheckedReader(GGUFReader):
    """GGUFReader that checks before it allocates, and tensor infos before gguf-py trusts them.

    Metadata arrays (a vocabulary's 262,144 token strings, scores and types) are not split into one
    numpy view per item as gguf-py does (seconds for a big vocabulary): scalar arrays are one view,
    string arrays a walk over their length prefixes, and items are made on demand. `kv_spans`
    records each key/value's byte range (for copying metadata verbatim)."""

    def _get(self, offset, dtype, count=1, override_order=None):
        end = int(offset) + np.dtype(dtype).itemsize * int(count)
        if end > len(self.data):
            raise InputError(f"truncated: the header needs bytes up to {end} but the file ends at byte "
                             f"{len(self.data)}")
        return super()._get(offset, dtype, count, override_order)

    def _get_str(self, offset):
        slen = self._get(offset, np.uint64)
        if int(slen[0]) > MAX_STRING:
            raise InputError(f"the string at byte {offset} claims {int(slen[0])} bytes, over GGUF's limit "
                             f"of {MAX_STRING}")
        return slen, self._get(offset + 8, np.uint8, slen[0])

    # ---------------------------------------------------------------------------------- metadata
    def _build_fields(self, offs: int, count: int) -> int:
        self.kv_spans: dict[str, tuple[int, int]] = {}
        size = len(self.data)
        buf = memoryview(self.data)
        count = int(count)
        if count > (size - offs) // _MIN_KV:
            raise InputError(f"the header declares {count} metadata keys, but the {size - offs} bytes after "
                             f"it hold at most {(size - offs) // _MIN_KV}")
        for i in range(count):
            orig = offs
            klen, kdata = self._get_str(offs)
            offs += 8 + int(klen[0])
            if not len(kdata):
                raise InputError(f"metadata key {i} (at byte {orig}) is empty")
            name = decode_name(bytes(kdata))
            if name in self.fields:
                what = "is gguf-py's name for a header field" if name in _HEADER_FIELDS else "appears twice"
                raise InputError(f"metadata key '{short(name)}' (at byte {orig}) {what}")
            raw_type = self._get(offs, np.uint32)
            offs += 4
            vtype = int(raw_type[0])
            head = [klen, kdata, raw_type]
            if vtype not in _VALUE_TYPES:
                raise InputError(f"metadata '{short(name)}' (at byte {orig}) has unknown value type {vtype}")
            if vtype == GGUFValueType.ARRAY:
                offs = self._array_field(orig, name, head, offs, buf)
            else:
                fsize, fparts, fidxs, ftypes = self._get_field_parts(offs, vtype)
                self._push_field(_Field(orig, name, head + fparts, [k + 3 for k in fidxs], ftypes), skip_sum=True)
                offs += fsize
            self.kv_spans[name] = (orig, offs)
        self.kv_end = offs
        return offs

    def _array_field(self, orig: int, name: str, head: list, offs: int, buf) -> int:
        size = len(self.data)
        itype_arr = self._get(offs, np.uint32)
        alen = self._get(offs + 4, np.uint64)
        itype, n, p = int(itype_arr[0]), int(alen[0]), offs + 12
        if itype == GGUFValueType.ARRAY:
            raise InputError(f"metadata '{short(name)}' is an array of arrays, which GGML does not read")
        if itype not in _VALUE_TYPES:
            raise InputError(f"metadata '{short(name)}' is an array of unknown value type {itype}")
        itype = GGUFValueType(itype)
        item = 8 if itype == GGUFValueType.STRING else np.dtype(_NP_SCALAR[itype]).itemsize
        if n > min(MAX_ITEMS, (size - p) // item):
            raise InputError(f"metadata '{short(name)}' declares {n} items, but the {size - p} bytes left in "
                             f"the file hold at most {(size - p) // item}" +
                             (f" (GGUF's limit is {MAX_ITEMS})" if n > MAX_ITEMS else ""))
        head += [itype_arr, alen]
        if itype == GGUFValueType.STRING:
            starts, lens = _walk_strings(buf, p, n, size, name)
            p = int(starts[-1]) + 8 + int(lens[-1]) if n else p
            parts = _LazyParts(head, starts=starts, lens=lens, mm=self.data)
            data = range(len(head) + 1, len(head) + 2 * n, 2)
        else:
            items = self._get(p, _NP_SCALAR[itype], n)
            p += items.nbytes
            parts = _LazyParts(head, items=items)
            data = range(len(head), len(head) + n)
        self._push_field(_ArrayField(orig, name, parts, data, [GGUFValueType.ARRAY, itype]), skip_sum=True)
        return p

    # -------------------------------------------------------------------------------- tensor infos
    def _check_alignment(self) -> None:
        f = self.fields.get("general.alignment")
        if f is None:
            return
        if f.types != [GGUFValueType.UINT32]:
            kind = "/".join(t.name for t in f.types)
            raise InputError(f"general.alignment must be a UINT32, not {kind}")
        a = int(f.parts[-1][0])
        if a == 0 or a & (a - 1):
            raise InputError(f"general.alignment {a} is not a power of two")

    def _build_tensor_info(self, offs: int, count: int) -> tuple[int, list[ReaderField]]:
        self._check_alignment()
        size = len(self.data)
        count = int(count)
        if count > (size - offs) // _MIN_TENSOR_INFO:
            raise InputError(f"the header declares {count} tensors, but the {size - offs} bytes after the "
                             f"metadata hold at most {(size - offs) // _MIN_TENSOR_INFO} tensor infos")
        fields, seen = [], {}
        for i in range(count):
            orig = offs
            name_len, name_data = self._get_str(offs)
            offs += 8 + int(name_len[0])
            name = decode_name(bytes(name_data))
            if len(name_data) >= MAX_NAME:
                raise InputError(f"tensor {i} (at byte {orig}): name '{short(name)}' is {len(name_data)} bytes long; "
                                 f"GGML's tensor names have at most {MAX_NAME - 1}")
            if name in seen:
                raise InputError(f"tensor name '{name}' is used twice (tensors {seen[name]} and {i})")
            seen[name] = i
            n_dims = self._get(offs, np.uint32)
            offs += 4
            if int(n_dims[0]) > MAX_DIMS:
                raise InputError(f"tensor '{name}' has {int(n_dims[0])} dimensions; GGML tensors have at "
                                 f"most {MAX_DIMS}")
            dims = self._get(offs, np.uint64, n_dims[0])
            offs += 8 * int(n_dims[0])
            raw_dtype = self._get(offs, np.uint32)
            offset_tensor = self._get(offs + 4, np.uint64)
            offs += 12
            fields.append(ReaderField(orig, name, [name_len, name_data, n_dims, dims, raw_dtype, offset_tensor],
                                      [1, 3, 4, 5]))
        return offs, fields

    def _build_tensors(self, start_offs, fields) -> None:
        """Every tensor's type, shape, size and place checked (in Python integers), then viewed."""
        size, start_offs, align = len(self.data), int(start_offs), int(self.alignment)
        if fields and start_offs > size:
            raise InputError(f"the tensor data would start at byte {start_offs} (alignment {align}), past the "
                             f"end of the file ({size} bytes)")
        tensors, expected = [], 0
        for field in fields:
            _, _, _, dims, raw_dtype, offset_tensor = field.parts
            name, raw = field.name, int(raw_dtype[0])
            try:
                t = T.GGMLType(raw)
                blck, tsize = T.block_size(t), T.type_size(t)
            except ValueError:
                raise InputError(f"tensor '{name}' has unknown or removed GGML type id {raw}") from None
            ne = [int(d) for d in dims]
            if any(d > _INT64_MAX for d in ne):
                raise InputError(f"tensor '{name}': shape {ne} has a dimension beyond GGML's int64")
            n_el = math.prod(ne)
            if n_el > _INT64_MAX:
                raise InputError(f"tensor '{name}': shape {ne} has {n_el} elements, more than GGML's int64 can count")
            if (ne[0] if ne else 1) % blck:
                raise InputError(f"tensor '{name}': {T.type_name(t)} row length {ne[0] if ne else 1} is not a "
                                 f"multiple of its block size {blck}")
            n_bytes = n_el // blck * tsize
            off = int(offset_tensor[0])
            if off % align:
                raise InputError(f"tensor '{name}': data offset {off} is not a multiple of the alignment {align}")
            start = start_offs + off
            if start + n_bytes > size:
                raise InputError(f"tensor '{name}' needs bytes {start}..{start + n_bytes} but the file has only "
                                 f"{size} bytes (truncated, or its offsets lie)")
            if off != expected:
                raise InputError(f"tensor '{name}': data offset {off}, but GGML expects {expected} (each tensor's "
                                 f"data follows the one before it, padded to the alignment {align})")
            expected = off + -(-n_bytes // align) * align
            tensors.append(ReaderTensor(name=name, tensor_type=t, shape=dims, n_elements=n_el, n_bytes=n_bytes,
                                        data_offset=start, data=self._view(t, ne, start, n_el, n_bytes), field=field))
        self.tensors = tensors

    def _view(self, t: T.GGMLType, ne: list[int], start: int, n_el: int, n_bytes: int) -> np.ndarray:
        """The tensor's data as gguf-py maps it: its numpy dtype, or bytes (..., row bytes)."""
        shape = tuple(reversed(ne))
        dtype = T.NP_DTYPES.get(t)
        if dtype is not None:
            return self.data[start:start + n_bytes].view(dtype).reshape(shape)
        if shape:
            shape = shape[:-1] + (shape[-1] // T.block_size(t) * T.type_size(t),)
        return self.data[start:start + n_bytes].reshape(shape)


class GGUFFile:
    """A GGUF model opened lazily: header and infos parsed, tensor data memory-mapped, nothing read.

    The first shard of a split model (gguf-split: `split.count` > 1) opens every shard beside it,
    as llama.cpp's loader does: `tensors` are all of them (each with the `path` holding its data),
    metadata is the first shard's. A later shard alone, a missing one or a mismatched set is an
    InputError."""

    def __init__(self, path: str | os.PathLike, *, _shard_of: str | None = None):
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
        if version and not version & 0xFFFF:
            raise InputError(f"{self.path}: big-endian GGUF files are not supported")
        if version not in (2, 3):
            raise InputError(f"{self.path}: GGUF version {version} is not supported (versions 2 and 3 are)")
        try:
            self.reader = _CheckedReader(self.path)
        except InputError as e:
            raise InputError(f"{self.path}: {e}") from None
        except Exception as e:  # a defect no check above names: still one clean error
            raise InputError(f"{self.path}: truncated or corrupt GGUF header or metadata "
                             f"({type(e).__name__}: {e})") from None
        self.shards: list[GGUFFile] = [self]
        if _shard_of is None:
            self._open_shards()

    @property
    def version(self) -> int:
        return int(self.reader.fields["GGUF.version"].parts[-1][0])

    @property
    def alignment(self) -> int:
        return int(self.reader.alignment)

    @property
    def data_offset(self) -> int:
        return int(self.reader.data_offset)

    @property
    def paths(self) -> list[str]:
        """Every file of the model: this one, then the other shards of a split model."""
        return [s.path for s in self.shards]

    @cached_property
    def own_tensors(self) -> dict[str, TensorInfo]:
        """The tensors whose data is in this file (all of them unless the model is split)."""
        return {t.name: TensorInfo(t.name, t.tensor_type, tuple(int(d) for d in t.shape), int(t.data_offset),
                                   int(t.n_bytes), self.path)
                for t in self.reader.tensors}

    @cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        if len(self.shards) == 1:
            return self.own_tensors
        return {n: i for s in self.shards for n, i in s.own_tensors.items()}

    def keys(self) -> list[str]:
        return [k for k in self.reader.fields if k not in _HEADER_FIELDS]

    def value_type(self, key: str) -> str:
        """The GGUF value type, e.g. 'UINT32', 'STRING' or 'ARRAY[FLOAT32]'."""
        types = self.reader.fields[key].types
        name = types[0].name
        return f"ARRAY[{types[1].name if len(types) > 1 else '?'}]" if types[0] == GGUFValueType.ARRAY else name

    def array_len(self, key: str) -> int | None:
        f = self.reader.fields[key]
        return len(f.data) if f.types and f.types[0] == GGUFValueType.ARRAY else None

    def metadata(self, key: str, default=KeyError):
        """A metadata value as Python (int, float, bool, str or list); KeyError if absent. A string
        that is not UTF-8 comes escaped (format.decode_text)."""
        f = self.reader.fields.get(key)
        if f is None or key in _HEADER_FIELDS:
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
        return {t.name: t for s in self.shards for t in s.reader.tensors}

    def storage(self, name: str | None = None) -> FileStorage:
        """The file holding tensor `name`'s data (this file if no name is given)."""
        return FileStorage(self.tensors[name].path if name is not None else self.path)

    # ------------------------------------------------------------------------------ split models
    def _split_int(self, key: str, default=None) -> int | None:
        """An integer split key of this file, or `default` if absent."""
        if key not in self.reader.fields:
            return default
        v = self.metadata(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InputError(f"{self.path}: {key} is {v!r}, not a count")
        return v

    def _open_shards(self) -> None:
        """The other shards of a split model, checked as llama.cpp's loader checks them."""
        count = self._split_int(SPLIT_COUNT, 0)
        if count <= 1:
            return
        no = self._split_int(SPLIT_NO)
        if no != 0:
            first = shard_prefix(self.path, no, count) if no is not None else None
            where = f"shard {no + 1} of {count}" if no is not None else f"a shard (no {SPLIT_NO}) of {count}"
            hint = f"; open its first shard, {shard_path(first, 0, count)}" if first is not None else \
                "; open its first shard"
            raise InputError(f"{self.path}: {where} of a split model{hint}")
        prefix = shard_prefix(self.path, 0, count)
        if prefix is None:
            raise InputError(f"{self.path}: the first of {count} shards of a split model, but its name does not "
                             f"end in -00001-of-{count:05d}.gguf, so the others cannot be found")
        owner = dict.fromkeys(self.own_tensors, self.path)
        for k in range(1, count):
            p = shard_path(prefix, k, count)
            if not os.path.exists(p):
                raise InputError(f"{self.path}: shard {k + 1} of {count} of this split model, {p}, is missing")
            s = GGUFFile(p, _shard_of=self.path)
            got = (s._split_int(SPLIT_NO, -1), s._split_int(SPLIT_COUNT, -1))
            if got != (k, count):
                raise InputError(f"{p}: its {SPLIT_NO} and {SPLIT_COUNT} ({got[0]}, {got[1]}) do not make it "
                                 f"shard {k + 1} of {count} (expected {k}, {count})")
            for n in s.own_tensors:
                if n in owner:
                    raise InputError(f"tensor '{n}' is in two shards of a split model: {owner[n]} and {p}")
                owner[n] = p
            self.shards.append(s)
        total = self._split_int(SPLIT_TENSORS)
        if total != len(owner):
            raise InputError(f"{self.path}: {SPLIT_TENSORS} is {total}, but the {count} shards hold "
                             f"{len(owner)} tensors")


def _stamp(paths: list[str]) -> tuple:
    return tuple((st.st_mtime_ns, st.st_size) for st in map(os.stat, paths))


_OPEN: dict[str, tuple[tuple, GGUFFile]] = {}  # path -> (every file's (mtime, size), model): the newest only


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open (or reuse, while none of its files has changed) a GGUF model."""
    p = os.path.abspath(os.fspath(path))
    try:
        os.stat(p)
    except OSError as e:
        raise InputError(f"{os.fspath(path)}: {e.strerror}") from None
    cached = _OPEN.get(p)
    if cached is not None:
        try:
            if _stamp(cached[1].paths) == cached[0]:
                return cached[1]
        except OSError:
            pass
    f = GGUFFile(path)
    _OPEN[p] = (_stamp(f.paths), f)  # a rewritten file replaces its old reader (and lets its map go)
    return f
