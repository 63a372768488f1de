"""The boundary between the engine and the command line: the engine's input and DSL errors name
what and where in their own words and fields; commands/wording.py alone words them with flags.

Each CLI case here is one kind of engine error, checked twice: what the engine says (neutral,
with its fields) and the one line the command line prints (with the flag that fixes it)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import numpy as np
import pytest
from conftest import STORIES, fails, write_gguf

from ggtool import Context
from ggtool.dsl import DictEnv, DSLError, StepLimitError, build, parse
from ggtool.errors import InputError
from ggtool.tensor_io import Inputs, SourceSyntaxError, parse_named_source

ENGINE = Path(__file__).resolve().parent.parent / "ggtool"
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


def _strings(path: Path) -> list[tuple[int, str]]:
    """Every string literal of a module (docstrings and f-string parts included), with its line."""
    kinds = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    with open(path, "rb") as f:
        return [(t.start[0], t.string) for t in tokenize.tokenize(f.readline) if t.type in kinds]


def test_no_option_name_in_any_string_of_the_engine():
    """The engine speaks no CLI: no `--flag` in any string (docstrings and f-strings included) of any
    module under ggtool/; commands/ words the flags."""
    files = sorted(ENGINE.rglob("*.py"))
    assert len(files) > 50
    found = [f"{f.relative_to(ENGINE)}:{line}: {s.strip()[:80]}" for f in files for line, s in _strings(f)
             if OPTION.search(s)]
    assert found == []


def test_the_option_check_sees_strings():
    """The check above can fail: a docstring and an f-string part naming a flag are both found."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write('"""Use --force."""\nx = 1\ny = f"{x} --gguf FILE"\n')
    try:
        assert [s for _, s in _strings(Path(f.name)) if OPTION.search(s)] != []
        assert len([s for _, s in _strings(Path(f.name)) if OPTION.search(s)]) == 2
    finally:
        Path(f.name).unlink()


def _inputs(*bindings, gguf_paths=(), stdin=None):
    return Inputs([parse_named_source(b) for b in bindings], list(gguf_paths), stdin=stdin)


# -- usage errors (exit 2) --------------------------------------------------------------------------------
def test_a_duplicate_input(run):
    with pytest.raises(SourceSyntaxError) as e:
        _inputs("a=[1]", "a=[2]")
    assert (str(e.value), e.value.input, e.value.kind) == ("input 'a': given twice", "a", "duplicate-input")
    err = fails(run("compute", "relu(a)", "--tensor", "a=[1]", "--tensor", "a=[2]"), code=2)
    assert err.splitlines()[-1] == "Error: --tensor a is given twice"


def test_two_inputs_from_stdin(run):
    with pytest.raises(SourceSyntaxError) as e:
        _inputs("a=-", "b=-", stdin=io.BytesIO(b"[1]"))
    assert e.value.details["names"] == ["a", "b"] and "--" not in str(e.value)
    err = fails(run("compute", "add(a, b)", "--tensor", "a=-", "--tensor", "b=-", input="[1]"), code=2)
    assert err.splitlines()[-1] == "Error: only one --tensor can read stdin ('-'); a, b all do"


@pytest.mark.parametrize("binding, neutral, worded", [
    ("a", "'a': expected NAME=SOURCE", "--tensor 'a': expected NAME=SOURCE"),
    ("a=", "input 'a': empty source", "--tensor a: empty source"),
    ("a=m.gguf", "input 'a': name the tensor: m.gguf:TENSOR",
     "--tensor a: name the tensor: m.gguf:TENSOR (or use --gguf m.gguf to make all of its tensors available)"),
])
def test_malformed_bindings(run, binding, neutral, worded):
    with pytest.raises(SourceSyntaxError) as e:
        parse_named_source(binding)
    assert str(e.value).startswith(neutral) and "--" not in str(e.value)
    err = fails(run("compute", "relu(a)", "--tensor", binding), code=2)
    assert f"Invalid value for '--tensor': {worded}" in err


# -- data errors (exit 1) ---------------------------------------------------------------------------------
def test_a_type_without_kernels_asks_for_a_prefix(run, tmp_path):
    path = write_gguf(tmp_path / "w.gguf", {"wide": np.arange(4, dtype=np.float64)})
    with pytest.raises(InputError) as e:
        _inputs(gguf_paths=[path]).tensor("wide", Context())
    assert str(e.value).endswith(f"say so: wide=f32:{path}:wide")
    err = fails(run("compute", "relu(wide)", "--gguf", path))
    assert err == (f"Error: line 1, column 6: input 'wide': --gguf {path}: tensor 'wide' is f64, a type ggtool does "
                   f"not compute with; to use it converted to f32, say so: --tensor wide=f32:{path}:wide\n")
    err = fails(run("compute", "relu(x)", "--tensor", f"x={path}:wide"))
    assert err == (f"Error: --tensor x: {path}:wide is f64, a type ggtool does not compute with; to use it converted "
                   f"to f32, say so: --tensor x=f32:{path}:wide\n")


def test_a_name_in_two_gguf_files(run, tmp_path):
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(STORIES.read_bytes())
    with pytest.raises(InputError) as e:
        _inputs(gguf_paths=[STORIES, copy]).tensor("output.weight", Context())
    files = [Path(f).name for f in e.value.details["files"]]   # as first opened: relative or not
    assert (e.value.kind, e.value.tensor, files) == ("ambiguous-tensor", "output.weight", [STORIES.name, "copy.gguf"])
    err = fails(run("compute", "relu(output.weight)", "--gguf", STORIES, "--gguf", copy))
    assert re.search(r"; pick one with --tensor output\.weight=\S*stories260K\.gguf:output\.weight\n\Z", err), err


def test_a_gguf_file_on_stdin(run):
    with pytest.raises(InputError) as e:
        _inputs("a=-", stdin=io.BytesIO(b"GGUF\x03\x00\x00\x00"))
    assert str(e.value) == "input 'a': stdin is a GGUF file; save it and read it from the file"
    err = fails(run("compute", "relu(a)", "--tensor", "a=-", input="GGUF\x03\x00\x00\x00"))
    assert err == "Error: --tensor a: stdin is a GGUF file; save it and use --gguf FILE or FILE.gguf:TENSOR\n"


def test_a_bad_gguf_file_given_whole(run, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope")
    with pytest.raises(InputError) as e:
        _inputs(gguf_paths=[str(bad)])
    assert (e.value.file, e.value.input) == (str(bad), None) and str(e.value).startswith(f"{bad}: ")
    assert fails(run("compute", "relu(a)", "--gguf", bad)).startswith(f"Error: --gguf {bad}: ")


def _dsl_error(program: str, env, **options) -> DSLError:
    with pytest.raises(DSLError) as e:
        build(parse(program), Context(), env, **options)
    return e.value


def test_a_missing_or_mistyped_input(run):
    e = _dsl_error('x = input("t", i32, 4)', DictEnv())
    assert (e.kind, e.details["name"], e.hint) == ("missing-input", "t", "")
    assert fails(run("compute", 'x = input("t", i32, 4)')) == \
        "Error: line 1, column 11: no input 't' was given (give it with --tensor t=...)\n"
    e = _dsl_error('x = input("t", i32, 4)', DictEnv({"t": np.ones(4, np.float32)}))
    assert (e.kind, e.hint) == ("input-type", " (e.g. t=i32:...)")
    assert fails(run("compute", 'x = input("t", i32, 4)', "--tensor", "t=[1.5]")) == \
        "Error: line 1, column 11: input 't' is f32, the program needs i32 (e.g. --tensor t=i32:...)\n"
    assert fails(run("plan", 'x = input("t", i32)')) == ("Error: line 1, column 11: no input 't' was given and input() "
                                                         "has no placeholder shape (give --tensor t=...)\n")


def test_the_step_limit_and_a_path_for_an_output(run):
    e = _dsl_error("for i in range(100): x = 1; end\nrelu(a)", DictEnv({"a": [1.0]}), max_steps=5)
    assert isinstance(e, StepLimitError) and e.kind == "step-limit" and "--" not in str(e)
    err = fails(run("compute", "for i in range(100): x = 1; end\nrelu(a)", "--tensor", "a=[1]", "--max-steps", "5"))
    assert err.rstrip().endswith("a loop without end? (--max-steps N raises the limit)")
    err = fails(run("compute", "relu(a)", "--tensor", "a=[1]", "--output", "y.npy"))
    assert err == ("Error: unknown output 'y.npy': --output names a tensor of the program; to write the result to "
                   "the file y.npy, use -o y.npy\n")


def test_with_message_keeps_the_position():
    e = _dsl_error("y = relu(nope)", DictEnv({"x": np.ones(2, np.float32)}))
    worded = e.with_message("something else", hint=" (a hint)")
    assert (worded.line, worded.column, type(worded)) == (e.line, e.column, type(e))
    assert str(worded).splitlines()[0] == f"line {e.line}, column {e.column}: something else (a hint)"
    assert str(e).splitlines()[0].startswith(f"line {e.line}, column {e.column}: unknown tensor or variable 'nope'")
