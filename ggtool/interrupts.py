"""How the command line ends on SIGINT, SIGTERM and SIGHUP, from its first line to its last: one
line on stderr (`Interrupted.`, `Terminated.`, `Hangup.`) and exit status 128 + the signal (130,
143, 129), never a traceback, nothing left behind.

Light (os, signal, sys, time, nothing of ggtool's): ggtool.__main__ installs the handlers before numpy, click and the
commands load. What a signal does depends on how far the command has got:

- starting (imports, the group's arguments; until GGToolGroup.invoke runs the command): there is
  nothing to clean up but the workers launch.prestart may have started, so the line is said, they
  are stopped, and the process exits at once. (A KeyboardInterrupt raised in the middle of an
  import would unwind through code never written for it, and print a traceback.)
- running: `Interrupted`, a KeyboardInterrupt, is raised in the main thread, so that every
  clean-up written for Ctrl-C runs (workers stopped, shared memory unlinked, temporary files
  removed); GGToolGroup.invoke says the line (`report`). A second signal within AGAIN_AFTER
  seconds is ignored: the clean-up must not be cut short.
- ending (the command is over; its clean-up and the exit handlers run): the first signal is
  remembered, and `exit_status` makes it the exit status at the very end, with its line.

A signal the process was started with ignored (`nohup`) stays ignored. Only the command line
installs these handlers (ggtool.__main__, ggtool.commands.main); a library user's are left alone.
"""

from __future__ import annotations

import os
import signal
import sys
import time

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
_default_unraisable: list = []  # sys.unraisablehook as it was


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP, raised in the main thread. A KeyboardInterrupt, so that every
    clean-up that handles Ctrl-C (the worker pool, atomic output files, quantize's threads)
    handles the other two the same way."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def install(phase: str = RUNNING) -> None:
    """Handle SIGINT, SIGTERM and SIGHUP from now on (those not ignored), in `phase`; once per
    process (ggtool.__main__ installs them starting, ggtool.commands.main then finds them)."""
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
    global _signum, _raised_at
    if _phase == STARTING:
        _exit_at_once(signum)
    if _phase == RUNNING:
        now = time.monotonic()
        if _raised_at is not None and now - _raised_at < AGAIN_AFTER:
            return
        _raised_at = now
        if _signum is None:
            _signum = signum
        raise Interrupted(signum)
    if _signum is None:
        _signum = signum


def _exit_at_once(signum: int) -> None:
    try:
        os.write(2, (MESSAGES[signum] + "\n").encode())
        # the workers prestarted for --threads N (none while that module is still loading)
        discard = getattr(sys.modules.get("ggtool.pool.launch"), "discard", None)
        if discard is not None:
            discard()
    finally:
        os._exit(128 + signum)


def _unraisable(info) -> None:
    """Interrupted raised inside a finalizer (a weakref callback, __del__), which cannot pass it on:
    nothing printed (the exit status will say it), and the next signal is raised at once."""
    global _raised_at
    if isinstance(info.exc_value, Interrupted):
        _raised_at = None
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
