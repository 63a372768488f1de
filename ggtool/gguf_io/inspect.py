"""A GGUF file described (header, metadata, tensors, totals, per-tensor statistics) and two files or
tensors compared (per-tensor error), as plain JSON-ready records; the command line renders them
(`ggtool inspect`, `ggtool compare`).

Opening is lazy (GGUFFile: header and infos parsed, data memory-mapped); metadata arrays are kept
shortened to their first items, so a 262,144-token vocabulary is not decoded; tensor data is read
only for statistics and comparisons, in row chunks (memory stays near one chunk, not the model).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import quant as Q
from .. import types as T
from ..errors import GGToolError, InputError
from .format import cut_text
from .reader import GGUFFile
from .spec import split_gguf_tensor

SHORT_STR = 60          # characters of a string value shown unless full
SHORT_ITEMS = 8         # items of an array value shown unless full
CHUNK_VALUES = 1 << 22  # values dequantized at a time (16 MiB of f32)


# ------------------------------------------------------------------------------------------- values

def _py(v):
    if isinstance(v, np.generic):
        return v.item()
    return v


def _value(g: GGUFFile, key: str, full: bool) -> dict:
    f = g.reader.fields[key]
    vtype = g.value_type(key)
    out: dict = {"key": key, "type": vtype}
    n = g.array_len(key)
    if n is not None:
        out["count"] = n
        items = f.contents() if full else f.contents(slice(0, SHORT_ITEMS))
        items = [_py(x) for x in items]
        if not full and n > SHORT_ITEMS:
            out["truncated"] = True
        out["value"] = items
        return out
    v = _py(f.contents())
    if isinstance(v, str) and not full:
        cut, length = cut_text(v, SHORT_STR)
        if length > SHORT_STR:
            out["length"] = length
            out["truncated"] = True
            v = cut
    out["value"] = v
    return out


# --------------------------------------------------------------------------------------- describe

def _bpw(nbytes: int, n: int) -> float:
    return round(nbytes * 8.0 / n, 4) if n else 0.0


def describe(g: GGUFFile, *, full: bool = False, diffable: bool = False,
             only: Callable[[str], bool] | None = None) -> dict:
    """Everything `inspect` shows, as a JSON-ready dict with stable keys. A split model (its first
    shard) is described whole: `shards` lists its files, each tensor's `shard` is the number in
    its file's name (offsets are in that file). `only(name)` picks the metadata keys and tensors
    listed (and totalled); n_kv and n_tensors stay the file's."""
    split = len(g.shards) > 1
    shard_of = {p: k + 1 for k, p in enumerate(g.paths)}
    tensors = []
    by_type: dict[str, dict] = {}
    n_el = n_bytes = 0
    for info in g.tensors.values():
        if only is not None and not only(info.name):
            continue
        n = info.n_elements
        rec = {"name": info.name, "type": T.type_name(info.type), "ne": list(info.ne),
               "bytes": info.n_bytes, "bpw": _bpw(info.n_bytes, n)}
        if not diffable:
            rec["offset"] = info.offset
            if split:
                rec["shard"] = shard_of[info.path]
        tensors.append(rec)
        bt = by_type.setdefault(rec["type"], {"tensors": 0, "elements": 0, "bytes": 0})
        bt["tensors"] += 1
        bt["elements"] += n
        bt["bytes"] += info.n_bytes
        n_el += n
        n_bytes += info.n_bytes
    if diffable:
        tensors.sort(key=lambda r: r["name"])
    keys = g.keys()
    metadata = [_value(g, k, full) for k in keys if only is None or only(k)]
    if diffable:
        metadata.sort(key=lambda r: r["key"])
    d = {"file": os.path.basename(g.path) if diffable else g.path, "version": g.version,
         "alignment": g.alignment}
    if not diffable:
        d["data_offset"] = g.data_offset
        d["file_size"] = os.path.getsize(g.path)
    if split:
        d["shards"] = [{"file": os.path.basename(s.path) if diffable else s.path, "tensors": len(s.own_tensors)}
                       for s in g.shards]
        if not diffable:
            for rec, s in zip(d["shards"], g.shards):
                rec.update(data_offset=s.data_offset, file_size=os.path.getsize(s.path))
    d.update({"n_kv": len(keys), "n_tensors": len(g.tensors), "metadata": metadata, "tensors": tensors,
              "totals": {"tensors": len(tensors), "elements": n_el, "bytes": n_bytes, "bpw": _bpw(n_bytes, n_el),
                         "by_type": dict(sorted(by_type.items()))}})
    return d


# ------------------------------------------------------------------------------------------ stats

def _row_chunks(g: GGUFFile, name: str):
    """float32 pieces of a tensor (rows in order), dequantized CHUNK_VALUES at a time."""
    info = g.tensors[name]
    raw = g.array(name)
    ne0 = info.ne[0] if info.ne else 1
    nrows = info.n_elements // max(ne0, 1)
    raw2 = raw.reshape(nrows, -1) if nrows else raw.reshape(0, 0)
    step = max(1, CHUNK_VALUES // max(ne0, 1))
    for r0 in range(0, nrows, step):
        part = raw2[r0:r0 + step]
        try:
            yield Q.dequantize(part, info.type).reshape(-1)
        except (GGToolError, ValueError, NotImplementedError) as e:
            raise InputError(f"{g.path}: tensor '{name}': cannot read its {T.type_name(info.type)} data ({e})") from None


class _Moments:
    def __init__(self):
        self.n = 0
        self.nonfinite = 0
        self.lo = math.inf
        self.hi = -math.inf
        self.s = 0.0
        self.ss = 0.0

    def add(self, x: np.ndarray) -> None:
        fin = np.isfinite(x)
        if not fin.all():
            self.nonfinite += int(x.size - fin.sum())
            x = x[fin]
        if x.size == 0:
            return
        self.n += x.size
        self.lo = min(self.lo, float(x.min()))
        self.hi = max(self.hi, float(x.max()))
        x64 = x.astype(np.float64)
        self.s += float(x64.sum())
        self.ss += float(np.square(x64).sum())    # numpy's own sum (not BLAS's dot: its order is the CPU's)

    def result(self) -> dict:
        if self.n == 0:
            return {"min": None, "max": None, "mean": None, "std": None, "nonfinite": self.nonfinite}
        mean = self.s / self.n
        var = max(self.ss / self.n - mean * mean, 0.0)
        return {"min": self.lo, "max": self.hi, "mean": mean, "std": math.sqrt(var), "nonfinite": self.nonfinite}


def tensor_stats(g: GGUFFile, name: str, on_bytes: Callable[[int], None] | None = None) -> dict:
    """min/max/mean/std (float64 sums) of a tensor's dequantized finite values, + nonfinite count."""
    m = _Moments()
    info = g.tensors[name]
    per_value = info.n_bytes / max(info.n_elements, 1)
    for x in _row_chunks(g, name):
        m.add(np.asarray(x, dtype=np.float32) if x.dtype != np.float32 else x)
        if on_bytes:
            on_bytes(int(x.size * per_value))
    return m.result()


# ---------------------------------------------------------------------------------------- compare

@dataclass
class Source:
    """One side of a compare: a GGUF file, one tensor of one, or a .npy array."""

    label: str
    gguf: GGUFFile | None = None
    tensor: str | None = None
    npy: np.ndarray | None = None

    def names(self) -> list[str]:
        if self.npy is not None:
            return [self.tensor]
        if self.tensor is not None:
            return [self.tensor]
        return list(self.gguf.tensors)

    def type_name(self, name: str) -> str:
        if self.npy is not None:
            return str(self.npy.dtype)
        return T.type_name(self.gguf.tensors[name].type)

    def ne(self, name: str) -> list[int]:
        if self.npy is not None:
            return list(self.npy.shape[::-1])
        return list(self.gguf.tensors[name].ne)

    def chunks(self, name: str):
        if self.npy is not None:
            flat = self.npy.reshape(-1)
            for s in range(0, flat.size, CHUNK_VALUES):
                yield np.asarray(flat[s:s + CHUNK_VALUES], dtype=np.float32)
            return
        yield from _row_chunks(self.gguf, name)


def open_source(spec: str) -> Source:
    """`FILE.gguf`, `FILE.gguf:TENSOR` or `FILE.npy`."""
    path, tensor = split_gguf_tensor(spec) or (spec, None)
    if not os.path.exists(path):
        raise InputError(f"{spec}: no such file")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise InputError(f"{path}: not a readable .npy file ({e})") from None
        if arr.dtype.kind not in "fiu":
            raise InputError(f"{path}: cannot compare a {arr.dtype} array")
        return Source(spec, npy=arr, tensor=tensor or os.path.splitext(os.path.basename(path))[0])
    g = GGUFFile(path)
    if tensor is not None and tensor not in g.tensors:
        raise InputError(f"{path}: no tensor named '{tensor}'")
    return Source(spec, gguf=g, tensor=tensor)


class _Diff:
    """Error of B against A. Where A or B holds a non-finite value the two are compared as values:
    the same inf (or NaN) on both sides is no error, anything else makes every measure infinite;
    either way the count is reported, never dropped."""

    def __init__(self):
        self.se = 0.0      # sum of squared errors
        self.sr = 0.0      # sum of squared reference values
        self.maxabs = 0.0
        self.n = 0
        self.identical = True
        self.nonfinite_a = 0
        self.nonfinite_b = 0
        self.unmatched = 0  # positions where a non-finite value meets a different value

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        if self.identical and not np.array_equal(a, b, equal_nan=True):
            self.identical = False
        self.n += a.size
        fa, fb = np.isfinite(a), np.isfinite(b)
        if not (fa.all() and fb.all()):
            self.nonfinite_a += int(a.size - np.count_nonzero(fa))
            self.nonfinite_b += int(b.size - np.count_nonzero(fb))
            both = fa & fb
            same = (a == b) | (np.isnan(a) & np.isnan(b))
            self.unmatched += int(np.count_nonzero(~both & ~same))
            a, b = a[both], b[both]
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        d = b64 - a64
        self.se += float(np.square(d).sum())      # numpy's own sums, the same on every host (BLAS's dot
        self.sr += float(np.square(a64).sum())    # adds in its CPU kernel's order)
        if d.size:
            self.maxabs = max(self.maxabs, float(np.abs(d).max()))

    def result(self) -> dict:
        if self.unmatched:
            nmse = maxabs = rms = math.inf
        else:
            nmse = self.se / self.sr if self.sr > 0 else (0.0 if self.se == 0 else math.inf)
            maxabs, rms = self.maxabs, math.sqrt(self.se / self.n) if self.n else 0.0
        return {"identical": self.identical, "nmse": nmse, "max_abs_error": maxabs,
                "rel_rms": math.sqrt(nmse) if math.isfinite(nmse) else math.inf,
                "rms_error": rms, "nonfinite": self.nonfinite_a + self.nonfinite_b,
                "nonfinite_a": self.nonfinite_a, "nonfinite_b": self.nonfinite_b}


def _pairs(a: Source, b: Source) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    if a.tensor is not None or b.tensor is not None or a.npy is not None or b.npy is not None:
        if len(a.names()) != 1 or len(b.names()) != 1:
            raise InputError("compare a single tensor (FILE.gguf:TENSOR or .npy) with a single tensor, "
                             "or two GGUF files")
        return [(a.names()[0], b.names()[0])], [], []
    bn = set(b.names())
    an = a.names()
    both = [(n, n) for n in an if n in bn]
    return both, [n for n in an if n not in bn], [n for n in b.names() if n not in set(an)]


def compare(a: Source, b: Source, on_bytes: Callable[[int], None] | None = None) -> dict:
    """Per tensor present in both: types, shapes, NMSE, max abs error, relative RMS (b against a)."""
    pairs, only_a, only_b = _pairs(a, b)
    rows = []
    total = _Diff()
    for na, nb in pairs:
        rec = {"name": na if na == nb else f"{na} | {nb}", "type_a": a.type_name(na), "type_b": b.type_name(nb),
               "ne": a.ne(na)}
        if a.ne(na) != b.ne(nb):
            rec.update({"ne_b": b.ne(nb), "error": "shapes differ"})
            rows.append(rec)
            continue
        d = _Diff()
        for xa, xb in zip(a.chunks(na), b.chunks(nb)):
            d.add(xa, xb)
            total.add(xa, xb)
            if on_bytes:
                on_bytes(xa.size)
        rec.update(d.result())
        rows.append(rec)
    compared = [r for r in rows if "error" not in r]
    return {"a": a.label, "b": b.label, "tensors": rows,
            "only_in_a": only_a, "only_in_b": only_b,
            "summary": {"compared": len(compared), "identical": sum(1 for r in compared if r["identical"]),
                        "shape_mismatch": len(rows) - len(compared),
                        **{k: v for k, v in total.result().items() if k != "identical"}}}


def worse_than(result: dict, max_nmse: float) -> list[dict]:
    """The tensors of a compare() result that fail a bound on NMSE: above it, not a number (inf or
    NaN where the files differ), or not comparable at all (shapes that differ); worst first."""
    def badness(r: dict) -> float:
        nmse = r.get("nmse")
        return math.inf if nmse is None or not math.isfinite(nmse) else nmse

    return sorted((r for r in result["tensors"] if badness(r) > max_nmse or math.isinf(badness(r))),
                  key=badness, reverse=True)


def compare_values(a: Source, b: Source) -> int:
    """Total number of values compare() will read (for a progress bar)."""
    pairs, _, _ = _pairs(a, b)
    n = 0
    for na, nb in pairs:
        if a.ne(na) == b.ne(nb):
            n += int(np.prod(a.ne(na), dtype=np.int64))
    return n
