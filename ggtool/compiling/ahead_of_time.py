"""Every kernel compiled into the cache before any run needs it (`compile_kernels`, which ``ggtool
kernels`` runs), and what the cache holds for this CPU now (`kernel_states`).

Why: a first-ever run pays for the kernels it uses (``first_run``: their numpy twins, or a wait for
their compile), 3.4-4.1x a cached run of a 270M-311M model's generation on two cores, and no
first-run policy gets that under 2x (docs/engine.md, "What 2x would take"). Compiled once, ahead
(the README's set-up does it after installing), the kernels this version has cost ~55 s of CPU
(25-30 s on two cores), and a model's first run is a cached run but for writing its repacked
weights (``quant.packs``): ~1.4x (docs/engine.md, "Kernels compiled ahead").

How: the kernels compile in processes of their own, started as every child of ggtool is
(``isolation``: ``python -I`` in "/", a filtered environment), as many as `jobs` (default: the
free CPUs). Each process takes the next unit as it finishes the last: a family of dots that share
their activation pass (as ``first_run.prepare`` groups them), or one kernel; the costliest first.
It marks each kernel ready in the cache as soon as numba has written it (``warm``'s markers), so
an interrupted compile keeps what it finished and a run started meanwhile uses each kernel from
then on. A kernel that fails to compile is marked failed, with numba's words (the runs keep its twin,
or Python's step, as they would); asked for again, it is tried again, and so is one whose marker
is no plain file (a link, a folder, a FIFO planted there: removed first). A compile process that
dies is reported with the kernels it had not finished, and another takes the rest of the work.

numba loads in the compile processes only, never in this one.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from .. import isolation, threads
from ..errors import GGToolError
from ..kernels import cache
from . import first_run, warm

READY, FAILED, MISSING = "ready", "failed", "missing"
WORKER = "from ggtool.compiling.ahead_of_time import _worker; _worker()"   # a compile process's program
WHY_LENGTH = 300        # a failed kernel's reason, as the cache keeps it (numba's first line, cut)


@dataclass(frozen=True)
class KernelState:
    """A kernel (a ``warm.KINDS`` name: "dot:q4_0", "node:rope_f32", "runner") in this CPU's cache:
    READY, FAILED (`why`: numba's words, or how its compile process ended) or MISSING."""

    name: str
    state: str
    why: str = ""


def kernel_names() -> list[str]:
    """Every kernel this version compiles, as ``warm.KINDS`` lists them (a kind's kernels sorted)."""
    return [kind if arg == "" else f"{kind}:{arg}"
            for kind, (_, args) in warm.KINDS.items() for arg in sorted(args())]


def cache_folder() -> str:
    """The cache folder of this CPU's compiled kernels (``kernels.cache.cache_dir``); a GGToolError
    where the cache cannot be used (its warning says why): nothing compiled would be kept. Asked
    before numba loads (`kernel_names` loads it), which sets NUMBA_CACHE_DIR: the user's is named."""
    root = cache.cache_dir()
    if cache.bypassed() or cache.subfolder(root, "ready") is None or cache.subfolder(root, "failed") is None:
        user = os.environ.get("NUMBA_CACHE_DIR")
        what = f"the kernel cache NUMBA_CACHE_DIR at {os.path.abspath(user)}" if user else \
            f"ggtool's cache at {cache.root_path()}"
        raise GGToolError(f"{what} cannot be used (the warning above says why): compiled kernels would not be kept")
    return root


def kernel_states(names=None) -> list[KernelState]:
    """The state of each kernel of `names` (default: every one, `kernel_names`) in this CPU's cache.
    A marker that is no plain file (a link, a folder planted there) counts for nothing."""
    root = cache.cache_dir()
    states = []
    for name in kernel_names() if names is None else names:
        if cache.plain_file(cache.marker("ready", name, root)):
            states.append(KernelState(name, READY))
        elif cache.plain_file(failed := cache.marker("failed", name, root)):
            states.append(KernelState(name, FAILED, _read_why(failed)))
        else:
            states.append(KernelState(name, MISSING))
    return states


def _read_why(path: str) -> str:
    try:
        with open(path, "rb") as f:
            text = f.read(WHY_LENGTH).decode("utf-8", "replace")
    except OSError:
        return ""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())     # no control bytes shown


def compile_kernels(names=None, jobs: int | None = None, on_start=None, on_done=None,
                    program: str = WORKER) -> list[KernelState]:
    """Compile into this CPU's cache each kernel of `names` (default: every one) that is not ready
    (a failed one again), in `jobs` processes (default: the free CPUs; never more than there are
    units of work), and return the states of `names` afterwards. `on_start(kernels, jobs)` is told
    what will compile and in how many processes, `on_done(state)` of each kernel as it is done.
    A GGToolError where the cache cannot be used (`cache_folder`) or a name is no kernel.
    `program`: the compile processes' code (tests give one that misbehaves)."""
    root = cache_folder()
    names = kernel_names() if names is None else list(dict.fromkeys(names))
    unknown = [n for n in names if not warm.known(n)]
    if unknown:
        raise GGToolError(f"no kernel is named {unknown[0]!r} (ggtool's kernels: {', '.join(kernel_names())})")
    todo = [s.name for s in kernel_states(names) if s.state != READY]
    for name in todo:
        cache.remove(cache.marker("failed", name, root))
        cache.remove(cache.marker("ready", name, root))     # no plain file (kernel_states): a link, a folder, a FIFO
    units = _units(todo)
    jobs = max(1, min(threads.free_cpus() if jobs is None else jobs, len(units)))
    if on_start is not None:
        on_start(todo, jobs if units else 0)
    if units:
        _Compile(root, units, jobs, on_done or (lambda state: None), program).run()
    return kernel_states(names)


def _units(names: list[str]) -> list[list[str]]:
    """`names` as units of one compile process's work, the costliest first: the quantized dots of one
    block size together (they share their activation pass, as ``first_run.prepare`` groups them),
    every other kernel alone."""
    from .. import types as T

    families: dict[int, list[str]] = {}
    units: list[list[str]] = []
    for name in names:
        kind, _, arg = name.partition(":")
        size = T.block_size(T.parse_type(arg)) if kind == "dot" else 1
        if size > 1:
            if size not in families:
                families[size] = []
                units.append(families[size])
            families[size].append(name)
        else:
            units.append([name])
    return sorted(units, key=first_run.compile_seconds, reverse=True)


class _Compile:
    """The compile processes at work: each is given a unit (a line of names on its stdin), answers a
    line a kernel on its stdout ("ready NAME", "failed NAME WHY") and is given the next unit; stdin
    closed, it exits. One that ends before answering for its unit fails those kernels (how it
    ended is their reason), and a new one takes the units left (at most as many restarts as units)."""

    def __init__(self, root: str, units, jobs: int, on_done, program: str):
        self.root, self.queue, self.jobs, self.on_done, self.program = root, list(units), jobs, on_done, program
        self.restarts = len(units)
        self.procs: dict = {}           # process -> [names it owes an answer for, bytes read, not a line yet]

    def run(self) -> None:
        import selectors

        self.selector = selectors.DefaultSelector()
        try:
            for _ in range(self.jobs):
                try:
                    self._start()
                except OSError as e:
                    if not self.procs:
                        raise GGToolError(f"no process could start to compile kernels: {e}") from None
                    break
            while self.procs:
                for key, _ in self.selector.select():
                    self._read(key.data)
        finally:
            self._stop()
            self.selector.close()

    def _start(self) -> None:
        import selectors
        import subprocess

        proc = isolation.popen(self.program, env={"NUMBA_CACHE_DIR": self.root}, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs[proc] = [[], b""]
        self.selector.register(proc.stdout, selectors.EVENT_READ, proc)
        self._give(proc)

    def _give(self, proc) -> None:
        """The next unit to `proc`, or the end of its input where none is left."""
        if self.queue:
            unit = self.queue.pop(0)
            self.procs[proc][0] = list(unit)
            try:
                proc.stdin.write((" ".join(unit) + "\n").encode())
                proc.stdin.flush()
                return
            except OSError:             # it has ended: _read finds its end and fails the unit
                return
        try:
            proc.stdin.close()
        except OSError:
            pass

    def _read(self, proc) -> None:
        owed = self.procs[proc]
        data = os.read(proc.stdout.fileno(), 65536)
        if not data:
            self._ended(proc)
            return
        *lines, owed[1] = (owed[1] + data).split(b"\n")
        for line in lines:
            state, _, rest = line.decode("utf-8", "replace").partition(" ")
            name, _, why = rest.partition(" ")
            if state in (READY, FAILED) and name in owed[0]:
                owed[0].remove(name)
                self.on_done(KernelState(name, state, why.strip()))
        if not owed[0]:
            self._give(proc)

    def _ended(self, proc) -> None:
        self.selector.unregister(proc.stdout)
        _close(proc)
        code = proc.wait()
        owed = self.procs.pop(proc)[0]
        why = f"its compile process {_ending(code)}"
        for name in owed:
            self.on_done(KernelState(name, MISSING, why))
        if (owed or code) and self.queue and self.restarts > 0:
            self.restarts -= 1
            try:
                self._start()
                return
            except OSError:
                pass
        if not self.procs:
            for unit in self.queue:             # no process left to take them (none could start)
                for name in unit:
                    self.on_done(KernelState(name, MISSING, why))
            self.queue.clear()

    def _stop(self) -> None:
        """Every compile process still running (an interrupt, an error here) is killed and waited for;
        what each had finished is in the cache, marked ready."""
        for proc in list(self.procs):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            _close(proc)
        self.procs.clear()


def _close(proc) -> None:
    for f in (proc.stdin, proc.stdout):
        try:
            f.close()
        except OSError:         # a unit written to a process that has ended
            pass


def _ending(code: int) -> str:
    if code < 0:
        import signal

        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _worker() -> None:
    """A compile process: for each line of names on stdin, compile each kernel into the cache (this
    process's NUMBA_CACHE_DIR), mark it ready or failed, and answer a line for it. Its stdout is
    its answers only: whatever else writes to fd 1 (numba, LLVM) goes to its stderr."""
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    for line in sys.stdin:
        for name in line.split():
            state, why = _compile_one(name)
            answers.write(f"{state} {name} {why}\n")
            answers.flush()


def _compile_one(name: str) -> tuple[str, str]:
    root = cache.cache_dir()
    try:
        kept = warm.compile_kernel(name)
    except Exception as e:      # noqa: BLE001 - numba's words, kept in the cache and shown
        why = " ".join(f"{type(e).__name__}: {e}".split())[:WHY_LENGTH]
    else:
        if kept and first_run._mark_ready(name):
            return READY, ""
        why = (f"its ready mark cannot be written in {os.path.join(root, 'ready')}" if kept else
               "numba cannot keep it in the cache (NUMBA_OPT=0?)")
    warm._mark(root, "failed", name, why + "\n")
    cache.remove(cache.marker("wanted", name, root))
    return FAILED, why
