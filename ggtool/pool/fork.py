"""Workers forked from the command line's process instead of started as fresh interpreters.

A fresh interpreter spends 0.1-0.2 s starting Python and importing numpy and ggtool before it can
compute (longer on a busy 2-core machine, where it competes with the command line doing the same),
and the command line waits for it at its first node. By the time the command line opens its pool
it has loaded all of that itself, and it is in a state known to fork safely: one thread (its BLAS
has been on one thread since start-up, see launch.prestart), no lock held by another thread,
nothing of a user's. So there a worker is a fork: ready within a millisecond, sharing the loaded
modules' memory copy-on-write, with the caller's import hooks and sys.path as they are.

Anywhere else (a library user's process may hold threads, locks, a GPU context, ...), and in the
command line once it has grown a thread, workers are fresh interpreters (launch.launch).
"""

from __future__ import annotations

import gc
import os
import select
import signal
import sys
import threading

from .. import environment

_ALLOWED_PID: list[int] = []   # the command line's pid, once launch.prestart has made it fork-safe


def allow() -> bool:
    """Let this process fork its workers (launch.prestart, for the command line only); False where
    it cannot (not Linux) or must not (GGTOOL_FORK=0: fresh interpreters, as before)."""
    if not environment.fork():
        return False
    if sys.platform.startswith("linux") and hasattr(os, "fork"):
        _ALLOWED_PID[:] = [os.getpid()]
        return True
    return False


def possible() -> bool:
    """Whether a worker can be forked from this process now: allowed, and one thread (Python's and
    the kernel's count: a BLAS or numba thread is not a Python thread)."""
    if _ALLOWED_PID != [os.getpid()] or threading.active_count() != 1:
        return False
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


class ForkedProcess:
    """The parts of subprocess.Popen the pool uses (pid, poll, wait, kill), for a forked worker.
    `wait` sleeps on a pidfd where there is one, where Popen polls."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:   # reaped elsewhere: gone, its status unknown (as Popen says)
                self.returncode = 0
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            _sleep_until_exit(self.pid, timeout, lambda: self.poll() is not None)
            if self.poll() is None:
                import subprocess

                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _sleep_until_exit(pid: int, timeout: float | None, exited) -> None:
    """Sleep until process pid (our child) has ended or `timeout` seconds have passed: on a pidfd,
    or (Linux < 5.3) polling `exited()`."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):   # pragma: no cover (no pidfd; or gone: exited() says so)
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while not exited() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.002)
        return
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)


def fork_worker(sock: int, life: int, bell: int, env: dict[str, str]) -> ForkedProcess:
    """Fork a worker that runs ggtool.pool.worker.main on these descriptors (the child's ends:
    every other descriptor is closed in it) with `env` added to its environment. The caller's
    ending signals must be blocked (interrupts.signals_blocked): the child inherits the mask."""
    from . import worker  # loaded here, so the child has it

    for stream in (sys.stdout, sys.stderr):   # nothing buffered here is written twice
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    pid = os.fork()
    if pid:
        return ForkedProcess(pid)
    code = 1
    try:
        gc.freeze()   # the caller's objects: never traversed here (no copy-on-write for nothing)
        _descriptors(keep=(sock, life, bell))
        os.environ.update(env)
        from .. import role

        role.POOL_WORKER = True
        worker.main(sock, life, bell)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _descriptors(keep) -> None:
    """stdin from /dev/null, stdout to stderr (a worker's output must not reach the command's
    data), and every descriptor but these and `keep` closed."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    lo = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(lo, fd)
        lo = fd + 1
    os.closerange(lo, os.sysconf("SC_OPEN_MAX"))
