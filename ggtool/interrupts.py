"""How the command line ends on SIGINT, SIGTERM and SIGHUP, from its first line to its last: one
line on stderr (`Interrupted.`, `Terminated.`, `Hangup.`) and exit status 128 + the signal (130,
143, 129), never a traceback, nothing left behind.

Light (os, signal, sys, threading, time, nothing of ggtool's): the command line installs the handlers before numpy,
click and the commands load. What a signal does depends on how far the command has got:

- starting (imports, the group's arguments; until GGToolGroup.invoke runs the command): there is
  nothing to clean up but what `at_exit_now` was given (the workers pool.launch.prestart may have
  started), so the line is said, that is stopped, and the process exits at once. (A KeyboardInterrupt raised in the middle of an
  import would unwind through code never written for it, and print a traceback.)
- running: `Interrupted`, a KeyboardInterrupt, is raised in the main thread, so that every
  clean-up written for Ctrl-C runs (workers stopped, shared memory unlinked, temporary files
  removed); GGToolGroup.invoke says the line (`report`). A second signal within AGAIN_AFTER
  seconds is ignored: the clean-up must not be cut short. A signal that comes while the main
  thread imports is raised once the import is over (`_defer`): a C extension's import prints
  what is raised inside it and fails with an ImportError.
- ending (the command is over; its clean-up and the exit handlers run): the first signal is
  remembered, and `exit_status` makes it the exit status at the very end, with its line.

A signal the process was started with ignored (`nohup`) stays ignored. Only the command line
installs these handlers (ggtool.commands); a library user's are left alone.

Any layer may hold the ending signals around a step that must complete as a whole (`signals_held`:
a shared-memory segment made and recorded, a worker started and known, an output renamed), or
block them while it starts a process (`signals_blocked`); `process_alive` tells what a dead
process left behind (segments and temporary files named after its pid).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

# The signals that end a process (Ctrl-C, `kill`/`timeout`, a closed terminal).
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
MESSAGES = {signal.SIGINT: "Interrupted.", signal.SIGTERM: "Terminated.", signal.SIGHUP: "Hangup."}
STARTING, RUNNING, ENDING = "starting", "running", "ending"
# After a signal raised Interrupted, the next ones are ignored for this long (the clean-up runs),
# then raised again (should the first have been lost: swallowed by code that caught it).
AGAIN_AFTER = 5.0

_phase: str | None = None       # None: the handlers are not installed
_signum: int | None = None      # the signal that ends the command
_said = False                   # its line is on stderr
_raised_at: float | None = None
_interrupted = False            # Interrupted has been raised: the command is on its way out
_default_unraisable: list = []  # sys.unraisablehook as it was
_exit_now_hooks: list = []      # what a signal while starting stops before the process exits (at_exit_now)


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP, raised in the main thread. A KeyboardInterrupt, so that every
    clean-up that handles Ctrl-C (the worker pool, atomic output files, quantize's threads)
    handles the other two the same way."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def install(phase: str = RUNNING) -> None:
    """Handle SIGINT, SIGTERM and SIGHUP from now on (those not ignored), in `phase`; once per
    process (ggtool.commands.console installs them starting, ggtool.commands.main then finds them)."""
    global _phase
    if _phase is not None:
        return
    _phase = phase
    for sig in ENDING_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _handle)
    _default_unraisable[:] = [sys.unraisablehook]
    sys.unraisablehook = _unraisable


def running() -> None:
    """The command itself runs: a signal raises Interrupted."""
    global _phase
    if _phase == STARTING:
        _phase = RUNNING


def ending() -> None:
    """The command is over: a signal is remembered for the exit status, no longer raised."""
    global _phase
    if _phase is not None:
        _phase = ENDING


def _handle(signum: int, frame) -> None:
    global _signum, _raised_at, _interrupted
    if _phase == STARTING:
        _exit_at_once(signum)
    if _phase == RUNNING:
        now = time.monotonic()
        if _raised_at is not None and now - _raised_at < AGAIN_AFTER:
            return
        if _signum is None:
            _signum = signum
        if _importing(frame) and _defer(signum):
            return
        _deferred.clear()
        _raised_at = now
        _interrupted = True
        raise Interrupted(signum)
    if _signum is None:
        _signum = signum


# -- a signal in the middle of an import ----------------------------------------------------------
# An exception raised inside an import that a C extension makes (numpy's import_array in numba's,
# numpy.linalg's, ...) is printed there with its traceback and replaced by an ImportError; so a
# signal that comes while the main thread imports is raised again once the import is over (or
# after IMPORT_GRACE seconds, should an import never end).
IMPORT_GRACE = 2.0
_IMPORT_FILES = frozenset({"<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>"})
_deferred: list[int] = []       # the signal waiting for an import to end (at most one)


def _importing(frame) -> bool:
    """Whether `frame` (the main thread's, as a handler sees it) is inside an import."""
    while frame is not None:
        if frame.f_code.co_filename in _IMPORT_FILES:
            return True
        frame = frame.f_back
    return False


def _defer(signum: int) -> bool:
    """Send `signum` to the main thread again once it is out of its imports: False (raise now) if
    the grace is over. A raw thread (not threading's): the handler may have interrupted the main
    thread inside threading's own locks."""
    import _thread
    if _deferred:
        if _deferred[0] == -1:      # the grace is over: raise, import or not
            _deferred.clear()
            return False
        return True
    _deferred.append(signum)
    main = threading.main_thread().ident

    def watch():
        end = time.monotonic() + IMPORT_GRACE
        while True:
            time.sleep(0.002)
            frame = sys._current_frames().get(main)
            if frame is None:
                return              # the main thread is gone: nothing to interrupt
            if time.monotonic() > end:
                _deferred[:] = [-1]
                break
            if not _importing(frame):
                _deferred.clear()
                break
        del frame
        try:
            signal.pthread_kill(main, signum)
        except (OSError, ValueError):
            pass

    _thread.start_new_thread(watch, ())
    return True


def received() -> Interrupted | None:
    """The Interrupted of an ending signal this process got while running and has not raised yet (held
    back while the main thread imported: ``_defer``), marked raised as ``_handle`` marks it; else None.
    A worker pool's caller asks before it reports a worker that died: the worker may have ended on
    the same signal (its grace over) before the signal could be raised here."""
    global _raised_at, _interrupted
    if _phase != RUNNING or _signum is None or _interrupted:
        return None
    _raised_at = time.monotonic()
    _interrupted = True
    return Interrupted(_signum)


def at_exit_now(fn) -> None:
    """Have a signal while the command is starting call `fn()` before the process exits at once
    (pool.launch.prestart: the workers it started, still importing, must not outlive it)."""
    if fn not in _exit_now_hooks:
        _exit_now_hooks.append(fn)


def _exit_at_once(signum: int) -> None:
    try:
        os.write(2, (MESSAGES[signum] + "\n").encode())
        for fn in list(_exit_now_hooks):
            fn()
    finally:
        os._exit(128 + signum)


def _unraisable(info) -> None:
    """Interrupted raised inside a finalizer (a weakref callback, __del__), which cannot pass it on:
    nothing printed (the exit status will say it), and the next signal is raised at once. After
    Interrupted was raised, any finalizer's error is nothing printed either: it is the signal's
    doing, an object it cut short in its __init__ failing in its __del__ (CI saw llvmlite's
    `OutputString.__del__` say "no attribute '_owned'" after `Terminated.`)."""
    global _raised_at
    if isinstance(info.exc_value, Interrupted):
        _raised_at = None
        return
    if _interrupted:
        return
    (_default_unraisable or [sys.__unraisablehook__])[0](info)


def report(signum: int) -> int:
    """Say the line of the signal that ends the command (once); returns its exit status."""
    global _signum, _said
    _signum = signum
    if not _said:
        _said = True
        say(MESSAGES[signum])
    return 128 + signum


def exit_status(code, final: bool = False):
    """The exit status: `code`, unless a signal came that no line has reported yet (one while the
    command was ending, or one lost in a finalizer): then its line is said and 128 + it returned.
    `final`: the process exits right after, so the signals are blocked first and one already on its
    way counted (pthread_sigmask runs the handlers of those caught meanwhile)."""
    global _signum
    if _phase is None:
        return code
    if final:
        ending()
        signal.pthread_sigmask(signal.SIG_BLOCK, ENDING_SIGNALS)
        pending = signal.sigpending() & set(ENDING_SIGNALS)
        if pending and _signum is None:
            _signum = min(pending)
    if _signum is not None and not _said:
        return report(_signum)
    return code


def silence(fd: int) -> None:
    """Point fd (1 or 2) at /dev/null: what is still buffered for it, flushed at exit, goes there
    instead of failing again (which would change the exit status to 120)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except OSError:
        pass


def say(message: str) -> None:
    """One line on stderr, if stderr can still take it (after SIGHUP the terminal may be gone)."""
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        silence(2)
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        silence(1)


# -- holding the ending signals, in any process ---------------------------------------------------
@contextmanager
def signals_held():
    """Hold SIGINT, SIGTERM and SIGHUP (their Python handlers) until the block is over, so that it
    completes or fails as a whole; a signal that came meanwhile is raised again afterwards.

    (Masking the signal would not do: any other thread of the process, a BLAS thread say, may take
    it, and Python runs the handler in the main thread at its next bytecode.) Signals whose
    disposition is not a Python handler (default, ignored) are left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Python runs signal handlers in the main thread only
        return
    held: list[int] = []
    saved = {}
    for sig in ENDING_SIGNALS:
        h = signal.getsignal(sig)
        if callable(h):
            saved[sig] = signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, h in saved.items():
            signal.signal(sig, h)
        for sig in dict.fromkeys(held):
            signal.raise_signal(sig)


@contextmanager
def signals_blocked():
    """Block the ending signals in this thread for the block: a process started meanwhile inherits
    the mask, and so is safe from a signal to the whole process group (a terminal's Ctrl-C or
    hangup, `timeout`) until it unblocks them or handles them itself."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ENDING_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists (one of another user counts), for what a dead process left
    behind: shared-memory segments and temporary files named after their creator's pid. Anything
    that is not a pid (0, -1: os.kill would signal a group) counts as alive: nothing is removed."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):   # another user's process; a number too large to be one
        return True
    return True
