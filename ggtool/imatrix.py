"""Importance matrices as llama-quantize reads them (tools/quantize/quantize.cpp ``load_imatrix``
over common/imatrix-loader.cpp), from llama-imatrix's GGUF or its legacy ``.dat``:

* GGUF: tensors ``<weight>.in_sum2`` (sums of squared activations, ne0 per expert) and
  ``<weight>.counts`` (tokens seen, one float per expert, rounded with lround); an entry's value
  is ``in_sum2 / count`` per expert (float32), or 1 where the count is 0. The keys
  ``imatrix.datasets``, ``imatrix.chunk_count`` and ``imatrix.chunk_size`` must all be there.
* ``.dat``: int32 entry count; per entry int32 name length, the name, int32 ncall, int32 nval,
  nval float32 (the sums already averaged, times ncall); then optionally int32 chunk count, int32
  length and the dataset name. An entry's value is ``sums / ncall`` (the sums as they are where
  ncall is 0).

A 3-d (MoE) weight's entry holds ne0 values per expert, experts one after the other:
``Imatrix.weights_for`` gives them as (n_expert, ne0), which ``ggtool.quant.quantize(x, t,
imatrix=...)`` takes for x of shape (n_expert, rows, ne0). A defect is an ImatrixError naming the
file and the entry; NaN or inf anywhere is refused, as llama_model_quantize refuses it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np

from .errors import ImatrixError, InputError

# the metadata llama-quantize records about the importance matrix it used
KEY_FILE = "quantize.imatrix.file"
KEY_DATASET = "quantize.imatrix.dataset"
KEY_ENTRIES = "quantize.imatrix.entries_count"
KEY_CHUNKS = "quantize.imatrix.chunks_count"
_VAL_STR_MAX = 127          # llama_model_kv_override's val_str: 127 bytes and a NUL
_F32 = np.float32


@dataclass(frozen=True)
class Imatrix:
    """An importance matrix: per weight name, float32 importances per column (ne0 * n_expert)."""

    path: str                                   # the file, as given (llama-quantize records it so)
    values: dict[str, np.ndarray]
    datasets: tuple[str, ...] = ()
    chunk_count: int = 0
    chunk_size: int = 0
    legacy: bool = False

    def weights_for(self, name: str, ne: tuple[int, ...]) -> np.ndarray | None:
        """The importances for weight `name` of shape `ne` (ggml order, trailing 1s allowed, as a
        Tensor's ne has them): (ne0,) for a matrix or a weight of one expert, (ne[2], ne0) for a
        3-d weight of several; None if the file has no entry for it. An entry of another
        length than ne0 * ne[2] is an ImatrixError of kind "size" (llama.cpp stops there, except
        for the token embeddings, which it quantizes without: the caller's rule)."""
        v = self.values.get(name)
        if v is None:
            return None
        n_expert = ne[2] if len(ne) > 2 else 1
        if v.size != ne[0] * n_expert:
            raise ImatrixError(f"imatrix size {v.size} is different from tensor size {ne[0] * n_expert} for {name}",
                               file=self.path, tensor=name, kind="size")
        return v if n_expert == 1 else v.reshape(n_expert, ne[0])

    def select(self, include: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> Imatrix | None:
        """llama-quantize's include-weights / exclude-weights selection: the entries whose name contains
        one of `include` (all if none), less those containing one of `exclude`; None when no
        entry is left (llama-quantize then quantizes as if no importance matrix were given)."""
        values = {k: v for k, v in self.values.items()
                  if not any(x in k for x in exclude) and (not include or any(x in k for x in include))}
        return replace(self, values=values) if values else None

    def metadata(self, entries_count: int | None = None) -> dict[str, str | int]:
        """The keys llama-quantize writes into the quantized file: the file name and first dataset
        (strings, cut to 127 bytes), the number of entries it used (UINT32; all of them unless
        given) and the chunk count (UINT32, only when above 0)."""
        meta: dict[str, str | int] = {KEY_FILE: _cut(self.path)}
        if self.datasets:
            meta[KEY_DATASET] = _cut(self.datasets[0])
        meta[KEY_ENTRIES] = len(self.values) if entries_count is None else entries_count
        if self.chunk_count > 0:
            meta[KEY_CHUNKS] = self.chunk_count
        return meta


def _cut(s: str) -> str:
    """strncpy(val_str, s, 127): the first 127 bytes of s (a character cut in two is dropped)."""
    b = s.encode("utf-8", "surrogateescape")[:_VAL_STR_MAX]
    return b.split(b"\0", 1)[0].decode("utf-8", "ignore")


def read_imatrix(path: str | os.PathLike) -> Imatrix:
    """The importance matrix in `path`: GGUF if it starts with GGUF's magic, else the legacy format."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ImatrixError(f"cannot read the importance matrix: {e.strerror}", file=p, kind="format") from None
    return _read_gguf(p) if head == b"GGUF" else _read_legacy(p)


def _check_finite(p: str, name: str, v: np.ndarray) -> None:
    if not np.isfinite(v).all():
        i = int(np.argmin(np.isfinite(v)))
        raise ImatrixError(f"entry '{name}' holds {v[i]} at index {i} (an importance matrix must be finite)",
                           file=p, tensor=name, kind="values")


def _read_gguf(p: str) -> Imatrix:
    from .gguf_io import open_gguf

    try:
        g = open_gguf(p)
    except InputError as e:
        raise ImatrixError(e.message, file=p, kind="format") from None
    if not g.tensors:
        raise ImatrixError("no data (the file has no tensors)", file=p, kind="format")
    missing = [k for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size") if k not in g.keys()]
    if missing:
        raise ImatrixError(f"missing imatrix metadata ({', '.join(missing)})", file=p, kind="metadata")
    for k in ("imatrix.chunk_count", "imatrix.chunk_size"):
        if g.value_type(k) != "UINT32":
            raise ImatrixError(f"{k} is {g.value_type(k)}, not UINT32", file=p, kind="metadata")
    datasets = g.metadata("imatrix.datasets") if g.value_type("imatrix.datasets") == "ARRAY[STRING]" else []
    pairs: dict[str, list] = {}
    for name in g.tensors:           # llama.cpp's map: entries in name order
        for suffix, slot in ((".in_sum2", 0), (".counts", 1)):
            if name.endswith(suffix) and len(name) > len(suffix):
                pairs.setdefault(name[:-len(suffix)], [None, None])[slot] = name
    values = {}
    for entry in sorted(pairs):
        sums_name, counts_name = pairs[entry]
        if sums_name is None or counts_name is None:
            raise ImatrixError(f"mismatched sums and counts for {entry}", file=p, tensor=entry, kind="format")
        for n in (sums_name, counts_name):
            if g.tensors[n].type.name != "F32":
                raise ImatrixError(f"sums and counts for {entry} must be F32, not {g.tensors[n].type.name}",
                                   file=p, tensor=entry, kind="format")
        sums = np.asarray(g.array(sums_name), _F32).reshape(-1)
        counts = np.asarray(g.array(counts_name), _F32).reshape(-1)
        if counts.size == 0:
            raise ImatrixError(f"entry '{entry}' has no counts", file=p, tensor=entry, kind="format")
        values[entry] = _per_column(sums, _lround(counts))
        _check_finite(p, entry, values[entry])
    return Imatrix(p, values, tuple(datasets), int(g.metadata("imatrix.chunk_count")),
                   int(g.metadata("imatrix.chunk_size")), False)


def _lround(v: np.ndarray) -> np.ndarray:
    """std::lround: to nearest, halves away from zero; a value no long holds (NaN, inf, |v| >= 2^63)
    is LONG_MIN, as x86's conversion makes it."""
    with np.errstate(invalid="ignore"):
        r = np.trunc(v.astype(np.float64) + np.copysign(0.5, v))
    fits = np.abs(r) < 2.0 ** 63                  # False for NaN too
    out = np.where(fits, r, 0).astype(np.int64)
    out[~fits] = np.iinfo(np.int64).min
    return out


def _per_column(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """in_sum2 / count per expert (float32), 1 where the count is not above 0; values past the
    last whole expert stay 0, as load_imatrix leaves them."""
    ne0 = sums.size // counts.size
    out = np.zeros(sums.size, _F32)
    for j, c in enumerate(counts):
        part = slice(j * ne0, (j + 1) * ne0)
        out[part] = sums[part] / _F32(c) if c > 0 else _F32(1)
    return out


def _read_legacy(p: str) -> Imatrix:
    with open(p, "rb") as f:
        buf = f.read()
    at = 0

    def i32(what: str, entry: str | None) -> int:
        nonlocal at
        if at + 4 > len(buf):
            raise ImatrixError(f"truncated at byte {at} (reading {what})", file=p, tensor=entry, kind="truncated")
        v = int.from_bytes(buf[at:at + 4], "little", signed=True)
        at += 4
        return v

    if len(buf) < 4 or int.from_bytes(buf[:4], "little", signed=True) < 1:
        raise ImatrixError("no data (neither GGUF nor a legacy imatrix with entries)", file=p, kind="format")
    n_entries = i32("the entry count", None)
    values: dict[str, np.ndarray] = {}
    for k in range(n_entries):
        ln = i32(f"the name length of entry {k + 1}", None)
        if ln < 0 or at + ln > len(buf):
            raise ImatrixError(f"truncated at byte {at} (the name of entry {k + 1}, {ln} bytes)", file=p,
                               kind="truncated")
        name = buf[at:at + ln].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        at += ln
        ncall = i32("ncall", name)
        nval = i32("the number of values", name)
        if nval < 1:
            raise ImatrixError(f"entry '{name}' has {nval} values", file=p, tensor=name, kind="format")
        if at + 4 * nval > len(buf):
            raise ImatrixError(f"truncated at byte {at} ({nval} values of entry '{name}', "
                               f"{len(buf) - at} bytes left)", file=p, tensor=name, kind="truncated")
        sums = np.frombuffer(buf, "<f4", nval, at).astype(_F32)
        at += 4 * nval
        values[name] = sums / _F32(ncall) if ncall > 0 else sums.copy()
        _check_finite(p, name, values[name])
    chunk_count, datasets = 0, []
    if at < len(buf):                # the trailing chunk count and dataset are optional
        tail = buf[at:at + 4]
        chunk_count = int.from_bytes(tail.ljust(4, b"\0"), "little", signed=True)
        at += 4
        if at + 4 <= len(buf):
            ln = int.from_bytes(buf[at:at + 4], "little", signed=True)
            at += 4
            if 0 < ln <= len(buf) - at:
                datasets.append(buf[at:at + ln].split(b"\0", 1)[0].decode("utf-8", "surrogateescape"))
    return Imatrix(p, dict(sorted(values.items())), tuple(datasets), chunk_count, 0, True)


# -- raw sums, for merging and writing (llama-imatrix's own side) -------------------------------------
@dataclass
class ImatrixSums:
    """What llama-imatrix accumulates (IMatrixCollector's m_stats): per weight, `sums` float32 (the
    squared activations summed over the rows seen, ne0 per expert) and `counts` int64 (rows seen,
    one per expert); `datasets` the texts, in order; `chunk_count` as the file says it."""

    sums: dict[str, np.ndarray]
    counts: dict[str, np.ndarray]
    datasets: list[str]
    chunk_count: int = 0


def read_imatrix_sums(path: str | os.PathLike, chunk_size: int) -> ImatrixSums:
    """A file's raw sums, as llama-imatrix loads an in-file (IMatrixCollector::load_imatrix):
    a GGUF file's in_sum2 and counts (counts rounded with lround); a legacy .dat's averaged values
    times `chunk_size`, its ncall times chunk_size as the count (the run's n_ctx: what llama-imatrix
    multiplies by)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ImatrixError(f"cannot read the importance matrix: {e.strerror}", file=p, kind="format") from None
    if head != b"GGUF":
        legacy = _read_legacy_raw(p)
        sums = {k: (v * _F32(chunk_size)).astype(_F32) for k, (v, _) in legacy[0].items()}
        counts = {k: np.array([n * chunk_size], np.int64) for k, (_, n) in legacy[0].items()}
        return ImatrixSums(sums, counts, legacy[1], legacy[2])
    from .gguf_io import open_gguf

    try:
        g = open_gguf(p)
    except InputError as e:
        raise ImatrixError(e.message, file=p, kind="format") from None
    if not g.tensors:
        raise ImatrixError("no data (the file has no tensors)", file=p, kind="format")
    datasets = list(g.metadata("imatrix.datasets")) if ("imatrix.datasets" in g.keys() and
                                                        g.value_type("imatrix.datasets") == "ARRAY[STRING]") else []
    chunk_count = int(g.metadata("imatrix.chunk_count")) if ("imatrix.chunk_count" in g.keys() and
                                                            g.value_type("imatrix.chunk_count") == "UINT32") else 0
    pairs: dict[str, list] = {}
    for name in g.tensors:
        for suffix, slot in ((".in_sum2", 0), (".counts", 1)):
            if name.endswith(suffix) and len(name) > len(suffix):
                pairs.setdefault(name[:-len(suffix)], [None, None])[slot] = name
    sums, counts = {}, {}
    for entry in sorted(pairs):
        s_name, c_name = pairs[entry]
        if s_name is None or c_name is None:
            raise ImatrixError(f"mismatched sums and counts for {entry}", file=p, tensor=entry, kind="format")
        for n in (s_name, c_name):
            if g.tensors[n].type.name != "F32":
                raise ImatrixError(f"sums and counts for {entry} must be F32, not {g.tensors[n].type.name}",
                                   file=p, tensor=entry, kind="format")
        s = np.asarray(g.array(s_name), _F32).reshape(-1).copy()
        c = _lround(np.asarray(g.array(c_name), _F32).reshape(-1))
        if c.size == 0 or s.size % c.size:
            raise ImatrixError(f"entry '{entry}' has {s.size} sums for {c.size} counts", file=p, tensor=entry,
                               kind="format")
        if (c < 0).any():
            raise ImatrixError(f"entry '{entry}' has a negative count", file=p, tensor=entry, kind="values")
        _check_finite(p, entry, s)
        sums[entry], counts[entry] = s, c
    return ImatrixSums(sums, counts, datasets, chunk_count)


def _read_legacy_raw(p: str):
    """A .dat's entries as (values as stored, ncall), its datasets and chunk count."""
    im = _read_legacy(p)      # checks it; its values are sums / ncall, so read the stored ones again
    with open(p, "rb") as f:
        buf = f.read()
    at, out = 4, {}
    for _ in range(int.from_bytes(buf[:4], "little", signed=True)):
        ln = int.from_bytes(buf[at:at + 4], "little", signed=True)
        name = buf[at + 4:at + 4 + ln].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        at += 4 + ln
        ncall, nval = (int.from_bytes(buf[at + i:at + i + 4], "little", signed=True) for i in (0, 4))
        at += 8
        out[name] = (np.frombuffer(buf, "<f4", nval, at).astype(_F32), ncall)
        at += 4 * nval
    return out, list(im.datasets), im.chunk_count


def merge_sums(into: ImatrixSums | None, other: ImatrixSums, path: str) -> ImatrixSums:
    """`other` added to `into` as llama-imatrix adds a loaded file (float sums, counts; one count
    spread over the experts of an entry that has more); an entry of another size is an
    ImatrixError naming `path`."""
    if into is None:
        return ImatrixSums({k: v.copy() for k, v in other.sums.items()}, {k: v.copy() for k, v in other.counts.items()},
                           list(other.datasets), other.chunk_count)
    for name, s in other.sums.items():
        c = other.counts[name]
        have = into.sums.get(name)
        if have is None:
            into.sums[name], into.counts[name] = s.copy(), c.copy()
            continue
        if have.size != s.size:
            raise ImatrixError(f"entry '{name}' has {s.size} values where the files before it have {have.size}",
                               file=path, tensor=name, kind="size")
        mine = into.counts[name]
        if mine.size == 1 and c.size > 1:
            mine = np.full(c.size, mine[0], np.int64)
        elif mine.size != c.size:
            raise ImatrixError(f"entry '{name}' has {c.size} counts where the files before it have {mine.size}",
                               file=path, tensor=name, kind="size")
        into.sums[name] = (have + s).astype(_F32)
        into.counts[name] = mine + c
    into.datasets += other.datasets
    return into


def imatrix_gguf_bytes(stats: ImatrixSums, chunk_count: int, chunk_size: int) -> bytes:
    """The GGUF file llama-imatrix writes (IMatrixCollector::save_imatrix, gguf_write_to_file):
    general.type "imatrix", imatrix.datasets, imatrix.chunk_count and imatrix.chunk_size, then per
    entry in name order `<name>.in_sum2` (F32 [ne0, n_expert]) and `<name>.counts` (F32 [1,
    n_expert]), each tensor's data padded to 32 bytes."""
    import struct

    from .gguf_io.write import ARRAY, STRING, gguf_string, header_bytes, kv_scalar, kv_u32
    from .types import GGMLType, pad

    kv = [kv_scalar("general.type", STRING, "imatrix"),
          gguf_string("imatrix.datasets") + struct.pack("<IIQ", ARRAY, STRING, len(stats.datasets))
          + b"".join(gguf_string(d) for d in stats.datasets),
          kv_u32("imatrix.chunk_count", chunk_count), kv_u32("imatrix.chunk_size", chunk_size)]
    infos, blobs, offset = [], [], 0
    for name in sorted(stats.sums):
        s, c = stats.sums[name], stats.counts[name]
        n_mat = c.size
        for tname, data, ne in ((f"{name}.in_sum2", s.astype("<f4"), [s.size // n_mat, n_mat]),
                                (f"{name}.counts", c.astype("<f4"), [1, n_mat])):
            ne = ne if ne[-1] != 1 else ne[:1]                  # ggml_n_dims
            raw = data.tobytes()
            infos.append((tname, ne, GGMLType.F32, offset))
            blobs.append(raw + b"\0" * (pad(len(raw), 32) - len(raw)))
            offset += pad(len(raw), 32)
    return header_bytes(kv, infos, 32) + b"".join(blobs)
