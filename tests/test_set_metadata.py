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


# ------------------------------------------------------------------ new output, created atomically

def test_racing_writers_of_a_new_output_one_wins_none_is_lost(tmp_path):
    """Without --force the finished file is linked to its name: the exists-check before writing
    cannot be raced past. Three writers of one new name, finishing in turn: the first is in place,
    the other two say the name exists; the file is the first one's."""
    from ggtool.errors import GGToolError
    from ggtool.tensor_io import atomic_path

    out = tmp_path / "o.gguf"
    ctxs = [atomic_path(str(out), replace=False) for _ in range(3)]
    tmps = [c.__enter__() for c in ctxs]                  # all three writing at once
    for k, tmp in enumerate(tmps):
        with open(tmp, "wb") as f:
            f.write(b"writer %d" % k)
    assert not ctxs[0].__exit__(None, None, None)
    for c in ctxs[1:]:
        with pytest.raises(GGToolError) as e:
            c.__exit__(None, None, None)
        assert (e.value.kind, str(e.value)) == ("output-exists", f"{out} exists")
    assert out.read_bytes() == b"writer 0" and os.listdir(tmp_path) == ["o.gguf"]


def test_files_that_appear_together_are_all_placed_or_none(tmp_path):
    """A model's shards without --force: if a later name is taken by the time they are placed, the
    ones already placed are removed again (they were this writer's), and nothing else is touched."""
    from ggtool.errors import GGToolError
    from ggtool.tensor_io import atomic_paths

    a, b = str(tmp_path / "q-00001-of-00002.gguf"), str(tmp_path / "q-00002-of-00002.gguf")
    with pytest.raises(GGToolError, match="q-00002-of-00002.gguf exists"):
        with atomic_paths([a, b], replace=False) as tmps:
            for t in tmps:
                with open(t, "wb") as f:
                    f.write(b"mine")
            with open(b, "wb") as f:                      # another writer, meanwhile
                f.write(b"theirs")
    assert sorted(os.listdir(tmp_path)) == ["q-00002-of-00002.gguf"] and open(b, "rb").read() == b"theirs"


def test_three_processes_writing_one_new_output(tmp_path):
    """The command line's race, as users meet it: one exit 0, two exit 1 with one line each, and the
    file is the winner's."""
    import subprocess
    import sys

    out = tmp_path / "o.gguf"
    procs = [subprocess.Popen([sys.executable, "-m", "ggtool", "set-metadata", str(STORIES), "-o", str(out), "-q",
                               "--set", f"general.name=writer {k}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path) for k in range(3)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    winners = [k for k, (code, _) in enumerate(results) if code == 0]
    assert len(winners) == 1, results
    assert sorted(err for code, err in results if code) == [f"Error: {out} exists (use --force to overwrite it)\n"] * 2
    assert fields(out)["general.name"] == ("STRING", f"writer {winners[0]}")
    assert os.listdir(tmp_path) == ["o.gguf"]


# ------------------------------------------------------------------------------ --set-file's files

@pytest.mark.parametrize("kind", ["device", "fifo", "directory", "too large", "not utf-8", "missing"])
def test_set_file_reads_only_a_regular_file_up_to_its_limit(run, tmp_path, kind):
    """/dev/zero was read until memory ran out, a FIFO waited on, a 100 MB file cost 2 GB: each is
    now one line, before more than the limit is read."""
    import tracemalloc

    path = {"device": "/dev/zero", "fifo": str(tmp_path / "f"), "directory": str(tmp_path / "d"),
            "too large": str(tmp_path / "big.txt"), "not utf-8": str(tmp_path / "bad.txt"),
            "missing": str(tmp_path / "nope.txt")}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "too large":
        with open(path, "wb") as f:                      # 100 MB, sparse
            f.truncate(100_000_000)
    elif kind == "not utf-8":
        with open(path, "wb") as f:
            f.write(b"hi \xff")
    limit = "; a value is read from a regular UTF-8 file of at most 67,108,864 bytes (64 MiB)"
    want = {"device": f"{path}: not a regular file (a character device){limit}",
            "fifo": f"{path}: not a regular file (a FIFO){limit}",
            "directory": f"{path}: not a regular file (a directory){limit}",
            "too large": f"{path}: 100,000,000 bytes, too large{limit}",
            "not utf-8": f"{path} is not UTF-8 text (invalid start byte at byte 3)",
            "missing": f"{path}: No such file or directory"}[kind]
    out = tmp_path / "o.gguf"
    tracemalloc.start()
    try:
        err = fails(run("set-metadata", STORIES, "-o", out, "--set-file", f"k={path}"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err == f"Error: {want}\n"
    assert peak < 16 << 20 and not out.exists()
    with pytest.raises(E.MetadataEditError) as e:
        E.read_value_file("k", path)
    assert (e.value.key, e.value.reason) == ("k", "file")


def test_set_file_up_to_its_limit_is_read_whole(run, tmp_path, monkeypatch):
    monkeypatch.setattr(E, "MAX_VALUE_FILE_BYTES", 1000)
    text = tmp_path / "t.txt"
    text.write_text("é" * 500, encoding="utf-8")                   # 1000 bytes: at the limit
    out = tmp_path / "o.gguf"
    r = run("set-metadata", STORIES, "-o", out, "--set-file", f"k={text}")
    assert ok(r) == "" and fields(out)["k"] == ("STRING", "é" * 500)
    assert r.stderr.splitlines()[0] == f'added k = "{"é" * 60}"... (500 characters) (STRING)'   # a long value shown cut
    text.write_text("é" * 500 + "x", encoding="utf-8")
    fails(run("set-metadata", STORIES, "-o", tmp_path / "p.gguf", "--set-file", f"k={text}"), "1,001 bytes, too large")


# --------------------------------------------------------------------- values that must survive

@pytest.mark.parametrize("typed, line", [
    ("x=f32:1e-50", "metadata 'x' is FLOAT32: 1e-50 underflows it (it would be stored as 0; the smallest positive "
                    "FLOAT32 is 1.40129846e-45)"),
    ("x=float:-1e-46", "metadata 'x' is FLOAT32: -1e-46 underflows it"),
    ("x=f32:1e-40", "metadata 'x' is FLOAT32: 1e-40 is below its normal range and would be stored as 9.9999461e-41, "
                    "losing digits (the smallest normal FLOAT32 is 1.17549435e-38)"),
    ("x=f64:1e-400", "metadata 'x' is FLOAT64: 1e-400 underflows it"),
    ("x=f64:1e-320", "metadata 'x' is FLOAT64: 1e-320 is below its normal range"),
    ("x=f32:3.41e38", "metadata 'x' is FLOAT32: 3.41e38 is too large for it (it would be inf"),
    ("x=f64:1e309", "metadata 'x' is FLOAT64: 1e309 is too large for it (it would be inf"),
    ("x=f32:inf", "metadata 'x' is FLOAT32: inf is not a finite number (NaN and infinities are refused)"),
    ("x=f64:-NaN", "metadata 'x' is FLOAT64: -NaN is not a finite number"),
])
def test_values_that_do_not_survive_their_type_are_refused(run, tmp_path, typed, line):
    out = tmp_path / "o.gguf"
    err = fails(run("set-metadata", STORIES, "-o", out, "--set-typed", typed))
    assert err.startswith("Error: " + line) and not out.exists()


@pytest.mark.parametrize("text, stored", [("3.4028235e38", 3.4028234663852886e38), ("3.4028234663852886e38", 3.4028234663852886e38),
                                          ("-3.4028235e38", -3.4028234663852886e38), ("1.17549435e-38", 1.1754943508222875e-38),
                                          ("1.401298464324817e-45", 1.401298464324817e-45), ("0.1", float(np.float32(0.1))),
                                          ("-0", -0.0), ("1e-45", 1.401298464324817e-45)])
def test_flt_max_and_exact_values_are_kept(run, tmp_path, text, stored):
    """FLT_MAX (as C prints it, 3.4028235e38, or exactly), the smallest normal and the smallest
    subnormal are FLOAT32 values; 0.1 keeps FLOAT32's precision. 1e-45 is the smallest subnormal
    within its own precision (1.4e-45 is the one it rounds to, 40% off): refused."""
    out = tmp_path / "o.gguf"
    r = run("set-metadata", STORIES, "-o", out, "--set-typed", f"x=f32:{text}", "-q")
    if text == "1e-45":
        fails(r, "is below its normal range")
        return
    ok(r)
    assert fields(out)["x"][0] == "FLOAT32" and float(np.float32(fields(out)["x"][1])) == stored


def test_keys_and_strings_must_be_utf8(run, tmp_path):
    """A key given through the shell as bytes that are not UTF-8 (Python holds them as surrogate
    escapes) was written, and gguf-py could not open the file."""
    out = tmp_path / "o.gguf"
    assert fails(run("set-metadata", STORIES, "-o", out, "--set", "a\udcff=1")) == (
        'Error: metadata key "a\\xff" is not UTF-8 text: gguf-py and llama.cpp read keys as UTF-8 (gguf-py could '
        "not open the file)\n")
    assert fails(run("set-metadata", STORIES, "-o", out, "--set", "general.name=x\udcfe")) == (
        "Error: metadata 'general.name': the string \"x\\xfe\" is not UTF-8 text (GGUF strings are UTF-8)\n")
    assert fails(run("set-metadata", STORIES, "-o", out, "--set", "\ud800k=1")).startswith(
        'Error: metadata key "\\xed\\xa0\\x80k" is not UTF-8 text')
    assert not out.exists()


def test_an_input_key_that_is_not_utf8_must_be_deleted(run, tmp_path):
    """ggtool reads a key of bytes that are not UTF-8 (escaped); gguf-py cannot open such a file,
    so set-metadata writes none: it names the key, which --delete takes as shown."""
    from gguf_craft import gguf as craft
    from gguf_craft import kv_str

    raw = craft([kv_str(b"general.architecture", "llama"), kv_str(b"bad\xffkey", "v"), kv_str(b"general.name", "n")])
    src = tmp_path / "bad.gguf"
    src.write_bytes(raw)
    out = tmp_path / "o.gguf"
    err = fails(run("set-metadata", src, "-o", out, "--set", "general.name=m"))
    assert err == (f'Error: {src}: metadata key "bad\\xffkey" is not UTF-8 text: gguf-py and llama.cpp could not open '
                   "the file written; delete the key (named as shown here)\n")
    ok(run("set-metadata", src, "-o", out, "--delete", "bad\\xffkey", "-q"))
    assert list(fields(out)) == ["general.architecture", "general.name"]


# ------------------------------------------------------------- gguf-py opens every file it writes

def _typed_values():
    from hypothesis import strategies as st

    ints = {"u8": (0, 255), "i8": (-128, 127), "u16": (0, 65535), "i16": (-32768, 32767), "u32": (0, 2**32 - 1),
            "i32": (-2**31, 2**31 - 1), "u64": (0, 2**64 - 1), "i64": (-2**63, 2**63 - 1)}
    return st.one_of(
        *[st.integers(lo, hi).map(lambda v, t=t: (t, str(v))) for t, (lo, hi) in ints.items()],
        st.floats(allow_nan=True, allow_infinity=True, width=64).map(lambda v: ("f32", repr(v))),
        st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda v: ("f32", repr(v))),
        st.floats(allow_nan=True, allow_infinity=True).map(lambda v: ("f64", repr(v))),
        st.booleans().map(lambda v: ("bool", str(v).lower())),
        st.text(max_size=40).map(lambda v: ("str", v)),
        st.integers(-2**70, 2**70).map(lambda v: ("int", str(v))),
        st.text(max_size=8).map(lambda v: ("u8", v)),
    )


def test_gguf_py_opens_every_file_set_metadata_writes(tmp_path):
    """A property: any keys (any text, surrogates included) set to any typed values give either one
    MetadataEditError, or a file gguf-py opens holding exactly the values set (as their type
    stores them)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    g = GGUFFile(STORIES)
    key = st.text(min_size=0, max_size=12)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.tuples(key, _typed_values()), max_size=4))
    def check(edits):
        sets = [E.SetValue(k, text, t) for k, (t, text) in edits]
        try:
            plan = E.plan_edit(g, sets)
        except E.MetadataEditError:
            return
        out = tmp_path / "o.gguf"
        with open(out, "wb", buffering=0) as f:
            E.write_edited(plan, f)
        E.check_written(plan, str(out))
        read = gguf.GGUFReader(str(out))                  # gguf-py opens it
        for k, (vtype, value) in plan.values.items():
            got = read.fields[k].contents()
            if vtype == E.W.FLOAT32:
                assert got == float(np.float32(value))
            else:
                assert got == value, (k, got, value)

    check()
