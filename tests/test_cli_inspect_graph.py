"""`ggtool inspect-graph`: tables, JSON, DOT, --only, numpy vs GGML order, and no data reads."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from conftest import STORIES, fails, ok

from ggtool.gguf_io import FileStorage

SEED = ("mul_mat(a, b)", "--tensor", "a=[[2,8],[5,1],[4,2],[8,6]]", "--tensor", "b=[[10,5],[9,9],[5,4]]")


def graph(run, *args):
    return json.loads(ok(run("inspect-graph", *args, "--json")))


def test_numpy_shape_is_reversed_ne(run):
    """numpy shape (d3, d2, d1, d0) is GGML ne = [d0, d1, d2, d3]: a (2, 3) array has ne [3, 2]."""
    g = graph(run, "relu(x)", "--tensor", "x=[[1,2,3],[4,5,6]]")
    assert g["leafs"][0]["ne"] == [3, 2, 1, 1]
    assert g["leafs"][0]["nb"] == [4, 12, 24, 24]
    g = graph(run, "relu(x)", "--tensor", "x=f32[3,2]")  # shape-only sources are GGML order
    assert g["leafs"][0]["ne"] == [3, 2, 1, 1]


def test_seed_graph_json(run):
    g = graph(run, *SEED)
    assert set(g) == {"nodes", "leafs", "compute_buffer_size"}
    node = g["nodes"][0]
    assert {k: node[k] for k in ("op", "name", "type", "ne", "nb", "src")} == {
        "op": "MUL_MAT", "name": "node_0", "type": "f32", "ne": [4, 3, 1, 1], "nb": [4, 16, 48, 48], "src": ["a", "b"]}
    assert [(leaf["name"], leaf["ne"], leaf["op"]) for leaf in g["leafs"]] == [("a", [2, 4, 1, 1], "NONE"),
                                                                             ("b", [2, 3, 1, 1], "NONE")]
    assert node["src_refs"] == ["leafs[0]", "leafs[1]"]
    assert node["buffer_offset"] == 0 and g["compute_buffer_size"] == 64   # 48 bytes, GGML's 32-byte alignment
    assert [leaf["buffer_offset"] for leaf in g["leafs"]] == [None, None]


def test_json_buffer_offsets_are_the_graph_allocators(run):
    """Each node's place in ggml_gallocr's compute buffer: reused once free, views at their source's."""
    g = graph(run, "h = relu(mul_mat(a, b))\nt = transpose(h)\nneg(cont(t))", "--tensor", "a=f32[8,16]",
              "--tensor", "b=f32[8,4]")
    offs = {n["name"]: n["buffer_offset"] for n in g["nodes"]}
    assert offs["node_0"] == 0 and offs["h"] == 0          # relu computes in place of mul_mat's result
    assert offs["t"] == 0                                  # a view: its source's memory
    assert offs["t (cont)"] == 256                         # h is still being read
    assert offs["node_4"] == 256                           # neg in place of the cont
    assert g["compute_buffer_size"] == 512


def test_unary_and_view_records(run):
    g = graph(run, "t = transpose(x)\ny = add(t, t)", "--tensor", "x=[[1,2,3],[4,5,6]]")
    t, y = g["nodes"]
    assert (t["op"], t["view_src"], t["view_offs"], t["ne"], t["nb"]) == ("TRANSPOSE", "x", 0, [2, 3, 1, 1],
                                                                         [12, 4, 24, 24])
    assert y["src_refs"] == ["nodes[0]", "nodes[0]"]
    g = graph(run, "relu(x)", "--tensor", "x=[1]")
    assert (g["nodes"][0]["op"], g["nodes"][0]["op_desc"]) == ("UNARY", "RELU")


def test_table_is_modelled_on_ggml_graph_print(run):
    out = ok(run("inspect-graph", *SEED))
    lines = out.splitlines()
    assert lines[0] == "=== GRAPH ===" and lines[1] == "n_nodes = 1" and lines[-1] == "=" * 40
    assert lines[2].split() == ["index", "op", "name", "type", "ne", "nb", "src", "view_src"]
    assert lines[3].split(None, 3)[:3] == ["-", "0", "MUL_MAT"]
    assert "[4, 3, 1, 1]" in lines[3] and "[4, 16, 48, 48]" in lines[3] and lines[3].endswith("a, b")
    assert lines[4] == "n_leafs = 2"
    assert lines[6].split()[:3] == ["-", "0", "NONE"] and "a" in lines[6].split()


def test_dot(run):
    out = ok(run("inspect-graph", *SEED, "--dot"))
    lines = out.splitlines()
    assert lines[0] == "digraph G {" and lines[-1] == "}"
    record = '  "{}" [ style = filled; fillcolor = {}; shape = record; label="{}"; ]'
    assert record.format("node_0", "white", "node_0 (f32)|0 [4, 3] | <x>MUL_MAT") in lines
    assert record.format("leaf_0", "pink", "<x>a (f32)|CONST 0 [2, 4]") in lines
    assert '  "leaf_0":x -> "node_0":x [ label = "x"; ]' in lines
    assert '  "leaf_1":x -> "node_0":x [ label = "y"; ]' in lines


def test_dot_escapes_record_characters():
    from ggtool.commands.inspect_graph import dot_escape

    assert dot_escape('a|b<c>{d}"e\\ (view)') == 'a\\|b\\<c\\>\\{d\\}\\"e\\\\ (view)'


def test_only_selects_a_subgraph(run):
    prog = "h = mul_mat(a, b)\nr = relu(h)\ns = add(r, r)"
    args = ("--tensor", "a=f32[2,4]", "--tensor", "b=f32[2,3]")
    g = json.loads(ok(run("inspect-graph", prog, *args, "--json", "--only", "^r$")))
    assert [n["name"] for n in g["nodes"]] == ["h", "r"]  # r and its direct source
    assert [n["index"] for n in g["nodes"]] == [0, 1] and g["leafs"] == []
    out = ok(run("inspect-graph", prog, *args, "--only", "^s$"))
    assert "(showing 2 nodes, 0 leafs)" in out.splitlines()[0] and "n_nodes = 3" in out
    dot = ok(run("inspect-graph", prog, *args, "--dot", "--only", "^h$"))
    assert '"leaf_0":x -> "node_0":x' in dot and "node_1" not in dot
    fails(run("inspect-graph", prog, *args, "--only", "^zzz$"), "--only '^zzz$' matches no tensor name")
    fails(run("inspect-graph", prog, *args, "--only", "(("), "not a valid regular expression")


def test_select_errors_carry_the_pattern_and_never_name_the_flag():
    from ggtool import Context, Graph
    from ggtool.inspect_graph import SelectionError, select
    from ggtool.ops import FUNCTIONS as F

    ctx = Context()
    a = ctx.new_tensor_from(np.ones((2, 2), np.float32), name="a")
    g = Graph(ctx).expand(F["relu"](ctx, a))
    assert [e.tensor.name for e in select(g, "^a$").leafs] == ["a"]
    with pytest.raises(SelectionError) as none:
        select(g, "^zzz$")
    assert (none.value.pattern, none.value.problem, none.value.n_nodes, none.value.n_leafs) == ("^zzz$", None, 1, 1)
    with pytest.raises(SelectionError) as bad:
        select(g, "((")
    assert bad.value.pattern == "((" and "missing )" in bad.value.problem
    assert "--" not in str(none.value) + str(bad.value)


def test_json_and_dot_are_exclusive(run):
    fails(run("inspect-graph", *SEED, "--json", "--dot"), "pick one", code=2)


def test_gguf_model_without_reading_data(run, monkeypatch, npy):
    def boom(*a, **k):
        raise AssertionError("tensor data was read")

    monkeypatch.setattr(FileStorage, "array", property(boom))
    monkeypatch.setattr(gguf.quants, "dequantize", boom)
    p = npy(np.ones((3, 64), np.float32), "h.npy")
    monkeypatch.setattr(np, "load", boom)
    prog = "e = get_rows(token_embd.weight, tok)\nmul_mat(blk.0.attn_q.weight, add(e, h))"
    g = graph(run, prog, "--gguf", STORIES, "--tensor", "tok=i32:[1,2,3]", "--tensor", f"h={p}")
    names = {leaf["name"]: leaf for leaf in g["leafs"]}
    assert names["token_embd.weight"]["ne"] == [64, 512, 1, 1]
    assert names["blk.0.attn_q.weight"]["type"] == "f32" and names["h"]["ne"] == [64, 3, 1, 1]
    assert g["nodes"][-1]["ne"] == [64, 3, 1, 1]


@pytest.mark.parametrize("fmt", [(), ("--json",), ("--dot",)])
def test_output_selection(run, fmt):
    prog = "h = mul_mat(a, b)\nr = relu(h)"
    out = ok(run("inspect-graph", prog, "--tensor", "a=f32[2,4]", "--tensor", "b=f32[2,3]", "--output", "h", *fmt))
    assert "RELU" not in out


def test_inspect_graph_of_a_terabyte_allocates_nothing(run):
    """The graph of a 10^12-byte shape is shown, its compute buffer offsets included, with no
    memory behind its tensors (a pool holding the node's bytes would run out of memory)."""
    g = graph(run, "abs(a)", "--tensor", "a=f32[1000000,250000]")
    assert g["nodes"][0]["ne"] == [1000000, 250000, 1, 1] and g["compute_buffer_size"] == 10**12
