"""`ggtool compute`: the seed example, formats, pipelines, -o files and GGUF inputs."""

from __future__ import annotations

import io
import json
import os

import gguf
import numpy as np
import pytest
from conftest import STORIES, fails, ok

SEED_A = "a=[[2,8],[5,1],[4,2],[8,6]]"
SEED_B = "b=[[10,5],[9,9],[5,4]]"
SEED_OUT = "[[60,55,50,110],[90,54,54,126],[42,29,28,64]]\n"



def test_seed_example(run):
    r = run("compute", "mul_mat(a, b)", "--tensor", SEED_A, "--tensor", SEED_B)
    assert ok(r) == SEED_OUT
    assert r.stderr == ""


def test_program_from_file_and_stdin(run, tmp_path):
    prog = tmp_path / "seed.prog"
    prog.write_text("# GGML's seed example\nc = mul_mat(a, b)\n")
    assert ok(run("compute", "-f", prog, "--tensor", SEED_A, "--tensor", SEED_B)) == SEED_OUT
    assert ok(run("compute", "-f", "-", "--tensor", SEED_A, "--tensor", SEED_B, input="mul_mat(a, b)")) == SEED_OUT


@pytest.mark.parametrize("threads", ["1", "3"])
def test_threads_do_not_change_the_result(run, threads):
    assert ok(run("compute", "mul_mat(a, b)", "--tensor", SEED_A, "--tensor", SEED_B, "--threads", threads)) == SEED_OUT


def test_json_numbers_are_shortest_float32_text(run):
    out = ok(run("compute", "scale(x, 1.0)", "--tensor", "x=[0.1, -0.0, 1e30, 3, NaN, Infinity, -Infinity, 1e-8]"))
    assert out == '[0.1,-0,1e+30,3,"NaN","Infinity","-Infinity",1e-08]\n'
    values = json.loads(out)
    assert np.float32(values[0]) == np.float32(0.1) and np.isnan(float(values[4]))


def test_output_is_numpy_order(run):
    # numpy (2, 3) in, relu keeps ne = [3, 2], out comes numpy (2, 3) again
    assert ok(run("compute", "relu(x)", "--tensor", "x=[[1,-2,3],[-4,5,-6]]")) == "[[1,0,3],[0,5,0]]\n"


def test_npy_pipeline(run):
    """compute ... --format npy | compute 'relu(x)' --tensor x=-"""
    first = run("compute", "mul_mat(a, b)", "--tensor", SEED_A, "--tensor", "b=[[-10,5],[9,-9],[5,4]]",
                "--format", "npy")
    ok(first)
    arr = np.load(io.BytesIO(first.stdout_bytes))
    assert arr.shape == (3, 4) and arr.dtype == np.float32
    second = run("compute", "relu(x)", "--tensor", "x=-", input=first.stdout_bytes)
    assert json.loads(ok(second)) == np.maximum(arr, 0).tolist()


def test_json_pipeline(run):
    first = ok(run("compute", "mul_mat(a, b)", "--tensor", SEED_A, "--tensor", SEED_B))
    assert ok(run("compute", "scale(x, 0.5)", "--tensor", "x=-", input=first)) == \
        "[[30,27.5,25,55],[45,27,27,63],[21,14.5,14,32]]\n"


def test_several_outputs_as_json_object(run):
    prog = "h = mul_mat(a, b)\ny = relu(scale(h, -1.0))"
    out = ok(run("compute", prog, "--tensor", SEED_A, "--tensor", SEED_B, "--output", "h", "--output", "y"))
    doc = json.loads(out)
    assert list(doc) == ["h", "y"]
    assert doc["h"] == json.loads(SEED_OUT) and doc["y"] == [[0] * 4] * 3


def test_binary_to_terminal_refused(run, monkeypatch):
    monkeypatch.setattr("ggtool.commands._common.stdout_is_tty", lambda: True)
    for fmt in ("npy", "gguf"):
        err = fails(run("compute", "relu(x)", "--tensor", "x=[1]", "--format", fmt), code=2)
        assert f"refusing to write {fmt} bytes to a terminal" in err


def test_out_files(run, tmp_path):
    for ext in ("json", "npy"):
        path = tmp_path / f"out.{ext}"
        r = run("compute", "mul_mat(a, b)", "--tensor", SEED_A, "--tensor", SEED_B, "-o", path)
        assert ok(r) == ""
        got = json.loads(path.read_text()) if ext == "json" else np.load(path).tolist()
        assert got == json.loads(SEED_OUT)
    assert sorted(os.listdir(tmp_path)) == ["out.json", "out.npy"]  # no temporary files left


def test_gguf_output_is_readable_by_gguf_py(run, tmp_path):
    path = tmp_path / "out.gguf"
    prog = "h = mul_mat(a, b)\nids = get_rows(a, i)"
    ok(run("compute", prog, "--tensor", SEED_A, "--tensor", SEED_B, "--tensor", "i=i32:[3,0]",
           "--output", "h", "--output", "ids", "--output", "i", "-o", path))
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    assert list(tensors) == ["h", "ids", "i"]
    assert tensors["h"].data.tolist() == json.loads(SEED_OUT)
    assert [int(n) for n in tensors["h"].shape] == [4, 3]  # ne order in the file
    assert tensors["ids"].data.tolist() == [[8, 6], [2, 8]]
    assert tensors["i"].tensor_type == gguf.GGMLQuantizationType.I32
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[-1]).decode() == "ggtool"


def test_gguf_to_stdout(run):
    r = run("compute", "relu(x)", "--tensor", "x=[[1,-1]]", "--format", "gguf")
    assert ok(r).startswith("GGUF")


def test_npy_holds_one_output(run, tmp_path):
    err = fails(run("compute", "y = relu(x)\nz = relu(y)", "--tensor", "x=[1]", "--output", "y", "--output", "z",
                    "-o", tmp_path / "o.npy"), code=2)
    assert "a .npy holds one array but the program has 2 outputs (y, z)" in err
    assert os.listdir(tmp_path) == []


def test_failed_run_leaves_no_file(run, tmp_path, monkeypatch):
    path = tmp_path / "out.gguf"
    path.write_bytes(b"old contents")

    def half_write(tmp, outputs, metadata=None):
        with open(tmp, "wb") as f:
            f.write(b"GGUF partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("ggtool.tensor_io.outputs.write_gguf", half_write)
    fails(run("compute", "relu(x)", "--tensor", "x=[1]", "-o", path), "No space left on device")
    assert path.read_bytes() == b"old contents"
    assert os.listdir(tmp_path) == ["out.gguf"]
    # a failure before writing (here: the program) also leaves the old file alone
    fails(run("compute", "relu(", "--tensor", "x=[1]", "-o", path))
    assert path.read_bytes() == b"old contents"


def test_out_refuses_unknown_extension_missing_dir_and_inputs(run, tmp_path, npy):
    fails(run("compute", "relu(x)", "--tensor", "x=[1]", "-o", tmp_path / "out.txt"), "from its extension", code=2)
    fails(run("compute", "relu(x)", "--tensor", "x=[1]", "-o", tmp_path / "no" / "o.json"), "does not exist", code=2)
    p = npy(np.ones(3, np.float32))
    fails(run("compute", "relu(x)", "--tensor", f"x={p}", "-o", p), "is also an input", code=2)
    # --format wins over the extension
    ok(run("compute", "relu(x)", "--tensor", "x=[1]", "-o", tmp_path / "out.txt", "--format", "json"))
    assert (tmp_path / "out.txt").read_text() == "[1]\n"


def test_gguf_model_get_rows(run):
    reader = gguf.GGUFReader(STORIES)
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight").data  # numpy (512, 64)
    r = run("compute", "get_rows(token_embd.weight, tok)", "--gguf", STORIES, "--tensor", "tok=i32:[1,2,511]")
    got = np.array(json.loads(ok(r)), dtype=np.float32)
    np.testing.assert_array_equal(got, emb[[1, 2, 511]])


def test_gguf_tensor_source_with_prefix(run):
    r = run("compute", "get_rows(e, tok)", "--tensor", f"e=f16:{STORIES}:token_embd.weight", "--tensor", "tok=i32:[7]")
    got = np.array(json.loads(ok(r)), dtype=np.float32)
    emb = next(t for t in gguf.GGUFReader(STORIES).tensors if t.name == "token_embd.weight").data
    # one row: ne [64, 1] prints as numpy shape (64,) (ggml_n_dims drops trailing 1s)
    np.testing.assert_array_equal(got, emb[7].astype(np.float16).astype(np.float32))


def test_shape_only_inputs_are_zeros(run):
    assert ok(run("compute", "relu(x)", "--tensor", "x=f32[3,2]")) == "[[0,0,0],[0,0,0]]\n"


def test_timing_and_verbose_go_to_stderr(run):
    r = run("compute", "mul_mat(a, b)", "--tensor", SEED_A, "--tensor", SEED_B, "--time")
    assert ok(r) == SEED_OUT and r.stderr.startswith("time: build")
    r = run("compute", "get_rows(token_embd.weight, tok)", "--gguf", STORIES, "--tensor", "tok=i32:[1]", "-v")
    ok(r)
    assert "load token_embd.weight:" in r.stderr and "memory-mapped" in r.stderr


def test_unused_tensor_warns(run):
    r = run("compute", "relu(x)", "--tensor", "x=[1]", "--tensor", "spare=[2]")
    assert ok(r) == "[1]\n"
    assert r.stderr == "Warning: --tensor spare is not used by the program\n"


@pytest.mark.parametrize("source,printed", [("f32[0,3]", "[[],[],[]]"), ("f32[3,0]", "[]"), ("[[],[]]", "[[],[]]")])
def test_empty_tensors_print_as_empty_json(run, source, printed):
    r = run("compute", "relu(x)", "--tensor", f"x={source}")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == printed + "\n"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_on_a_terminal_only():
    import time

    from ggtool.commands._progress import compute_progress

    term = _Terminal()
    with compute_progress(5, delay=0, interval=0.005, file=term) as progress:
        for i in range(5):
            progress.node = i
            time.sleep(0.05)
    assert "compute" in term.getvalue() and "4/5" in term.getvalue()   # node 4 running: 4 done
    with compute_progress(5, file=io.StringIO()) as progress:           # not a terminal: no bar
        assert progress is None


def test_text_source_feeds_a_model(run):
    """--tensor tokens=text:... gives llama.gg the ids `ggtool tokenize` gives: the README's predictions."""
    r = run("compute", "-f", "ggtool/programs/llama.gg", "--gguf", STORIES, "--tensor", "tokens=text:Once upon a time, there was",
            "--output", "tokens")
    assert ok(r) == "[1,403,407,261,378,432,383,286]\n"


def test_text_source_without_a_model_names_the_flag(run):
    fails(run("compute", "tokens", "--tensor", "tokens=text:hello"), "--tensor tokens: a text source",
          "--gguf MODEL")
