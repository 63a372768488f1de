"""The DSL forms gemma3.gg needed: comparisons and and/or/not, if/elif/else, functions (def/return),
include, metadata arrays (a[i], len, kind), causal_mask and has_tensor."""

from __future__ import annotations

import numpy as np
import pytest

import ggtool
from ggtool.dsl import DictEnv, DSLError, build, parse, unparse
from ggtool.dsl.nodes import BoolOp, Compare, If, Index, Name, Not, Num


def run(source, tensors=None, metadata=None, filename="<program>", **kw):
    return build(parse(source, filename), ggtool.Context(), DictEnv(tensors or {}, metadata), **kw)


def vars_of(source, tensors=None, **kw):
    """The variables after running `source` (which may end with a scalar: a tensor ends it here)."""
    v = run(source + "\n__t", {**(tensors or {}), "__t": np.zeros(1, np.float32)}, **kw).variables
    return v


def err(source, tensors=None, metadata=None, filename="<program>"):
    with pytest.raises(DSLError) as e:
        run(source, tensors, metadata, filename)
    return str(e.value)


A = {"a": np.arange(6, dtype=np.float32).reshape(2, 3)}


# -- comparisons and boolean operators ----------------------------------------------------------
def test_comparisons_give_1_or_0():
    v = vars_of('a = 2 < 3; b = 2 >= 3; c = 1 == 1.0; d = "x" != "y"; e = f16 == f16; f = null == null; '
                'g = 3 <= 3; h = 4 > 5')
    assert [v[k] for k in "abcdefgh"] == [1, 0, 1, 1, 1, 1, 1, 0]
    assert all(type(v[k]) is int for k in "abcdefgh")


def test_boolean_operators_short_circuit():
    v = vars_of("a = 1 and 0; b = 0 or 2; c = not 0; d = not 3; e = 0 and undefined; f = 1 or undefined")
    assert [v[k] for k in "abcdef"] == [0, 1, 1, 0, 0, 1]


def test_precedence():
    e = parse("x = not a < b + 1 and c or d").body[0].value
    assert e == BoolOp("or", BoolOp("and", Not(Compare("<", Name(("a",)), BinOpAdd("b", 1))), Name(("c",))),
                       Name(("d",)))
    assert vars_of("x = 1 + 2 * 3 == 7")["x"] == 1


def BinOpAdd(name, n):
    from ggtool.dsl.nodes import BinOp
    return BinOp("+", Name((name,)), Num(n))


@pytest.mark.parametrize("source, message", [
    ("x = a < 1", "'<' can't compare tensor 'a'"),
    ('x = 1 == "1"', "'==' can't compare int 1 with string '1'"),
    ('x = "a" < "b"', "'<' needs numbers, got string 'a'"),
    ("x = a and 1", "'and' needs a number (0 is false, anything else true), got tensor 'a'"),
    ('x = not "s"', "'not' needs a number"),
    ("x = 1 < 2 < 3", "comparisons can't be chained"),
])
def test_comparison_errors(source, message):
    assert message in err(source, A)


# -- if ------------------------------------------------------------------------------------------
def test_if_elif_else_picks_one_branch():
    src = """
for i in range(4):
    if i == 0:
        y = relu(a)
    elif i < 3:
        y = neg(a); k = i
    else:
        y = abs(a)
    end
end
"""
    built = run(src, A)
    assert built.variables["k"] == 2 and built.outputs[0][0] == "y"
    assert built.tensors["y-0"].op_desc == "RELU" and built.tensors["y-2"].op_desc == "NEG"
    assert built.tensors["y-3"].op_desc == "ABS" and "y-1" in built.tensors
    assert "x" not in vars_of("if 0: x = 1; end")
    assert vars_of("x = 5\nif x > 3: x = 1; else: x = 2; end")["x"] == 1


def test_if_without_a_taken_branch_leaves_the_result_to_the_statement_before():
    built = run("y = relu(a)\nif 0:\n    y = neg(a)\nend", A)
    assert built.outputs[0][1].op_desc == "RELU"


@pytest.mark.parametrize("source, message", [
    ("if 1:\n  x = 1\n", "line 1, column 1: 'if' block is never closed: expected 'end'"),
    ("else:\n", "'else' without an 'if'"),
    ("if 1: x = 1; else: x = 2; elif 1: x = 3; end", "'elif' here does not belong to the 'else' block"),
    ("for i in range(2): x = 1; else: end", "'else' here does not belong to the 'for' block"),
    ("if 1 x = 2; end", "expected ':' after the condition of 'if'"),
    ("if a: x = 1; end", "'if' needs a number"),
])
def test_if_errors(source, message):
    with pytest.raises(DSLError) as e:
        run(source, A)
    assert message in str(e.value)


# -- functions -----------------------------------------------------------------------------------
def test_functions_scope_defaults_keywords_and_names():
    src = """
eps = 1e-6
def norm_w(x, w, scale=2.0):
    normed = rms_norm(x, eps)      # reads the global eps
    tmp = 7                        # local: not visible outside
    return mul(scale(normed, scale), w)
end
for il in range(2):
    y = norm_w(a, b, scale=3.0)
end
z = norm_w(x=a, w=b)
"""
    built = run(src, {**A, "b": np.ones(3, np.float32)})
    assert "tmp" not in built.variables and "normed" not in built.variables and "x" not in built.variables
    assert built.tensors["normed-1"].op == "RMS_NORM" and built.tensors["y-1"].op == "MUL"
    assert built.tensors["normed"].op == "RMS_NORM" and built.tensors["z"].op == "MUL"
    scales = [n.param_f32(0) for n in built.graph.nodes if n.op == "SCALE"]
    assert scales == [2.0]   # the graph holds z's chain only
    ggtool.graph_compute(built.graph, 1)
    x = A["a"]
    want = x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6) * 2
    np.testing.assert_allclose(built.outputs[0][1].numpy().reshape(2, 3), want, rtol=1e-6)


def test_return_from_inside_blocks_and_a_function_without_return():
    v = vars_of("""
def first_odd(n):
    for i in range(n):
        if i % 2 == 1:
            return i
        end
    end
    return -1
end
def nothing():
    x = 1
end
a = first_odd(5); b = first_odd(1); c = kind(nothing())
""")
    assert (v["a"], v["b"], v["c"]) == (1, -1, "null")


def test_recursion_works_and_is_bounded():
    assert vars_of("def f(n):\n  if n == 0: return 1; end\n  return n * f(n - 1)\nend\nx = f(5)")["x"] == 120
    assert "calls nest more than 64 deep" in err("def f(n): return f(n + 1); end\nx = f(0)")


@pytest.mark.parametrize("source, message", [
    ("def f(a): return a; end\nx = f(1, 2)", "f() takes 1 argument, got 2: def f(a) (line 1)"),
    ("def f(a): return a; end\nx = f()", "f() is missing argument 'a'"),
    ("def f(a): return a; end\nx = f(b=1)", "f() has no parameter 'b'"),
    ("def f(a): return a; end\nx = f(1, a=2)", "got argument 'a' twice"),
    ("def add(a): return a; end", "can't define 'add': it is a GGML op"),
    ("def meta(a): return a; end", "can't define 'meta': it is a builtin"),
    ("def f(a): return a; end\ndef f(b): return b; end", "function 'f' is defined twice (first at <program> line 1)"),
    ("return 1", "'return' outside a function"),
    ("for i in range(2): def f(): return 1; end; end", "a function is defined at the top level"),
    ("def f(a=1, b): return a; end", "parameter 'b' without a default after one with a default"),
    ("def f(a, a): return a; end", "parameter 'a' repeated"),
    ("def f():\n  return\nend", "'return' needs a value"),
])
def test_function_errors(source, message):
    assert message in err(source)


def test_an_error_inside_a_function_names_the_call_and_the_loop():
    src = "def proj(il, h):\n    return mul_mat(blk.{il}.w, h)\nend\nfor il in range(3):\n    y = proj(il, a)\nend\n"
    message = err(src, {**A, "blk.0.w": A["a"], "blk.1.w": A["a"]}, filename="model.gg")
    assert message.startswith("model.gg, line 2, column 20, in proj() called at model.gg line 5, "
                              "in loop iteration il=2: unknown tensor 'blk.2.w'")
    assert message.endswith("\n  return mul_mat(blk.{il}.w, h)\n                 ^")


# -- include -------------------------------------------------------------------------------------
def test_include_runs_a_file_once_beside_the_program(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "common.gg").write_text('n = 3\ndef twice(x):\n    return add(x, x)\nend\n')
    (tmp_path / "model.gg").write_text('include "lib/common.gg"\ninclude "lib/common.gg"\nk = n\ny = twice(a)\n')
    path = tmp_path / "model.gg"
    built = build(parse(path.read_text(), str(path)), ggtool.Context(), DictEnv(A))
    assert built.variables["k"] == 3 and built.outputs[0][1].op == "ADD"


def test_include_errors(tmp_path):
    path = tmp_path / "model.gg"
    path.write_text('include "missing.gg"\n')
    message = err(path.read_text(), filename=str(path))
    assert message.startswith(f"{path}, line 1, column 9: include: can't read '{tmp_path}/missing.gg'")
    (tmp_path / "bad.gg").write_text("x = 1\ny = relu(nope)\n")
    path.write_text('\ninclude "bad.gg"\n')
    message = err(path.read_text(), filename=str(path))
    assert message.startswith(f"{tmp_path}/bad.gg, line 2, column 10, included from {path} line 2: "
                              "unknown tensor or variable 'nope'")
    assert "'include' is a top-level statement" in err('for i in range(1): include "x.gg"; end')
    assert "expected the file to include as a string" in err("include x.gg")


# -- metadata arrays, len, kind -----------------------------------------------------------------
def test_metadata_arrays():
    meta = {"pattern": [True, False, True], "names": np.array(["a", "b"]), "n": np.int32(4)}
    v = vars_of('p = meta("pattern"); a = p[0]; b = p[-1]; n = len(p); s = meta("names")[1]; '
                'k = kind(p); l = len("abc"); m = kind(meta("n")); t = kind(a)', metadata=meta)
    assert v["p"] == (1, 0, 1) and (v["a"], v["b"], v["n"], v["s"]) == (1, 1, 3, "b")
    assert (v["k"], v["l"], v["m"], v["t"]) == ("array", 3, "int", "int")
    assert [vars_of(f"x = kind({e})", tensors=A)["x"] for e in ("a", "1.5", '"s"', "f32", "null")] == \
        ["tensor", "float", "string", "type", "null"]


@pytest.mark.parametrize("source, message", [
    ('x = meta("p")[3]', "index 3 is out of range: the array has 3 values"),
    ('x = meta("p")[0.5]', "an index must be an integer, got float 0.5"),
    ("x = n[0]", "can't index int 2: only arrays (metadata arrays) have elements"),
    ('x = meta("p") + 1', "'+' needs numbers, got array of 3 ints"),
    ('x = t.{meta("p")}', "can't put array of 3 ints into a name"),
    ("x = len(2)", "len() needs an array or a string, got int 2"),
    ('x = meta("p")[0', "'[' was never closed"),
    ("x = f(1]", "']' does not close '('"),
])
def test_array_errors(source, message):
    assert message in err("n = 2\n" + source, metadata={"p": [1, 2, 3]})


# -- causal_mask, has_tensor --------------------------------------------------------------------
def test_causal_mask():
    built = run("m = causal_mask(4)\nw = causal_mask(4, 2, 6)")
    m, w = built.tensors["m"], built.tensors["w"]
    assert m.ne == (4, 4, 1, 1) and w.ne == (6, 4, 1, 1) and m.op == "NONE"
    inf = -np.inf
    assert (m.numpy().reshape(4, 4) == np.triu(np.full((4, 4), inf), 1)).all()
    assert (np.isfinite(w.numpy().reshape(4, 6)) == np.array(
        [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 0, 0]], bool)).all()
    for source, message in (("m = causal_mask(0)", "n_tokens must be at least 1"),
                            ("m = causal_mask(3, -1)", "n_swa must be 0 (no window) or positive"),
                            ("m = causal_mask(3, 0, 2)", "n_kv (2) must be at least n_tokens (3)"),
                            ("m = causal_mask(2.0)", "causal_mask() needs an integer")):
        assert message in err(source)


def test_a_few_rows_of_the_causal_mask_are_the_blocks_bits(monkeypatch):
    """fill_causal_mask's few-row path (a decode step's one row: slices) writes what its block path
    writes, for any positions (negative and past n_kv too) and windows, over rows holding anything."""
    from ggtool.dsl import builtins

    rng = np.random.default_rng(5)
    for _ in range(400):
        n, n_kv, n_swa = int(rng.integers(1, 9)), int(rng.integers(1, 40)), int(rng.choice([0, 1, 2, 5, 100]))
        positions = rng.integers(-3, 45, n)
        few, block = (np.full((n, n_kv), np.nan, np.float32) for _ in range(2))
        builtins.fill_causal_mask(few, positions, n_swa)
        monkeypatch.setattr(builtins, "_FEW_ROWS", 0)
        builtins.fill_causal_mask(block, positions, n_swa)
        monkeypatch.undo()
        assert few.tobytes() == block.tobytes(), (n_kv, n_swa, positions)
        assert not np.isnan(few).any()


def test_causal_mask_with_soft_max_ext_is_diag_mask_inf():
    x = np.random.default_rng(0).standard_normal((3, 5, 5)).astype(np.float32)
    built = run("a1 = soft_max_ext(x, causal_mask(5), 0.5, 0.0)\na2 = soft_max(diag_mask_inf(scale(x, 0.5), 0))",
                {"x": x}, outputs=["a1", "a2"])
    ggtool.graph_compute(built.graph, 1)
    assert (built.tensors["a1"].numpy() == built.tensors["a2"].numpy()).all()


def test_has_tensor():
    v = vars_of('x = has_tensor("a"); y = has_tensor("b"); z = has_tensor("a") and not has_tensor("b")', tensors=A)
    assert (v["x"], v["y"], v["z"]) == (1, 0, 1)
    assert "has_tensor() needs the tensor's name as a string" in err("x = has_tensor(a)", A)


def test_input_and_state_are_named_by_a_string():
    assert "input() needs the input's name as a string, got int 3" in err("x = input(3, f32, 4)", A)
    assert "state() needs the state's name as a string, got int 3" in err("x = state(3, f32, 4)", A)


# -- the printer -----------------------------------------------------------------------------------
def test_new_forms_round_trip():
    src = '''include "lib.gg"
def f(x, w=2, s="a"):
    if not x < 1 and (w == 2 or s != "b"):
        return m[0][i + 1]
    elif x >= 3:
        return -m[-1]
    else:
        y = (a == b) == c
    end
    return y
end
z = f(1, w=3)
'''
    program = parse(src)
    assert unparse(program) == src
    assert parse(unparse(program)) == program
    (stmt,) = parse("if a: x = 1; elif b: x = 2; else: x = 3; end").body
    assert isinstance(stmt, If) and len(stmt.branches) == 2 and len(stmt.orelse) == 1
    assert parse("x = m[1]").body[0].value == Index(Name(("m",)), Num(1))
