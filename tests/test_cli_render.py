"""The command line's presentation: one JSON writer with one NaN policy (strict JSON, non-finite
numbers as the strings "NaN", "Infinity", "-Infinity"), one table renderer, one progress context."""

import io
import json
import math

import numpy as np
import pytest
from conftest import STORIES, ok, write_gguf
from ggtool.commands._json import arrays_document, dumps, format_numbers, record_lines
from ggtool.commands._progress import progress_bar
from ggtool.commands._table import table


def strict(text: str):
    """json.loads as a strict parser (jq, JavaScript) reads: bare NaN or Infinity is an error."""
    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")

    return json.loads(text, parse_constant=refuse)


# -- the JSON policy, in each command that writes JSON ---------------------------------------------------
def test_compute_writes_non_finite_values_as_strings_that_round_trip(run):
    out = ok(run("compute", "div(x, y)", "--tensor", "x=[[1,-1],[0,2]]", "--tensor", "y=[[0,0],[0,4]]"))
    assert strict(out) == [["Infinity", "-Infinity"], ["NaN", 0.5]]
    back = ok(run("compute", "x", "--tensor", "x=-", input=out))    # --tensor NAME=- reads them back
    assert back == out
    several = ok(run("compute", "y = div(x, z)\nw = neg(y)", "--output", "y", "--output", "w",
                     "--tensor", "x=[1]", "--tensor", "z=[0]"))
    assert strict(several) == {"y": ["Infinity"], "w": ["-Infinity"]}


def test_compute_json_file_uses_the_same_policy(run, tmp_path):
    out = tmp_path / "r.json"
    ok(run("compute", "div(x, y)", "--tensor", "x=[1,0]", "--tensor", "y=[0,0]", "-o", out))
    assert out.read_text() == '["Infinity","NaN"]\n'


def test_json_input_reads_bare_and_string_non_finite_values(run):
    assert ok(run("compute", "x", "--tensor", 'x=[NaN, "Infinity", -Infinity, "-Infinity"]')) == \
        '["NaN","Infinity","-Infinity","-Infinity"]\n'
    bad = run("compute", "x", "--tensor", 'x=["nan"]')
    assert bad.exit_code == 1 and "JSON element [0] is a string" in bad.stderr


def test_compare_json_writes_infinite_errors_as_strings(run, tmp_path):
    x = np.ones(32, np.float32)
    y = x.copy()
    y[3] = np.inf
    a = write_gguf(tmp_path / "a.gguf", {"w": x})
    b = write_gguf(tmp_path / "b.gguf", {"w": y})
    d = strict(ok(run("compare", a, b, "--json")))
    w = d["tensors"][0]
    assert w["nmse"] == w["max_abs_error"] == w["rel_rms"] == w["rms_error"] == "Infinity"
    assert d["summary"]["nmse"] == "Infinity" and math.isinf(float(d["summary"]["nmse"]))


def test_inspect_json_writes_non_finite_metadata_and_stats_as_strings(run, tmp_path):
    x = np.full(32, np.nan, np.float32)           # no finite value: min/max/mean/std are null
    p = write_gguf(tmp_path / "m.gguf", {"w": x}, kv={"t.nan": math.nan, "t.inf": -math.inf})
    d = strict(ok(run("inspect", p, "--json", "--stats")))
    values = {m["key"]: m["value"] for m in d["metadata"]}
    assert values["t.nan"] == "NaN" and values["t.inf"] == "-Infinity"
    assert d["tensors"][0]["stats"] == {"min": None, "max": None, "mean": None, "std": None, "nonfinite": 32}
    text = ok(run("inspect", p))   # the text report keeps its own words
    assert "t.nan" in text and " nan" in text and " -inf" in text


@pytest.mark.parametrize("args", [
    ("inspect-graph", "div(x, y)", "--tensor", "x=[1]", "--tensor", "y=[0]", "--json"),
    ("plan", "div(x, y)", "--tensor", "x=[1]", "--tensor", "y=[0]", "--json"),
    ("ops", "--json"),
    ("ops", "--builtins", "--json"),
    ("inspect", STORIES, "--json", "--stats"),
])
def test_every_json_output_is_strict_json(run, args):
    strict(ok(run(*args)))


# -- the writer ------------------------------------------------------------------------------------------
def test_writer_spells_non_finite_values_one_way():
    assert dumps({"a": math.nan, "b": [np.float32(np.inf), -math.inf], "c": np.int64(3)}) == \
        '{"a": "NaN", "b": ["Infinity", "-Infinity"], "c": 3}'
    assert format_numbers(np.array([np.nan, np.inf, -np.inf, 1.5], np.float32)) == \
        ['"NaN"', '"Infinity"', '"-Infinity"', "1.5"]
    assert format_numbers(np.array([np.inf, 2], np.float16)) == ['"Infinity"', "2"]
    assert "".join(arrays_document([("x", np.array([[1.0, np.nan]], np.float32))])) == '[[1,"NaN"]]\n'
    assert list(record_lines({"nodes": [{"i": 0}, {"i": math.inf}], "n": 2})) == \
        ['{', '"nodes": [', '  {"i": 0},', '  {"i": "Infinity"}', '],', '"n": 2', '}']


# -- tables and progress -------------------------------------------------------------------------------
def test_table_pads_aligns_and_caps_columns():
    rows = [["name", "n", "note"], ["a", "10", "x"], ["long_name", "2", ""]]
    assert table(rows, right={1}) == ["name        n  note", "a          10  x", "long_name   2"]
    capped = table([["ab", "wide cell", "z"], ["c", "w", "y"]], max_width={1: 4})
    assert capped == ["ab  wide cell  z", "c   w     y"]
    assert table([]) == []


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_shows_on_a_terminal_unless_quiet():
    term = _Terminal()
    with progress_bar(2048, "stats", "B", scale=1024, file=term) as bar:
        bar.update(2048)
    assert "stats" in term.getvalue() and "2.00k" in term.getvalue()
    with progress_bar(10, "x", " values", file=_Terminal(), quiet=True) as bar:
        assert bar is None
    with progress_bar(10, "x", " values", file=io.StringIO()) as bar:    # a pipe, a log file
        assert bar is None
