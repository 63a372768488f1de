"""Editing a GGUF file's metadata into a new file, as gguf-py's gguf_new_metadata.py does.

Every key/value not edited is copied verbatim (its raw bytes, in its place); a key set keeps its
place, a new one is appended, a deleted one dropped. Tensor infos and data are copied byte for byte
(data with copy_file_range), laid out as GGML lays them out: each tensor padded to the alignment, so
with the alignment unchanged every offset is the input's. Changing `general.alignment` (or deleting
it: the default 32) lays the same bytes out again for the new alignment.

What would make a file llama.cpp cannot load, or one that lies, is refused with a
`MetadataEditError` naming the key and the reason: `general.alignment` other than a UINT32 power of
two (up to what ggtool writes), `general.architecture` deleted or made other than a string, the
split keys (a split model is refused whole: its metadata lives in its first shard but the shards
belong together), gguf-py's header names (`GGUF.version`, ...), an array set to a scalar.

`plan_edit` decides (nothing written); `write_edited` streams the result into an open file. The
caller makes that file atomic (the command line goes through tensor_io.atomic_path).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from gguf import GGUFValueType

from .. import types as T
from ..errors import GGToolError
from . import write as W
from .format import DEFAULT_ALIGNMENT, SPLIT_KEYS, check_write_alignment, short
from .reader import _HEADER_FIELDS, GGUFFile, TensorInfo

ALIGNMENT_KEY = "general.alignment"
ARCHITECTURE_KEY = "general.architecture"

# type names a value may be given as: llama-quantize's kv-override names (int, float, bool, str),
# GGUF's own (as inspect shows them, any case) and their short forms
INT_TYPES = {W.UINT8: (0, 2**8 - 1), W.INT8: (-2**7, 2**7 - 1), W.UINT16: (0, 2**16 - 1),
             W.INT16: (-2**15, 2**15 - 1), W.UINT32: (0, 2**32 - 1), W.INT32: (-2**31, 2**31 - 1),
             W.UINT64: (0, 2**64 - 1), W.INT64: (-2**63, 2**63 - 1)}
FLOAT_TYPES = (W.FLOAT32, W.FLOAT64)
TYPE_NAMES = {"int": "int", "float": "float", "bool": W.BOOL, "str": W.STRING, "string": W.STRING,
              "u8": W.UINT8, "i8": W.INT8, "u16": W.UINT16, "i16": W.INT16, "u32": W.UINT32, "i32": W.INT32,
              "u64": W.UINT64, "i64": W.INT64, "f32": W.FLOAT32, "f64": W.FLOAT64,
              **{GGUFValueType(t).name.lower(): t for t in (*INT_TYPES, *FLOAT_TYPES)}}


FLT_MAX = 3.4028234663852886e38     # the largest FLOAT32


def type_name(vtype: int) -> str:
    return GGUFValueType(vtype).name


class MetadataEditError(GGToolError):
    """An edit that cannot be made: `key`, and `reason`, one of `missing` (deleted but absent),
    `twice` (edited twice), `protected` (the edit would corrupt the file or make it lie), `array`
    (an array cannot be set to a scalar), `type` (an unknown type name), `value` (a value that does
    not parse as, or fit, its type)."""

    def __init__(self, key: str, reason: str, message: str):
        self.key, self.reason = key, reason
        self.kind = "metadata-" + reason
        super().__init__(message)


@dataclass(frozen=True)
class SetValue:
    """Set `key` to `text` parsed as `type` (a TYPE_NAMES key); type None: as the key's own type
    (a new key: a string)."""

    key: str
    text: str
    type: str | None = None


@dataclass
class EditPlan:
    """What the new file holds: metadata as raw key/value bytes in order, the tensors (infos as
    read, data offsets relative to the data section) and the alignment."""

    source: GGUFFile
    kv: list[tuple[str, bytes]]
    alignment: int
    tensors: list[tuple[TensorInfo, int]] = field(default_factory=list)   # (info as read, new data offset)
    changed: list[str] = field(default_factory=list)     # keys set that were there
    added: list[str] = field(default_factory=list)       # keys set that were not
    deleted: list[str] = field(default_factory=list)
    values: dict[str, tuple[int, object]] = field(default_factory=dict)   # key set -> (GGUF type, value)

    def header(self) -> bytes:
        return W.header_bytes((raw for _, raw in self.kv),
                              [(t.name, t.ne, t.type, off) for t, off in self.tensors], self.alignment)

    def file_bytes(self) -> int:
        if not self.tensors:
            return len(self.header())
        t, off = self.tensors[-1]
        return len(self.header()) + T.pad(off + t.n_bytes, self.alignment)


def parse_value(key: str, vtype: int, text: str):
    """`text` as a value of GGUF type vtype (MetadataEditError `value` if it is not one)."""
    what = f"metadata '{short(key)}' is {type_name(vtype)}"
    if vtype == W.STRING:
        return text
    if vtype == W.BOOL:
        low = text.strip().lower()
        if low not in ("true", "false"):
            raise MetadataEditError(key, "value", f"{what}: {text!r} is not true or false")
        return low == "true"
    if vtype in INT_TYPES:
        try:
            v = int(text.strip())
        except ValueError:
            raise MetadataEditError(key, "value", f"{what}: {text!r} is not an integer") from None
        lo, hi = INT_TYPES[vtype]
        if not lo <= v <= hi:
            raise MetadataEditError(key, "value", f"{what}: {v} is out of its range {lo}..{hi}")
        return v
    try:
        v = float(text.strip())
    except ValueError:
        raise MetadataEditError(key, "value", f"{what}: {text!r} is not a number") from None
    if not math.isfinite(v) or (vtype == W.FLOAT32 and abs(v) > FLT_MAX):
        raise MetadataEditError(key, "value", f"{what}: {text!r} is not a finite {type_name(vtype)} number")
    return v


def _resolve_type(g: GGUFFile, s: SetValue, old: int | None) -> int:
    """The GGUF type to write s.key as: its own (or STRING for a new key; a new general.alignment:
    UINT32, the one type GGML reads it as) unless s.type says."""
    if s.type is None:
        if old is None:
            return W.UINT32 if s.key == ALIGNMENT_KEY else W.STRING
        return old
    t = TYPE_NAMES.get(s.type.strip().lower())
    if t is None:
        raise MetadataEditError(s.key, "type", f"metadata '{short(s.key)}': unknown value type {s.type!r} (int, "
                                "float, bool, str, or GGUF's own: u8 i8 u16 i16 u32 i32 u64 i64 f32 f64)")
    if t == "int":      # the key's integer type if it has one, else UINT32 as llama-quantize writes it
        return old if old in INT_TYPES else W.UINT32
    if t == "float":
        return old if old in FLOAT_TYPES else W.FLOAT32
    return t


def _check_protected(key: str, vtype: int | None, value=None) -> None:
    """Refuse what would corrupt the file or make it lie (vtype None: a deletion)."""
    if key in _HEADER_FIELDS:
        raise MetadataEditError(key, "protected", f"'{key}' is gguf-py's name for a header field, not a metadata key")
    if key in SPLIT_KEYS:
        raise MetadataEditError(key, "protected", f"'{key}' is a split model's key: it would make this file a "
                                "shard of a model that has no other shards")
    if key == ARCHITECTURE_KEY and vtype != W.STRING:
        what = "deleted" if vtype is None else f"a {type_name(vtype)}"
        raise MetadataEditError(key, "protected", f"'{key}' cannot be {what}: llama.cpp needs it, a string, "
                                "to load the model")
    if key == ALIGNMENT_KEY and vtype is not None:
        if vtype != W.UINT32:
            raise MetadataEditError(key, "protected", f"'{key}' must be a UINT32 (GGML refuses any other type), "
                                    f"not a {type_name(vtype)}")
        try:
            check_write_alignment(value, key)
        except GGToolError as e:
            raise MetadataEditError(key, "protected", str(e)) from None


def plan_edit(g: GGUFFile, sets: Sequence[SetValue] = (), deletes: Sequence[str] = ()) -> EditPlan:
    """The new file's metadata and layout for `g` with `sets` applied and `deletes` removed
    (MetadataEditError for an edit that cannot be made; nothing is written)."""
    if len(g.shards) > 1:
        raise MetadataEditError(SPLIT_KEYS[1], "protected",
                                f"{g.path}: the first of {len(g.shards)} shards of a split model; metadata is "
                                "edited in a single file (merge the shards with gguf-split first)")
    seen: set[str] = set()
    for key in [s.key for s in sets] + list(deletes):
        if not key:
            raise MetadataEditError(key, "value", "a metadata key cannot be empty")
        if key in seen:
            raise MetadataEditError(key, "twice", f"metadata '{short(key)}' is edited twice")
        seen.add(key)
    fields = g.reader.fields
    own = {k: fields[k].types for k in g.keys()}
    new: dict[str, bytes] = {}
    values: dict[str, tuple[int, object]] = {}
    for s in sets:
        types = own.get(s.key)
        if types and types[0] == GGUFValueType.ARRAY:
            raise MetadataEditError(s.key, "array", f"metadata '{short(s.key)}' is an array ({g.value_type(s.key)}); "
                                    "only a scalar value can be set (delete the key to remove it)")
        vtype = _resolve_type(g, s, int(types[0]) if types else None)
        value = parse_value(s.key, vtype, s.text)
        _check_protected(s.key, vtype, value)
        new[s.key] = W.kv_scalar(s.key, vtype, value)
        values[s.key] = (vtype, value)
    for key in deletes:
        if key not in own:
            raise MetadataEditError(key, "missing", f"metadata '{short(key)}' is not in {g.path}, so it cannot be deleted")
        _check_protected(key, None)
    raw = g.reader.data
    kv = [(k, new.pop(k) if k in new else bytes(raw[s:e])) for k, (s, e) in g.reader.kv_spans.items()
          if k not in deletes]
    added = list(new)
    kv += list(new.items())
    plan = EditPlan(g, kv, _alignment(kv, g), changed=[s.key for s in sets if s.key in own], added=added,
                    deleted=list(deletes), values=values)
    off = 0
    for t in g.own_tensors.values():
        plan.tensors.append((t, off))
        off = T.pad(off + t.n_bytes, plan.alignment)
    return plan


def _alignment(kv: list[tuple[str, bytes]], g: GGUFFile) -> int:
    """The alignment the new file declares: a UINT32 (checked on read, or on set), else GGUF's default.
    One kept from the input must be one ggtool writes (quantize refuses the same)."""
    for k, raw in kv:
        if k == ALIGNMENT_KEY:
            a = struct.unpack("<I", raw[-4:])[0]
            check_write_alignment(a, g.path)
            return a
    return DEFAULT_ALIGNMENT


def write_edited(plan: EditPlan, f: BinaryIO, on_bytes: Callable[[int], None] | None = None) -> int:
    """Write the planned file to `f` (an unbuffered binary file): the header, then each tensor's
    bytes copied and padded. Returns the bytes written."""
    def write(buf) -> None:
        mv = memoryview(buf).cast("B")
        while len(mv):
            mv = mv[f.write(mv):]

    head = plan.header()
    write(head)
    pos = 0
    for t, off in plan.tensors:
        W.copy_file_bytes(t.path, t.offset, t.n_bytes, f.fileno(), write, on_bytes)
        end = T.pad(off + t.n_bytes, plan.alignment)
        write(b"\0" * (end - off - t.n_bytes))
        pos = end
    return len(head) + pos

