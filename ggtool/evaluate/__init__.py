"""What a model makes of a text, as llama.cpp's tools measure it (docs/evaluate.md):
`Perplexity` (llama-perplexity: PPL, base-logits files, KL divergence), `collect_imatrix`
(llama-imatrix: importance matrices), on `Model` (a GGUF model opened once, its chunks evaluated
in llama.cpp's pieces, `Schedule`). No click here: commands/perplexity.py and commands/imatrix.py
parse, call and format."""

from __future__ import annotations

from .basefile import BaseFile
from .chunks import Model
from .perplexity import ChunkReport, Perplexity
from .schedule import Schedule
from .text import EvaluateError, read_text, tokenize_text

__all__ = ["BaseFile", "ChunkReport", "EvaluateError", "Model", "Perplexity", "Schedule", "read_text",
           "tokenize_text"]
