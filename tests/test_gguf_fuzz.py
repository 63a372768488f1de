"""A seeded mutation fuzz of GGUF files: truncations, byte flips, and counts, lengths, dims, type ids
and offsets set to lying values, hundreds of mutants of one small valid model. Every mutant must
give a correct result (it opens, every tensor reads back whole, a quantize of it writes a file
that reopens) or one clean GGToolError (`Error: ...` on the command line), never another
exception, and never more than a few MB of memory (tracemalloc: lying counts fail before
anything is allocated for them).

`python tests/test_gguf_fuzz.py [SEED]` prints the count of mutants per outcome class."""

from __future__ import annotations

import random
import struct
import sys
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ggtool import quant as Q  # noqa: E402
from ggtool import quantize_model as QM  # noqa: E402
from ggtool.errors import GGToolError  # noqa: E402
from ggtool.gguf_io import GGUFFile  # noqa: E402

SEED = 19
MAX_BYTES = 4 << 20          # the most memory one mutant may take (the model is 1.5 KB)
LIES = (0, 7, 2**24, 2**27, 2**32, 2**63, 2**64 - 32, 2**64 - 1)   # and the file size (+1), the real value +-1


class _Model:
    """A small valid GGUF built field by field, remembering where each count, length, dim, type
    id and offset is (offset, width, label), and where each region starts."""

    def __init__(self):
        self.b = bytearray()
        self.fields: list[tuple[int, int, str]] = []
        self.bounds: list[int] = []

    def u(self, fmt: str, v, label: str | None = None):
        if label:
            self.fields.append((len(self.b), struct.calcsize(fmt), label))
        self.b += struct.pack(fmt, v)

    def s(self, text: bytes, label: str):
        self.u("<Q", len(text), f"{label} length")
        self.b += text


def build(alignment_key: bool = True) -> tuple[bytes, list[tuple[int, int, str]], list[int]]:
    """The model, with or without a general.alignment key (gguf-py's reader takes different paths)."""
    m = _Model()
    kvs = [(b"general.architecture", 8, b"llama"), (b"general.name", 8, b"fuzz"),
           (b"llama.block_count", 4, 1), (b"llama.attention.layer_norm_rms_epsilon", 6, 1e-5),
           (b"tokenizer.ggml.tokens", 9, (8, [b"<s>", b"a", b"bc", b"", b"\xc3\xa9"])),
           (b"tokenizer.ggml.scores", 9, (6, [0.5, -1.0, 2.0, 0.0, 3.5])),
           (b"tokenizer.ggml.add_bos_token", 7, True)] + ([(b"general.alignment", 4, 32)] if alignment_key else [])
    rng = np.random.default_rng(SEED)
    w32 = rng.standard_normal((2, 32)).astype(np.float32)
    tensors = [(b"token_embd.weight", [32, 4], 0, rng.standard_normal((4, 32)).astype(np.float32).tobytes()),
               (b"blk.0.attn_q.weight", [32, 2], 1, w32.astype(np.float16).tobytes()),
               (b"blk.0.ffn_up.weight", [32, 2], 8, Q.quantize_q8_0(w32).tobytes()),
               (b"blk.0.ffn_down.weight", [33, 2], 0, rng.standard_normal((2, 33)).astype(np.float32).tobytes()),
               (b"output_norm.weight", [32], 0, np.ones(32, np.float32).tobytes())]
    m.b += b"GGUF"
    m.u("<I", 3, "version")
    m.u("<Q", len(tensors), "n_tensors")
    m.u("<Q", len(kvs), "n_kv")
    for key, vtype, value in kvs:
        m.bounds.append(len(m.b))
        m.s(key, "key")
        m.u("<I", vtype, "value type")
        if vtype == 8:
            m.s(value, "string")
        elif vtype == 9:
            itype, items = value
            m.u("<I", itype, "item type")
            m.u("<Q", len(items), "array count")
            for it in items:
                if itype == 8:
                    m.s(it, "item")
                else:
                    m.u("<f", it)
        else:
            m.u({4: "<I", 6: "<f", 7: "<?"}[vtype], value)
    offset = 0
    for name, ne, ggml_type, data in tensors:
        m.bounds.append(len(m.b))
        m.s(name, "tensor name")
        m.u("<I", len(ne), "n_dims")
        for d in ne:
            m.u("<Q", d, "dim")
        m.u("<I", ggml_type, "type id")
        m.u("<Q", offset, "data offset")
        offset += -(-len(data) // 32) * 32
    m.b += b"\0" * (-len(m.b) % 32)
    for _, _, _, data in tensors:
        m.bounds.append(len(m.b))
        m.b += data + b"\0" * (-len(data) % 32)
    m.bounds.append(len(m.b))
    return bytes(m.b), m.fields, m.bounds


def mutants(seed: int = SEED):
    """(label, bytes) of every mutant of both models: truncations, lying fields, byte flips."""
    rng = random.Random(seed)
    yield from _mutants(rng, *build(True))
    # without the key, the tensor infos again (gguf-py's reader sums offsets differently then)
    for label, data in _mutants(rng, *build(False), only=_TENSOR_FIELDS, flips=50):
        yield f"{label} (no general.alignment)", data


_TENSOR_FIELDS = ("n_tensors", "tensor name length", "n_dims", "dim", "type id", "data offset")


def _mutants(rng: random.Random, base: bytes, fields, bounds, only=None, flips: int = 150):
    header_end = bounds[len(bounds) - 6]               # the data section starts after the tensor infos
    cuts = {c + d for c in bounds for d in (-1, 0, 1)} | {rng.randrange(len(base)) for _ in range(40)}
    for c in sorted(x for x in cuts if 0 <= x < len(base)):
        yield f"truncated at {c}", base[:c]
    for at, width, label in fields:
        if only is not None and label not in only:
            continue
        real = int.from_bytes(base[at:at + width], "little")
        for v in {*LIES, len(base), len(base) + 1, real + 1, max(real - 1, 0), rng.getrandbits(8 * width)}:
            v &= (1 << 8 * width) - 1
            if v != real:
                yield f"{label} at {at} = {v}", base[:at] + v.to_bytes(width, "little") + base[at + width:]
    for _ in range(flips):
        at = rng.randrange(4, header_end)
        flip = bytearray(base)
        flip[at] ^= 1 << rng.randrange(8) if rng.random() < 0.5 else rng.randrange(1, 256)
        yield f"byte {at} flipped", bytes(flip)


def _open_measured(path: Path, measure: bool) -> GGUFFile:
    """GGUFFile(path), failing if parsing the header took more than MAX_BYTES (traced for lying
    fields and flipped bytes, and only while opening: tracing all would make the fuzz 4x slower;
    a truncation leaves every count as it was)."""
    if not measure:
        return GGUFFile(path)
    tracemalloc.start()
    try:
        return GGUFFile(path)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < MAX_BYTES, f"opening took {peak} bytes"


def check(path: Path, quantize_to: Path | None = None, measure: bool = True) -> str:
    """'ok' (a correct result) or 'error' (one GGToolError); anything else raises."""
    try:
        g = _open_measured(path, measure)
        for k in g.keys():
            g.metadata(k)
        size = path.stat().st_size
        for name, info in g.tensors.items():
            raw = np.asarray(g.array(name))
            assert raw.nbytes == info.n_bytes and g.data_offset <= info.offset <= size - info.n_bytes, name
            vals = Q.dequantize(raw, info.type)
            assert vals.size == info.n_elements, name
        if quantize_to is not None:
            QM.quantize_file(path, quantize_to, QM.QuantizeOptions(threads=1, allow_requantize=True), force=True)
            assert set(GGUFFile(quantize_to).tensors) == set(g.tensors)
    except GGToolError:
        return "error"
    return "ok"


def run_fuzz(tmp: Path, seed: int = SEED, on_cli=None) -> Counter:
    """Count of outcomes; raises on a bad one (naming the mutant). on_cli(path) runs the command
    line on some mutants."""
    counts: Counter = Counter()
    path, out = tmp / "m.gguf", tmp / "q.gguf"
    path.write_bytes(build()[0])
    assert check(path, out) == "ok"          # warm: what loads on first use is not the mutants' memory
    for i, (label, data) in enumerate(mutants(seed)):
        path.write_bytes(data)
        try:
            outcome = check(path, out if i % 25 == 0 else None, measure=not label.startswith("truncated"))
        except Exception as e:  # noqa: BLE001 - the point: nothing but GGToolError escapes
            raise AssertionError(f"mutant '{label}': {type(e).__name__}: {e}") from e
        counts[outcome] += 1
        if on_cli is not None and i % 20 == 0:
            on_cli(path, label)
    return counts


def test_gguf_mutants_give_a_result_or_one_clean_error(tmp_path, run):
    def cli(path, label):
        r = run("inspect", path, "--stats")
        assert "Traceback" not in r.stderr, label
        if r.exit_code:
            lines = r.stderr.splitlines()
            assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), (label, r.stderr)
            assert "internal error" not in r.stderr, (label, r.stderr)

    counts = run_fuzz(tmp_path, on_cli=cli)
    assert sum(counts.values()) >= 1200 and counts["ok"] >= 100 and counts["error"] >= 1000, counts


def test_the_unmutated_model_is_read_right(tmp_path):
    base, fields, _ = build()
    p = tmp_path / "m.gguf"
    p.write_bytes(base)
    g = GGUFFile(p)
    assert g.metadata("tokenizer.ggml.tokens") == ["<s>", "a", "bc", "", "é"]
    assert list(g.tensors) == ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_up.weight",
                               "blk.0.ffn_down.weight", "output_norm.weight"]
    assert check(p, tmp_path / "q.gguf") == "ok"
    assert len(fields) > 40



def _strings_by_hand(buf: bytes, p: int, n: int) -> tuple[list[int], list[int]] | None:
    """The n strings at p as GGUF stores them (u64 length, bytes), read one by one; None past the end."""
    starts, lens = [], []
    for _ in range(n):
        if p + 8 > len(buf):
            return None
        (ln,) = struct.unpack_from("<Q", buf, p)
        starts.append(p)
        lens.append(ln)
        p += 8 + ln
    return (starts, lens) if p <= len(buf) else None


@pytest.mark.parametrize("piece", [None, 64])
def test_string_arrays_are_walked_as_their_lengths_say(monkeypatch, piece):
    """A string array's items are found with numpy (reader._short_strings: starts are followed by 7
    zero bytes) where a Python walk took ~40 ms for a 262,144-token vocabulary; whatever the
    strings hold (empty ones, which look like starts one byte early; NUL bytes; lengths of 256 and
    more; runs of empties past the jumps it takes; a file cut short) the result is the walk's,
    also where the scan goes in pieces of a few strings (`piece`: chains that cross pieces)."""
    from ggtool.errors import InputError
    from ggtool.gguf_io import reader

    if piece:
        monkeypatch.setattr(reader, "_SCAN_BYTES", piece)

    rng = np.random.default_rng(SEED)
    fast = 0
    for trial in range(600):
        kind = trial % 6
        n = int(rng.integers(1, 3 * reader._MAX_JUMPS if kind == 4 else 40))
        b = bytearray(rng.integers(0, 256, int(rng.integers(0, 16)), dtype=np.uint8).tobytes())
        p = len(b)
        for _ in range(n):
            length = {0: lambda: int(rng.integers(1, 12)), 1: lambda: int(rng.choice([0, 0, 1, 5, 300])),
                      2: lambda: int(rng.integers(0, 600)), 4: lambda: 0}.get(kind, lambda: int(rng.integers(0, 30)))()
            data = rng.integers(0, 256, length, dtype=np.uint8)
            if kind == 3:
                data[rng.random(length) < 0.5] = 0
            b += struct.pack("<Q", length) + data.tobytes()
        b += rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8).tobytes()
        if kind == 5:
            b = b[:int(rng.integers(p + 8 * n, len(b) + 1))]     # the caller has checked n prefixes fit
        buf = bytes(b)
        want = _strings_by_hand(buf, p, n)
        if want is None or max(want[1]) > reader.MAX_STRING:
            with pytest.raises(InputError, match="string"):
                reader._walk_strings(memoryview(buf), p, n, len(buf), "x")
            continue
        starts, lens = reader._walk_strings(memoryview(buf), p, n, len(buf), "x")
        assert starts.tolist() == want[0] and lens.tolist() == want[1], (trial, kind)
        fast += reader._short_strings(np.frombuffer(buf, np.uint8), p, n, len(buf)) is not None
    # a vocabulary's strings (short, non-empty, empty now and then) are found by the numpy scan
    tokens = ([b"<s>", b"", b"ab", b"\xc3\xa9", b"x" * 255] + [b"tok"] * 45) * 20
    vocab = b"".join(struct.pack("<Q", len(t)) + t for t in tokens)
    got = reader._short_strings(np.frombuffer(vocab, np.uint8), 0, len(tokens), len(vocab))
    assert got is not None and got[1].tolist() == [len(t) for t in tokens]
    assert fast >= 150, fast



def test_a_hostile_string_array_costs_bounded_memory():
    """16 MB of zeros read as 2,000,000 empty strings: every byte looks like a string's start, which
    the numpy scan would hold as int64s many times over (~0.5 GB); it reads in pieces of
    _SCAN_BYTES and gives up early (too many false starts), and the walk gives the strings."""
    from ggtool.gguf_io import reader

    n = 2_000_000
    buf = bytes(8 * n + 64)
    tracemalloc.start()
    try:
        assert reader._short_strings(np.frombuffer(buf, np.uint8), 0, n, len(buf)) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 48 * reader._SCAN_BYTES, peak
    starts, lens = reader._walk_strings(memoryview(buf), 0, n, len(buf), "x")
    assert starts[-1] == 8 * (n - 1) and not lens.any()


if __name__ == "__main__":
    import tempfile
    import time

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        c = run_fuzz(Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else SEED)
    print(f"{sum(c.values())} mutants: {c['ok']} ok, {c['error']} clean errors, 0 bad "
          f"({time.perf_counter() - t0:.1f} s)")
