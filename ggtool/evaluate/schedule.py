"""How llama-perplexity and llama-imatrix cut chunks into evaluations, so that ggtool computes each
chunk in the same pieces (the same KV-cache sizes, the same rows per matrix product, hence the same
sums under llama.cpp's numerics).

Both tools give llama.cpp `n_seq = max(1, n_batch // n_ctx)` chunks per batch, one sequence each
(a KV cache of n_seq streams, `n_ctx` rounded up to 256 cells each). llama.cpp splits a batch into
micro-batches (`n_ubatch` tokens): with one stream, n_ubatch tokens after another
(llama_batch_allocr::split_simple); with several, the same number of tokens of every sequence,
n_ubatch // n of each of the n sequences (split_equal). So a chunk of 512 tokens in a batch of
four is evaluated 128 tokens at a time, and each piece's attention reads the cells in use padded
to 256. A batch smaller than n_ctx (n_batch < n_ctx) is evaluated n_batch tokens at a time, each
in micro-batches of n_ubatch.
"""

from __future__ import annotations

from dataclasses import dataclass

from .text import EvaluateError

N_BATCH = 2048     # common_params' defaults
N_UBATCH = 512


@dataclass(frozen=True)
class Group:
    """Chunks llama.cpp evaluates in one batch: `chunks` (their indices), `pieces` ((start, stop)
    positions of each evaluation, the same for each chunk) and `ubatch_rows` (the rows of
    llama.cpp's micro-batch for each piece: the piece's size times the chunks)."""

    chunks: range
    pieces: tuple[tuple[int, int], ...]

    @property
    def ubatch_rows(self) -> tuple[int, ...]:
        return tuple((b - a) * len(self.chunks) for a, b in self.pieces)


@dataclass(frozen=True)
class Schedule:
    """llama.cpp's batches for chunks of n_ctx tokens, with -b n_batch and -ub n_ubatch."""

    n_ctx: int
    n_batch: int = N_BATCH
    n_ubatch: int = N_UBATCH

    def __post_init__(self):
        for name in ("n_ctx", "n_batch", "n_ubatch"):
            if getattr(self, name) < 1:
                raise EvaluateError(f"{name} must be at least 1, not {getattr(self, name)}", kind="bad-size")

    @property
    def n_seq(self) -> int:
        """Chunks per batch (llama.cpp's n_parallel, its KV cache's streams)."""
        return max(1, self.n_batch // self.n_ctx)

    def groups(self, n_chunk: int, first: int = 0) -> list[Group]:
        """The batches of chunks first..n_chunk-1 (a resumed run starts at `first`, which must
        begin a batch of an uninterrupted run: a multiple of n_seq)."""
        n_seq, out = self.n_seq, []
        n_batch = min(self.n_batch, n_seq * self.n_ctx)          # llama_perplexity's main
        n_ubatch = min(self.n_ubatch, n_batch)                   # llama_context's cparams
        for i in range(first, n_chunk, n_seq):
            chunks = range(i, min(i + n_seq, n_chunk))
            if n_seq == 1:       # one stream: split_simple, batch after batch
                pieces = [(u, min(u + n_ubatch, b0 + n_batch, self.n_ctx))
                          for b0 in range(0, self.n_ctx, n_batch)
                          for u in range(b0, min(b0 + n_batch, self.n_ctx), n_ubatch)]
            else:                # split_equal: as many tokens of each sequence
                k = max(1, n_ubatch // len(chunks))
                pieces = [(u, min(u + k, self.n_ctx)) for u in range(0, self.n_ctx, k)]
            out.append(Group(chunks, tuple(pieces)))
        return out
