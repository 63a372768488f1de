"""The `ggtool` command line's click group over the ggtool engine (its entry point: ggtool.commands.console).

Every subcommand lives in its own module here and only parses arguments, calls the engine and
formats. This group maps failures to the project's conventions: a GGToolError (or a DSL error)
is one `Error: ...` line on stderr and exit 1; usage errors exit 2; an unexpected exception is
one `Error: internal error ...` line (GGTOOL_DEBUG=1 shows the traceback).

In a shell pipeline it behaves as a C tool does. SIGINT, SIGTERM and SIGHUP (ggtool.interrupts:
ggtool.commands.console installs the handlers first thing, `main` otherwise) raise `Interrupted`, a
KeyboardInterrupt, while the command runs, so every clean-up written for Ctrl-C runs: workers
stopped, shared memory unlinked, temporary output files removed; then one line on stderr and exit
128 + the signal (130, 143, 129); before and after, they end it the same way. A reader that
closes the pipe early (`| head`) ends the command quietly with exit 141 (128 + SIGPIPE), whatever
it was writing, stdout or stderr.
"""

from __future__ import annotations

import errno
import importlib
import io
import select
import signal
import sys

import click

from ggtool import __version__, environment, interrupts, role
from ggtool.errors import GGToolError, warnings_as_lines
from ggtool.interrupts import Interrupted  # noqa: F401  (its home; named here too)

DEBUG_ENV = environment.DEBUG.name

# -- signals and broken pipes ---------------------------------------------------------------------
BROKEN_PIPE_STATUS = 128 + signal.SIGPIPE


def install_signal_handlers() -> None:
    """SIGINT, SIGTERM and SIGHUP raise Interrupted (unless ggtool.commands.console installed them first:
    then they end the process at once until the command runs); a signal this process was started
    with ignored (`nohup`, a background job of a script) stays ignored."""
    interrupts.install(interrupts.RUNNING)


def _ending() -> None:
    """The command is over, one way or another: a further signal must not cut the clean-up short
    (it is remembered for the exit status, ggtool.interrupts), and the worker pool, idle or
    abandoned, is stopped at once, with the workers launched first thing that it never took (still
    importing, they would outlive this process by as long)."""
    interrupts.ending()
    pool = sys.modules.get("ggtool.pool")
    if pool is not None:
        pool.close_pool(graceful=False)
    launch = sys.modules.get("ggtool.pool.launch")
    if launch is not None:
        launch.discard()


def broken_std_streams() -> list[int]:
    """Of stdout and stderr (fds 1, 2), those that are pipes or sockets nobody reads any more."""
    broken = []
    for fd in (1, 2):
        try:
            p = select.poll()
            p.register(fd, select.POLLOUT)
            events = p.poll(0)
        except (OSError, ValueError):
            continue
        if any(ev & (select.POLLERR | select.POLLHUP) and not ev & select.POLLNVAL for _, ev in events):
            broken.append(fd)
    return broken


def _end_interrupted(e: KeyboardInterrupt) -> click.exceptions.Exit:
    _ending()
    return click.exceptions.Exit(interrupts.report(getattr(e, "signum", signal.SIGINT)))


def _end_broken_pipe(e: OSError) -> click.exceptions.Exit | None:
    """A reader closed stdout (or stderr) early: nothing to say, nowhere to say it. None when the
    broken pipe is not one of ours (then it is an error like any other)."""
    if e.errno != errno.EPIPE:
        return None
    broken = broken_std_streams()
    if not broken:
        return None
    _ending()
    for fd in broken:
        interrupts.silence(fd)
    return click.exceptions.Exit(BROKEN_PIPE_STATUS)


def os_line(e: OSError) -> str:
    """An OSError as one line: the file, then what went wrong."""
    where = f"{e.filename}: " if e.filename else ""
    return f"{where}{e.strerror or e}"


def one_line(e: Exception) -> str:
    """The error as one line. A DSL error's first line already says where (line, column); the
    source line and caret under it are dropped. Other multi-line messages are joined. Engine
    errors are worded with the command line's flags (wording.cli_message)."""
    from .wording import cli_message

    lines = [ln.strip() for ln in cli_message(e).splitlines() if ln.strip()]
    if type(e).__name__ == "DSLError":
        return lines[0] if lines else type(e).__name__
    return " ".join(lines) or type(e).__name__


class GGToolGroup(click.Group):
    """Subcommands are imported when used, so a tiny compute does not pay for quantize's imports."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(m.replace("_", "-") for m in SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = name.replace("-", "_")
        if module not in SUBCOMMANDS:
            return None
        return importlib.import_module(f"{__package__}.{module}").command

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        """The group's own options (`--help`, `--version`: printed here) under the same rules as
        the commands for signals and broken pipes."""
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except KeyboardInterrupt as e:
            raise _end_interrupted(e) from None
        except OSError as e:
            end = _end_broken_pipe(e)
            if end is None:   # `ggtool --help >&-` (commands/_streams.py)
                raise click.ClickException(os_line(e)) from None
            raise end from None

    def invoke(self, ctx: click.Context):
        interrupts.running()   # from here a signal raises Interrupted, and clean-ups run
        try:
            try:
                environment.check()   # a bad GGTOOL_* value is one line before any work
                rv = super().invoke(ctx)
                sys.stdout.flush()   # here, not at exit, where a broken pipe could no longer be handled
                return rv
            finally:
                interrupts.ending()   # a signal from here on is remembered, not raised
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt as e:   # Ctrl-C, SIGTERM, SIGHUP (Interrupted)
            raise _end_interrupted(e) from None
        except GGToolError as e:   # the user's input is wrong (a DSLError is one too)
            raise click.ClickException(one_line(e)) from None
        except OSError as e:
            end = _end_broken_pipe(e)   # `ggtool ... | head`
            if end is not None:
                raise end from None
            if environment.debug():
                raise
            raise click.ClickException(os_line(e)) from None
        except MemoryError:
            raise click.ClickException("out of memory") from None
        except Exception as e:
            if environment.debug():
                raise
            raise click.ClickException(f"internal error: {type(e).__name__}: {e} "
                                       f"(run with {DEBUG_ENV}=1 for the traceback)") from None


HELP = """GGML's context-mode machinery for the shell.

Load tensors from .npy files, GGUF files or inline JSON into a context, build a compute graph
from a small op DSL, plan it as ggml_graph_plan does, and compute it.

\b
Example (GGML's seed example):
  $ ggtool compute 'mul_mat(a, b)' \\
        --tensor a='[[2,8],[5,1],[4,2],[8,6]]' --tensor b='[[10,5],[9,9],[5,4]]'
  [[60,55,50,110],[90,54,54,126],[42,29,28,64]]

Shapes: numpy shape (d3, d2, d1, d0) is GGML ne = [d0, d1, d2, d3]; JSON and .npy data are in
numpy order, everything printed as ne is in GGML order.

Data goes to stdout, diagnostics to stderr, '-' means stdin/stdout. Exit status: 0 success, 1
bad data (one 'Error: ...' line), 2 bad usage, 130/143/129 interrupted (SIGINT, SIGTERM,
SIGHUP), 141 output pipe closed by its reader (as `| head` does). Run 'ggtool COMMAND --help'
for each command's options and examples.
"""


@click.group(cls=GGToolGroup, help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ggtool")
def cli():
    pass


# Subcommands: commands/<module>.py defines `command`, a click.Command whose name is the module's
# with "_" as "-". To add one, create the module and add ONE line here, e.g. "quantize",
SUBCOMMANDS = (
    "compute",
    "inspect_graph",
    "plan",
    "ops",
    "quantize",
    "inspect",
    "compare",
    "set_metadata",
    "tokenize",
    "detokenize",
    "generate",
    "perplexity",
    "imatrix",
    "sweep",
    "kernels",
)


def buffered_stdout() -> None:
    """Under PYTHONUNBUFFERED (or -u) stdout's byte layer is a raw file, whose write may write
    less than asked when the reader leaves mid-write, and TextIOWrapper ignores the count: the
    output would end short with exit 0. Give it a buffered layer, which writes all or raises
    (EPIPE: exit 141); text still goes through at once (write_through)."""
    out = sys.stdout
    raw = getattr(out, "buffer", None)
    if isinstance(out, io.TextIOWrapper) and isinstance(raw, io.RawIOBase):
        out.flush()
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw), encoding=out.encoding, errors=out.errors,
                                      line_buffering=out.line_buffering, write_through=True)


def main() -> None:
    install_signal_handlers()
    role.COMMAND_LINE = True   # this process is ggtool's: e.g. a mapped input truncated under us is one Error line
    warnings_as_lines()   # the engine's warnings: one `Warning: ...` line each
    buffered_stdout()
    code = 0
    try:
        cli.main(prog_name="ggtool")
    except SystemExit as e:
        code = e.code
    finally:
        _ending()   # no signal may cut short the exit's own clean-up (the pool, at exit)
    sys.exit(interrupts.exit_status(code))   # a signal while it ended ends it with 128 + the signal
