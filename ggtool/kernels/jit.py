"""The one place numba is imported: ``njit``, GGML-exact settings, and the on-disk cache.

Kernels are compiled on first use and cached on disk (numba's ``cache=True``). The cache lives in
``$GGTOOL_CACHE_DIR/numba`` if that is set, else ``$XDG_CACHE_HOME/ggtool/numba`` (default
``~/.cache/ggtool/numba``), in a subfolder named after a digest of the SHARED modules (``_tiles_key``), never
beside the installed package, which may not be writable. A ``NUMBA_CACHE_DIR`` the user set wins
over all of these.

Settings: no ``fastmath`` (GGML's float32 order of operations is the contract: no reassociation,
no fused multiply-add), ``nogil`` (the quantizer threads run kernels side by side), and numba's
own threading is never used (``parallel`` is off): in the worker pool a participant is one thread.
"""

from __future__ import annotations

import os
import sys

from . import KernelError


def cache_dir() -> str:
    """Where compiled kernels are cached (see the module docstring)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return os.environ["NUMBA_CACHE_DIR"]
    base = os.environ.get("GGTOOL_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "ggtool")
    return os.path.join(base, "numba", _tiles_key())


# Modules whose compiled functions other kernel modules compile into theirs: simd's vector tiles
# (into dot and dot_k), dot_base's store_group (into dot and dot_k), dot_k's scale decoding (into x86),
# ggtool.kquants' blocks and legacy (their searches and block ends, into kquants.legacy and .weighted).
SHARED = ("simd.py", "dot_base.py", "dot_k.py", "../kquants/blocks.py", "../kquants/legacy.py")


def _tiles_key() -> str:
    """A digest of the SHARED modules. numba checks a cached kernel against its own source file
    only: a changed shared module gets a cache directory of its own instead of stale kernels."""
    import hashlib

    h = hashlib.sha1()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in SHARED:
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return "tiles-" + h.hexdigest()[:12]


# Optional packages numba imports with itself for integrations ggtool's kernels never use: scipy
# (a version check), yaml (a .numba_config.yaml in the current folder) and cffi (typing cffi
# functions). In ggtool's own command line (ggtool.role.COMMAND_LINE) they are held off
# while numba loads, ~35 ms of every quantized command's start where they are installed; numba in
# a library user's process, or in a pool worker (which may run a user's functions), keeps them.
OPTIONAL = ("scipy", "yaml", "cffi")


def _load_numba():
    from .. import role

    held = []
    if "numba" not in sys.modules:
        os.environ.setdefault("NUMBA_CACHE_DIR", cache_dir())   # read once, when numba is imported
        if role.COMMAND_LINE:
            held = [m for m in OPTIONAL if m not in sys.modules]
    for m in held:
        sys.modules[m] = None      # `import m` raises ImportError meanwhile: numba goes without it
    try:
        import numba
        if "cffi" in held:   # imported later, at the first kernel: it would parse C with pycparser (~15 ms)
            import numba.core.typing.cffi_utils  # noqa: F401
    except Exception as e:  # ImportError, or a broken install (llvmlite/numpy mismatch)
        raise KernelError(f"ggtool's compiled kernels need numba, which cannot be loaded ({type(e).__name__}: {e}); "
                          "install it with `python3 -m pip install numba`") from None
    finally:
        for m in held:
            if sys.modules.get(m, 0) is None:
                del sys.modules[m]
    _init_target()
    return numba


def _init_target() -> None:
    """Set up numba's CPU target now (it would be on the first call) without importing scipy.

    Where scipy is installed, numba's set-up imports scipy.linalg (~0.25 s of every process's
    start) only to learn whether np.correlate in jitted code may use BLAS; ggtool's kernels use no
    BLAS. The import is held off for the set-up alone, and only if scipy.linalg is not loaded
    already: numba's np.dot and linalg still find scipy when a jitted function needs it."""
    blas = "scipy.linalg.cython_blas"
    if "scipy.linalg" in sys.modules or blas in sys.modules:
        return
    sys.modules[blas] = None             # `import` of it raises ImportError meanwhile
    try:
        from numba.core.registry import cpu_target
        cpu_target.target_context.refresh()
    except Exception:  # noqa: BLE001 - numba's internals moved: its first call sets up as usual
        pass
    finally:
        if sys.modules.get(blas, 0) is None:
            del sys.modules[blas]


numba = _load_numba()


def njit(fn=None, **options):
    """numba.njit with ggtool's settings: cache=True, nogil, no bounds checks, numpy's error model."""
    opts = dict(cache=True, nogil=True, boundscheck=False, error_model="numpy")
    opts.update(options)
    if fn is None:
        return lambda f: numba.njit(**opts)(f)
    return numba.njit(**opts)(fn)
