"""The graph driver (ggml_graph_compute): every node's forward, in order, with the plan's work buffer."""

from __future__ import annotations

import itertools
import sys
import weakref

import numpy as np

from . import runner
from .context import OBJECT_SIZE, pad
from .errors import ComputeError, GGToolError, OutOfMemoryError, memory_limit
from .kernels.numerics import resolve
from .plan import Plan, make_plan
from .runner import node_error, run_node  # noqa: F401 - ggtool.compute.run_node, as before the runner
from .threads import single_threaded


class Work:
    """What a kernel gets besides its node: the work buffer, the barrier, and the numerics, resolved
    (``ggtool.kernels.numerics``): "ggml" (GGML's scalar reference order of float operations),
    "llama.cpp-avx512" or "llama.cpp-avx2" (llama.cpp's x86-64 builds' orders,
    ``ggtool.kernels.x86``), which mul_mat, soft_max, rope, gelu and silu follow."""

    __slots__ = ("wdata", "_barrier", "numerics")

    def __init__(self, wdata: np.ndarray, barrier=None, numerics: str = "ggml"):
        self.wdata = wdata
        self._barrier = barrier
        self.numerics = numerics

    def barrier(self) -> None:
        if self._barrier is not None:
            self._barrier()


class Progress:
    """The index of the node participant 0 is computing (-1 before the first), written as it goes:
    a thread may watch a long compute through it (the CLI's progress bar does) at no cost to it."""

    __slots__ = ("node",)

    def __init__(self):
        self.node = -1


def work_view(graph, plan: Plan) -> np.ndarray:
    buf = graph.ctx.buffer
    return buf[plan.work_offset: plan.work_offset + plan.work_size]


ALLOC_MODES = ("context", "graph")


def prepare(graph, n_threads: int = 1, plan: Plan | None = None, alloc: str = "context", outputs=(),
            numerics: str | None = None) -> Plan:
    """Plan the graph and allocate its work buffer in the pool (ggml_graph_compute_with_ctx).

    alloc "context": every node computes into its own memory in the context (GGML's context
    mode). alloc "graph": the nodes compute into one compute buffer planned by ggtool.alloc
    (ggml_gallocr), where intermediates reuse memory; only `outputs` (and the OUTPUT flag) are
    sure to keep their values after the compute (see `bind`). `numerics` (see `Work`) is kept in
    the plan, resolved; None leaves the plan's own (default "ggml"), resolved too."""
    if alloc not in ALLOC_MODES:
        raise GGToolError(f"alloc must be one of {', '.join(ALLOC_MODES)}, not {alloc!r}")
    if numerics is not None:     # "llama.cpp" becomes the variant this CPU's build runs
        numerics = resolve(numerics)
    materialize_written(graph)
    verify_maps(graph)
    plan = plan or make_plan(graph, n_threads)
    # a given plan's own name too: kernels and workers see only a resolved one
    plan.numerics = numerics if numerics is not None else resolve(plan.numerics)
    if alloc == "graph":
        plan.allocation = bind(graph, outputs, plan)
    else:
        unbind(graph)
    if plan.work_offset is None:
        if alloc == "context":
            check_memory(graph, plan)
        plan.work_offset = graph.ctx.new_buffer(plan.work_size)
    return plan


_VIEW_OPS = frozenset(("NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"))


def written(nodes):
    """The tensors nodes write into: the sources of ops whose result is a view of them (cpy, clamp)."""
    return [n.view_src for n in nodes if n.view_src is not None and n.op not in _VIEW_OPS]


def forget_packs(tensors) -> None:
    """Drop the repacked forms of these weights (their bytes change with each compute); in every
    process that computes, the workers too."""
    packs = sys.modules.get("ggtool.quant.matmul")   # loaded only once something was repacked
    if packs is not None:
        for t in tensors:
            packs.forget(t)


def materialize_written(graph) -> None:
    """A memory-mapped tensor (a GGUF weight, a .npy input) a node writes into is copied into the
    context first (Context.materialize): the map is read-only, and a file is never written."""
    targets = _written_of(graph)
    for t in targets:
        if t.storage is not None:
            t.ctx.materialize(t)
    forget_packs(targets)


def _once_if_frozen(found: weakref.WeakKeyDictionary, graph, find):
    """find(graph), kept in `found` for a frozen graph (its tensors keep their fields: what it
    writes and reads stays the same), found again at every compute for any other."""
    if graph not in _FROZEN:
        return find(graph)
    got = found.get(graph)
    if got is None:
        got = found[graph] = find(graph)
    return got


_WRITTEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # frozen graph -> written(nodes)
_FROZEN_MAPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # frozen graph -> maps_read(graph)


def _written_of(graph) -> list:
    """written(graph.nodes), once for a frozen graph."""
    return _once_if_frozen(_WRITTEN, graph, lambda g: written(g.nodes))


def verify_maps(graph) -> None:
    """Every memory-mapped file the graph reads still holds what was mapped (a shrunk one would end
    the compute with SIGBUS): one stat per file, at every compute. A frozen graph's files are found
    once (what it writes was copied out of its file before, by materialize_written): gemma-3's
    decode step has 277 leafs, walked at every step before (0.06-0.2 ms, with the caches cold after
    the step, while the workers wait)."""
    for storage in _once_if_frozen(_FROZEN_MAPS, graph, maps_read):
        storage.verify()


def maps_read(graph) -> list:
    """The memory-mapped files (storages with `verify`) the graph's leafs read, each once: equal
    storages are one file (a GGUF's tensors each have their own)."""
    seen: dict = {}
    for t in graph.leafs:
        storage = t.root.storage
        if getattr(storage, "verify", None) is not None and storage not in seen:
            seen[storage] = None
    return list(seen)


class Binding:
    """A graph's nodes placed in a compute buffer of its context (`bind`): the Allocation, the
    buffer's payload offset and size, the outputs it was made for, and every moved tensor's
    context-mode data offset (restored by `unbind`)."""

    __slots__ = ("allocation", "offset", "size", "outputs", "kept", "saved", "__weakref__")   # a frozen graph's
    # description on the pool (pool.wire.Described) holds its binding weakly, to see it replaced

    def __init__(self, allocation, offset: int, size: int, outputs: frozenset, saved: list, kept: frozenset = frozenset()):
        self.allocation, self.offset, self.size, self.outputs, self.saved = allocation, offset, size, outputs, saved
        self.kept = kept        # id() of the outputs and their roots: results a compute must write


def bind(graph, outputs=(), plan: Plan | None = None):
    """Place the graph's nodes in a compute buffer as ggml_gallocr would, and return the Allocation.

    The buffer is one object of the graph's context (so it moves into shared memory with it); its
    bytes are counted apart from the GGML context size (`Context.compute_buffer_bytes`). Each node
    the allocation places, and each view of one, points into it (`data_offset`); their own memory
    in the context is left untouched. The nodes stay bound until `unbind` (a compute with alloc
    "context" unbinds); binding again with the same outputs reuses the placement and the buffer."""
    from .alloc import allocate

    outputs = list(outputs)
    key = frozenset(id(t) for t in outputs)
    b = graph.binding
    if b is not None and b.outputs == key:
        return b.allocation
    allocation = allocate(graph, outputs)
    if plan is not None:
        check_memory(graph, plan, allocation=allocation)
    ctx = graph.ctx
    unbind(graph)
    buf = graph.compute_buffer
    if buf is None or buf[1] < allocation.size:   # GGML reallocates a buffer grown too small
        buf = (ctx.new_buffer(allocation.size, "the compute buffer"), allocation.size)
        ctx.compute_buffer_bytes += OBJECT_SIZE + pad(allocation.size)
        graph.compute_buffer = buf
    base, saved = buf[0], []
    for t in graph.nodes:
        off = allocation.offsets.get(id(t))
        if off is not None:
            saved.append((t, t.data_offset))
            t.data_offset = base + off
    for t in itertools.chain(graph.nodes, graph.leafs):
        vs = t.view_src
        if vs is not None and id(vs) in allocation.offsets:
            saved.append((t, t.data_offset))
            t.data_offset = vs.data_offset + t.view_offs
    kept = key | frozenset(id(t.root) for t in outputs)
    graph.binding = Binding(allocation, buf[0], buf[1], key, saved, kept)
    return allocation


def unbind(graph) -> None:
    """Give every node bound by `bind` its own memory in the context back (context mode)."""
    b = graph.binding
    if b is not None:
        for t, off in reversed(b.saved):
            t.data_offset = off
        graph.binding = None


def memory_needed(graph, plan: Plan, allocation=None) -> tuple[int, int, int]:
    """(inputs, intermediates, work): the bytes a compute fills. Inputs are the leafs whose data
    is in a context's pool (memory-mapped GGUF data is the file's, and can be paged out);
    intermediates, every node with data of its own in context mode, the compute buffer with an
    `allocation`."""
    inputs = sum(t.nbytes for t in graph.leafs if t.storage is None and t.view_src is None and t.has_data)
    if allocation is not None:
        own = allocation.size
    else:
        own = sum(t.nbytes for t in graph.nodes if t.view_src is None and t.op != "NONE" and t.has_data)
    return inputs, own, plan.work_size


def check_memory(graph, plan: Plan, limit: int | None = None, allocation=None) -> None:
    """Refuse, with OutOfMemoryError, a compute that would fill more memory than the machine has:
    the pool's pages are reserved, not allocated, so it would run until the kernel killed it."""
    limit = memory_limit() if limit is None else limit
    inputs, own, work = memory_needed(graph, plan, allocation)
    total = inputs + own + work
    if limit is not None and total > limit:
        what = "compute buffer" if allocation is not None else "intermediates"
        raise OutOfMemoryError(f"computing the graph (inputs {inputs}, {what} {own}, work buffer {work})", total)


def graph_compute(graph, n_threads: int = 1, pool=None, plan: Plan | None = None, progress: Progress | None = None,
                  alloc: str = "context", outputs=(), numerics: str | None = None, observe=None) -> Plan:
    """ggml_graph_compute (with ggml_graph_plan unless `plan` is given): run the graph, return the plan.

    `pool` runs it on a WorkerPool; `progress` (a Progress) follows the node being computed. alloc
    "graph" computes in a compute buffer planned as ggml_gallocr does, where only `outputs` keep
    their values; "context" (the default) gives every node its own memory. numerics "llama.cpp" sums as
    llama.cpp's x86-64 build for this CPU (ggtool.kernels.numerics); the default "ggml" as GGML's reference.

    `observe` is GGML's eval callback (cb_eval, what llama-imatrix collects with): an object with
    `wants(node) -> bool`, asked once per node and compute, and `__call__(node)`, called for each
    node it wants, in node order, once that node is computed and while its sources (`node.src`)
    still hold the values it read. In one process the call comes as the node finishes; on the pool,
    after the compute, the wanted nodes' sources then kept by the allocation as outputs are."""
    wanted = [] if observe is None else [i for i, n in enumerate(graph.nodes) if observe.wants(n)]
    threads = plan.n_threads if plan is not None else n_threads
    if wanted and pool is not None and threads > 1:     # their sources must outlive the compute
        outputs = [*outputs, *(s for i in wanted for s in graph.nodes[i].src if s is not None)]
    plan = prepare(graph, n_threads, plan, alloc, outputs, numerics)
    if pool is not None and plan.n_threads > 1:
        pool.run(graph, plan, progress)
        for i in wanted:
            observe(graph.nodes[i])
    else:
        run_in_process(graph, plan, progress, (observe, frozenset(wanted)) if wanted else None)
    return plan


def run_in_process(graph, plan: Plan, progress: Progress | None = None, observe=None) -> None:
    """Every node in this process as participant 0 of 1: on the compiled runner (``ggtool.runner``)
    where this process has it and no node is observed, else node after node from Python; `observe`
    (callback, node indices) is called with each of those nodes as it finishes (see graph_compute)."""
    work = Work(work_view(graph, plan), numerics=plan.numerics)
    callback, wanted = observe if observe is not None else (None, ())
    bound = _bound(graph, plan) if COMPILED and not wanted else None
    if bound is not None:
        with single_threaded():
            failed = runner.participate(bound, graph.nodes, 0, 1, work, _Alone.sync(), progress)
        if failed is not None:
            raise ComputeError(failed[1])
        return
    with single_threaded(), np.errstate(all="ignore"):
        for i, node in enumerate(graph.nodes):
            if progress is not None:
                progress.node = i
            run_node(i, node, 0, 1, work)
            if i in wanted:
                callback(node)


# False: every compute runs its nodes from Python, as before the compiled runner (tests compare both)
COMPILED = True

_FROZEN: weakref.WeakSet = weakref.WeakSet()
_BOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # frozen graph -> (key, Bound)


def freeze(graph) -> None:
    """Promise that `graph`'s tensors keep their fields (ops, parameters, sources, shapes, data
    offsets: only their data changes) for as long as it lives, as a generation step's graph does:
    its compiled steps are then made once per plan, not at every compute (WorkerPool.freeze promises
    the same to the pool)."""
    _FROZEN.add(graph)


def _bound(graph, plan: Plan):
    """The graph's compiled steps for one participant in this process (None where it has no compiled
    runner), kept for a frozen graph while its plan, numerics, node placement and the contexts'
    buffers are those they were made for."""
    from .compiling import first_run

    frozen = graph in _FROZEN
    got = _BOUND.get(graph) if frozen else None
    if got is not None:
        contexts = got[2]
    else:
        contexts = [weakref.ref(c) for c in {id(t.ctx): t.ctx for t in itertools.chain(graph.nodes, graph.leafs)
                                             if t.storage is None}.values()]
    buffers = tuple(None if c() is None else c().buffer.ctypes.data for c in contexts)
    # the kernels compiled ahead so far (first_run.stamp): the program is made again when one more is ready
    key = (id(plan), plan.numerics, id(graph.binding), plan.work_offset, buffers, first_run.stamp(),
           "numba" in sys.modules)      # runner.worth
    if got is not None and got[0] == key and (got[1] is None or got[1].fresh()):
        return got[1]       # None: no runner for it (yet), not asked again every step
    b = graph.binding
    program = runner.make_program(graph.nodes, 1, plan.numerics, fuse=b is not None, keep=b.kept if b else frozenset())
    bound = None if program is None else runner.bind(program, graph.nodes, plan.numerics, 0, 1)
    if frozen:
        _BOUND[graph] = (key, bound, contexts)
    return bound


class _Alone:
    """The barrier block of a participant alone (no barrier is ever met; the runner reads its abort
    word), one per process."""
    _block = None

    @classmethod
    def sync(cls):
        if cls._block is None:
            cls._block = np.zeros(64, np.int64)
        return runner.Sync(int(cls._block.ctypes.data), 1, 0, int(runner.CHECK_EVERY * 1e9))
