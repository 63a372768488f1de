"""Split GGUF models (llama.cpp's gguf-split): given the first shard, `inspect`, `compute` and
`quantize` read every shard beside it, as llama.cpp's loader does; `quantize` writes one file, or
the same shard layout with --keep-split; a later shard alone, or a missing one, is a clear error."""

from __future__ import annotations

import json
import shutil
import struct

import gguf
import numpy as np
import pytest
from conftest import STORIES, fails, ok
from gguf_craft import gguf as gguf_bytes
from gguf_craft import kv, kv_str, split_model, tensor_info

from ggtool.gguf_io import GGUFFile

LLAMA = STORIES.parent.parent / "ggtool" / "programs" / "llama.gg"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """stories260K in 2 shards of 24 tensors: stories-00001-of-00002.gguf, stories-00002-of-00002.gguf."""
    d = tmp_path_factory.mktemp("split")
    return split_model(STORIES, d / "stories.gguf", 24)


def _fields(path) -> dict:
    r = gguf.gguf.GGUFReader(str(path))
    return {k: (f.types[0].name, f.contents()) for k, f in r.fields.items() if not k.startswith("GGUF.")}


def test_inspect_reads_every_shard(run, shards):
    out = ok(run("inspect", shards[0]))
    assert out.splitlines()[0].endswith("48 tensors, alignment 32")
    assert f"split model, 2 shards: {shards[0]} (24 tensors), {shards[1]} (24 tensors)" in out
    d = json.loads(ok(run("inspect", shards[0], "--json")))
    assert [s["tensors"] for s in d["shards"]] == [24, 24]
    assert sorted(t["shard"] for t in d["tensors"]) == [1] * 24 + [2] * 24
    whole = json.loads(ok(run("inspect", STORIES, "--json", "--diffable")))
    split = json.loads(ok(run("inspect", shards[0], "--json", "--diffable", "--stats")))
    assert [(t["name"], t["ne"]) for t in split["tensors"]] == [(t["name"], t["ne"]) for t in whole["tensors"]]
    assert all(t["stats"]["nonfinite"] == 0 for t in split["tensors"])


def test_quantize_writes_one_file_as_from_the_unsplit_model(run, shards, tmp_path):
    # the same bytes as from the unsplit model: all 48 tensors of both shards, no split key
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    ok(run("quantize", STORIES, a, "-q", "-t", "1"))
    ok(run("quantize", shards[0], b, "-q", "-t", "2"))
    assert a.read_bytes() == b.read_bytes()


def test_quantize_keep_split_writes_the_same_shards(run, shards, tmp_path):
    r = run("quantize", shards[0], tmp_path / "q.gguf", "--keep-split", "-t", "1")
    ok(r)
    out = [tmp_path / "q-00001-of-00002.gguf", tmp_path / "q-00002-of-00002.gguf"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in out]
    assert f"wrote {out[0]}, {out[1]} (" in r.stderr
    for src, dst in zip(shards, out):        # each shard's tensors, in the same order
        assert [t.name for t in gguf.gguf.GGUFReader(str(dst)).tensors] == [t.name for t in gguf.gguf.GGUFReader(str(src)).tensors]
    first, second = _fields(out[0]), _fields(out[1])
    assert second == {"split.no": ("UINT16", 1), "split.count": ("UINT16", 2), "split.tensors.count": ("INT32", 48)}
    assert list(first)[-5:] == ["general.quantization_version", "general.file_type", "split.no", "split.count",
                                "split.tensors.count"]
    assert first["split.no"] == ("UINT16", 0) and first["general.name"] == ("STRING", "llama")
    # the same bytes per tensor as the single file, and read back whole from the first shard
    single = tmp_path / "single" / "q.gguf"
    single.parent.mkdir()
    ok(run("quantize", shards[0], single, "-q", "-t", "1"))
    one, many = GGUFFile(single), GGUFFile(out[0])
    assert len(many.tensors) == 48 and many.paths == [str(p) for p in out]
    for name in one.tensors:
        assert np.array_equal(one.array(name), many.array(name)), name
    dry = ok(run("quantize", shards[0], tmp_path / "q.gguf", "--keep-split", "--dry-run", "--force"))
    assert dry.endswith(f"bytes to {out[0]}, {out[1]} (dry run)\n")


def test_keep_split_output_named_as_its_first_shard(run, shards, tmp_path):
    ok(run("quantize", shards[0], tmp_path / "m-00001-of-00002.gguf", "--keep-split", "-q"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]


def test_keep_split_checks_every_output_before_writing(run, shards, tmp_path):
    (tmp_path / "q-00002-of-00002.gguf").write_bytes(b"keep me")
    fails(run("quantize", shards[0], tmp_path / "q.gguf", "--keep-split"), "q-00002-of-00002.gguf exists")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q-00002-of-00002.gguf"]
    fails(run("quantize", shards[0], shards[1].parent / "stories.gguf", "--keep-split", "--force"),
          "INPUT and OUTPUT are the same file")


def test_keep_split_of_a_single_file_writes_one_shard_as_llama_quantize(run, tmp_path):
    """llama-quantize --keep-split of one file: OUT-00001-of-00001.gguf, tensors in file order, no
    split keys; the same bytes otherwise."""
    ok(run("quantize", STORIES, tmp_path / "q.gguf", "--keep-split", "-q"))
    assert [p.name for p in tmp_path.iterdir()] == ["q-00001-of-00001.gguf"]
    kept = gguf.GGUFReader(tmp_path / "q-00001-of-00001.gguf")
    assert [t.name for t in kept.tensors] == [t.name for t in gguf.GGUFReader(STORIES).tensors]
    assert not [k for k in kept.fields if k.startswith("split.")]
    ok(run("quantize", STORIES, tmp_path / "whole.gguf", "-q"))
    whole = gguf.GGUFReader(tmp_path / "whole.gguf")
    assert {t.name: bytes(t.data) for t in kept.tensors} == {t.name: bytes(t.data) for t in whole.tensors}


def test_compare_reads_every_shard(run, shards):
    out = ok(run("compare", shards[0], STORIES))
    assert "48 tensors compared (48 identical), 0 only in A, 0 only in B" in out
    fails(run("compare", shards[1], STORIES), "shard 2 of 2 of a split model")


def test_compute_uses_every_shard(run, shards, tmp_path):
    tokens = "tokens=i32:[1,345,267]"
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    ok(run("compute", "-f", LLAMA, "--gguf", STORIES, "--tensor", tokens, "-o", a))
    ok(run("compute", "-f", LLAMA, "--gguf", shards[0], "--tensor", tokens, "-o", b))
    assert np.load(a).tobytes() == np.load(b).tobytes()
    w = "blk.4.ffn_up.weight"                # in the second shard
    got = ok(run("compute", "sum(w)", "--tensor", f"w={shards[0]}:{w}"))
    assert got == ok(run("compute", "sum(w)", "--tensor", f"w={STORIES}:{w}"))


@pytest.mark.parametrize("cmd", [["inspect"], ["quantize", "-", "OUT"], ["compute", "x", "--tensor", "x=[1]", "--gguf"]])
def test_a_later_shard_alone_is_an_error(run, shards, tmp_path, cmd):
    args = [a for a in cmd if a not in ("-", "OUT")]
    args = args + [shards[1]] + ([tmp_path / "q.gguf"] if cmd[0] == "quantize" else [])
    fails(run(*args), "shard 2 of 2 of a split model; open its first shard", str(shards[0]))
    assert not (tmp_path / "q.gguf").exists()


def test_a_missing_shard_is_an_error(run, shards, tmp_path):
    first = tmp_path / shards[0].name
    shutil.copy(shards[0], first)
    missing = tmp_path / shards[1].name
    fails(run("inspect", first), f"shard 2 of 2 of this split model, {missing}, is missing")
    fails(run("quantize", first, tmp_path / "q.gguf"), "is missing")
    fails(run("compute", "x", "--tensor", "x=[1]", "--gguf", first), "is missing")
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]


def test_a_first_shard_under_another_name_is_an_error(run, shards, tmp_path):
    p = tmp_path / "model.gguf"
    shutil.copy(shards[0], p)
    fails(run("inspect", p), "does not end in -00001-of-00002.gguf")


def _u16(key, v):
    return kv(key, 2, struct.pack("<H", v))


def _shard(no: int, count: int, total: int, names, first: bool = True, extra=()) -> bytes:
    kvs = ([kv_str("general.architecture", "llama")] if first else []) + [
        _u16("split.no", no), _u16("split.count", count), kv("split.tensors.count", 5, struct.pack("<i", total)),
        *extra]
    infos = [tensor_info(n, [8], 0, 32 * k) for k, n in enumerate(names)]
    return gguf_bytes(kvs, infos, bytes(32 * len(names)))


@pytest.mark.parametrize("second, message", [
    (_shard(0, 2, 2, ["b"], first=False), "do not make it shard 2 of 2"),
    (_shard(1, 3, 2, ["b"], first=False), "do not make it shard 2 of 2"),
    (_shard(1, 2, 2, ["a"], first=False), "tensor 'a' is in two shards"),
    (_shard(1, 2, 2, ["b", "c"], first=False), "split.tensors.count is 2, but the 2 shards hold 3 tensors"),
])
def test_mismatched_shards_are_an_error(run, tmp_path, second, message):
    (tmp_path / "m-00001-of-00002.gguf").write_bytes(_shard(0, 2, 2, ["a"]))
    (tmp_path / "m-00002-of-00002.gguf").write_bytes(second)
    fails(run("inspect", tmp_path / "m-00001-of-00002.gguf"), message)


def test_split_keys_of_the_wrong_kind_are_an_error(run, tmp_path):
    p = tmp_path / "m-00001-of-00002.gguf"
    p.write_bytes(gguf_bytes([kv_str("general.architecture", "llama"), kv_str("split.count", "2")]))
    fails(run("inspect", p), "split.count is '2', not a count")
