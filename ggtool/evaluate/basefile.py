"""Base-logits files: what a perplexity run of the base model writes, and a KL-divergence run reads
back against another.

**llama.cpp's** (llama-perplexity writes and reads it; ggtool writes the same bytes): `_logits_`,
uint32 n_ctx, int32 n_vocab, int32 n_chunk, the n_chunk * n_ctx int32 tokens of the text (the
chunks as the text has them, before BOS replaces their first token), then for each chunk its
n_ctx - 1 - n_ctx/2 scored rows of `row_width(n_vocab)` uint16 (logprobs.encode_full). n_vocab x
tokens x 2 bytes: 11 GiB for a LLaMA-2 model on wikitext-2's test set.

**ggtool's top-K** (`top_k=K`; llama.cpp cannot read it): `_ggtopk_`, uint32 version (1),
uint32 n_ctx, int32 n_vocab, int32 n_chunk, int32 K, the tokens, then per scored row K int32 ids
and K float32 log-probabilities (by decreasing probability), float32 log of the rest's mass and
float32 log-probability of the next token: 8K + 8 bytes a row (264 for K = 32, against 64 KiB a
row for a 32000-token vocabulary).

Both are read one piece at a time (never a whole chunk), after their size is checked against what
the header promises.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from .logprobs import row_width
from .text import EvaluateError

FULL_MAGIC = b"_logits_"
TOP_K_MAGIC = b"_ggtopk_"
TOP_K_VERSION = 1


def scored_rows(n_ctx: int) -> int:
    """Rows a chunk contributes: positions n_ctx/2 .. n_ctx-2 (each predicts the next token)."""
    return n_ctx - 1 - n_ctx // 2


@dataclass(frozen=True)
class BaseHeader:
    """What a base file says about itself: its kind ("full" or "top-k"), n_ctx, n_vocab, n_chunk,
    K (top-k files), where its tokens and rows start, and a row's bytes."""

    kind: str
    n_ctx: int
    n_vocab: int
    n_chunk: int
    k: int
    tokens_at: int

    @property
    def row_bytes(self) -> int:
        return 2 * row_width(self.n_vocab) if self.kind == "full" else 8 * self.k + 8

    @property
    def rows_at(self) -> int:
        return self.tokens_at + 4 * self.n_chunk * self.n_ctx

    def chunk_bytes(self) -> int:
        return scored_rows(self.n_ctx) * self.row_bytes

    @property
    def size(self) -> int:
        return self.rows_at + self.n_chunk * self.chunk_bytes()

    def header_bytes(self, tokens: np.ndarray) -> bytes:
        if self.kind == "full":
            head = FULL_MAGIC + struct.pack("<Iii", self.n_ctx, self.n_vocab, self.n_chunk)
        else:
            head = TOP_K_MAGIC + struct.pack("<IIiii", TOP_K_VERSION, self.n_ctx, self.n_vocab, self.n_chunk, self.k)
        return head + np.ascontiguousarray(tokens[: self.n_chunk * self.n_ctx], "<i4").tobytes()


def new_header(n_ctx: int, n_vocab: int, n_chunk: int, k: int | None) -> BaseHeader:
    if k is None:
        return BaseHeader("full", n_ctx, n_vocab, n_chunk, 0, 20)
    return BaseHeader("top-k", n_ctx, n_vocab, n_chunk, k, 28)


class BaseFile:
    """A base file opened for reading (checked: magic, sizes, tokens within the vocabulary)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            self._f = open(self.path, "rb")
        except OSError as e:
            raise EvaluateError(f"cannot read the base logits: {e.strerror}", kind="base-file", file=self.path) from None
        try:
            self.header = self._read_header()
            self.tokens = self._read_tokens()
        except BaseException:
            self._f.close()
            raise

    def _fail(self, message: str, kind: str = "base-file", **details):
        raise EvaluateError(message, kind=kind, file=self.path, **details)

    def _read_header(self) -> BaseHeader:
        f = self._f
        size = os.fstat(f.fileno()).st_size
        magic = f.read(8)
        if magic == FULL_MAGIC:
            raw = f.read(12)
            if len(raw) < 12:
                self._fail(f"truncated: {size} bytes, not even its header", "base-truncated")
            n_ctx, n_vocab, n_chunk = struct.unpack("<Iii", raw)
            h = BaseHeader("full", n_ctx, n_vocab, n_chunk, 0, 20)
        elif magic == TOP_K_MAGIC:
            raw = f.read(20)
            if len(raw) < 20:
                self._fail(f"truncated: {size} bytes, not even its header", "base-truncated")
            version, n_ctx, n_vocab, n_chunk, k = struct.unpack("<IIiii", raw)
            if version != TOP_K_VERSION:
                self._fail(f"a top-K base file of version {version}; this ggtool reads version {TOP_K_VERSION}")
            if not 1 <= k < max(n_vocab, 2):
                self._fail(f"K is {k}, for a vocabulary of {n_vocab} tokens")
            h = BaseHeader("top-k", n_ctx, n_vocab, n_chunk, k, 28)
        else:
            self._fail("not a base-logits file (it starts with neither llama-perplexity's '_logits_' nor "
                       "ggtool's '_ggtopk_')")
        if not 2 <= h.n_ctx <= 1 << 24:
            self._fail(f"its n_ctx is {h.n_ctx}")
        if not 1 <= h.n_vocab <= 1 << 24:
            self._fail(f"its vocabulary is {h.n_vocab} tokens")
        if h.n_chunk < 1:
            self._fail(f"it holds {h.n_chunk} chunks")
        if size != h.size:
            what = "truncated" if size < h.size else "longer than its header says"
            self._fail(f"{what}: {size} bytes, where {h.n_chunk} chunks of {h.n_ctx} tokens over a vocabulary of "
                       f"{h.n_vocab} make {h.size}", "base-truncated" if size < h.size else "base-file",
                       size=size, expected=h.size)
        return h

    def _read_tokens(self) -> np.ndarray:
        h = self.header
        self._f.seek(h.tokens_at)
        tokens = np.fromfile(self._f, "<i4", h.n_chunk * h.n_ctx).astype(np.int32)
        bad = np.flatnonzero((tokens < 0) | (tokens >= h.n_vocab))
        if len(bad):
            self._fail(f"token {int(tokens[bad[0]])} at position {int(bad[0])} is outside its vocabulary of "
                       f"{h.n_vocab}")
        return tokens

    def rows(self, chunk: int, first_row: int, n_rows: int):
        """Rows first_row.. of chunk `chunk`'s scored rows: uint16 (n_rows, row_width) for a full
        file; (ids, log-probabilities, log rest, log p(next)) for a top-K one."""
        h = self.header
        self._f.seek(h.rows_at + chunk * h.chunk_bytes() + first_row * h.row_bytes)
        raw = self._f.read(n_rows * h.row_bytes)
        if len(raw) != n_rows * h.row_bytes:      # changed since it was checked
            self._fail("truncated while it was read", "base-truncated")
        if h.kind == "full":
            return np.frombuffer(raw, "<u2").reshape(n_rows, row_width(h.n_vocab))
        rec = np.frombuffer(raw, np.dtype([("ids", "<i4", (h.k,)), ("lp", "<f4", (h.k,)), ("rest", "<f4"),
                                           ("next", "<f4")]))
        ids = rec["ids"]
        if ((ids < 0) | (ids >= h.n_vocab)).any():
            self._fail(f"chunk {chunk + 1} names a token outside the vocabulary of {h.n_vocab}")
        return ids, rec["lp"], rec["rest"], rec["next"]

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def top_k_row_bytes(ids, lp, log_rest, lp_next) -> bytes:
    """Top-K rows as the file holds them."""
    n, k = ids.shape
    rec = np.empty(n, np.dtype([("ids", "<i4", (k,)), ("lp", "<f4", (k,)), ("rest", "<f4"), ("next", "<f4")]))
    rec["ids"], rec["lp"], rec["rest"], rec["next"] = ids, lp, log_rest, lp_next
    return rec.tobytes()
