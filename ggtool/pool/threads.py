"""How many participants by default. (A participant computes on one thread: see
ggtool.compute.single_threaded; workers get the same through their environment, procs.spawn.)"""

from __future__ import annotations

import os

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
