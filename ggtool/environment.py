"""Every GGTOOL_* environment variable ggtool reads: its name, what it means, its default and the
parser of its value, and one function to read each. The one list, and the one place that reads
them: tests/test_environment.py fails on a GGTOOL_* name anywhere in the tree that is not here, or
read elsewhere; docs/cli.md#environment renders the list, checked against it.

Light (os only): the command line asks for GGTOOL_THREADS before click and numpy load. Each read
looks at os.environ when it is made, so a change (a test's monkeypatch, a worker's environment)
counts. An unset or blank variable is its default; a value its parser refuses is a GGToolError
naming the variable. The command line's thread option reads GGTOOL_THREADS through click too
(its `envvar`, spelled `THREADS.name`), under the same rule: a positive integer.
"""

from __future__ import annotations

import os

from .errors import GGToolError


# -- parsers: (name, text) -> value; `text` is the variable's value, stripped and not empty ------------
def positive_int(name: str, text: str) -> int:
    """A count: anything but a positive integer is an error, never silently the default."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise GGToolError(f"{name} must be a positive integer, got {text!r}")
    return n


def path(name: str, text: str) -> str:
    """A folder, as given (made when first used)."""
    return text


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size(name: str, text: str) -> int:
    """Bytes: a number, or a number with K, M, G or T (powers of 1024; 'B' and 'iB' after them
    allowed: 2G, 2GB, 2GiB, 1.5G, 512M, 1000000)."""
    s = text.upper()
    s = s[:-2] if s.endswith("IB") else s[:-1] if s.endswith("B") else s
    unit = s[-1] if s and s[-1] in "KMGT" else ""
    number = s[: len(s) - len(unit)].strip()
    try:
        value = float(number) if number else -1.0
    except ValueError:
        value = -1.0
    if not 0 <= value < 2**63 / _SIZE_UNITS[unit]:   # also NaN and inf
        raise GGToolError(f"{name} must be a size such as 2G, 512M or a number of bytes, got {text!r}")
    return int(value * _SIZE_UNITS[unit])


def cpu_flag_set(name: str, text: str) -> frozenset[str]:
    """CPU feature flags as /proc/cpuinfo names them (avx2, fma, f16c, avx512f, ...), separated by
    spaces or commas; lower case."""
    return frozenset(text.replace(",", " ").lower().split())


def off_if_zero(name: str, text: str) -> bool:
    """A switch that is on unless it is 0."""
    return text != "0"


def present(name: str, text: str) -> bool:
    """A switch that any value turns on."""
    return True


class Variable:
    """One GGTOOL_* variable: `name`, `meaning` and `default` (in words, for the documentation),
    `parse(name, text)` its value; `internal`: set by ggtool for its own processes, not by users."""

    __slots__ = ("default", "internal", "meaning", "name", "parse")

    def __init__(self, name: str, meaning: str, default: str, parse, internal: bool = False):
        self.name, self.meaning, self.default, self.parse, self.internal = name, meaning, default, parse, internal

    def text(self) -> str | None:
        """The value as set, stripped; None if unset or blank."""
        v = os.environ.get(self.name, "").strip()
        return v or None

    def read(self):
        """The parsed value, or None if unset or blank (then the default applies)."""
        v = self.text()
        return None if v is None else self.parse(self.name, v)

    def __repr__(self) -> str:
        return f"Variable({self.name!r})"


THREADS = Variable(
    "GGTOOL_THREADS",
    "Participants of a compute (`compute`, `generate`, `plan`: this process and N-1 workers) and "
    "`quantize`'s threads, where the command line gives no thread count.",
    "the free CPUs; for a graph, the count a cost model finds fastest for its work among them (`ggtool plan` says why)",
    positive_int)
QUANT_THREADS = Variable(
    "GGTOOL_QUANT_THREADS",
    "Threads of the library's array quantizers (`ggtool.quant`); a pool worker gets 1.",
    "GGTOOL_THREADS's rule, at most 8",
    positive_int)
CACHE_DIR = Variable(
    "GGTOOL_CACHE_DIR",
    "Folder of ggtool's cache: `numba/` in it holds the compiled kernels and the repacked weights. "
    "`NUMBA_CACHE_DIR`, if set, is used instead of that `numba/`.",
    "`$XDG_CACHE_HOME/ggtool` (`~/.cache/ggtool`)",
    path)
CACHE_MAX = Variable(
    "GGTOOL_CACHE_MAX",
    "Upper bound of the repacked-weights cache, e.g. 2G; least recently used packs are evicted "
    "(0: none is kept).",
    "4G",
    size)
CPU_FLAGS = Variable(
    "GGTOOL_CPU_FLAGS",
    "Space- or comma-separated /proc/cpuinfo flags ggtool uses instead of this CPU's, e.g. to act "
    "as an AVX2 host (`avx2 fma f16c`).",
    "this CPU's flags",
    cpu_flag_set)
PLACE = Variable(
    "GGTOOL_PLACE",
    "0: leave which CPU each participant of a compute runs on to the kernel.",
    "each participant on a CPU of its own",
    off_if_zero)
FORK = Variable(
    "GGTOOL_FORK",
    "0: start the worker processes as fresh interpreters, never as forks of the command line.",
    "forks, on Linux",
    off_if_zero)
DEBUG = Variable(
    "GGTOOL_DEBUG",
    "Any value: an internal error shows its traceback instead of one line.",
    "one line",
    present)
POOL_WORKER = Variable(
    "GGTOOL_POOL_WORKER",
    "Set by ggtool in its worker processes: a pool made there computes in that process.",
    "unset",
    present, internal=True)

VARIABLES = (THREADS, QUANT_THREADS, CACHE_DIR, CACHE_MAX, CPU_FLAGS, PLACE, FORK, DEBUG, POOL_WORKER)
BY_NAME = {v.name: v for v in VARIABLES}


# -- one reader each -------------------------------------------------------------------------------
def threads() -> int | None:
    """GGTOOL_THREADS, or None (ggtool.threads.default_threads' rule)."""
    return THREADS.read()


def quant_threads() -> int | None:
    """GGTOOL_QUANT_THREADS, or None (ggtool.quant.threads.get_threads' rule)."""
    return QUANT_THREADS.read()


def cache_dir() -> str | None:
    """GGTOOL_CACHE_DIR, or None (the XDG cache folder)."""
    return CACHE_DIR.read()


def cache_max() -> int | None:
    """GGTOOL_CACHE_MAX in bytes, or None (the cache's default bound, 4 GiB)."""
    return CACHE_MAX.read()


def cpu_flags() -> frozenset[str] | None:
    """GGTOOL_CPU_FLAGS, or None (this CPU's flags)."""
    return CPU_FLAGS.read()


def place() -> bool:
    """Whether each participant of a compute is woken on a CPU of its own (GGTOOL_PLACE not 0)."""
    return PLACE.read() is not False


def fork() -> bool:
    """Whether workers may be forks of the command line (GGTOOL_FORK not 0)."""
    return FORK.read() is not False


def debug() -> bool:
    """Whether an internal error shows its traceback (GGTOOL_DEBUG set)."""
    return DEBUG.read() is True


def pool_worker() -> bool:
    """Whether this process is a worker of the pool (GGTOOL_POOL_WORKER set)."""
    return POOL_WORKER.read() is True


def read(name: str):
    """The value of the variable `name` (one of VARIABLES), or None if unset."""
    return BY_NAME[name].read()


def check() -> None:
    """Read every variable once: a value its parser refuses is a GGToolError naming it now (the
    command line calls this before a command runs), not in the middle of a compute."""
    for v in VARIABLES:
        v.read()


def foreign(names) -> dict[str, str | None]:
    """Other programs' variables (numba's code-generation settings, ...) by name, as set or None:
    what ggtool's caches key on. Never a GGTOOL_* one (those are read above, parsed)."""
    assert not any(n.startswith("GGTOOL_") for n in names)
    return {n: os.environ.get(n) for n in names}
