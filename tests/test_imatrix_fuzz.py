"""A seeded mutation fuzz of importance-matrix files (ggtool.imatrix reads llama-imatrix's GGUF and
legacy .dat), from llama-imatrix's own two files (golden/imatrix): truncations, flipped bytes,
every .dat field set to lying values, and GGUF imatrices rewritten with their keys, types, shapes
and values wrong. Every mutant must end in a loaded matrix (finite float32 values, its metadata and
its weights for the model's tensors usable) or one ImatrixError naming the file; never another
exception, never more than a few MB of memory for a file of 16 KB (a lying count fails before
anything is allocated for it). Some mutants go through `ggtool quantize --imatrix` too: exit 0, or
one `Error: --imatrix FILE: ...` line.

`python tests/test_imatrix_fuzz.py [SEED]` prints the count of mutants per outcome."""

from __future__ import annotations

import random
import struct
import sys
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import STORIES, write_gguf  # noqa: E402

from ggtool.errors import ImatrixError  # noqa: E402
from ggtool.imatrix import Imatrix, read_imatrix  # noqa: E402

SEED = 29
GOLD = Path(__file__).resolve().parent / "golden" / "imatrix"
GGUF, DAT = GOLD / "stories260K-imatrix.gguf", GOLD / "stories260K-imatrix.dat"
MAX_BYTES = 4 << 20
LIES = (0, 1, -1, 7, 2**31 - 1, -(2**31), 2**24, 12275, 12276)   # and the real value +-1, a random one
SHAPES = {"blk.0.attn_q.weight": (64, 64), "blk.0.ffn_down.weight": (172, 64), "output.weight": (64, 512)}


# -- .dat: its fields, and lying values for each ---------------------------------------------------------
def dat_fields(data: bytes) -> tuple[list[tuple[int, str]], list[int]]:
    """(offset, label) of every int32 field of a legacy imatrix, and where each entry starts."""
    fields, bounds = [(0, "entry count")], [0, 4]
    at = 4
    for _ in range(struct.unpack_from("<i", data, 0)[0]):
        bounds.append(at)
        ln = struct.unpack_from("<i", data, at)[0]
        fields.append((at, "name length"))
        at += 4 + ln
        nval = struct.unpack_from("<i", data, at + 4)[0]
        fields += [(at, "ncall"), (at + 4, "nval")]
        at += 8 + 4 * nval
    bounds.append(at)
    if at + 8 <= len(data):
        fields += [(at, "chunk count"), (at + 4, "dataset length")]
    return fields, bounds


def dat_mutants(rng: random.Random):
    base = DAT.read_bytes()
    fields, bounds = dat_fields(base)
    cuts = {b + d for b in bounds for d in (-1, 0, 1, 2)} | {rng.randrange(len(base)) for _ in range(30)}
    for c in sorted(x for x in cuts if 0 <= x < len(base)):
        yield f".dat truncated at {c}", base[:c], ".dat"
    for k, (at, label) in enumerate(fields):
        real = struct.unpack_from("<i", base, at)[0]
        # every lie for the count, the first two entries and the tail; a few for the entries between
        lies = {*LIES} if k < 7 or k >= len(fields) - 5 else set(rng.sample(LIES, 2))
        for v in {*lies, real + 1, real - 1, rng.randrange(-(2**31), 2**31)} - {real}:
            v = (v + 2**31) % 2**32 - 2**31
            yield f".dat {label} at {at} = {v}", base[:at] + struct.pack("<i", v) + base[at + 4:], ".dat"
    for _ in range(100):
        at = rng.randrange(len(base))
        flip = bytearray(base)
        flip[at] ^= 1 << rng.randrange(8) if rng.random() < 0.5 else rng.randrange(1, 256)
        yield f".dat byte {at} flipped", bytes(flip), ".dat"
    for value in (np.nan, np.inf, -np.inf, 3e38):   # a value that is not finite, or overflows when averaged
        at = bounds[5] + 4 + struct.unpack_from("<i", base, bounds[5])[0] + 8
        yield f".dat value {value}", base[:at] + struct.pack("<f", value) + base[at + 4:], ".dat"
    yield ".dat with nothing after the entries", base[:bounds[-1]], ".dat"
    yield ".dat whose entry count is all", struct.pack("<i", 1) + base[4:bounds[3]], ".dat"


# -- GGUF: raw damage, and imatrices written wrong ------------------------------------------------------
def _gold_gguf() -> tuple[dict, dict]:
    """llama-imatrix's GGUF as (tensors, metadata) to write variants of."""
    from gguf import GGUFReader

    r = GGUFReader(str(GGUF))
    tensors = {t.name: np.array(t.data, np.float32).reshape([int(n) for n in t.shape[::-1]]) for t in r.tensors}
    return tensors, {"imatrix.datasets": ["readme-6k.txt"], "imatrix.chunk_count": 4, "imatrix.chunk_size": 128}


def gguf_variants():
    """(label, tensors, kv): imatrices a writer could get wrong."""
    t, kv = _gold_gguf()
    entry = "blk.0.attn_q.weight"
    sums, counts = f"{entry}.in_sum2", f"{entry}.counts"
    for key in kv:
        yield f"no {key}", t, {k: v for k, v in kv.items() if k != key}
        yield f"{key} as a string", t, {**kv, key: "4"}
        yield f"{key} as a float", t, {**kv, key: 4.0}
    yield "datasets empty", t, {**kv, "imatrix.datasets": []}
    yield "dataset of 300 bytes", t, {**kv, "imatrix.datasets": ["é" * 150]}
    yield "no tensors", {}, kv
    yield "sums without counts", {k: v for k, v in t.items() if k != counts}, kv
    yield "counts without sums", {k: v for k, v in t.items() if k != sums}, kv
    yield "a nameless entry", {**t, ".in_sum2": t[sums], ".counts": t[counts]}, kv
    yield "suffixes twice", {**t, f"{sums}.counts": np.ones(1, np.float32)}, kv
    for label, c in [("zero", [0.0]), ("negative", [-3.0]), ("NaN", [np.nan]), ("inf", [np.inf]), ("2^70", [2.0**70]),
                     ("0.4", [0.4]), ("0.5", [0.5]), ("none", []), ("3 of them", [1.0, 2.0, 3.0]),
                     ("128 of them", [1.0] * 128)]:
        yield f"counts {label}", {**t, counts: np.array(c, np.float32)}, kv
    yield "counts as f16", {**t, counts: t[counts].astype(np.float16)}, kv
    yield "counts as i32", {**t, counts: t[counts].astype(np.int32)}, kv
    yield "sums as f16", {**t, sums: t[sums].astype(np.float16)}, kv
    for label, v in [("NaN", np.nan), ("inf", np.inf), ("-inf", -np.inf), ("3e38", 3e38), ("negative", -1.0)]:
        bad = t[sums].copy()
        bad[5] = v
        yield f"a sum {label}", {**t, sums: bad}, kv
    yield "sums of 63", {**t, sums: t[sums][:63]}, kv
    yield "sums of 65", {**t, sums: np.append(t[sums], 1.0).astype(np.float32)}, kv
    yield "two experts", {**t, sums: np.tile(t[sums], (2, 1)), counts: np.array([4.0, 0.0], np.float32)}, kv
    yield "an entry for no tensor", {**t, "nothing.weight.in_sum2": np.ones(8, np.float32),
                                     "nothing.weight.counts": np.ones(1, np.float32)}, kv


def gguf_mutants(rng: random.Random, tmp: Path):
    base = GGUF.read_bytes()
    data_start = 4384
    cuts = {rng.randrange(len(base)) for _ in range(30)} | {0, 3, 4, 8, 24, data_start - 1, data_start, len(base) - 1}
    for c in sorted(cuts):
        yield f"GGUF truncated at {c}", base[:c], ".gguf"
    for _ in range(100):
        at = rng.randrange(4, len(base))   # the header (names, types, shapes) and the data (NaN and huge floats)
        flip = bytearray(base)
        flip[at] ^= 1 << rng.randrange(8) if rng.random() < 0.5 else rng.randrange(1, 256)
        yield f"GGUF byte {at} flipped", bytes(flip), ".gguf"
    for label, tensors, kv in gguf_variants():
        path = write_gguf(tmp / "variant.gguf", tensors, arch="llama", kv=kv)
        yield f"GGUF {label}", path.read_bytes(), ".gguf"


def mutants(tmp: Path, seed: int = SEED):
    rng = random.Random(seed)
    yield from dat_mutants(rng)
    yield from gguf_mutants(rng, tmp)


# -- the outcome of one mutant -----------------------------------------------------------------------------
def check(path: Path, measure: bool = True) -> str:
    """'ok' (a usable matrix) or 'error' (one ImatrixError naming the file); anything else raises."""
    try:
        if measure:
            tracemalloc.start()
        try:
            im = read_imatrix(path)
        finally:
            if measure:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                assert peak < MAX_BYTES, f"reading took {peak} bytes"
        assert isinstance(im, Imatrix)
        for name, v in im.values.items():
            assert v.dtype == np.float32 and v.ndim == 1 and np.isfinite(v).all(), name
        im.metadata()
        for name, ne in SHAPES.items():
            try:
                w = im.weights_for(name, ne)
            except ImatrixError as e:
                assert e.kind == "size" and e.tensor == name and e.file == str(path), e
                continue
            assert w is None or w.shape == (ne[0],)
    except ImatrixError as e:
        assert e.file == str(path) and str(e).startswith(f"{path}: "), str(e)
        return "error"
    return "ok"


def run_fuzz(tmp: Path, seed: int = SEED, on_cli=None) -> Counter:
    counts: Counter = Counter()
    assert check(GGUF, measure=False) == check(DAT, measure=False) == "ok"   # warm
    for i, (label, data, suffix) in enumerate(mutants(tmp, seed)):
        path = tmp / f"mutant{suffix}"
        path.write_bytes(data)
        try:
            outcome = check(path, measure="truncated" not in label)
        except Exception as e:  # noqa: BLE001 - the point: nothing but ImatrixError escapes
            raise AssertionError(f"mutant '{label}': {type(e).__name__}: {e}") from e
        counts[outcome] += 1
        if on_cli is not None and i % 25 == 0:
            on_cli(path, label)
    return counts


def test_imatrix_mutants_give_a_matrix_or_one_clean_error(tmp_path, run):
    out = tmp_path / "q.gguf"

    def cli(path, label):
        r = run("quantize", STORIES, out, "--type", "Q4_0", "--imatrix", path, "--force", "--quiet")
        assert "Traceback" not in r.stderr and "internal error" not in r.stderr, (label, r.stderr)
        if r.exit_code:
            lines = r.stderr.splitlines()
            assert r.exit_code == 1 and len(lines) == 1, (label, r.stderr)
            assert lines[0].startswith(f"Error: --imatrix {path}: "), (label, r.stderr)

    counts = run_fuzz(tmp_path, on_cli=cli)
    assert counts["ok"] > 20 and counts["error"] > 100, counts   # both outcomes are exercised


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        print(dict(run_fuzz(Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else SEED)))
