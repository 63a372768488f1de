"""qwen2.gg and qwen3.gg against llama.cpp on tiny random models (tests/tiny_qwen.py makes them, the
same bytes on every run; tests/golden/qwen/ holds llama.cpp's logits and its README): every position's
logits of a prompt batch, then greedy steps through the KV cache, tokens equal and logits within the
tolerance tests/test_llama.py holds stories260K to."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from conftest import ROOT, ok
from tiny_qwen import write_tiny

from ggtool.dsl import parse
from ggtool.generate import Sampling, Session, generate, shipped_program

GOLDEN = np.load(ROOT / "tests" / "golden" / "qwen" / "llama-cpp-tiny-qwen.npz")
ATOL = 1e-3   # tests/test_llama.py's check_against_llama_cpp
ARCHS = ("qwen2", "qwen3")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen")
    paths = {a: write_tiny(out / f"tiny-{a}.gguf", a) for a in ARCHS}
    for a, p in paths.items():   # the models llama.cpp computed
        assert hashlib.sha256(p.read_bytes()).hexdigest() == str(GOLDEN[f"{a}_sha256"])
    return paths


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("seq", range(2))
def test_prompt_logits_are_llama_cpps(run, tmp_path, models, arch, seq):
    """Every position of one batch, through the command line and the program chosen by hand."""
    out = tmp_path / "logits.npy"
    tokens = json.dumps(GOLDEN[f"prompt_{seq}"].tolist()).replace(" ", "")
    ok(run("compute", "-f", shipped_program(arch), "--gguf", models[arch], "--tensor", f"tokens=i32:{tokens}",
           "-o", out))
    ref = GOLDEN[f"{arch}_prompt_logits_{seq}"]
    got = np.load(out)
    assert got.shape == ref.shape and np.abs(got - ref).max() <= ATOL
    assert (got.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_steps_are_llama_cpps(models, arch):
    """The program generate picks by general.architecture, over the KV cache: each step's token and logits."""
    path = shipped_program(arch)
    session = Session(str(models[arch]), parse(path.read_text(), str(path)), n_ctx=32)
    for seq in range(2):
        session.reset()
        greedy, want = GOLDEN[f"{arch}_greedy_{seq}"].tolist(), GOLDEN[f"{arch}_step_logits_{seq}"]
        logits = session.eval(GOLDEN[f"prompt_{seq}"])
        assert np.abs(logits - GOLDEN[f"{arch}_prompt_logits_{seq}"][-1]).max() <= ATOL
        for i, token in enumerate(greedy):
            assert int(np.argmax(logits)) == token
            logits = session.eval([token])
            assert np.abs(logits - want[i]).max() <= ATOL, f"step {i}"


@pytest.mark.parametrize("arch", ARCHS)
def test_cli_generates_llama_cpps_tokens(run, models, arch):
    prompt = json.dumps(GOLDEN["prompt_0"].tolist())
    r = ok(run("generate", "--gguf", models[arch], "--tokens", prompt, "-n", "8", "--ignore-eos", "--temp", "0",
               "--format", "json"))
    assert json.loads(r) == GOLDEN[f"{arch}_greedy_0"].tolist()
