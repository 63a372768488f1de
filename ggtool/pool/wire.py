"""The graph as the workers see it: a compact picklable description, sent once per graph.

The caller `describe`s a graph (per tensor: type, ne, nb, op, op_params, sources, data offset,
buffer) and `pack`s it with its kernels and the workers' program; a worker `install`s it, rebuilding
light Tensor objects on the shared buffers, and caches the result so that computing the same graph
again only needs "run graph #k".
"""

from __future__ import annotations

import operator
import pickle

import numpy as np

from ..compute import written
from ..errors import GGToolError
from ..tensor import Tensor
from .segments import share_context

_FIELDS = operator.attrgetter("type", "ne", "nb", "op", "flags", "_name", "struct_offset", "data_offset",
                              "view_offs")


# -- the caller's side ----------------------------------------------------------------------------
def describe(graph, plan):
    """Every tensor the graph's nodes reach, as plain tuples (nodes first, then their sources):
    (fields, op_params bytes, buffer, view_src index, src indices); buffer is the name of the
    shared segment holding the tensor's context pool, or its FileStorage. Also the kernels by op,
    and the work buffer (segment, offset, size) with the plan's numerics. Everything the workers'
    copy is built from."""
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
    return tuple(records), kernels, (work_seg, plan.work_offset, plan.work_size, plan.numerics)


def pack(records, n_nodes: int, kernels: dict, work, progw) -> bytes:
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
        return pickle.dumps((records, n_nodes, shipped, work, progw), protocol=pickle.HIGHEST_PROTOCOL)
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
    """A graph installed in a worker: its nodes, program, work buffer, kernels and segments used."""

    __slots__ = ("kernels", "nodes", "numerics", "prog", "segs", "wdata", "written")


def install(blob: bytes, segs: dict) -> WorkerGraph:
    records, n_nodes, kernels, (wseg, woff, wsize, numerics), progw = pickle.loads(blob)
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
    wg.wdata = segs[wseg][woff: woff + wsize] if woff is not None else segs[wseg][:0]
    wg.numerics = numerics
    wg.kernels = _resolve_kernels(kernels)
    wg.segs = set(ctxs) | {wseg}
    return wg
