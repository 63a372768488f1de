"""How participants wait for each other: the spin bound of the compiled runner's barrier, and the
Python path's barrier and per-participant loop (the same code in the caller and the workers).

The compiled runner (``ggtool.runner``, ``ggtool.kernels.runner``) runs a graph's steps with GGML's
barrier in compiled code; `spin_ns` is how long its waiters spin before they sleep, from the number
of participants and the cores free for them. Where the runner is not loaded (a first-ever run, whose
kernels are compiled in the background for the next; numba missing) the graph runs from Python:
`programs` turns a plan into what each participant runs, and `participate` runs it, with a
`Barrier` between segments of nodes. Both meet in the pool's control segment (its layout:
wire.ABORT, wire.arrivals, wire.at_node).
"""

from __future__ import annotations

import os
import time

import numpy as np

from ..compute import Work, run_node
from ..errors import ComputeError
from ..runner import CHECK_EVERY, Aborted  # noqa: F401 - the pool's names for them
from ..threads import free_cpus as free_cpus_now
from .wire import ABORT, arrivals, at_node

_SPIN = 50             # barrier: busy polls before yielding the CPU (short: with more participants than
                       # free cores, spinning only delays the participant we wait for)
_YIELD_FOR = 0.002     # seconds of sched_yield polling before sleeping
_MAX_SLEEP = 0.001     # longest sleep between polls

_BARRIER = (-1, 0)

# The compiled barrier's spin before a waiter sleeps on the futex. Where every participant has a core
# of its own, a waiter spins as GGML's threads do (which never sleep) for long enough that a step's
# waits almost never reach the futex (a sleeper costs the last arrival a system call, and itself a
# wake-up of 5-50 us); where the machine has fewer free cores than participants, a spinning waiter
# takes the core the participant it waits for needs, so it spins about what a sleep and its wake-up
# cost (the ski rental again: never more than twice the better choice). Measured on a 2-core AVX2 VM
# with one other process busy, 2 participants (docs/engine.md, "An AVX2-only host, 2 cores"): a 2 us
# spin decoded the small llama at 123 tokens/s, 10-35 us at 169-175, 200 us at 127 (67 lingering).
SPIN_FREE_NS = 200_000
SPIN_BUSY_NS = 20_000
# How long a worker that has just answered a compute spins for the caller's next message before it
# sleeps on its bell (wire.rung), where every participant has a core: a decode step's caller spends
# 0.3-1 ms between computes (sampling, the next step's inputs), and a worker woken from its sleep
# starts 0.1-0.2 ms after the caller. GGML's threads poll for the next graph the same way.
LINGER_NS = 3_000_000


def free_cpus() -> int:
    """The CPUs no other process is busy on: the thread rule's reading (``threads.free_cpus``: the
    median of the last five readings of /proc/loadavg, one at most every 0.2 s). One read alone often
    counted a task that ran for a moment (a shell, a monitor): a 2-thread decode then slept at every
    barrier (~25% slower on a 2-core machine)."""
    return free_cpus_now()


def spin_ns(nth: int) -> int:
    """How long a waiter at the compiled barrier spins before it sleeps (see SPIN_FREE_NS)."""
    return SPIN_FREE_NS if nth <= free_cpus() else SPIN_BUSY_NS


def linger_ns(spin: int) -> int:
    """How long a worker spins for the next message after a compute whose barrier spins `spin` ns:
    LINGER_NS where every participant has a core (the barrier's long spin), else not at all."""
    return LINGER_NS if spin >= SPIN_FREE_NS else 0


class Barrier:
    """Reusable barrier without atomics: participant i only ever writes its own, increasing arrival
    counter; the barrier of generation g is passed once every participant's counter reaches g.
    (Aligned 8-byte stores are atomic and stores are seen in order on x86-64 / TSO.)"""

    __slots__ = ("check", "gen", "mine", "mv", "others")

    def __init__(self, mv: memoryview, ith: int, nth: int, gen: int, check):
        self.mv, self.gen, self.check = mv, gen, check
        self.mine = arrivals(ith)
        self.others = [arrivals(j) for j in range(nth) if j != ith]

    def __call__(self) -> None:
        g = self.gen = self.gen + 1
        mv = self.mv
        mv[self.mine] = g
        for s in self.others:
            if mv[s] < g:
                self._wait(s, g)

    def _wait(self, s: int, g: int) -> None:
        mv = self.mv
        for _ in range(_SPIN):
            if mv[s] >= g:
                return
        start = time.monotonic()
        next_check = start + CHECK_EVERY
        pause = 0.0
        while mv[s] < g:
            if mv[ABORT]:
                raise Aborted
            now = time.monotonic()
            if now >= next_check:
                self.check()
                next_check = now + CHECK_EVERY
            if now - start < _YIELD_FOR:
                os.sched_yield()
            else:
                pause = min(_MAX_SLEEP, pause * 2 or 2e-5)
                time.sleep(pause)


def participate(nodes, prog, ith: int, work: Work, mv: memoryview, progress=None):
    """Run this participant's program; returns None, or (node index, message) if a kernel failed.
    `progress` (a ggtool.compute.Progress, participant 0's) follows the node being computed."""
    i = -1
    at = at_node(ith)
    try:
        with np.errstate(all="ignore"):  # inf and NaN are results, as in GGML
            for i, n in prog:
                if i < 0:
                    work.barrier()
                else:
                    mv[at] = i
                    if progress is not None:
                        progress.node = i
                    run_node(i, nodes[i], ith if n > 1 else 0, n, work)
    except ComputeError as e:
        mv[ABORT] = 1
        return i, str(e)
    return None


def programs(plan, nth: int):
    """Per-participant programs: (node index, nth for the call) or a barrier.

    Nodes that split (the plan's split "all", as GGML splits them whatever their n_tasks) run on
    every participant with (ith, nth); runs of nodes of participant 0 alone (split "one") run on it
    with (0, 1). A barrier separates consecutive segments and follows a final multi-participant
    node; no-op nodes (views, NONE, empty tensors: split "-") are left out.
    """
    from ..plan import SPLIT_ALL, SPLIT_NONE

    segs: list = []
    for i, p in enumerate(plan.nodes):
        if p.split == SPLIT_NONE:
            continue
        if p.split == SPLIT_ALL:
            segs.append(i)
        elif segs and isinstance(segs[-1], list):
            segs[-1].append(i)
        else:
            segs.append([i])
    prog0, progw = [], []
    for k, seg in enumerate(segs):
        if k:
            prog0.append(_BARRIER)
            progw.append(_BARRIER)
        if isinstance(seg, list):
            prog0.extend((i, 1) for i in seg)
        else:
            prog0.append((seg, nth))
            progw.append((seg, nth))
    if segs and not isinstance(segs[-1], list):
        prog0.append(_BARRIER)
        progw.append(_BARRIER)
    return tuple(prog0), tuple(progw)
