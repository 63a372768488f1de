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
belong together), gguf-py's header names (`GGUF.version`, ...), an array set to a scalar, an empty
key, a key or string that is not UTF-8 (gguf-py cannot open a file with such a key), and a value its
type cannot hold (out of range; a float that overflows, underflows to 0 or, below the normal
range, loses digits; NaN and infinities). `check_metadata` is that one check: quantize's
quantize's metadata overrides go through it too (`quantize_model.KVOverride`), so both refuse the same in the
same words.

`plan_edit` decides (nothing written); `write_edited` streams the result into an open file;
`check_written` reads it back before it is moved into place. The caller makes that file atomic (the
command line goes through tensor_io.atomic_path, with replace=False unless asked to replace, so that of
writers racing for a new name one wins). `read_value_file` reads a value from a regular file of at
most MAX_VALUE_FILE_BYTES.
"""

from __future__ import annotations

import decimal
import math
import os
import stat
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np
from gguf import GGUFValueType

from .. import types as T
from ..errors import GGToolError
from . import write as W
from .format import DEFAULT_ALIGNMENT, SPLIT_KEYS, check_write_alignment, decode_text, encode_text, quote_text, short
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
MAX_VALUE_FILE_BYTES = 64 << 20     # the largest file read as a value (a chat template, a tokenizer's JSON)
_TINIEST = {W.FLOAT32: 2.0 ** -149, W.FLOAT64: 5e-324}                 # the smallest positive subnormal
_NORMAL = {W.FLOAT32: 2.0 ** -126, W.FLOAT64: sys.float_info.min}      # the smallest positive normal
# half an ulp, relative: what rounding to the type costs a value in its normal range (FLOAT32's with
# room for the double rounding decimal -> float64 -> float32)
_PRECISION = {W.FLOAT32: decimal.Decimal(2) ** -24 * (1 + decimal.Decimal(2) ** -28), W.FLOAT64: decimal.Decimal(2) ** -53}


def type_name(vtype: int) -> str:
    return GGUFValueType(vtype).name


class MetadataEditError(GGToolError):
    """An edit that cannot be made: `key`, and `reason`, one of `missing` (deleted but absent),
    `twice` (edited twice), `protected` (the edit would corrupt the file or make it lie), `array`
    (an array cannot be set to a scalar), `type` (an unknown type name), `value` (a value that does
    not parse as, or survive, its type; a string that is not UTF-8), `key` (empty, or not UTF-8),
    `file` (a value's file that cannot be read as one)."""

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
    """`text` as a value of GGUF type vtype (MetadataEditError `value` if it is not one, or would
    not survive being stored as one: out of range, overflow to inf, underflow to 0, a subnormal
    that loses digits, text that is not UTF-8)."""
    what = f"metadata '{short(key)}' is {type_name(vtype)}"
    if vtype == W.STRING:
        check_text(key, text)
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
        check_value(key, vtype, v)
        return v
    try:
        v = float(text.strip())
        decimal.Decimal(text.strip())
    except (ValueError, decimal.InvalidOperation):
        raise MetadataEditError(key, "value", f"{what}: {text!r} is not a number") from None
    check_value(key, vtype, v, text.strip())
    return v


def check_value(key: str, vtype: int, value, text: str | None = None) -> None:
    """MetadataEditError `value` unless `value` survives being stored as GGUF type vtype: an integer
    in its range; a float that stays finite, is not flushed to 0 and (a subnormal) keeps the type's
    precision (2^-24 relative for FLOAT32, 2^-53 for FLOAT64), judged against `text` (the number
    as the user wrote it) where given; text that is UTF-8. NaN and inf are refused: llama.cpp's readers
    take them, but no metadata key means them, and JSON (inspect's) has no such numbers."""
    what = f"metadata '{short(key)}' is {type_name(vtype)}"
    if vtype in INT_TYPES:
        lo, hi = INT_TYPES[vtype]
        if not lo <= value <= hi:
            raise MetadataEditError(key, "value", f"{what}: {value} is out of its range {lo}..{hi}")
        return
    if vtype == W.STRING:
        check_text(key, value)
        return
    if vtype not in FLOAT_TYPES:
        return
    shown_value = text if text is not None else f"{value!r}"
    want = decimal.Decimal(text) if text is not None else decimal.Decimal(value)
    with np.errstate(over="ignore"):
        stored = float(np.float32(value)) if vtype == W.FLOAT32 else float(value)
    if not want.is_finite():
        raise MetadataEditError(key, "value", f"{what}: {shown_value} is not a finite number (NaN and infinities "
                                "are refused)")
    if not math.isfinite(stored):
        raise MetadataEditError(key, "value", f"{what}: {shown_value} is too large for it (it would be inf; the "
                                f"largest {type_name(vtype)} is {FLT_MAX if vtype == W.FLOAT32 else sys.float_info.max:.9g})")
    if want == 0:
        return
    got = decimal.Decimal(stored)
    if got == 0:
        raise MetadataEditError(key, "value", f"{what}: {shown_value} underflows it (it would be stored as 0; "
                                f"the smallest positive {type_name(vtype)} is {_TINIEST[vtype]:.9g})")
    if abs(got - want) > abs(want) * _PRECISION[vtype]:
        raise MetadataEditError(key, "value", f"{what}: {shown_value} is below its normal range and would be stored "
                                f"as {stored:.9g}, losing digits (the smallest normal {type_name(vtype)} is "
                                f"{_NORMAL[vtype]:.9g})")


def check_key(key: str) -> None:
    """MetadataEditError `key` for a key that cannot be written: empty, or not UTF-8 (gguf-py and
    llama.cpp read keys as UTF-8: gguf-py cannot open a file with such a key)."""
    if not key:
        raise MetadataEditError(key, "key", "a metadata key cannot be empty")
    if _not_utf8(key):
        raise MetadataEditError(key, "key", f"metadata key {quote_text(_escaped(key))} is not UTF-8 text: gguf-py "
                                "and llama.cpp read keys as UTF-8 (gguf-py could not open the file)")


def check_text(key: str, text: str) -> None:
    """MetadataEditError `value` for a string value that is not UTF-8 (GGUF strings are UTF-8)."""
    if _not_utf8(text):
        raise MetadataEditError(key, "value", f"metadata '{short(key)}': the string {quote_text(_escaped(text[:48]))} is "
                                "not UTF-8 text (GGUF strings are UTF-8)")


def _not_utf8(s: str) -> bool:
    """A str from the command line with bytes that are not UTF-8 (surrogate escapes) or lone surrogates."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _escaped(s: str) -> str:
    """s with its undecodable bytes (surrogate escapes) as \\xNN, as format.EscapedText shows
    them; other lone surrogates as the bytes they would be."""
    try:
        return decode_text(s.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:              # a lone surrogate: the bytes it would be
        return decode_text(s.encode("utf-8", "surrogatepass"))


def check_metadata(key: str, vtype: int | None, value=None) -> None:
    """The one check of a key/value to be written into a GGUF file, by set-metadata (every value set,
    every deletion: vtype None) and quantize's metadata overrides alike: the key (check_key), the value
    (check_value) and what would corrupt the file or make it lie (check_protected)."""
    check_key(key)
    if vtype is not None:
        check_value(key, vtype, value)
    check_protected(key, vtype, value)


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


def check_protected(key: str, vtype: int | None, value=None) -> None:
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
        check_key(key)
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
        check_metadata(s.key, vtype, value)
        new[s.key] = W.kv_scalar(s.key, vtype, value)
        values[s.key] = (vtype, value)
    for key in deletes:
        if key not in own:
            raise MetadataEditError(key, "missing", f"metadata '{short(key)}' is not in {g.path}, so it cannot be deleted")
        check_metadata(key, None)
    raw = g.reader.data
    kv = [(k, new.pop(k) if k in new else bytes(raw[s:e])) for k, (s, e) in g.reader.kv_spans.items()
          if k not in deletes]
    for k, _ in kv:
        if not _utf8(encode_text(k)):
            raise MetadataEditError(k, "key", f"{g.path}: metadata key {quote_text(k)} is not UTF-8 text: gguf-py and "
                                    f"llama.cpp could not open the file written; delete the key (named as shown here)")
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


def read_value_file(key: str, path: str) -> str:
    """The text of `path`, as a string value for `key`: a regular file (not a FIFO, a device such as
    /dev/zero, a directory) of at most MAX_VALUE_FILE_BYTES, UTF-8. MetadataEditError `file`
    otherwise, before more than that is read (a FIFO is never waited on)."""
    def refuse(what: str) -> MetadataEditError:
        return MetadataEditError(key, "file", f"{path}: {what}; a value is read from a regular UTF-8 file of at most "
                                 f"{MAX_VALUE_FILE_BYTES:,} bytes ({MAX_VALUE_FILE_BYTES >> 20} MiB)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise MetadataEditError(key, "file", f"{path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refuse("not a regular file (" + _file_kind(st.st_mode) + ")")
        if st.st_size > MAX_VALUE_FILE_BYTES:
            raise refuse(f"{st.st_size:,} bytes, too large")
        chunks, n = [], 0
        while True:                       # to its end, but never past the limit (a file still growing)
            b = os.read(fd, min(1 << 20, MAX_VALUE_FILE_BYTES + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
            if n > MAX_VALUE_FILE_BYTES:
                raise refuse("more than the limit (it grew while read)")
    except OSError as e:
        raise MetadataEditError(key, "file", f"{path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    del chunks
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MetadataEditError(key, "file", f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def check_written(plan: EditPlan, path: str) -> None:
    """The file written for `plan`, checked before it is moved into place: it opens (every count,
    offset and size checked by the reader), every key is UTF-8 (gguf-py opens it), and its keys,
    alignment and tensors are the plan's. GGToolError naming what differs (a bug, or a disk that
    lies)."""
    try:
        g = GGUFFile(path)
    except GGToolError as e:
        raise GGToolError(f"the file written does not read back: {e}") from None
    keys = [k for k, _ in plan.kv]
    bad = next((k for k in g.keys() if not _utf8(encode_text(k))), None)
    if bad is not None:
        raise GGToolError(f"the file written has a metadata key that is not UTF-8: {quote_text(bad)}")
    if [encode_text(k) for k in g.keys()] != [encode_text(k) for k in keys] or g.alignment != plan.alignment:
        raise GGToolError("the file written does not hold the planned metadata")
    want = [(t.name, t.type, t.ne, off) for t, off in plan.tensors]
    got = [(t.name, t.type, t.ne, t.offset - g.data_offset) for t in g.own_tensors.values()]
    if got != want:
        raise GGToolError("the file written does not hold the planned tensors")


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

