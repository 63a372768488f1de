"""The one progress context of the command line: a tqdm bar on stderr, shown only on a terminal and
never with --quiet, so that a pipe or a log file gets no control characters."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def progress_bar(total: int, desc: str, unit: str, *, scale: int | None = None, quiet: bool = False,
                 delay: float = 0.0, interval: float = 0.1, file=None) -> Iterator:
    """Yields a tqdm bar (`update(n)`, `write(line)`), or None when none is shown: `quiet`, or
    `file` (stderr) not a terminal. `scale` 1000 or 1024 shows counts with SI or binary prefixes;
    `delay` seconds pass before the bar first shows."""
    file = sys.stderr if file is None else file
    if quiet or not file.isatty():
        yield None
        return
    from tqdm import tqdm

    scaled = {"unit_scale": True, "unit_divisor": scale} if scale else {}
    bar = tqdm(total=total, unit=unit, desc=desc, file=file, leave=False, dynamic_ncols=True, delay=delay,
               mininterval=interval, **scaled)
    try:
        yield bar
    finally:
        bar.close()


@contextlib.contextmanager
def compute_progress(total: int, delay: float = 1.0, interval: float = 0.1, file=None):
    """A progress bar in nodes for a compute that lasts over `delay` seconds; yields the
    ggtool.compute.Progress to pass to the compute (or None: no bar). A thread reads which node
    participant 0 is at, so the compute itself pays nothing."""
    with progress_bar(total, "compute", " nodes", delay=delay, interval=interval, file=file) as bar:
        if bar is None:
            yield None
            return
        from ggtool.compute import Progress

        progress = Progress()
        stop = threading.Event()

        def watch():
            while not stop.wait(interval):
                if progress.node > bar.n:
                    bar.update(progress.node - bar.n)   # nodes before the current one are done

        watcher = threading.Thread(target=watch, name="ggtool-progress", daemon=True)
        watcher.start()
        try:
            yield progress
        finally:
            stop.set()
            watcher.join()
