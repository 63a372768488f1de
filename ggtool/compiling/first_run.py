"""Which of a compiled kernel and its numpy twin a call runs, while the kernel is not in the cache
yet: the first-ever-run policy (``kernels.cache`` says whether a kernel is cached; ``kernels.twins`` are the
numpy twins, the same bits).

Why a choice: compiling a kernel costs numba ~0.5-2 s of its own Python work (CPU seconds, this
machine; the first compile of a process ~0.7 s more), and a twin costs per call what the compiled
kernel does 10-100 times over (a twin decodes every weight it reads, each call: a mat-vec of the
weights of a 311M-parameter model takes the twins ~0.8 s, the kernels ~25 ms). So the twins are
right for small work (a short compute, a tiny model: the process never loads numba) and wrong for
large work (a generation of many tokens over a large model: 1.2 tokens/s against 34, issue 30).

The rule, per kernel and process (a ski rental): a call's twin would cost ``twin_seconds`` (the caller's
estimate from the work's size: weights, rows, values); where the work repeats (``repeating(n)``: a
generation's steps), the twin's calls of this step count once for every step still to come. While
that and the calls of the steps before stay within COMPILE_SECONDS[kind] (what compiling the
kernel costs), the twin runs; else the kernel is compiled now, in this process
(``warm.compile_kernel``, what the background compiler would do), marked ready in the cache for
the next runs, and called. The first compile of a command line says
so on stderr, once. A kernel another participant (a pool worker, or the caller) has compiled
meanwhile is used as soon as its ready marker is there. A library user's process compiles as it
always has (``cache.use_kernel``), and so does every cached kernel.

Ahead of large work whose products are known (``prepare``: a generation's step), the kernels the
rule would compile start compiling at once, in processes of their own (the 32-value dots in one,
the K-quants in another: a family shares its activation pass; each family's activation quantizer
first, the float dots of attention with the smaller family; ``ggtool.isolation``: ``python -I`` in
"/", a filtered environment), side by side on the free CPUs while this process reads the model and
builds the graph; the first call of such a kernel waits until its process has marked it ready
(not for the rest of the family), and compiles in process where that failed. Processes still compiling when the command ends are
stopped (the background compiler finishes their work for the next run).

The compiled graph runner (``ggtool.runner``) is weighed the same way (``prepare_runner``): its loop
and node kernels cost ~1-3.5 s CPU each to compile (~20 s for a gemma-3 decode's thirteen), and
spare each computing node ~PYTHON_NODE of Python a step. Where a generation's steps would spare
more than compiling costs, the kernels it has no compiled form of yet start compiling ahead, all in
one process (numba loaded once, the callees they share compiled once), the most used first, each
marked ready as it is done; the graph's program is made again at the first step after one is
(``stamp``, which ``compute`` watches), so a step runs on the runner as soon as it can, with the
same bits (the runner's kernels compute what the Python forwards do). A kernel that failed to
compile ahead leaves its nodes to Python, as before.

Light: os, sys, time (subprocess where a kernel compiles ahead); numba loads only where a kernel
compiles in this process.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from contextlib import contextmanager

from .. import role
from ..kernels import cache

# CPU seconds to compile a kernel, measured on this machine (a dot: ~1.4-2.2 s, its tile and the
# activation pass the 32-value types share; docs/engine.md, "Small work and large work"): a
# twin may cost as much before the kernel is compiled.
COMPILE_SECONDS = {"dot": 2.0, "quantize": 1.0, "runner": 1.6, "node": 1.5, "float_rows": 0.3}
# kernels that cost far more than their kind's (x86 numerics' product kernel: every x86 dot of every type)
KERNEL_SECONDS = {"node:mm_x86": 11.0, "node:mm_q32": 3.8}
SHARED_FORM = 0.1   # a dot whose packed form another dot of its process compiled (``compile_seconds``)
# An activation quantizer compiles ahead after its family's dots where its twin would cost the work
# more than this (seconds): gemma-3-270m's 128 tokens ~0.7 s of Q8_0 twins (~1 s measured, 10% of the
# steps), a 311M model's 64 ~0.1 s
QUANTIZE_AHEAD = 0.25
# While a float dot compiles ahead, a call whose twin costs less than this (seconds) runs the twin rather
# than wait: a prompt's attention products (F32, a few rows: ~2 ms a layer, a few times the kernel) go
# on while their dot compiles (~2 s CPU, which gemma-3's prompt waited for). A block type's twin
# decodes every weight it reads (10-100 times its kernel) and takes the CPU its compile needs, on a
# path that soon meets a larger call that must wait anyway (a 311M model's first layer): it waits.
TWIN_WHILE_AHEAD = 0.01
# What a computing node costs from Python more than on the compiled runner, a step (measured: a 128-token
# gemma-3-270m generation, 15.0 s CPU without the runner, 9.4 s with it, ~800 nodes a step).
PYTHON_NODE = 55e-6

# What a twin costs (seconds): a block type's dot ~ N*K*(decoding + TWIN_MAC * M) + TWIN_CALL, its
# record's decoding a value (``twin_decode_seconds``), a quantizer ~ values * TWIN_VALUE + TWIN_CALL
# (measured with one BLAS thread on 4096 x 2048 weights, M = 1..512, and 8M values).
TWIN_MAC = 0.12e-9
TWIN_VALUE = 6e-9
TWIN_CALL = 40e-6
# F32/F16 weights (``twins.float_dot``, GGML's scalar order): few outputs (m * n < FLOAT_WIDE) cost a
# running sum per output, ~7 ns a product (a decode step's attention, m = the heads); many cost a
# pass over the outputs a k, ~0.8 ns a product and ~3 us a k (measured as above: n x k x m =
# 141 x 256 x 4 .. 512 x 512 x 512)
TWIN_FLOAT_FEW = 7e-9
TWIN_FLOAT_MANY = 0.8e-9
TWIN_FLOAT_K = 3e-6
FLOAT_WIDE = 4096
FLOAT_TYPES = ("f32", "f16")

AHEAD_POLL = 0.01                    # seconds between looks at a kernel compiling ahead (_wait_ahead)

NOTICE = ("compiling ggtool's kernels for this CPU (once, ~{s:.0f} s; `ggtool kernels` compiles them"
          " all ahead)...")

_compiled: set[str] = set()          # kernels this process runs compiled
_ahead: dict = {}                    # kernel -> the process compiling it ahead (subprocess.Popen)
_spent: dict[str, float] = {}        # kernel -> seconds its twin has cost (estimated)
_told = [False]
_meanwhile: list = []                # work a wait for a kernel compiling ahead does first (``meanwhile``)
_looked: dict[str, float] = {}       # kernel -> when use_compiled last looked for its ready marker
READY_LOOK = 0.05
_runner_pending: dict = {}           # runner kernel compiling ahead -> its process (prepare_runner)
_stamp = [0]                         # how many of those have become ready (or failed) so far


class Repeats:
    """How many more times the work computed now will be computed (`left`, this time included), and
    what each kernel's twin has cost in this time so far (`step`). `later`: what a kernel's twin
    costs in each time after the first, where the caller knows it (a generation's step, whose first
    time, the prompt, is larger work computed once: counted once, not once a step to come)."""

    def __init__(self, left: int, later: dict[str, float] | None = None):
        self.left = max(1, int(left))
        self.step: dict[str, float] = {}
        self.later = dict(later or {})
        self.first = True

    def next(self, left: int) -> None:
        """The next time of the work begins; `left` times are still to come, it included."""
        self.left = max(1, int(left))
        self.step.clear()
        self.first = False

    def seconds(self, name: str, now: float) -> float:
        """The twin's seconds of kernel `name` from this time on, `now` of them in this time."""
        later = self.later.get(name, now) if self.first else now
        return now + later * (self.left - 1)


_repeats = [Repeats(1)]


@contextmanager
def repeating(n: int, later: dict[str, float] | None = None):
    """The work computed inside is expected to be computed n times over (a generation's n steps):
    the caller says when each begins (`Repeats.next`, on the object yielded), and the twin's calls
    of a time count as often as the times still to come when the policy weighs them against compiling.
    `later`: the twin's seconds of a time after the first, per kernel, where known (`step_seconds`):
    the first time's own calls then count once."""
    r = Repeats(n, later)
    _repeats.append(r)
    try:
        yield r
    finally:
        _repeats.remove(r)


def dot_seconds(type_name: str, n: int, k: int, m: int) -> float:
    """A twin's time for a dot of n weight rows of k values (type_name) with m activation rows."""
    if type_name in FLOAT_TYPES:
        if m * n < FLOAT_WIDE:
            return n * k * m * TWIN_FLOAT_FEW + TWIN_CALL
        return k * (n * m * TWIN_FLOAT_MANY + TWIN_FLOAT_K) + TWIN_CALL
    return n * k * (_twin_decode(type_name) + TWIN_MAC * m) + TWIN_CALL


def _twin_decode(type_name: str) -> float | None:
    """What the twin's decoding of a weight value of `type_name` costs, None for a type with no twin
    (only the classic block types have one: their records' ``twin_decode_seconds``)."""
    from .. import qtypes

    try:
        return getattr(qtypes.get(type_name), "twin_decode_seconds", None)
    except KeyError:                    # F32, BF16, ...: no record
        return None


def quantize_seconds(values: int) -> float:
    """A twin quantizer's time for `values` floats."""
    return values * TWIN_VALUE + TWIN_CALL


def use_compiled(name: str, twin_seconds) -> bool:
    """Whether this call runs the compiled kernel `name` ("dot:q4_0", "quantize:Q8_0_cpu"), else its
    twin (see the module docstring); may compile it now. `twin_seconds`: the twin's time for this
    call, or a function giving it (asked only while the kernel is not compiled)."""
    if name in _compiled:
        return True
    if name in _ahead:
        if _ahead[name].poll() is None and not _ready_lately(name):
            if callable(twin_seconds):
                twin_seconds = twin_seconds()
            if name.startswith("quantize:") or (name[4:] in FLOAT_TYPES and twin_seconds < TWIN_WHILE_AHEAD):
                return False            # a call cheaper than waiting for the compile: the twin meanwhile
        if _wait_ahead(name):
            return True
    if cache.use_kernel(name) or _ready_lately(name):
        _compiled.add(name)
        return True
    if callable(twin_seconds):
        twin_seconds = twin_seconds()
    spent, r = _spent.get(name, 0.0), _repeats[-1]
    before = r.step.get(name, 0.0)
    if spent - before + r.seconds(name, before + twin_seconds) <= COMPILE_SECONDS[name.split(":", 1)[0]]:
        r.step[name] = before + twin_seconds
        _spent[name] = spent + twin_seconds
        return False
    compile_now(name)
    return True


def compile_now(name: str) -> None:
    """Compile kernel `name` in this process (saying so on the command line's stderr, once), and
    mark it ready in the cache for the next runs."""
    _tell(COMPILE_SECONDS[name.split(":", 1)[0]] + 0.7)
    from . import warm

    t = time.process_time()
    kept = warm.compile_kernel(name)
    _compiled.add(name)
    _spent[name] = time.process_time() - t
    if kept:            # else the next run weighs it again (numba could not keep it: NUMBA_OPT=0)
        _mark_ready(name)


def _tell(seconds: float) -> None:
    if role.COMMAND_LINE and not role.POOL_WORKER and not _told[0]:
        _told[0] = True
        try:
            sys.stderr.write(NOTICE.format(s=max(1.0, seconds)) + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):   # stderr closed: the compile goes on
            pass


def prepare(products, repeats: int = 1, free_cpus: int = 1) -> list[str]:
    """Start compiling, in processes of their own (one a family of dots), the dot kernels that the work ahead would
    compile anyway, and after a family's dots its activation quantizer where its twin would cost the
    work more than QUANTIZE_AHEAD (calls run the twin until it is ready, never wait for it: a decode
    row's quantizer twin costs ~40 us a call, compiling it ~1 s CPU that would hold up the dots after
    it, and the other core is idle once the dots are compiled): `products` are
    its matrix products as (weight type name, rows, row length, activation rows), in the order the
    work runs them, `repeats` how often it is computed. Only in the command line's process, for
    kernels neither cached nor compiled, and where at least 2 CPUs are free (`free_cpus`: else they
    compile in process at first use). Returns the kernels started."""
    if not role.COMMAND_LINE or role.POOL_WORKER or free_cpus < 2:
        return []

    def wanted(name: str) -> bool:
        return name not in _compiled and name not in _ahead and not cache.use_kernel(name) and not _ready(name)

    from .. import types as T

    cost = step_seconds(products)
    dots = [name for name, s in cost.items()
            if name.startswith("dot:") and s * max(1, repeats) > COMPILE_SECONDS["dot"] and wanted(name)]
    # a process for the 32-value dots and one for the K-quants (those of a family share their activation
    # pass: compiled once; numba loaded once), one process for all where fewer CPUs are free; the float dots
    # (attention's) join the family that costs least to compile, so that the families end together (a
    # prompt runs every dot: it waits for the last); each family's activation quantizers after its dots,
    # where their twins would cost the work QUANTIZE_AHEAD: no call waits for them (``use_compiled``)
    groups: dict = {}                      # a family's block size (or "F", "all") -> its kernels
    for name in dots:
        if name[4:] not in FLOAT_TYPES:
            groups.setdefault(T.block_size(T.parse_type(name[4:])), []).append(name)     # 32 or 256 values
    for name in dots:
        if name[4:] in FLOAT_TYPES:
            (min(groups.values(), key=compile_seconds) if groups else groups.setdefault("F", [])).append(name)
    taken: set[str] = set()
    for names in groups.values():
        for q in dict.fromkeys(map(_activation_quantizer, list(names))):
            if q is not None and q not in taken and wanted(q) and cost.get(q, 0.0) * max(1, repeats) > QUANTIZE_AHEAD:
                taken.add(q)
                names.append(q)
    if len(groups) > free_cpus:
        every = [n for names in groups.values() for n in names]
        groups = {"all": [n for n in every if n not in taken] + [n for n in every if n in taken]}
    started = []
    for names in groups.values():
        proc = _spawn(names[0] if len(names) == 1 else names)
        if proc is not None:
            for name in names:
                _ahead[name] = proc
            started.extend(names)
    if started:
        _tell(ahead_seconds([compile_seconds(names) for names in groups.values()], free_cpus))
        if len(_ahead) == len(started):
            atexit.register(_stop_ahead)
    return started


def ahead_seconds(families: list[float], free_cpus: int) -> float:
    """What compiling ahead adds to the run's wall time, as the notice says it: the longest family's CPU
    seconds (`families`: each process's ``compile_seconds``), stretched where the processes and this
    one outnumber the free CPUs (a 311M model's two families beside its run on two CPUs: ~4 s, where
    the longest alone said ~3 and the run took 3.3-4.4 s longer), and ~0.7 s to start a process and
    load numba."""
    share = max(1.0, (len(families) + 1) / max(1, free_cpus))
    return max(families, default=0.0) * share + 0.7


def compile_seconds(names) -> float:
    """CPU seconds to compile kernels `names` in turn in one process: COMPILE_SECONDS of each
    (KERNEL_SECONDS of one that costs more), but a
    dot whose packed form (its tile, ``qtypes``' ``packed_form``) an earlier one compiled costs
    SHARED_FORM (Q8_0 after Q5_0: ~0 s measured)."""
    forms, total = set(), 0.0
    for name in names:
        kind, _, arg = name.partition(":")
        form = _packed_form(arg) if kind == "dot" else None
        total += SHARED_FORM if form is not None and form in forms else KERNEL_SECONDS.get(name, COMPILE_SECONDS[kind])
        forms.add(form)
    return total


def _packed_form(type_name: str) -> str | None:
    from .. import qtypes
    from .. import types as T

    try:
        return getattr(qtypes.get(T.parse_type(type_name)), "packed_form", None)
    except (KeyError, ValueError):      # F32, F16, BF16: no record
        return None


def step_seconds(products) -> dict[str, float]:
    """What each twin costs in one time of a work whose matrix products are `products` (as `prepare`
    takes them), by kernel, in the order the work first uses them: each product's dot, and the
    quantizer that converts its activations first (``quantize_seconds`` of its k * m values), where
    the product has a twin."""
    cost: dict[str, float] = {}
    for type_name, n, k, m in products:
        if type_name in FLOAT_TYPES or _twin_decode(type_name) is not None:
            name = f"dot:{type_name}"
            q = _activation_quantizer(name)
            if q is not None:
                cost[q] = cost.get(q, 0.0) + quantize_seconds(k * m)
            cost[name] = cost.get(name, 0.0) + dot_seconds(type_name, n, k, m)
    return cost


def _activation_quantizer(dot: str) -> str | None:
    """The quantizer kernel ("quantize:<kind>", ``warm.QUANTIZERS``) that converts a dot's activations
    to its weights' vec_dot_type (``ops.matmul``), or None (F32 weights take them as they are)."""
    from .. import types as T

    vdt = T.vec_dot_type(T.parse_type(dot[4:]))
    kind = {T.GGMLType.Q8_0: "Q8_0_cpu", T.GGMLType.Q8_1: "Q8_1_cpu", T.GGMLType.Q8_K: "Q8_K", T.F16: "F16"}.get(vdt)
    return None if kind is None else f"quantize:{kind}"


def prepare_runner(kernels, nodes: int = 0, repeats: int = 1, free_cpus: int = 1) -> list[str]:
    """Start compiling, in one process of its own, the compiled graph runner's loop and the node kernels
    `kernels` (``kernels.nodes`` names, the most used first) that the work ahead would run on it, where
    running its `nodes` computing nodes from Python `repeats` times would cost more than compiling
    them (PYTHON_NODE a node and time against COMPILE_SECONDS). Only in the command line's process,
    for kernels neither cached nor compiled, and where at least 2 CPUs are free. Returns the kernels
    started ("runner", "node:<name>"): each is used from the first compute after it is ready (`stamp`).
    `kernels` may be a function giving (kernels, nodes), asked only where the runner is not cached."""
    if not role.COMMAND_LINE or role.POOL_WORKER or free_cpus < 2 or cache.use_kernel("runner"):
        return []                       # a cached runner: its kernels are the background compiler's
    if callable(kernels):
        kernels, nodes = kernels()
    names = ["runner", *dict.fromkeys(f"node:{k}" for k in kernels)]
    todo = [n for n in names if n not in _compiled and n not in _ahead and n not in _runner_pending
            and not cache.use_kernel(n) and not _ready(n)]
    cost = sum(COMPILE_SECONDS[n.partition(":")[0]] for n in todo)
    if not todo or ("runner" not in todo and not ready_now("runner")) \
            or PYTHON_NODE * nodes * max(1, repeats) <= cost:
        return []
    proc = _spawn(todo, nice=True)
    if proc is None:
        return []
    for n in todo:
        _runner_pending[n] = proc
    _tell(cost)
    if not _ahead and len(_runner_pending) == len(todo):
        atexit.register(_stop_ahead)
    return todo


def compiling_ahead(name: str) -> bool:
    """Whether kernel `name` is still compiling in a process of its own (``prepare``): its first call
    will wait, so the work that does not need it (repacking its weights) is best done first."""
    proc = _ahead.get(name)
    return proc is not None and proc.poll() is None and not _ready(name)


def ready_now(name: str) -> bool:
    """Whether kernel `name` runs compiled in this process now, without waiting for anything: compiled
    here, in the cache (``cache.use_kernel``, which wishes for it otherwise), or marked ready since
    (by a process compiling it ahead, or another run)."""
    if name in _compiled:
        return True
    if name in _ahead and _ahead[name].poll() is not None:
        _wait_ahead(name)
    if cache.use_kernel(name) or _ready(name):
        _compiled.add(name)
        return True
    return False


def stamp() -> int:
    """A number that changes when a kernel compiling ahead for the runner (`prepare_runner`) becomes
    ready or fails: a graph's program made before is then made again. Costs a look at each pending
    kernel's ready mark."""
    for n, proc in list(_runner_pending.items()):
        if _ready(n) or proc.poll() is not None:
            del _runner_pending[n]
            _stamp[0] += 1
    return _stamp[0]


def _spawn(name, nice: bool = False):
    """A compile-ahead process for kernel `name` (or a list of kernels, compiled in turn), started as
    every child of ggtool is (``isolation``: ``python -I`` in "/", a filtered environment), or None
    where none can start. `nice`: it yields the CPU to this process and to the other compiles."""
    import subprocess

    from .. import isolation

    root = cache.cache_dir()
    if cache.bypassed() or cache.subfolder(root, "ready") is None:
        return None         # no cache to compile into: compiled in process at first use
    try:
        return isolation.popen(f"from ggtool.compiling.first_run import _compile_main; _compile_main({name!r}, {nice!r})",
                               env={"NUMBA_CACHE_DIR": root}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:     # no process: compiled in process at first use
        return None


def processes_ahead() -> int:
    """How many processes compile kernels ahead now (``prepare``, ``prepare_runner``)."""
    return len({id(p) for p in (*_ahead.values(), *_runner_pending.values()) if p.poll() is None})


def meanwhile(work) -> None:
    """Give the waits for kernels compiling ahead something to do: `work`, an iterable of callables
    (each a few milliseconds: a weight tile to repack, which the first call of its dot would do
    anyway), is run one callable at a time while a kernel is awaited, instead of sleeping; what is
    left when no dot is compiling ahead any more is dropped. A callable that raises ends the work (its call raises
    again where it belongs, in its own words)."""
    _meanwhile[:] = [iter(work)]


def _do_meanwhile() -> bool:
    """Run the next callable of `meanwhile`'s work; whether there was one."""
    if not _meanwhile:
        return False
    try:
        step = next(_meanwhile[0])
        step()
    except Exception:   # noqa: BLE001 - StopIteration included: the rest is done at its first use, as before
        _meanwhile.clear()
        return False
    return True


def _wait_ahead(name: str) -> bool:
    """Wait for the process compiling `name` ahead to have compiled it (a process of several kernels
    marks each ready as it is done: the first of them need not wait for the others), or to end;
    whether it compiled it (then this process loads it from the cache). The wait does `meanwhile`'s
    work first, and sleeps once that is done."""
    proc = _ahead.pop(name)
    while proc.poll() is None and not _ready(name):
        if not _do_meanwhile():
            time.sleep(AHEAD_POLL)
    if not any(n.startswith("dot:") for n in _ahead):      # no wait to come (a quantizer's calls never wait)
        _meanwhile.clear()
    ok = _ready(name)
    if ok:
        _compiled.add(name)
    return ok


def _stop_ahead() -> None:
    for proc in {id(p): p for p in (*_ahead.values(), *_runner_pending.values())}.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _ahead.clear()
    _runner_pending.clear()
    _meanwhile.clear()


def _compile_main(name, nice: bool = False) -> None:
    """A compile-ahead process: compile kernel `name` (or each of a list, in turn) into the cache and
    mark it ready; a kernel that fails is left to its caller (the exit code says so), the others go on."""
    from . import warm

    if nice:
        try:
            os.nice(5)
        except OSError:
            pass
    failed = False
    for n in [name] if isinstance(name, str) else name:
        try:
            kept = warm.compile_kernel(n)
        except Exception:               # noqa: BLE001 - compiled (and refused) at its first use instead
            if isinstance(name, str):
                raise
            failed = True
            continue
        if kept:
            _mark_ready(n)
        else:                           # not in the cache: the caller compiles it at its first use
            failed = True
    if failed:
        sys.exit(1)


def _ready_lately(name: str) -> bool:
    """`_ready`, looked at no more than every READY_LOOK seconds a kernel: a twin runs at every call of
    a kernel not compiled (a decode row's quantizer: ~25 us), and a look costs ~25 us more (the
    cache's folder, a stat); a kernel another process compiles meanwhile is taken up within READY_LOOK."""
    now = time.monotonic()
    if now - _looked.get(name, -READY_LOOK) < READY_LOOK:
        return False
    _looked[name] = now
    return _ready(name)


def _ready(name: str) -> bool:
    """Whether the cache holds kernel `name`'s ready marker (a plain file, never a link)."""
    ready = cache.marker("ready", name)
    return cache.plain_file(ready)


def _mark_ready(name: str) -> bool:
    """As the background compiler marks it (``warm``): ready, and no longer wanted; whether its ready
    mark is there (never an error: a mark that cannot be written only makes a run compile it again)."""
    if cache.bypassed():
        return False
    from . import warm

    root = cache.cache_dir()
    marked = warm._mark(root, "ready", name)
    cache.remove(cache.marker("wanted", name, root))
    return marked
