"""Worker threads for the array-level quantizers: large arrays are cut into cache-sized chunks of
blocks and spread over a few threads (the compiled kernels release the GIL, as numpy's loops do).

Kept apart so every kernel module shares one executor and one thread setting (``set_threads``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from .. import environment
from ..threads import default_threads, env_threads, one_thread

MAX_THREADS = 8   # the executor's size
QUANT_THREADS_ENV = environment.QUANT_THREADS.name
_threads: int | None = None
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def set_threads(n: int | None) -> None:
    """Threads used by the array-level functions here (None: back to the default, see get_threads)."""
    global _threads
    _threads = None if n is None else max(1, int(n))


@contextlib.contextmanager
def threads_set_to(n: int | None) -> Iterator[None]:
    """set_threads(n) for the duration of a block, then the setting before it (None stays None):
    a caller that runs its own threads (whole-model quantization) keeps these to one."""
    saved = _threads
    set_threads(n)
    try:
        yield
    finally:
        set_threads(saved)


def get_threads() -> int:
    """One inside a participant of a compute (ggtool.threads.single_threaded); else the count
    set_threads gave, else GGTOOL_QUANT_THREADS, else ggtool.threads' default rule, at most MAX_THREADS."""
    if one_thread():
        return 1
    if _threads is not None:
        return _threads
    n = env_threads(QUANT_THREADS_ENV)
    if n is not None:
        return n
    return max(1, min(default_threads(), MAX_THREADS))


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="ggtool-quant")
        return _executor


def _run_chunks(fn, n_items: int, chunk: int) -> None:
    """Call fn(start, stop) over [0, n_items) in pieces of `chunk`, on up to get_threads() threads.

    Chunks are handed out dynamically; the caller runs chunks too."""
    if n_items <= chunk:          # one chunk: no thread to ask for
        if n_items > 0:
            fn(0, n_items)
        return
    starts = list(range(0, n_items, chunk))
    nt = min(get_threads(), len(starts))
    if nt <= 1:
        for s in starts:
            fn(s, min(s + chunk, n_items))
        return
    it = iter(starts)
    lock = threading.Lock()
    stop = []

    def run():
        try:
            while not stop:
                with lock:
                    s = next(it, None)
                if s is None:
                    return
                fn(s, min(s + chunk, n_items))
        except BaseException:
            stop.append(1)
            raise

    futures = [_pool().submit(run) for _ in range(nt - 1)]
    err = None
    try:
        run()
    except BaseException as e:  # noqa: BLE001 - re-raised below after the others finished
        err = e
    for f in futures:
        try:
            f.result()
        except BaseException as e:  # noqa: BLE001
            err = err or e
    if err is not None:
        raise err
