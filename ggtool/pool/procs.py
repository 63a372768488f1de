"""The worker processes as the caller sees them: starting, waiting for, describing the death of, and
killing them.

A worker is a fresh interpreter (subprocess: nothing inherited from the caller's state, no
re-import of the caller's `__main__` as multiprocessing's spawn does, and the environment is ours
to set: BLAS and OpenMP on one thread before numpy loads), or a fork of the command line's own
process where that is known to be safe (see launch and fork). Each worker
has a watchdog thread that exits the process as soon as the caller is gone (EOF on a pipe only the
caller holds). `State` holds what must be cleaned up, apart from the pool so a finalizer can do it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as _wait_ready
from multiprocessing.reduction import ForkingPickler

from .. import role, threads
from ..errors import GGToolError
from ..interrupts import signals_held
from . import shm
from .launch import launch, take
from .segments import release_segments
from .wire import Exit, Init, Ready, answered, decode, encode, rung

_START_TIMEOUT = 120.0
# A message at most this long fits in the socket's buffer whole: it is sent before the bell rings.
_SMALL_MESSAGE = 16 * 1024


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


def changed_sources() -> list[str]:
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


class WorkerDied(BaseException):  # BaseException: raised from barriers inside kernels
    def __init__(self, ith: int, w):
        self.ith, self.w = ith, w


class Worker:
    """The caller's handle on a worker: its process, connection, bell and life pipe, its slot in the
    control segment (`ctl`: the segment as int64, set once Init is sent), and what it holds."""

    __slots__ = ("bell", "conn", "ctl", "graphs", "life", "proc", "ready", "segs", "slot")

    def __init__(self, proc, conn, life: int, bell: int, slot: int = 0):
        self.proc, self.conn, self.life, self.bell, self.ready = proc, conn, life, bell, False
        self.slot, self.ctl = slot, None
        self.segs: dict[str, int] = {}
        self.graphs: set[int] = set()

    def send(self, msg) -> None:
        """Send a message and ring the worker's bell (an eventfd), on which it sleeps between
        messages; it reads the message after the ring.

        A small message is written first and the bell rung after: a socket write wakes its reader
        as a "sync" wakeup, which makes Linux run the worker on the caller's CPU and stall the
        caller for milliseconds while the other core idles; an eventfd wakes it like a futex, on an
        idle CPU. A large one (a graph's description) may not fit in the socket's buffer, so the
        worker is woken first to read it as it is written (the other order would wait forever on a
        worker that waits for its bell). The rung slot (wire.rung) counts the message after its
        bell, for a worker that spins instead of sleeping (before the large message's bytes: it
        reads them as they come)."""
        buf = ForkingPickler.dumps(encode(msg))
        if self.bell < 0:
            self.conn.send_bytes(buf)
            self._ring()
        elif len(buf) <= _SMALL_MESSAGE:
            self.conn.send_bytes(buf)
            os.eventfd_write(self.bell, 1)
            self._ring()
        else:
            os.eventfd_write(self.bell, 1)
            self._ring()
            self.conn.send_bytes(buf)

    def _ring(self) -> None:
        if self.ctl is not None:
            self.ctl[rung(self.slot)] += 1

    def answered(self) -> int:
        """How many answers the worker has sent (wire.answered)."""
        return self.ctl[answered(self.slot)]

    @property
    def pid(self) -> int:
        return self.proc.pid


def death(w: Worker) -> str:
    try:
        rc = w.proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        return "stopped responding"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    if rc - 128 in (signal.SIGTERM, signal.SIGHUP):  # worker._on_termination: a signal for it alone
        return f"exited on {signal.Signals(rc - 128).name}"
    return f"exited with code {rc}"


def spawn(ctl: shm.Segment, slot: int) -> Worker:
    """One worker (a prestarted one if the command line launched it, see `launch`), told which
    control segment to use and its slot there (its place in the pool, 1..)."""
    started = take() or launch()
    conn = Connection(started.sock.detach())
    w = Worker(started.proc, conn, started.life, started.bell, slot)
    threads.HELPERS.add(w.pid)
    try:
        w.send(Init(ctl.name, ctl.size, role.COMMAND_LINE, slot))
    except BaseException:
        kill(w)
        raise
    w.ctl = memoryview(ctl.array).cast("q")
    return w


def kill(w: Worker) -> None:
    """Kill a worker that is not (yet) in State.workers, and close its connection and life pipe."""
    try:
        w.proc.kill()
    except OSError:
        pass
    reap(w)


def reap(w: Worker) -> None:
    """Wait for a killed or exiting worker, then close its connection, bell and life pipe (each on
    its own: a failure to close one must not leak the others, or the worker's watchdog never sees EOF)."""
    try:
        w.proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass
    threads.HELPERS.discard(w.pid)
    try:
        w.conn.close()
    except Exception:
        pass
    for fd in (w.bell, w.life):
        try:
            if fd >= 0:
                os.close(fd)
        except Exception:
            pass


def wait_ready(workers) -> None:
    """Wait until each of `workers` has said it is ready (at most _START_TIMEOUT seconds)."""
    pending = {w.conn: w for w in workers if not w.ready}
    deadline = time.monotonic() + _START_TIMEOUT
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise GGToolError(f"worker processes did not start within {_START_TIMEOUT:.0f} s")
        for c in _wait_ready(list(pending), timeout=min(left, 1.0)):
            w = pending.pop(c)
            try:
                msg = decode(c.recv())
            except (EOFError, OSError):
                raise GGToolError(f"a worker process (pid {w.pid}) failed to start ({death(w)})") from None
            if not isinstance(msg, Ready):
                raise GGToolError(f"a worker process (pid {w.pid}) failed to start: {msg.message}")
            w.ready = True


class State:
    """What must be cleaned up, held apart from the pool so a finalizer can do it."""

    def __init__(self):
        self.workers: list[Worker] = []
        self.ctl: shm.Segment | None = None
        self.used: set[str] = set()
        self.pid = os.getpid()

    def teardown(self, graceful: bool = False) -> None:
        """Stop the workers (`graceful`: ask them to exit, wait up to 2 s, then kill; else kill at
        once) and unlink the segments. A SIGINT, SIGTERM or SIGHUP meanwhile is held until it is done."""
        if os.getpid() != self.pid:
            return  # a forked copy of the caller: the workers and segments are the parent's
        with signals_held():
            self._teardown(graceful)

    def _teardown(self, graceful: bool) -> None:
        workers, self.workers = self.workers, []
        if graceful:
            for w in workers:
                try:
                    w.send(Exit())
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
            reap(w)
        if self.ctl is not None:
            self.ctl.unlink()
            self.ctl = None
        used, self.used = self.used, set()
        release_segments(used)  # the tracker hears of it at the next flush (this may run in a GC)
