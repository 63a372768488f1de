"""Writing GGUF files: the header bytes and the output-path rules both writers share.

`quantize` (ggtool.quantize_model) and `set-metadata` (`.edit`) write a GGUF v3 file as llama.cpp's
gguf.cpp lays it out: header, metadata (raw key/value bytes), tensor infos, padding to the
alignment, then each tensor's data padded to it. Kept here, without gguf-py, so that both build
the same bytes and refuse the same outputs (`check_output_paths`) with the same structured error.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Sequence

from ..errors import GGToolError
from ..types import GGMLType, pad
from .format import encode_text

# gguf.cpp's enum gguf_type (gguf-py's GGUFValueType)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR_FORMATS = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
                   FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}


def gguf_string(s: str | bytes) -> bytes:
    """A GGUF string: uint64 length, then the bytes (a name read escaped is written as its own bytes)."""
    b = s if isinstance(s, bytes) else encode_text(s)
    return struct.pack("<Q", len(b)) + b


def kv_scalar(key: str, vtype: int, value) -> bytes:
    """The raw bytes of one metadata key/value of a scalar type (STRING included)."""
    if vtype == STRING:
        return gguf_string(key) + struct.pack("<I", STRING) + gguf_string(value)
    return gguf_string(key) + struct.pack("<I", vtype) + struct.pack(_SCALAR_FORMATS[vtype], value)


def kv_string_array(key: str, values) -> bytes:
    """The raw bytes of one metadata key whose value is an array of strings."""
    values = list(values)
    return (gguf_string(key) + struct.pack("<IIQ", ARRAY, STRING, len(values))
            + b"".join(gguf_string(v) for v in values))


def kv_u32(key: str, value: int) -> bytes:
    return kv_scalar(key, UINT32, value)


def header_bytes(kv: Iterable[bytes], tensors: Sequence[tuple[str, Sequence[int], GGMLType, int]],
                 alignment: int) -> bytes:
    """GGUF v3 header, metadata (raw key/value bytes, in order) and tensor infos (name, ne in ggml
    order, type, data offset relative to the data section), padded to `alignment`."""
    kv = list(kv)
    parts = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(kv)), *kv]
    for name, ne, ttype, offset in tensors:
        parts.append(gguf_string(name))
        parts.append(struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne))
        parts.append(struct.pack("<IQ", int(ttype), offset))
    head = b"".join(parts)
    return head + b"\0" * (pad(len(head), alignment) - len(head))


def copy_file_bytes(path: str, offset: int, n_bytes: int, out_fd: int, write: Callable[[object], None],
                    on_bytes: Callable[[int], None] | None = None) -> None:
    """Copy n_bytes of `path` from `offset` to the current position of out_fd: copy_file_range (no
    user-space copy), or where it is missing or refuses, `write` of the memory-mapped bytes."""
    step = 64 << 20
    with open(path, "rb") as src:
        done = 0
        while done < n_bytes:
            n = min(step, n_bytes - done)
            try:
                k = os.copy_file_range(src.fileno(), out_fd, n, offset + done)
            except (AttributeError, OSError):
                k = 0
            if k <= 0:   # no copy_file_range here (or it refused): through the memory map
                from .storage import FileStorage
                write(FileStorage(path).array[offset + done: offset + done + n])
                k = n
            done += k
            if on_bytes:
                on_bytes(k)


class OutputPathError(GGToolError):
    """An output path that must not be written: `path`, and `reason`, one of
    `exists` (a file is there and replacing it was not allowed), `same_as_input` (`input` names it,
    also through a link), `directory`, `no_directory` (its directory does not exist),
    `not_writable` (no file can be made in its directory), `stdout`."""

    MESSAGES = {"exists": "{path} exists",
                "same_as_input": "INPUT and OUTPUT are the same file ({path}); write to another path",
                "directory": "{path} is a directory",
                "no_directory": "{path}: directory {directory} does not exist",
                "not_writable": "{path}: directory {directory} is not writable",
                "stdout": "OUTPUT must be a file (a GGUF file cannot be streamed to stdout)"}

    def __init__(self, path: str, reason: str, *, input: str | None = None):
        self.path, self.reason, self.input = path, reason, input
        self.kind = "output-" + reason.replace("_", "-")
        directory = os.path.dirname(os.path.abspath(path)) or "."
        super().__init__(self.MESSAGES[reason].format(path=path, directory=directory))


def check_output_paths(inputs: str | Sequence[str], outputs: str | Sequence[str], replace: bool) -> None:
    """Every output file must be a new file, or one `replace` allows replacing, and none an input
    file (a split model's shards included): OutputPathError otherwise."""
    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    for output in [outputs] if isinstance(outputs, str) else outputs:
        if output == "-":
            raise OutputPathError(output, "stdout")
        op = os.path.abspath(output)
        for ip in inputs:
            ip_abs = os.path.abspath(ip)
            same = ip_abs == op
            if not same and os.path.exists(op):
                try:
                    same = os.path.samefile(ip_abs, op)
                except OSError:
                    same = False
            if same:
                raise OutputPathError(output, "same_as_input", input=ip)
        if os.path.isdir(op):
            raise OutputPathError(output, "directory")
        if os.path.exists(op) and not replace:
            raise OutputPathError(output, "exists")
        if not os.path.isdir(os.path.dirname(op) or "."):
            raise OutputPathError(output, "no_directory")
        in_place = os.path.exists(op) and not os.path.isfile(op)     # a FIFO, a device: written in place
        if not in_place and not os.access(os.path.dirname(os.path.realpath(op)) or ".", os.W_OK | os.X_OK):
            raise OutputPathError(output, "not_writable")   # the temporary file beside it could not be made
