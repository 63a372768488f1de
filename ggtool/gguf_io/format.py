"""GGUF's limits and conventions, without gguf-py: what the reader enforces on read and the
writers (`quantize`, `compute -o x.gguf`) on write, in one place.

* GGML's limits (ggml.h, gguf.cpp): at most 4 dimensions, tensor names shorter than 64 bytes, no
  name twice, strings of at most 1 GiB, arrays of at most 2^30 items, a power-of-two alignment.
  ggtool also refuses to *write* an alignment above 64 KiB: GGML allows any power of two, but every
  tensor is padded to it, so a file's 2^31 alignment would turn a quantized model into gigabytes
  of zeros.
* Text: GGUF strings are bytes; one that is not UTF-8 is shown with each invalid byte as `\\xNN`
  (an `EscapedText`, which remembers its bytes, so that a name is written back as it was read).
* Split models (llama.cpp's gguf-split): `PREFIX-00001-of-00003.gguf` ...; the first shard
  carries the metadata, every shard `split.no` (0-based), `split.count` and `split.tensors.count`.
"""

from __future__ import annotations

import os
import re

from ..errors import GGToolError

MAX_DIMS = 4                    # GGML_MAX_DIMS
MAX_NAME = 64                   # GGML_MAX_NAME: a name has at most MAX_NAME - 1 bytes
MAX_STRING = 1 << 30            # GGUF_MAX_STRING_LENGTH
MAX_ITEMS = 1 << 30             # GGUF_MAX_ARRAY_ELEMENTS
MAX_WRITE_ALIGNMENT = 1 << 16   # the largest alignment ggtool writes (see above)
DEFAULT_ALIGNMENT = 32          # GGUF_DEFAULT_ALIGNMENT

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
SPLIT_KEYS = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS)


# ------------------------------------------------------------------------------------------- text

class EscapedText(str):
    """A GGUF string that is not valid UTF-8: its text has each invalid byte as `\\xNN`; `raw`
    holds the bytes it was read from."""

    raw: bytes


def decode_text(raw: bytes) -> str:
    """A GGUF string's bytes as text: a plain str if UTF-8, else an EscapedText. Never raises."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        s = EscapedText(raw.decode("utf-8", "backslashreplace"))
        s.raw = bytes(raw)
        return s


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def decode_name(raw: bytes) -> str:
    """A key or tensor name: as decode_text, and control characters (a newline) as `\\xNN` too, so
    that a name always prints on one line (in a table, in an error message)."""
    s = decode_text(raw)
    if not _CONTROL.search(s):
        return s
    e = EscapedText(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", s))
    e.raw = bytes(raw)
    return e


def encode_text(s: str) -> bytes:
    """The bytes to write for a name read with decode_text (its own bytes if it was escaped)."""
    raw = getattr(s, "raw", None)
    return raw if raw is not None else s.encode("utf-8", "surrogateescape")


_INVALID = re.compile("[\udc80-\udcff]")


def quote_text(s: str) -> str:
    """`s` in double quotes with JSON's escapes; an EscapedText's invalid bytes as `\\xNN` (a real
    backslash is `\\\\`, so the two cannot be confused)."""
    import json

    raw = getattr(s, "raw", None)
    if raw is None:
        return json.dumps(s, ensure_ascii=False)
    quoted = json.dumps(raw.decode("utf-8", "surrogateescape"), ensure_ascii=False)
    return _INVALID.sub(lambda m: f"\\x{ord(m.group()) - 0xDC00:02x}", quoted)


def cut_text(s: str, n: int) -> tuple[str, int]:
    """(the first n characters of s, its length), an invalid byte of an EscapedText counting as one
    character (never cut inside its escape)."""
    raw = getattr(s, "raw", None)
    if raw is None:
        return s[:n], len(s)
    chars = raw.decode("utf-8", "surrogateescape")
    return decode_text(chars[:n].encode("utf-8", "surrogateescape")), len(chars)


# --------------------------------------------------------------------------------- write-side checks

def check_tensor_name(name: str, what: str = "tensor name") -> None:
    """GGToolError unless `name` fits GGML's tensor name (at most MAX_NAME - 1 bytes)."""
    n = len(encode_text(name))
    if n >= MAX_NAME:
        raise GGToolError(f"{what} '{short(name)}' is {n} bytes long; GGML's tensor names have at most "
                          f"{MAX_NAME - 1}")


def check_write_alignment(alignment: int, where: str) -> None:
    if alignment <= 0 or alignment & (alignment - 1) or alignment > MAX_WRITE_ALIGNMENT:
        raise GGToolError(f"{where}: alignment {alignment} cannot be written (a power of two up to "
                          f"{MAX_WRITE_ALIGNMENT} is)")


def short(s: str, n: int = 48) -> str:
    return s if len(s) <= n else s[:n] + "..."


# ------------------------------------------------------------------------------------- split models

def shard_path(prefix: str, no: int, count: int) -> str:
    """llama_split_path: PREFIX-%05d-of-%05d.gguf, `no` 0-based."""
    return f"{prefix}-{no + 1:05d}-of-{count:05d}.gguf"


def shard_prefix(path: str, no: int, count: int) -> str | None:
    """llama_split_prefix: PATH without its `-0000k-of-0000n.gguf` ending, or None if PATH does not
    end so (for this `no`, 0-based, and `count`)."""
    end = f"-{no + 1:05d}-of-{count:05d}.gguf"
    p = os.fspath(path)
    return p[:-len(end)] if p.endswith(end) and len(p) > len(end) else None


def output_prefix(path: str, count: int) -> str:
    """The prefix of the shards written for OUTPUT `path`: llama-quantize drops `.gguf`; a first
    shard's own name (`out-00001-of-00003.gguf`) gives its prefix too."""
    p = os.fspath(path)
    first = shard_prefix(p, 0, count)
    if first is not None:
        return first
    return p[:-5] if p.endswith(".gguf") else p
