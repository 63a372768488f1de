"""`ggtool kernels`: the compiled kernels in the cache for this CPU, and compiling them all ahead."""

from __future__ import annotations

import sys
import time

import click

from ._common import log, write_text
from ._json import document
from ._progress import progress_bar
from ._table import table

HELP = """Show which of ggtool's compiled kernels are in the cache for this CPU, or compile them all
now (--compile).

ggtool's kernels (the dot product of each quantized type, the quantizers of activations, the
compiled graph runner and its node kernels) are compiled by numba for the CPU they run on, once,
and kept in ggtool's cache (~/.cache/ggtool, or GGTOOL_CACHE_DIR). A run compiles what it needs
as it goes, and its first run is slower for it: 3-4x a cached run of a generation on two cores.
--compile compiles every kernel ahead, one process per free CPU (~30 s on two cores, ~55 s of
CPU in all), so that the first run of any model is as fast as the next but for repacking its
weights. The README's set-up does it right after installing.

\b
Example:
  $ ggtool kernels --compile
  compiling 39 kernels for this CPU in 2 processes...
  39 of 39 kernels ready (29.8 s) in /home/me/.cache/ggtool/numba/kernels-40fdf8877551
  $ ggtool kernels dot:q4
  dot:q4_0  ready
  dot:q4_1  ready
  dot:q4_K  ready

PATTERN keeps the kernels whose name contains it (with --compile too). A kernel that does not
compile is marked failed with numba's words, and runs keep its numpy twin (or Python's step) as
before; --compile tries it again, and exits 1 if any kernel is not ready after it. Interrupted,
--compile keeps every kernel it finished.
"""


@click.command("kernels", help=HELP, short_help="Show the compiled kernels, or compile them all ahead.")
@click.argument("pattern", required=False)
@click.option("--compile", "compile_", is_flag=True,
              help="Compile every kernel that is not ready yet (failed ones again), then say how many are.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Processes compiling side by side (default: the free CPUs).")
@click.option("--json", "as_json", is_flag=True,
              help='JSON on stdout: {"cache", "kernels": [{"name", "state", "why"}, ...]}.')
@click.option("--quiet", "-q", is_flag=True, help="--compile says nothing but errors (no progress, no summary).")
def command(pattern, compile_, jobs, as_json, quiet):
    from ggtool.compiling import ahead_of_time as aot

    folder = aot.cache_folder()     # first: naming the kernels loads numba, which is then given a folder
    names = [n for n in aot.kernel_names() if pattern is None or pattern.lower() in n.lower()]
    if not names:
        raise click.ClickException(f"no kernel name contains {pattern!r}; see ggtool kernels")
    states = _compile(aot, names, jobs, quiet, folder) if compile_ else aot.kernel_states(names)
    if as_json:
        write_text([document({"cache": folder, "kernels": [{"name": s.name, "state": s.state, "why": s.why}
                                                           for s in states]})])
    elif not compile_:
        write_text(line.rstrip() + "\n" for line in table([[s.name, s.state, s.why] for s in states]))
    not_ready = [s for s in states if s.state != aot.READY]
    if compile_ and not_ready:
        first = not_ready[0]
        raise click.ClickException(
            f"{len(not_ready)} of {len(states)} kernels not ready: {first.name} {first.state}"
            + (f" ({first.why})" if first.why else "") + ("; see ggtool kernels" if len(not_ready) > 1 else ""))


def _compile(aot, names, jobs, quiet, folder):
    t0 = time.monotonic()
    with progress_bar(len(names), "compile", " kernels", quiet=quiet) as bar:
        def say(line: str) -> None:
            if quiet:
                return
            if bar is not None:
                bar.write(line, file=sys.stderr)
            else:
                log(line)

        def on_start(todo, processes):
            if bar is not None:
                bar.reset(total=len(todo))
            if todo:
                say(f"compiling {len(todo)} kernel{'s' * (len(todo) != 1)} for this CPU in {processes} "
                    f"process{'es' * (processes != 1)}...")

        def on_done(state):
            if bar is not None:
                bar.update(1)
            if state.state != aot.READY:
                say(f"{state.name}: {state.state}" + (f" ({state.why})" if state.why else ""))

        states = aot.compile_kernels(names, jobs=jobs, on_start=on_start, on_done=on_done)
    if not quiet and all(s.state == aot.READY for s in states):     # else the error says how many are not
        log(f"{len(states)} of {len(states)} kernels ready ({time.monotonic() - t0:.1f} s) in {folder}")
    return states
