"""A model held open across steps: weights, a KV cache, and one built graph per batch shape.

`Session(model_path, program)` opens the GGUF once and is the DSL environment of its program
(ggtool.dsl.Env): weights and metadata come from the file, the batch inputs (`tokens`, `kv_pos`,
`kv_cells`, `kv_mask`, `kv_mask_swa`) from the session, and every `state(...)` tensor (the KV cache,
`cache_k.{il}`/`cache_v.{il}` in the shipped programs) lives in the session's one Context, n_ctx cells
in its rows (ne1), so that it outlives each compute. `eval(tokens)` runs one batch at the next positions and
returns the last token's logits. Attention reads only the cells in use, padded to KV_PAD as
llama.cpp pads them: the graph of each (batch size, cells read) is built once and computed again
with new input values, so a step costs what its context holds, not n_ctx. docs/generate.md has
the design.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import types as T
from ..context import Context
from ..errors import GGToolError
from ..kernels.numerics import LLAMA_CPP_KV_PAD, is_llama_cpp
from ..tensor import Tensor

KV_PAD = LLAMA_CPP_KV_PAD   # llama.cpp's n_kv: the used cells rounded up to a multiple of 256 (llama_kv_cache::get_n_kv)


class ContextFullError(GGToolError):
    """The batch would not fit in the KV cache (`n_ctx` cells)."""

    def __init__(self, n_past: int, n_tokens: int, n_ctx: int):
        self.n_past, self.n_tokens, self.n_ctx, self.kind = n_past, n_tokens, n_ctx, "context-full"
        super().__init__(f"the KV cache holds {n_ctx} tokens: {n_past} + {n_tokens} do not fit")


class NoCacheError(GGToolError):
    """The program does not use the KV cache inputs (it would recompute nothing it has seen)."""

    def __init__(self, filename: str, input: str = "kv_mask"):
        self.filename, self.input, self.kind = filename, input, "no-cache"
        if input == "kv_mask":
            why = "so it cannot continue a batch from the KV cache"
        else:
            why = "so it cannot give the logits of chosen rows (llama.cpp's inp_out_ids)"
        super().__init__(f"{filename}: the program reads no {input} input, {why} (docs/dsl.md, \"Persistent state\")")


@dataclass
class _Step:
    """The graph for one batch size, with its input tensors and its plan (made by the first compute),
    the position its one-row masks were last filled for (`masked`; -1: none, or several rows), and
    whether the masks keep what was written (`masks_kept`: no node of the graph writes into them)."""

    graph: object
    logits: Tensor
    batch: dict
    plan: object = None
    masked: int = -1
    masks_kept: bool = True


class Session:
    """One model, its program and its KV cache of `n_ctx` cells (see the module's docstring)."""

    read_data = True

    def __init__(self, model_path: str, program, n_ctx: int, n_threads: int = 1, pool=None,
                 numerics: str = "ggml", max_steps: int | None = None, kv_pad: int = KV_PAD):
        from ..compute import graph_compute
        from ..dsl.builtins import fill_causal_mask
        from ..tensor_io import Inputs

        # what every step calls, loaded with the session (not with this module, which `ggtool generate
        # --help` imports), and not looked up at each step
        self._graph_compute, self._fill_causal_mask = graph_compute, fill_causal_mask
        self.weights = Inputs([], [model_path])
        self._steps: dict[tuple, _Step] = {}   # (n_tokens, n_kv), or (n_tokens, n_kv, n_out) -> its graph
        self.program, self.n_ctx, self.n_threads, self.pool = program, n_ctx, n_threads, pool
        self.numerics, self.max_steps = numerics, max_steps
        # llama.cpp's attention runs over a multiple of 256 cells (its n_kv): under its numerics the
        # cache has as many and reads them padded so, whatever kv_pad asks, so that the sums over
        # cells fall in its lanes (the unused are masked)
        exact = is_llama_cpp(numerics)
        self.kv_pad = LLAMA_CPP_KV_PAD if exact else kv_pad
        self.n_cells = -(-n_ctx // LLAMA_CPP_KV_PAD) * LLAMA_CPP_KV_PAD if exact else n_ctx
        self.ctx = Context()
        self.n_past = 0
        arch = _meta(self.weights, "general.architecture", "")
        self.n_swa = int(_meta(self.weights, f"{arch}.attention.sliding_window", 0))
        self._state: dict[str, Tensor] = {}
        self._building: dict[str, Tensor] = {}

    @property
    def pool(self):
        """The worker pool the steps compute on (None: this process)."""
        return self._pool

    @pool.setter
    def pool(self, pool) -> None:
        """A pool given after graphs were built (`prepare`, then the thread count chosen for them)
        is told of those graphs too: only their inputs' values change between steps, so it
        describes each once, not at every step."""
        self._pool = pool
        freeze = getattr(pool, "freeze", None)
        if freeze is not None:
            for step in self._steps.values():
                freeze(step.graph)

    # -- the DSL environment -----------------------------------------------------------------------
    def tensor(self, name: str, ctx: Context) -> Tensor | None:
        t = self._building.get(name)
        return t if t is not None else self.weights.tensor(name, ctx)

    def names(self) -> list[str]:
        return [*self._building, *self.weights.names()]

    def metadata(self, key: str):
        return self.weights.metadata(key)

    def state(self, name: str, type_, ne: list[int], ctx: Context) -> Tensor:
        """The state tensor `name`: n_cells cells in its rows (ne1, what set_rows writes;
        n_ctx, or under llama.cpp's numerics n_ctx rounded up to 256), zeros, made
        by the first graph that asks; a graph that reads fewer cells gets a view of the first ne[1].
        A 1-D state is one row, kept as it is asked for."""
        from ..ops import FUNCTIONS

        t = self._state.get(name)
        if t is None:
            full = [ne[0], self.n_cells, *ne[2:]] if len(ne) > 1 else list(ne)
            t = self._state[name] = ctx.new_tensor(type_, full)
            t.name = name
        k = len(ne)
        if k < 2 or k > 4 or list(ne) == list(t.ne[:k]) or [ne[0], *ne[2:]] != [t.ne[0], *t.ne[2:k]]:
            return t   # every cell, or a shape the DSL's state() then refuses
        return FUNCTIONS[f"view_{k}d"](ctx, t, *ne, *t.nb[1:k], 0)

    # -- graphs ------------------------------------------------------------------------------------
    def n_kv(self, n_tokens: int, n_past: int | None = None) -> int:
        """The cells a batch of n_tokens after n_past ones (default: those in the cache) reads: those
        in use, padded to kv_pad."""
        pad, n_past = self.kv_pad, self.n_past if n_past is None else n_past
        return min(self.n_cells, -(-(n_past + n_tokens) // pad) * pad)

    def prepare(self, *sizes: int, n_past: int | None = None, n_out: int | None = None) -> None:
        """Build the graphs of these batch sizes after n_past tokens (default: the next position)
        now, before the first compute places the context; `n_out` as for `eval_rows`."""
        for n in sizes:
            self._step(n, self.n_kv(n, n_past), n_out)

    def graph(self, n_tokens: int, n_out: int | None = None):
        """The graph of a batch of n_tokens at the next position (built now if it is not yet)."""
        return self._step(n_tokens, self.n_kv(n_tokens), n_out).graph

    def _step(self, n_tokens: int, n_kv: int, n_out: int | None = None) -> _Step:
        key = (n_tokens, n_kv) if n_out is None else (n_tokens, n_kv, n_out)
        step = self._steps.get(key)
        if step is not None:
            return step
        from ..dsl import build
        from ..dsl.limits import MAX_STEPS

        c = self.ctx
        batch = {"tokens": c.new_tensor(T.I32, [n_tokens]), "kv_pos": c.new_tensor(T.I32, [n_tokens]),
                 "kv_cells": c.new_tensor(T.I32, [n_tokens]), "kv_mask": c.new_tensor(T.F32, [n_kv, n_tokens]),
                 "kv_mask_swa": c.new_tensor(T.F32, [n_kv, n_tokens])}
        if n_out is not None:       # the rows whose logits are wanted (llama.cpp's inp_out_ids)
            batch["kv_out_ids"] = c.new_tensor(T.I32, [n_out])
        for name, t in batch.items():
            t.name = name
        self._building = batch
        try:
            built = build(self.program, c, self, max_steps=MAX_STEPS if self.max_steps is None else self.max_steps)
        finally:
            self._building = {}
        if "kv_mask" not in built.tensors:
            raise NoCacheError(self.program.filename)
        if n_out is not None and "kv_out_ids" not in built.tensors:
            raise NoCacheError(self.program.filename, "kv_out_ids")
        from ..compute import freeze, written

        masks = {id(batch["kv_mask"]), id(batch["kv_mask_swa"])}
        kept = not any(id(t.root) in masks for t in written(built.graph.nodes))
        step = self._steps[key] = _Step(built.graph, built.outputs[0][1], batch, masks_kept=kept)

        freeze(built.graph)        # only the inputs' values change between steps: its steps made once
        pool_freeze = getattr(self.pool, "freeze", None)
        if pool_freeze is not None:     # and described once for the pool
            pool_freeze(built.graph)
        return step

    def logits_width(self) -> int:
        """How many logits a token gets (the program's output rows: the vocabulary it computes)."""
        return int(self._step(1, self.n_kv(1)).logits.ne[0])

    def state_bytes(self) -> int:
        """The bytes of every state tensor made so far (the KV cache)."""
        return sum(int(t.nbytes) for t in self._state.values())

    def attach_pool(self, n_threads: int, pool) -> None:
        """Compute on `pool` with n_threads participants from now on; the graphs built so far are
        described to it once (WorkerPool.freeze), as those built later are."""
        self.n_threads, self.pool = n_threads, pool      # the pool's setter describes them

    def llama_cpp_gaps(self) -> list:
        """Under llama.cpp's numerics, what the one-token step computes in GGML's order where llama.cpp's
        x86 build computes otherwise (``ggtool.ops.llama_cpp_gaps``: none today, every weight type and silu have it);
        empty under the default numerics or where every node is covered."""
        if not is_llama_cpp(self.numerics):
            return []
        from ..ops import llama_cpp_gaps

        return llama_cpp_gaps(self.graph(1).nodes)

    def reset(self) -> None:
        """An empty KV cache (the graphs are kept): the next batch starts at position 0."""
        for t in self._state.values():
            t.data[...] = 0
        self.n_past = 0

    def save_cells(self) -> tuple[int, dict[str, np.ndarray]]:
        """A copy of the cells in use (n_past, and each state tensor's first n_past cells), for
        `load_cells`: several sequences take turns on one cache, as llama.cpp's streams do."""
        n = self.n_past
        return n, {name: np.array(_cells(t, n)) for name, t in self._state.items()}

    def load_cells(self, saved: tuple[int, dict[str, np.ndarray]]) -> None:
        """Put back what `save_cells` copied: the next batch continues that sequence. The cells past
        n_past keep what they hold (finite values, masked)."""
        n, cells = saved
        for name, t in self._state.items():
            _cells(t, n)[...] = cells[name]
        self.n_past = n

    # -- computing ---------------------------------------------------------------------------------
    def eval(self, tokens) -> np.ndarray:
        """The batch `tokens` at positions n_past.. : its K and V join the cache; the last token's
        logits (float32, n_vocab) are returned."""
        return np.array(self._run(tokens, None, None)[-1])

    def eval_rows(self, tokens, rows, observe=None) -> np.ndarray:
        """The batch `tokens` at positions n_past.. , as `eval`, but the logits of the batch's rows
        `rows` (indices into the batch; the program's `kv_out_ids`, llama.cpp's inp_out_ids) are
        returned: float32 (len(rows), n_vocab), a view of the compute buffer valid until the next
        compute (copy what must outlive it). `observe` is graph_compute's (cb_eval): it sees each
        node it wants as the node is computed."""
        rows = np.asarray(rows, np.int32)
        return self._run(tokens, rows, observe)

    def _run(self, tokens, rows, observe) -> np.ndarray:
        tokens = np.asarray(tokens, np.int32)
        n = len(tokens)
        if self.n_past + n > self.n_ctx:
            raise ContextFullError(self.n_past, n, self.n_ctx)
        n_kv = self.n_kv(n)
        step = self._step(n, n_kv, None if rows is None else len(rows))
        b = step.batch
        # the batch's inputs are the session's own tensors (I32 and F32 in its context, never mapped
        # from a file, never repacked): written in place, as the masks always were
        p0 = self.n_past
        positions = np.arange(p0, p0 + n, dtype=np.int32)
        b["tokens"].data[...] = tokens
        b["kv_pos"].data[...] = positions
        b["kv_cells"].data[...] = positions                # cell c holds position c
        if rows is not None:
            b["kv_out_ids"].data[...] = rows
        self._mask(step, n, n_kv, positions)
        step.plan = self._graph_compute(step.graph, self.n_threads, pool=self.pool, plan=step.plan, alloc="graph",
                                        outputs=[step.logits], numerics=self.numerics, observe=observe)
        self.n_past += n
        return step.logits.data.reshape(-1, step.logits.ne[0])

    def _mask(self, step: _Step, n: int, n_kv: int, positions: np.ndarray) -> None:
        """The batch's KQ masks (fill_causal_mask): a one-row step's at the position after the one it
        was filled for last has one cell more to see (and, with a window, one less): those alone."""
        mask = step.batch["kv_mask"].data.reshape(n, n_kv)
        swa = step.batch["kv_mask_swa"].data.reshape(n, n_kv)
        p, last = int(positions[0]), step.masked
        step.masked = -1        # until filled: a fill cut short (Ctrl-C) leaves no row taken for filled
        if n == 1 and last >= 0 and last == p - 1 and p < n_kv and step.masks_kept:
            mask[0, p] = swa[0, p] = np.float32(0)
            if self.n_swa > 0 and p - self.n_swa >= 0:
                swa[0, p - self.n_swa] = np.float32(-np.inf)
        else:
            self._fill_causal_mask(mask, positions)
            self._fill_causal_mask(swa, positions, self.n_swa)
        if n == 1:
            step.masked = p


def _cells(t: Tensor, n: int) -> np.ndarray:
    """The first n cells (ne1, numpy's next-to-last axis) of a state tensor; a 1-D state whole."""
    d = t.data
    return d if d.ndim < 2 else d[..., :n, :]


def _meta(inputs, key: str, default):
    try:
        return inputs.metadata(key)
    except KeyError:
        return default
