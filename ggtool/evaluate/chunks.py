"""A model run over chunks of a text as llama-perplexity and llama-imatrix run it: each chunk in a
fresh KV cache (a generate Session: the model's program, its graphs built once per piece size),
its first token replaced by BOS where the vocabulary adds one, in the pieces `Schedule` gives, the
logits of the rows asked for (llama.cpp's inp_out_ids) handed over piece by piece: one piece's
logits at a time, never a chunk's or a text's."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from .schedule import Group
from .text import EvaluateError


@dataclass
class Piece:
    """One evaluation's wanted rows: chunk `chunk`, the positions `positions` (within the chunk)
    of the rows of `logits` (float32 (rows, n_vocab), a view valid until the next evaluation)."""

    chunk: int
    positions: np.ndarray
    logits: np.ndarray


class Model:
    """A GGUF model opened for evaluation: its vocabulary, its program (`program`: (source,
    filename) of a DSL program, or None for the one shipped for its architecture) and one Session
    of n_ctx cells, computed on `n_threads` (a `pool` for more than one) with `numerics` (kept
    resolved: "llama.cpp" is this CPU's build)."""

    def __init__(self, path: str | os.PathLike, n_ctx: int, *, program: tuple[str, str] | None = None,
                 n_threads: int = 1, pool=None, numerics: str = "ggml"):
        from ..dsl import parse
        from ..generate import Session, shipped_program
        from ..gguf_io import open_gguf
        from ..kernels.numerics import host_flags, resolve
        from ..tokenizer import Vocab

        self.path = os.fspath(path)
        self.numerics = resolve(numerics, host_flags())
        self.vocab = Vocab.from_gguf(self.path)
        if program is None:
            where = shipped_program(open_gguf(self.path).metadata("general.architecture", ""))
            program = (where.read_text(encoding="utf-8"), str(where))
        source, filename = program
        self.program_digest = hashlib.sha256(source.encode("utf-8")).hexdigest()
        self.session = Session(self.path, parse(source, filename=filename), n_ctx=n_ctx, n_threads=n_threads,
                               pool=pool, numerics=self.numerics)
        self.n_ctx = n_ctx
        self.n_vocab = self.vocab.n_tokens
        self.bos = self.vocab.bos_id if self.vocab.add_bos else None

    def pieces(self, tokens: np.ndarray, groups: list[Group], out_from: int,
               observe: Callable[[int], object] | None = None) -> Iterator[Piece]:
        """Evaluate the chunks of `groups` (chunk i is tokens[i*n_ctx:(i+1)*n_ctx]) and yield, piece
        after piece, the logits of positions out_from.. . `observe(n)` gives graph_compute's
        observer for a piece of a batch of n chunks (llama.cpp's micro-batch: n times its rows); with one, the
        chunks of a group take turns piece by piece (each its own cells, saved and put back), so
        that the observer sees the rows in llama.cpp's order: piece 0 of each chunk, then piece 1..."""
        s, n_ctx = self.session, self.n_ctx
        for group in groups:
            chunks = {i: self._chunk(tokens, i) for i in group.chunks}
            turns = observe is not None and len(group.chunks) > 1
            saved = {}
            order = ([(p, i) for p in range(len(group.pieces)) for i in group.chunks] if turns else
                     [(p, i) for i in group.chunks for p in range(len(group.pieces))])
            for p, i in order:
                a, b = group.pieces[p]
                if p == 0:
                    s.reset()
                elif turns:
                    s.load_cells(saved[i])
                obs = observe(len(group.chunks)) if observe is not None else None
                positions = np.arange(max(a, out_from), b, dtype=np.int32)
                if len(positions):
                    logits = s.eval_rows(chunks[i][a:b], positions - a, observe=obs)
                    self._check_vocab(logits)
                    yield Piece(i, positions, logits)
                else:
                    s.eval_rows(chunks[i][a:b], np.arange(b - a - 1, b - a, dtype=np.int32), observe=obs)
                if turns and b < n_ctx:
                    saved[i] = s.save_cells()

    def first_graph(self, groups: list[Group], out_from: int):
        """The graph of the first evaluation `pieces` makes (built now): what the thread rule
        measures (ggtool.plan.estimate_flops)."""
        a, b = groups[0].pieces[0]
        return self.session.graph(b - a, max(1, b - max(a, out_from)))

    def use_threads(self, n_threads: int, pool) -> None:
        """Compute on n_threads from now on (`pool` for more than one)."""
        self.session.n_threads, self.session.pool = n_threads, pool

    def _chunk(self, tokens: np.ndarray, i: int) -> np.ndarray:
        c = np.array(tokens[i * self.n_ctx:(i + 1) * self.n_ctx], np.int32)
        if self.bos is not None:
            c[0] = self.bos
        return c

    def _check_vocab(self, logits: np.ndarray) -> None:
        if logits.shape[1] != self.n_vocab:
            raise EvaluateError(f"the model computes {logits.shape[1]} logits per token for a vocabulary of "
                                f"{self.n_vocab} tokens", kind="vocab-logits", file=self.path)
