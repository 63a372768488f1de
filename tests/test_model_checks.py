"""Models are checked before they run: a program states the architecture it computes
(`architecture("llama")`), and the weights of the --gguf files it never used are listed in one
warning, so that a program for another model fails or warns instead of printing garbage logits."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT, STORIES, TINY_LLAMA, fails, ok, write_gguf

import ggtool
from ggtool.dsl import DictEnv, DSLError, build

LLAMA = ROOT / "fixtures" / "llama.gg"
GEMMA3 = ROOT / "fixtures" / "gemma3.gg"
N_EMBD, N_FF, N_VOCAB = 8, 16, 32


def tiny_model(path, arch: str, biases: bool = False):
    """A one-layer transformer GGUF of `arch` with llama's tensor names; `biases` adds qwen2's
    q/k/v biases, which llama.gg has no use for."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32) * 0.1

    tensors = {"token_embd.weight": w(N_VOCAB, N_EMBD), "output_norm.weight": np.ones(N_EMBD, np.float32),
               "blk.0.attn_norm.weight": np.ones(N_EMBD, np.float32), "blk.0.attn_q.weight": w(N_EMBD, N_EMBD),
               "blk.0.attn_k.weight": w(N_EMBD, N_EMBD), "blk.0.attn_v.weight": w(N_EMBD, N_EMBD),
               "blk.0.attn_output.weight": w(N_EMBD, N_EMBD), "blk.0.ffn_norm.weight": np.ones(N_EMBD, np.float32),
               "blk.0.ffn_up.weight": w(N_FF, N_EMBD), "blk.0.ffn_gate.weight": w(N_FF, N_EMBD),
               "blk.0.ffn_down.weight": w(N_EMBD, N_FF)}
    if biases:
        tensors.update({f"blk.0.attn_{p}.bias": w(N_EMBD) for p in "qkv"})
    kv = {f"{arch}.block_count": 1, f"{arch}.embedding_length": N_EMBD, f"{arch}.context_length": 64,
          f"{arch}.attention.head_count": 2, f"{arch}.attention.layer_norm_rms_epsilon": 1e-5}
    return write_gguf(path, tensors, arch=arch, kv=kv)


def test_a_program_for_another_architecture_is_an_error(run, tmp_path):
    """llama.gg on a qwen2 model, gemma3.gg on a llama one: an error naming both architectures and
    the program's file and line, never garbage logits with exit 0."""
    qwen2 = tiny_model(tmp_path / "qwen2.gguf", "qwen2", biases=True)
    fails(run("compute", "-f", LLAMA, "--gguf", qwen2, "--tensor", "tokens=i32:[1,2]"),
          "llama.gg, line 12, column 1: this program computes the 'llama' architecture, "
          "but the model's general.architecture is 'qwen2'")
    fails(run("plan", "-f", GEMMA3, "--gguf", STORIES, "--tensor", "tokens=i32[2]"),
          "gemma3.gg", "this program computes the 'gemma3' architecture", "general.architecture is 'llama'")


def test_architecture_checks_only_a_model_it_is_given():
    """No model metadata (no GGUF): nothing to check. Several names: any of them will do."""
    ctx = ggtool.Context()
    a = {"a": np.ones(2, np.float32)}
    build('architecture("llama")\nrelu(a)', ctx, DictEnv(a))
    build('architecture("llama", "mistral")\nrelu(a)', ctx, DictEnv(a, {"general.architecture": "mistral"}))
    with pytest.raises(DSLError, match="computes the 'llama' or 'qwen2' architecture, but the model's "
                                       "general.architecture is 'gemma3'"):
        build('architecture("llama", "qwen2")\nrelu(a)', ctx, DictEnv(a, {"general.architecture": "gemma3"}))
    for source, message in (("architecture()", "needs the name of at least one architecture"),
                            ("architecture(1)", "needs names as strings, got int 1")):
        with pytest.raises(DSLError, match=message):
            build(source, ctx, DictEnv(a))


def test_weights_a_program_never_uses_are_listed_in_one_warning(run, tmp_path):
    """A llama model with qwen2's q/k/v biases runs under llama.gg, and one warning says which
    weights it left out: how many, and the first names in the file's order."""
    model = tiny_model(tmp_path / "biased.gguf", "llama", biases=True)
    result = run("compute", "-f", LLAMA, "--gguf", model, "--tensor", "tokens=i32:[1,2]")
    ok(result)
    warnings = [ln for ln in result.stderr.splitlines() if ln.startswith("Warning: ")]
    assert warnings == [f"Warning: the program does not use 3 tensors of --gguf {model}: "
                        "blk.0.attn_q.bias, blk.0.attn_k.bias, blk.0.attn_v.bias"]
    result = run("inspect-graph", "relu(token_embd.weight)", "--gguf", model)
    assert "does not use 13 tensors of --gguf" in result.stderr and ", ... (8 more)" in result.stderr


@pytest.mark.parametrize("model", [STORIES, TINY_LLAMA], ids=["stories260K", "tiny-random"])
def test_the_llama_program_uses_every_weight_of_a_llama_model(run, model, tmp_path):
    result = run("plan", "-f", LLAMA, "--gguf", model, "--tensor", "tokens=i32[3]")
    ok(result)
    assert "Warning" not in result.stderr
    plain = tiny_model(tmp_path / "plain.gguf", "llama")
    result = run("compute", "-f", LLAMA, "--gguf", plain, "--tensor", "tokens=i32:[1,2]")
    assert ok(result) and "Warning" not in result.stderr
