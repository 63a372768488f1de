"""The worker's side: the main loop of a worker process.

A worker is forked from the command line (pool.fork), or started as `python -c "...; from
ggtool.pool.worker import main; main()" <socket fd> <pipe fd> <eventfd>` (pool.launch). It ignores
Ctrl-C, and takes SIGTERM and SIGHUP as notice only (they are the caller's to handle: a terminal or
`timeout` signals the whole process group, and the caller then stops its workers itself); it exits
as soon as the caller is gone (a watchdog thread reads EOF on the pipe), or TERM_GRACE seconds after
a SIGTERM/SIGHUP the caller did not act on (one sent to this worker alone). It sleeps on the
eventfd (its bell) between messages, and answers the caller's messages (wire): `Run` a graph as
participant ith of nth (installing and caching the graph the first time), `Map` a function over
items, `Preload` the compiled kernels, `Exit`. After a compute on the compiled runner it listens for
a while for the next (wire.standby), which the caller may then hand it without a message.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler

import numpy as np

from .. import role, runner
from ..compute import Work, forget_packs
from ..errors import GGToolError
from ..interrupts import IMPORT_GRACE
from ..ops.base import KERNELS, Kernel
from . import shm
from .barrier import Aborted, Barrier, participate
from .placement import Release
from .wire import (
    ABORT,
    H_GENERATION,
    H_KEY,
    H_LINGER,
    H_NTH,
    H_SPIN,
    LISTENING,
    ON_SOCKET,
    QUIET,
    Done,
    Error,
    Exit,
    Failed,
    Map,
    Preload,
    Raised,
    Ready,
    Results,
    Run,
    Stopped,
    WorkerGraph,
    answered,
    at_node,
    decode,
    encode,
    handed,
    install,
    outcome,
    rung,
    standby,
)

# Seconds a worker waits, after a SIGTERM or SIGHUP, for its caller to stop it before it exits by itself:
# longer than the caller may hold the same signal back while it imports (interrupts.IMPORT_GRACE: a
# first-ever run's compile imports numba mid-compute), so that the caller, not its worker, ends first.
TERM_GRACE = IMPORT_GRACE + 1.0
# Nanoseconds a worker's compiled steps run before they return to Python (where nothing waits for it:
# its caller's death and signals are its other threads' to see; an abort, the barrier's)
WAIT_NS = 50_000_000
_TERM_SIGNALS = {signal.SIGTERM, signal.SIGHUP}


def _on_termination() -> None:
    """The thread that takes SIGTERM and SIGHUP (blocked in every other thread): the caller, which got
    the same signal from a terminal or `timeout`, stops us within milliseconds; if it does not (the
    signal was for this worker alone), exit as the signal would have ended us."""
    sig = signal.sigwait(_TERM_SIGNALS)
    time.sleep(TERM_GRACE)
    os._exit(128 + sig)


NAME = "ggtool-worker"


def _name_process() -> None:
    """Show as ggtool-worker in ps and top (the process name, /proc/PID/comm, where there is one): a
    forked worker's command line is the caller's."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(NAME)
    except OSError:
        pass


def _nothing() -> None:
    """A worker's liveness check while waiting: nothing to do, its watchdog thread watches the caller."""


def _preload_kernels() -> None:
    """Load numba and the compiled kernels (~0.35 s; the graph runner's modules too) while the caller
    is still building its graph (the caller's "preload" message, WorkerPool.preload_kernels): at the
    first quantized node they are ready, and the caller loads its own copy without sharing the
    machine with ours. A failure is left for the kernel that needs them to report."""
    try:
        from ..kernels import dot, dot_k, nodes, nodes_mm, quantize, runner  # noqa: F401
    except Exception:  # noqa: BLE001
        pass


def _clean_up_after(caller: int, wait: float = 1.0) -> None:
    """The caller's life pipe closed. If the caller died (we are handed to another parent, within
    `wait` seconds: its files close a moment before), the shared-memory segments it created are
    unlinked here, which it had no chance to do (SIGKILL); a caller alive has let us go and keeps
    its segments."""
    deadline = time.monotonic() + wait
    while os.getppid() == caller:
        if time.monotonic() > deadline:
            return
        time.sleep(0.001)
    shm.remove_orphans(caller)


def main(sock: int | None = None, life: int | None = None, bell: int | None = None) -> None:
    """Entry point of a worker process: `python -c ... <socket fd> <life pipe fd> <bell fd or -1>`,
    or these descriptors as arguments (a worker forked from the caller, pool.fork)."""
    _take_signals()
    if sock is None:
        sock, life, bell = (int(a) for a in sys.argv[-3:])
    _name_process()
    w = _Worker(Connection(sock), bell)
    _watch_caller(life)
    w.start()
    try:
        w.serve()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)


def _take_signals() -> None:
    """Ctrl-C is the caller's to handle; SIGTERM and SIGHUP are blocked in every thread (procs.spawn
    started us with them blocked) but the one that waits for them (`_on_termination`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, _TERM_SIGNALS)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Thread(target=_on_termination, name="ggtool-pool-signals", daemon=True).start()


def _watch_caller(life: int) -> None:
    """A thread that exits the process as soon as the caller is gone (or has let us go): EOF on
    the life pipe, whose write end only the caller holds."""
    caller = os.getppid()

    def watchdog():
        try:
            os.read(life, 1)
            _clean_up_after(caller)
        finally:
            os._exit(3)

    threading.Thread(target=watchdog, name="ggtool-pool-watchdog", daemon=True).start()


class _Worker:
    """A worker's state between messages: its connection and bell, the control segment, and the
    segments and graphs the caller has sent it (the caller keeps the same record, see caller._send_run)."""

    def __init__(self, conn: Connection, bell: int):
        self.conn, self.bell = conn, bell
        self.ctl: memoryview | None = None
        self.ctl_addr = 0      # where the control segment is mapped here (the compiled runner's sync block)
        self.slot = 0          # our line in the control segment (Init)
        self.got = 0           # messages received since Init (the caller's count: wire.rung)
        self.release = None
        self.segs: dict[str, np.ndarray] = {}
        self.graphs: dict[int, WorkerGraph] = {}
        self.preloading: threading.Thread | None = None

    def receive(self):
        if self.bell >= 0:
            os.eventfd_read(self.bell)   # one ring per message (EFD_SEMAPHORE)
        raw = self.conn.recv()
        self.got += 1
        return decode(raw)

    def start(self) -> None:
        """Attach the control segment the caller names in its first message and say we are ready."""
        try:
            init = self.receive()
        except (EOFError, OSError):
            os._exit(0)
        try:
            self.ctl = memoryview(shm.attach(init.ctl_name, init.ctl_size)).cast("q")
            self.ctl_addr = np.frombuffer(self.ctl, np.int64).ctypes.data
            self.slot, self.got = init.slot, 0
            role.LIBRARY_CALLER = not init.command_line
            self.release = Release()   # our mask, read before Ready: after it the caller may pin us (wake_on)
            self.conn.send(encode(Ready(os.getpid())))
        except BaseException as e:
            try:
                self.conn.send(encode(Error(f"{type(e).__name__}: {e}")))
            finally:
                os._exit(1)

    def serve(self) -> None:
        """Answer the caller's messages, and the computes it hands us while we listen (wire.standby),
        until it says Exit or goes away."""
        handed = False
        while True:
            msg = None
            try:
                msg = self.handed_run() if handed else self.receive()
            except (EOFError, OSError):
                return
            except BaseException as e:  # a message that cannot be unpickled here (a kernel's module, say)
                reply = self.failure(e)
            else:
                if isinstance(msg, Exit):
                    return
                if isinstance(msg, Preload):   # no reply: the caller does not wait for it
                    self.preload()
                    continue
                try:
                    reply = self.run(msg) if isinstance(msg, Run) else self.map(msg)
                except BaseException as e:
                    reply = self.failure(e)
            kr = sys.modules.get("ggtool.kernels.runner") if isinstance(msg, Run) and msg.linger_ns > 0 else None
            if not self.answer(reply, quiet=handed, listening=kr is not None):
                return
            handed = kr is not None and self.linger(kr, msg.linger_ns)

    def linger(self, kr, ns: int) -> bool:
        """Listen for up to `ns` for the caller's next compute (wire.standby) or message (wire.rung),
        rather than going to sleep on the bell at once: the next compute of a decode step then finds
        us awake, and is handed to us without a message. Only where the compiled runner `kr` is
        loaded (it has the spin); the bell still carries every message. Whether a compute was handed."""
        return bool(kr.listen(self.ctl_addr + 8 * standby(self.slot), self.ctl_addr + 8 * rung(self.slot), self.got, ns))

    def handed_run(self) -> Run:
        """The compute the caller handed us (its fields in our line, wire.handed): a Run of a graph we
        hold, with nothing to attach or drop, on a CPU of our choosing."""
        ctl, i = self.ctl, self.slot
        return Run(ctl[handed(i, H_KEY)], i, ctl[handed(i, H_NTH)], ctl[handed(i, H_GENERATION)],
                   ctl[handed(i, H_SPIN)], ctl[handed(i, H_LINGER)], False, None, [], [], [])

    def answer(self, reply, quiet: bool = False, listening: bool = False) -> bool:
        """Give the reply: pickled whole, counted in wire.answered, then sent (counted first, so that a
        caller that has read it knows the count has moved: its next compute's count starts from the
        right one); False once the caller is gone. `quiet`: the answer to a handed compute, where a
        Done is only counted (wire.outcome QUIET). `listening`: we listen for the next compute once
        answered (`linger`), and say so first (wire.standby; x86 keeps stores in order). Else the
        word is left as it is: ASLEEP, or CLAIMED by the compute just handed to us (neither can be
        claimed)."""
        buf = None
        if not (quiet and isinstance(reply, Done)):
            try:
                buf = ForkingPickler.dumps(encode(reply))
            except Exception as e:   # a map result that cannot travel: its error, not our death
                buf = ForkingPickler.dumps(encode(Raised(GGToolError(
                    f"a result cannot be sent back from a worker ({type(e).__name__}: {e})"))))
        ctl, i = self.ctl, self.slot
        if listening:
            ctl[standby(i)] = LISTENING
        ctl[outcome(i)] = QUIET if buf is None else ON_SOCKET
        ctl[answered(i)] += 1
        if buf is not None:
            try:
                self.conn.send_bytes(buf)
            except (OSError, ValueError):
                return False
        return True

    def preload(self) -> None:
        if self.preloading is None:
            self.preloading = threading.Thread(target=_preload_kernels, name="ggtool-pool-preload", daemon=True)
            self.preloading.start()

    def run(self, msg: Run):
        if msg.placed:
            self.release()  # the caller chose the CPU we woke up on; from here the scheduler may move us
        wg = self.install(msg)
        forget_packs(wg.written)   # weights the graph writes into: repacked anew each run
        for op, fn in wg.kernels.items():
            k = KERNELS.get(op)
            if k is None:
                KERNELS[op] = Kernel(op, fn)
            elif k.forward is not fn:
                KERNELS[op] = dataclasses.replace(k, forward=fn)
        try:
            if wg.program is not None:
                failed = self.run_compiled(wg, msg)
            else:
                work = Work(wg.wdata, Barrier(self.ctl, msg.ith, msg.nth, msg.generation, _nothing), wg.numerics)
                failed = participate(wg.nodes, wg.prog, msg.ith, work, self.ctl)
        except Aborted:
            return Stopped()
        return Done() if failed is None else Failed(*failed)

    def run_compiled(self, wg: WorkerGraph, msg: Run):
        """Participant ith's part on the compiled runner: its steps bound here once per graph and
        (ith, nth), with the barrier's view and the Work for its spin, kept for the next compute."""
        got = wg.bound
        if got is None or got[0][:2] != (msg.ith, msg.nth) or not got[1].fresh():
            got = ((msg.ith, msg.nth, None), runner.bind(wg.program, wg.nodes, wg.numerics, msg.ith, msg.nth))
        if got[0][2] != msg.spin_ns:
            base = self.ctl_addr
            sync = runner.Sync(base, msg.nth, msg.spin_ns, WAIT_NS, None, base + 8 * at_node(msg.ith))
            got = ((msg.ith, msg.nth, msg.spin_ns), got[1], sync, Work(wg.wdata, sync.barrier, wg.numerics))
        wg.bound = got
        return runner.participate(got[1], wg.nodes, msg.ith, msg.nth, got[3], got[2])

    def install(self, msg: Run) -> WorkerGraph:
        """The graph of `msg`, after forgetting what the caller dropped and attaching what it added."""
        graphs, segs = self.graphs, self.segs
        for k in msg.drop_graphs:
            graphs.pop(k, None)
        for n in msg.drop_segments:
            segs.pop(n, None)
            for k in [k for k, g in graphs.items() if n in g.segs]:
                del graphs[k]
        for n, size in msg.attach:
            segs[n] = shm.attach(n, size)
        if msg.graph is not None:
            graphs[msg.key] = install(msg.graph, segs)
        return graphs[msg.key]

    def map(self, msg: Map):
        try:
            return Results([msg.fn(x) for x in msg.items])
        except Exception as e:
            try:
                pickle.dumps(e)
            except Exception:
                e = GGToolError(f"{type(e).__name__}: {e}")
            return Raised(e)

    def failure(self, e: BaseException) -> Error:
        if self.release is not None:
            self.release()   # in case the caller placed us for a run we could not start
        self.ctl[ABORT] = 1    # whoever waits for us at a barrier stops
        self.segs.clear()      # and the caller forgets what it sent us, as we do
        self.graphs.clear()
        return Error(str(e) if isinstance(e, GGToolError) else f"{type(e).__name__}: {e}")
