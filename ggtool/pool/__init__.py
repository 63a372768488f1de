"""The worker pool: GGML's compute threads as processes over shared memory (ggml_graph_compute
and its thread pool).

Python threads cannot run the numpy kernels of one node in parallel, so `WorkerPool` starts N-1
worker processes once and reuses them for every graph; the calling process takes part as worker 0,
as GGML's main thread does. For each graph:

- Every context whose pool the graph touches is moved into a POSIX shared-memory segment
  (`segments.share_context`; the plan's work buffer and the graph allocator's compute buffer live in
  the graph context's pool, so they move too). Only the bytes tensors can read are copied into it
  (`segments.shared_ranges`: leafs' data, the nodes' data where they compute, the work and compute
  buffers), so nodes placed in a compute buffer cost no shared memory for their own. Memory-mapped
  GGUF tensors (`FileStorage`) are mapped by each worker from the file. Workers see every tensor as
  a zero-copy numpy view of the same bytes.
- The graph goes to each worker once, as a compact picklable description (per tensor: type, ne, nb,
  op, op_params, sources, data offset, buffer); workers rebuild light Tensor objects on the shared
  buffers and cache them, so computing the same graph again only sends "run graph #k".
- Per node, every participant calls the kernel with its (ith, nth) and a barrier separates nodes.
  Nodes whose n_tasks is 1 run on worker 0 alone, and a run of them needs no barrier inside it.
  The barrier is a spin/yield/sleep barrier on per-participant counters in a small shared segment;
  while waiting, the caller checks that its workers are alive. Each worker has a watchdog thread
  that exits the process as soon as the caller is gone (EOF on a pipe only the caller holds).
- A kernel error stops every participant at its next barrier; the caller raises the ComputeError of
  the failing node (the same message as a single-process run) and the pool stays usable. A dead worker
  gives a ComputeError as soon as the caller reaches a barrier (milliseconds when it is waiting), the
  other workers are killed and the pool is rebuilt on its next use. KeyboardInterrupt (or any other
  exception in the caller) kills the workers, unlinks the segments and propagates.

The modules, each importing only those below it (tests/test_pool_layers.py): `caller`
(WorkerPool), `procs` (the worker processes as the caller holds them), `launch` (starting one, and
readying the command line's process for them), `fork` (a worker forked from the command line),
`worker` (the worker process's main loop), `barrier` (the barrier and the per-participant loop),
`wire` (the messages, the control segment's slots, the graph description), `segments` (contexts in
shared memory), `shm` (POSIX shared-memory segments), `placement` (which CPU a worker wakes on).
This module holds the process-wide pool (`get_pool`, `close_pool`).
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .caller import WorkerPool

_DEFAULT: WorkerPool | None = None
_DEFAULT_LOCK = threading.Lock()
# loaded on first use: `ggtool.pool.launch` must stay light (it runs before numpy loads)
_LAZY = {"WorkerPool": "caller", "MAX_PARTICIPANTS": "wire", "share_context": "segments"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ggtool.pool' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)


def get_pool(n_threads: int | None = None) -> WorkerPool:
    """The process's shared pool (created on first use, grown on demand, closed at exit)."""
    global _DEFAULT
    from ..interrupts import signals_held
    from ..threads import default_threads
    from .caller import WorkerPool

    n = default_threads() if n_threads is None else int(n_threads)
    with _DEFAULT_LOCK:
        if _DEFAULT is None or _DEFAULT.closed or _DEFAULT._state.pid != os.getpid():
            with signals_held():   # made and known together: close_pool must find it
                _DEFAULT = WorkerPool(n)
            _close_at_exit()
        # a larger n is not started here: WorkerPool._ensure grows the pool, under its lock, when a
        # compute or map asks for more participants
        return _DEFAULT


_EXIT_HOOK: list[int] = []   # the pid that registered it


def _close_at_exit() -> None:
    """Close the default pool at exit (before segments' own exit hook, which unlinks what is left).
    The pool's own finalizer would close it too, but weakref.finalize's exit hook runs after the
    others whenever a finalizer existed before ggtool.pool was imported (a TemporaryDirectory, say)."""
    if _EXIT_HOOK != [os.getpid()]:
        _EXIT_HOOK[:] = [os.getpid()]
        atexit.register(_exit_hook, os.getpid())


def _exit_hook(pid: int) -> None:
    if pid == os.getpid():
        close_pool()


def close_pool(graceful: bool = True) -> None:
    """Close the process-wide pool, if any (it is also closed at exit); `graceful=False` kills the
    workers at once (see WorkerPool.close)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is not None:
            _DEFAULT.close(graceful)
            _DEFAULT = None
