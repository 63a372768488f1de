"""`ggtool set-metadata`: metadata set, added or deleted into a new file, as gguf-new-metadata does;
tensors byte for byte; what would corrupt the file refused; nothing written on any error."""

from __future__ import annotations

import os
import shutil

import gguf
import numpy as np
import pytest
from conftest import STORIES, fails, ok, write_gguf
from gguf_craft import split_model

from ggtool.gguf_io import GGUFFile
from ggtool.gguf_io import edit as E

V = gguf.GGUFValueType


def fields(path) -> dict:
    r = gguf.GGUFReader(str(path))
    return {k: (f.types[0].name, f.contents()) for k, f in r.fields.items() if not k.startswith("GGUF.")}


def tensor_bytes(path) -> dict:
    r = gguf.GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, tuple(int(d) for d in t.shape), np.asarray(t.data).tobytes(),
                     int(t.data_offset) - r.data_offset) for t in r.tensors}


def test_round_trip_through_gguf_py(run, tmp_path):
    out = tmp_path / "out.gguf"
    r = run("set-metadata", STORIES, "-o", out, "--set", "general.name=tiny stories",
                 "--set-typed", "llama.context_length=int:256", "--set-typed", "my.flag=bool:true",
                 "--set-typed", "my.scale=f32:0.5", "--set-typed", "my.offset=i64:-7", "--set", "my.note=a=b:c",
                 "--delete", "llama.rope.dimension_count")
    assert ok(r) == ""                                                # diagnostics on stderr, data on none
    before, after = fields(STORIES), fields(out)
    assert after["general.name"] == ("STRING", "tiny stories")
    assert after["llama.context_length"] == ("UINT32", 256)          # int keeps the key's own type
    assert after["my.flag"] == ("BOOL", True) and after["my.scale"] == ("FLOAT32", 0.5)
    assert after["my.offset"] == ("INT64", -7) and after["my.note"] == ("STRING", "a=b:c")
    assert "llama.rope.dimension_count" not in after
    # the others as they were, in their places; new keys last (--set ones, then --set-typed ones)
    kept = [k for k in before if k != "llama.rope.dimension_count"]
    assert list(after) == kept + ["my.note", "my.flag", "my.scale", "my.offset"]
    assert all(after[k] == before[k] for k in kept if k not in ("general.name", "llama.context_length"))
    assert tensor_bytes(out) == tensor_bytes(STORIES)               # data, types, shapes, offsets
    assert r.stderr.splitlines() == ['set general.name = "tiny stories" (STRING)', "set llama.context_length = 256 (UINT32)",
                                'added my.note = "a=b:c" (STRING)', "added my.flag = true (BOOL)",
                                "added my.scale = 0.5 (FLOAT32)", "added my.offset = -7 (INT64)",
                                "deleted llama.rope.dimension_count", f"wrote {out} ({out.stat().st_size:,} bytes)"]


def test_no_edit_gives_the_same_bytes(tmp_path):
    """The writer lays a file out as GGML does: with nothing edited, the input's own bytes."""
    plan = E.plan_edit(GGUFFile(STORIES))
    out = tmp_path / "same.gguf"
    with open(out, "wb", buffering=0) as f:
        assert E.write_edited(plan, f) == plan.file_bytes() == STORIES.stat().st_size
    assert out.read_bytes() == STORIES.read_bytes()


def test_set_file_and_types_by_gguf_name(run, tmp_path):
    tpl = tmp_path / "chat.jinja"
    tpl.write_text("{% for m in messages %}{{ m.content }}\n{% endfor %}", encoding="utf-8")
    out = tmp_path / "o.gguf"
    ok(run("set-metadata", STORIES, "-o", out, "--set-file", f"tokenizer.chat_template={tpl}",
           "--set-typed", "my.u8=UINT8:255", "--set-typed", "my.d=float64:1e300", "-q"))
    f = fields(out)
    assert f["tokenizer.chat_template"] == ("STRING", tpl.read_text())
    assert f["my.u8"] == ("UINT8", 255) and f["my.d"] == ("FLOAT64", 1e300)


def test_new_alignment_lays_the_same_bytes_out_again(run, tmp_path):
    a64 = tmp_path / "a64.gguf"
    ok(run("set-metadata", STORIES, "-o", a64, "--set-typed", "general.alignment=int:64", "-q"))
    r = gguf.GGUFReader(str(a64))
    assert r.alignment == 64 and fields(a64)["general.alignment"] == ("UINT32", 64)
    assert all(t.data_offset % 64 == 0 for t in r.tensors)
    got, want = tensor_bytes(a64), tensor_bytes(STORIES)
    assert {n: v[:3] for n, v in got.items()} == {n: v[:3] for n, v in want.items()}
    back = tmp_path / "back.gguf"                                   # deleted: GGUF's default, 32
    ok(run("set-metadata", a64, "-o", back, "--delete", "general.alignment", "-q"))
    assert back.read_bytes() == STORIES.read_bytes()


@pytest.mark.parametrize("args, code, fragments", [
    (["--set", "general.name"], 2, ["'general.name' is not KEY=VALUE"]),
    (["--set", "=x"], 2, ["is not KEY=VALUE"]),
    (["--set-typed", "a.b=5"], 2, ["is not KEY=TYPE:VALUE"]),
    ([], 2, ["nothing to do"]),
    (["--delete", "general.url"], 1, ["metadata 'general.url' is not in", "cannot be deleted"]),
    (["--set", "llama.context_length=abc"], 1, ["'llama.context_length' is UINT32: 'abc' is not an integer"]),
    (["--set-typed", "x=u8:300"], 1, ["300 is out of its range 0..255"]),
    (["--set-typed", "x=i32:-2147483649"], 1, ["out of its range"]),
    (["--set-typed", "x=int:-1"], 1, ["UINT32: -1 is out of its range"]),
    (["--set-typed", "x=f32:1e39"], 1, ["1e39 is too large for it (it would be inf; the largest FLOAT32 is 3.40282347e+38)"]),
    (["--set-typed", "x=float:nan"], 1, ["nan is not a finite number (NaN and infinities are refused)"]),
    (["--set-typed", "x=bool:yes"], 1, ["'yes' is not true or false"]),
    (["--set-typed", "x=q8:1"], 1, ["unknown value type 'q8'"]),
    (["--set", "a=1", "--delete", "a"], 1, ["'a' is edited twice"]),
    (["--set", "tokenizer.ggml.tokens=x"], 1, ["is an array (ARRAY[STRING])"]),
    (["--delete", "general.architecture"], 1, ["'general.architecture' cannot be deleted"]),
    (["--set-typed", "general.architecture=u32:1"], 1, ["cannot be a UINT32"]),
    (["--set-typed", "general.alignment=int:48"], 1, ["alignment 48 cannot be written"]),
    (["--set", "general.alignment=63"], 1, ["alignment 63 cannot be written"]),
    (["--set-typed", "split.count=u16:2"], 1, ["split model's key"]),
    (["--set", "GGUF.version=2"], 1, ["header field"]),
])
def test_refusals_write_nothing(run, tmp_path, args, code, fragments):
    out = tmp_path / "out" / "o.gguf"
    out.parent.mkdir()
    fails(run("set-metadata", STORIES, "-o", out, *args), *fragments, code=code)
    assert os.listdir(out.parent) == []


def test_output_paths(run, tmp_path):
    out = tmp_path / "o.gguf"
    out.write_bytes(b"keep me")
    fails(run("set-metadata", STORIES, "-o", out, "--set", "a=b"), f"{out} exists (use --force to overwrite it)")
    assert out.read_bytes() == b"keep me"
    fails(run("set-metadata", STORIES, "-o", out, "--set", "a=1", "--set", "a=2", "--force"), "edited twice")
    assert out.read_bytes() == b"keep me"                         # an edit error keeps the old file
    ok(run("set-metadata", STORIES, "-o", out, "--set", "a=b", "--force", "-q"))
    assert fields(out)["a"] == ("STRING", "b")
    copy = tmp_path / "m.gguf"
    shutil.copy(STORIES, copy)
    link = tmp_path / "link.gguf"
    link.symlink_to(copy)
    fails(run("set-metadata", copy, "-o", link, "--set", "a=b", "--force"), "INPUT and OUTPUT are the same file")
    assert copy.read_bytes() == STORIES.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["link.gguf", "m.gguf", "o.gguf"]


def test_a_split_model_is_refused(run, tmp_path):
    shards = split_model(STORIES, tmp_path / "s.gguf", 24)
    fails(run("set-metadata", shards[0], "-o", tmp_path / "o.gguf", "--set", "a=b"),
          "the first of 2 shards of a split model")
    fails(run("set-metadata", shards[1], "-o", tmp_path / "o.gguf", "--set", "a=b"), "shard 2 of 2")
    assert not (tmp_path / "o.gguf").exists()


def test_a_file_without_tensors_and_a_non_utf8_name(run, tmp_path):
    src = write_gguf(tmp_path / "e.gguf", {}, kv={"general.name": "x"})
    out = tmp_path / "o.gguf"
    ok(run("set-metadata", src, "-o", out, "--set", "general.name=y", "-q"))
    assert fields(out)["general.name"] == ("STRING", "y") and tensor_bytes(out) == {}


def test_engine_errors_carry_key_and_reason():
    g = GGUFFile(STORIES)
    with pytest.raises(E.MetadataEditError) as e:
        E.plan_edit(g, deletes=["nope"])
    assert (e.value.key, e.value.reason) == ("nope", "missing")
    with pytest.raises(E.MetadataEditError) as e:
        E.plan_edit(g, [E.SetValue("general.alignment", "3", "u32")])
    assert (e.value.key, e.value.reason) == ("general.alignment", "protected")
    with pytest.raises(E.MetadataEditError) as e:
        E.plan_edit(g, [E.SetValue("k", "1", "nope")])
    assert e.value.reason == "type"


def test_help_teaches_with_examples(run):
    out = ok(run("set-metadata", "--help"))
    assert "Examples:" in out and "--set-typed llama.context_length=int:4096" in out and "llama-quantize's KEY=TYPE:VALUE" in out


def test_a_new_alignment_set_plainly_is_a_uint32(run, tmp_path):
    """--set general.alignment=64 on a file without the key writes GGML's UINT32, not a string it
    would then refuse; the tensors are laid out again for it."""
    import gguf

    out = tmp_path / "a.gguf"
    ok(run("set-metadata", str(STORIES), "-o", str(out), "--set", "general.alignment=64", "-q"))
    r = gguf.GGUFReader(str(out))
    field = r.fields["general.alignment"]
    assert field.types == [gguf.GGUFValueType.UINT32] and int(field.parts[-1][0]) == 64
    assert all(t.data_offset % 64 == 0 for t in r.tensors)
