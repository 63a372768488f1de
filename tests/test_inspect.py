"""`ggtool inspect` and `ggtool compare`, and the fast GGUF metadata reader behind them."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import write_gguf

from ggtool.gguf_io import GGUFFile

ROOT = Path(__file__).resolve().parent.parent
STORIES = ROOT / "fixtures" / "stories260K.gguf"
TINY = ROOT / "fixtures" / "llama-2-tiny-random.gguf"



def _ti_offset(path, name: str) -> int:
    """Byte offset of a tensor info (its name length field) in the file."""
    r = gguf.GGUFReader(str(path))
    return next(t.field.offset for t in r.tensors if t.name == name)


# ------------------------------------------------------------------------------- reader (fast open)

@pytest.mark.parametrize("path", [STORIES, TINY])
def test_fast_reader_matches_gguf_py(path):
    f = GGUFFile(path)
    r = gguf.GGUFReader(str(path))
    for k in f.keys():  # noqa: SIM118 - GGUFFile.keys(), not a dict
        assert f.metadata(k) == r.fields[k].contents(), k
        if r.fields[k].types[0] == gguf.GGUFValueType.ARRAY:
            fa, fb = f.reader.fields[k], r.fields[k]
            assert f.array_len(k) == len(fb.data)
            assert list(fa.data) == list(fb.data)
            for i in (0, 1, len(fb.data) - 1):
                assert fa.contents(i) == fb.contents(i)
                assert bytes(fa.parts[fa.data[i]]) == bytes(fb.parts[fb.data[i]])
            assert fa.contents(slice(3, 9, 2)) == fb.contents(slice(3, 9, 2))
    assert [t.name for t in f.reader.tensors] == [t.name for t in r.tensors]


def test_string_arrays_with_long_items(tmp_path):
    # lengths of 256+ bytes take the exact (u64) walk; mixed with short, empty and non-ASCII items
    items = ["a", "", "é" * 200, "x" * 70000, "tail", "ü"]
    p = write_gguf(tmp_path / "s.gguf", {"w": np.zeros(4, np.float32)}, arch="llama",
                   kv={"test.strings": items, "test.short": ["a", "bc", ""], "test.ints": [1, 2, 3]})
    f = GGUFFile(p)
    r = gguf.GGUFReader(str(p))
    for k in ("test.strings", "test.short", "test.ints"):
        assert f.metadata(k) == r.fields[k].contents(), k
    assert f.metadata("test.strings") == items
    assert f.reader.fields["test.strings"].contents(3) == "x" * 70000
    assert GGUFFile(p).tensors["w"].ne == (4,)


def test_big_vocabulary_opens_fast():
    t0 = time.perf_counter()
    f = GGUFFile(TINY)          # 32,000 tokens: gguf-py's reader needs ~1.6 s here
    dt = time.perf_counter() - t0
    assert dt < 0.5, dt
    assert f.array_len("tokenizer.ggml.tokens") == 32000
    assert f.metadata("tokenizer.ggml.tokens")[31999] == gguf.GGUFReader(str(TINY)).fields[
        "tokenizer.ggml.tokens"].contents(31999)


def test_kv_spans_are_raw_metadata(tmp_path):
    f = GGUFFile(STORIES)
    spans = f.reader.kv_spans
    assert list(spans) == f.keys()
    raw = bytes(f.reader.data[spans["general.name"][0]:spans["general.name"][1]])
    assert raw == struct.pack("<Q", 12) + b"general.name" + struct.pack("<IQ", 8, 5) + b"llama"


# ------------------------------------------------------------------------------------------ inspect

def test_inspect_text(run):
    r = run("inspect", STORIES)
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert out.startswith("fixtures/stories260K.gguf: GGUF v3, 19 metadata keys, 48 tensors, alignment 32") or \
        "GGUF v3, 19 metadata keys, 48 tensors" in out.splitlines()[0]
    assert 'tokenizer.ggml.tokens' in out and '... (512 items)]' in out
    assert 'llama.attention.layer_norm_rms_epsilon  FLOAT32         1e-05' in out
    assert "token_embd.weight" in out and "offset" in out
    assert "total: 48 tensors, 292,800 elements, 1,171,200 bytes" in out
    assert r.stderr == ""


def test_inspect_json_stable_keys(run):
    r = run("inspect", TINY, "--json")
    assert r.exit_code == 0 and r.stdout.endswith("}\n")
    d = json.loads(r.stdout)
    assert list(d) == ["file", "version", "alignment", "data_offset", "file_size", "n_kv", "n_tensors",
                       "metadata", "tensors", "totals"]
    tok = next(m for m in d["metadata"] if m["key"] == "tokenizer.ggml.tokens")
    assert tok["type"] == "ARRAY[STRING]" and tok["count"] == 32000 and len(tok["value"]) == 8 and tok["truncated"]
    t0 = d["tensors"][0]
    assert list(t0) == ["name", "type", "ne", "bytes", "bpw", "offset"]
    assert t0["type"] == "f16" and t0["bpw"] == 16.0
    assert d["totals"]["by_type"]["f16"]["tensors"] == 9
    full = json.loads(run("inspect", TINY, "--json", "--full").stdout)
    tok = next(m for m in full["metadata"] if m["key"] == "tokenizer.ggml.tokens")
    assert len(tok["value"]) == 32000 and "truncated" not in tok


def test_inspect_diffable_has_no_offsets_and_diffs_clean(run, tmp_path):
    r = run("inspect", STORIES, "--diffable")
    assert r.exit_code == 0
    assert "offset" not in r.stdout and "file size" not in r.stdout
    copy = tmp_path / "copy.gguf"
    # same content, different order and alignment: identical diffable output
    run("quantize", STORIES, tmp_path / "q.gguf", "-q", "-t", "1")
    a = json.loads(run("inspect", STORIES, "--diffable", "--json").stdout)
    b = json.loads(run("inspect", tmp_path / "q.gguf", "--diffable", "--json").stdout)
    assert [t["name"] for t in a["tensors"]] == [t["name"] for t in b["tensors"]]
    assert "offset" not in a["tensors"][0] and "data_offset" not in a
    copy.write_bytes(STORIES.read_bytes())
    assert run("inspect", copy, "--diffable").stdout.splitlines()[1:] == r.stdout.splitlines()[1:]


def test_inspect_stats(run, tmp_path):
    x = np.arange(64 * 4, dtype=np.float32).reshape(4, 64) - 100
    p = write_gguf(tmp_path / "s.gguf", {"w": x})
    d = json.loads(run("inspect", p, "--stats", "--json").stdout)
    s = d["tensors"][0]["stats"]
    assert s["min"] == -100 and s["max"] == 155 and s["mean"] == pytest.approx(x.mean())
    assert s["std"] == pytest.approx(x.std()) and s["nonfinite"] == 0
    out = run("inspect", STORIES, "--stats").stdout
    assert "mean" in out and "std" in out


def test_inspect_long_string_shortened(run, tmp_path):
    p = write_gguf(tmp_path / "s.gguf", {"w": np.zeros(4, np.float32)}, arch="llama", kv={"tokenizer.chat_template": "x" * 500})
    out = run("inspect", p).stdout
    assert '..." (500 chars)' in out and "x" * 61 not in out
    assert "x" * 500 in run("inspect", p, "--full").stdout


# ------------------------------------------------------------------------------------ bad files

def test_truncated_file(run, tmp_path):
    data = STORIES.read_bytes()
    p = tmp_path / "t.gguf"
    p.write_bytes(data[:600_000])
    r = run("inspect", p)
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    assert "truncated" in r.stderr and r.stderr.startswith("Error: ")
    p.write_bytes(data[:5000])        # inside the metadata
    r = run("inspect", p)
    assert r.exit_code == 1 and r.stderr.startswith("Error: ") and len(r.stderr.splitlines()) == 1


def test_lying_offset(run, tmp_path):
    p = write_gguf(tmp_path / "l.gguf", {"a": np.zeros(32, np.float32), "b": np.ones(32, np.float32)})
    data = bytearray(p.read_bytes())
    off = _ti_offset(p, "b")
    # name len (8) + name (1) + n_dims (4) + dims (8) + type (4) -> offset u64
    pos = off + 8 + 1 + 4 + 8 + 4
    data[pos:pos + 8] = struct.pack("<Q", 1 << 20)
    p.write_bytes(bytes(data))
    r = run("inspect", p)
    assert r.exit_code == 1 and "tensor 'b'" in r.stderr and "offsets lie" in r.stderr


def test_unknown_type_id(run, tmp_path):
    p = write_gguf(tmp_path / "u.gguf", {"a": np.zeros(32, np.float32)})
    data = bytearray(p.read_bytes())
    pos = _ti_offset(p, "a") + 8 + 1 + 4 + 8
    data[pos:pos + 4] = struct.pack("<I", 77)
    p.write_bytes(bytes(data))
    r = run("inspect", p)
    assert r.exit_code == 1 and "unknown or removed GGML type id 77" in r.stderr
    data[pos:pos + 4] = struct.pack("<I", 4)    # Q4_2: removed
    p.write_bytes(bytes(data))
    assert "type id 4" in run("inspect", p).stderr


def test_not_gguf(run, tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"FUGG" + b"\0" * 100)
    r = run("inspect", p)
    assert r.exit_code == 1 and "not a GGUF file" in r.stderr


# ------------------------------------------------------------------------------------------ compare

def test_compare_quantized_model(run, tmp_path):
    q = tmp_path / "q.gguf"
    assert run("quantize", STORIES, q, "-q", "-t", "1").exit_code == 0
    r = run("compare", STORIES, q)
    assert r.exit_code == 0, r.output
    assert "48 tensors compared (11 identical), 0 only in A, 0 only in B" in r.stdout
    d = json.loads(run("compare", STORIES, q, "--json").stdout)
    rows = {t["name"]: t for t in d["tensors"]}
    qk = rows["blk.0.attn_q.weight"]
    assert qk["type_a"] == "f32" and qk["type_b"] == "q4_0"
    assert 1e-4 < qk["nmse"] < 3e-2 and qk["rel_rms"] == pytest.approx(qk["nmse"] ** 0.5)
    assert rows["output.weight"]["type_b"] == "q8_0" and rows["output.weight"]["nmse"] < 1e-4
    assert rows["output_norm.weight"]["identical"] and rows["output_norm.weight"]["nmse"] == 0
    # check one value by hand
    src = {t.name: t for t in gguf.GGUFReader(str(STORIES)).tensors}
    dst = {t.name: t for t in gguf.GGUFReader(str(q)).tensors}
    a = np.asarray(src["blk.0.attn_q.weight"].data, np.float64)
    b = gguf.quants.dequantize(np.asarray(dst["blk.0.attn_q.weight"].data), gguf.GGMLQuantizationType.Q4_0)
    assert qk["nmse"] == pytest.approx(((b - a) ** 2).sum() / (a ** 2).sum(), rel=1e-9)
    assert qk["max_abs_error"] == pytest.approx(np.abs(b - a).max())


def test_compare_tensor_and_npy(run, tmp_path, npy):
    src = {t.name: t for t in gguf.GGUFReader(str(STORIES)).tensors}
    x = np.asarray(src["output.weight"].data, np.float32)
    p = npy(x + 0.5, "o.npy")
    d = json.loads(run("compare", f"{STORIES}:output.weight", p, "--json").stdout)
    assert d["tensors"][0]["max_abs_error"] == pytest.approx(0.5)
    r = run("compare", f"{STORIES}:output.weight", f"{STORIES}:blk.0.attn_q.weight")
    assert r.exit_code == 0 and "shapes differ" in r.stdout
    r = run("compare", f"{STORIES}:nope", p)
    assert r.exit_code == 1 and "no tensor named 'nope'" in r.stderr


def test_compare_only_in_one(run, tmp_path):
    a = write_gguf(tmp_path / "a.gguf", {"x": np.ones(32, np.float32), "y": np.ones(32, np.float32)})
    b = write_gguf(tmp_path / "b.gguf", {"x": np.ones(32, np.float32), "z": np.ones(32, np.float32)})
    r = run("compare", a, b)
    assert "1 tensors compared (1 identical), 1 only in A, 1 only in B" in r.stdout
    assert "only in A: y" in r.stdout and "only in B: z" in r.stdout


def test_gguf_v1_is_refused_clearly(run, tmp_path):
    p = tmp_path / "v1.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<I", 1) + b"\0" * 64)
    r = run("inspect", p)
    assert r.exit_code == 1 and "GGUF version 1 is not supported" in r.stderr


def _overflowed_pair(tmp_path):
    """(a, b): what ggtool quantize wrote before it checked f16 overflow: 70000 in 'w' became inf."""
    x = np.ones((2, 33), np.float32)
    x[1, 5] = 70000
    a = write_gguf(tmp_path / "a.gguf", {"w": x, "v": np.ones(32, np.float32)})
    with np.errstate(over="ignore"):
        b = write_gguf(tmp_path / "b.gguf", {"w": x.astype(np.float16), "v": np.ones(32, np.float32)})
    return a, b


def test_compare_reports_non_finite_values_never_nmse_0(run, tmp_path):
    a, b = _overflowed_pair(tmp_path)
    out = run("compare", a, b).stdout
    assert "overall: nmse inf, max abs error inf, rel rms inf" in out
    assert "non-finite values: 0 in A, 1 in B (w)" in out
    d = json.loads(run("compare", a, b, "--json").stdout)
    w = d["tensors"][0]
    assert w["nmse"] == "Infinity" and w["nonfinite"] == 1 and w["nonfinite_b"] == 1 and not w["identical"]
    assert d["summary"]["nmse"] == "Infinity" and d["summary"]["nonfinite"] == 1
    assert d["tensors"][1]["identical"] and d["tensors"][1]["nmse"] == 0


def test_compare_same_inf_on_both_sides_is_no_error(run, tmp_path):
    x = np.ones(32, np.float32)
    x[3] = np.inf
    y = x.copy()
    y[0] = 2
    a = write_gguf(tmp_path / "a.gguf", {"w": x})
    b = write_gguf(tmp_path / "b.gguf", {"w": y})
    d = json.loads(run("compare", a, b, "--json").stdout)
    w = d["tensors"][0]
    assert w["nonfinite_a"] == 1 and w["nonfinite_b"] == 1
    assert w["max_abs_error"] == 1 and w["nmse"] == pytest.approx(1 / 31)
    assert "non-finite values: 1 in A, 1 in B (w)" in run("compare", a, b).stdout


def test_inspect_stats_counts_non_finite_values(run, tmp_path):
    x = np.ones(32, np.float32)
    x[[3, 9]] = [np.inf, np.nan]
    p = write_gguf(tmp_path / "s.gguf", {"w": x, "v": np.ones(32, np.float32)})
    out = run("inspect", p, "--stats").stdout
    assert "nonfinite" in out.splitlines()[7]
    assert "non-finite values (inf, NaN): 2, left out of min/max/mean/std" in out
    assert "nonfinite" not in run("inspect", STORIES, "--stats").stdout


def test_compare_max_nmse_is_a_quality_gate(run, tmp_path):
    """--max-nmse X: exit 0 when every tensor is within X, else exit 1 with one line naming how many
    and the worst; the report is printed either way."""
    q = tmp_path / "q.gguf"
    assert run("quantize", STORIES, q, "--quiet").exit_code == 0
    passed = run("compare", STORIES, q, "--max-nmse", "0.01")
    assert passed.exit_code == 0 and "48 tensors compared" in passed.stdout and passed.stderr == ""
    failed = run("compare", STORIES, q, "--max-nmse", "0.001")
    assert failed.exit_code == 1 and "48 tensors compared" in failed.stdout
    assert failed.stderr.splitlines() == [
        "Error: 31 of 48 tensors fail --max-nmse 0.001 (worst: 'blk.0.attn_v.weight', nmse 0.00922038)"]
    assert run("compare", STORIES, STORIES, "--max-nmse", "0").exit_code == 0   # identical files
    nan = run("compare", STORIES, q, "--max-nmse", "nan")    # would pass everything
    assert nan.exit_code == 2 and "a bound of NaN would pass every tensor" in nan.stderr


def test_compare_max_nmse_counts_non_finite_and_mismatched_shapes_as_worse(run, tmp_path):
    a, b = _overflowed_pair(tmp_path)
    r = run("compare", a, b, "--max-nmse", "1e30")
    assert r.exit_code == 1 and "1 of 2 tensors fail --max-nmse 1e+30 (worst: 'w', nmse inf)" in r.stderr
    c = write_gguf(tmp_path / "c.gguf", {"w": np.ones((3, 33), np.float32), "v": np.ones(32, np.float32)})
    r = run("compare", a, c, "--max-nmse", "1e30")
    assert r.exit_code == 1 and "(worst: 'w', shapes differ)" in r.stderr


def test_inspect_only_filters_keys_and_tensors(run):
    out = run("inspect", STORIES, "--only", r"^blk\.0\.attn_[qk]\.|rope").stdout
    assert "metadata (1 of 19):\n  llama.rope.dimension_count  UINT32  8\n" in out
    assert "tensors (2 of 48):" in out and "blk.0.attn_q.weight" in out and "blk.0.attn_k.weight" in out
    assert "blk.0.attn_v.weight" not in out and "blk.1.attn_q.weight" not in out
    assert "total: 2 tensors, 6,144 elements" in out
    d = json.loads(run("inspect", STORIES, "--only", "^output", "--json").stdout)
    assert [t["name"] for t in d["tensors"]] == ["output_norm.weight", "output.weight"]
    assert d["metadata"] == [] and d["n_tensors"] == 48 and d["totals"]["tensors"] == 2
    bad = run("inspect", STORIES, "--only", "(")
    assert bad.exit_code == 2 and "'(' is not a regular expression" in bad.stderr
