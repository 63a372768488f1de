"""Tiny random qwen2 and qwen3 GGUFs, made the same byte for byte on every run (seeded numpy, gguf-py's
writer): the models tests/golden/qwen/ holds llama.cpp's logits for. Too small to mean anything, big
enough to use every part of the graph: two layers, grouped-query attention (4 query heads over 2 KV
heads), qwen2's q/k/v biases and tied output, qwen3's per-head q/k norms and its own output.weight,
and a byte-level (gpt2) vocabulary of the 256 bytes, three merges and `<|endoftext|>`.

    python tests/tiny_qwen.py DIR     # writes DIR/tiny-qwen2.gguf and DIR/tiny-qwen3.gguf
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ggtool.tokenizer.bpe import BYTE_TO_CHAR

N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_LAYER = 32, 4, 2, 8, 64, 2
MERGES = ["Ġ t", "h e", "Ġt he"]
EOS = "<|endoftext|>"


def vocab() -> list[str]:
    """The 256 bytes as byte-level BPE shows them (GPT-2's bytes_to_unicode, ggtool's own table), the
    merges' results, and EOS."""
    return [*BYTE_TO_CHAR, *(m.replace(" ", "") for m in MERGES), EOS]


def write_tiny(path: Path, arch: str) -> Path:
    """Write the tiny `arch` ("qwen2" or "qwen3") model to `path`; returns the path."""
    import gguf

    rng = np.random.default_rng({"qwen2": 2, "qwen3": 3}[arch])
    tokens = vocab()
    n_vocab = len(tokens)

    def weight(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(256)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    if arch == "qwen3":
        w.add_key_length(HEAD_DIM)
        w.add_value_length(HEAD_DIM)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (n_vocab - 1) + [gguf.TokenType.CONTROL])
    w.add_token_merges(MERGES)
    w.add_eos_token_id(n_vocab - 1)
    w.add_bos_token_id(n_vocab - 1)
    w.add_add_bos_token(False)

    n_q, n_kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    w.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD, scale=1.0))
    for il in range(N_LAYER):
        blk = f"blk.{il}."
        w.add_tensor(blk + "attn_norm.weight", norm(N_EMBD))
        w.add_tensor(blk + "attn_q.weight", weight(n_q, N_EMBD))
        w.add_tensor(blk + "attn_k.weight", weight(n_kv, N_EMBD))
        w.add_tensor(blk + "attn_v.weight", weight(n_kv, N_EMBD))
        if arch == "qwen2":
            w.add_tensor(blk + "attn_q.bias", weight(n_q))
            w.add_tensor(blk + "attn_k.bias", weight(n_kv))
            w.add_tensor(blk + "attn_v.bias", weight(n_kv))
        else:
            w.add_tensor(blk + "attn_q_norm.weight", norm(HEAD_DIM))
            w.add_tensor(blk + "attn_k_norm.weight", norm(HEAD_DIM))
        w.add_tensor(blk + "attn_output.weight", weight(N_EMBD, n_q))
        w.add_tensor(blk + "ffn_norm.weight", norm(N_EMBD))
        w.add_tensor(blk + "ffn_gate.weight", weight(N_FF, N_EMBD))
        w.add_tensor(blk + "ffn_up.weight", weight(N_FF, N_EMBD))
        w.add_tensor(blk + "ffn_down.weight", weight(N_EMBD, N_FF))
    w.add_tensor("output_norm.weight", norm(N_EMBD))
    if arch == "qwen3":                      # qwen2 ties its output to token_embd.weight
        w.add_tensor("output.weight", weight(n_vocab, N_EMBD))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for a in ("qwen2", "qwen3"):
        print(write_tiny(out / f"tiny-{a}.gguf", a))
