"""The compiled graph runner: one participant's walk over a graph's steps, each a node's kernel called
through its address, with GGML's barrier between them, and no Python in between.

A graph is turned into steps by ``ggtool.runner`` (in Python, once per graph and process). Each step
is a row of ``steps`` (int64): the kernel's address (0: a node with no compiled kernel, which the
participant runs in Python: ``run`` returns ``PYTHON`` and is called again), the node's index, flags
(``BARRIER``: all participants meet after it; ``ONLY0``: participant 0 alone runs it) and the row of
the node tables it reads. Every kernel has one calling convention, that of ``ggtool.kernels.nodes``:
``int64 kernel(row address, float row address, ith, nth, work buffer address)``, 0 or an error code.

The barrier is GGML's (``ggml_barrier``): a counter of arrivals and a generation in shared memory (the
pool's control segment, the ``sync`` block: five cache lines, ``BARRIER_WORDS``), the last to arrive
resets the counter (and the chunk counter, ``CHUNK``) and bumps the generation, the others spin on the
generation with the CPU's pause hint. Unlike GGML's, a waiter stops spinning after ``spin_ns`` (the
plan's bound: long where every participant has a core, short where the machine is oversubscribed and
spinning would take the core a straggler needs) and sleeps on the generation's futex, woken by the last
arrival (which calls the kernel only when someone sleeps), and it notices an aborted compute (``ABORT``,
set by a participant whose kernel failed or by the caller). ``run`` returns to its Python caller at
``deadline_ns`` (``TIMEOUT``, resumable: the state says where it stood, at a barrier or between steps),
so that the caller can see to dead workers and signals (Ctrl-C) every few milliseconds whatever the
graph does.
"""

from __future__ import annotations

import numpy as np

from .jit import njit
from .native import atomic_add, atomic_cas, atomic_load, atomic_store, call5, futex_wait, futex_wake, now_ns, pause

# the sync block: int64 words, one per 64-byte line (word k at byte 64*k). CHUNK: the units of work a
# step deals out taken so far (GGML's current_chunk: ``nodes_mm``), 0 at every barrier's passing
N_BARRIER, N_PASSED, SLEEPERS, ABORT, CHUNK = 0, 1, 2, 3, 4
BARRIER_WORDS = 5 * 8            # int64 slots the block takes (5 lines)

# step flags
BARRIER, ONLY0 = 1, 2
# a step row: kernel address, node index, flags, table row
S_FN, S_NODE, S_FLAGS, S_ROW = 0, 1, 2, 3
STEP_WIDTH = 4

# run's answers
DONE, PYTHON, TIMEOUT, ABORTED, ERROR = 0, 1, 2, 3, 4
# the state array: next step, waiting at a barrier (1) and the generation it waits to pass, the Python
# step just done (its call is skipped when run resumes), the error code, the step that failed
ST_STEP, ST_WAITING, ST_PASSED, ST_SKIP, ST_CODE = 0, 1, 2, 3, 4
STATE_WIDTH = 8

_SLEEP_NS = 1_000_000            # one futex sleep at most (then ABORT and the deadline are looked at)
_CLOCK_EVERY = 64                # pauses between looks at the clock
_CLOCK_STEPS = 7                 # the clock is read after every 8th step (it costs ~0.15 us in a VM)


@njit(nogil=True)
def _word(sync, k):
    return sync + 64 * k


@njit(nogil=True)
def wait_passed(sync, passed, spin_ns, deadline_ns):
    """Wait until the generation moves past `passed`: spin with the pause hint for spin_ns, then sleep
    on the futex; DONE, ABORTED, or TIMEOUT at deadline_ns (still waiting: call again)."""
    gen = _word(sync, N_PASSED)
    if atomic_load(gen) != passed:
        return DONE
    t0 = now_ns()
    i = 0
    while True:
        for _ in range(_CLOCK_EVERY):
            pause()
            if atomic_load(gen) != passed:
                return DONE
        i += 1
        if atomic_load(_word(sync, ABORT)) != 0:
            return ABORTED
        t = now_ns()
        if t - t0 >= spin_ns:
            break
        if t >= deadline_ns:
            return TIMEOUT
    while True:
        atomic_add(_word(sync, SLEEPERS), 1)
        if atomic_load(gen) == passed:
            left = deadline_ns - now_ns()
            futex_wait(gen, passed, min(_SLEEP_NS, max(left, 1)))
        atomic_add(_word(sync, SLEEPERS), -1)
        if atomic_load(gen) != passed:
            return DONE
        if atomic_load(_word(sync, ABORT)) != 0:
            return ABORTED
        if now_ns() >= deadline_ns:
            return TIMEOUT


@njit(nogil=True)
def arrive(sync, nth):
    """Arrive at the barrier: -1 if this participant was the last (the generation has moved on), else
    the generation to wait past (``wait_passed``)."""
    passed = atomic_load(_word(sync, N_PASSED))
    n = atomic_add(_word(sync, N_BARRIER), 1)
    if n == nth - 1:
        atomic_store(_word(sync, N_BARRIER), 0)
        atomic_store(_word(sync, CHUNK), 0)      # every participant is done with the last step's units
        atomic_add(_word(sync, N_PASSED), 1)
        if atomic_load(_word(sync, SLEEPERS)) > 0:
            futex_wake(_word(sync, N_PASSED))
        return -1
    return passed


@njit(nogil=True)
def barrier(sync, nth, state, spin_ns, deadline_ns):
    """The barrier for Python's callers (a kernel that meets the others inside, a Python step): DONE,
    ABORTED, or TIMEOUT with the state set to resume (``barrier_resume``)."""
    if nth <= 1:
        return DONE
    if state[ST_WAITING] == 0:
        passed = arrive(sync, nth)
        if passed < 0:
            return DONE
        state[ST_WAITING], state[ST_PASSED] = 1, passed
    r = wait_passed(sync, state[ST_PASSED], spin_ns, deadline_ns)
    if r != TIMEOUT:
        state[ST_WAITING] = 0
    return r


@njit(nogil=True)
def wait_change(addr, old, spin_ns):
    """Spin with the pause hint until the int64 at `addr` is no longer `old`, for at most spin_ns:
    whether it changed (a pool's ``wire.rung`` and ``wire.answered`` slots)."""
    if atomic_load(addr) != old:
        return True
    t0 = now_ns()
    while True:
        for _ in range(_CLOCK_EVERY):
            pause()
            if atomic_load(addr) != old:
                return True
        if now_ns() - t0 >= spin_ns:
            return False


# a worker's standby word (``ggtool.pool.wire.standby``): asleep on its bell (or busy), listening (spinning
# for its caller's next compute), claimed (the caller has handed it a compute through the control segment)
ASLEEP, LISTENING, CLAIMED = 0, 1, 2


@njit(nogil=True)
def listen(standby, rung, got, spin_ns):
    """A worker's wait for its caller's next compute, for at most spin_ns, its `standby` word set to
    LISTENING before it counted its last answer (so that a caller quick to compute again finds it
    listening): True once the caller has claimed it (``hand``: the compute's arguments are in the
    control segment), False once it has set the word ASLEEP (a message came: the int64 at `rung` is
    no longer `got`; or spin_ns passed): from then on the caller cannot claim it and sends messages.
    Either side moves the word from LISTENING with a compare-and-swap, so a claim and the end of the
    wait never cross: whoever moves it first decides."""
    t0 = now_ns()
    while True:
        for _ in range(_CLOCK_EVERY):
            pause()
            if atomic_load(standby) == CLAIMED:
                return True
            if atomic_load(rung) != got:
                return atomic_cas(standby, LISTENING, ASLEEP) == CLAIMED
        if now_ns() - t0 >= spin_ns:
            return atomic_cas(standby, LISTENING, ASLEEP) == CLAIMED


@njit(nogil=True)
def hand(ctl, lines, fields, values, claimed):
    """The caller's side of ``listen``, for every worker of a compute at once: in each worker's line
    (``ctl`` + 8 * ``lines[k]``) the compute's fields (``values``, at the words ``fields[1:]``), then
    the claim of its standby word (word ``fields[0]``: LISTENING -> CLAIMED, a compare-and-swap):
    ``claimed[k]`` whether it took the compute (else it is asleep or busy: send it a message). Every
    listening worker is claimed within nanoseconds of the first, with no Python between them."""
    for k in range(lines.shape[0]):
        line = ctl + 8 * lines[k]
        for f in range(values.shape[0]):
            atomic_store(line + 8 * fields[f + 1], values[f])
        claimed[k] = atomic_cas(line + 8 * fields[0], LISTENING, CLAIMED) == LISTENING


@njit(nogil=True)
def set_abort(sync):
    atomic_store(_word(sync, ABORT), 1)


@njit(nogil=True)
def run(steps, rows, frows, ith, nth, wdata, sync, at_node, state, spin_ns, deadline_ns):
    """Run steps from state[ST_STEP] on; see the module's docstring. `rows`/`frows`: the int64 and
    float64 node tables; `at_node`: the address of this participant's "node I am at" word (0: none)."""
    n = steps.shape[0]
    s = state[ST_STEP]
    rw, fw = rows.shape[1] * 8, frows.shape[1] * 8
    rbase, fbase = rows.ctypes.data, frows.ctypes.data
    while s < n:
        flags = steps[s, S_FLAGS]
        if state[ST_WAITING] == 0:
            if state[ST_SKIP] != 0:          # the Python step just run
                state[ST_SKIP] = 0
            elif (flags & ONLY0) == 0 or ith == 0:
                fn = steps[s, S_FN]
                if at_node != 0:
                    atomic_store(at_node, steps[s, S_NODE])
                if fn == 0:
                    state[ST_STEP] = s
                    return PYTHON
                row = steps[s, S_ROW]
                code = call5(fn, rbase + row * rw, fbase + row * fw, ith, nth, wdata)
                if code != 0:
                    state[ST_STEP], state[ST_CODE] = s, code
                    if nth > 1:
                        set_abort(sync)
                    return ERROR
            if (flags & BARRIER) == 0 or nth <= 1:
                s += 1
                if (s & _CLOCK_STEPS) == 0 and s < n and now_ns() >= deadline_ns:
                    state[ST_STEP] = s
                    return TIMEOUT
                continue
            passed = arrive(sync, nth)
            if passed < 0:
                s += 1
                continue
            state[ST_WAITING], state[ST_PASSED] = 1, passed
        r = wait_passed(sync, state[ST_PASSED], spin_ns, deadline_ns)
        if r == TIMEOUT:
            state[ST_STEP] = s
            return TIMEOUT
        state[ST_WAITING] = 0
        if r == ABORTED:
            state[ST_STEP] = s
            return ABORTED
        s += 1
        if (s & _CLOCK_STEPS) == 0 and s < n and now_ns() >= deadline_ns:
            state[ST_STEP] = s
            return TIMEOUT
    state[ST_STEP] = n
    return DONE


def new_state() -> np.ndarray:
    return np.zeros(STATE_WIDTH, np.int64)


def warm() -> None:
    """Compile (or load) the runner's loop and barrier for the types ``ggtool.runner`` calls them with
    (the background compiler's "runner" kernel, ``compiling.warm``)."""
    block = np.zeros(BARRIER_WORDS, np.int64)
    sync = int(block.ctypes.data)
    steps = np.zeros((0, STEP_WIDTH), np.int64)
    rows, frows = np.zeros((1, 64), np.int64), np.zeros((1, 8), np.float64)
    run(steps, rows, frows, 0, 1, 0, sync, 0, new_state(), 0, 0)
    barrier(sync, 1, new_state(), 0, 0)
    wait_change(sync, 0, 0)
    none = np.zeros(0, np.int64)
    hand(sync, none, np.zeros(6, np.int64), none, np.zeros(0, np.bool_))
    listen(sync, sync, 0, 0)
    set_abort(sync)
