"""Writing results: compact JSON in numpy order, .npy, and .gguf; files are replaced atomically.

JSON numbers are the shortest text that reads back to the same float32 (or float16) value, with
integral values written as integers (`60`, not `60.0`), so the seed example prints
`[[60,55,50,110],...]`. JSON has no NaN or infinities; like Python's json module, ggtool writes
`NaN`, `Infinity` and `-Infinity` (json.loads, numpy and ggtool itself read them back).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator

import numpy as np

from .. import types as T
from ..errors import GGToolError
from ..tensor import Tensor

FORMATS = ("json", "npy", "gguf")
GGUF_ARCH = "ggtool"

_SPECIAL = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
# Below these magnitudes every integer is exact, so an integral value prints as a plain integer.
_EXACT_INT = {np.dtype(np.float32): 2**24, np.dtype(np.float16): 2**11}


def format_for_path(path: str) -> str | None:
    """The output format a file name asks for (.json, .npy, .gguf), or None."""
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    return ext if ext in FORMATS else None


def tensor_array(t: Tensor) -> np.ndarray:
    """A tensor's values in numpy order, packed, with ggml_n_dims dimensions (trailing ne of 1 dropped:
    ne [4, 3, 1, 1] is numpy shape (3, 4); an empty dimension is kept); quantized tensors are
    dequantized to f32. A packed tensor comes as a view of its memory, not a copy: a large output
    would otherwise cost a second buffer (and its first touch) just to be written out."""
    n = max((i + 1 for i, d in enumerate(t.ne) if d != 1), default=1)
    if T.is_quantized(t.type) or t.type == T.BF16:
        arr = t.numpy()
    else:
        arr = np.ascontiguousarray(t.data)   # copies only a view that is not packed
    return arr.reshape(t.ne[:n][::-1])


# -- JSON -----------------------------------------------------------------------------------------
def format_numbers(flat: np.ndarray) -> list[str]:
    """Each element as the shortest JSON text that reads back to the same value of its dtype."""
    flat = np.asarray(flat).ravel()
    if flat.dtype.kind in "iub":
        return [str(v) for v in flat.tolist()]
    if flat.dtype not in _EXACT_INT:
        flat = flat.astype(np.float32)
    with np.errstate(invalid="ignore"):
        integral = np.isfinite(flat) & (np.abs(flat) < _EXACT_INT[flat.dtype]) & (flat == np.round(flat))
    if integral.all() and not (np.signbit(flat) & (flat == 0)).any():
        return [str(v) for v in flat.astype(np.int64).tolist()]
    out = []
    for v in flat:  # numpy scalars: str() is the shortest round-trip repr of the dtype
        s = str(v)
        s = _SPECIAL.get(s, s)
        out.append(s[:-2] if s.endswith(".0") else s)
    return out


def json_chunks(arr: np.ndarray) -> Iterator[str]:
    """One array as compact nested JSON lists in numpy order, a row at a time (so `| head` stops early)."""
    arr = np.asarray(arr)
    if arr.ndim == 0:
        yield format_numbers(arr.reshape(1))[0]
        return
    outer = arr.shape[:-1]
    if not outer:
        yield "[" + ",".join(format_numbers(arr)) + "]"
        return
    n_rows = int(np.prod(outer))
    if n_rows == 0:
        yield _empty_nested(outer)
        return
    rows = arr.reshape(n_rows, arr.shape[-1])
    for r in range(n_rows):
        idx = np.unravel_index(r, outer)
        opening = 0  # how many enclosing lists open at this row (trailing zero indices)
        for i in reversed(idx):
            if i:
                break
            opening += 1
        closing = 0
        for i, n in zip(reversed(idx), reversed(outer)):
            if i != n - 1:
                break
            closing += 1
        sep = "" if r == 0 else ","
        yield sep + "[" * opening + "[" + ",".join(format_numbers(rows[r])) + "]" + "]" * closing


def _empty_nested(shape: tuple[int, ...]) -> str:
    if not shape or shape[0] == 0:
        return "[]"
    inner = _empty_nested(shape[1:]) if len(shape) > 1 else "[]"
    return "[" + ",".join([inner] * shape[0]) + "]"


def json_document(named: list[tuple[str, np.ndarray]]) -> Iterator[str]:
    """One output: the bare array. Several: {"name": array, ...}. Ends with a newline."""
    if len(named) == 1:
        yield from json_chunks(named[0][1])
    else:
        for i, (name, arr) in enumerate(named):
            yield ("{" if i == 0 else ",") + json.dumps(name) + ":"
            yield from json_chunks(arr)
        yield "}"
    yield "\n"


# -- binary formats ---------------------------------------------------------------------------------
def write_npy(f, arr: np.ndarray) -> None:
    np.save(f, np.ascontiguousarray(arr), allow_pickle=False)


def write_gguf(path: str, tensors: list[tuple[str, Tensor]], metadata: dict[str, str] | None = None) -> None:
    """All `tensors` under their names, in their own types (quantized ones as raw blocks, bf16 as
    its bits). GGML's limits hold for what is written as for what is read: names of at most 63
    bytes, each once (a tensor has at most 4 dimensions by construction)."""
    from gguf import GGUFWriter

    from ..gguf_io.format import check_tensor_name

    names = [n for n, _ in tensors]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise GGToolError(f"cannot write GGUF: output name {dup[0]!r} is used twice")
    for n in names:
        check_tensor_name(n, "cannot write GGUF: output name")
    w = GGUFWriter(path, GGUF_ARCH)
    try:
        for key, value in (metadata or {}).items():
            w.add_string(key, value)
        for name, t in tensors:
            if T.is_quantized(t.type) and t.is_contiguous():
                raw = np.ascontiguousarray(t.data).reshape(*t.ne[1: t.n_dims][::-1], -1)
                w.add_tensor(name, raw, raw_dtype=t.type)
            elif t.type == T.BF16:    # no numpy dtype: its bits as row bytes, in logical order
                raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(*t.ne[1: t.n_dims][::-1], -1)
                w.add_tensor(name, raw, raw_dtype=t.type)
            else:
                w.add_tensor(name, np.ascontiguousarray(tensor_array(t)))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()


# -- atomic files ----------------------------------------------------------------------------------
@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary file beside `path`, moved over it only if the block succeeds (else removed).

    So a failed or interrupted write never leaves a half-written file, and never clobbers the old one.
    Making the temporary file and knowing its name hold SIGINT, SIGTERM and SIGHUP until both are
    done, so that a signal cannot leave a temporary file nobody will remove.
    """
    from ..pool.launch import signals_held

    target = os.path.abspath(path)
    directory = os.path.dirname(target)
    tmp = None
    try:
        with signals_held():
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=directory)
            except OSError as e:
                raise GGToolError(f"cannot write {path}: {e.strerror or e}") from None
            os.close(fd)
        yield tmp
        os.chmod(tmp, _new_file_mode(target))
        os.replace(tmp, target)   # a signal before it leaves the old file, one after it the new
    except BaseException:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


def _new_file_mode(path: str) -> int:
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_text_atomic(path: str, chunks: Iterable[str]) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for c in chunks:
            f.write(c)


def write_npy_atomic(path: str, arr: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        write_npy(f, arr)
