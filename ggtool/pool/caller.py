"""WorkerPool: N participants for GGML-style compute, the caller plus N-1 worker processes.

For each graph the caller shares the contexts' pools (`segments`), sends the graph's description
to each worker once (`wire`), tells every worker to run it, and takes part itself as participant 0
(`barrier`). A kernel error stops every participant at its next barrier; the caller raises the
ComputeError of the failing node (the same message as a single-process run) and the pool stays
usable. A dead worker gives a ComputeError as soon as the caller reaches a barrier (milliseconds when
it is waiting), the other workers are killed and the pool is rebuilt on its next use.
KeyboardInterrupt (or any other exception in the caller) kills the workers, unlinks the segments and
propagates.
"""

from __future__ import annotations

import functools
import os
import platform
import threading
import time
import weakref
from collections import OrderedDict
from multiprocessing.connection import wait as _wait

import numpy as np

from .. import role, runner
from ..compute import Work, freeze, run_in_process, single_threaded, work_view
from ..errors import ComputeError, GGToolError
from ..interrupts import received, signals_held
from ..threads import default_threads
from . import shm, wire
from .barrier import CHECK_EVERY, Aborted, Barrier, linger_ns, participate, programs, spin_ns
from .placement import placement, wake_on
from .procs import State, Worker, WorkerDied, changed_sources, death, spawn, wait_ready
from .segments import live_segments, segment_size
from .wire import (
    ABORT,
    CHUNK,
    CTL_SIZE,
    H_GENERATION,
    H_KEY,
    H_LINGER,
    H_NTH,
    H_SPIN,
    MAX_PARTICIPANTS,
    N_BARRIER,
    ON_SOCKET,
    SLEEPERS,
    STANDBY,
    Error,
    Failed,
    Map,
    Preload,
    Raised,
    Results,
    Run,
    answered,
    arrivals,
    at_node,
    decode,
    outcome,
    standby,
)

_GRAPH_CACHE = 64      # graphs remembered per pool (and per worker)
_POLL, _POLL_MAX = 0.0001, 0.001   # seconds between looks at a handed compute's answer, once the spin is over
HANDING = platform.machine().lower() in ("x86_64", "amd64")     # see WorkerPool._hand
# a worker's standby word and a handed compute's fields, in its line (kernels.runner.hand's `fields`)
_HANDED_FIELDS = np.array([STANDBY, H_KEY, H_NTH, H_GENERATION, H_SPIN, H_LINGER], np.int64)


class _Entry:
    """A graph as sent to the workers: its key, pickled description, segments and participant 0's
    program: the compiled runner's (`program`, bound in this process on first use: `bound`), or the
    Python path's (`prog0`)."""

    __slots__ = ("blob", "bound", "key", "prog0", "program", "segs")

    def __init__(self, key, blob, segs, prog0, program=None):
        self.key, self.blob, self.segs, self.prog0, self.program = key, blob, segs, prog0, program
        self.bound = None


class Fingerprint:
    """A graph's description as the key of the pool's caches, hashed once: the description holds a
    record of every node, and a tuple's hash is not kept, so each lookup (and each step of iterating
    the ordered cache) would hash it all again, ~0.1 ms a graph at every compute."""

    __slots__ = ("_hash", "value")

    def __init__(self, value: tuple):
        self.value, self._hash = value, hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, Fingerprint) and self._hash == other._hash
                                 and self.value == other.value)


class WorkerPool:
    """N participants for GGML-style compute: the caller plus N-1 worker processes.

        with WorkerPool(4) as pool:
            ggtool.graph_compute(graph, 4, pool=pool)
            squares = pool.map(math.sqrt, range(100))

    A plan of more threads than the pool has starts more workers; a plan of 1 runs in-process.
    Workers start in the background when the pool is created; the first compute waits for them.
    With `place` (and GGTOOL_PLACE not 0), each worker wakes up for a compute on a CPU of its own, when
    there are enough (see placement.wake_on).
    """

    def __init__(self, n_threads: int | None = None, place: bool = True):
        n = default_threads() if n_threads is None else int(n_threads)
        if not 1 <= n <= MAX_PARTICIPANTS:
            raise GGToolError(f"a worker pool has 1 to {MAX_PARTICIPANTS} participants, not {n}")
        if role.POOL_WORKER:
            n = 1
        self.n_threads = n
        self.place = place
        self._state = State()
        self._finalizer = weakref.finalize(self, self._state.teardown, True)
        self._lock = threading.Lock()
        self._owner = None
        self._closed = False
        self._entries: OrderedDict[Fingerprint, _Entry] = OrderedDict()
        self._frozen: weakref.WeakSet = weakref.WeakSet()        # graphs described once per plan
        self._described: OrderedDict[tuple, wire.Described] = OrderedDict()
        self._keys: dict[int, _Entry] = {}
        self._next_key = 0
        self._unsettled: tuple | None = None     # (workers, their answer counts) of a compute left to settle
        self._handing: tuple = ((),)             # _hand's arrays: (slots, lines, claimed, values)
        self.stats = {"graphs_sent": 0, "runs": 0, "handed": 0, "restarts": 0, "described": 0}
        try:
            self._start(n)
        except BaseException:   # Ctrl-C or SIGTERM while the workers start: none is left behind
            self._state.teardown()
            raise

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

    def close(self, graceful: bool = True) -> None:
        """Stop the workers and unlink every segment the pool used (idempotent). `graceful`: ask
        the workers to exit (up to 2 s before they are killed); else kill them at once (on an
        interrupt or a broken pipe, when nothing they hold is wanted any more)."""
        self._closed = True
        self._unsettled = None
        self._entries.clear()
        self._keys.clear()
        self._described.clear()
        if graceful:
            self._finalizer()
        elif self._finalizer.detach() is not None:
            self._state.teardown()

    def _start(self, n: int) -> None:
        st = self._state
        if len(st.workers) >= n - 1:
            return
        changed = changed_sources()
        if changed:
            raise GGToolError(f"{changed[0]} changed after this process started: new worker processes would run "
                              "other code than this one; restart the program")
        # each segment and worker is in State as soon as it exists (a signal meanwhile is held), so
        # that teardown finds it
        if st.ctl is None:
            shm.remove_dead_owners()   # what pools killed with their workers left in /dev/shm
            with signals_held():
                st.ctl = shm.Segment(CTL_SIZE)
        while len(st.workers) < n - 1:
            with signals_held():
                st.workers.append(spawn(st.ctl, len(st.workers) + 1))

    def _ensure(self, n: int, wait: bool = True) -> list[Worker]:
        """At least n participants, started and (`wait`) ready; returns workers 1..n-1. Without
        `wait` they may still be starting: `_wait_ready` them before use."""
        if self._closed:
            raise GGToolError("the worker pool is closed")
        if os.getpid() != self._state.pid:
            raise GGToolError("this worker pool belongs to the parent process (os.fork): make a new one")
        if n > MAX_PARTICIPANTS:
            raise GGToolError(f"a worker pool has at most {MAX_PARTICIPANTS} participants, not {n}")
        self.n_threads = max(self.n_threads, n)
        if self._unsettled is not None:
            self._settle()
        if any(w.proc.poll() is not None for w in self._state.workers):
            self._broken()  # a worker died while idle: start afresh
        try:
            self._start(self.n_threads)
            workers = self._state.workers[: n - 1]
            if wait:
                wait_ready(workers)
        except BaseException:
            self._broken()
            raise
        return workers

    def _wait_ready(self, workers: list[Worker]) -> None:
        try:
            wait_ready(workers)
        except BaseException:
            self._broken()
            raise

    def _broken(self) -> None:
        """Kill every worker and unlink the segments; the next use starts afresh."""
        self._state.teardown()
        self._unsettled = None
        self._entries.clear()
        self._keys.clear()
        self._described.clear()
        self.stats["restarts"] += 1

    def _enter(self):
        if self._owner == threading.get_ident():
            raise GGToolError("the worker pool is already busy in this thread (a kernel cannot use the pool)")
        self._lock.acquire()
        self._owner = threading.get_ident()

    def _leave(self):
        self._owner = None
        self._lock.release()

    def preload_kernels(self) -> None:
        """Have the workers load numba and the compiled kernels now (~0.35 s each, in the
        background; nothing waits for it), so that they are ready at the first quantized node of a
        graph this process is still building. For a caller that knows quantized weights are
        coming (the command line, once it has read its inputs)."""
        if self._closed:
            return
        self._enter()
        try:
            for w in self._state.workers:
                if w.proc.poll() is None:
                    w.send(Preload())
        finally:
            self._leave()

    # -- compute -------------------------------------------------------------------------
    def run(self, graph, plan, progress=None) -> None:
        """Compute `graph` with `plan` (work buffer already allocated, see compute.prepare);
        `progress` (a ggtool.compute.Progress) follows participant 0."""
        nth = plan.n_threads
        if nth <= 1 or role.POOL_WORKER:
            run_in_process(graph, plan, progress)
            return
        self._enter()
        try:
            workers = self._ensure(nth, wait=False)
            if len(plan.nodes) != graph.n_nodes:
                raise GGToolError(f"the plan was made for {len(plan.nodes)} nodes but the graph has "
                                  f"{graph.n_nodes}: plan it again")
            # the contexts move into shared memory while workers just started are still importing
            entry = self._entry(graph, plan, nth)
            self._wait_ready(workers)
            with single_threaded():
                self._run(graph, plan, nth, workers, entry, progress)
        finally:
            self._leave()

    def freeze(self, graph) -> None:
        """Promise that `graph`'s tensors keep their fields (ops, parameters, sources, shapes, data
        offsets: only their data changes) for as long as it lives, as a generation step's graph,
        computed again for each token, does: the pool then describes it once per plan instead of
        at every compute (wire.Described). Without the promise a compute describes the graph again
        and finds any change."""
        self._frozen.add(graph)
        freeze(graph)      # and its compiled steps in one process too

    def _entry(self, graph, plan, nth: int) -> _Entry:
        """The graph as the workers know it, from the cache when nothing changed since it was sent."""
        frozen = graph in self._frozen
        if frozen:
            d = self._described.get((id(graph), id(plan), nth))
            if d is not None and d.holds(graph, plan):
                entry = self._entries.get(d.fingerprint)
                if entry is not None:
                    self._entries.move_to_end(d.fingerprint)
                    return entry
        contexts: dict = {}
        records, kernels, work = wire.describe(graph, plan, contexts)
        self.stats["described"] += 1
        n_tasks = tuple([p.n_tasks for p in plan.nodes])
        kept = graph.binding.kept if graph.binding is not None else frozenset()
        asked = tuple(i for i, t in enumerate(graph.nodes) if id(t) in kept)    # the fused steps depend on it
        fingerprint = Fingerprint((nth, work, n_tasks, records, tuple(kernels.items()), asked))
        if frozen:
            self._described[id(graph), id(plan), nth] = wire.Described(graph, plan, fingerprint, contexts, work)
            while len(self._described) > _GRAPH_CACHE:
                self._described.popitem(last=False)
        entry = self._entries.get(fingerprint)
        if entry is not None:
            self._entries.move_to_end(fingerprint)
            return entry
        key = self._next_key
        self._next_key += 1
        b = graph.binding
        program = runner.make_program(graph.nodes, nth, plan.numerics, fuse=b is not None,
                                      keep=b.kept if b else frozenset())
        prog0, progw = programs(plan, nth) if program is None else ((), ())
        segs = {r[2] for r in records if isinstance(r[2], str)} | {work[0]}
        entry = _Entry(key, wire.pack(records, graph.n_nodes, kernels, work, progw, program), segs, prog0, program)
        self._entries[fingerprint] = entry
        self._keys[key] = entry
        while len(self._entries) > _GRAPH_CACHE:
            _, old = self._entries.popitem(last=False)
            self._keys.pop(old.key, None)
        return entry

    def _run(self, graph, plan, nth: int, workers: list[Worker], entry: _Entry, progress) -> None:
        """Participant 0's part of a compute: the workers told to run `entry`, this process's own
        program, then every worker's answer. Raises the ComputeError of the first failing node, or
        of a worker that died; any other exception (Ctrl-C) breaks the pool, leaving nothing behind.
        The CPUs of a placed compute (`placement`) are chosen only for a worker sent a Run (a handed
        one wakes on its own: it is spinning)."""
        live = self._forget_stale(entry)
        mv = memoryview(self._state.ctl.array).cast("q")
        g0 = self._reset_control(mv, nth)
        spin = spin_ns(nth)
        linger = linger_ns(spin) if entry.program is not None else 0
        try:
            answers = [w.answered() for w in workers]
            handed_to = self._hand(workers, entry, nth, g0, spin, linger, live) if linger else set()
            cpus = ()
            for ith, w in enumerate(workers, 1):
                if ith in handed_to:
                    continue
                if cpus == ():
                    cpus = placement(nth) if self.place else None
                self._send_run(ith, w, entry, nth, g0, spin, linger, cpus, live)
            self.stats["runs"] += 1
            self.stats["handed"] += len(handed_to)
            failures = self._take_part(graph, plan, entry, nth, g0, spin, workers, mv, progress)
            if not failures and len(handed_to) == len(workers) and not mv[ABORT] and _ends_met(entry.program):
                # every participant passed the last step's barrier, so each will answer Done, quietly:
                # counted before the next use of the workers (_settle), while this process goes on
                self._unsettled = (workers, answers)
                return
            if entry.program is not None:
                self._await_answers(workers, answers, spin, handed_to, mv)
            failures += self._failures([(ith, w) for ith, w in enumerate(workers, 1)
                                        if ith not in handed_to or mv[outcome(w.slot)] == ON_SOCKET])
        except WorkerDied as d:
            raise self._died(d, mv, graph) from None
        except BaseException:
            # KeyboardInterrupt, or a failure of the pool itself: nothing may be left behind
            mv[ABORT] = 1
            self._broken()
            raise
        if failures:
            raise ComputeError(min(failures)[1])
        if mv[ABORT]:  # pragma: no cover (a participant stopped without saying why)
            raise ComputeError("the compute was aborted by a worker")

    def _await_answers(self, workers: list[Worker], answers: list[int], spin: int, handed_to: set[int],
                       mv: memoryview) -> None:
        """Wait until each worker has answered (wire.answered moves past `answers`): spinning, for
        at most `spin` ns in all, where a caller asleep on the sockets would wake 0.1-0.3 ms after the
        last answer (the workers end a decode step's graph within microseconds of it); the answers
        are then read from the sockets, which tell a dead worker. A worker handed its compute
        (`handed_to`, by participant number) may send nothing: each is waited for to the end,
        sleeping after the spin and watching its process (a death raises WorkerDied)."""
        from ..kernels import runner as kr

        base = self._state.ctl.array.ctypes.data
        deadline = time.monotonic_ns() + spin
        for ith, (w, seen) in enumerate(zip(workers, answers), 1):
            left = deadline - time.monotonic_ns()
            if (left <= 0 or not kr.wait_change(base + 8 * answered(w.slot), seen, left)) and ith in handed_to:
                _await_change(mv, answered(w.slot), seen, workers)

    def _settle(self) -> None:
        """Wait for the answers of the compute `_run` left unsettled (every worker's Done, counted, so
        that the next compute's counts start from them): long there by now, the caller has had the
        results since. Where a worker died meanwhile, the pool starts afresh (as after one that
        dies idle), unless this process got an ending signal it has not raised yet (the worker got it
        too): that is raised; anything else (Ctrl-C) breaks the pool too."""
        workers, answers = self._unsettled
        self._unsettled = None
        mv = memoryview(self._state.ctl.array).cast("q")
        try:
            for w, seen in zip(workers, answers):
                if mv[answered(w.slot)] == seen:
                    _await_change(mv, answered(w.slot), seen, workers)
                if mv[outcome(w.slot)] == ON_SOCKET:  # pragma: no cover - past the last barrier, a worker is done
                    raise GGToolError(f"worker {w.slot} (pid {w.pid}) answered a compute it had finished with a message")
        except WorkerDied:
            self._broken()
            signalled = received()    # killed with us by the terminal or `timeout`: that signal is the error
            if signalled is not None:
                raise signalled from None
        except BaseException:
            self._broken()
            raise

    def _hand(self, workers: list[Worker], entry: _Entry, nth: int, g0: int, spin: int, linger: int,
              live: set[str]) -> set[int]:
        """Hand `entry` through the control segment (wire.standby) to each worker that holds the graph
        and every segment already, has nothing to drop (segments gone, graphs the pool forgot: a Run
        says so, and frees their memory), and is listening: the participant numbers of those that
        took it (the others are sent a Run). One compiled call writes the fields and claims them all
        (``kernels.runner.hand``). x86 only: a worker's answer is published by plain stores in order (TSO)."""
        if not HANDING:
            return set()
        ready = [(ith, w) for ith, w in enumerate(workers, 1)
                 if entry.key in w.graphs and all(n in w.segs for n in entry.segs)
                 and all(n in live for n in w.segs) and all(k in self._keys for k in w.graphs)]
        if not ready:
            return set()
        from ..kernels import runner as kr

        slots = tuple(w.slot for _, w in ready)
        if self._handing[0] != slots:       # the arrays of the workers handed to last, kept (a decode's are the same)
            self._handing = (slots, np.array([standby(i) - STANDBY for i in slots], np.int64),
                             np.zeros(len(slots), np.bool_), np.zeros(5, np.int64))
        _, lines, claimed, values = self._handing
        values[:] = entry.key, nth, g0, spin, linger
        kr.hand(self._state.ctl.array.ctypes.data, lines, _HANDED_FIELDS, values, claimed)
        return {ith for (ith, _), took in zip(ready, claimed.tolist()) if took}

    def _forget_stale(self, entry: _Entry) -> set[str]:
        """Record `entry`'s segments as used by the pool, and forget the graphs whose segments are
        gone; returns the segments still live."""
        self._state.used |= entry.segs
        live = live_segments()
        for fp, e in list(self._entries.items()):
            if not e.segs <= live:
                del self._entries[fp]
                self._keys.pop(e.key, None)
        return live

    def _reset_control(self, mv: memoryview, nth: int) -> int:
        """Clear the abort flag, the compiled barrier's arrivals, sleepers and chunk counter (a compute
        stopped midway, or one ending on a step that deals out its units, may have left some: every
        worker has answered since) and each participant's node;
        returns the Python barrier's generation the compute starts from (every counter is at or
        below it)."""
        g0 = max(mv[arrivals(i)] for i in range(len(self._state.workers) + 1))
        mv[ABORT] = mv[N_BARRIER] = mv[SLEEPERS] = mv[CHUNK] = 0
        for i in range(nth):
            mv[at_node(i)] = -1
        return g0

    def _send_run(self, ith: int, w: Worker, entry: _Entry, nth: int, g0: int, spin: int, linger: int,
                  cpus: list[int] | None, live: set[str]) -> None:
        """Tell worker ith to run `entry`, with what it lacks (the graph, segments to attach) and
        what it may drop; wake it on its CPU if the compute is placed."""
        drop_graphs = [k for k in w.graphs if k not in self._keys]
        w.graphs.difference_update(drop_graphs)
        drop_segs = [n for n in w.segs if n not in live]
        for n in drop_segs:
            del w.segs[n]
        attach = [(n, segment_size(n)) for n in entry.segs if n not in w.segs]
        blob = None
        if entry.key not in w.graphs:
            blob = entry.blob
            self.stats["graphs_sent"] += 1
        if cpus:
            wake_on(w.pid, cpus[ith])
        try:
            w.send(Run(entry.key, ith, nth, g0, spin, linger, cpus is not None, blob, attach, drop_segs, drop_graphs))
        except OSError:
            raise WorkerDied(ith, w) from None
        w.graphs.add(entry.key)
        w.segs.update(attach)

    def _take_part(self, graph, plan, entry: _Entry, nth: int, g0: int, spin: int, workers: list[Worker],
                   mv: memoryview, progress) -> list[tuple[int, str]]:
        """This process's own program, as participant 0 (checking its workers are alive while it
        waits at a barrier); its failure, if any, as [(node, message)]."""
        check = functools.partial(_check_alive, workers)
        try:
            if entry.program is not None:
                if entry.bound is None or not entry.bound.fresh():
                    entry.bound = runner.bind(entry.program, graph.nodes, plan.numerics, 0, nth)
                base = self._state.ctl.array.ctypes.data
                sync = runner.Sync(base, nth, spin, int(CHECK_EVERY * 1e9), check, base + 8 * at_node(0))
                work = Work(work_view(graph, plan), sync.barrier, plan.numerics)
                failed = runner.participate(entry.bound, graph.nodes, 0, nth, work, sync, progress)
            else:
                work = Work(work_view(graph, plan), Barrier(mv, 0, nth, g0, check), plan.numerics)
                failed = participate(graph.nodes, entry.prog0, 0, work, mv, progress)
        except Aborted:
            return []
        return [failed] if failed else []

    def _failures(self, workers: list[tuple[int, Worker]]) -> list[tuple[int, str]]:
        """The answers on the sockets of `workers` (participant number, worker) to their compute: the
        (node, message) of each failure (-1: a worker that could not run the graph, which then has to
        be sent everything again)."""
        failures = []
        for ith, reply in self._replies(workers):
            if isinstance(reply, Failed):
                failures.append((reply.node, reply.message))
            elif isinstance(reply, Error):
                w = dict(workers)[ith]
                w.graphs.clear()
                w.segs.clear()
                failures.append((-1, f"worker {ith} (pid {w.pid}) could not run the graph: {reply.message}"))
        return failures

    def _died(self, d: WorkerDied, mv: memoryview, graph) -> BaseException:
        """The error of a worker that died mid-compute, naming the node it was at; the pool is broken.
        Where this process got an ending signal it has not raised yet, that signal is the error: the
        worker got it too, from the terminal or `timeout` (worker.TERM_GRACE)."""
        how = death(d.w)
        self._broken()
        signalled = received()
        if signalled is not None:
            return signalled
        i = mv[at_node(d.ith)]
        at = "before starting the graph"
        if i >= 0:
            node = graph.nodes[i]
            at = f"while computing node {i} '{node.name}' ({node.op_desc})"
        return ComputeError(f"worker {d.ith} (pid {d.w.pid}) died ({how}) {at}{_why(how)}")

    def _replies(self, workers: list[tuple[int, Worker]]):
        """One reply per worker (participant number, worker), in any order; a closed connection or a
        dead process raises."""
        pending = {w.conn: (i, w) for i, w in workers}
        while pending:
            ready = _wait(list(pending), timeout=CHECK_EVERY)
            for c in ready:
                i, w = pending.pop(c)
                try:
                    reply = decode(c.recv())
                except (EOFError, OSError):
                    raise WorkerDied(i, w) from None
                yield i, reply
            if not ready:
                for i, w in pending.values():
                    if w.proc.poll() is not None:
                        raise WorkerDied(i, w)

    # -- map -----------------------------------------------------------------------------
    def map(self, fn, items, n_threads: int | None = None) -> list:
        """[fn(x) for x in items], split in contiguous blocks over the participants.

        `fn` must be picklable (a module-level function); items and results travel pickled.
        The first exception, in item order, is re-raised in the caller.
        """
        items = list(items)
        n = min(self.n_threads if n_threads is None else int(n_threads), len(items))
        if n <= 1 or role.POOL_WORKER or self._owner == threading.get_ident():
            return [fn(x) for x in items]
        self._enter()
        try:
            workers = self._ensure(n)
            bounds = [len(items) * k // n for k in range(n + 1)]
            blocks = [items[bounds[k]: bounds[k + 1]] for k in range(n)]
            try:
                for k, w in enumerate(workers, 1):
                    try:
                        w.send(Map(fn, blocks[k]))
                    except OSError:
                        raise WorkerDied(k, w) from None
                results, errors = self._map_block(fn, blocks[0], n)
                self._map_replies(workers, results, errors)
            except WorkerDied as d:
                how = death(d.w)
                self._broken()
                raise received() or GGToolError(f"worker {d.ith} (pid {d.w.pid}) died ({how}) during pool.map") from None
            except BaseException:
                self._broken()
                raise
            if errors:
                raise min(errors, key=lambda e: e[0])[1]
            return [r for block in results for r in block]
        finally:
            self._leave()

    @staticmethod
    def _map_block(fn, block: list, n: int) -> tuple[list, list]:
        """Participant 0's block of a map, on one thread: the results of all n blocks (its own
        filled in) and the errors so far, as (participant, exception)."""
        results: list = [None] * n
        errors = []
        with single_threaded():
            try:
                results[0] = [fn(x) for x in block]
            except Exception as e:
                errors.append((0, e))
        return results, errors

    def _map_replies(self, workers: list[Worker], results: list, errors: list) -> None:
        """Each worker's answer to its Map, into `results` or `errors`."""
        for k, reply in self._replies(list(enumerate(workers, 1))):
            if isinstance(reply, Results):
                results[k] = reply.values
            elif isinstance(reply, Raised):
                errors.append((k, reply.exception))
            else:
                w = workers[k - 1]
                w.graphs.clear()
                w.segs.clear()
                errors.append((k, GGToolError(f"worker {k} (pid {w.pid}): {reply.message}")))

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._state.workers)} workers"
        return f"<WorkerPool {self.n_threads} participants, {state}>"


def _ends_met(program) -> bool:
    """Whether a compiled program ends on a barrier (runner.make_program's, for more than one
    participant): passing it, a participant knows every other has finished its steps."""
    return program is not None and len(program.steps) > 0 and bool(program.steps[-1][2] & runner.BARRIER)


def _await_change(mv: memoryview, slot: int, seen: int, workers: list[Worker]) -> None:
    """Sleep-poll until the control segment's `slot` is no longer `seen` (sleeps from _POLL, doubling
    up to _POLL_MAX: a long compute costs the caller little), looking at the `workers`' processes
    every CHECK_EVERY (a death raises WorkerDied, as at a barrier: the one waited for, or another,
    which may stop the graph; Ctrl-C is raised between polls)."""
    next_check, pause = 0.0, _POLL
    while mv[slot] == seen:
        now = time.monotonic()
        if now >= next_check:
            _check_alive(workers)
            next_check = now + CHECK_EVERY
        time.sleep(pause)
        pause = min(_POLL_MAX, 2 * pause)


def _check_alive(workers: list[Worker]) -> None:
    """Participant 0's check while it waits at a barrier: a worker that died raises WorkerDied."""
    for i, w in enumerate(workers, 1):
        if w.proc.poll() is not None:
            raise WorkerDied(i, w)


def _why(how: str) -> str:
    """What a worker's death by SIGBUS says of the inputs: a memory-mapped file that shrank."""
    if "SIGBUS" not in how:
        return ""
    from ..gguf_io.storage import shrunk

    return "".join(f": {lost}" for lost in shrunk())
