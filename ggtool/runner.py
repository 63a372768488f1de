"""The compiled graph runner's Python side: a graph turned into steps that each participant runs without
Python between nodes (``ggtool.kernels.runner`` runs them, ``ggtool.kernels.nodes`` holds the kernels).

- `make_program(nodes, nth, numerics)`, in the process that plans (the caller): each node that computes
  becomes its op's compiled steps (``ops.base.Kernel.steps``: a kernel and its parameters), or one step
  Python runs (an op, a type or a layout no compiled kernel takes yet); each step is run by every
  participant (the op splits, as GGML's forward does) or by participant 0 alone, and followed by the
  barrier (not between two steps of participant 0 alone; after the last step too, where more than one
  participates: passing it tells each that all have finished). The `Program` names the steps only, so
  that every participant runs the same steps and meets at the same barriers whatever it could
  compile; it travels to the workers with the graph.
- `bind(program, nodes, numerics, ith, nth)`, in every participant's process, once per graph: the
  steps with this process's kernel addresses, and the node tables (every tensor's address in this
  process, types, ne, nb, the op's parameters, the arrays the step keeps: repacked weights, caches).
- `participate(bound, ...)`: runs them, returning to Python for the Python steps (`run_node`, as
  before the runner), every few milliseconds for the caller's checks (dead workers, signals:
  ``kernels.runner``'s deadline), and for a kernel's error (the node is run again by its Python
  forward, which raises it in its own words; ComputeError names the node).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import types as T
from .errors import ComputeError, GGToolError
from .ops.base import kernel_for

# the runner's step flags and answers (kernels.runner's, which loads numba: kept in step here)
BARRIER, ONLY0 = 1, 2
FUSED = -1     # a step's number among its node's steps, for the step of a node fused with the next
CONVERT = "mm_convert"   # mul_mat's first step: src1 into the work buffer (left out when it is there already)
DONE, PYTHON, TIMEOUT, ABORTED, ERROR = 0, 1, 2, 3, 4
CHECK_EVERY = 0.005      # seconds between the caller's checks while it waits (dead workers, Ctrl-C)


class Aborted(BaseException):
    """Another participant stopped the graph (BaseException: kernels' `except Exception` let it pass)."""


def run_node(index: int, node, ith: int, nth: int, work) -> None:
    """One node's kernel for participant ith of nth. Callers run nodes inside
    `np.errstate(all="ignore")`: as in GGML, inf and NaN are results, not errors."""
    forward = kernel_for(node).forward
    if forward is None or 0 in node.ne:  # NONE and views; empty tensors
        return
    try:
        forward(node, ith, nth, work)
    except Exception as e:  # a kernel failure is reported with its node, never as a traceback
        raise node_error(index, node, e) from e


def node_error(index: int, node, e: BaseException) -> ComputeError:
    msg = str(e) if isinstance(e, GGToolError) else f"{type(e).__name__}: {e}"
    return ComputeError(f"node {index} '{node.name}' ({node.op_desc}) failed: {msg}")


def computes(node) -> bool:
    """Whether a node does anything when run (not NONE, a view or an empty tensor)."""
    return node.op != "NONE" and not node.is_empty() and kernel_for(node).forward is not None


# -- which kernels this process may run ---------------------------------------------------------------
# A graph of this many computing nodes runs on the compiled runner even where nothing has loaded numba
# yet (its ~0.5 s start then pays for itself within a few computes); a smaller all-f32 graph in a
# process without numba runs from Python, as `ggtool compute` on small f32 tensors always has.
WORTH_NUMBA = 256


def worth(nodes) -> bool:
    """Whether a graph is worth the compiled runner here: numba is loaded already, the graph reads a
    block-type tensor (its kernels load numba anyway), or it has WORTH_NUMBA computing nodes."""
    import sys

    if "numba" in sys.modules:
        return True
    n = 0
    for node in nodes:
        if node.op == "NONE":
            continue
        if any(s is not None and T.is_quantized(s.type) for s in node.src):
            return True
        n += 1
    return n >= WORTH_NUMBA


def available() -> bool:
    """Whether this process runs graphs on the compiled runner: numba loads, and in ggtool's command
    line and its workers the runner is in the kernel cache already (else it is compiled in the
    background for the next run, with the node kernels `make_program` asked for, and this one runs
    each node from Python, as before the runner, until a process compiling it ahead has made it:
    ``compiling.first_run.prepare_runner``)."""
    from .compiling import first_run

    if not first_run.ready_now("runner"):
        return False
    try:
        from .kernels import runner  # noqa: F401
    except GGToolError:   # numba cannot be loaded: the Python path computes f32 graphs without it
        return False
    return True


def kernel_ready(name: str) -> bool:
    """Whether node kernel `name` is compiled here (or may be: a library's process compiles it)."""
    return _cached(f"node:{name}")


def _cached(name: str) -> bool:
    """Whether kernel `name` runs compiled here now (``compiling.first_run.ready_now``: it is wished for
    the next run otherwise)."""
    from .compiling import first_run

    return first_run.ready_now(name)


def kernels_used(nodes, numerics: str) -> tuple[list[str], int]:
    """The node kernels a program of `nodes` would run (``kernels.nodes`` names, the most used first;
    fused steps are not counted: each node's own kernels stand for them) and how many nodes compute:
    what ``compiling.first_run.prepare_runner`` weighs."""
    count: dict[str, int] = {}
    n = 0
    for node in nodes:
        if not computes(node):
            continue
        n += 1
        try:
            mine = kernel_for(node).steps(node, numerics)
        except GGToolError:
            continue
        for s in mine:
            count[s.kernel] = count.get(s.kernel, 0) + 1
    return sorted(count, key=lambda k: (-count[k], k)), n


# -- the program (the caller's) ------------------------------------------------------------------------
@dataclass(frozen=True)
class Program:
    """Each step as (kernel name, or None: Python; node index; flags; the step's number among its
    node's compiled steps, FUSED: the node and the next in one step)."""
    steps: tuple
    nth: int

    @property
    def compiled(self) -> int:
        return sum(1 for s in self.steps if s[0] is not None)


def _uses(nodes) -> dict:
    """id(tensor) -> how many sources of nodes name it (a view counts as a use of what it views)."""
    uses: dict = {}
    for t in nodes:
        for s in t.src:
            if s is not None:
                uses[id(s)] = uses.get(id(s), 0) + 1
    return uses


_VIEWS = frozenset(("NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"))


def _changing(nodes) -> set:
    """id() of the roots whose bytes a compute of `nodes` changes: the nodes', and the tensors nodes
    write into (cpy, set_rows: their result is a view of them)."""
    return {id(t.root) for t in nodes if t.op not in _VIEWS}


def _fused(nodes, i: int, numerics: str, uses, keep: frozenset):
    """The fused step of nodes i and i+1 where the op fuses them (Kernel.fuse), else None: never for
    a node whose result is asked for (an output flag, or `keep`: the compute's outputs)."""
    from .tensor import FLAG_OUTPUT

    node = nodes[i]
    fuse = kernel_for(node).fuse
    if fuse is None or i + 1 >= len(nodes) or uses.get(id(node), 0) != 1 or node.flags & FLAG_OUTPUT \
            or id(node) in keep:
        return None
    try:
        return fuse(node, nodes[i + 1], numerics)
    except GGToolError:
        return None


def make_program(nodes, nth: int, numerics: str, compiled: bool = True, fuse: bool = False,
                 keep: frozenset = frozenset()) -> Program | None:
    """The steps of `nodes` for nth participants (see the module's docstring), or None where this
    process has no compiled runner (`available`; the kernels the steps would use are asked for all
    the same, for the next run) or the graph is not worth it (`worth`); `compiled` False: every step
    in Python (the runner's loop and barrier still). `fuse`: nodes GGML fuses (Kernel.fuse) are one
    step, where only the program's outputs matter (a compute in the graph allocator's buffer): the
    first node's result is then never written; `keep`: id() of the tensors asked for, never fused away."""
    if not worth(nodes):
        return None
    steps = []
    uses = _uses(nodes) if fuse and compiled else None
    changing = _changing(nodes)
    converted, since = None, -1       # the src1 mul_mat converted into the work buffer last, and its node

    def written_since(t) -> bool:
        """Whether a node after the last conversion wrote into t's bytes."""
        root = t.root
        return any(n.root is root and n.op not in _VIEWS for n in nodes[since + 1:i])

    skip = -1
    for i, node in enumerate(nodes):
        if i == skip or not computes(node):
            continue
        k = kernel_for(node)
        only0 = 0 if k.splits() else ONLY0
        if uses is not None:
            both = _fused(nodes, i, numerics, uses, keep)
            if both is not None and kernel_ready(both.kernel):
                steps.append((both.kernel, i, only0, FUSED))
                skip = i + 1
                continue
        mine = ()
        if compiled:
            try:
                mine = k.steps(node, numerics)
            except GGToolError:
                mine = ()
            # every step's kernels asked (not only up to the first missing): a first-ever run wishes
            # for all of them at once, for the next run
            if mine and not all([kernel_ready(s.kernel) and all([_cached(n) for n in s.needs])
                                 and not any(id(t.root) in changing for t in s.stable) for s in mine]):
                mine = ()
        if mine:
            first = 0
            if mine[0].kernel == CONVERT:
                key = (id(node.src[1]), mine[0].ints)
                if key == converted and not written_since(node.src[1]):
                    first = 1                   # the work buffer holds it already: no step, no barrier
                converted, since = key, i
            steps.extend((s.kernel, i, only0, j) for j, s in enumerate(mine) if j >= first)
        else:
            steps.append((None, i, only0, 0))
            converted = None                    # a Python step may use the work buffer
    out = []
    for n, (name, i, flags, j) in enumerate(steps):
        nxt = steps[n + 1] if n + 1 < len(steps) else None
        if nxt is not None and not (flags & ONLY0 and nxt[2] & ONLY0):
            flags |= BARRIER
        elif nxt is None and nth > 1:
            flags |= BARRIER      # the last: whoever passes it knows every participant has finished (pool.caller)
        out.append((name, i, flags, j))
    return Program(tuple(out), nth) if available() else None


# -- the tables (every participant's, in its own process) ----------------------------------------------
class Bound:
    """A program bound in one process: step rows with kernel addresses, the node tables, what they
    point into (kept alive), the prologues to run before each compute, and the rows of the steps that
    deal out their units (`dealt`) with the chunk counter's address they hold (`chunk`)."""

    __slots__ = ("chunk", "dealt", "epoch", "frows", "keep", "prologues", "rows", "steps")

    def fresh(self) -> bool:
        """Whether the repacked weights it holds are still the weights' (none dropped since bind)."""
        return self.epoch == packs_epoch()


def packs_epoch() -> int:
    """How many times repacked weights were dropped in this process (quant.matmul.EPOCH)."""
    import sys

    m = sys.modules.get("ggtool.quant.matmul")
    return 0 if m is None else m.EPOCH[0]


def address(t) -> int:
    """Where tensor t's data starts in this process."""
    return int(t.data.ctypes.data)


def describe(t) -> tuple:
    """A tensor's words in a table row: address, type, ne[4], nb[4]."""
    return (address(t), int(t.type), *t.ne, *t.nb)


def bind(program: Program, nodes, numerics: str, ith: int, nth: int) -> Bound:
    """The program's steps and tables in this process (see the module's docstring)."""
    from .kernels import nodes as kn
    from .kernels import nodes_mm  # noqa: F401 - registers mul_mat's kernels with kn
    from .kernels import runner as kr

    s_count = len(program.steps)
    steps = np.zeros((max(s_count, 1), kr.STEP_WIDTH), np.int64)[:s_count]
    rows = np.zeros((max(s_count, 1), kn.ROW), np.int64)
    frows = np.zeros((max(s_count, 1), kn.FROW), np.float64)
    keep, prologues, shared, dealt = [], [], {}, []
    specs: dict[int, tuple] = {}
    for n, (name, i, flags, j) in enumerate(program.steps):
        steps[n, kr.S_NODE], steps[n, kr.S_FLAGS], steps[n, kr.S_ROW] = i, flags, n
        if name is None:
            continue
        node = nodes[i]
        if j == FUSED:
            mine = (kernel_for(node).fuse(node, nodes[i + 1], numerics),)
            j = 0
        else:
            mine = specs.get(i)
            if mine is None:
                mine = specs[i] = kernel_for(node).steps(node, numerics)
        if j >= len(mine) or mine[j] is None or mine[j].kernel != name:
            raise GGToolError(f"node {i} '{node.name}' ({node.op_desc}): this process would compile it as "
                              f"{[s.kernel for s in mine if s is not None]}, its caller as {name} (step {j})")
        spec = mine[j]
        tensors = spec.tensors if spec.tensors is not None else (node, *node.src)
        r = rows[n]
        for k, t in enumerate(tensors):
            if t is not None:
                r[k * kn.TENSOR:(k + 1) * kn.TENSOR] = describe(t)
        ints = list(spec.ints)
        if spec.bind is not None:
            more, kept, prologue = spec.bind(ith, nth, shared)
            ints.extend(more)
            keep.append(kept)
            if prologue is not None:
                prologues.append(prologue)
        if len(ints) > kn.CHUNK_ADDR - kn.P or len(spec.floats) > kn.FROW:
            raise GGToolError(f"node {i}: too many parameters for a table row")  # pragma: no cover
        r[kn.P:kn.P + len(ints)] = ints
        if spec.deals:
            dealt.append(n)
        frows[n, :len(spec.floats)] = spec.floats
        steps[n, kr.S_FN] = kn.address(name)
    b = Bound()
    b.steps, b.rows, b.frows, b.keep, b.prologues = steps, rows, frows, keep, prologues
    b.epoch = packs_epoch()
    b.dealt, b.chunk = np.array(dealt, np.int64), 0
    return b


# -- running -------------------------------------------------------------------------------------------
class Sync:
    """One participant's view of the barrier block (``kernels.runner``: at `addr`, in shared memory for
    the pool, in this process for one participant), the wait bounds, and what to check while waiting
    (`check`: raises if a worker died)."""

    __slots__ = ("addr", "at_node", "check", "nth", "spin_ns", "wait_ns")

    def __init__(self, addr: int, nth: int, spin_ns: int, wait_ns: int, check=None, at_node: int = 0):
        self.addr, self.nth, self.spin_ns, self.wait_ns = addr, nth, spin_ns, wait_ns
        self.check, self.at_node = check, at_node

    def barrier(self) -> None:
        """Meet the other participants (a Python kernel's barrier inside, work.barrier())."""
        from .kernels import runner as kr

        if self.nth <= 1:
            return
        state = kr.new_state()
        while True:
            r = kr.barrier(self.addr, self.nth, state, self.spin_ns, time.monotonic_ns() + self.wait_ns)
            if r == DONE:
                return
            if r == ABORTED:
                raise Aborted
            if self.check is not None:
                self.check()


def deal_from(bound: Bound, sync: Sync, nth: int) -> None:
    """Point the steps that deal out their units at this compute's chunk counter (the barrier block's),
    or at none where a participant is alone (it then takes every unit in turn): what `participate`
    does first, and what any other loop over the bound steps must do (bench/bench_steps.py's)."""
    from .kernels import nodes as kn
    from .kernels import runner as kr

    chunk = sync.addr + 64 * kr.CHUNK if nth > 1 else 0
    if bound.chunk != chunk and len(bound.dealt):
        bound.rows[bound.dealt, kn.CHUNK_ADDR] = chunk
    bound.chunk = chunk


def participate(bound: Bound, nodes, ith: int, nth: int, work, sync: Sync, progress=None):
    """Run the program bound for `nodes` as participant ith of nth; None, or (node index, message)
    where a kernel failed (the abort flag is then set). Raises Aborted when another participant
    stopped the graph, and whatever `sync.check` raises. `work` (a ggtool.compute.Work) is what
    Python steps get."""
    from .kernels import runner as kr

    for prologue in bound.prologues:
        prologue()
    deal_from(bound, sync, nth)
    state = kr.new_state()
    steps = bound.steps
    while True:
        deadline = time.monotonic_ns() + sync.wait_ns
        r = kr.run(steps, bound.rows, bound.frows, ith, nth, int(work.wdata.ctypes.data), sync.addr, sync.at_node,
                   state, sync.spin_ns, deadline)
        if r == DONE:
            if progress is not None:
                progress.node = len(nodes) - 1
            return None
        s = int(state[kr.ST_STEP])
        if progress is not None and s < len(steps):
            progress.node = int(steps[s, kr.S_NODE])
        if r == TIMEOUT:
            if sync.check is not None:
                sync.check()
            continue
        if r == ABORTED:
            raise Aborted
        i = int(steps[s, kr.S_NODE])
        alone = steps[s, kr.S_FLAGS] & ONLY0
        if r == PYTHON:
            try:
                with np.errstate(all="ignore"):   # inf and NaN are results, as in GGML
                    run_node(i, nodes[i], 0 if alone else ith, 1 if alone else nth, work)
            except ComputeError as e:
                if nth > 1:
                    kr.set_abort(sync.addr)
                return i, str(e)
            state[kr.ST_SKIP] = 1
            continue
        # ERROR: the node's Python forward says what (it meets no barrier: the others stop)
        return i, _error_message(i, nodes[i], 0 if alone else ith, 1 if alone else nth, work, int(state[kr.ST_CODE]))


def _error_message(i: int, node, ith: int, nth: int, work, code: int) -> str:
    quiet = type(work)(work.wdata, None, work.numerics)   # no barrier in the re-run: the others stopped
    # this participant's share first; then the whole node, since a compiled step may share the work
    # out otherwise than the Python forward does (mm_convert splits a row's blocks, the forward rows)
    for share in ((ith, nth), (0, 1)) if nth > 1 else ((ith, nth),):
        try:
            with np.errstate(all="ignore"):
                run_node(i, node, *share, quiet)
        except ComputeError as e:
            return str(e)
        except Aborted:   # pragma: no cover
            pass
    return str(node_error(i, node, GGToolError(f"its compiled kernel failed (code {code}) where its Python "
                                                f"forward does not: a bug in ggtool")))
