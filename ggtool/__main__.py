"""`ggtool` and `python -m ggtool`: the command line (the click layer lives in ggtool.commands).

Its first line installs the handlers of SIGINT, SIGTERM and SIGHUP (ggtool.interrupts), so that a
signal at any moment after it, in the ~0.1 s of imports too, ends it with one line and 128 + the
signal. Before anything heavy is imported, `compute` readies this process for its workers
(ggtool.pool.launch.prestart): BLAS on one thread, so that the pool can fork them from it once
numpy and ggtool are loaded (or, where it cannot fork, launches them now to import side by side
with this process). When
the command is over and the exit handlers have run (the pool stopped, outputs closed and renamed,
shared memory unlinked), the process ends at once: tearing down the interpreter's modules one by
one would add ~30 ms to every command and change nothing."""

import sys

from ggtool import interrupts  # light: signal, os, time


def main() -> None:
    interrupts.install(interrupts.STARTING)   # first: a signal from here on ends ggtool cleanly
    from ggtool.pool.launch import prestart

    prestart(sys.argv[1:])
    import ggtool.kernels

    ggtool.kernels.OWN_PROCESS = True   # numba loads without what ggtool has no use for (kernels.jit)
    from ggtool.commands import main as command_line

    try:
        command_line()
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    _exit_now(code)


def _exit_now(code: int) -> None:
    import atexit
    import os

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


if __name__ == "__main__":
    main()
