"""The one place numba is imported: ``njit``, GGML-exact settings, and the on-disk cache.

Kernels are compiled on first use and cached on disk (numba's ``cache=True``), where ``cache``
says (``cache.cache_dir``), in files with a CRC-32 (``checked_cache``): a damaged one is compiled
anew, never loaded.

Settings: no ``fastmath`` (GGML's float32 order of operations is the contract: no reassociation,
no fused multiply-add), ``nogil`` (the quantizer threads run kernels side by side), and numba's
own threading is never used (``parallel`` is off): in the worker pool a participant is one thread.
"""

from __future__ import annotations

import os
import sys

from . import KernelError
from .cache import SHARED, cache_dir  # noqa: F401 (jit.SHARED, jit.cache_dir as before)


# Optional packages numba imports with itself for integrations ggtool's kernels never use: scipy
# (a version check), yaml (a .numba_config.yaml in the current folder: `_no_config_file`) and cffi
# (typing cffi functions). In ggtool's own command line (ggtool.role.COMMAND_LINE) they are held off
# while numba loads, ~35 ms of every quantized command's start where they are installed, and so
# are numba's extensions (`_NoExtensions`); numba in a library user's process, or in a pool worker
# started as an interpreter of its own (which may run a user's functions), keeps them.
OPTIONAL = ("scipy", "yaml", "cffi")


class _NoExtensions:
    """numba.core.entrypoints as numba imports it in ggtool's own command line: numba's extensions
    (the ``numba_extensions`` entry points of installed packages, for types and functions of other
    libraries) are not loaded; ggtool's kernels use none. Finding them imports importlib.metadata
    and reads every installed package's entry points: ~25 ms of each quantized command's start,
    more in a large environment. An import finder and loader, in ``sys.meta_path`` while numba loads."""

    NAME = "numba.core.entrypoints"

    def find_spec(self, name, path=None, target=None):
        if name != self.NAME:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(name, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__doc__ = _NoExtensions.__doc__
        module._already_initialized = True
        module.init_all = lambda: None


def _load_numba():
    from .. import role

    hidden, finder = {}, None
    if role.COMMAND_LINE:
        # yaml is hidden even where it is loaded (gguf-py's): numba's config must not read a file
        hidden = {m: sys.modules.get(m) for m in OPTIONAL if m not in sys.modules or m == "yaml"}
    if "numba" not in sys.modules:
        os.environ.setdefault("NUMBA_CACHE_DIR", cache_dir())   # read once, when numba is imported
        if role.COMMAND_LINE and _NoExtensions.NAME not in sys.modules:
            finder = _NoExtensions()
            sys.meta_path.insert(0, finder)
    for m in hidden:
        sys.modules[m] = None      # `import m` raises ImportError meanwhile: numba goes without it
    try:
        import warnings

        with warnings.catch_warnings():
            if role.COMMAND_LINE:   # its read at import finds no yaml (hidden): nothing to say
                warnings.filterwarnings("ignore", message=_CONFIG_WARNING)
            import numba
            if "cffi" in hidden:   # imported later, at the first kernel: it would parse C with pycparser (~15 ms)
                import numba.core.typing.cffi_utils  # noqa: F401
        if role.COMMAND_LINE:
            _no_config_file()
    except Exception as e:  # ImportError, or a broken install (llvmlite/numpy mismatch)
        raise KernelError(f"ggtool's compiled kernels need numba, which cannot be loaded ({type(e).__name__}: {e}); "
                          "install it with `python3 -m pip install numba`") from None
    finally:
        for m, was in hidden.items():
            if sys.modules.get(m, 0) is None:
                if was is None:
                    del sys.modules[m]
                else:
                    sys.modules[m] = was
        if finder is not None and finder in sys.meta_path:
            sys.meta_path.remove(finder)
    _init_target()
    _light_environments()
    return numba


# numba's words where it finds a .numba_config.yaml but no yaml to read it (numba.core.config)
_CONFIG_WARNING = "A Numba config file is found"


def _no_config_file() -> None:
    """numba reads a ``.numba_config.yaml`` from the current directory (at import and at every
    compile) and takes it as NUMBA_* settings: in ggtool's command line that is wherever the user
    stands, so a file planted there (a model's download folder) could print numba's debug output
    into the data on stdout, or turn the kernels into Python. The command line's numba reads none
    (its config's file name is one that cannot exist; yaml is hidden while numba loads, so the read
    at import finds no parser), as the pool's workers and the background compiler, which start in
    "/", never did; NUMBA_* variables still apply everywhere."""
    try:
        from numba.core import config

        if isinstance(getattr(config, "_config_fname", None), str):
            config._config_fname = os.path.join(os.devnull, ".numba_config.yaml")   # never a file
    except Exception:  # noqa: BLE001 - numba's internals moved
        pass


class _LightImports:
    """What ``numba.core.environment`` sees as ``importlib``: a cached function's environment, as
    numba rebuilds it at load (``_rebuild_env``), holds its module's globals, which only object-mode
    code reads. For one of numba's own modules not yet loaded (``numba.np.arrayobj``, for
    ``numba.carray``, which every node kernel calls: ~45 ms with what it imports) the globals are a
    stand-in with the module's name; any other module is imported as before."""

    @staticmethod
    def import_module(name, package=None):
        import importlib
        import types

        if name.startswith("numba.") and name not in sys.modules:
            return types.SimpleNamespace(__name__=name)
        return importlib.import_module(name, package)


def _light_environments() -> None:
    """Have numba rebuild the environments of its own functions without importing their modules
    (`_LightImports`); where numba's internals have moved, it imports them as before."""
    try:
        from numba.core import environment

        if environment.importlib.__name__ == "importlib" and hasattr(environment, "_rebuild_env"):
            environment.importlib = _LightImports
    except Exception:  # noqa: BLE001 - numba's internals moved
        pass


def _init_target() -> None:
    """Set up numba's CPU target for loading cached kernels, and leave the rest to the first compile.

    Loading a kernel from the cache (numba's ``Cache.load_overload``) first refreshes the CPU
    target: it imports and installs every typing and lowering registry numba has (~0.14 s of every
    process that loads one, a pool worker's too), which only compiling reads; numba's compiler
    refreshes the target itself before it compiles (``CompilerBase``). Loading needs numba's
    runtime (NRT: the kernels allocate through it), so a CPU load here initialises that alone (and
    where that load fails, numba's own refresh and load follow); a load for another target is numba's own.

    The refresh, when a compile makes it, is without scipy where scipy is installed: numba's
    set-up imports scipy.linalg (~0.25 s) only to learn whether np.correlate in jitted code may use
    BLAS; ggtool's kernels use no BLAS. The import is held off for the refresh alone, and only if
    scipy.linalg is not loaded already: numba's np.dot and linalg still find scipy when a jitted
    function needs it. Where numba's internals have moved, its own set-up runs as usual."""
    try:
        from numba.core import caching
        from numba.core.cpu import CPUContext
        from numba.core.registry import cpu_target
        from numba.core.runtime import rtsys

        ctx = cpu_target.target_context
        refresh, numba_load = ctx.refresh, caching.Cache.load_overload
        if not hasattr(caching.Cache, "_guard_against_spurious_io_errors"):
            return
    except Exception:  # noqa: BLE001 - numba's internals moved
        return

    def refresh_without_blas():
        blas = "scipy.linalg.cython_blas"
        if "scipy.linalg" in sys.modules or blas in sys.modules:
            return refresh()
        sys.modules[blas] = None             # `import` of it raises ImportError meanwhile
        try:
            return refresh()
        finally:
            if sys.modules.get(blas, 0) is None:
                del sys.modules[blas]

    def load_overload(self, sig, target_context):
        if not isinstance(target_context, CPUContext):
            return numba_load(self, sig, target_context)
        try:
            rtsys.initialize(target_context)
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
        except Exception:  # noqa: BLE001 - what a load needed was set up by the refresh after all
            return numba_load(self, sig, target_context)

    ctx.refresh = refresh_without_blas
    caching.Cache.load_overload = load_overload


numba = _load_numba()


def njit(fn=None, **options):
    """numba.njit with ggtool's settings: cache=True (its files checked: `checked_cache`), nogil, no
    bounds checks, numpy's error model."""
    opts = dict(cache=True, nogil=True, boundscheck=False, error_model="numpy")
    opts.update(options)
    if fn is None:
        return lambda f: njit(f, **options)
    cache = opts.pop("cache")
    d = numba.njit(**opts)(fn)
    if cache:
        checked_cache(d)
    return d


def checked_cache(dispatcher) -> None:
    """Have numba keep `dispatcher`'s compiled code in files it checks (`_CheckedFiles`), not
    numba's own: a flipped byte in a cached kernel is a miss, not a crash or wrong machine code.
    For ggtool's kernels only (a library user's own numba functions keep numba's files). Where
    numba's internals have moved, its own cache stays. The cache is made when first used
    (`_CacheWhenUsed`)."""
    dispatcher._cache = _CacheWhenUsed(dispatcher)


class _CacheWhenUsed:
    """A dispatcher's cache, made when numba first uses it. Making one looks for the kernel's
    files (~0.2 ms), and a process that runs a model loads its node kernels compiled, so most of
    the ~110 dispatchers that importing the kernels makes are never called: ~35 ms of a cached
    gemma-3-270m run went there."""

    def __init__(self, dispatcher):
        self._dispatcher = dispatcher

    def _make(self):
        from numba.core.caching import FunctionCache

        py_func = self._dispatcher.py_func
        real = None
        if _CheckedCache is not None:
            try:
                real = _CheckedCache(py_func)
            except Exception:  # noqa: BLE001 - numba's internals moved: its own cache, unchecked
                real = None
        if real is None:
            real = FunctionCache(py_func)
        self._dispatcher._cache = real
        return real

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_dispatcher", "_make"):
            raise AttributeError(name)
        return getattr(self._make(), name)


try:
    import pickle
    import zlib

    from numba.core.caching import FunctionCache, IndexDataCacheFile

    class _CheckedFiles(IndexDataCacheFile):
        """numba's index (``.nbi``) and data (``.nbc``) files with their payload behind a magic and a
        CRC-32: one that does not match is removed and reported once (``cache.say``), and numba
        compiles the kernel anew. The version it writes first is numba's and "+crc32", so files of
        numba's own format are another version to it (ignored, then overwritten)."""

        MAGIC = b"GGTNBC1\0"

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._version = f"{numba.__version__}+crc32"

        def _dump(self, obj):
            data = super()._dump(obj)
            return self.MAGIC + zlib.crc32(data).to_bytes(4, "little") + data

        def _payload(self, data: bytes, path: str):
            n = len(self.MAGIC)
            if data[:n] == self.MAGIC and len(data) >= n + 4 and zlib.crc32(data[n + 4:]) == int.from_bytes(data[n:n + 4], "little"):
                return data[n + 4:]
            try:
                os.unlink(path)
            except OSError:
                pass
            _refused(path)
            return None

        def _load_index(self):
            try:
                with open(self._index_path, "rb") as f:
                    version = pickle.load(f)
                    data = f.read()
            except FileNotFoundError:
                return {}
            except Exception:  # noqa: BLE001 - an unreadable head: damaged
                self._payload(b"", self._index_path)
                return {}
            if version != self._version:
                return {}
            payload = self._payload(data, self._index_path)
            if payload is None:
                return {}
            stamp, overloads = pickle.loads(payload)
            return overloads if stamp == self._source_stamp else {}

        def _load_data(self, name):
            path = self._data_path(name)
            with open(path, "rb") as f:
                data = f.read()
            payload = self._payload(data, path)
            if payload is None:
                raise FileNotFoundError(path)      # IndexDataCacheFile.load: a miss
            return pickle.loads(payload)

    class _CheckedCache(FunctionCache):
        def __init__(self, py_func):
            super().__init__(py_func)
            self._cache_file = _CheckedFiles(cache_path=self._cache_path, filename_base=self._impl.filename_base,
                                             source_stamp=self._impl.locator.get_source_stamp())
except Exception:  # noqa: BLE001 - numba's internals moved: numba's own cache, unchecked
    _CheckedCache = None


_told: set[str] = set()


def _refused(path: str) -> None:
    from .cache import say

    if path not in _told:
        _told.add(path)
        say(f"a compiled kernel in the cache was refused and is compiled anew: {path} does not match its checksum")
