"""BLAS thread control for a participant of a compute (ggtool.threads.single_threaded), without threadpoolctl.

It stays beside ggtool/threads.py rather than in pool/: a compute in one process (ggtool.compute,
below the pool) keeps BLAS on one thread too.

Worker processes get `OPENBLAS_NUM_THREADS=1` (and friends, THREAD_VARS) in their environment before
numpy loads (pool.launch), and so does `ggtool compute`'s own process (launch.prestart). Any other
calling process, which takes part in every pooled compute as worker 0, has numpy loaded already,
so its OpenBLAS is switched to one thread for the duration of the compute (`limit`) through the
library's own `openblas_set_num_threads`, found among the loaded libraries. Best effort: with a
BLAS other than OpenBLAS/MKL `limit` does nothing.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
               "NUMEXPR_NUM_THREADS", "BLIS_NUM_THREADS")

# (get, set) symbol pairs: scipy-openblas (numpy's wheels, 64-bit ints), plain OpenBLAS, MKL
_SYMBOLS = (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
            ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
            ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
            ("openblas_get_num_threads", "openblas_set_num_threads"),
            ("MKL_Get_Max_Threads", "MKL_Set_Num_Threads"))

_controls: list[tuple] | None = None


def _loaded_libraries() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:  # no /proc (not Linux): BLAS threads cannot be found, limit() does nothing
        return []
    return sorted(p for p in paths if any(k in os.path.basename(p).lower() for k in ("blas", "mkl_rt")))


def _find() -> list[tuple]:
    global _controls
    if _controls is None:
        import ctypes

        import numpy  # noqa: F401  (make sure numpy's BLAS is loaded)

        found = []
        for path in _loaded_libraries():
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for get, set_ in _SYMBOLS:
                if hasattr(lib, get) and hasattr(lib, set_):
                    g, s = getattr(lib, get), getattr(lib, set_)
                    g.restype, g.argtypes = ctypes.c_int, []
                    s.restype, s.argtypes = None, [ctypes.c_int]
                    found.append((g, s))
                    break
        _controls = found
    return _controls


def get_threads() -> int | None:
    """Threads the loaded BLAS would use, or None if it cannot be controlled."""
    c = _find()
    return c[0][0]() if c else None


def set_threads(n: int) -> None:
    for _, s in _find():
        s(int(n))


@contextmanager
def limit(n: int = 1):
    """Run the block with the process's BLAS on at most n threads, then restore it."""
    changed = [(s, old) for g, s in _find() if (old := g()) > n]
    for s, _ in changed:
        s(n)
    try:
        yield
    finally:
        for s, old in changed:
            s(old)
