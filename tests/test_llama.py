"""`fixtures/llama.gg`, a whole llama forward pass in the DSL, against llama.cpp.

The reference is `tests/golden/llama/stories260K-logits.npz` (llama.cpp's own logits for two token
sequences, see the README beside it; a copy of llama.cpp's output, so these tests stand on their own).
The logits are computed through the real `ggtool` command line, as a user would type it, plus once on a
two-process `WorkerPool` through the engine API; the metadata and error checks build the graph from
the GGUF header only.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, STORIES, TINY_LLAMA, fails, ok

from ggtool.gguf_io import FileStorage

PROGRAM = ROOT / "fixtures" / "llama.gg"
GOLDEN = ROOT / "tests" / "golden" / "llama" / "stories260K-logits.npz"

STORIES_LAYERS, NODES_PER_LAYER = 5, 29


def tokens_arg(tokens) -> str:
    return "tokens=i32:" + json.dumps([int(t) for t in tokens]).replace(" ", "")


def compute(run, tmp_path, gguf, tokens, threads=1) -> np.ndarray:
    out = tmp_path / "logits.npy"
    ok(run("compute", "-f", PROGRAM, "--gguf", gguf, "--tensor", tokens_arg(tokens), "-o", out,
           "--threads", threads))
    return np.load(out)


def check_against_llama_cpp(logits: np.ndarray, seq: int) -> None:
    ref = np.load(GOLDEN)[f"logits_{seq}"]
    assert logits.shape == ref.shape and logits.dtype == np.float32
    diff = np.abs(logits - ref).max()
    assert diff <= 1e-3, f"max abs difference {diff}"
    assert (logits.argmax(axis=1) == ref.argmax(axis=1)).all()


# -- the program itself --------------------------------------------------------------------------------
def test_program_parses_and_round_trips():
    from ggtool.dsl import parse, unparse

    program = parse(PROGRAM.read_text(), str(PROGRAM))
    assert parse(unparse(program)) == program


def test_docs_show_the_program_verbatim():
    """docs/llama.md quotes the whole program, and transformer.gg that it includes, as indented
    blocks: they must be these files."""
    doc = (ROOT / "docs" / "llama.md").read_text()
    for path, heading in ((PROGRAM, "The program"), (PROGRAM.parent / "transformer.gg", "What it includes")):
        block = "".join("    " + line if line.strip() else "\n" for line in path.read_text().splitlines(True))
        after = doc.split(f"\n## {heading}")[1]
        assert block + "\n## " in after, path.name


# -- logits against llama.cpp ----------------------------------------------------------------------------------
# An explicit --threads 2 computes on the CLI's worker pool: the calling process and one worker process.
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("seq", [0, 1])
def test_stories260k_logits_match_llama_cpp(run, tmp_path, seq, threads):
    tokens = np.load(GOLDEN)[f"tokens_{seq}"]
    check_against_llama_cpp(compute(run, tmp_path, STORIES, tokens, threads), seq)


def test_the_documented_command_line(tmp_path):
    """docs/llama.md's command, verbatim, in a fresh process: 4 tokens, numpy (n_tokens, n_vocab)."""
    out = tmp_path / "logits.npy"
    subprocess.run([sys.executable, "-m", "ggtool", "compute", "-f", "fixtures/llama.gg", "--gguf",
                    "fixtures/stories260K.gguf", "--tensor", "tokens=i32:[1,403,407,261]", "-o", str(out)],
                   cwd=ROOT, check=True, capture_output=True)
    logits = np.load(out)
    ref = np.load(GOLDEN)["logits_0"][:4]       # sequence 0 starts with these 4 tokens; attention is causal
    assert logits.shape == (4, 512)
    assert np.abs(logits - ref).max() <= 1e-3 and (logits.argmax(1) == ref.argmax(1)).all()


def test_worker_pool_two_processes():
    """The engine API on a real 2-process WorkerPool: same logits as llama.cpp, twice on one pool."""
    import ggtool
    from ggtool.dsl import build, parse
    from ggtool.pool import WorkerPool
    from ggtool.tensor_io import Inputs, parse_source

    tokens = np.load(GOLDEN)["tokens_1"]
    inputs = Inputs([parse_source("tokens", tokens_arg(tokens)[len("tokens="):])], [str(STORIES)])
    built = build(parse(PROGRAM.read_text(), str(PROGRAM)), ggtool.Context(), inputs)
    (_, logits), = built.outputs
    with WorkerPool(2) as pool:
        for _ in range(2):
            plan = ggtool.graph_compute(built.graph, 2, pool=pool)
            assert plan.n_threads == 2
            check_against_llama_cpp(logits.numpy().reshape(len(tokens), -1).copy(), 1)


# -- not this model only ---------------------------------------------------------------------------------------
def test_llama2_tiny_random_f16(run, tmp_path):
    """Another llama GGUF: 1 layer, 2 heads, n_embd 8, n_rot 4, F16 weights, 32000-token vocabulary."""
    logits = compute(run, tmp_path, TINY_LLAMA, [1, 100, 2000, 31999], threads=2)
    assert logits.shape == (4, 32000) and logits.dtype == np.float32
    assert np.isfinite(logits).all() and logits.std() > 0


class _Overridden:
    """A DSL environment: the CLI's Inputs with some metadata keys replaced or removed (None), and
    some tensors hidden."""

    def __init__(self, inputs, meta, hide=()):
        self.inputs, self.meta, self.hide = inputs, meta, set(hide)

    def tensor(self, name, ctx):
        return None if name in self.hide else self.inputs.tensor(name, ctx)

    def names(self):
        return [n for n in self.inputs.names() if n not in self.hide]

    def metadata(self, key):
        if key in self.meta:
            if self.meta[key] is None:
                raise KeyError(key)
            return self.meta[key]
        return self.inputs.metadata(key)


def _build(meta=None, hide=()):
    """Build the program over stories260K's header (no data), metadata overridden, tensors hidden."""
    import ggtool
    from ggtool.dsl import build, parse
    from ggtool.tensor_io import Inputs, parse_source

    inputs = Inputs([parse_source("tokens", "i32[3]")], [str(STORIES)], read_data=False)
    return build(parse(PROGRAM.read_text(), str(PROGRAM)), ggtool.Context(), _Overridden(inputs, meta or {}, hide))


def _ropes(meta):
    return [n for n in _build(meta).graph.nodes if n.op == "ROPE"]


def test_rope_follows_the_metadata():
    """freq_base is `{arch}.rope.freq_base` (10000 when absent, as in stories260K), n_dims the rope
    dimension count, freq_scale 1 / the linear scaling factor; mode 0 (adjacent pairs)."""
    ropes = _ropes({})
    assert len(ropes) == 2 * STORIES_LAYERS
    for r in ropes:
        assert (r.op_params[1], r.op_params[2], r.op_params[4]) == (8, 0, 2048)  # n_dims, mode, n_ctx_orig
        assert (r.param_f32(5), r.param_f32(6), r.param_f32(7)) == (10000.0, 1.0, 0.0)
    ropes = _ropes({"llama.rope.freq_base": 500000.0, "llama.rope.scaling.factor": 4.0,
                    "llama.rope.dimension_count": 4})
    assert {(r.op_params[1], r.param_f32(5), r.param_f32(6)) for r in ropes} == {(4, 500000.0, 0.25)}


# -- inspect-graph and plan: the whole model graph from the GGUF header alone -----------------------------------
@pytest.fixture
def no_data_reads(monkeypatch):
    """Make any read of tensor data (a memory-mapped GGUF tensor, or a converted one) an error."""
    from ggtool.tensor_io import Inputs

    def boom(*_):
        raise AssertionError("tensor data was read")

    monkeypatch.setattr(FileStorage, "array", property(boom))
    monkeypatch.setattr(Inputs, "_read", boom)


def test_inspect_graph_and_plan_read_no_data(run, tmp_path, no_data_reads):
    args = ("-f", PROGRAM, "--gguf", STORIES, "--tensor", "tokens=i32[16]")   # a shape-only tokens input
    graph = json.loads(ok(run("inspect-graph", *args, "--json")))
    assert len(graph["nodes"]) == 1 + NODES_PER_LAYER * STORIES_LAYERS + 3 == 149
    assert graph["nodes"][-1]["name"] == "logits" and graph["nodes"][-1]["ne"] == [512, 16, 1, 1]
    assert {leaf["name"] for leaf in graph["leafs"]} >= {"tokens", "pos", "token_embd.weight", "output.weight",
                                                         "blk.4.ffn_down.weight"}
    plan = json.loads(ok(run("plan", *args, "--threads", "2", "--json")))
    assert (plan["n_threads"], len(plan["nodes"])) == (2, 149)
    assert plan["mem_size"] > STORIES.stat().st_size - 20_000        # weights counted as if in the context
    table = ok(run("plan", *args, "--threads", "2"))
    assert f"mem_size  = {plan['mem_size']}" in table
    # the patch does bite: computing must read the weights
    fails(run("compute", *args), "tensor data was read")


def test_dot_renders_one_layer(run):
    """`--only '-0\\b'` picks layer 0's 29 nodes (every node a layer creates is named `name-0`) and their
    direct sources: the weights of blk.0, the positions and the previous residual `inp_embd`."""
    dot = ok(run("inspect-graph", "-f", PROGRAM, "--gguf", STORIES, "--tensor", "tokens=i32[16]",
                 "--dot", "--only", r"-0\b"))
    assert dot.startswith("digraph")
    labels = [line for line in dot.splitlines() if "label=" in line]
    for name in ("attn_norm-0", "Qcur-0", "Kcur-0", "kq_soft-0", "kqv_out-0", "ffn_inp-0", "gate_up-0", "x-0",
                 "blk.0.attn_q.weight", "blk.0.ffn_down.weight", "pos", "inp_embd"):
        assert any(f'label="{name} (' in line or f'label="<x>{name} (' in line for line in labels), name
    assert not any("-1 (" in line or "blk.1." in line for line in labels)


def test_plan_and_inspect_with_the_gguf_alone(run):
    """Without --tensor tokens the program's input() declaration stands in one placeholder token."""
    plan = json.loads(ok(run("plan", "-f", PROGRAM, "--gguf", STORIES, "--json")))
    graph = json.loads(ok(run("inspect-graph", "-f", PROGRAM, "--gguf", STORIES, "--json")))
    assert plan["nodes"][-1]["name"] == "logits" and plan["mem_size"] > 0
    tokens = next(t for t in graph["leafs"] if t["name"] == "tokens")
    assert tokens["type"] == "i32" and tokens["ne"] == [1, 1, 1, 1]
    assert graph["nodes"][-1]["ne"] == [512, 1, 1, 1]


def test_tokens_of_the_wrong_type_is_a_located_error(run):
    err = fails(run("plan", "-f", PROGRAM, "--gguf", STORIES, "--tensor", "tokens=f32[4]"),
                "input 'tokens' is f32, the program needs i32")
    assert "transformer.gg, line" in err and "included from " in err and "llama.gg line" in err


def test_error_in_a_layer_names_the_iteration_line_and_column():
    from ggtool.dsl import DSLError

    lines = PROGRAM.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "attn_k.weight" in text)
    column = lines[line - 1].index("blk.{il}.attn_k") + 1
    with pytest.raises(DSLError) as e:
        _build(hide={"blk.3.attn_k.weight"})
    message = str(e.value)
    assert message.startswith(f"{PROGRAM}, line {line}, column {column}, in loop iteration il=3: "
                              "unknown tensor 'blk.3.attn_k.weight' (did you mean 'blk.4.attn_k.weight'")
    shown, caret = message.splitlines()[-2:]
    assert caret.strip() == "^" and caret.index("^") == shown.index("blk.{il}.attn_k")


def test_tied_embeddings_by_substituting_output_weight(run, tmp_path):
    """A model without output.weight (tied embeddings) runs with the embedding passed under that name;
    the logits are then the final normed state times token_embd."""
    out = tmp_path / "out.gguf"
    ok(run("compute", "-f", PROGRAM, "--gguf", STORIES, "--tensor", "tokens=i32:[1,403,407]",
           "--tensor", f"output.weight={STORIES}:token_embd.weight", "--output", "result_norm",
           "--output", "logits", "-o", out))
    import gguf

    got = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(out)).tensors}
    embd = next(np.array(t.data) for t in gguf.GGUFReader(str(STORIES)).tensors if t.name == "token_embd.weight")
    np.testing.assert_allclose(got["logits"], got["result_norm"] @ embd.T, rtol=1e-5, atol=1e-5)
