"""The thread policy, one home for every layer (the pool, the quantizers, the command line): the
default-thread rule (`choose`, `default_threads`), and a participant of a compute on one thread
(`single_threaded`).

The rule. A count given explicitly (the command line's thread count, GGTOOL_THREADS, `WorkerPool(n)`,
`quant.set_threads(n)`) always wins. Otherwise, for a compute whose work is known (`Work`: its
arithmetic, the bytes of weights it reads, the barriers its nodes meet; `ggtool.plan.estimate_work`),
the count is the one a cost model says is fastest, among the CPUs that are free now:

    time(n) = W / n + [n > 1] * (START + steps * (WAKE + barriers * BARRIER * n))

W, the work on one participant, is max(flops / FLOP_RATE, weight bytes / BYTE_RATE) a step (a decode
step streams every weight once and is bound by memory; a prompt is bound by arithmetic). Workers
cost their start once (START: the workers start side by side, each loading numba and its kernels
while this process does the same; nothing once a pool is running), and every step a wake-up of
the pool (WAKE) and a barrier per node that splits (BARRIER per participant). The constants were measured on the
development machine (2 cores, AVX-512, shared; bench/bench_scaling.py and the figures in
docs/engine.md, "How many threads"): re-measure them where the pool's costs change.

Free CPUs: those this process may use (its affinity mask, and a cgroup's CPU quota), less the
other processes running now (the median of a few reads of /proc/loadavg's running count, less this
one and its pool's workers, HELPERS): a pool with more participants than free cores waits on every barrier for a participant the
scheduler has put aside, and collapses (issue 30: 43 tokens/s on one thread, 8 on two, with one
other busy process on 2 cores). Light (os; ctypes only when BLAS is limited): the command line
asks it before numpy loads.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass

from . import blas, environment

THREADS_ENV = environment.THREADS.name

# The cost model's constants (seconds, bytes, flops), measured with bench/bench_scaling.py (see the
# module docstring): per participant, the quantized kernels stream ~8 GB/s of weights from memory
# (mat-vec) and compute ~100 GFLOP/s (mat-mat; numpy's one-thread BLAS about as much for f32);
# the pool's barrier costs ~5 us per node and participant on free cores, a wake-up of the pool
# ~0.1 ms a compute, and a worker process ~0.3 s to start and load its kernels.
BYTE_RATE = 8e9
FLOP_RATE = 1e11
BARRIER = 5e-6
WAKE = 1e-4
START = 0.3
LOADAVG = "/proc/loadavg"
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"
SAMPLES = 5          # reads of the running count, SAMPLE_GAP apart; their median counts
SAMPLE_GAP = 0.001


@dataclass(frozen=True)
class Work:
    """What one compute of a graph does, as the thread rule weighs it (ggtool.plan.estimate_work)."""

    flops: int = 0          # arithmetic: 2*K per mul_mat output element, one per other element
    weight_bytes: int = 0   # bytes of the weights (leaf tensors) its matrix products read
    params: int = 0         # their elements
    barriers: int = 0       # nodes that split between participants (a barrier after each)

    def seconds(self) -> float:
        """The work's time on one participant (the model's W)."""
        return max(self.flops / FLOP_RATE, self.weight_bytes / BYTE_RATE)


@dataclass(frozen=True)
class Choice:
    """A thread count and why: `given` (an explicit count), or the model's pick among `free` CPUs of
    `cpus`; `predicted` the model's seconds for the steps at each count it weighed (1..)."""

    n: int
    reason: str
    given: bool = False
    cpus: int = 1
    free: int = 1
    predicted: tuple = ()


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (os.cpu_count() where that is unknown),
    at most a cgroup's CPU quota (cpu.max) where one is set."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not Linux)
        n = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(n, quota)) if quota else n


_quota: list = []    # the cgroup's CPU quota, read once a process


def _cgroup_quota() -> int | None:
    if _quota and _quota[0][0] == CGROUP_CPU_MAX:
        return _quota[0][1]
    q = _read_quota()
    _quota[:] = [(CGROUP_CPU_MAX, q)]
    return q


def _read_quota() -> int | None:
    try:
        with open(CGROUP_CPU_MAX) as f:
            q, period = f.read().split()[:2]
        return None if q == "max" else max(1, int(q) // int(period))
    except (OSError, ValueError):
        return None


_seen: list = []     # (time.monotonic(), others) of the readings in the window, the newest last
SEEN_FOR = 1.0       # seconds the window spans (the quantizers and every compute's barrier ask)


def others_running() -> int:
    """Threads of other processes running or ready to run now on this machine: the median of the
    last SAMPLES readings of /proc/loadavg's running count, less this process's one (0 where
    unreadable). A first call (or one after SEEN_FOR seconds without) reads SAMPLES times,
    SAMPLE_GAP apart (`_read_others`); a later one reads once (`_read_one`, no sleep: it is on a
    compute's way) where the newest reading is SEEN_FOR / SAMPLES old, in place of the oldest."""
    now = time.monotonic()
    if not _seen or now - _seen[-1][0] >= SEEN_FOR:
        _seen[:] = [(now, _read_others())] * SAMPLES
    elif now - _seen[-1][0] >= SEEN_FOR / SAMPLES:
        _seen.append((now, _read_one() or 0))
        del _seen[:-SAMPLES]
    return sorted(n for _, n in _seen)[len(_seen) // 2]


# Process ids of this process's pool workers (``pool.procs`` adds and removes them): while they compute, or
# spin for the next compute, they are running, and that is this process's work, not another's. Counted
# as others, a 2-thread decode read its own worker as a busy core and spun at its barriers as if the
# machine were oversubscribed (SPIN_BUSY_NS, no linger) for every other second; a 16-thread one would
# have for all of them.
HELPERS: set[int] = set()
if hasattr(os, "register_at_fork"):     # a fork's workers are its parent's, others to it
    os.register_at_fork(after_in_child=HELPERS.clear)


def _read_others() -> int:
    """The median of SAMPLES reads, SAMPLE_GAP apart, of the others running (see `_read_one`)."""
    counts = []
    for i in range(SAMPLES):
        n = _read_one()
        if n is None:
            return 0
        counts.append(n)
        if i + 1 < SAMPLES:
            time.sleep(SAMPLE_GAP)
    counts.sort()
    return counts[len(counts) // 2]


def _read_one() -> int | None:
    """One read of /proc/loadavg's running count, less this process and its running workers (None:
    unreadable, 0 to the caller)."""
    try:
        with open(LOADAVG) as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0, running - _helpers_running() - 1)


def _helpers_running() -> int:
    """How many of HELPERS are running now (state R in /proc/PID/stat, its main thread's: a worker
    busy only on another thread, loading its kernels, still counts as another process; one gone
    is not running)."""
    n = 0
    for pid in list(HELPERS):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                n += f.read().rsplit(b")", 1)[1].split(None, 1)[0] == b"R"
        except (OSError, IndexError, ValueError):
            pass
    return n


def free_cpus(cpus: int | None = None) -> int:
    """The CPUs this process may use that no other process is using now (at least 1)."""
    cpus = available_cpus() if cpus is None else cpus
    return max(1, cpus - others_running())


def env_threads(name: str) -> int | None:
    """A thread count from the environment variable `name` (None if unset or empty); anything but a
    positive integer is an error, never silently the default (ggtool.environment reads it)."""
    return environment.read(name)


def predict(work: Work, n: int, steps: int = 1, started: bool = False) -> float:
    """The model's seconds for `steps` computes of `work` on n participants (see the module
    docstring); `started`: the pool's workers are running already (no START)."""
    t = steps * work.seconds() / n
    if n > 1:
        t += (0.0 if started else START) + steps * (WAKE + work.barriers * BARRIER * n)
    return t


def choose(work: Work | None = None, steps: int = 1, started: bool = False) -> Choice:
    """The default thread count and why: GGTOOL_THREADS if set; else, without `work`, the free
    CPUs; else the count among the free CPUs for which the model (`predict`) is fastest for
    `steps` computes of `work` (ties go to fewer)."""
    n = env_threads(THREADS_ENV)
    if n is not None:
        return Choice(n, f"{n} thread{'s' if n > 1 else ''}: {THREADS_ENV}={n}", given=True, cpus=n, free=n)
    cpus = available_cpus()
    if work is None:
        free = free_cpus(cpus) if cpus > 1 else 1
        return Choice(free, f"{free} thread{'s' if free > 1 else ''}: the free CPUs ({free} of {cpus})",
                      cpus=cpus, free=free)
    times = tuple(predict(work, k, steps, started) for k in range(1, cpus + 1))
    best = min(range(cpus), key=lambda k: (times[k], k)) + 1
    free = cpus
    if best > 1:                   # only then is the machine's load worth reading
        free = free_cpus(cpus)
        best = min(range(free), key=lambda k: (times[k], k)) + 1
    return Choice(best, _why(work, best, cpus, free, times, steps, started), cpus=cpus, free=free, predicted=times)


def _why(work: Work, n: int, cpus: int, free: int, times: tuple, steps: int, started: bool) -> str:
    head = (f"{_count(work.params)} weights ({work.weight_bytes / 2**20:.0f} MiB), {work.flops / 1e9:.2f} GFLOP"
            f"{f' a step, {steps} steps' if steps > 1 else ''}: ~{_ms(times[0])} on one thread")
    busy = f"; {free} of {cpus} CPUs free" if free < cpus else ""
    if n > 1:
        return f"{n} threads: {head}, ~{_ms(times[n - 1])} on {n} ({work.barriers} barriers a step){busy}"
    if cpus < 2:
        return f"1 thread: {head}; this process may use 1 CPU"
    if free < 2 and times[1] < times[0]:
        return f"1 thread: {head}, ~{_ms(times[1])} on 2, but {free} of {cpus} CPUs are free (others are busy)"
    start = "" if started else f"starting a worker (~{START:g} s) and "
    return (f"1 thread: {head}, ~{_ms(times[1])} on 2: {start}{work.barriers * steps} barriers cost more than "
            "the second thread saves")


def _count(n: int) -> str:
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.0f}{unit}"
    return str(n)


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def default_threads(work: Work | None = None, steps: int = 1) -> int:
    """The default thread count (`choose(work, steps).n`): GGTOOL_THREADS if set, else the free CPUs,
    or for `work` the count the cost model finds fastest among them."""
    return choose(work, steps).n


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
