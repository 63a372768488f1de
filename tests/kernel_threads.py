"""Run kernels with nth > 1 inside one process, to test GGML's (ith, nth) work split.

`compute_threaded` is GGML's worker loop on Python threads: every node runs on all threads, a
barrier inside the ops that need one and after every node. `thread_writes` runs the threads of
one node one after another on a poisoned output and reports, per element, how many threads
wrote it: a correct split writes every element exactly once.
"""

from __future__ import annotations

import threading

import numpy as np

import ggtool
from ggtool.compute import Work, run_node

POISON = np.uint32(0x7FC0DEAD)  # a NaN payload no kernel produces


def compute_threaded(graph, n_threads: int, force: bool = False, numerics: str = "ggml") -> int:
    """Compute `graph` on n threads (the plan's n_threads unless `force`); returns nth used."""
    plan = ggtool.make_plan(graph, n_threads)
    nth = n_threads if force else plan.n_threads
    wdata = np.zeros(max(plan.work_size, 1), np.uint8)
    barrier = threading.Barrier(nth, timeout=60)
    errors: list[BaseException] = []

    def worker(ith: int) -> None:
        work = Work(wdata, barrier.wait, numerics)
        try:
            for i, node in enumerate(graph.nodes):
                run_node(i, node, ith, nth, work)
                barrier.wait()
        except threading.BrokenBarrierError:
            pass
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(nth)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return nth


def _snapshot(arr: np.ndarray) -> np.ndarray:
    a = np.array(arr, copy=True)
    return a if a.dtype == np.uint8 else a[..., None].view(np.uint8)


def thread_writes(index: int, node, nth: int, wsize: int) -> np.ndarray:
    """Per element of node (per byte for quantized rows): how many threads wrote it."""
    out = node.data
    count = np.zeros(out.shape, np.int32)
    wdata = np.zeros(max(wsize, 1), np.uint8)
    for ith in range(nth):
        _poison(out)
        before = _snapshot(out)
        run_node(index, node, ith, nth, Work(wdata))  # barriers are no-ops: threads run in turn
        changed = before != _snapshot(out)
        count += changed if out.dtype == np.uint8 else changed.any(axis=-1)
    return count


def _poison(out: np.ndarray) -> None:
    if out.dtype == np.uint8:
        out[...] = 0xA5
    elif out.itemsize == 4:
        out.view(np.uint32)[...] = POISON
    else:
        out.view(np.uint16)[...] = np.uint16(0x7E5A)
