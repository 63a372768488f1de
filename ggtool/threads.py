"""The thread policy, one home for every layer (the pool, the quantizers, the command line): the
default-thread rule (`default_threads`), and a participant of a compute on one thread
(`single_threaded`).

Light (os; ctypes only when BLAS is limited): the command line asks it before numpy loads. A
count given explicitly (the command line's option, `WorkerPool(n)`, `quant.set_threads(n)`)
always wins over the default.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from . import blas, environment

THREADS_ENV = environment.THREADS.name
# The arithmetic each participant must bring before a default adds it: a worker process costs
# ~0.5 s (start, numba and the kernels loaded, its share of the weights repacked) and saves its
# share of the compute (the quantized kernels run ~20-40 GFLOP/s a participant, whole graph). On 2
# shared cores gemma-3-270m was faster on one thread at 13, 30, 64 and 128 tokens (7-70 GFLOP;
# bench/bench_coldstart.py --threads 1,2): so a participant for every 40 GFLOP, at least one.
PARTICIPANT_MIN_FLOPS = 4 * 10**10


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; os.cpu_count() where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not Linux)
        return os.cpu_count() or 1


def env_threads(name: str) -> int | None:
    """A thread count from the environment variable `name` (None if unset or empty); anything but a
    positive integer is an error, never silently the default (ggtool.environment reads it)."""
    return environment.read(name)


def default_threads(flops: int | None = None) -> int:
    """GGTOOL_THREADS if set, else the CPUs this process may use; but for a compute of `flops`
    arithmetic, only as many as bring PARTICIPANT_MIN_FLOPS each (1, this process alone, below
    that): a smaller share costs more to start than it saves."""
    n = env_threads(THREADS_ENV)
    if n is not None:
        return n
    cpus = available_cpus()
    if flops is not None:
        return max(1, min(cpus, flops // PARTICIPANT_MIN_FLOPS))
    return cpus


_single = 0   # how many single_threaded blocks are running (ggtool.quant asks `one_thread`)


@contextmanager
def single_threaded():
    """A participant is one thread: BLAS and ggtool.quant's array functions on one thread
    meanwhile. Parallelism is the pool's job, and the same thread counts give the same bits."""
    global _single
    with blas.limit(1):
        _single += 1
        try:
            yield
        finally:
            _single -= 1


def one_thread() -> bool:
    """Whether a participant computes now (inside `single_threaded`): the quantizers then use one thread."""
    return _single > 0
