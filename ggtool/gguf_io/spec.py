"""`FILE.gguf:TENSOR`: one tensor of a GGUF file, named as the tensor sources and `compare` take it."""

from __future__ import annotations

import os

_MARK = ".gguf:"


def split_gguf_tensor(spec: str) -> tuple[str, str] | None:
    """`FILE.gguf:TENSOR` -> (FILE.gguf, TENSOR); None when `spec` is not one (no '.gguf:' in it,
    or it is itself an existing file). A path may contain '.gguf:' and a tensor name ':' too: the
    first split whose file exists wins, else the last. TENSOR may be empty (the caller says so)."""
    i = spec.find(_MARK)
    if i < 0 or os.path.isfile(spec):
        return None
    while True:
        path, tensor = spec[: i + len(_MARK) - 1], spec[i + len(_MARK):]
        nxt = spec.find(_MARK, i + 1)
        if nxt < 0 or os.path.exists(path):
            return path, tensor
        i = nxt
