"""What passes between the caller and its workers: the messages, the control segment's layout,
and the graph as the workers see it.

- Messages are small named tuples (`encode`d as plain tuples over each worker's socket): the caller sends `Init`,
  then `Run`, `Map`, `Preload` or `Exit`; a worker answers `Init` with `Ready` (or `Error`), `Run`
  with `Done`, `Failed` (a kernel's error), `Stopped` (another participant stopped the graph) or
  `Error` (it could not run it), and `Map` with `Results`, `Raised` or `Error`.
- The control segment is int64 slots shared by all participants, a 64-byte line each: first the
  compiled runner's barrier block (``ggtool.kernels.runner``: the arrivals, the generation, the
  sleepers, the abort flag `ABORT` and the chunk counter `CHUNK`, a line each), then participant i's line: `arrivals(i)` (its
  counter for the Python barrier, `barrier.Barrier`, where the compiled runner is not loaded) and
  `at_node(i)` (the node it is computing, -1: none yet), and for a worker `rung` and `answered`; then
  a second line for each worker: its `standby` word, where the caller may hand it a compute
  without a message (`handed`, `outcome`).
- The graph: the caller `describe`s it (per tensor: type, ne, nb, op, op_params, sources, data
  offset, buffer) and `pack`s it with its kernels and the workers' program (the compiled runner's
  steps, ``ggtool.runner.Program``, or the Python path's, `barrier.programs`); a worker `install`s
  it, rebuilding light Tensor objects on the shared buffers, and caches the result so that
  computing the same graph again only needs a `Run` of its key. A graph its owner freezes (a
  generation step's, computed once per token) is described once per plan (`Described`): a step
  then costs a few checks, not a walk over every tensor.
"""

from __future__ import annotations

import operator
import pickle
from typing import Any, NamedTuple

import numpy as np

from ..compute import written
from ..errors import GGToolError
from ..tensor import Tensor
from .segments import share_context


# -- the messages ---------------------------------------------------------------------------------
class Init(NamedTuple):
    """The first message: the control segment to attach; `command_line`: whether the caller is
    ggtool's command line (else a library's process: role.LIBRARY_CALLER); `slot`: this worker's
    line in it (its place in the pool, 1.., the participant it is in every Run: see `rung`)."""
    ctl_name: str
    ctl_size: int
    command_line: bool
    slot: int


class Run(NamedTuple):
    """Compute graph `key` as participant `ith` of `nth`, from barrier generation `generation` (the
    Python barrier's), spinning `spin_ns` at a compiled barrier before sleeping. `placed`: the caller
    chose the CPU this wake-up runs on (placement.wake_on). `graph`: the packed description, the first
    time this worker gets the graph (else None); `attach`: (segment, size) to map first;
    `drop_segments` and `drop_graphs`: what the caller no longer has. `linger_ns`: how long to spin,
    once answered, for the caller's next message (see `rung`) before sleeping on the bell."""
    key: int
    ith: int
    nth: int
    generation: int
    spin_ns: int
    linger_ns: int
    placed: bool
    graph: bytes | None
    attach: list
    drop_segments: list
    drop_graphs: list


class Map(NamedTuple):
    """[fn(x) for x in items]."""
    fn: Any
    items: list


class Preload(NamedTuple):
    """Load the compiled kernels now, in the background (no reply)."""


class Exit(NamedTuple):
    """Exit now (no reply)."""


class Ready(NamedTuple):
    pid: int


class Done(NamedTuple):
    """The graph ran to its end here."""


class Failed(NamedTuple):
    """A kernel failed: the node and the error's message (as a single-process run says it)."""
    node: int
    message: str


class Stopped(NamedTuple):
    """Another participant stopped the graph first."""


class Error(NamedTuple):
    """The worker could not do what it was sent (its caches are cleared: send everything again)."""
    message: str


class Results(NamedTuple):
    values: list


class Raised(NamedTuple):
    """fn raised this (picklable) exception."""
    exception: BaseException


MESSAGES = (Init, Run, Map, Preload, Exit, Ready, Done, Failed, Stopped, Error, Results, Raised)
_KINDS = {cls: kind for kind, cls in enumerate(MESSAGES)}


def encode(msg: tuple) -> tuple:
    """A message as it travels: a plain tuple, its kind's number then its fields. (A named tuple
    pickles as its class, which both sides would look up at every message: several times slower,
    and a compute sends two per worker.)"""
    return (_KINDS[type(msg)], *msg)


def decode(raw: tuple):
    """The message `encode` made `raw` from."""
    return MESSAGES[raw[0]]._make(raw[1:])


# -- the control segment: int64 slots, a 64-byte line each ------------------------------------------
MAX_PARTICIPANTS = 256
LINE = 8                 # int64 slots per 64-byte cache line
SYNC_LINES = 5           # the compiled runner's barrier block (kernels.runner: BARRIER_WORDS)
N_BARRIER, N_PASSED, SLEEPERS = 0, LINE, 2 * LINE   # its slots: arrivals, generation, sleepers
ABORT = 3 * LINE         # slot: non-zero once a participant stopped the graph (the block's abort word)
CHUNK = 4 * LINE         # slot: the units of work a step deals out taken so far (kernels.runner.CHUNK)
# in participant i's line: its Python barrier's counter, the node it computes; for a worker, the
# messages the caller has sent it and the answers it has sent (see `rung`)
ARRIVALS, AT_NODE, RUNG, ANSWERED = 0, 1, 2, 3
# in worker i's second line (after every participant's first): its standby word and a handed compute's
# Run (see `handed`), and how it answered that compute (`outcome`)
STANDBY, H_KEY, H_NTH, H_GENERATION, H_SPIN, H_LINGER, OUTCOME = range(7)
QUIET, ON_SOCKET = 0, 1      # outcomes: done (nothing sent), or its answer is on the socket
ASLEEP, LISTENING, CLAIMED = 0, 1, 2     # a standby word's states (kernels.runner's, which loads numba: kept in step)
CTL_SIZE = (SYNC_LINES + 2 * MAX_PARTICIPANTS) * LINE * 8


def arrivals(ith: int) -> int:
    """The slot of participant ith's arrival counter (the Python barrier): only it writes it, ever
    increasing."""
    return (SYNC_LINES + ith) * LINE + ARRIVALS


def at_node(ith: int) -> int:
    """The slot of the node participant ith is computing (-1: none yet), for the caller's report
    of a worker that died."""
    return (SYNC_LINES + ith) * LINE + AT_NODE


def rung(ith: int) -> int:
    """The slot counting the messages the caller has sent worker ith since its Init (the caller
    alone writes it, after the message and its bell): a worker that has just answered spins on it
    for a while (Run.linger_ns) before it sleeps on its bell, so that a decode step's next compute
    finds it awake, as GGML's threads poll for the next graph. The bell and the socket still carry
    every message: the slot only says one is there."""
    return (SYNC_LINES + ith) * LINE + RUNG


def answered(ith: int) -> int:
    """The slot counting the answers worker ith has given (it alone writes it, just before it sends
    each: a caller that has read an answer knows the count has moved): a caller done with its own
    part spins on it for a moment before it reads the sockets, and waits on it for a handed
    compute's answer (`standby`)."""
    return (SYNC_LINES + ith) * LINE + ANSWERED


def standby(ith: int) -> int:
    """The slot of worker ith's standby word (``kernels.runner``: ASLEEP, LISTENING, CLAIMED). A worker
    that has answered a compute of the compiled runner listens there (``kernels.runner.listen``, for
    Run.linger_ns) for the next compute; a caller whose next compute is of a graph that worker holds
    already, with nothing to attach, writes the Run's fields in the worker's line (`handed`) and claims
    it (``kernels.runner.hand``): the compute starts without a message (a pickled Run, a bell, a
    socket read, ~25 us of Python a worker each way). The worker answers a Done by `outcome` QUIET and
    every other answer (a failure, a stop, an error) on its socket as before (ON_SOCKET), then counts
    it in `answered`: the caller waits on that count, and watches the worker's process meanwhile."""
    return (SYNC_LINES + MAX_PARTICIPANTS + ith) * LINE + STANDBY


def handed(ith: int, field: int) -> int:
    """The slot of a handed compute's field (H_KEY, H_NTH, H_GENERATION, H_SPIN, H_LINGER) in worker
    ith's second line: written by the caller before its claim, read by the worker after it."""
    return (SYNC_LINES + MAX_PARTICIPANTS + ith) * LINE + field


def outcome(ith: int) -> int:
    """The slot saying how worker ith answered its last compute: QUIET (done) or ON_SOCKET; written
    before the worker counts the answer in `answered`."""
    return (SYNC_LINES + MAX_PARTICIPANTS + ith) * LINE + OUTCOME


# -- the graph --------------------------------------------------------------------------------------
_FIELDS = operator.attrgetter("type", "ne", "nb", "op", "flags", "_name", "struct_offset", "data_offset",
                              "view_offs")


# -- the caller's side ----------------------------------------------------------------------------
def describe(graph, plan, contexts=None):
    """Every tensor the graph's nodes reach, as plain tuples (nodes first, then their sources):
    (fields, op_params bytes, buffer, view_src index, src indices); buffer is the name of the
    shared segment holding the tensor's context pool, or its FileStorage. Also the kernels by op,
    and the work buffer (segment, offset, size) with the plan's numerics. Everything the workers'
    copy is built from. `contexts` (a dict), if given, receives every context shared, by id."""
    nodes = graph.nodes
    order = list(nodes)
    index = {id(t): i for i, t in enumerate(order)}
    k = 0
    while k < len(order):  # sources and view sources, breadth-first after the nodes
        t = order[k]
        k += 1
        for s in (*t.src, t.view_src):
            if s is not None and id(s) not in index:
                index[id(s)] = len(order)
                order.append(s)
    bufs: dict[int, str] = {}
    records = []
    append = records.append
    for t in order:
        buf = t.storage
        if buf is None:
            buf = bufs.get(id(t.ctx))
            if buf is None:
                buf = bufs[id(t.ctx)] = share_context(t.ctx).name
                if contexts is not None:
                    contexts[id(t.ctx)] = t.ctx
        vs = t.view_src
        append((_FIELDS(t), t.op_params.tobytes(), buf, -1 if vs is None else index[id(vs)],
                tuple([-1 if s is None else index[id(s)] for s in t.src])))
    from ..ops import kernel_for

    kernels = {}
    for t in nodes:
        if t.op != "NONE" and t.op_desc not in kernels:
            kernels[t.op_desc] = kernel_for(t).forward
    kernels = {op: fn for op, fn in kernels.items() if fn is not None}
    work_seg = bufs.get(id(graph.ctx)) or share_context(graph.ctx).name
    if contexts is not None:
        contexts[id(graph.ctx)] = graph.ctx
    return tuple(records), kernels, work_of(plan, work_seg)


def work_of(plan, work_seg: str) -> tuple:
    """The work buffer as a description holds it: (segment, offset, size, numerics)."""
    return (work_seg, plan.work_offset, plan.work_size, plan.numerics)


class Described:
    """A frozen graph's description, made once per plan: what a later compute checks, without
    describing the graph again, to know it may just `Run` what the workers hold. The graph's
    tensors are promised unchanged (WorkerPool.freeze); where their bytes are can still change
    (a context grown into a new segment, another work buffer, the nodes bound anew by a compute
    of another alloc mode or outputs), and that is checked at each compute."""

    __slots__ = ("binding", "fingerprint", "graph", "n_nodes", "plan", "shared", "work")

    def __init__(self, graph, plan, fingerprint, contexts: dict, work: tuple):
        import weakref

        self.graph, self.plan = weakref.ref(graph), weakref.ref(plan)
        self.n_nodes, self.fingerprint, self.work = graph.n_nodes, fingerprint, work
        self.shared = tuple((weakref.ref(c), share_context(c).name) for c in contexts.values())
        self.binding = None if graph.binding is None else weakref.ref(graph.binding)   # where the nodes are

    def holds(self, graph, plan) -> bool:
        """Is the description still the graph's as `plan` computes it? (Shares the contexts again
        where one has grown, as describe would.)"""
        if self.graph() is not graph or self.plan() is not plan or graph.n_nodes != self.n_nodes:
            return False
        was = None if self.binding is None else self.binding()   # the nodes placed anew since (another
        if (self.binding is not None and was is None) or was is not graph.binding:   # alloc mode, outputs)?
            return False
        for ref, name in self.shared:
            ctx = ref()
            if ctx is None or share_context(ctx).name != name:
                return False
        return work_of(plan, share_context(graph.ctx).name) == self.work


def pack(records, n_nodes: int, kernels: dict, work, progw, program=None) -> bytes:
    """Pickle a graph description. Kernels go by reference (module and name); a kernel that pickle
    cannot name (a closure made by a factory, a lambda) goes as (module, qualname): the worker imports
    the module and takes the kernel its registry then holds for the op, if it is the same function."""
    shipped = {}
    for op, fn in kernels.items():
        module = getattr(fn, "__module__", None)
        if module == "__main__":
            raise GGToolError(f"the kernel of op {op} ({getattr(fn, '__qualname__', fn)}) cannot be sent to the "
                              "worker processes: it is defined in the __main__ script, which they do not import; "
                              "define it in an importable module")
        try:
            pickle.dumps(fn)
            shipped[op] = fn
        except Exception:
            shipped[op] = (module, getattr(fn, "__qualname__", repr(fn)))
    try:
        return pickle.dumps((records, n_nodes, shipped, work, progw, program), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise GGToolError(f"the graph cannot be sent to the worker processes: {e}") from None


# -- the worker's side ----------------------------------------------------------------------------
def _resolve_kernels(shipped: dict) -> dict:
    """Worker side: op -> forward, from the shipped functions or this process's registry."""
    import importlib

    from ..ops.base import KERNELS

    out = {}
    for op, fn in shipped.items():
        if isinstance(fn, tuple):
            module, qualname = fn
            if module:
                importlib.import_module(module)
            k = KERNELS.get(op)
            got = None if k is None else k.forward
            if got is None or (got.__module__, got.__qualname__) != (module, qualname):
                raise GGToolError(f"the kernel of op {op} ({module}.{qualname}) is not registered in the worker "
                                  "processes: register it when its module is imported")
            fn = got
        out[op] = fn
    return out


class _Ctx:
    """Worker-side stand-in for a Context: tensors only need its `.buffer`."""

    __slots__ = ("buffer",)

    def __init__(self, buffer):
        self.buffer = buffer


class WorkerGraph:
    """A graph installed in a worker: its nodes, program (the compiled runner's `program`, bound in
    this process on first use: `bound`, else the Python path's `prog`), work buffer, kernels and
    segments used."""

    __slots__ = ("bound", "kernels", "nodes", "numerics", "prog", "program", "segs", "wdata", "written")


def install(blob: bytes, segs: dict) -> WorkerGraph:
    records, n_nodes, kernels, (wseg, woff, wsize, numerics), progw, program = pickle.loads(blob)
    ctxs: dict[str, _Ctx] = {}
    nostore = _Ctx(None)
    tensors = []
    for (type_, ne, nb, op, flags, name, soffs, doffs, voffs), params, buf, _vs, _src in records:
        if isinstance(buf, str):
            ctx = ctxs.get(buf)
            if ctx is None:
                ctx = ctxs[buf] = _Ctx(segs[buf])
            storage = None
        else:
            ctx, storage = nostore, buf
        t = Tensor(ctx, type_, ne, nb, soffs, doffs, storage)
        t.op = op
        t.op_params = np.frombuffer(params, dtype=np.int32).copy()
        t.flags, t._name, t.view_offs = flags, name, voffs
        tensors.append(t)
    for t, (_, _, _, vs, src) in zip(tensors, records):
        t.view_src = None if vs < 0 else tensors[vs]
        t.src = [None if s < 0 else tensors[s] for s in src]
    wg = WorkerGraph()
    wg.nodes = tensors[:n_nodes]
    wg.written = written(wg.nodes)
    wg.prog = progw
    wg.program, wg.bound = program, None
    wg.wdata = segs[wseg][woff: woff + wsize] if woff is not None else segs[wseg][:0]
    wg.numerics = numerics
    wg.kernels = _resolve_kernels(kernels)
    wg.segs = set(ctxs) | {wseg}
    return wg
