"""llama.cpp's tokenizers, read from a GGUF model's metadata: `Vocab.from_gguf(path)`.

SentencePiece ("llama": stories260K, Llama 2, Gemma 3) and byte-level BPE ("gpt2" with the
pre-tokenizers `tokenizer.ggml.pre` names: Qwen2, SmolLM, Llama 3, ...), special tokens and
detokenization, each as llama-vocab.cpp does it. No click here: the commands are in
ggtool.commands.tokenize.
"""

from __future__ import annotations

from .vocab import Vocab, VocabError

__all__ = ["Vocab", "VocabError"]
