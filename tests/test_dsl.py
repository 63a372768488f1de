"""The op DSL: lexer/parser, printer round trip, error reports, building and computing graphs."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ggtool
from ggtool import types as T
from ggtool.dsl import DictEnv, DSLError, build, format_source, parse, parse_expression, unparse
from ggtool.dsl.lexer import KEYWORDS
from ggtool.dsl.nodes import (
    Assign,
    BinOp,
    BoolOp,
    Call,
    Compare,
    Def,
    ExprStmt,
    For,
    If,
    Include,
    Index,
    Keyword,
    Name,
    Neg,
    Not,
    Null,
    Num,
    Param,
    Program,
    Return,
    Str,
    TypeWord,
)
from ggtool.dsl.parser import TYPE_WORDS
from ggtool.ops import FUNCTIONS


def f32(a):
    return np.asarray(a, dtype=np.float32)


def run(source, tensors=None, metadata=None, outputs=None, **kw):
    ctx = ggtool.Context()
    built = build(parse(source), ctx, DictEnv(tensors or {}, metadata), outputs=outputs, **kw)
    return built


def err(source, tensors=None, metadata=None, outputs=None, filename="<program>"):
    with pytest.raises(DSLError) as e:
        build(parse(source, filename), ggtool.Context(), DictEnv(tensors or {}, metadata), outputs=outputs)
    return str(e.value)


def stmt(source):
    (s,) = parse(source).body
    return s


def expr(source):
    return parse_expression(source)


# -- parser -------------------------------------------------------------------------------------
def test_assignment_and_call():
    assert stmt("y = add(a, b)") == Assign(Name(("y",)), Call("add", (Name(("a",)), Name(("b",)))))


def test_nested_calls_keywords_and_trailing_comma():
    s = stmt("y = relu(add(a, b=c),)")
    assert s.value == Call("relu", (Call("add", (Name(("a",)),), (Keyword("b", Name(("c",))),)),))


def test_numbers():
    assert expr("3") == Num(3) and isinstance(expr("3").value, int)
    assert expr("1e-6") == Num(1e-6) and expr("2.5") == Num(2.5) and expr(".5") == Num(0.5)
    assert expr("-1") == Num(-1) and expr("- 2.0") == Num(-2.0) and expr("1E+3") == Num(1000.0)
    assert expr("1") != expr("1.0")  # int and float literals stay distinct


def test_type_words_null_strings():
    assert expr("f32") == TypeWord("f32") and expr("q4_0") == TypeWord("q4_0")
    assert {"f32", "f16", "i32", "q4_0", "q8_0"} <= TYPE_WORDS
    assert expr("null") == Null()
    assert expr('"a\\"b\\\\ {{x}}"') == Str(('a"b\\ {x}',))
    assert expr('"{arch}.block_count"') == Str((Name(("arch",)), ".block_count"))
    assert expr('""') == Str(("",))


def test_dotted_and_interpolated_names():
    assert expr("blk.0.attn_q.weight") == Name(("blk.0.attn_q.weight",))
    assert expr("token_embd.weight") == Name(("token_embd.weight",))
    assert expr("blk.{i + 1}.ffn_up.weight") == Name(
        ("blk.", BinOp("+", Name(("i",)), Num(1)), ".ffn_up.weight"))
    assert expr("{name}") == Name((Name(("name",)),))


def test_arithmetic_precedence_and_unary_minus():
    assert expr("1 + 2 * 3") == BinOp("+", Num(1), BinOp("*", Num(2), Num(3)))
    assert expr("(1 + 2) * 3") == BinOp("*", BinOp("+", Num(1), Num(2)), Num(3))
    assert expr("8 - 4 - 2") == BinOp("-", BinOp("-", Num(8), Num(4)), Num(2))
    assert expr("n // 2 % 3") == BinOp("%", BinOp("//", Name(("n",)), Num(2)), Num(3))
    assert expr("-n * 2") == BinOp("*", Neg(Name(("n",))), Num(2))
    assert expr("-(1)") == Neg(Num(1))


def test_separators_comments_and_multiline_calls():
    p = parse("a = 1; b = 2  # two\n\n# only a comment\nc = add(a,\n        b)\n;")
    assert [s.target.plain for s in p.body] == ["a", "b", "c"]


def test_for_loop():
    s = stmt("for i in range(1, n, 2):\n    x = add(x, blk.{i}.w)\nend")
    assert s == For("i", (Num(1), Name(("n",)), Num(2)),
                    (Assign(Name(("x",)), Call("add", (Name(("x",)), Name(("blk.", Name(("i",)), ".w"))))),))
    one_line = stmt("for i in range(3): x = relu(x); end")
    assert one_line.body == (Assign(Name(("x",)), Call("relu", (Name(("x",)),))),)


def test_expression_statement():
    assert stmt("add(a, b)") == ExprStmt(Call("add", (Name(("a",)), Name(("b",)))))


def test_positions():
    s = parse("x = 1\n  y = mul(a, b)").body[1]
    assert s.pos == (2, 3) and s.value.pos == (2, 7) and s.value.args[1].pos == (2, 14)


def test_unparse_canonical_form():
    src = ("n=meta( \"{arch}.x\" ,4)\nfor i in range(n):\n  x=add(x,blk.{i}.w) # c\n"
           "  for j in range(2): y=-(1)-(a-b); end\nend\n")
    assert format_source(src) == (
        'n = meta("{arch}.x", 4)\n'
        "for i in range(n):\n"
        "    x = add(x, blk.{i}.w)\n"
        "    for j in range(2):\n"
        "        y = -(1) - (a - b)\n"
        "    end\n"
        "end\n")


# -- parse errors: line, column, caret -------------------------------------------------------------
@pytest.mark.parametrize("source, report", [
    ("x = add(a, b\ny = 2", "line 1, column 8: '(' was never closed\n  x = add(a, b\n         ^"),
    ("x = 1.2.3", "line 1, column 5: bad number '1.2.3'\n  x = 1.2.3\n      ^"),
    ("y = 1\nx = 3e+", "line 2, column 5: bad number '3e+'\n  x = 3e+\n      ^"),
    ("x = 12ab", "line 1, column 5: bad number '12ab'\n  x = 12ab\n      ^"),
    ("x = )", "line 1, column 5: unmatched ')'\n  x = )\n      ^"),
    ("x = $", "line 1, column 5: unexpected character '$'\n  x = $\n      ^"),
    ('x = "abc', "line 1, column 5: unterminated string\n  x = \"abc\n      ^"),
    ("x = blk.{i.w", "line 1, column 9: '{' was never closed\n  x = blk.{i.w\n          ^"),
    ("x = blk.{}.w", "line 1, column 9: empty '{}': expected an expression inside\n  x = blk.{}.w\n          ^"),
    ("x = add(a, b) y", "line 1, column 15: expected a new line or ';' after the statement, got name 'y'\n"
                        "  x = add(a, b) y\n                ^"),
    ("x = ", "line 1, column 5: expected an expression after '=', got end of program\n  x = \n      ^"),
    ("x = add(a b)", "line 1, column 11: expected ',' or ')' in the arguments of add(), got name 'b'\n"
                     "  x = add(a b)\n            ^"),
    ("add(a, b) = x", "line 1, column 1: can't assign to a call; the left of '=' must be a name\n"
                      "  add(a, b) = x\n  ^"),
    ("f32 = 1", "line 1, column 1: can't assign to a type name; the left of '=' must be a name\n  f32 = 1\n  ^"),
    ("x = f(a=1, 2)", "line 1, column 12: positional argument after keyword argument\n  x = f(a=1, 2)\n             ^"),
    ("x = f(a=1, a=2)", "line 1, column 12: keyword argument 'a' repeated\n  x = f(a=1, a=2)\n             ^"),
    ("for i in range(3):\n    x = a\n", "line 1, column 1: 'for' loop is never closed: expected 'end'\n"
                                         "  for i in range(3):\n  ^"),
    ("x = 1\nend", "line 2, column 1: 'end' without a 'for', 'if' or 'def' block\n  end\n  ^"),
    ("for i in range(3)\nx = a\nend", "line 1, column 18: expected ':' after range(...), got end of line\n"
                                      "  for i in range(3)\n                   ^"),
    ("for i in range():\nend", "line 1, column 15: range() takes 1 to 3 arguments (stop | start, stop[, step]), "
                               "got 0\n  for i in range():\n                ^"),
    ("for 3 in range(2):\nend", "line 1, column 5: expected a loop variable name after 'for', got '3'\n"
                                "  for 3 in range(2):\n      ^"),
    ("for i of range(2):\nend", "line 1, column 7: expected 'in' after 'for i', got name 'of'\n"
                                "  for i of range(2):\n        ^"),
])
def test_parse_errors(source, report):
    with pytest.raises(DSLError) as e:
        parse(source)
    assert str(e.value) == report


def test_error_shows_dedented_line_with_filename():
    with pytest.raises(DSLError) as e:
        parse("for i in range(2):\n    y = add(a,, b)\nend", filename="model.gg")
    assert str(e.value) == ("model.gg, line 2, column 15: expected an expression, got ','\n"
                            "  y = add(a,, b)\n"
                            "            ^")
    assert (e.value.line, e.value.column, e.value.message) == (2, 15, "expected an expression, got ','")
    assert isinstance(e.value, ggtool.GGToolError)


# -- build errors ----------------------------------------------------------------------------------
A = {"a": f32(np.ones((2, 3))), "b": f32(np.ones((3, 2))), "blk.0.attn_q.weight": f32(np.ones((2, 3)))}


def test_unknown_op_suggests():
    report = err("x = a\n    y = mul_l(a, b)", A)
    head, line, caret = report.split("\n")
    assert head.startswith("line 2, column 9: unknown op 'mul_l' (did you mean 'mul'")
    assert (line, caret) == ("  y = mul_l(a, b)", "      ^")


def test_unknown_op_suggests_mul_mat():
    assert err("x = a\n    y = mul_matt(a, b)", A).startswith(
        "line 2, column 9: unknown op 'mul_matt' (did you mean 'mul_mat'")


def test_unknown_tensor_suggests():
    assert err("y = add(a, bb)", A) == ("line 1, column 12: unknown tensor or variable 'bb' (did you mean 'b'?)\n"
                                        "  y = add(a, bb)\n             ^")
    assert err("y = add(blk.0.attn_k.weight, a)", A).startswith(
        "line 1, column 9: unknown tensor 'blk.0.attn_k.weight' (did you mean 'blk.0.attn_q.weight'?)")


def test_wrong_argument_count_names_the_c_signature():
    assert err("y = add(a, b, a)", A) == ("line 1, column 5: add() takes 2 arguments, got 3: ggml_add(ctx, a, b)\n"
                                          "  y = add(a, b, a)\n      ^")
    assert err("y = add(a)", A).startswith("line 1, column 5: add() takes 2 arguments, got 1: ggml_add(ctx, a, b)")
    assert err("y = reshape_2d(a, ne1=3)", A).startswith(
        "line 1, column 5: reshape_2d() is missing argument 'ne0': ggml_reshape_2d(ctx, a, ne0, ne1)")


def test_bad_keyword_lists_valid_ones():
    assert err("y = reshape_2d(a, ne0=3, rows=2)", A) == (
        "line 1, column 26: reshape_2d() has no parameter 'rows'; valid keywords: a, ne0, ne1 "
        "(ggml_reshape_2d(ctx, a, ne0, ne1))\n"
        "  y = reshape_2d(a, ne0=3, rows=2)\n                           ^")
    assert "got argument 'a' twice" in err("y = add(a, a=b)", A)


def test_op_shape_error_points_at_the_call():
    ctx = ggtool.Context()
    with pytest.raises(ggtool.ShapeError) as op_error:  # the op's own message, kept as is
        FUNCTIONS["add"](ctx, DictEnv(A).tensor("a", ctx), DictEnv(A).tensor("b", ctx))
    with pytest.raises(DSLError) as e:
        build(parse("y = a\nz = add(y, b)"), ggtool.Context(), DictEnv(A))
    assert str(e.value) == f"line 2, column 5: {op_error.value}\n  z = add(y, b)\n      ^"
    assert isinstance(e.value.__cause__, ggtool.ShapeError)


def test_error_inside_loop_names_the_iteration():
    src = "x = a\nfor i in range(3):\n    x = add(x, blk.{i}.attn_q.weight)\nend"
    assert err(src, A) == (
        "line 3, column 16, in loop iteration i=1: unknown tensor 'blk.1.attn_q.weight' "
        "(did you mean 'blk.0.attn_q.weight'?)\n"
        "  x = add(x, blk.{i}.attn_q.weight)\n             ^")
    nested = "for i in range(2):\n  for j in range(2):\n    y = reshape_2d(a, 3, 2 + i + j)\n  end\nend"
    assert err(nested, A).startswith("line 3, column 9, in loop iteration i=0, j=1: reshape")


def test_scalar_and_type_errors():
    assert err("y = a + 1", A).startswith(
        "line 1, column 5: '+' needs numbers, got tensor 'a' (f32 [3, 2, 1, 1]); for tensors use add(a, b)")
    assert err("n = 4 // 0") .startswith("line 1, column 7: division by zero in '//'")
    assert err("y = reshape_2d(a, 3, a)", A).startswith("line 1, column 5: reshape_2d() can't use these arguments")
    assert err("y = ne(a, 4)", A).startswith("line 1, column 11: ne(): dimension must be 0, 1, 2 or 3, got 4")
    assert err("y = x.{a}", A).startswith("line 1, column 8: can't put tensor 'a'")
    assert err("for i in range(2.0):\nend").startswith("line 1, column 16: range() needs integers, got float 2.0")
    assert err('y = -"s"').startswith("line 1, column 6: unary '-' needs a number, got string 's'")


def test_metadata_errors():
    assert err('n = meta("llama.block_cnt")', metadata={"llama.block_count": 5}) == (
        "line 1, column 10: no metadata 'llama.block_cnt' (give a default: meta(\"llama.block_cnt\", value))\n"
        '  n = meta("llama.block_cnt")\n           ^')
    # arrays are values now (a[i], len): the result is an array, not a tensor
    assert "the program's result 'n' is array of 3 ints" in err('n = meta("toks")', metadata={"toks": np.arange(3)})


def test_result_and_output_errors():
    assert err("n = 3") == ("line 1, column 1: the program's result 'n' is int 3, not a tensor; end the program "
                            "with a tensor or ask for outputs by name\n  n = 3\n  ^")
    assert err("") == "the program computes nothing: it has no statements"
    assert err("yy = add(a, a)", A, outputs=["y"]) == "unknown output 'y' (did you mean 'yy'?)"
    assert err("y = add(a, a)\nn = 2", A, outputs=["n"]) == "output 'n' is int 2, not a tensor"


# -- building and computing ------------------------------------------------------------------------
def test_mul_mat_example():
    a = f32([[2, 8], [5, 1], [4, 2], [8, 6]])
    b = f32([[10, 5], [9, 9], [5, 4]])
    built = run("y = mul_mat(a, b)", {"a": a, "b": b})
    ggtool.graph_compute(built.graph, 1)
    (name, y), = built.outputs
    assert name == "y" and y.name == "y" and y.ne == (4, 3, 1, 1)
    np.testing.assert_array_equal(y.numpy().reshape(3, 4),
                                  [[60, 55, 50, 110], [90, 54, 54, 126], [42, 29, 28, 64]])


def test_build_compute_and_names():
    rng = np.random.default_rng(0)
    a, b = f32(rng.normal(size=(2, 3, 4))), f32(rng.normal(size=(3, 4)))
    built = run("s = add(a, b)\nm = mul(s, b)\np = permute(m, 1, 0, 2, 3)", {"a": a, "b": b})
    assert [n for n, _ in built.outputs] == ["p"]
    assert built.graph.size == 2048 and built.notes == []
    assert [t.name for t in built.graph.leafs] == ["a", "b"]
    assert [t.name for t in built.graph.nodes] == ["s", "m", "p"]
    assert set(built.tensors) == {"a", "b", "s", "m", "p"}
    ggtool.graph_compute(built.graph, 1)
    np.testing.assert_allclose(built.tensors["m"].numpy().reshape(a.shape), (a + b) * b, rtol=1e-6)
    np.testing.assert_allclose(built.tensors["p"].numpy().reshape(2, 4, 3), ((a + b) * b).transpose(0, 2, 1),
                               rtol=1e-6)


def test_requested_outputs_in_order_and_one_graph():
    built = run("s = add(a, a)\nm = mul(a, a)\nd = sub(m, s)", A, outputs=["m", "s", "a"])
    assert [(n, t.name) for n, t in built.outputs] == [("m", "m"), ("s", "s"), ("a", "a")]
    assert [t.name for t in built.graph.nodes] == ["m", "s"]  # d is not an output: not in the graph
    assert "d" in built.tensors and built.graph.contains(built.tensors["d"]) is False


def test_expression_statement_result():
    built = run("add(a, a)", A)
    assert built.outputs[0][0] == "result" and built.outputs[0][1].op == "ADD"
    built = run("y = add(a, a)\nr = y\nr", A)
    assert built.outputs[0][0] == "r" and built.outputs[0][1].name == "y"


def test_alias_does_not_rename():
    built = run("y = a\nz = y\nw = add(z, a)", A)
    assert built.variables["y"] is built.variables["z"] is built.tensors["a"]
    assert built.tensors["a"].name == "a" and built.tensors["w"].name == "w"


def test_keyword_arguments_and_null():
    built = run("v = view_1d(a, ne0=2, offset=4)\nr = reshape_2d(a=v, ne1=1, ne0=2)", A)
    v, r = built.tensors["v"], built.tensors["r"]
    assert v.ne == (2, 1, 1, 1) and v.view_offs == 4 and r.ne == (2, 1, 1, 1)
    assert run("m = null\ny = add(a, a)", A).variables["m"] is None


def test_scalars_ints_stay_ints():
    v = run("a1 = 7 // 2\nb1 = 7 / 2\nc1 = -7 % 3\nd1 = 2 * (3 + 4)\ne1 = -d1\nf1 = 6 / 3\ng1 = 2.0 * 3\n"
            "h1 = sqrt(64)\ni1 = int(3.9)\nj1 = max(1, 5, 2)\ny = add(a, a)", A).variables
    assert (v["a1"], v["b1"], v["c1"], v["d1"], v["e1"], v["f1"], v["g1"]) == (3, 3.5, 2, 14, -14, 2.0, 6.0)
    assert type(v["a1"]) is int and type(v["f1"]) is float and type(v["d1"]) is int
    assert (v["h1"], v["i1"], v["j1"]) == (8.0, 3, 5)


def test_type_words_evaluate_to_types():
    v = run("t = f16\nu = q4_0\ny = add(a, a)", A).variables
    assert v["t"] == T.F16 and v["u"] == T.Q4_0


def test_tensor_properties():
    v = run("n0 = ne(a, 0)\nn1 = ne(a, 1)\ns1 = nb(a, 1)\nn = nelements(a)\nr = nrows(a)\nd = n_dims(a)\n"
            "es = element_size(a)\nrs = row_size(q4_0, 64)\nrf = row_size(a, 3)\nty = type(a)\ny = add(a, a)",
            A).variables
    assert (v["n0"], v["n1"], v["s1"], v["n"], v["r"], v["d"]) == (3, 2, 12, 6, 2, 2)
    assert (v["es"], v["rs"], v["rf"], v["ty"]) == (4, 36, 12, T.F32)


def test_arange_i32():
    built = run("n = 5\npos = arange_i32(n)\np2 = arange_i32(2, 8, 3)\ny = add(pos, pos)", outputs=["pos", "p2"])
    pos = built.tensors["pos"]
    assert pos.type == T.I32 and pos.op == "NONE" and pos.name == "pos" and pos.ne == (5, 1, 1, 1)
    np.testing.assert_array_equal(pos.numpy().ravel(), np.arange(5))
    np.testing.assert_array_equal(built.tensors["p2"].numpy().ravel(), [2, 5])


def test_metadata_defaults_and_interpolation():
    md = {"general.architecture": "llama", "llama.block_count": np.uint32(5),
          "llama.attention.layer_norm_rms_epsilon": np.float32(1e-5), "general.name": b"tiny"}
    v = run('arch = meta("general.architecture")\nn = meta("{arch}.block_count")\n'
            'eps = meta("{arch}.attention.layer_norm_rms_epsilon")\nbase = meta("{arch}.rope.freq_base", 10000.0)\n'
            'name = meta("general.name")\nkey = "{arch}.x{n * 2}.{f16}"\ny = add(a, a)', A, md).variables
    assert v["arch"] == "llama" and v["n"] == 5 and type(v["n"]) is int
    assert v["eps"] == float(np.float32(1e-5)) and type(v["eps"]) is float
    assert v["base"] == 10000.0 and v["name"] == "tiny" and v["key"] == "llama.x10.f16"


def test_loops_carry_variables_and_name_per_iteration():
    tensors = {"x": f32([1, 2, 3])} | {f"blk.{i}.w": f32([i, i, i]) for i in range(3)}
    built = run("h = x\nfor i in range(3):\n    h = add(h, blk.{i}.w)\n    blk.{i}.out = mul(h, h)\nend", tensors,
                outputs=["h", "h-1", "blk.2.out"])
    assert [n for n, _ in built.outputs] == ["h", "h-1", "blk.2.out"]
    assert built.variables["i"] == 2 and built.variables["h"].name == "h-2"
    assert {"h-0", "h-1", "h-2", "blk.0.out", "blk.2.out"} <= set(built.tensors)
    ggtool.graph_compute(built.graph, 1)
    np.testing.assert_array_equal(built.outputs[0][1].numpy().ravel(), [4, 5, 6])
    np.testing.assert_array_equal(built.outputs[1][1].numpy().ravel(), [2, 3, 4])
    np.testing.assert_array_equal(built.outputs[2][1].numpy().ravel(), [16, 25, 36])


def test_nested_loops_and_empty_range():
    built = run("y = a\nfor i in range(2):\n  for j in range(1, 3):\n    y = add(y, a)\n  end\nend\n"
                "for k in range(0):\n  y = mul(y, y)\nend\ny", A)
    assert built.outputs[0][1].name == "y-1-2" and built.graph.n_nodes == 4
    ggtool.graph_compute(built.graph, 1)
    np.testing.assert_array_equal(built.outputs[0][1].numpy(), np.full((1, 1, 2, 3), 5.0))


def test_graph_grows_beyond_the_default_size():
    built = run("y = a\nfor i in range(3000):\n    y = add(y, a)\nend", A)
    assert built.graph.size == 4096 and built.graph.n_nodes == 3000
    assert built.notes and "4096" in built.notes[0] and "3000 nodes" in built.notes[0]
    forced = run("y = add(a, a)", A, graph_size=16)
    assert forced.graph.size == 16
    with pytest.raises(DSLError, match="graph size 2 is too small: the program has 3 nodes"):
        run("y = add(a, a)\ny = add(y, a)\ny = add(y, a)", A, graph_size=2)


def test_build_accepts_source_text_and_default_env():
    ctx = ggtool.Context()
    built = build("p = arange_i32(3)", ctx)
    assert built.outputs[0][1].ctx is ctx


def test_scalar_math_names_call_the_op_on_tensors():
    built = run("y = sqrt(a)\nn = sqrt(16)", A, outputs=["y"])
    assert built.tensors["y"].op_desc == "SQRT" and built.variables["n"] == 4.0


def test_rms_norm_keyword_eps():
    x = f32([[1, 2, 3, 4], [0, 0, 0, 0]])
    built = run("y = rms_norm(x, eps=1e-6)", {"x": x})
    ggtool.graph_compute(built.graph, 1)
    want = x / np.sqrt((x ** 2).mean(axis=1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(built.outputs[0][1].numpy().reshape(2, 4), want, rtol=1e-6)


# -- printer round trip (hypothesis) ---------------------------------------------------------------
RESERVED = KEYWORDS | TYPE_WORDS | {"range"}
LOWER, DIGITS = "abcdefghijklmnopqrstuvwxyz_", "0123456789"


def _word(first: str, rest: str, max_size: int):
    return st.builds(lambda a, b: a + b, st.sampled_from(first), st.text(rest, max_size=max_size)).filter(
        lambda s: s not in RESERVED)


ident = _word(LOWER, LOWER + DIGITS, 4)
dotted = _word(LOWER + "ABC", LOWER + "ABC" + DIGITS + ".", 7)
tail = st.text(LOWER + DIGITS + ".", min_size=1, max_size=4)
text = st.text("ab 0.#é€\n\t\"\\{}", min_size=1, max_size=5)


def _name(start, pieces):
    parts = [start] if start else []
    for e, t in pieces:
        parts.append(e)
        if t:
            parts.append(t)
    return Name(tuple(parts))


def _str(pieces):
    parts = []
    for p in pieces:
        if isinstance(p, str) and parts and isinstance(parts[-1], str):
            parts[-1] += p
        else:
            parts.append(p)
    return Str(tuple(parts) or ("",))


def extend(e):
    kw = st.lists(st.tuples(ident, e), max_size=2, unique_by=lambda kv: kv[0]).map(
        lambda kvs: tuple(Keyword(k, v) for k, v in kvs))
    return st.one_of(
        st.builds(Neg, e),
        st.builds(BinOp, st.sampled_from(["+", "-", "*", "/", "//", "%"]), e, e),
        st.builds(Compare, st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), e, e),
        st.builds(BoolOp, st.sampled_from(["and", "or"]), e, e),
        st.builds(Not, e),
        st.builds(Index, e, e),
        st.builds(Call, ident, st.lists(e, max_size=3).map(tuple), kw),
        st.builds(_name, st.one_of(dotted, st.none()),
                  st.lists(st.tuples(e, st.one_of(tail, st.none())), min_size=1, max_size=2)),
        st.lists(st.one_of(text, e), max_size=3).map(_str),
    )


leaves = st.one_of(
    st.integers(-10**12, 10**12).map(Num),
    st.floats(allow_nan=False, allow_infinity=False).map(Num),
    dotted.map(lambda s: Name((s,))),
    st.sampled_from(["f32", "f16", "i32", "q4_0", "q8_0"]).map(TypeWord),
    st.just(Null()),
    text.map(lambda s: Str((s,))),
)
exprs = st.recursive(leaves, extend, max_leaves=6)
targets = st.one_of(dotted.map(lambda s: Name((s,))),
                    st.builds(_name, dotted, st.lists(st.tuples(exprs, st.one_of(tail, st.none())),
                                                      min_size=1, max_size=1)))
simple = st.one_of(st.builds(Assign, targets, exprs), st.builds(ExprStmt, exprs))


def _loop(body):
    return st.builds(For, ident, st.lists(exprs, min_size=1, max_size=3).map(tuple),
                     st.lists(body, max_size=3).map(tuple))


def _if(body):
    return st.builds(If, st.lists(st.tuples(exprs, st.lists(body, max_size=2).map(tuple)), min_size=1, max_size=3)
                     .map(tuple), st.lists(body, max_size=2).map(tuple))


blocks = st.one_of(simple, _loop(st.one_of(simple, _if(simple))), _if(st.one_of(simple, _loop(simple))))
in_def = st.one_of(blocks, st.builds(Return, exprs))
params = st.lists(ident, max_size=3, unique=True).map(lambda names: tuple(Param(n) for n in names))
statements = st.one_of(blocks, st.builds(Def, ident, params, st.lists(in_def, max_size=3).map(tuple)),
                       text.map(lambda t: Include(Str((t,)))))
programs = st.lists(statements, max_size=4).map(lambda b: Program(tuple(b)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs)
def test_print_parse_round_trip(program):
    source = unparse(program)
    parsed = parse(source)
    assert parsed == program
    assert parse(unparse(parsed)) == parsed


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("ab_.{}()[]=,;:+-*/%#\"\n 019e<>!") + [
    "for ", " in ", "range(", "end", "f32", "if ", "elif ", "else", "def ", "return ", "include ", " and ",
    " or ", "not ", "=="]),
                max_size=30).map("".join))
def test_parser_fails_only_with_dsl_errors(source):
    try:
        program = parse(source)
    except DSLError as e:
        assert e.line is not None and e.column is not None
        return
    assert parse(unparse(program)) == program


# -- docs/dsl.md ------------------------------------------------------------------------------------
def test_every_form_in_the_docs_parses():
    import re
    from pathlib import Path
    doc = (Path(__file__).resolve().parent.parent / "docs" / "dsl.md").read_text()
    table = doc.split("## Every form")[1].split("\n## ")[0]
    examples = [code for row in table.splitlines() if row.startswith("| ") and "---" not in row
                for code in re.findall(r"`([^`]+)`", row.rsplit(" | ", 1)[-1]) if "=" in code or "(" in code]
    assert len(examples) >= 18
    for code in examples:
        assert parse(code).body, code


# -- input(): a declared program input with a placeholder shape --------------------------------
def test_input_uses_the_given_tensor_and_checks_its_type():
    ctx = ggtool.Context()
    built = build("t = input(\"t\", i32, 2)\ny = get_rows(w, t)", ctx,
                  DictEnv({"t": np.array([2, 0], np.int32), "w": np.arange(6, dtype=np.float32).reshape(3, 2)}))
    ggtool.graph_compute(built.graph, 1)
    assert built.outputs[0][1].numpy().tolist() == [[[[4.0, 5.0], [0.0, 1.0]]]]
    with pytest.raises(DSLError, match="input 't' is f32, the program needs i32"):
        build('t = input("t", i32, 2)', ggtool.Context(), DictEnv({"t": np.zeros(2, np.float32)}))


def test_input_placeholder_only_where_no_data_is_read():
    """inspect-graph and plan (read_data False) get a placeholder of the declared shape; a compute
    without the input is an error, never a silent run on zeros."""
    built = build('y = input("t", f16, 3, 2)', ggtool.Context(), DictEnv({}, read_data=False))
    t = built.outputs[0][1]
    assert (t.ne, t.name, T.type_name(t.type)) == ((3, 2, 1, 1), "t", "f16")  # not renamed to y
    with pytest.raises(DSLError, match="no input 't' was given"):
        build('t = input("t", f16, 3, 2)', ggtool.Context(), DictEnv({}))
    with pytest.raises(DSLError, match="no input 'u' was given and input\\(\\) has no placeholder shape"):
        build('u = input("u", f32)', ggtool.Context(), DictEnv({}, read_data=False))


def test_ast_nodes_are_frozen_values_that_ignore_positions():
    import copy
    import pickle

    a, b = Call("f", (Num(1, (1, 3)),), (), (1, 1)), Call("f", (Num(1),), ())
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b) == "Call(func='f', args=(Num(value=1),), kwargs=())"
    assert Num(1) != Num(1.0) and Num(1) != Name(("x",)) and Num(2) != Num(3)
    with pytest.raises(AttributeError, match="immutable"):
        a.func = "g"
    for c in (pickle.loads(pickle.dumps(a)), copy.deepcopy(a)):
        assert c == a and c.pos == (1, 1) and c.args[0].pos == (1, 3)
    p = Program((a,), "f(1)", "x.gg")
    assert p == Program((b,)) and copy.copy(p).filename == "x.gg"
