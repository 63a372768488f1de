"""Thread counts: how many participants by default, and the caller as one thread while it takes part.

The caller's own BLAS is limited to one thread for the duration of each pooled compute
(`ggtool.blas.limit`), and ggtool.quant's thread pool too; workers get the same through their
environment when they start (see procs.spawn).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from .. import blas
from ..errors import GGToolError


def default_threads() -> int:
    """GGTOOL_THREADS if set, else the cores this process may run on."""
    v = os.environ.get("GGTOOL_THREADS", "").strip()
    if v:
        try:
            n = int(v)
        except ValueError:
            n = 0
        if n < 1:
            raise GGToolError(f"GGTOOL_THREADS must be a positive integer, got {v!r}")
        return n
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


@contextmanager
def _single_threaded():
    """The caller is one participant of N: one BLAS thread, one ggtool.quant thread, meanwhile."""
    quant = sys.modules.get("ggtool.quant")
    saved = getattr(quant, "_threads", None)
    with blas.limit(1):
        if quant is not None:
            quant.set_threads(1)
        try:
            yield
        finally:
            if quant is not None:
                quant.set_threads(saved)
