"""Which CPU each participant of a compute wakes up on. (How many participants by default is
ggtool.threads' rule; a participant computes on one thread: see ggtool.threads.single_threaded,
and workers get the same through their environment.)"""

from __future__ import annotations

import ctypes
import functools
import os

from .. import environment


def placement(nth: int) -> list[int] | None:
    """A distinct CPU for each participant of a compute, on distinct cores while there are enough
    (SMT siblings last), starting with the caller's current CPU; None when there are more
    participants than CPUs or GGTOOL_PLACE=0. See `wake_on`."""
    if not environment.place():
        return None
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not Linux)
        return None
    if nth > len(allowed):
        return None
    return spread(nth, allowed, _current_cpu(), _core)


def spread(nth: int, allowed: list[int], here: int | None, core_of) -> list[int]:
    """`nth` of the CPUs `allowed` (sorted), from `here` (the caller's CPU; None or a CPU not
    allowed: from the first) on: one CPU per core first (`core_of(cpu)` names its core), then the
    SMT siblings."""
    start = allowed.index(here) if here in allowed else 0
    rotated = allowed[start:] + allowed[:start]
    firsts, seconds, cores = [], [], set()
    for cpu in rotated:
        core = core_of(cpu)
        (seconds if core in cores else firsts).append(cpu)
        cores.add(core)
    return (firsts + seconds)[:nth]


@functools.cache
def _core(cpu: int) -> str:
    """The CPUs sharing `cpu`'s core (its SMT siblings, itself included), as sysfs lists them."""
    for name in ("core_cpus_list", "thread_siblings_list"):
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/{name}") as f:
                return f.read().strip()
        except OSError:
            continue
    return str(cpu)


_sched_getcpu = None


def _current_cpu() -> int | None:
    global _sched_getcpu
    if _sched_getcpu is None:
        try:
            _sched_getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
            _sched_getcpu.restype, _sched_getcpu.argtypes = ctypes.c_int, []
        except (OSError, AttributeError):  # pragma: no cover (no glibc)
            _sched_getcpu = False
    return _sched_getcpu() if _sched_getcpu else None


def wake_on(pid: int, cpu: int) -> None:
    """Make a sleeping worker wake up on `cpu`; it widens its mask again as soon as it runs (`Release`).

    Left to itself, Linux often wakes a worker on the caller's CPU while the other core idles, and
    one of them waits milliseconds for the load balancer (f32 mul_mat K=N=4096 M=64 on 2
    participants: 85-99 GFLOP/s, 103-122 placed). Only the wake is placed: a participant pinned for
    the whole compute cannot escape a busy thread that shares its CPU (the caller's own OpenBLAS
    threads, spinning after a numpy call, made a 159-node graph 6x slower that way).
    """
    try:
        os.sched_setaffinity(pid, {cpu})
    except OSError:
        pass  # the worker is gone: the caller finds out at its next barrier


class Release:
    """A worker's side of `wake_on`: back to the mask it started with."""

    def __init__(self):
        self.home = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None

    def __call__(self) -> None:
        if self.home is not None:
            try:
                os.sched_setaffinity(0, self.home)
            except OSError:  # pragma: no cover (a CPU of the mask went offline): stay where we are
                pass
