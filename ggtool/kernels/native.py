"""What compiled code needs of the machine beyond numpy: atomics on shared memory, the CPU's spin-wait
hint, the kernel's futex, a monotonic clock, raw addresses as arrays, and calls through a function
pointer. Each is a numba ``@intrinsic`` (LLVM IR, no inline assembly: numba's JIT has no assembler),
so the loops that use them compile, and cache, as any other kernel.

- ``atomic_add(addr, v)`` (returns the old value), ``atomic_cas(addr, expected, v)`` (stores v where the
  word is `expected`; returns the value before), ``atomic_load(addr)`` (acquire), ``atomic_store(addr, v)``
  (release) on an aligned int64 at ``addr``: what GGML's barrier does with C11 atomics (``seq_cst``
  read-modify-writes).
- ``pause()``: x86's ``pause`` (``llvm.x86.sse2.pause``), GGML's ``ggml_thread_cpu_relax``; nothing
  elsewhere.
- ``futex_wait(addr, expected, timeout_ns)`` / ``futex_wake(addr)``: Linux's futex on the low 32 bits
  of the word at ``addr`` (shared between processes: not FUTEX_PRIVATE), through libc's ``syscall``;
  where there is no futex (not Linux) the wait is a ``sched_yield`` and the wake nothing.
- ``now_ns()``: CLOCK_MONOTONIC (libc's clock_gettime, the vDSO: ~20 ns).
- ``voidptr(addr)``: an address as a pointer, for ``numba.carray(voidptr(a), shape, dtype)``.
- ``view_as(a, dtype)``: numpy's ``a.view(dtype)`` of a C-contiguous array for a dtype of the same
  size (float32 bits as uint32, uint8 as int8). numba types and lowers ``.view`` through a function
  of its own it compiles for each pair of types (~0.1-0.2 s CPU each, ~0.6 s of a first-ever run's
  32-value dots); this is the same array header with another element type, compiled in no time.
- ``read_only(a)``: a as a read-only array. numba compiles a function apart for read-only arrays
  (weights mapped from a file are), so the runner's node kernels pass their raw-address arrays
  read-only where the Python path's callers do: one compiled form of each callee for both.
- ``call5(fn, a, b, c, d, e)``: calls ``int64 fn(int64, int64, int64, int64, int64)`` at address
  ``fn`` (a ``numba.cfunc``'s ``address``): how the graph runner calls each node's kernel.

libc's functions are registered with LLVM under names of their own (``ggtool_syscall``, ...) when this
module is imported, before any code that calls them is compiled or loaded from the cache.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

from .jit import numba  # first: numba loaded ggtool's way (its cache, its optional packages)

import llvmlite.binding as ll  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import types  # noqa: E402
from numba.core import cgutils  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

LINUX = sys.platform.startswith("linux")
X86 = platform.machine().lower() in ("x86_64", "amd64")
SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower(), -1)
FUTEX_WAIT, FUTEX_WAKE = 0, 1

_libc = ctypes.CDLL(None)
for _name in ("syscall", "clock_gettime", "sched_yield"):
    _fn = getattr(_libc, _name, None)
    if _fn is not None:
        ll.add_symbol("ggtool_" + _name, ctypes.cast(_fn, ctypes.c_void_p).value)
HAS_FUTEX = LINUX and SYS_FUTEX > 0 and hasattr(_libc, "syscall")

_I64, _I32, _I8P = ir.IntType(64), ir.IntType(32), ir.IntType(8).as_pointer()
_i64 = types.int64


def _p64(builder, addr):
    return builder.inttoptr(addr, _I64.as_pointer())


def _extern(builder, name, ret, args, var_arg=False):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args, var_arg=var_arg), name)


@intrinsic
def atomic_add(typingctx, addr, value):
    """*addr += value atomically (seq_cst); the value before."""
    def codegen(context, builder, sig, args):
        return builder.atomic_rmw("add", _p64(builder, args[0]), args[1], "seq_cst")
    return _i64(_i64, _i64), codegen


@intrinsic
def atomic_cas(typingctx, addr, expected, value):
    """*addr = value if *addr == expected, atomically (seq_cst); the value before (== expected: stored)."""
    def codegen(context, builder, sig, args):
        pair = builder.cmpxchg(_p64(builder, args[0]), args[1], args[2], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 0)
    return _i64(_i64, _i64, _i64), codegen


@intrinsic
def atomic_load(typingctx, addr):
    def codegen(context, builder, sig, args):
        return builder.load_atomic(_p64(builder, args[0]), "acquire", 8)
    return _i64(_i64), codegen


@intrinsic
def atomic_store(typingctx, addr, value):
    def codegen(context, builder, sig, args):
        builder.store_atomic(args[1], _p64(builder, args[0]), "release", 8)
        return context.get_dummy_value()
    return types.void(_i64, _i64), codegen


@intrinsic
def pause(typingctx):
    """The spin-wait hint: x86's pause (a few dozen cycles; the sibling hyper-thread runs meanwhile)."""
    def codegen(context, builder, sig, args):
        if X86:
            fn = builder.module.declare_intrinsic("llvm.x86.sse2.pause", (), ir.FunctionType(ir.VoidType(), []))
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def _futex(typingctx, addr, op, value, timeout_ns):
    def codegen(context, builder, sig, args):
        ts = cgutils.alloca_once(builder, ir.ArrayType(_I64, 2))
        builder.store(builder.sdiv(args[3], _I64(1_000_000_000)), builder.gep(ts, [_I32(0), _I32(0)]))
        builder.store(builder.srem(args[3], _I64(1_000_000_000)), builder.gep(ts, [_I32(0), _I32(1)]))
        tsp = builder.select(builder.icmp_signed("<", args[3], _I64(0)), _I64(0), builder.ptrtoint(ts, _I64))
        fn = _extern(builder, "ggtool_syscall", _I64, [_I64], var_arg=True)
        return builder.call(fn, [_I64(SYS_FUTEX), args[0], args[1], args[2], tsp, _I64(0), _I64(0)])
    return _i64(_i64, _i64, _i64, _i64), codegen


@intrinsic
def _sched_yield(typingctx):
    def codegen(context, builder, sig, args):
        builder.call(_extern(builder, "ggtool_sched_yield", _I32, []), [])
        return context.get_dummy_value()
    return types.void(), codegen


if HAS_FUTEX:
    @numba.njit(inline="always")
    def futex_wait(addr, expected, timeout_ns):
        """Sleep while the low 32 bits at addr equal `expected` (at most timeout_ns; a wake or a signal
        ends it sooner)."""
        _futex(addr, FUTEX_WAIT, expected & 0xFFFFFFFF, timeout_ns)

    @numba.njit(inline="always")
    def futex_wake(addr):
        """Wake every process sleeping on addr."""
        _futex(addr, FUTEX_WAKE, 0x7FFFFFFF, -1)
else:  # pragma: no cover (not Linux)
    @numba.njit(inline="always")
    def futex_wait(addr, expected, timeout_ns):
        _sched_yield()

    @numba.njit(inline="always")
    def futex_wake(addr):
        pass


@intrinsic
def now_ns(typingctx):
    """CLOCK_MONOTONIC in nanoseconds."""
    def codegen(context, builder, sig, args):
        ts = cgutils.alloca_once(builder, ir.ArrayType(_I64, 2))
        fn = _extern(builder, "ggtool_clock_gettime", _I32, [_I32, _I8P])
        builder.call(fn, [_I32(1), builder.bitcast(ts, _I8P)])
        s = builder.load(builder.gep(ts, [_I32(0), _I32(0)]))
        n = builder.load(builder.gep(ts, [_I32(0), _I32(1)]))
        return builder.add(builder.mul(s, _I64(1_000_000_000)), n)
    return _i64(), codegen


@intrinsic
def voidptr(typingctx, addr):
    """An int64 address as a void pointer (``numba.carray(voidptr(a), n, np.float32)``)."""
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], _I8P)
    return types.voidptr(_i64), codegen


@intrinsic
def view_as(typingctx, a, dtype):
    """a's elements as `dtype` (a numpy scalar type of a's element size; a C-contiguous array): the
    same memory, shape and strides, as ``a.view(dtype)``; read-only where a is."""
    to = getattr(dtype, "dtype", None)
    if not (isinstance(a, types.Array) and a.layout == "C" and isinstance(to, types.Number)
            and isinstance(a.dtype, types.Number) and to.bitwidth == a.dtype.bitwidth):
        return None                     # numba says which call it cannot type
    return a.copy(dtype=to)(a, dtype), _same_header


def _same_header(context, builder, sig, args):
    """Lowering of an array as another array type of the same header (`view_as`, `read_only`)."""
    src = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=args[0])
    dst = cgutils.create_struct_proxy(sig.return_type)(context, builder)
    for field in ("meminfo", "parent", "nitems", "itemsize", "shape", "strides"):
        setattr(dst, field, getattr(src, field))
    dst.data = builder.bitcast(src.data, dst.data.type)
    out = dst._getvalue()
    context.nrt.incref(builder, sig.return_type, out)      # a new reference, as a view is
    return out


@intrinsic
def read_only(typingctx, a):
    """a, read-only (the same memory; numpy's view with writeable=False)."""
    if not isinstance(a, types.Array):
        return None
    return a.copy(readonly=True)(a), _same_header


@intrinsic
def call5(typingctx, fn, a, b, c, d, e):
    """int64 fn(a, b, c, d, e) through the function pointer `fn` (an address)."""
    def codegen(context, builder, sig, args):
        f = builder.inttoptr(args[0], ir.FunctionType(_I64, [_I64] * 5).as_pointer())
        return builder.call(f, args[1:])
    return _i64(*([_i64] * 6)), codegen


# -- the runner's kernels in numba's cache ----------------------------------------------------------------
# numba checks a cached function against its own source file only, and the graph runner's loop and node
# kernels (runner.py, nodes.py, nodes_mm.py) compile other modules' functions into theirs. Their cache
# entries are stamped with every such module's as well, so that editing one compiles them anew.
_HERE = os.path.dirname(os.path.abspath(__file__))
_OWN = frozenset(os.path.join(_HERE, f) for f in ("runner.py", "nodes.py", "nodes_mm.py"))
_DEPS = tuple(os.path.join(_HERE, f) for f in ("native.py", "runner.py", "nodes.py", "nodes_mm.py", "jit.py",
                                               "quantize.py", "dot.py", "dot_k.py", "dot_base.py",
                                               "simd.py", "x86.py"))


def _deps_stamp() -> tuple:
    out = []
    for p in _DEPS:
        try:
            st = os.stat(p)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def _install_locator() -> None:
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    base = getattr(caching, "_CacheLocator", None)
    if impl is None or base is None or not isinstance(getattr(impl, "_locator_classes", None), list):
        return    # another numba: its own stamps (edit the runner's modules with its cache cleared)

    class RunnerLocator(base):
        """The locator numba would choose, with the stamp of the modules compiled in as well."""

        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            # what numba reads of the locator it chose beyond the protocol (its warning that a function
            # cannot be cached names the locator's `_py_file`)
            if name == "_inner":
                raise AttributeError(name)
            return getattr(self._inner, name)

        def ensure_cache_path(self):
            return self._inner.ensure_cache_path()

        def get_cache_path(self):
            return self._inner.get_cache_path()

        def get_source_stamp(self):
            return (self._inner.get_source_stamp(), _deps_stamp())

        def get_disambiguator(self):
            return self._inner.get_disambiguator()

        @classmethod
        def from_function(cls, py_func, py_file):
            if os.path.abspath(py_file) not in _OWN:
                return None
            for other in impl._locator_classes:
                if other is not cls:
                    inner = other.from_function(py_func, py_file)
                    if inner is not None:
                        return cls(inner)
            return None

    if not any(getattr(c, "__name__", "") == "RunnerLocator" for c in impl._locator_classes):
        impl._locator_classes.insert(0, RunnerLocator)


_install_locator()
