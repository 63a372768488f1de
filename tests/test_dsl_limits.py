"""The DSL's limits (ggtool/dsl/limits.py, docs/dsl.md "Limits"): a hostile program ends in one
DSLError at its line and column, soon and in little memory, never in a hang, an exhausted memory
or a Python exception. One test per hostile class; one program of each class goes through the CLI."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import fails, ok

import ggtool
from ggtool.dsl import DictEnv, DSLError, StepLimitError, build, parse, unparse
from ggtool.dsl.limits import MAX_RUN_DEPTH, MAX_SOURCE_BYTES, MAX_STEPS, MAX_STRING

A = {"a": np.ones(2, np.float32)}
ONE = ("--tensor", "a=[1]")


def err(source, metadata=None, filename="<program>", **kw) -> DSLError:
    with pytest.raises(DSLError) as e:
        build(parse(source, filename), ggtool.Context(), DictEnv(A, metadata), **kw)
    assert e.value.line is not None and e.value.column is not None, str(e.value)
    return e.value


def value(source, **kw):
    return build(parse(source + "\nrelu(a)"), ggtool.Context(), DictEnv(A), **kw).variables["x"]


# -- steps -------------------------------------------------------------------------------------------
def test_a_loop_without_end_stops_at_the_step_limit(run):
    """`for i in range(1000000000)` does not run for ever: it stops after MAX_STEPS statements and
    iterations, and --max-steps moves the limit either way."""
    fails(run("compute", "for i in range(1000000000): x = 1; end\nrelu(a)", *ONE),
          f"line 1, column 29, in loop iteration i={MAX_STEPS // 2 - 1}: the program ran more than {MAX_STEPS} steps",
          "(--max-steps N raises the limit)")
    fails(run("compute", "for i in range(1000000000): end\nrelu(a)", *ONE, "--max-steps", "50"),
          "line 1, column 1, in loop iteration i=49: the program ran more than 50 steps")
    ok(run("compute", "for i in range(99): x = 1; end\nrelu(a)", *ONE, "--max-steps", "200"))
    e = err("for i in range(99): x = 1; end\nrelu(a)", max_steps=100)
    assert isinstance(e, StepLimitError) and e.loop == "i=49"
    assert "(default 1000000)" in " ".join(run("compute", "--help").stdout.split()) and MAX_STEPS == 1000000


# -- nesting -----------------------------------------------------------------------------------------
DEEP_TEXT = {
    "1000 parentheses": "x = " + "(" * 1000 + "1" + ")" * 1000,
    "65 parentheses": "x = " + "(" * 65 + "1" + ")" * 65,
    "a chain of 65 operators": "x = " + " + ".join(["1"] * 66),
    "calls in calls": "x = " + "abs(" * 70 + "1" + ")" * 70,
    "unary minus": "x = " + "-" * 1000 + "a",
    "not": "x = " + "not " * 1000 + "1",
    "indexes": "x = a" + "[0" * 70 + "]" * 70,
    "blocks": "if 1:\n" * 70 + "x = 1\n" + "end\n" * 70,
    "interpolations": "x = a" + "{a" * 70 + "}" * 70,
}


@pytest.mark.parametrize("source", DEEP_TEXT.values(), ids=DEEP_TEXT.keys())
def test_nesting_in_the_text_is_bounded(source):
    """1000 nested parentheses are no RecursionError: past 64 levels (of any kind, an operator
    chain's included) parsing stops at the culprit."""
    with pytest.raises(DSLError, match="nests more than 64 levels deep") as e:
        parse(source)
    assert e.value.line is not None and e.value.column > 0


def test_the_depth_check_knows_every_node_with_children():
    """parser._NODE_FIELDS lists where each node class keeps its children: a class missing there
    would let its nesting past the check."""
    from ggtool.dsl import nodes
    from ggtool.dsl.parser import _NODE_FIELDS

    classes = {v for v in vars(nodes).values() if isinstance(v, type) and "pos" in getattr(v, "__slots__", ())}
    leaves = {nodes.Num, nodes.TypeWord, nodes.Null}
    assert classes - leaves == set(_NODE_FIELDS)


def test_sixty_four_levels_are_allowed_and_print_back():
    for source in ("x = " + "(" * 64 + "1" + ")" * 64, "x = " + " + ".join(["1"] * 64),
                   "if 1:\n" * 63 + "x = 1\n" + "end\n" * 63):
        assert parse(unparse(parse(source))) == parse(source)
    assert value("x = " + " + ".join(["1"] * 64)) == 64


RUNAWAY = {
    "blocks in a recursion": "def f(n):\n if 1: if 1: if 1: return f(n + 1); end; end; end\nend\nx = f(0)",
    "arguments in a recursion": "def f(n):\n return " + "max(" * 60 + "f(n + 1)" + ", 1)" * 60 + "\nend\nx = f(0)",
    "names in a recursion": "def f(n):\n return " + "a{" * 30 + "f(n + 1)" + "}" * 30 + "\nend\nx = f(0)",
    "strings in a recursion": "def f(n):\n return " + '"{' * 30 + "f(n + 1)" + '}"' * 30 + "\nend\nx = f(0)",
}


@pytest.mark.parametrize("source", RUNAWAY.values(), ids=RUNAWAY.keys())
def test_nesting_while_running_is_bounded_through_calls(run, source):
    """Each function body is shallow, but calls stack them: past MAX_RUN_DEPTH levels in all the
    program stops, before Python's own recursion limit (here under click and pytest's frames)."""
    fails(run("compute", source + "\nrelu(a)", *ONE),
          f"the program nests more than {MAX_RUN_DEPTH} levels deep while it runs", "in f() called at line 2 (")


def test_a_runaway_recursion_is_one_short_line():
    e = err("def f(n): return f(n + 1); end\nx = f(0)")
    first = str(e).splitlines()[0]
    assert first == ("line 1, column 18, in f() called at line 1 (63 times), in f() called at line 2: "
                     "f(): calls nest more than 64 deep (a function that calls itself without end?)")


# -- numbers -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("source, message", [
    ("x = " + "9" * 5000, "integer '9999999999999999999999999999999999999999'... (5000 characters) is out of range"),
    ("x = 9223372036854775808", "integer 9223372036854775808 is out of range (int64: "),
    ("x = -9223372036854775809", "integer -9223372036854775809 is out of range"),
    ("x = 4611686018427387904 * 2", "4611686018427387904 * 2 is out of range (int64: "),
    ("x = -9223372036854775807 - 2", "-9223372036854775807 - 2 is out of range"),
    ("y = -9223372036854775807 - 1\nx = -y", "-(-9223372036854775808) is out of range"),
    ('x = int("99999999999999999999")', "int(): '99999999999999999999' is out of range"),
    ('x = int("9" * 2)', "'*' needs numbers"),
    ("x = int(1e300)", "int(): 1e+300 is out of range"),
    ('x = reshape_1d(a, meta("n"))', "reshape_1d(): 18446744073709551615 is out of range (int64: "),
])
def test_integers_stay_in_int64(source, message):
    """A 5000-digit literal is an error at its place, no ValueError: every int a program makes
    (literal, arithmetic, int()) or hands to an op (a uint64 metadata value) fits in C's int64_t."""
    assert message in str(err(source, {"n": np.uint64(2**64 - 1)}))


def test_int64_bounds_themselves_are_fine():
    assert value("x = -9223372036854775807 - 1") == -2**63 and value("x = 9223372036854775807") == 2**63 - 1


@pytest.mark.parametrize("source, message", [
    ("x = 1e400", "number '1e400' is too large for a float (it would be inf)"),
    ("x = 1e300 * 1e300", "1e+300 * 1e+300 overflows a float (it would be inf)"),
    ("x = -1e308 - 1e308", "overflows a float (it would be -inf)"),
    ("x = 1e308 / 1e-308", "overflows a float"),
    ('x = float("1e999")', "float(): '1e999' is too large for a float (it would be inf)"),
    ("x = exp(1000)", "exp(1000): math range error"),
])
def test_floats_that_overflow_are_errors(source, message):
    """Float arithmetic that overflows is an error, never an inf handed to an op's parameter in silence."""
    assert message in str(err(source))


def test_infinity_asked_for_by_name_stays_allowed():
    assert value('x = float("-inf")') == float("-inf")


# -- strings -----------------------------------------------------------------------------------------
def test_strings_built_by_interpolation_are_bounded():
    """A string doubled in a loop would take all memory in 40 iterations; past MAX_STRING
    characters it is an error at the string, and a message quotes a long value only in part."""
    e = err('s = "ab"\nfor i in range(40): s = "{s}{s}"; end')
    assert str(e).startswith(f"line 2, column 25, in loop iteration i=11: this string would be 8192 characters "
                             f"long; at most {MAX_STRING} may be built with {{...}}")
    e = err('n = "x"\nfor i in range(40): n = "{n}{n}"; y = t{n}; end')
    assert "in loop iteration i=0: unknown tensor 't" in str(e)
    e = err("x = " + "z" * 5000)
    assert f"unknown tensor or variable '{'z' * 100}'... (5000 characters)" in str(e)
    e = err('x = "' + "q" * 3000 + '" + 1')
    assert "got string 'qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq'... (3000 characters)" in str(e)


# -- include -----------------------------------------------------------------------------------------
def include(tmp_path, target: str) -> DSLError:
    main = tmp_path / "main.gg"
    main.write_text(f'include "{target}"\nrelu(a)\n')
    return err(main.read_text(), filename=str(main))


def test_include_reads_only_gg_files(run):
    """`include "/dev/zero"` does not read until memory runs out: include reads DSL programs, .gg
    files, and a device, /etc/passwd or a model never is."""
    fails(run("compute", 'include "/dev/zero"\nrelu(a)', *ONE),
          "line 1, column 9: include: can't read '/dev/zero': not a .gg file (include reads programs only)")


def test_include_reads_only_regular_files(tmp_path):
    """A FIFO (never opened for a blocking read), a directory or a device named .gg: refused."""
    os.mkfifo(tmp_path / "fifo.gg")
    (tmp_path / "dir.gg").mkdir()
    os.symlink("/dev/zero", tmp_path / "zero.gg")
    for name in ("fifo.gg", "dir.gg", "zero.gg"):
        assert f"include: can't read '{tmp_path}/{name}': not a regular file" in str(include(tmp_path, name))


def test_include_reads_at_most_a_mebibyte(tmp_path):
    (tmp_path / "big.gg").write_text("x = 1\n" + "#" * MAX_SOURCE_BYTES)
    assert f"larger than {MAX_SOURCE_BYTES} bytes" in str(include(tmp_path, "big.gg"))
    (tmp_path / "fits.gg").write_text("x = 1\n" + "#" * (MAX_SOURCE_BYTES - 7) + "\n")
    main = tmp_path / "main.gg"
    main.write_text('include "fits.gg"\nrelu(a)\n')
    assert build(parse(main.read_text(), str(main)), ggtool.Context(), DictEnv(A)).variables["x"] == 1


def test_an_included_binary_file_is_never_echoed(run, tmp_path):
    """A model renamed .gg, or bytes that are not UTF-8: the error says so, and shows none of them."""
    secret = b"GGUF\x03\x00\x00\x00" + b"hunter2-secret\x00" * 4
    (tmp_path / "model.gg").write_bytes(secret)
    (tmp_path / "latin1.gg").write_bytes(b"x = 1 # caf\xe9 hunter2-secret\n")
    for name, reason in (("model.gg", "not a text file (a NUL byte at offset 5)"),
                         ("latin1.gg", "not UTF-8 text (invalid continuation byte at byte 11)")):
        e = include(tmp_path, name)
        assert reason in str(e) and "hunter2" not in str(e) and "GGUF" not in str(e)
        result = run("compute", "-f", tmp_path / "main.gg", *ONE)
        assert "hunter2" not in fails(result, reason)


def test_include_cycles_end_and_include_depth_is_bounded(tmp_path):
    (tmp_path / "a.gg").write_text('include "b.gg"\nx = 1\n')
    (tmp_path / "b.gg").write_text('include "a.gg"\ny = 2\n')
    main = tmp_path / "main.gg"
    main.write_text('include "a.gg"\nrelu(a)\n')
    v = build(parse(main.read_text(), str(main)), ggtool.Context(), DictEnv(A)).variables
    assert (v["x"], v["y"]) == (1, 2)
    for i in range(20):
        (tmp_path / f"c{i}.gg").write_text(f'include "c{i + 1}.gg"\n')
    (tmp_path / "c20.gg").write_text("x = 1\n")
    e = include(tmp_path, "c0.gg")
    assert "include: files include each other more than 16 deep" in str(e)
    assert f"{tmp_path}/c15.gg, line 1, column 9, included from {tmp_path}/c14.gg line 1" in str(e)


def test_a_parse_error_in_an_included_file_says_where_it_was_included_from(tmp_path):
    (tmp_path / "bad.gg").write_text("x = (1\n")
    e = include(tmp_path, "bad.gg")
    assert str(e).startswith(f"{tmp_path}/bad.gg, line 1, column 5, included from {tmp_path}/main.gg line 1: "
                             "'(' was never closed")


def test_a_program_file_is_read_up_to_a_mebibyte(run, tmp_path):
    """-f /dev/zero reads no more than a program's limit, and stops there with one line."""
    fails(run("compute", "-f", "/dev/zero"), f"/dev/zero: a program is at most {MAX_SOURCE_BYTES} bytes")
    big = tmp_path / "big.gg"
    big.write_text("relu(a)\n" + "#" * MAX_SOURCE_BYTES)
    fails(run("compute", "-f", big, *ONE), "a program is at most")
