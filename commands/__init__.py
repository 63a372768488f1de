"""The `ggtool` command line (installed as ggtool.commands): `console` is the entry point of
`ggtool` and `python -m ggtool`; the click group is `group` (its names, `main`, `cli`, ..., are
reachable here too), and each subcommand is a module of its own.

This module stays light (ggtool.interrupts and ggtool.pool.launch, no click, no numpy), because
`console` runs before anything heavy is imported. Its first line installs the handlers of SIGINT,
SIGTERM and SIGHUP, so that a signal at any moment after it, in the ~0.1 s of imports too, ends
ggtool with one line and 128 + the signal. A standard stream the shell closed gets /dev/null in
its place (commands/_streams.py). Then it looks ahead at the arguments (`threads_asked`):
a `compute` readies this process for its workers (ggtool.pool.launch.prestart, given the thread
count): BLAS on one thread, so that the pool can fork them once numpy and ggtool are loaded (or,
where it cannot fork, launches them now to import side by side with this process). When the
command is over and the exit handlers have run (the pool stopped, outputs closed and renamed,
shared memory unlinked), the process ends at once: tearing down the interpreter's modules one by
one would add ~30 ms to every command and change nothing.
"""

from __future__ import annotations

import os
import sys

from ggtool import environment, interrupts  # light: os; signal, threading, time

from . import _streams  # light: os, io

THREADS_OPTION, THREADS_SHORT = "--threads", "-t"   # _common.threads_option's names


def console() -> None:
    """`ggtool`: the command line, from its first line to its exit status."""
    interrupts.install(interrupts.STARTING)   # first: a signal from here on ends ggtool cleanly
    _streams.adopt()                          # closed stdin, stdout, stderr: /dev/null holds their place
    n_threads = threads_asked(sys.argv[1:])
    if n_threads is not None:
        from ggtool.pool.launch import prestart

        prestart(n_threads)
    from .group import main

    try:
        main()
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    _exit_now(code)


COMPUTING = ("compute", "generate", "perplexity", "imatrix")   # the commands that compute on the worker pool


def threads_asked(argv: list[str]) -> int | None:
    """For a command line that computes (COMPUTING), the thread count it gives (its --threads N,
    else GGTOOL_THREADS), 0 when it gives none; None for any other command line. Read before click
    loads, so only a clear case counts: anything odd is 0, left for click to judge."""
    if not argv or argv[0] not in COMPUTING:
        return None
    if "--help" in argv or "-h" in argv:
        return 0
    value = environment.THREADS.text() or ""
    args = iter(argv[1:])
    for a in args:
        if a == "--":
            break
        if a in (THREADS_OPTION, THREADS_SHORT):
            value = next(args, "")
        elif a.startswith(THREADS_OPTION + "="):
            value = a[len(THREADS_OPTION) + 1:]
        elif a.startswith(THREADS_SHORT) and a[2:].isdigit():
            value = a[2:]
    return int(value) if value.isdigit() else 0


def _exit_now(code: int) -> None:
    import atexit

    if _observed():   # a profiler, debugger or coverage tool reports at exit
        sys.exit(interrupts.exit_status(code))
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a reader that left: the command has said what it had to
            pass
    os._exit(interrupts.exit_status(code, final=True))   # a signal while ending: its line and status


def _observed() -> bool:
    """Whether a tool watches this process: one set with sys.setprofile/sys.settrace, or one of
    sys.monitoring's (Python 3.12+), which is where cProfile and coverage's sysmon core live now."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return True
    mon = getattr(sys, "monitoring", None)
    return mon is not None and any(mon.get_tool(i) is not None
                                   for i in (mon.DEBUGGER_ID, mon.COVERAGE_ID, mon.PROFILER_ID))


def __getattr__(name: str):
    """The click group's names (`main`, `cli`, `SUBCOMMANDS`, ...), loaded on first use."""
    if name.startswith("__") or name == "group":   # not loaded yet: the import system asks first
        raise AttributeError(name)
    import importlib

    group = importlib.import_module(".group", __name__)
    try:
        return getattr(group, name)
    except AttributeError:
        raise AttributeError(f"module 'ggtool.commands' has no attribute {name!r}") from None
