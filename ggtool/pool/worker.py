"""The worker's side: the main loop of a worker process.

A worker is forked from the command line (pool.fork), or started as `python -c "...; from
ggtool.pool.worker import main; main()" <socket fd> <pipe fd> <eventfd>` (pool.launch). It ignores
Ctrl-C, and takes SIGTERM and SIGHUP as notice only (they are the caller's to handle: a terminal or
`timeout` signals the whole process group, and the caller then stops its workers itself); it exits
as soon as the caller is gone (a watchdog thread reads EOF on the pipe), or TERM_GRACE seconds after
a SIGTERM/SIGHUP the caller did not act on (one sent to this worker alone). It sleeps on the
eventfd (its bell) between messages, and answers the caller's messages: "run" a graph as
participant ith of nth (installing and caching the graph the first time), "map" a function over
items, "exit".
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection

import numpy as np

from ..compute import Work, forget_packs
from ..errors import GGToolError
from . import shm
from .barrier import ABORT, Aborted, Barrier, participate
from .placement import Release
from .wire import WorkerGraph, install

# Seconds a worker waits, after a SIGTERM or SIGHUP, for its caller to stop it before it exits by itself.
TERM_GRACE = 2.0
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
    """Load numba and the compiled kernels (~0.35 s) while the caller is still building its graph
    (the caller's "preload" message, WorkerPool.preload_kernels): at the first quantized node they
    are ready, and the caller loads its own copy without sharing the machine with ours. A failure
    is left for the kernel that needs them to report."""
    try:
        from ..kernels import dot, dot_k, kquants, quantize  # noqa: F401
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
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the caller's to handle
    # SIGTERM/SIGHUP: blocked in every thread (procs.spawn started us with them blocked) but one
    signal.pthread_sigmask(signal.SIG_BLOCK, _TERM_SIGNALS)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Thread(target=_on_termination, name="ggtool-pool-signals", daemon=True).start()
    if sock is None:
        sock, life, bell = (int(a) for a in sys.argv[-3:])
    _name_process()
    conn = Connection(sock)

    def receive():
        if bell >= 0:
            os.eventfd_read(bell)   # one ring per message (EFD_SEMAPHORE)
        return conn.recv()

    caller = os.getppid()

    def watchdog():  # EOF: the caller is gone (or has let us go); nothing left to compute for
        try:
            os.read(life, 1)
            _clean_up_after(caller)
        finally:
            os._exit(3)

    threading.Thread(target=watchdog, name="ggtool-pool-watchdog", daemon=True).start()
    try:
        _, ctl_name, ctl_size = receive()
    except (EOFError, OSError):
        os._exit(0)
    try:
        mv = memoryview(shm.attach(ctl_name, ctl_size)).cast("q")
        release = Release()   # our mask, read before "ready": after it the caller may pin us (wake_on)
        conn.send(("ready", os.getpid()))
    except BaseException as e:
        try:
            conn.send(("error", f"{type(e).__name__}: {e}"))
        finally:
            os._exit(1)

    segs: dict[str, np.ndarray] = {}
    graphs: dict[int, WorkerGraph] = {}
    preloading = None
    from ..ops.base import KERNELS, Kernel

    def run(msg):
        _, key, ith, nth, g0, placed, blob, attach, drop_segs, drop_graphs = msg
        if placed:
            release()  # the caller chose the CPU we woke up on; from here the scheduler may move us
        for k in drop_graphs:
            graphs.pop(k, None)
        for n in drop_segs:
            segs.pop(n, None)
            for k in [k for k, g in graphs.items() if n in g.segs]:
                del graphs[k]
        for n, size in attach:
            segs[n] = shm.attach(n, size)
        if blob is not None:
            graphs[key] = install(blob, segs)
        wg = graphs[key]
        forget_packs(wg.written)   # weights the graph writes into: repacked anew each run
        for op, fn in wg.kernels.items():
            k = KERNELS.get(op)
            if k is None or k.forward is not fn:
                KERNELS[op] = Kernel(op, fn)
        work = Work(wg.wdata, Barrier(mv, ith, nth, g0, _nothing), wg.numerics)
        try:
            failed = participate(wg.nodes, wg.prog, ith, work, mv)
        except Aborted:
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
        release()       # in case the caller placed us for a run we could not start
        mv[ABORT] = 1   # whoever waits for us at a barrier stops
        segs.clear()    # and the caller forgets what it sent us, as we do
        graphs.clear()
        return ("error", str(e) if isinstance(e, GGToolError) else f"{type(e).__name__}: {e}")

    while True:
        try:
            msg = receive()
        except (EOFError, OSError):
            break
        except BaseException as e:  # a message that cannot be unpickled here (a kernel's module, say)
            reply = failure(e)
        else:
            if msg[0] == "exit":
                break
            if msg[0] == "preload":   # no reply: the caller does not wait for it
                if preloading is None:
                    preloading = threading.Thread(target=_preload_kernels, name="ggtool-pool-preload", daemon=True)
                    preloading.start()
                continue
            try:
                reply = run(msg) if msg[0] == "run" else run_map(msg)
            except BaseException as e:
                reply = failure(e)
        try:
            conn.send(reply)   # pickled whole before anything is written
        except (OSError, ValueError):
            break
        except Exception as e:   # a map result that cannot travel: its error, not our death
            try:
                conn.send(("exc", GGToolError(f"a result cannot be sent back from a worker ({type(e).__name__}: {e})")))
            except (OSError, ValueError):
                break
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)
