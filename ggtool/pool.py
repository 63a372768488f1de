"""The worker pool: GGML's compute threads as processes over shared memory (spec section 9).

Python threads cannot run the numpy kernels of one node in parallel, so `WorkerPool` starts N-1
worker processes once and reuses them for every graph; the calling process takes part as worker 0,
as GGML's main thread does. For each graph:

- Every context whose pool the graph touches is moved into a POSIX shared-memory segment
  (`Context.rebind`; the plan's work buffer lives in the graph context's pool, so it moves too).
  Memory-mapped GGUF tensors (`FileStorage`) are mapped by each worker from the file. Workers see every
  tensor as a zero-copy numpy view of the same bytes.
- The graph goes to each worker once, as a compact picklable description (per tensor: type, ne, nb,
  op, op_params, sources, data offset, buffer); workers rebuild light Tensor objects on the shared
  buffers and cache them, so computing the same graph again only sends "run graph #k".
- Per node, every participant calls the kernel with its (ith, nth) and a barrier separates nodes.
  Nodes whose n_tasks is 1 run on worker 0 alone, and a run of them needs no barrier inside it.
  The barrier is a spin/yield/sleep barrier on per-participant counters in a small shared segment;
  while waiting, the caller checks that its workers are alive. Each worker has a watchdog thread
  that exits the process as soon as the caller is gone (EOF on a pipe only the caller holds).
- A kernel error stops every participant at its next barrier; the caller raises the ComputeError of
  the failing node (the same message as a single-process run) and the pool stays usable. A dead worker
  gives a ComputeError as soon as the caller reaches a barrier (milliseconds when it is waiting), the
  other workers are killed and the pool is rebuilt on its next use. KeyboardInterrupt (or any other exception in the caller) kills the workers, unlinks the
  segments and propagates.

Workers are started with an explicit "spawn" (a fresh interpreter via subprocess: nothing inherited
from the caller's state, no re-import of the caller's `__main__` as multiprocessing's spawn does,
and the environment is ours to set: BLAS and OpenMP on one thread before numpy loads). The caller's
own BLAS is limited to one thread for the duration of each pooled compute (`ggtool.blas.limit`).
"""

from __future__ import annotations

import atexit
import operator
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as _wait_ready

import numpy as np

from . import blas, shm
from .compute import Work, run_node, work_view
from .errors import ComputeError, GGToolError
from .tensor import Tensor

MAX_PARTICIPANTS = 256
_LINE = 8                                   # int64 slots per 64-byte cache line
_ABORT = 0                                  # slot: non-zero once a participant stopped the graph
# participant i owns line 1+i: [arrival counter, index of the node it is computing (-1: none yet)]
_CTL_SIZE = (1 + MAX_PARTICIPANTS) * 64

_SPIN = 50             # barrier: busy polls before yielding the CPU (short: with more participants than
                       # free cores, spinning only delays the participant we wait for)
_YIELD_FOR = 0.002     # seconds of sched_yield polling before sleeping
_MAX_SLEEP = 0.001     # longest sleep between polls
_CHECK_EVERY = 0.005   # seconds between liveness checks while waiting
_START_TIMEOUT = 120.0
_GRAPH_CACHE = 64      # graphs remembered per pool (and per worker)

_BARRIER = (-1, 0)
# set in the workers' environment: a pool made there (by a module a worker imports) stays in-process
_IN_WORKER = bool(os.environ.get("GGTOOL_POOL_WORKER"))
_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _slot(ith: int) -> int:
    return (1 + ith) * _LINE


def default_threads() -> int:
    """GGTOOL_THREADS if set, else the cores this process may run on."""
    v = os.environ.get("GGTOOL_THREADS", "").strip()
    if v:
        try:
            n = int(v)
        except ValueError:
            n = 0
        if n < 1:
            raise GGToolError(f"GGTOOL_THREADS must be a positive integer, got {v!r}")
        return n
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


# -- the barrier and the per-participant loop (the same code in the caller and the workers) ------
class _Aborted(BaseException):
    """Another participant stopped the graph (BaseException: kernels' `except Exception` let it pass)."""


class _Barrier:
    """Reusable barrier without atomics: participant i only ever writes its own, increasing arrival
    counter; the barrier of generation g is passed once every participant's counter reaches g.
    (Aligned 8-byte stores are atomic and stores are seen in order on x86-64 / TSO.)"""

    __slots__ = ("check", "gen", "mine", "mv", "others")

    def __init__(self, mv: memoryview, ith: int, nth: int, gen: int, check):
        self.mv, self.gen, self.check = mv, gen, check
        self.mine = _slot(ith)
        self.others = [_slot(j) for j in range(nth) if j != ith]

    def __call__(self) -> None:
        g = self.gen = self.gen + 1
        mv = self.mv
        mv[self.mine] = g
        for s in self.others:
            if mv[s] < g:
                self._wait(s, g)

    def _wait(self, s: int, g: int) -> None:
        mv = self.mv
        for _ in range(_SPIN):
            if mv[s] >= g:
                return
        start = time.monotonic()
        next_check = start + _CHECK_EVERY
        pause = 0.0
        while mv[s] < g:
            if mv[_ABORT]:
                raise _Aborted
            now = time.monotonic()
            if now >= next_check:
                self.check()
                next_check = now + _CHECK_EVERY
            if now - start < _YIELD_FOR:
                os.sched_yield()
            else:
                pause = min(_MAX_SLEEP, pause * 2 or 2e-5)
                time.sleep(pause)


def _participate(nodes, prog, ith: int, work: Work, mv: memoryview):
    """Run this participant's program; returns None, or (node index, message) if a kernel failed."""
    i = -1
    at = _slot(ith) + 1
    try:
        for i, n in prog:
            if i < 0:
                work.barrier()
            else:
                mv[at] = i
                run_node(i, nodes[i], ith if n > 1 else 0, n, work)
    except ComputeError as e:
        mv[_ABORT] = 1
        return i, str(e)
    return None


def _programs(plan, nth: int):
    """Per-participant programs: (node index, nth for the call) or _BARRIER.

    Nodes with n_tasks > 1 run on every participant with (ith, nth); runs of single-task nodes run
    on participant 0 with (0, 1). A barrier separates consecutive segments and follows a final
    multi-task node; no-op nodes (views, NONE, empty tensors) are left out.
    """
    from .ops import kernel_for

    segs: list = []
    for i, p in enumerate(plan.nodes):
        node = p.node
        if node.op == "NONE" or node.is_empty() or kernel_for(node).forward is None:
            continue
        if p.n_tasks > 1:
            segs.append(i)
        elif segs and isinstance(segs[-1], list):
            segs[-1].append(i)
        else:
            segs.append([i])
    prog0, progw = [], []
    for k, seg in enumerate(segs):
        if k:
            prog0.append(_BARRIER)
            progw.append(_BARRIER)
        if isinstance(seg, list):
            prog0.extend((i, 1) for i in seg)
        else:
            prog0.append((seg, nth))
            progw.append((seg, nth))
    if segs and not isinstance(segs[-1], list):
        prog0.append(_BARRIER)
        progw.append(_BARRIER)
    return tuple(prog0), tuple(progw)


# -- shared segments for contexts (process-wide) -------------------------------------------------
_SEGMENTS: dict[int, tuple] = {}   # id(ctx) -> (weakref to ctx, Segment)
_SEG_LOCK = threading.RLock()


def _ctx_gone(key: int, seg: shm.Segment, ref) -> None:
    seg.unlink()
    ent = _SEGMENTS.get(key)
    if ent is not None and ent[0] is ref:
        _SEGMENTS.pop(key, None)


def share_context(ctx) -> shm.Segment:
    """The shared segment holding `ctx`'s pool, moving the pool there first if needed.

    The segment lives as long as the context keeps that buffer; it is unlinked when the context is
    garbage-collected, when its pool grows out of it, when a pool that used it is closed, and at exit.
    """
    with _SEG_LOCK:
        shm.flush()
        key = id(ctx)
        ent = _SEGMENTS.get(key)
        if ent is not None:
            ref, seg = ent
            if ref() is ctx and seg.linked and ctx.buffer is seg.array:
                return seg
            _SEGMENTS.pop(key, None)
            if ref() is ctx:
                seg.unlink()   # the pool grew into a private buffer: this copy is stale
        need = ctx.used_mem
        try:
            st = os.statvfs("/dev/shm")
            free = st.f_bavail * st.f_frsize
        except OSError:  # pragma: no cover
            free = None
        if free is not None and need > free:
            raise GGToolError(
                f"not enough shared memory for the worker pool: the context needs {need} bytes, "
                f"/dev/shm has {free} free (enlarge /dev/shm or use --threads 1)")
        with shm.signals_held():  # the copy and the registry entry go together, Ctrl-C or not
            seg = shm.Segment(max(len(ctx.buffer), need, 1))
            try:
                ctx.rebind(seg.array)
            except BaseException:
                seg.unlink()
                raise
            ref = weakref.ref(ctx, lambda r, k=key, s=seg: _ctx_gone(k, s, r))
            _SEGMENTS[key] = (ref, seg)
        return seg


def _live_segments() -> set[str]:
    return {seg.name for _, seg in list(_SEGMENTS.values()) if seg.linked}


def _release_segments(names) -> None:
    with _SEG_LOCK:
        for key, (ref, seg) in list(_SEGMENTS.items()):
            if seg.name in names:
                seg.unlink()
                _SEGMENTS.pop(key, None)


@atexit.register
def _release_all_segments() -> None:
    _release_segments({seg.name for _, seg in list(_SEGMENTS.values())})
    shm.flush()


# -- the graph as the workers see it --------------------------------------------------------------
class _Entry:
    __slots__ = ("blob", "key", "prog0", "segs")

    def __init__(self, key, blob, segs, prog0):
        self.key, self.blob, self.segs, self.prog0 = key, blob, segs, prog0


_FIELDS = operator.attrgetter("type", "ne", "nb", "op", "flags", "_name", "struct_offset", "data_offset",
                              "view_offs")


def _describe(graph, plan):
    """Every tensor the graph's nodes reach, as plain tuples (nodes first, then their sources):
    (fields, op_params bytes, buffer, view_src index, src indices); buffer is the name of the
    shared segment holding the tensor's context pool, or its FileStorage. Also the kernels by op
    and the work buffer (segment, offset, size). Everything the workers' copy is built from."""
    nodes = graph.nodes
    order = list(nodes)
    index = {id(t): i for i, t in enumerate(order)}
    k = 0
    while k < len(order):  # sources and view sources, breadth-first after the nodes
        t = order[k]
        k += 1
        for s in (*t.src, t.view_src):
            if s is not None and id(s) not in index:
                index[id(s)] = len(order)
                order.append(s)
    bufs: dict[int, str] = {}
    records = []
    append = records.append
    for t in order:
        buf = t.storage
        if buf is None:
            buf = bufs.get(id(t.ctx))
            if buf is None:
                buf = bufs[id(t.ctx)] = share_context(t.ctx).name
        vs = t.view_src
        append((_FIELDS(t), t.op_params.tobytes(), buf, -1 if vs is None else index[id(vs)],
                tuple([-1 if s is None else index[id(s)] for s in t.src])))
    from .ops import kernel_for

    kernels = {}
    for t in nodes:
        if t.op != "NONE" and t.op_desc not in kernels:
            kernels[t.op_desc] = kernel_for(t).forward
    kernels = {op: fn for op, fn in kernels.items() if fn is not None}
    work_seg = bufs.get(id(graph.ctx)) or share_context(graph.ctx).name
    return tuple(records), kernels, (work_seg, plan.work_offset, plan.work_size)


def _pack(records, n_nodes: int, kernels: dict, work, progw) -> bytes:
    """Pickle a graph description. Kernels go by reference (module and name); a kernel that pickle
    cannot name (a closure made by a factory, a lambda) goes as (module, qualname): the worker imports
    the module and takes the kernel its registry then holds for the op, if it is the same function."""
    shipped = {}
    for op, fn in kernels.items():
        module = getattr(fn, "__module__", None)
        if module == "__main__":
            raise GGToolError(f"the kernel of op {op} ({getattr(fn, '__qualname__', fn)}) cannot be sent to the "
                              "worker processes: it is defined in the __main__ script, which they do not import; "
                              "define it in an importable module")
        try:
            pickle.dumps(fn)
            shipped[op] = fn
        except Exception:
            shipped[op] = (module, getattr(fn, "__qualname__", repr(fn)))
    try:
        return pickle.dumps((records, n_nodes, shipped, work, progw), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise GGToolError(f"the graph cannot be sent to the worker processes: {e}") from None


def _resolve_kernels(shipped: dict) -> dict:
    """Worker side: op -> forward, from the shipped functions or this process's registry."""
    import importlib

    from .ops.base import KERNELS

    out = {}
    for op, fn in shipped.items():
        if isinstance(fn, tuple):
            module, qualname = fn
            if module:
                importlib.import_module(module)
            k = KERNELS.get(op)
            got = None if k is None or k.forward is None else k.forward
            if got is None or (got.__module__, got.__qualname__) != (module, qualname):
                raise GGToolError(f"the kernel of op {op} ({module}.{qualname}) is not registered in the worker "
                                  "processes: register it when its module is imported")
            fn = got
        out[op] = fn
    return out


class _Ctx:
    """Worker-side stand-in for a Context: tensors only need its `.buffer`."""

    __slots__ = ("buffer",)

    def __init__(self, buffer):
        self.buffer = buffer


class _WorkerGraph:
    __slots__ = ("kernels", "nodes", "prog", "segs", "wdata")


def _install(blob: bytes, segs: dict) -> _WorkerGraph:
    records, n_nodes, kernels, (wseg, woff, wsize), progw = pickle.loads(blob)
    ctxs: dict[str, _Ctx] = {}
    nostore = _Ctx(None)
    tensors = []
    for (type_, ne, nb, op, flags, name, soffs, doffs, voffs), params, buf, _vs, _src in records:
        if isinstance(buf, str):
            ctx = ctxs.get(buf)
            if ctx is None:
                ctx = ctxs[buf] = _Ctx(segs[buf])
            storage = None
        else:
            ctx, storage = nostore, buf
        t = Tensor(ctx, type_, ne, nb, soffs, doffs, storage)
        t.op = op
        t.op_params = np.frombuffer(params, dtype=np.int32).copy()
        t.flags, t._name, t.view_offs = flags, name, voffs
        tensors.append(t)
    for t, (_, _, _, vs, src) in zip(tensors, records):
        t.view_src = None if vs < 0 else tensors[vs]
        t.src = [None if s < 0 else tensors[s] for s in src]
    wg = _WorkerGraph()
    wg.nodes = tensors[:n_nodes]
    wg.prog = progw
    wg.wdata = segs[wseg][woff: woff + wsize] if woff is not None else segs[wseg][:0]
    wg.kernels = _resolve_kernels(kernels)
    wg.segs = set(ctxs) | {wseg}
    return wg


# -- the caller's side ---------------------------------------------------------------------------
def _process_start_time() -> float | None:
    """When this process started (seconds since the epoch, Linux), or None."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _changed_sources() -> list[str]:
    """Files of ggtool's loaded modules modified since this process started: workers started now
    would import them as they are now, and compute with other kernels than the caller."""
    t0 = _process_start_time()
    if t0 is None:
        return []
    out = []
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if (name == "ggtool" or name.startswith("ggtool.")) and path:
            try:
                if os.stat(path).st_mtime > t0 + 1.0:  # btime has a 1 s resolution
                    out.append(path)
            except OSError:
                pass
    return sorted(out)


@contextmanager
def _single_threaded():
    """The caller is one participant of N: one BLAS thread, one ggtool.quant thread, meanwhile."""
    quant = sys.modules.get("ggtool.quant")
    saved = getattr(quant, "_threads", None)
    with blas.limit(1):
        if quant is not None:
            quant.set_threads(1)
        try:
            yield
        finally:
            if quant is not None:
                quant.set_threads(saved)


class _WorkerDied(BaseException):  # BaseException: raised from barriers inside kernels
    def __init__(self, ith: int, w):
        self.ith, self.w = ith, w


class _Worker:
    __slots__ = ("conn", "graphs", "life", "proc", "ready", "segs")

    def __init__(self, proc, conn, life: int):
        self.proc, self.conn, self.life, self.ready = proc, conn, life, False
        self.segs: dict[str, int] = {}
        self.graphs: set[int] = set()

    @property
    def pid(self) -> int:
        return self.proc.pid


def _death(w: _Worker) -> str:
    try:
        rc = w.proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        return "stopped responding"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with code {rc}"


class _State:
    """What must be cleaned up, held apart from the pool so a finalizer can do it."""

    def __init__(self):
        self.workers: list[_Worker] = []
        self.ctl: shm.Segment | None = None
        self.used: set[str] = set()
        self.pid = os.getpid()

    def teardown(self, graceful: bool = False) -> None:
        if os.getpid() != self.pid:
            return  # a forked copy of the caller: the workers and segments are the parent's
        workers, self.workers = self.workers, []
        if graceful:
            for w in workers:
                try:
                    w.conn.send(("exit",))
                except Exception:
                    pass
            deadline = time.monotonic() + 2.0
            for w in workers:
                try:
                    w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for w in workers:
            if w.proc.poll() is None:
                try:
                    w.proc.kill()
                except OSError:
                    pass
        for w in workers:
            try:
                w.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
            try:
                w.conn.close()
                os.close(w.life)
            except Exception:
                pass
        if self.ctl is not None:
            self.ctl.unlink()
            self.ctl = None
        used, self.used = self.used, set()
        _release_segments(used)  # the tracker hears of it at the next flush (this may run in a GC)


class WorkerPool:
    """N participants for GGML-style compute: the caller plus N-1 worker processes.

        with WorkerPool(4) as pool:
            graph.compute(4, pool=pool)        # or ggtool.compute.compute(graph, 4, pool=pool)
            squares = pool.map(math.sqrt, range(100))

    A plan of more threads than the pool has starts more workers; a plan of 1 runs in-process.
    Workers start in the background when the pool is created; the first compute waits for them.
    """

    def __init__(self, n_threads: int | None = None):
        n = default_threads() if n_threads is None else int(n_threads)
        if not 1 <= n <= MAX_PARTICIPANTS:
            raise GGToolError(f"a worker pool has 1 to {MAX_PARTICIPANTS} participants, not {n}")
        if _IN_WORKER:
            n = 1
        self.n_threads = n
        self._state = _State()
        self._finalizer = weakref.finalize(self, self._state.teardown, True)
        self._lock = threading.Lock()
        self._owner = None
        self._closed = False
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._keys: dict[int, _Entry] = {}
        self._next_key = 0
        self.stats = {"graphs_sent": 0, "runs": 0, "restarts": 0}
        self._start(n)

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (participants 1..N-1)."""
        return [w.pid for w in self._state.workers]

    def close(self) -> None:
        """Stop the workers and unlink every segment the pool used (idempotent)."""
        self._closed = True
        self._entries.clear()
        self._keys.clear()
        self._finalizer()
        shm.flush()

    def _start(self, n: int) -> None:
        st = self._state
        if len(st.workers) >= n - 1:
            return
        changed = _changed_sources()
        if changed:
            raise GGToolError(f"{changed[0]} changed after this process started: new worker processes would run "
                              "other code than this one; restart the program")
        if st.ctl is None:
            st.ctl = shm.Segment(_CTL_SIZE)
        while len(st.workers) < n - 1:
            st.workers.append(self._spawn())

    def _spawn(self) -> _Worker:
        """Start one worker: a fresh interpreter with our sys.path and single-threaded BLAS.

        It gets a socket for messages and the read end of a pipe whose write end only this process
        holds: when we die, however we die, the worker's watchdog thread reads EOF and exits, even
        in the middle of a kernel.
        """
        parent, child = socket.socketpair()
        life_r, life_w = os.pipe()
        path = list(sys.path)
        if _PKG_ROOT not in path:
            path.append(_PKG_ROOT)
        code = f"import sys; sys.path[:] = {path!r}; from ggtool.pool import _worker_main; _worker_main()"
        cmd = [sys.executable, *subprocess._args_from_interpreter_flags(), "-c", code,
               str(child.fileno()), str(life_r)]
        try:
            env = blas.single_thread_env()
            env["GGTOOL_QUANT_THREADS"] = "1"   # ggtool.quant's own thread pool: one thread per process
            env["GGTOOL_POOL_WORKER"] = "1"
            proc = subprocess.Popen(cmd, pass_fds=(child.fileno(), life_r), env=env,
                                    stdin=subprocess.DEVNULL, stdout=2, close_fds=True)
        except BaseException:
            parent.close()
            os.close(life_w)
            raise
        finally:
            child.close()
            os.close(life_r)
        conn = Connection(parent.detach())
        w = _Worker(proc, conn, life_w)
        ctl = self._state.ctl
        conn.send(("init", ctl.name, ctl.size))
        return w

    def _wait_ready(self, workers) -> None:
        pending = {w.conn: w for w in workers if not w.ready}
        deadline = time.monotonic() + _START_TIMEOUT
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GGToolError(f"worker processes did not start within {_START_TIMEOUT:.0f} s")
            for c in _wait_ready(list(pending), timeout=min(left, 1.0)):
                w = pending.pop(c)
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    raise GGToolError(f"a worker process (pid {w.pid}) failed to start ({_death(w)})") from None
                if msg[0] != "ready":
                    raise GGToolError(f"a worker process (pid {w.pid}) failed to start: {msg[1]}")
                w.ready = True

    def _ensure(self, n: int) -> list[_Worker]:
        """At least n participants, started and ready; returns workers 1..n-1."""
        if self._closed:
            raise GGToolError("the worker pool is closed")
        if os.getpid() != self._state.pid:
            raise GGToolError("this worker pool belongs to the parent process (os.fork): make a new one")
        if n > MAX_PARTICIPANTS:
            raise GGToolError(f"a worker pool has at most {MAX_PARTICIPANTS} participants, not {n}")
        self.n_threads = max(self.n_threads, n)
        if any(w.proc.poll() is not None for w in self._state.workers):
            self._broken()  # a worker died while idle: start afresh
        try:
            self._start(self.n_threads)
            workers = self._state.workers[: n - 1]
            self._wait_ready(workers)
        except BaseException:
            self._broken()
            raise
        return workers

    def _broken(self) -> None:
        """Kill every worker and unlink the segments; the next use starts afresh."""
        self._state.teardown()
        self._entries.clear()
        self._keys.clear()
        self.stats["restarts"] += 1

    def _enter(self):
        if self._owner == threading.get_ident():
            raise GGToolError("the worker pool is already busy in this thread (a kernel cannot use the pool)")
        self._lock.acquire()
        self._owner = threading.get_ident()

    def _leave(self):
        self._owner = None
        self._lock.release()

    # -- compute -------------------------------------------------------------------------
    def run(self, graph, plan) -> None:
        """Compute `graph` with `plan` (work buffer already allocated, see compute.prepare)."""
        nth = plan.n_threads
        if nth <= 1 or _IN_WORKER:
            work = Work(work_view(graph, plan))
            for i, node in enumerate(graph.nodes):
                run_node(i, node, 0, 1, work)
            return
        self._enter()
        try:
            workers = self._ensure(nth)
            with _single_threaded():
                self._run(graph, plan, nth, workers)
        finally:
            self._leave()

    def _entry(self, graph, plan, nth: int) -> _Entry:
        """The graph as the workers know it, from the cache when nothing changed since it was sent."""
        records, kernels, work = _describe(graph, plan)
        n_tasks = tuple([p.n_tasks for p in plan.nodes])
        fingerprint = (nth, work, n_tasks, records, tuple(kernels.items()))
        entry = self._entries.get(fingerprint)
        if entry is not None:
            self._entries.move_to_end(fingerprint)
            return entry
        key = self._next_key
        self._next_key += 1
        prog0, progw = _programs(plan, nth)
        segs = {r[2] for r in records if isinstance(r[2], str)} | {work[0]}
        entry = _Entry(key, _pack(records, graph.n_nodes, kernels, work, progw), segs, prog0)
        self._entries[fingerprint] = entry
        self._keys[key] = entry
        while len(self._entries) > _GRAPH_CACHE:
            _, old = self._entries.popitem(last=False)
            self._keys.pop(old.key, None)
        return entry

    def _run(self, graph, plan, nth: int, workers: list[_Worker]) -> None:
        if len(plan.nodes) != graph.n_nodes:
            raise GGToolError(f"the plan was made for {len(plan.nodes)} nodes but the graph has "
                              f"{graph.n_nodes}: plan it again")
        st = self._state
        entry = self._entry(graph, plan, nth)   # shares the contexts' pools (may move them)
        st.used |= entry.segs
        live = _live_segments()
        for fp, e in list(self._entries.items()):  # forget graphs whose segments are gone
            if not e.segs <= live:
                del self._entries[fp]
                self._keys.pop(e.key, None)
        mv = memoryview(st.ctl.array).cast("q")
        g0 = max(mv[_slot(i)] for i in range(len(st.workers) + 1))
        mv[_ABORT] = 0
        for i in range(nth):
            mv[_slot(i) + 1] = -1
        try:
            for ith, w in enumerate(workers, 1):
                drop_graphs = [k for k in w.graphs if k not in self._keys]
                w.graphs.difference_update(drop_graphs)
                drop_segs = [n for n in w.segs if n not in live]
                for n in drop_segs:
                    del w.segs[n]
                attach = [(n, _seg_size(n)) for n in entry.segs if n not in w.segs]
                blob = None
                if entry.key not in w.graphs:
                    blob = entry.blob
                    self.stats["graphs_sent"] += 1
                try:
                    w.conn.send(("run", entry.key, ith, nth, g0, blob, attach, drop_segs, drop_graphs))
                except OSError:
                    raise _WorkerDied(ith, w) from None
                w.graphs.add(entry.key)
                w.segs.update(attach)
            self.stats["runs"] += 1

            def check():
                for i, w in enumerate(workers, 1):
                    if w.proc.poll() is not None:
                        raise _WorkerDied(i, w)

            work = Work(work_view(graph, plan), _Barrier(mv, 0, nth, g0, check))
            failures = []
            try:
                failed = _participate(graph.nodes, entry.prog0, 0, work, mv)
                if failed:
                    failures.append(failed)
            except _Aborted:
                pass
            for ith, reply in self._replies(workers):
                if reply[0] == "failed":
                    failures.append((reply[1], reply[2]))
                elif reply[0] == "error":
                    w = workers[ith - 1]
                    w.graphs.clear()
                    w.segs.clear()
                    failures.append((-1, f"worker {ith} (pid {w.pid}) could not run the graph: {reply[1]}"))
        except _WorkerDied as d:
            how = _death(d.w)
            self._broken()
            i = mv[_slot(d.ith) + 1]
            at = "before starting the graph"
            if i >= 0:
                node = graph.nodes[i]
                at = f"while computing node {i} '{node.name}' ({node.op_desc})"
            raise ComputeError(f"worker {d.ith} (pid {d.w.pid}) died ({how}) {at}") from None
        except BaseException:
            # KeyboardInterrupt, or a failure of the pool itself: nothing may be left behind
            mv[_ABORT] = 1
            self._broken()
            raise
        if failures:
            raise ComputeError(min(failures)[1])
        if mv[_ABORT]:  # pragma: no cover (a participant stopped without saying why)
            raise ComputeError("the compute was aborted by a worker")

    def _replies(self, workers: list[_Worker]):
        """One reply per worker, in any order; a closed connection or a dead process raises."""
        pending = {w.conn: (i, w) for i, w in enumerate(workers, 1)}
        while pending:
            ready = _wait_ready(list(pending), timeout=_CHECK_EVERY)
            for c in ready:
                i, w = pending.pop(c)
                try:
                    reply = c.recv()
                except (EOFError, OSError):
                    raise _WorkerDied(i, w) from None
                yield i, reply
            if not ready:
                for i, w in pending.values():
                    if w.proc.poll() is not None:
                        raise _WorkerDied(i, w)

    # -- map -----------------------------------------------------------------------------
    def map(self, fn, items, n_threads: int | None = None) -> list:
        """[fn(x) for x in items], split in contiguous blocks over the participants.

        `fn` must be picklable (a module-level function); items and results travel pickled.
        The first exception, in item order, is re-raised in the caller.
        """
        items = list(items)
        n = min(self.n_threads if n_threads is None else int(n_threads), len(items))
        if n <= 1 or _IN_WORKER or self._owner == threading.get_ident():
            return [fn(x) for x in items]
        self._enter()
        try:
            workers = self._ensure(n)
            bounds = [len(items) * k // n for k in range(n + 1)]
            try:
                for k, w in enumerate(workers, 1):
                    try:
                        w.conn.send(("map", fn, items[bounds[k]: bounds[k + 1]]))
                    except OSError:
                        raise _WorkerDied(k, w) from None
                results: list = [None] * n
                errors = []
                with _single_threaded():
                    try:
                        results[0] = [fn(x) for x in items[: bounds[1]]]
                    except Exception as e:
                        errors.append((0, e))
                for k, reply in self._replies(workers):
                    if reply[0] == "ok":
                        results[k] = reply[1]
                    elif reply[0] == "exc":
                        errors.append((k, reply[1]))
                    else:
                        w = workers[k - 1]
                        w.graphs.clear()
                        w.segs.clear()
                        errors.append((k, GGToolError(f"worker {k} (pid {w.pid}): {reply[1]}")))
            except _WorkerDied as d:
                how = _death(d.w)
                self._broken()
                raise GGToolError(f"worker {d.ith} (pid {d.w.pid}) died ({how}) during pool.map") from None
            except BaseException:
                self._broken()
                raise
            if errors:
                raise min(errors, key=lambda e: e[0])[1]
            return [r for block in results for r in block]
        finally:
            self._leave()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._state.workers)} workers"
        return f"<WorkerPool {self.n_threads} participants, {state}>"


def _seg_size(name: str) -> int:
    for _, seg in list(_SEGMENTS.values()):
        if seg.name == name:
            return seg.size
    raise GGToolError(f"shared segment {name} is gone")  # pragma: no cover


# -- the process-wide pool -----------------------------------------------------------------------
_DEFAULT: WorkerPool | None = None
_DEFAULT_LOCK = threading.Lock()


def get_pool(n_threads: int | None = None) -> WorkerPool:
    """The process's shared pool (created on first use, grown on demand, closed at exit)."""
    global _DEFAULT
    n = default_threads() if n_threads is None else int(n_threads)
    with _DEFAULT_LOCK:
        if _DEFAULT is None or _DEFAULT.closed or _DEFAULT._state.pid != os.getpid():
            _DEFAULT = WorkerPool(n)
        elif n > _DEFAULT.n_threads:
            _DEFAULT.n_threads = n
            _DEFAULT._start(n)
        return _DEFAULT


def close_pool() -> None:
    """Close the process-wide pool, if any (it is also closed at exit)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is not None:
            _DEFAULT.close()
            _DEFAULT = None


# -- the worker's side ---------------------------------------------------------------------------
def _nothing() -> None:
    """A worker's liveness check while waiting: nothing to do, its watchdog thread watches the caller."""


def _worker_main() -> None:
    """Entry point of a worker process: `python -c ... <fd of its socket to the caller>`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the caller's to handle
    conn = Connection(int(sys.argv[-2]))
    life = int(sys.argv[-1])

    def watchdog():  # EOF: the caller is gone (or has let us go); nothing left to compute for
        try:
            os.read(life, 1)
        finally:
            os._exit(3)

    threading.Thread(target=watchdog, name="ggtool-pool-watchdog", daemon=True).start()
    try:
        _, ctl_name, ctl_size = conn.recv()
    except (EOFError, OSError):
        os._exit(0)
    try:
        mv = memoryview(shm.attach(ctl_name, ctl_size)).cast("q")
        conn.send(("ready", os.getpid()))
    except BaseException as e:
        try:
            conn.send(("error", f"{type(e).__name__}: {e}"))
        finally:
            os._exit(1)

    segs: dict[str, np.ndarray] = {}
    graphs: dict[int, _WorkerGraph] = {}
    from .ops.base import KERNELS, Kernel

    def run(msg):
        _, key, ith, nth, g0, blob, attach, drop_segs, drop_graphs = msg
        for k in drop_graphs:
            graphs.pop(k, None)
        for n in drop_segs:
            segs.pop(n, None)
            for k in [k for k, g in graphs.items() if n in g.segs]:
                del graphs[k]
        for n, size in attach:
            segs[n] = shm.attach(n, size)
        if blob is not None:
            graphs[key] = _install(blob, segs)
        wg = graphs[key]
        for op, fn in wg.kernels.items():
            k = KERNELS.get(op)
            if k is None or k.forward is not fn:
                KERNELS[op] = Kernel(op, fn)
        work = Work(wg.wdata, _Barrier(mv, ith, nth, g0, _nothing))
        try:
            failed = _participate(wg.nodes, wg.prog, ith, work, mv)
        except _Aborted:
            return ("aborted",)
        return ("ok",) if failed is None else ("failed", *failed)

    def run_map(msg):
        _, fn, items = msg
        try:
            return ("ok", [fn(x) for x in items])
        except Exception as e:
            try:
                pickle.dumps(e)
            except Exception:
                e = GGToolError(f"{type(e).__name__}: {e}")
            return ("exc", e)

    def failure(e: BaseException):
        mv[_ABORT] = 1   # whoever waits for us at a barrier stops
        segs.clear()     # and the caller forgets what it sent us, as we do
        graphs.clear()
        return ("error", str(e) if isinstance(e, GGToolError) else f"{type(e).__name__}: {e}")

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        except BaseException as e:  # a message that cannot be unpickled here (a kernel's module, say)
            reply = failure(e)
        else:
            if msg[0] == "exit":
                break
            try:
                reply = run(msg) if msg[0] == "run" else run_map(msg)
            except BaseException as e:
                reply = failure(e)
        try:
            conn.send(reply)
        except (OSError, ValueError):
            break
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)
