"""Starting worker processes, and readying the command line for them before it has loaded.

A worker started as a fresh interpreter spends ~0.15 s importing numpy and ggtool before it can
compute. The command line, about to compute, calls `prestart` first thing (before numpy loads) with
the thread count it was given: it puts the process's BLAS on one thread, as a participant computes
anyway, so the process stays single-threaded, and its pool forks its workers from it, with
everything loaded (pool.fork). Where that is not possible (not Linux), an explicit count N above 1
launches the N-1 workers at once, so that they import side by side with the command line; the pool
adopts them (`take`). This module imports nothing heavy (socket and subprocess load only when a
worker is launched). A launched worker that is never adopted exits with the process (its life pipe
closes).
"""

from __future__ import annotations

import os

from .. import environment, role
from ..interrupts import at_exit_now, signals_blocked, signals_held
from ..threads import available_cpus
from . import fork
from ..blas import THREAD_VARS

_PRESTARTED: list[Launched] = []
_PRESTARTING: list[bool] = []     # non-empty while prestart (the command line's alone) launches


class Launched:
    """A worker process just started: its process, our end of its socket, the write end of its
    life pipe and its bell (an eventfd, or -1)."""

    __slots__ = ("bell", "life", "proc", "sock")

    def __init__(self, proc, sock, life: int, bell: int):
        self.proc, self.sock, self.life, self.bell = proc, sock, life, bell

    def close(self) -> None:
        """Kill the process and close our ends (a launch nobody adopted)."""
        import subprocess

        try:
            self.proc.kill()
            self.proc.wait(timeout=5.0)
        except (OSError, subprocess.TimeoutExpired):  # pragma: no cover
            pass
        self.sock.close()
        for fd in (self.life, self.bell):
            if fd >= 0:
                os.close(fd)


def launch() -> Launched:
    """Start one worker with single-threaded BLAS: forked from this process where that is safe
    (the command line's, see pool.fork), else a fresh interpreter started isolated (ggtool.isolation).

    It gets a socket for messages and the read end of a pipe whose write end only this process
    holds: when we die, however we die, the worker's watchdog thread reads EOF and exits, even in
    the middle of a kernel. It waits for its first message (procs.spawn sends it).
    """
    import socket

    parent, child = socket.socketpair()
    life_r, life_w = os.pipe()
    bell = os.eventfd(0, os.EFD_SEMAPHORE | os.EFD_CLOEXEC) if hasattr(os, "eventfd") else -1
    env = {k: "1" for k in THREAD_VARS}
    env[environment.QUANT_THREADS.name] = "1"   # ggtool.quant's own thread pool: one thread per process
    env[environment.POOL_WORKER.name] = "1"
    try:
        # The worker inherits the signal mask: it starts with the ending signals blocked, so a Ctrl-C
        # or SIGTERM to the whole process group cannot kill it, or have it print a traceback, while
        # it is still starting; worker.main then ignores SIGINT and takes SIGTERM/SIGHUP on a thread
        # of its own. The caller handles them.
        with signals_blocked():
            if fork.possible():
                proc = fork.fork_worker(child.fileno(), life_r, bell, env)
            else:
                proc = _interpreter(child.fileno(), life_r, bell, env)
    except BaseException:
        parent.close()
        os.close(life_w)
        if bell >= 0:
            os.close(bell)
        raise
    finally:
        child.close()
        os.close(life_r)
    return Launched(proc, parent, life_w, bell)


def _interpreter(sock: int, life: int, bell: int, env: dict):
    """A fresh interpreter running ggtool.pool.worker.main on these descriptors (a Popen), isolated
    (ggtool.isolation: `python -I` in "/", this process's sys.path, the environment it needs)."""
    import subprocess

    from .. import isolation

    code = "from ggtool.pool.worker import main; main()"
    if role.COMMAND_LINE or _PRESTARTING:   # the command line's warnings are lines: so are its workers'
        code = "from ggtool.errors import warnings_as_lines; warnings_as_lines(); " + code
    return isolation.popen(code, str(sock), str(life), str(bell), env=env,
                           pass_fds=(sock, life, *([bell] if bell >= 0 else [])), stdin=subprocess.DEVNULL,
                           stdout=2, close_fds=True)


def take() -> Launched | None:
    """A prestarted worker still alive, or None."""
    while _PRESTARTED:
        w = _PRESTARTED.pop(0)
        if w.proc.poll() is None:
            return w
        w.close()
    return None


def discard() -> None:
    """Kill the prestarted workers nobody took."""
    while _PRESTARTED:
        _PRESTARTED.pop().close()


def prestart(n_threads: int = 0) -> None:
    """Ready this process, a command line about to compute with `n_threads` participants (0: not
    decided yet), for its workers, before its own imports: BLAS on one thread, and workers forked
    from it later; or, where it cannot fork, the n_threads-1 workers launched now (at most one per
    CPU). The pool adopts them. The command line calls it; a library's process never does."""
    if role.POOL_WORKER:
        return
    os.environ.update({k: "1" for k in THREAD_VARS})
    if fork.allow():
        return
    n = min(n_threads, available_cpus())
    at_exit_now(discard)   # a signal while the command line still starts: they stop with it
    _PRESTARTING.append(True)
    try:
        for _ in range(n - 1):
            with signals_held():   # started and known together: a signal now stops it (discard)
                _PRESTARTED.append(launch())
    except OSError:  # out of processes or descriptors: the pool will say so when it starts them
        discard()
    finally:
        _PRESTARTING.clear()
