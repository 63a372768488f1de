"""llama-imatrix's importance matrix, collected while the model runs over a text
(tools/imatrix/imatrix.cpp), through graph_compute's `observe` (GGML's cb_eval).

For each MUL_MAT whose weight (src0) is a `blk.*` tensor, or `output.weight` with
`process_output`, and whose activations (src1) are F32 with at least 16 rows in llama.cpp's
micro-batch: per input column, the squared activations summed over the rows (float32, row after
row in llama.cpp's order: each chunk of a batch in turn, so the sums round as llama.cpp's do) and
the rows counted. Earlier matrices' sums (llama-imatrix's in-files) are added first, as it loads them.
The file written is llama-imatrix's GGUF (ggtool.imatrix.imatrix_gguf_bytes), which ggtool's quantizer
and llama-quantize read.

Mixture-of-experts weights (MUL_MAT_ID, per expert) will come with the op.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import numpy as np

from ..errors import ImatrixError
from ..imatrix import ImatrixSums, imatrix_gguf_bytes, read_imatrix_sums
from . import logprobs as lp
from .perplexity import ChunkReport
from .schedule import Schedule
from .text import EvaluateError, need_tokens

F32 = np.float32
MIN_ROWS = 16          # llama-imatrix skips smaller batches


class Collector:
    """The sums (an ImatrixSums, started from `start`) and the observer that adds to them."""

    def __init__(self, chunk_size: int, process_output: bool = False, start: ImatrixSums | None = None):
        self.chunk_size, self.process_output = chunk_size, process_output
        self.stats = start or ImatrixSums({}, {}, [])

    def wanted_weight(self, name: str) -> bool:
        return name.startswith("blk.") or (self.process_output and name == "output.weight")

    def observer(self, n_seqs: int) -> _Observer:
        """The observer for one evaluation of a batch of `n_seqs` chunks (llama.cpp's micro-batch
        has n_seqs times the rows ggtool's piece has)."""
        return _Observer(self, n_seqs)

    def add(self, node) -> None:
        """IMatrixCollector::collect_imatrix for a MUL_MAT: sums and counts of its weight."""
        w, x = node.src[0], node.src[1]
        name = w.name
        n_mat = w.ne[2] * w.ne[3]
        ne0 = x.ne[0]
        s = self.stats.sums.get(name)
        if s is None:
            s = self.stats.sums[name] = np.zeros(ne0 * n_mat, F32)
            self.stats.counts[name] = np.zeros(1, np.int64)
        elif s.size != ne0 * n_mat:
            raise ImatrixError(f"inconsistent size for {name} ({s.size} vs {ne0 * n_mat})", tensor=name, kind="size")
        c = self.stats.counts[name]
        if c.size > 1 and (c == c[0]).all():        # one count per dense weight
            c = self.stats.counts[name] = c[:1].copy()
        data = x.data                                # numpy (ne3, ne2, ne1, ne0), strides honoured
        acc = s.reshape(n_mat, ne0)
        for i3 in range(x.ne[3]):
            for i2 in range(x.ne[2]):
                m = (i3 % w.ne[3]) * w.ne[2] + (i2 % w.ne[2])
                rows = np.asarray(data[i3, i2], F32)
                # row after row, in float32: numpy's add.accumulate runs along the rows in order
                acc[m] = np.add.accumulate(np.concatenate([acc[m][None], rows * rows]), axis=0)[-1]
        if not np.isfinite(s).all():
            raise ImatrixError(f"non-finite values in the activations of {name}", tensor=name, kind="values")
        c += x.ne[1] * x.ne[2] * x.ne[3] // n_mat

    @property
    def chunk_count(self) -> int:
        """imatrix.chunk_count: the most rows any entry saw, in chunks (llama-imatrix's m_last_chunk)."""
        most = max((int(c.max()) for c in self.stats.counts.values() if c.size), default=0)
        return most // self.chunk_size


class _Observer:
    def __init__(self, collector: Collector, n_seqs: int):
        self.c, self.n_seqs = collector, n_seqs

    def wants(self, node) -> bool:
        if node.op != "MUL_MAT":
            return False
        w, x = node.src[0], node.src[1]
        if x.type != 0 or x.ne[1] * self.n_seqs < MIN_ROWS:      # F32 activations, 16 rows or more
            return False
        return w.op == "NONE" and self.c.wanted_weight(w.name)

    def __call__(self, node) -> None:
        self.c.add(node)


def imatrix_group(job, fetch=None):
    """One batch of chunks of an importance matrix as a task (distribute.GroupJob -> GroupSums): its
    sums from zero and its pieces' nll, for the caller to add in chunk order."""
    from .distribute import GroupSums, open_model
    from .schedule import Group

    t0 = time.perf_counter()
    model = open_model(job.model, fetch)
    n_ctx, first = model.n_ctx, model.n_ctx // 2
    tokens = np.asarray(job.tokens, np.int32)
    c = Collector(n_ctx, job.process_output)
    out_from = 0 if job.process_output else first
    nll = []
    for piece in model.pieces(tokens, [Group(range(job.n_chunks), tuple(job.pieces))], out_from,
                              observe=c.observer):
        keep = (piece.positions >= first) & (piece.positions < n_ctx - 1)
        v = None
        if job.ppl and keep.any():
            pos = piece.positions[keep]
            v = lp.nll(piece.logits[keep], tokens[piece.chunk * n_ctx + pos + 1])
        nll.append((piece.chunk, v, bool(piece.positions[-1] == n_ctx - 1)))
    return GroupSums(job.index, c.stats.sums, c.stats.counts, nll, time.perf_counter() - t0)


def check_against_model(stats: ImatrixSums, model_path: str, file: str) -> None:
    """Every entry read from `file` must be a matrix of the model, of its width: an importance
    matrix made for another model is refused before anything runs."""
    from ..gguf_io import open_gguf

    g = open_gguf(model_path)
    for name, s in stats.sums.items():
        t = g.tensors.get(name)
        if t is None:
            raise ImatrixError(f"entry '{name}' is not a tensor of {model_path} (an importance matrix for another "
                               "model?)", file=file, tensor=name, kind="model")
        ne = list(t.shape) if hasattr(t, "shape") else list(t.ne)
        ne = [int(v) for v in ne] + [1] * (4 - len(ne))
        if s.size != ne[0] * ne[2] * ne[3]:
            raise ImatrixError(f"entry '{name}' has {s.size} values; {model_path}'s tensor takes "
                               f"{ne[0] * ne[2] * ne[3]} (an importance matrix for another model?)", file=file,
                               tensor=name, kind="model")


def load_in_files(paths: list[str], chunk_size: int) -> ImatrixSums | None:
    """The matrices of `paths` added together, as llama-imatrix loads its in-files."""
    from ..imatrix import merge_sums

    stats = None
    for p in paths:
        stats = merge_sums(stats, read_imatrix_sums(p, chunk_size), p)
    return stats


class ImatrixRun:
    """llama-imatrix over `tokens` (compute_imatrix): iterate for a ChunkReport per chunk (the
    running PPL when `ppl`), then `.result` (a record) and `.bytes()` (the GGUF file). `dataset`
    is the text's name as the file records it (llama-imatrix records -f as given)."""

    def __init__(self, model, tokens: np.ndarray, *, dataset: str, n_chunks: int | None = None,
                 schedule: Schedule | None = None, process_output: bool = False, start: ImatrixSums | None = None,
                 ppl: bool = True, text_file: str | None = None, executor=None):
        n_ctx = model.n_ctx
        self.executor = executor   # distribute: each batch of chunks a task, its sums added in chunk order
        need_tokens(len(tokens), n_ctx, text_file)
        self.model, self.tokens, self.ppl = model, tokens, ppl
        n_max = len(tokens) // n_ctx
        self.n_chunk = n_max if n_chunks is None else max(1, min(n_chunks, n_max))
        self.schedule = schedule or Schedule(n_ctx)
        if self.schedule.n_ctx != n_ctx:
            raise EvaluateError(f"the schedule's n_ctx {self.schedule.n_ctx} is not the model's {n_ctx}", kind="bad-size")
        self.collector = Collector(n_ctx, process_output, start)
        self.dataset = dataset
        self.nll = self.nll2 = 0.0
        self.count = 0
        self.seconds = 0.0
        self.result: dict | None = None

    def first_graph(self):
        """The graph of the run's first evaluation (for the thread rule)."""
        out_from = 0 if self.collector.process_output else self.model.n_ctx // 2
        return self.model.first_graph(self.schedule.groups(self.n_chunk), out_from)

    def __iter__(self) -> Iterator[ChunkReport]:
        m, n_ctx, first = self.model, self.model.n_ctx, self.model.n_ctx // 2
        out_from = 0 if self.collector.process_output else first
        t0 = time.perf_counter()
        if self.executor is not None:
            yield from self._run_tasks(t0)
            return
        for piece in m.pieces(self.tokens, self.schedule.groups(self.n_chunk), out_from, observe=self.collector.observer):
            keep = (piece.positions >= first) & (piece.positions < n_ctx - 1)
            if self.ppl and keep.any():
                pos = piece.positions[keep]
                v = lp.nll(piece.logits[keep], self.tokens[piece.chunk * n_ctx + pos + 1])
                self.nll += float(v.sum())
                self.nll2 += float((v * v).sum())
                self.count += len(v)
            if piece.positions[-1] == n_ctx - 1:
                self.seconds = time.perf_counter() - t0
                ppl = math.exp(self.nll / self.count) if self.count else float("nan")
                yield ChunkReport(piece.chunk + 1, self.n_chunk, ppl, self.seconds)
        self.seconds = time.perf_counter() - t0
        self.collector.stats.datasets.append(self.dataset)
        self.result = self._final()

    def _run_tasks(self, t0: float) -> Iterator[ChunkReport]:
        """Each batch of chunks a task (distribute.imatrix_group): its sums, from zero, added to the
        others' in chunk order (float32, as merging imatrix files adds them); the nll of its pieces added in
        the order one process adds them. The same bits on one worker or many; against a run in one
        process, whose float32 sums run on across batches, they differ by that regrouping."""
        from ..imatrix import ImatrixSums, merge_sums
        from .distribute import GroupJob, ModelSpec, map_ordered

        ex, n_ctx = self.executor, self.model.n_ctx
        spec = ModelSpec.of(self.model)
        spec = ModelSpec(ex.ship(self.model.path), spec.n_ctx, spec.numerics, spec.program)
        groups = self.schedule.groups(self.n_chunk)
        jobs = [GroupJob(k, spec, np.array(self.tokens[g.chunks.start * n_ctx:g.chunks.stop * n_ctx], np.int32),
                         g.pieces, len(g.chunks), self.collector.process_output, self.ppl)
                for k, g in enumerate(groups)]
        for res, g in zip(map_ordered(ex, imatrix_group, jobs), groups):
            merge_sums(self.collector.stats, ImatrixSums(res.sums, res.counts, []), "a task's sums")
            for chunk, v, last in res.nll:
                if v is not None:
                    self.nll += float(v.sum())
                    self.nll2 += float((v * v).sum())
                    self.count += len(v)
                if last:
                    self.seconds = time.perf_counter() - t0
                    ppl = math.exp(self.nll / self.count) if self.count else float("nan")
                    yield ChunkReport(g.chunks.start + chunk + 1, self.n_chunk, ppl, self.seconds)
        self.seconds = time.perf_counter() - t0
        self.collector.stats.datasets.append(self.dataset)
        self.result = self._final()

    def _final(self) -> dict:
        rec = {"kind": "imatrix", "model": self.model.path, "n_ctx": self.model.n_ctx, "n_chunk": self.n_chunk,
               "n_batch": self.schedule.n_batch, "n_ubatch": self.schedule.n_ubatch, "numerics": self.model.numerics,
               "entries": len(self.collector.stats.sums), "chunk_count": self.collector.chunk_count,
               "datasets": list(self.collector.stats.datasets), "seconds": self.seconds,
               "tokens_per_second": self.n_chunk * self.model.n_ctx / self.seconds if self.seconds else None}
        if self.ppl and self.count:
            nll, nll2 = self.nll / self.count, self.nll2 / self.count
            var = nll2 - nll * nll
            rec["ppl"] = math.exp(nll)
            rec["ppl_unc"] = math.sqrt(var / (self.count - 1)) * math.exp(nll) if var > 0 and self.count > 1 else None
        return rec

    def bytes(self) -> bytes:
        return imatrix_gguf_bytes(self.collector.stats, self.collector.chunk_count, self.model.n_ctx)


def write_imatrix(path: str, stats: ImatrixSums, chunk_count: int, chunk_size: int) -> int:
    """The GGUF file to `path`, atomically (tensor_io.atomic_path), read back and checked before it
    is renamed into place; returns its size."""
    from ..tensor_io.outputs import atomic_path, named_write_errors

    data = imatrix_gguf_bytes(stats, chunk_count, chunk_size)
    with named_write_errors(path), atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
        if tmp != path:
            back = read_imatrix_sums(tmp, chunk_size)
            if sorted(back.sums) != sorted(stats.sums) or any(
                    not np.array_equal(back.sums[k], stats.sums[k]) for k in stats.sums):
                raise ImatrixError("the file written does not read back as what was collected", file=path,
                                   kind="format")
    return len(data)
