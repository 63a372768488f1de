"""Evaluation cut into tasks that any process can run, merged on the caller as one process would add
them (docs/cluster.md): the pieces of a chunk are scored where the model runs, and the caller adds
the pieces' values in chunk order with the same arithmetic as `Perplexity`, so the numbers do not
depend on where or in which order the tasks ran.

- `ChunkJob` -> `score_chunk`: one chunk of a perplexity, base-file or KL-divergence run, its
  pieces' values (not their sums): the nll per scored token, a base file's encoded rows, the
  arguments `KLDSums.add` takes. Chunks of one batch are independent (each starts from a fresh KV
  cache), so a chunk is a task.
- `GroupJob` -> `collect.imatrix_group`: one batch of chunks (llama.cpp's, whose chunks take turns piece by
  piece) of an importance matrix: its sums from zero, added to the others in chunk order.
- `QuantizeJob` -> `quantize_task`: one file type written from a model.

A task's model or file is a `FileSource`: a path every process sees, or the file's bytes in Ray's
object store, written once per process into a private cache folder (ship mode). Executors:
`LocalExecutor` (this process, in order: what a Ray cluster gives, on one machine, without Ray) and
`ggtool.evaluate.cluster.RayExecutor`. A task's result carries its index; a task run twice (a
worker lost, Ray's retry) gives the same result, and the caller takes one per index.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from .schedule import Group
from .text import EvaluateError

HEAD_BYTES = 1 << 20          # what a FileSource hashes of a file to tell it from another of its size


def head_digest(path: str) -> str:
    """sha256 of the file's size, first and last MiB: cheap, and enough to tell two model files apart."""
    size = os.path.getsize(path)
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(HEAD_BYTES))
        if size > HEAD_BYTES:
            f.seek(max(HEAD_BYTES, size - HEAD_BYTES))
            h.update(f.read(HEAD_BYTES))
    return h.hexdigest()


@dataclass(frozen=True)
class FileSource:
    """A file a task reads: `path` as the caller sees it, its `size` and `digest` (head_digest), and
    `ref`, the object-store reference of its bytes when it is shipped (None: read at `path`)."""

    path: str
    size: int
    digest: str
    ref: object = None

    @classmethod
    def of(cls, path: str | os.PathLike) -> FileSource:
        p = os.path.abspath(os.fspath(path))
        return cls(p, os.path.getsize(p), head_digest(p))

    def shipped(self, ref) -> FileSource:
        return FileSource(self.path, self.size, self.digest, ref)

    def local_path(self, fetch: Callable[[object], object] | None = None) -> str:
        """A path to this file in this process: `path` itself (checked: the same size and digest), or
        the shipped bytes written once into this process's cache folder (`fetch` gets them)."""
        if self.ref is None:
            try:
                same = os.path.getsize(self.path) == self.size and head_digest(self.path) == self.digest
            except OSError:
                same = False
            if not same:
                raise EvaluateError(f"this node does not see the file the caller sees at this path ({self.size} "
                                    "bytes); ship it through the object store", kind="not-shared", file=self.path)
            return self.path
        return _cached_copy(self, fetch)


_CACHE_LOCK = threading.Lock()


def shipped_folder() -> str:
    """This user's folder of shipped files, in the temporary directory: made 0700, and refused if
    it is a symbolic link, not a directory, another user's or open to others (a folder planted in
    a shared /tmp would hand them the model and the files written from it)."""
    import stat

    folder = os.path.join(tempfile.gettempdir(), f"ggtool-shipped-{os.getuid()}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise EvaluateError(f"cannot make the folder of shipped files: {e.strerror}", kind="ship-cache",
                            file=folder) from None
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise EvaluateError("the folder of shipped files is not this user's own private directory (a link, "
                            "another user's, or open to others): remove it", kind="ship-cache", file=folder)
    return folder


def _cached_copy(src: FileSource, fetch) -> str:
    folder = shipped_folder()
    path = os.path.join(folder, f"{src.digest}-{src.size}{os.path.splitext(src.path)[1]}")
    with _CACHE_LOCK:
        try:
            if os.path.getsize(path) == src.size and head_digest(path) == src.digest:
                return path
        except OSError:
            pass
        data = fetch(src.ref) if fetch is not None else src.ref
        buf = memoryview(data).cast("B")
        if len(buf) != src.size:
            raise EvaluateError(f"the shipped copy is {len(buf)} bytes, not {src.size}", kind="not-shared",
                                file=src.path)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(buf)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    return path


# -- the model a task evaluates ---------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSpec:
    """What a task needs to open the caller's model as `chunks.Model`: the file, n_ctx, the program
    ((source, filename) or None for the shipped one) and the numerics, resolved on the caller
    (every node computes in the caller's order, whatever its CPU)."""

    source: FileSource
    n_ctx: int
    numerics: str
    program: tuple[str, str] | None = None

    @classmethod
    def of(cls, model) -> ModelSpec:
        """The spec of an open `chunks.Model`."""
        return cls(FileSource.of(model.path), model.n_ctx, model.numerics, getattr(model, "program", None))


_MODELS: dict[tuple, object] = {}      # this process's open models: a worker runs many tasks of one


def open_model(spec: ModelSpec, fetch=None):
    """The `chunks.Model` of `spec`, kept open in this process for the next task (one at a time)."""
    from .chunks import Model

    path = spec.source.local_path(fetch)
    key = (path, spec.source.digest, spec.n_ctx, spec.numerics, spec.program)
    m = _MODELS.get(key)
    if m is None:
        _MODELS.clear()
        m = _MODELS[key] = Model(path, spec.n_ctx, program=spec.program, numerics=spec.numerics)
    return m


# -- perplexity, base files, KL divergence: a chunk a task --------------------------------------------

@dataclass
class ChunkJob:
    """One chunk: `tokens` its n_ctx tokens, `pieces` its batch's pieces (Group.pieces), `mode`
    ppl, base or kld; `top_k` for a top-K base file; `base_rows` the chunk's scored rows of the base
    file read (kld mode: BaseFile.rows of the whole chunk), `base_kind` its kind."""

    index: int
    model: ModelSpec
    mode: str
    tokens: np.ndarray
    pieces: tuple
    top_k: int | None = None
    base_rows: object = None
    base_kind: str = "full"


@dataclass
class ChunkScores:
    """A chunk's pieces, in order: (first scored row of the piece, what it adds): for ppl the nll
    per token; for base (the encoded rows' bytes, the nll); for kld the arguments of KLDSums.add."""

    index: int
    items: list = field(default_factory=list)
    seconds: float = 0.0


class _Recorder:
    """A KLDSums stand-in that keeps what `add` was given, for the caller to add in order."""

    def __init__(self):
        self.calls = []

    def add(self, *args) -> None:
        self.calls.append(args)


def _slice_rows(rows, a: int, n: int):
    if isinstance(rows, tuple):
        return tuple(r[a:a + n] for r in rows)
    return rows[a:a + n]


def score_chunk(job: ChunkJob, fetch=None) -> ChunkScores:
    """Evaluate one chunk and return its pieces' values (see ChunkScores)."""
    import time

    from . import logprobs as lp
    from .basefile import top_k_row_bytes

    t0 = time.perf_counter()
    model = open_model(job.model, fetch)
    n_ctx, first = model.n_ctx, model.n_ctx // 2
    tokens = np.asarray(job.tokens, np.int32)
    out = ChunkScores(job.index)
    base_rows = job.base_rows
    if isinstance(base_rows, Lazy):
        base_rows = base_rows()
    elif base_rows is not None and fetch is not None:
        base_rows = fetch(base_rows)
    for piece in model.pieces(tokens, [Group(range(0, 1), tuple(job.pieces))], first):
        keep = piece.positions < n_ctx - 1
        positions, logits = piece.positions[keep], piece.logits[keep]
        if not len(positions):
            continue
        rows = positions - first
        nxt = tokens[positions + 1]
        if job.mode == "ppl":
            out.items.append((int(rows[0]), lp.nll(logits, nxt)))
        elif job.mode == "base":
            if job.top_k is None:
                enc, v = lp.encode_full(logits, nxt)
                out.items.append((int(rows[0]), (enc.tobytes(), v)))
            else:
                ids, lps, rest, nx, v = lp.encode_top_k(logits, nxt, job.top_k)
                out.items.append((int(rows[0]), (top_k_row_bytes(ids, lps, rest, nx), v)))
        else:
            rec = _Recorder()
            base = _slice_rows(base_rows, int(rows[0]), len(rows))
            if job.base_kind == "full":
                lp.kld_full(logits, nxt, base, rec)
            else:
                lp.kld_top_k(logits, nxt, *base, rec)
            out.items.append((int(rows[0]), rec.calls[0]))
    out.seconds = time.perf_counter() - t0
    return out


# -- importance matrices: a batch of chunks a task -------------------------------------------------------

@dataclass
class GroupJob:
    """One batch of chunks of an importance matrix: `tokens` its chunks' tokens one after the other,
    `pieces` and `n_chunks` the batch's, `ppl` whether to score it too."""

    index: int
    model: ModelSpec
    tokens: np.ndarray
    pieces: tuple
    n_chunks: int
    process_output: bool = False
    ppl: bool = True


@dataclass
class GroupSums:
    """A batch's importance sums and counts from zero, and per piece yielded, in order: (its chunk
    within the batch, its nll or None, whether it ends the chunk)."""

    index: int
    sums: dict
    counts: dict
    nll: list
    seconds: float = 0.0


# -- executors ---------------------------------------------------------------------------------------------

class Lazy:
    """A value made when a task asks for it (LocalExecutor.put_cached: nothing held before)."""

    def __init__(self, make: Callable[[], object]):
        self.make = make

    def __call__(self):
        return self.make()


class LocalExecutor:
    """Runs each task in this process when its result is asked for, in the order asked: the
    distributed procedure without a cluster (the reference a cluster's numbers equal)."""

    name = "local"
    workers = 1

    def put(self, obj):
        return obj

    def put_cached(self, key, make: Callable[[], object]):
        """What a task gets as `make()`'s value: here made when the task runs, so that nothing is
        held for the tasks still waiting (a cluster's executor puts it in its store once per key)."""
        return Lazy(make)

    def ship(self, path: str) -> FileSource:
        return FileSource.of(path)

    def submit(self, fn, *args, **kw):
        return (fn, args)

    def get(self, handle):
        fn, args = handle
        return fn(*args)

    def ordered(self, handles: list) -> Iterator:
        """The results of `handles`, in their order (as each finishes, when the tasks run elsewhere)."""
        for h in handles:
            yield self.get(h)

    def close(self) -> None:
        pass


def map_ordered(executor, fn, jobs: Iterable) -> Iterator:
    """Submit every job at once (the executor spreads them), then yield results in job order."""
    return executor.ordered([executor.submit(fn, j) for j in jobs])


# -- quantization: a file type a task ------------------------------------------------------------------------

@dataclass
class QuantizeJob:
    """One file type of a model: `ftype` its name, `tensor_types` PATTERN=TYPE rules, `imatrix` the
    importance matrix's file, `output` the path to write (a path every node sees) or None (the
    file's bytes come back in the result), `threads` converting it."""

    index: int
    source: FileSource
    ftype: str
    output: str | None = None
    imatrix: FileSource | None = None
    allow_requantize: bool = False
    tensor_types: tuple[str, ...] = ()
    threads: int = 1


@dataclass
class QuantizeDone:
    """A quantization's result: its size, digest, tensor bytes and elements (for bits per weight),
    seconds, and `data` (the file's bytes, when it was not written at the caller's path)."""

    index: int
    size: int
    digest: str
    tensor_bytes: int
    n_elements: int
    seconds: float
    data: bytes | None = None


def quantize_task(job: QuantizeJob, fetch=None) -> QuantizeDone:
    from .. import quantize_model as QM
    from ..imatrix import read_imatrix

    src = job.source.local_path(fetch)
    imatrix = read_imatrix(job.imatrix.local_path(fetch)) if job.imatrix is not None else None
    opts = QM.QuantizeOptions(type=job.ftype, imatrix=imatrix, allow_requantize=job.allow_requantize,
                              tensor_types=[QM.parse_tensor_type_override(r) for r in job.tensor_types],
                              threads=job.threads)
    if job.output is not None:
        res = QM.quantize_file(src, job.output, opts, force=True)
        return QuantizeDone(job.index, res.file_bytes, head_digest(job.output), res.plan.dst_bytes,
                            res.plan.n_elements, res.seconds)
    folder = tempfile.mkdtemp(prefix="ggtool-quantize-")
    out = os.path.join(folder, "model.gguf")
    try:
        res = QM.quantize_file(src, out, opts)
        with open(out, "rb") as f:
            data = f.read()
        return QuantizeDone(job.index, len(data), head_digest(out), res.plan.dst_bytes, res.plan.n_elements,
                            res.seconds, data)
    finally:
        if os.path.exists(out):
            os.unlink(out)
        os.rmdir(folder)
