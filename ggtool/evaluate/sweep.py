"""A sweep over file types (docs/cluster.md): a model quantized to each, each evaluated
against the source (or a given base) on one text, by its KL divergence through a base-logits file
computed once; a record per type (size, bits per weight, PPL, mean KLD, same top p, time), the
Pareto front of KLD against size, and the chart of it (ggtool.evaluate.chart).

Everything lives in one directory, DIR, which makes the sweep resumable cell by cell:

- `manifest.json`: what every cell shares (the source model, the text's tokens, n_ctx, chunks,
  numerics, the base): a DIR that holds another sweep is refused, naming what differs;
- `base.bin`, `base.json`: the base log-probabilities and their record (computed from the source
  model, or from --base MODEL; a base-logits file given as the base is read where it is);
- per type T: `T.gguf` and `T.quant.json` once quantized, `T.json` once evaluated.

A cell's record is written last, atomically, and names the digest of the file it describes: a
cell whose record is missing, unreadable, of another sweep or of a file that is not there (or not
the same) is done again, and said so in one line; a finished cell is kept. Tasks run in this
process (threads) or, with an executor (distribute; cluster.RayExecutor), each quantization and
each chunk of each evaluation a task, merged in chunk order: the same numbers either way.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..errors import GGToolError
from .distribute import FileSource, QuantizeJob, head_digest, quantize_task

VERSION = 1
MANIFEST = "manifest.json"
LOCK = ".ggtool-sweep.lock"      # held (flock) while a sweep runs in DIR
BASE = "base.bin"
RESULTS_JSON = "results.json"
RESULTS_CSV = "results.csv"
CHART = "kld-vs-size"
COLUMNS = ("type", "bytes", "bpw", "ppl", "ppl_unc", "kld", "kld_unc", "same_top", "quantize_seconds",
           "eval_seconds", "pareto")


class SweepError(GGToolError):
    """A sweep cannot run: `kind` ("types", "dir", "busy", "manifest", "cell", "base"), `path` where it matters."""

    def __init__(self, message: str, *, kind: str, path: str | None = None, **details):
        self.kind, self.path, self.details = kind, path, details
        super().__init__(f"{path}: {message}" if path else message)


def parse_types(spec) -> list:
    """File types from 'q4_0,q4_k_m,...' (or a list): each one ggtool writes (FileTypeError names
    the first that is not), in the order given, each once."""
    from ..quantize_model import file_type

    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec)]
    if not names or any(not n for n in names):
        raise SweepError("the list of file types is empty or has an empty entry (NAME,NAME,...)", kind="types")
    out = []
    for n in names:
        ft = file_type(n)
        if ft not in out:
            out.append(ft)
    return out


def _lstat(path: str):
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def check_dir(path: str) -> None:
    """DIR: a directory (or nothing yet, to be made), never a symbolic link, a file or a device;
    if it exists and is not empty, it must hold a sweep (its manifest)."""
    st = _lstat(path)
    if st is None:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise SweepError(f"its parent {parent} is not a directory", kind="dir", path=path)
        return
    if stat.S_ISLNK(st.st_mode):
        raise SweepError(f"is a symbolic link (to {os.readlink(path)}); give the directory itself", kind="dir",
                         path=path)
    if not stat.S_ISDIR(st.st_mode):
        raise SweepError("is not a directory", kind="dir", path=path)
    names = [n for n in os.listdir(path) if not n.startswith(".")]
    if names and MANIFEST not in names:
        raise SweepError(f"is not empty and holds no sweep ({MANIFEST}); give a new or empty directory",
                         kind="dir", path=path)


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class SweepOptions:
    """What a sweep is asked: see `Sweep`."""

    model: str
    types: list
    text: str
    out_dir: str
    imatrix: str | None = None
    base: str | None = None
    n_ctx: int = 512
    n_chunks: int | None = None
    n_batch: int = 2048
    n_ubatch: int = 512
    top_k: int | None = None
    numerics: str = "ggml"
    allow_requantize: bool = False
    threads: int | None = None


@dataclass
class SweepEvent:
    """What a sweep says as it goes: `what` is "note" (a line: a cell redone and why), "start"
    (a cell begins: `type`, `step` quantize/evaluate/base), "chunk" (`report`: a ChunkReport),
    "cell" (`row`, and `kept` for a cell found finished)."""

    what: str
    type: str | None = None
    step: str | None = None
    message: str | None = None
    report: object = None
    row: dict | None = None
    kept: bool = False


@dataclass
class SweepResult:
    rows: list = field(default_factory=list)      # the base first, then each type in the order given
    base: dict | None = None
    outputs: dict = field(default_factory=dict)   # results.json, results.csv, chart files
    seconds: float = 0.0


class Sweep:
    """A sweep of `opts.types` (see the module); `executor`: a distribute executor (each quantization
    and chunk a task), or None (this process, `opts.threads` threads)."""

    def __init__(self, opts: SweepOptions, executor=None):
        from ..imatrix import read_imatrix
        from .basefile import BaseFile

        self.opts, self.executor = opts, executor
        self.types = parse_types(opts.types)
        self.dir = opts.out_dir
        check_dir(self.dir)
        self.source = FileSource.of(opts.model)
        self.imatrix = FileSource.of(opts.imatrix) if opts.imatrix else None
        if opts.imatrix:
            read_imatrix(opts.imatrix)           # a bad one is refused before anything runs
        self.base_file = None                    # a base-logits file given as the base
        self.base_model = opts.model
        if opts.base is not None:
            with open(opts.base, "rb") as f:
                magic = f.read(8)
            if magic in (b"_logits_", b"_ggtopk_"):
                self.base_file = os.path.abspath(opts.base)
                with BaseFile(self.base_file) as b:
                    if opts.n_ctx != b.header.n_ctx:
                        raise SweepError(f"the base logits were computed with a context of {b.header.n_ctx}, not "
                                         f"{opts.n_ctx}", kind="base", path=opts.base)
            else:
                self.base_model = opts.base
        self._prepare_text()
        self.notes: list[str] = []

    # -- identity --------------------------------------------------------------------------------------
    def _prepare_text(self) -> None:
        from .chunks import Model
        from .text import need_tokens, read_text, tokenize_text

        o = self.opts
        m = Model(o.model, o.n_ctx, numerics=o.numerics)
        self.numerics = m.numerics
        self.program_digest = m.program_digest
        self.tokens = tokenize_text(m.vocab, read_text(o.text))
        need_tokens(len(self.tokens), o.n_ctx, o.text)
        n_max = len(self.tokens) // o.n_ctx
        self.n_chunk = n_max if o.n_chunks is None else max(1, min(o.n_chunks, n_max))
        self._source_model = m

    def identity(self) -> dict:
        o = self.opts
        base = ({"logits": {"size": os.path.getsize(self.base_file), "digest": head_digest(self.base_file)}}
                if self.base_file else {"model": self._ident(self.base_model)})
        return {"source": self._ident(o.model), "base": base, "n_ctx": o.n_ctx, "n_chunk": self.n_chunk,
                "n_batch": o.n_batch, "n_ubatch": o.n_ubatch, "top_k": o.top_k, "numerics": self.numerics,
                "program": self.program_digest,
                "tokens": hashlib.sha256(np.ascontiguousarray(self.tokens[: self.n_chunk * o.n_ctx], "<i4")
                                         .tobytes()).hexdigest()}

    @staticmethod
    def _ident(path: str) -> dict:
        return {"size": os.path.getsize(path), "digest": head_digest(path)}

    def _cell_identity(self, ft) -> dict:
        return {"type": ft.name, "imatrix": self._ident(self.opts.imatrix) if self.opts.imatrix else None,
                "allow_requantize": self.opts.allow_requantize}

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _own_path(self, name: str) -> str:
        """DIR/name, to be written: a symbolic link (or a FIFO, a socket) planted there is removed
        first, so that a sweep writes into DIR and nowhere else (ggtool's outputs follow a user's
        links; DIR's files are the sweep's own)."""
        path = self._path(name)
        st = _lstat(path)
        if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
            os.unlink(path)
        return path

    # -- the manifest and the cells -------------------------------------------------------------------
    def _manifest(self) -> None:
        from ..tensor_io.outputs import write_text_atomic

        os.makedirs(self.dir, exist_ok=True)
        path = self._path(MANIFEST)
        ident = self.identity()
        st = _lstat(path)
        if st is not None:
            try:
                if not stat.S_ISREG(st.st_mode):
                    raise ValueError("not a regular file")
                with open(path, encoding="utf-8") as f:
                    have = json.load(f)
                if have.get("kind") != "ggtool-sweep" or not isinstance(have.get("identity"), dict):
                    raise ValueError("not a sweep's manifest")
            except (ValueError, OSError) as e:
                raise SweepError(f"the sweep's manifest is damaged ({e}); remove the directory or give another",
                                 kind="manifest", path=path) from None
            diff = [k for k in ident if have["identity"].get(k) != ident[k]]
            if diff:
                raise SweepError(f"holds a sweep of another {', '.join(diff)}; give another directory for this one",
                                 kind="manifest", path=self.dir, differs=diff)
            return
        write_text_atomic(path, [json.dumps({"kind": "ggtool-sweep", "version": VERSION, "identity": ident},
                                            indent=1) + "\n"])

    def _read_record(self, name: str, identity: dict, kind: str, file: str | None = None) -> dict | None:
        """A cell's record if it is finished and ours; None (and a note saying why) if not."""
        path = self._path(name)
        st = _lstat(path)
        if st is None:
            return None
        why = None
        if stat.S_ISLNK(st.st_mode):
            why = "is a symbolic link (not followed)"
        elif not stat.S_ISREG(st.st_mode):
            why = "is not a regular file"
        else:
            try:
                with open(path, encoding="utf-8") as f:
                    rec = json.load(f)
                if not isinstance(rec, dict) or rec.get("kind") != kind:
                    why = "is not a record of this sweep (damaged or foreign)"
                elif rec.get("identity") != identity:
                    why = "was made with other settings (" + ", ".join(
                        k for k in identity if (rec.get("identity") or {}).get(k) != identity[k]) + ")"
                elif file is not None:
                    fst = _lstat(self._path(file))
                    if fst is None or not stat.S_ISREG(fst.st_mode):
                        why = f"describes {file}, which is missing"
                    elif fst.st_size != rec.get("file", {}).get("size") or head_digest(self._path(file)) != \
                            rec.get("file", {}).get("digest"):
                        why = f"describes another {file} than the one there"
            except (OSError, ValueError, UnicodeDecodeError, AttributeError):
                why = "is damaged (not a JSON record)"
        if why is None:
            return rec
        self._note(f"{path} {why}; that cell is done again")
        if stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode):
            os.unlink(path)
        return None

    def _note(self, message: str) -> None:
        self.notes.append(message)
        self._events.append(SweepEvent("note", message=message))

    def _write_record(self, name: str, rec: dict) -> None:
        from ..tensor_io.outputs import write_text_atomic

        write_text_atomic(self._own_path(name), [json.dumps(rec, indent=1, allow_nan=False, default=_plain) + "\n"])

    # -- the run -------------------------------------------------------------------------------------
    def run(self) -> Iterator[SweepEvent]:
        """Do what is not done; yield events (see SweepEvent); `.result` at the end. DIR is locked
        meanwhile (LOCK, flock): a second sweep in it is refused, never interleaved with this one."""
        fd = self._lock()
        try:
            yield from self._run()
        finally:
            os.close(fd)

    def _lock(self) -> int:
        import fcntl

        os.makedirs(self.dir, exist_ok=True)
        path = self._path(LOCK)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise SweepError(f"cannot open its lock {LOCK} ({e.strerror}: a symbolic link is not followed)",
                             kind="busy", path=self.dir) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SweepError(f"its lock {LOCK} is not a regular file", kind="busy", path=self.dir)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise SweepError("another sweep is running in this directory; wait for it, or give another",
                                 kind="busy", path=self.dir) from None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _run(self) -> Iterator[SweepEvent]:
        t0 = time.perf_counter()
        self._events: list[SweepEvent] = []
        self._manifest()
        ex = self.executor
        base_rec = self._base_record()
        yield from self._flush()
        # what each type still needs
        quant, evals = {}, {}
        for ft in self.types:
            ident = self._cell_identity(ft)
            rec = self._read_record(f"{ft.name}.json", ident, "ggtool-sweep-cell", f"{ft.name}.gguf")
            if rec is not None:
                evals[ft.name] = rec
                continue
            q = self._read_record(f"{ft.name}.quant.json", ident, "ggtool-sweep-quantized", f"{ft.name}.gguf")
            quant[ft.name] = q
        yield from self._flush()
        # the tasks: quantizations first (with an executor all at once), then the base, then evaluations
        pending_q = {}
        if ex is not None:
            src = ex.ship(self.opts.model)
            imx = ex.ship(self.opts.imatrix) if self.opts.imatrix else None
            shared = src.ref is None
            for k, ft in enumerate(self.types):
                if ft.name in quant and quant[ft.name] is None:
                    job = QuantizeJob(k, src, ft.name, self._own_path(f"{ft.name}.gguf") if shared else None, imx,
                                      self.opts.allow_requantize)
                    pending_q[ft.name] = ex.submit(quantize_task, job)
        if base_rec is None:
            base_rec = yield from self._make_base()
        runs = {}
        for k, ft in enumerate(self.types):
            if ft.name in evals:
                continue
            if quant[ft.name] is None:
                yield SweepEvent("start", ft.name, "quantize")
                quant[ft.name] = self._quantized(k, ft, pending_q.get(ft.name))
            if ex is not None:       # its chunks queued now, beside the other types'
                runs[ft.name] = self._kld_run(ft)
                runs[ft.name].submit()
        for ft in self.types:
            if ft.name in evals:
                row = self._row(ft.name, evals[ft.name])
                yield SweepEvent("cell", ft.name, row=row, kept=True)
                continue
            yield SweepEvent("start", ft.name, "evaluate")
            run = runs.get(ft.name) or self._kld_run(ft)
            try:
                for r in run:
                    yield SweepEvent("chunk", ft.name, report=r)
            finally:
                run.read_base.close()
            q = quant[ft.name]
            rec = {"kind": "ggtool-sweep-cell", "identity": self._cell_identity(ft), "file": q["file"],
                   "tensor_bytes": q["tensor_bytes"], "n_elements": q["n_elements"],
                   "quantize_seconds": q["seconds"],
                   # its tasks' own seconds with an executor (they ran beside others'), else the run's
                   "eval_seconds": getattr(run, "task_seconds", None) or run.result["seconds"],
                   "kld": _kld_summary(run.result)}
            self._write_record(f"{ft.name}.json", rec)
            evals[ft.name] = rec
            yield SweepEvent("cell", ft.name, row=self._row(ft.name, rec))
        self.result = self._finish(base_rec, evals, time.perf_counter() - t0)

    def _flush(self) -> Iterator[SweepEvent]:
        while self._events:
            yield self._events.pop(0)

    def _model(self, path: str):
        from .chunks import Model

        return Model(path, self.opts.n_ctx, numerics=self.numerics)

    def _threads(self, model, run) -> None:
        if self.executor is not None:
            return
        from ..plan import estimate_work
        from ..threads import default_threads

        n = self.opts.threads or default_threads(estimate_work(run.first_graph()))
        if n > 1:
            from ..pool import get_pool
            model.use_threads(n, get_pool(n))

    # -- the base -------------------------------------------------------------------------------------
    def _base_path(self) -> str:
        return self.base_file or self._path(BASE)

    def _base_record(self) -> dict | None:
        if self.base_file:
            return {"kind": "ggtool-sweep-base", "given": self.base_file}
        return self._read_record("base.json", {"model": self._ident(self.base_model)}, "ggtool-sweep-base", BASE)

    def _make_base(self) -> Iterator[SweepEvent]:
        from .journal import side_files
        from .perplexity import Perplexity
        from .schedule import Schedule

        path = self._path(BASE)
        for p in (path, *side_files(path)):
            st = _lstat(p)
            if st is not None and (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                os.unlink(p)
        yield SweepEvent("start", "base", "base")
        m = self._model(self.base_model)
        o = self.opts
        run = Perplexity(m, tokens=self.tokens, n_chunks=self.n_chunk, schedule=Schedule(o.n_ctx, o.n_batch, o.n_ubatch),
                         write_base=path, top_k=o.top_k, executor=self.executor, text_file=o.text)
        self._threads(m, run)
        for r in run:
            yield SweepEvent("chunk", "base", report=r)
        rec = {"kind": "ggtool-sweep-base", "identity": {"model": self._ident(self.base_model)},
               "file": {"name": BASE, "size": os.path.getsize(path), "digest": head_digest(path)},
               "model_bytes": os.path.getsize(self.base_model), "ppl": run.result["ppl"],
               "ppl_unc": run.result["ppl_unc"], "seconds": getattr(run, "task_seconds", None) or run.result["seconds"]}
        self._write_record("base.json", rec)
        return rec

    # -- a type ---------------------------------------------------------------------------------------
    def _quantized(self, k: int, ft, handle) -> dict:
        """Quantize (or collect the task that did) and record it."""
        out = self._own_path(f"{ft.name}.gguf")
        if handle is not None:
            done = self.executor.get(handle)
            if done.data is not None:
                from ..tensor_io.outputs import atomic_path, named_write_errors

                with named_write_errors(out), atomic_path(out) as tmp, open(tmp, "wb") as f:
                    f.write(done.data)
        else:
            threads = self.opts.threads or os.cpu_count() or 1
            job = QuantizeJob(k, self.source, ft.name, out, self.imatrix, self.opts.allow_requantize,
                              threads=threads)
            done = quantize_task(job)
        digest = head_digest(out)
        if os.path.getsize(out) != done.size or digest != done.digest:
            raise SweepError("the quantized file is not the one the task wrote", kind="cell", path=out)
        rec = {"kind": "ggtool-sweep-quantized", "identity": self._cell_identity(ft),
               "file": {"name": f"{ft.name}.gguf", "size": done.size, "digest": digest},
               "tensor_bytes": done.tensor_bytes, "n_elements": done.n_elements, "seconds": done.seconds}
        self._write_record(f"{ft.name}.quant.json", rec)
        return rec

    def _kld_run(self, ft):
        from .basefile import BaseFile
        from .perplexity import Perplexity
        from .schedule import Schedule

        o = self.opts
        m = self._model(self._path(f"{ft.name}.gguf"))
        base = BaseFile(self._base_path())
        try:
            run = Perplexity(m, tokens=self.tokens, n_chunks=self.n_chunk,
                             schedule=Schedule(o.n_ctx, o.n_batch, o.n_ubatch), read_base=base,
                             executor=self.executor, text_file=o.text)
        except BaseException:
            base.close()
            raise
        self._threads(m, run)
        return run

    # -- the table ------------------------------------------------------------------------------------
    def _row(self, name: str, rec: dict) -> dict:
        k = rec["kld"]
        return {"type": name, "bytes": rec["file"]["size"],
                "bpw": 8.0 * rec["tensor_bytes"] / rec["n_elements"] if rec["n_elements"] else None,
                "ppl": k["ppl"], "ppl_unc": k["ppl_unc"], "kld": k["kld"], "kld_unc": k["kld_unc"],
                "same_top": k["same_top"], "quantize_seconds": rec["quantize_seconds"],
                "eval_seconds": rec["eval_seconds"], "pareto": False}

    def _finish(self, base_rec: dict, evals: dict, seconds: float) -> SweepResult:
        from ..tensor_io.outputs import write_text_atomic
        from .chart import Chart, pareto_front

        rows = [self._row(ft.name, evals[ft.name]) for ft in self.types]
        front = pareto_front([(r["bytes"], r["kld"]) for r in rows])
        for i in front:
            rows[i]["pareto"] = True
        base_row = None
        if not self.base_file:
            base_row = {"type": "base", "bytes": base_rec["model_bytes"], "bpw": None, "ppl": base_rec["ppl"],
                        "ppl_unc": base_rec["ppl_unc"], "kld": 0.0, "kld_unc": 0.0, "same_top": 1.0,
                        "quantize_seconds": None, "eval_seconds": base_rec["seconds"], "pareto": None}
        o = self.opts
        record = {"kind": "sweep", "model": o.model, "base": self.base_file or self.base_model, "text": o.text,
                  "n_ctx": o.n_ctx, "n_chunk": self.n_chunk, "numerics": self.numerics,
                  "imatrix": o.imatrix, "executor": getattr(self.executor, "name", "local"),
                  "base_row": base_row, "rows": rows, "seconds": seconds}
        outputs = {"json": self._own_path(RESULTS_JSON), "csv": self._own_path(RESULTS_CSV),
                   "png": self._own_path(CHART + ".png"), "svg": self._own_path(CHART + ".svg")}
        write_text_atomic(outputs["json"], [json.dumps(record, indent=1, allow_nan=False, default=_plain) + "\n"])
        write_text_atomic(outputs["csv"], [csv_text(([base_row] if base_row else []) + rows)])
        chart = Chart([(r["bytes"] / (1 << 20), r["kld"], r["type"]) for r in rows], front,
                      title=f"{os.path.basename(o.model)}: KL divergence against size",
                      x_label="file size (MiB)", y_label="mean KLD")
        from ..tensor_io.outputs import atomic_path, named_write_errors

        with named_write_errors(outputs["png"]), atomic_path(outputs["png"]) as tmp, open(tmp, "wb") as f:
            f.write(chart.png())
        write_text_atomic(outputs["svg"], [chart.svg()])
        return SweepResult(rows, base_row, outputs, seconds)


def _kld_summary(rec: dict) -> dict:
    return {"ppl": rec["ppl"]["q"], "ppl_unc": rec["ppl"]["q_unc"], "ppl_base": rec["ppl"]["base"],
            "kld": rec["kld"]["mean"], "kld_unc": rec["kld"]["mean_unc"], "same_top": rec["same_top"]["p"],
            "scored": rec["scored"]}


def _plain(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    raise TypeError(f"{type(o).__name__} is not JSON")


def csv_text(rows: list[dict]) -> str:
    """The rows as CSV (RFC 4180; numbers as Python writes them, empty for none)."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow(["" if r.get(c) is None else (repr(float(r[c])) if isinstance(r[c], float) else r[c])
                    for c in COLUMNS])
    return buf.getvalue()


def finite(x) -> bool:
    return x is not None and math.isfinite(x)
