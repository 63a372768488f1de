"""Every bad input: exit 1 with one `Error: ...` line naming what and where (2 for bad usage),
nothing on stdout, never a traceback."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from conftest import STORIES, fails, ok, write_gguf

A = "a=[[2,8],[5,1],[4,2],[8,6]]"
B = "b=[[10,5],[9,9],[5,4]]"


def small_gguf(path, ne0=4):
    return write_gguf(path, {"w": np.arange(ne0, dtype=np.float32)})


def patch_tensor_info(path, field: str, value: int):
    """Overwrite tensor 'w''s type id or data offset in its GGUF tensor info."""
    data = bytearray(path.read_bytes())
    at = data.index(struct.pack("<Q", 1) + b"w") + 9  # after the name
    n_dims = struct.unpack_from("<I", data, at)[0]
    type_at = at + 4 + 8 * n_dims
    if field == "type":
        struct.pack_into("<I", data, type_at, value)
    else:
        struct.pack_into("<Q", data, type_at + 4, value)
    path.write_bytes(bytes(data))
    return path


# -- the program -------------------------------------------------------------------------------------
def test_malformed_expression(run):
    err = fails(run("compute", "mul_mat(a, ", "--tensor", A, "--tensor", B))
    assert err.startswith("Error: line 1, column")


def test_unknown_op(run):
    fails(run("compute", "mul_matt(a, b)", "--tensor", A, "--tensor", B), "unknown op 'mul_matt'", "mul_mat")


def test_mismatched_shapes(run):
    fails(run("compute", "mul_mat(a, b)", "--tensor", A, "--tensor", "b=[[1,2,3]]"), "mul_mat")


def test_missing_tensor_name(run):
    fails(run("compute", "mul_mat(a, c)", "--tensor", A, "--tensor", B), "'c'")


def test_dsl_error_in_program_file_names_the_file(run, tmp_path):
    prog = tmp_path / "bad.prog"
    prog.write_text("x = relu(a)\ny = relu(nope)\n")
    fails(run("compute", "-f", prog, "--tensor", A), f"{prog}", "line 2")


def test_unknown_output(run):
    fails(run("compute", "relu(a)", "--tensor", A, "--output", "zz"), "unknown output 'zz'")


def test_program_twice_or_never(run, tmp_path):
    prog = tmp_path / "p.prog"
    prog.write_text("relu(a)")
    fails(run("compute", "relu(a)", "-f", prog, "--tensor", A), "not both", code=2)
    fails(run("compute", "--tensor", A), "no program", code=2)
    fails(run("compute", "-f", tmp_path / "missing.prog", "--tensor", A), "missing.prog", code=2)


def test_program_file_not_utf8(run, tmp_path):
    prog = tmp_path / "p.prog"
    prog.write_bytes(b"relu(\xff)")
    fails(run("compute", "-f", prog, "--tensor", A), "not UTF-8")


# -- --tensor syntax (usage errors, exit 2) -----------------------------------------------------------
@pytest.mark.parametrize("option, message", [
    ("a", "expected NAME=SOURCE"),
    ("9a=[1]", "is not a tensor name"),
    ("a=q4_K:[1]", "cannot convert to 'q4_K'"),
    ("a=f32[2,x]", "bad shape"),
    ("a=model.gguf", "name the tensor"),
])
def test_bad_tensor_option(run, option, message):
    fails(run("compute", "relu(a)", "--tensor", option), message, code=2)


def test_two_stdin_inputs(run):
    fails(run("compute", "add(a, b)", "--tensor", "a=-", "--tensor", "b=-", input="[1]"),
          "only one --tensor can read stdin", code=2)


def test_program_and_tensor_both_from_stdin(run):
    fails(run("compute", "-f", "-", "--tensor", "a=-", input="relu(a)"), "both read stdin", code=2)


def test_duplicate_tensor_name(run):
    fails(run("compute", "relu(a)", "--tensor", "a=[1]", "--tensor", "a=[2]"), "given twice", code=2)


def test_bad_threads(run):
    fails(run("compute", "relu(a)", "--tensor", A, "--threads", "0"), "--threads", code=2)


def test_missing_gguf_file(run, tmp_path):
    fails(run("compute", "relu(a)", "--gguf", tmp_path / "nope.gguf"), "nope.gguf", code=2)


# -- data (exit 1) -----------------------------------------------------------------------------------------
def test_non_rectangular_json(run):
    err = fails(run("compute", "mul_mat(a, b)", "--tensor", A, "--tensor", "b=[[10,5],[9,9,9]]"))
    assert err == "Error: --tensor b: JSON is not rectangular: row 1 has 3 elements, row 0 has 2\n"


@pytest.mark.parametrize("source, message", [
    ("[1, true]", "element [1] is a boolean"),
    ('["x"]', "element [0] is a string"),
    ("[1, 2", "invalid JSON"),
    ("i32:[1.5]", "i32 needs whole numbers"),
    ("f16:[1e6]", "too large for f16"),
    ("[[[[[1]]]]]", "5 dimensions"),
])
def test_bad_json_values(run, source, message):
    fails(run("compute", "relu(a)", "--tensor", f"a={source}"), "--tensor a: ", message)


def test_bad_stdin(run):
    fails(run("compute", "relu(a)", "--tensor", "a=-", input=""), "--tensor a: stdin is empty")
    fails(run("compute", "relu(a)", "--tensor", "a=-", input=b"\x93NUMPY\x01\x00garbage"), "--tensor a")
    fails(run("compute", "relu(a)", "--tensor", "a=-", input=b"\xff\xfe"), "neither a .npy stream nor JSON")
    fails(run("compute", "relu(a)", "--tensor", "a=-", input=b"GGUF\x03\x00"), "stdin is a GGUF file")


def test_pickled_npy(run, npy):
    p = npy(np.array([{"a": 1}], dtype=object))
    fails(run("compute", "relu(a)", "--tensor", f"a={p}"), "--tensor a", "pickled", "allow_pickle=False")


@pytest.mark.parametrize("array, message", [
    (np.zeros((1, 1, 1, 1, 2), np.float32), "5 dimensions"),
    (np.array([True]), "boolean arrays are not supported"),
    (np.array(["s"]), "is not supported"),
    (np.array([2**40]), "does not fit in i32"),
])
def test_unsupported_npy(run, npy, array, message):
    fails(run("compute", "relu(a)", "--tensor", f"a={npy(array)}"), message)


def test_truncated_npy(run, npy):
    p = npy(np.ones(100, np.float32))
    p.write_bytes(p.read_bytes()[:-4])
    fails(run("compute", "relu(a)", "--tensor", f"a={p}"), "truncated")


def test_missing_npy(run, tmp_path):
    fails(run("compute", "relu(a)", "--tensor", f"a={tmp_path / 'no.npy'}"), "--tensor a", "No such file")


def test_truncated_gguf(run, tmp_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(STORIES.read_bytes()[:600_000])
    fails(run("compute", "relu(a)", "--gguf", bad, "--tensor", A), "--gguf", "truncated")
    fails(run("compute", "relu(a)", "--tensor", f"a={bad}:output.weight"), "--tensor a", "truncated")


def test_gguf_lying_about_type(run, tmp_path):
    bad = patch_tensor_info(small_gguf(tmp_path / "t.gguf"), "type", 99)
    fails(run("compute", "relu(w)", "--gguf", bad), "unknown or removed GGML type id 99")


def test_gguf_lying_about_offset(run, tmp_path):
    bad = patch_tensor_info(small_gguf(tmp_path / "o.gguf"), "offset", 1 << 20)
    fails(run("compute", "relu(w)", "--gguf", bad), "tensor 'w' needs bytes")


def test_not_a_gguf(run, tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + bytes(100))
    fails(run("inspect-graph", "relu(w)", "--gguf", bad), "not a GGUF file")


def test_missing_gguf_tensor(run):
    fails(run("compute", "relu(a)", "--tensor", f"a={STORIES}:output.weights"),
          "has no tensor 'output.weights'", "did you mean 'output.weight'")


def test_quantized_row_length(run):
    # ffn_down rows are 172 long: not a whole number of q4_0 blocks
    fails(run("inspect-graph", "relu(a)", "--tensor", f"a=q4_0:{STORIES}:blk.0.ffn_down.weight"),
          "--tensor a", "blocks of 32")


# -- the process -------------------------------------------------------------------------------------------
def test_ctrl_c_exits_130(run, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("ggtool.commands.compute.build_graph", interrupted)
    r = run("compute", "relu(a)", "--tensor", A)
    assert r.exit_code == 130 and "Traceback" not in r.stderr and r.stdout == ""


def test_internal_error_is_one_line(run, monkeypatch):
    def bug(*a, **k):
        raise ZeroDivisionError("oops")

    monkeypatch.setattr("ggtool.commands.compute.build_graph", bug)
    fails(run("compute", "relu(a)", "--tensor", A), "internal error: ZeroDivisionError: oops", "GGTOOL_DEBUG=1")


def test_success_still_works(run):
    assert ok(run("compute", "relu(a)", "--tensor", "a=[-1, 2]")) == "[0,2]\n"


def test_an_output_name_that_looks_like_a_file_says_to_use_o(run):
    """--output NAME picks a tensor, -o FILE writes one: mixing them up says which is which."""
    fails(run("compute", "y = add(a, a)", "--tensor", "a=[1]", "--output", "y.npy"),
          "unknown output 'y.npy': --output names a tensor of the program; to write the result to the file "
          "y.npy, use -o y.npy")
    err = fails(run("compute", "y = add(a, a)", "--tensor", "a=[1]", "--output", "yy"), "unknown output 'yy'")
    assert "-o" not in err
