"""The text an evaluation reads: a file of UTF-8 text, tokenized once as llama.cpp's tools do
(common_tokenize: BOS as the model says, special tokens' text not parsed)."""

from __future__ import annotations

import os

import numpy as np

from ..errors import GGToolError

MAX_TEXT_BYTES = 1 << 30      # 1 GiB: wikitext-2's test set is 1.3 MiB, its training set 540 MiB


class EvaluateError(GGToolError):
    """An evaluation cannot run on what it was given: `kind` names the problem ("empty-text",
    "binary-text", "short-text", "base-file", "base-vocab", "base-ctx", "base-truncated",
    "resume", ...), `file` the file at fault where there is one."""

    def __init__(self, message: str, *, kind: str, file: str | None = None, **details):
        self.kind, self.file, self.details = kind, file, details
        super().__init__(f"{file}: {message}" if file else message)


def read_text(path: str | os.PathLike) -> str:
    """The text of `path`: UTF-8, not empty, no NUL byte (a binary file is refused, not tokenized)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_TEXT_BYTES + 1)
    except OSError as e:
        raise EvaluateError(f"cannot read the text: {e.strerror}", kind="text-unreadable", file=p) from None
    if len(raw) > MAX_TEXT_BYTES:
        raise EvaluateError(f"the text is larger than {MAX_TEXT_BYTES >> 20} MiB", kind="text-too-large", file=p)
    if not raw.strip():
        raise EvaluateError("the text is empty" if not raw else "the text holds only white space",
                            kind="empty-text", file=p)
    nul = raw.find(b"\0")
    if nul >= 0:
        raise EvaluateError(f"not a text file (a NUL byte at offset {nul})", kind="binary-text", file=p)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EvaluateError(f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})", kind="binary-text",
                            file=p) from None


def tokenize_text(vocab, text: str) -> np.ndarray:
    """llama-perplexity's tokens: the whole text at once, BOS added where the vocabulary adds one
    (an EOS it would add is refused, as llama-perplexity asserts)."""
    if vocab.add_eos:
        raise EvaluateError("the model's vocabulary adds an EOS token to every text, which perplexity does not "
                            "handle (llama-perplexity refuses it too)", kind="adds-eos")
    return np.asarray(vocab.tokenize(text), np.int32)


def need_tokens(n_tokens: int, n_ctx: int, file: str | None) -> None:
    """At least 2 * n_ctx tokens, as llama-perplexity and llama-imatrix ask."""
    if n_tokens < 2 * n_ctx:
        raise EvaluateError(f"the text is {n_tokens} tokens; a context of {n_ctx} needs at least {2 * n_ctx}",
                            kind="short-text", file=file, n_tokens=n_tokens, n_ctx=n_ctx)
