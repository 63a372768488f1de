"""The one default-thread rule, for every layer (the pool, the quantizers, the command line).

Light (os only): the command line asks it before numpy loads. A count given explicitly (a
`--threads`, `WorkerPool(n)`, `quant.set_threads(n)`) always wins over it.
"""

from __future__ import annotations

import os

from .errors import GGToolError

THREADS_ENV = "GGTOOL_THREADS"
# Below this much arithmetic, starting worker processes (~0.3 s) costs more than they save.
AUTO_POOL_MIN_FLOPS = 10**10


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; os.cpu_count() where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not Linux)
        return os.cpu_count() or 1


def default_threads(flops: int | None = None) -> int:
    """GGTOOL_THREADS if set, else the CPUs this process may use; but 1 (this process alone) for a
    compute of `flops` arithmetic too small to gain from worker processes."""
    v = os.environ.get(THREADS_ENV, "").strip()
    if v:
        try:
            n = int(v)
        except ValueError:
            n = 0
        if n < 1:
            raise GGToolError(f"{THREADS_ENV} must be a positive integer, got {v!r}")
        return n
    if flops is not None and flops < AUTO_POOL_MIN_FLOPS:
        return 1
    return available_cpus()
