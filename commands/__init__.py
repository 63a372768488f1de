"""The `ggtool` command line: a click group over the ggtool engine (installed as ggtool.commands).

Every subcommand lives in its own module here and only parses arguments, calls the engine and
formats. This group maps failures to the project's conventions: a GGToolError (or a DSL error)
is one `Error: ...` line on stderr and exit 1; usage errors exit 2; Ctrl-C exits 130; an
unexpected exception is one `Error: internal error ...` line (GGTOOL_DEBUG=1 shows the traceback).
"""

from __future__ import annotations

import errno
import importlib
import os

import click

from ggtool import __version__
from ggtool.errors import GGToolError

DEBUG_ENV = "GGTOOL_DEBUG"


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that are the user's input being wrong (reported as `Error: ...`, exit 1)."""
    types: list[type[BaseException]] = [GGToolError]
    try:
        from ggtool.dsl import DSLError
    except ImportError:
        pass
    else:
        types.append(DSLError)
    return tuple(types)


def one_line(e: Exception) -> str:
    """The error as one line. A DSL error's first line already says where (line, column); the
    source line and caret under it are dropped. Other multi-line messages are joined."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
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
        return importlib.import_module(f"{__name__}.{module}").command

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            ctx.exit(130)
        except _user_errors() as e:
            raise click.ClickException(one_line(e)) from None
        except OSError as e:
            if e.errno == errno.EPIPE:
                raise  # click's main() exits quietly on a broken pipe (`ggtool ... | head`)
            if os.environ.get(DEBUG_ENV):
                raise
            where = f"{e.filename}: " if e.filename else ""
            raise click.ClickException(f"{where}{e.strerror or e}") from None
        except MemoryError:
            raise click.ClickException("out of memory") from None
        except Exception as e:
            if os.environ.get(DEBUG_ENV):
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
bad data (one 'Error: ...' line), 2 bad usage, 130 interrupted. Run 'ggtool COMMAND --help'
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
)


def main() -> None:
    cli.main(prog_name="ggtool")
