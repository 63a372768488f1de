"""The GGUF reader distrusts the file: lying counts fail before anything is allocated, offsets cannot
wrap, GGML's limits hold on read, and strings that are not UTF-8 are shown escaped."""

from __future__ import annotations

import json
import struct
import tracemalloc

import numpy as np
import pytest
from conftest import STORIES, fails, ok, write_gguf
from gguf_craft import ARRAY, STRING, f32_model, gguf, gstr, kv, kv_str, kv_u32, tensor_info

from ggtool.errors import InputError
from ggtool.gguf_io import GGUFFile
from ggtool.gguf_io.format import EscapedText, decode_text, encode_text

ARCH = kv_str("general.architecture", "llama")


def _write(tmp_path, data: bytes, name: str = "m.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


# ------------------------------------------------------------------------------------ offsets wrap

def test_offset_that_wraps_around_2_64_is_refused(run, tmp_path):
    # 2^64-32 + the data offset wraps (as uint64) to 32 bytes before the data: the header's bytes
    p = _write(tmp_path, gguf([ARCH], [tensor_info("w", [8], 0, 2**64 - 32)], np.arange(8, dtype=np.float32).tobytes()))
    fails(run("inspect", p), "tensor 'w'", "offsets lie")
    out = tmp_path / "q.gguf"
    fails(run("quantize", p, out), "tensor 'w'")
    assert not out.exists()


# ----------------------------------------------------------------------- lying counts, before allocating

LYING_COUNTS = {
    # a 224-byte file declaring a 2^27-item string array (reading it item by item would take 2.1 GB)
    "string array of 2^27": gguf([kv("tok", ARRAY, struct.pack("<IQ", STRING, 2**27))]),
    "u32 array of 2^62": gguf([kv("a", ARRAY, struct.pack("<IQ", 4, 2**62))]),
    "2^64-1 metadata keys": gguf([ARCH], n_kv=2**64 - 1),
    "2^63 tensors": gguf([ARCH], n_tensors=2**63),
    "string of 2^63 bytes": gguf([kv("s", STRING, struct.pack("<Q", 2**63))]),
    "key of 2^32 bytes": gguf([struct.pack("<Q", 2**32) + b"k"]),
    "tensor name of 2^40 bytes": gguf([ARCH], [struct.pack("<Q", 2**40)]),
    "dims 2^32 x 2^32 (int64 product 0)": gguf([ARCH], [tensor_info("w", [2**32, 2**32])]),
    "dim of 2^64-1": gguf([ARCH], [tensor_info("w", [2**64 - 1])]),
}


@pytest.mark.parametrize("case", list(LYING_COUNTS))
def test_lying_counts_fail_before_allocating(tmp_path, case):
    data = LYING_COUNTS[case]
    p = _write(tmp_path, data + b"\0" * max(0, 224 - len(data)))

    def open_it():
        with pytest.raises(InputError) as e:
            GGUFFile(p)
        assert str(e.value).startswith(f"{p}: ")

    assert _peak_bytes(open_it) < 2 << 20


def test_lying_count_is_one_clean_error(run, tmp_path):
    p = _write(tmp_path, LYING_COUNTS["string array of 2^27"] + b"\0" * 160)
    fails(run("inspect", p), "metadata 'tok' declares 134217728 items")


# --------------------------------------------------------------------------------- GGML's limits

def test_five_dimensions_are_refused(run, tmp_path):
    p = _write(tmp_path, gguf([ARCH], [tensor_info("blk.0.attn_q.weight", [32, 2, 1, 1, 1])], bytes(256)))
    fails(run("inspect", p), "'blk.0.attn_q.weight' has 5 dimensions", "at most 4")
    out = tmp_path / "q.gguf"
    fails(run("quantize", p, out), "5 dimensions")
    assert not out.exists()


def test_tensor_name_of_64_bytes_or_more_is_refused(run, tmp_path):
    ok_name, long_name = "a" * 63, "a" * 93 + ".weight"
    p = _write(tmp_path, gguf([ARCH], [tensor_info(ok_name, [32], 0, 0)], bytes(128)))
    assert ok_name in ok(run("inspect", p))
    p = _write(tmp_path, gguf([ARCH], [tensor_info(long_name, [32, 2])], bytes(256)))
    fails(run("inspect", p), "is 100 bytes long", "at most 63")
    fails(run("quantize", p, tmp_path / "q.gguf"), "100 bytes long")


def test_duplicate_tensor_name_is_refused(run, tmp_path):
    p = _write(tmp_path, gguf([ARCH], [tensor_info("w", [32], 0, 0), tensor_info("w", [32], 0, 128)], bytes(256)))
    fails(run("inspect", p), "tensor name 'w' is used twice")


def test_duplicate_and_empty_metadata_keys_are_refused(run, tmp_path):
    p = _write(tmp_path, gguf([ARCH, kv_str("general.architecture", "x")]))
    fails(run("inspect", p), "metadata key 'general.architecture'", "appears twice")
    p = _write(tmp_path, gguf([ARCH, kv_str("", "x")]))
    fails(run("inspect", p), "metadata key 1", "is empty")


@pytest.mark.parametrize("align, message", [(48, "48 is not a power of two"), (0, "0 is not a power of two")])
def test_alignment_must_be_a_power_of_two(run, tmp_path, align, message):
    p = _write(tmp_path, gguf([ARCH, kv_u32("general.alignment", align)], [tensor_info("w", [32])], bytes(128)))
    fails(run("inspect", p), message)


def test_alignment_must_be_a_uint32(run, tmp_path):
    p = _write(tmp_path, gguf([ARCH, kv_str("general.alignment", "32")]))
    fails(run("inspect", p), "general.alignment must be a UINT32, not STRING")


def test_huge_alignment_puts_the_data_past_the_end(run, tmp_path):
    p = _write(tmp_path, gguf([ARCH, kv_u32("general.alignment", 2**31)], [tensor_info("w", [32])], bytes(128)))
    fails(run("inspect", p), "would start at byte 2147483648", "past the end")


def test_array_of_arrays_is_refused(run, tmp_path):
    inner = struct.pack("<IQ", 4, 1) + struct.pack("<I", 7)
    p = _write(tmp_path, gguf([ARCH, kv("nested", ARRAY, struct.pack("<IQ", ARRAY, 1) + inner)]))
    fails(run("inspect", p), "'nested' is an array of arrays")


def test_unknown_value_type_is_named(run, tmp_path):
    p = _write(tmp_path, gguf([ARCH, kv("odd", 99, b"\0" * 8)]))
    fails(run("inspect", p), "metadata 'odd'", "unknown value type 99")


def test_tensor_data_out_of_ggml_order_is_refused(run, tmp_path):
    # two tensors whose offsets point at each other's data: inside the file, but not where GGML
    # puts them (each right after the one before, padded); gguf.cpp refuses such a file
    a, b = np.zeros(32, np.float32).tobytes(), np.ones(32, np.float32).tobytes()
    p = _write(tmp_path, gguf([ARCH], [tensor_info("a", [32], 0, 128), tensor_info("b", [32], 0, 0)], b + a))
    fails(run("inspect", p), "tensor 'a': data offset 128, but GGML expects 0")


def test_a_file_gguf_py_writes_still_reads_the_same(tmp_path):
    p = _write(tmp_path, f32_model(("a", "b", "c"), n=40))
    g = GGUFFile(p)
    assert list(g.tensors) == ["a", "b", "c"]
    assert np.array_equal(g.array("c"), np.arange(2, 42, dtype=np.float32))


# ----------------------------------------------------------------------------------- not UTF-8

def test_non_utf8_metadata_is_shown_escaped(run, tmp_path):
    p = _write(tmp_path, gguf([ARCH, kv_str("general.name", b"\xff\xfe\x80"),
                               kv("tags", ARRAY, struct.pack("<IQ", STRING, 2) + gstr(b"ok") + gstr(b"a\xffb")),
                               kv_str("real.backslash", "\\xff")],
                              [tensor_info("w", [32])], bytes(128)))
    out = ok(run("inspect", p))
    assert 'general.name          STRING         "\\xff\\xfe\\x80"' in out
    assert '["ok", "a\\xffb"]' in out
    assert '"\\\\xff"' in out                       # a real backslash stays distinguishable
    d = json.loads(ok(run("inspect", p, "--json")))
    values = {m["key"]: m["value"] for m in d["metadata"]}
    assert values["general.name"] == "\\xff\\xfe\\x80" and values["tags"] == ["ok", "a\\xffb"]
    g = GGUFFile(p)
    assert g.metadata("general.name") == "\\xff\\xfe\\x80"
    from ggtool.dsl.builtins import meta_value
    assert meta_value(g.metadata("general.name"), "general.name") == "\\xff\\xfe\\x80"


def test_non_utf8_names_are_escaped_and_written_back_as_bytes(run, tmp_path):
    name = b"blk.0.\xe9.weight"
    p = _write(tmp_path, gguf([ARCH, kv_str(b"key.\xff", "v")], [tensor_info(name, [32, 2])], bytes(256)))
    out = ok(run("inspect", p))
    assert "blk.0.\\xe9.weight" in out and "key.\\xff" in out
    q = tmp_path / "q.gguf"
    ok(run("quantize", p, q, "-q"))
    raw = q.read_bytes()
    assert gstr(name) in raw and gstr(b"key.\xff") in raw
    assert GGUFFile(q).tensors["blk.0.\\xe9.weight"].type.name == "Q4_0"


def test_names_with_control_characters_stay_on_one_line(run, tmp_path):
    name = b"blk.0\n.weight"
    p = _write(tmp_path, gguf([ARCH, kv_str(b"k\tey", "multi\nline")], [tensor_info(name, [32, 2])], bytes(256)))
    out = ok(run("inspect", p))
    assert "blk.0\\x0a.weight" in out and "k\\x09ey" in out and '"multi\\nline"' in out
    assert GGUFFile(p).metadata("k\\x09ey") == "multi\nline"     # a value keeps its newline
    q = tmp_path / "q.gguf"
    ok(run("quantize", p, q, "-q"))
    assert gstr(name) in q.read_bytes()
    p = _write(tmp_path, gguf([ARCH], [tensor_info(name, [32]), tensor_info(name, [32], 0, 128)], bytes(256)))
    fails(run("inspect", p), "tensor name 'blk.0\\x0a.weight' is used twice")


def test_escaped_text_round_trips():
    for raw in (b"plain", b"\xff\xfe\x80", b"a\\xffb", "é".encode(), b"\xc3"):
        s = decode_text(raw)
        assert encode_text(s) == raw
        assert isinstance(s, EscapedText) == (raw in (b"\xff\xfe\x80", b"\xc3"))


def test_stories_opens_unchanged():
    g = GGUFFile(STORIES)
    assert len(g.tensors) == 48 and g.metadata("general.name") == "llama"
    assert g.tensors["token_embd.weight"].path == str(STORIES)


def test_gguf_py_writer_output_is_accepted(tmp_path):
    p = write_gguf(tmp_path / "w.gguf", {"x": np.ones((3, 64), np.float32), "y": np.ones(7, np.float16)},
                   kv={"s": "é", "l": ["a", "b"]})
    g = GGUFFile(p)
    assert g.tensors["x"].ne == (64, 3) and g.metadata("s") == "é"


# ------------------------------------------------------------------------------ GGML's limits on write

def test_long_output_name_is_not_written(run, tmp_path):
    name = "a" * 100
    out = tmp_path / "o.gguf"
    fails(run("compute", name, "--tensor", f"{name}=[1,2]", "-o", out), "output name", "100 bytes long")
    assert not out.exists()
    ok(run("compute", "a" * 63, "--tensor", f"{'a' * 63}=[1,2]", "-o", out))
    assert list(GGUFFile(out).tensors) == ["a" * 63]


def test_long_npy_name_is_not_quantized(run, tmp_path, npy):
    p = npy(np.ones((2, 32), np.float32))
    out = tmp_path / "q.gguf"
    fails(run("quantize", p, out, "--name", "w" * 64), "is 64 bytes long")
    assert not out.exists()


def test_alignment_over_64k_is_not_written(run, tmp_path):
    p = _write(tmp_path, gguf([ARCH, kv_u32("general.alignment", 1 << 17)]))
    assert "alignment 131072" in ok(run("inspect", p))
    out = tmp_path / "q.gguf"
    fails(run("quantize", p, out), "alignment 131072 cannot be written")
    assert not out.exists()
