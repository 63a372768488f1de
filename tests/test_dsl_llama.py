"""A whole llama forward pass written in the DSL, checked against llama.cpp's own logits.

It checks the DSL's design (metadata, scalars, loops, interpolated names, arange_i32): the
program knows nothing about the model beyond what the GGUF says.
"""

from pathlib import Path

import numpy as np
import pytest

import ggtool
from ggtool.dsl import DictEnv, DSLError, build, parse

ROOT = Path(__file__).resolve().parent.parent
STORIES = ROOT / "fixtures" / "stories260K.gguf"
TINY = ROOT / "fixtures" / "llama-2-tiny-random.gguf"
LOGITS = ROOT / "tests" / "golden" / "llama" / "stories260K-logits.npz"

LLAMA = """\
# llama logits for `tokens` (i32 [n_tokens]) with any llama GGUF
arch      = meta("general.architecture")
n_layer   = meta("{arch}.block_count")
n_embd    = meta("{arch}.embedding_length")
n_head    = meta("{arch}.attention.head_count")
n_head_kv = meta("{arch}.attention.head_count_kv", n_head)
head_dim  = n_embd // n_head
n_rot     = meta("{arch}.rope.dimension_count", head_dim)
eps       = meta("{arch}.attention.layer_norm_rms_epsilon")
n_tokens  = ne(tokens, 0)
pos       = arange_i32(n_tokens)
kq_scale  = 1.0 / sqrt(head_dim)

x = get_rows(token_embd.weight, tokens)                     # [n_embd, n_tokens]
for il in range(n_layer):
    h = mul(rms_norm(x, eps), blk.{il}.attn_norm.weight)
    q = reshape_3d(mul_mat(blk.{il}.attn_q.weight, h), head_dim, n_head, n_tokens)
    k = reshape_3d(mul_mat(blk.{il}.attn_k.weight, h), head_dim, n_head_kv, n_tokens)
    v = reshape_3d(mul_mat(blk.{il}.attn_v.weight, h), head_dim, n_head_kv, n_tokens)
    q = permute(rope(q, pos, n_rot, 0), 0, 2, 1, 3)         # [head_dim, n_tokens, n_head]
    k = permute(rope(k, pos, n_rot, 0), 0, 2, 1, 3)         # [head_dim, n_tokens, n_head_kv]
    kq = mul_mat(k, q)                 # [n_kv, n_tokens, n_head]: q head j uses k head j // (n_head / n_head_kv)
    kq = soft_max(diag_mask_inf(scale(kq, kq_scale), 0))
    vt = cont(permute(v, 1, 2, 0, 3))                       # [n_kv, head_dim, n_head_kv]
    o = cont_2d(permute(mul_mat(vt, kq), 0, 2, 1, 3), n_embd, n_tokens)
    x = add(x, mul_mat(blk.{il}.attn_output.weight, o))
    h = mul(rms_norm(x, eps), blk.{il}.ffn_norm.weight)
    ffn = mul(silu(mul_mat(blk.{il}.ffn_gate.weight, h)), mul_mat(blk.{il}.ffn_up.weight, h))
    x = add(x, mul_mat(blk.{il}.ffn_down.weight, ffn))
end
logits = mul_mat(output.weight, mul(rms_norm(x, eps), output_norm.weight))
"""



def gguf_env(path, tokens, drop=()):
    """A DictEnv over a GGUF file (the CLI's ggtool.tensor_io does this lazily and memory-mapped)."""
    import gguf
    reader = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith(("GGUF.", "tokenizer."))}
    tensors = {t.name: np.array(t.data) for t in reader.tensors if t.name not in drop}
    tensors["tokens"] = np.asarray(tokens, dtype=np.int32)
    return DictEnv(tensors, meta)


@pytest.mark.parametrize("seq", [0, 1])
def test_stories260k_logits_match_llama_cpp(seq):
    ref = np.load(LOGITS)
    tokens = ref[f"tokens_{seq}"]
    built = build(parse(LLAMA, "llama.gg"), ggtool.Context(), gguf_env(STORIES, tokens))
    (name, logits), = built.outputs
    assert name == "logits" and logits.ne == (512, len(tokens), 1, 1)
    assert built.graph.size == 2048 and built.tensors["x-4"].op == "ADD"
    ggtool.graph_compute(built.graph, 2)
    np.testing.assert_allclose(logits.numpy().reshape(len(tokens), 512), ref[f"logits_{seq}"], atol=1e-4, rtol=0)


def test_f16_model_builds_and_computes():
    built = build(parse(LLAMA), ggtool.Context(), gguf_env(TINY, [1, 100, 2000]))
    ggtool.graph_compute(built.graph, 1)
    logits = built.outputs[0][1].numpy()
    assert logits.shape == (1, 1, 3, 32000) and np.isfinite(logits).all()


def test_missing_layer_tensor_is_reported_in_its_iteration():
    env = gguf_env(STORIES, [1, 403], drop={"blk.3.attn_k.weight"})
    with pytest.raises(DSLError) as e:
        build(parse(LLAMA, "llama.gg"), ggtool.Context(), env)
    assert str(e.value).startswith(
        "llama.gg, line 18, column 28, in loop iteration il=3: unknown tensor 'blk.3.attn_k.weight' "
        "(did you mean ")
    assert str(e.value).endswith("  k = reshape_3d(mul_mat(blk.{il}.attn_k.weight, h), head_dim, n_head_kv, n_tokens)\n"
                                 "                         ^")
