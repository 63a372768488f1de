"""Issue 11 figures: the graph allocator and the pool's shared memory, each figure with its reference
measured in the same run.

    python bench/bench_alloc.py                   # everything (a couple of minutes on 2 cores)
    python bench/bench_alloc.py chain --runs 9    # only some: chain llama overhead

- chain: the whole process. The issue's "20 mul_mats" of w (2048x2048) by x (512 rows of 2048),
  summed, from .npy files to an .npy: `s0 = mul_mat(w, x)`, then `y_i = mul_mat(w, x)`,
  `s_i = add(s_{i-1}, y_i)` for i = 1..20 (21 products, 20 adds), as `ggtool compute --threads 2
  -o y.npy` (--alloc graph, the default, and --alloc context) against a numpy script doing the same
  load / products / sums / np.save with 2 BLAS threads (OPENBLAS/OMP/MKL_NUM_THREADS=2).
  Wall time (median), ratio numpy / ggtool (target >= 0.9x), peak RSS of each process (its largest
  resident set, or a worker's, as wait4 reports them: shared memory a process touched counts in its
  RSS), and ggtool's own phases (`--time`, median).
- llama: ggtool/programs/llama.gg on fixtures/stories260K.gguf with 512 tokens, `ggtool compute -o
  logits.npy` with --alloc graph and --alloc context, --threads 1 and 2: wall time and peak RSS;
  and the compute buffer `ggtool plan --json` reports against the sum of all intermediates.
- overhead: per-node overhead on the pool, in-process: a chain of 1000 adds on 16 floats, built
  once, computed once to warm up, then timed on `ggtool.pool.get_pool(2)` (2 participants) with
  each alloc mode, next to the same graph in-process (target <= 20 us/node).

Processes are timed in interleaved rounds (one of each per round, so a change in the machine's load
hits all alike) after a warm-up round. Python's bytecode cache is on for them, as in an installed
ggtool: if PYTHONDONTWRITEBYTECODE is set here, the subprocesses run without it, with their cache
in a temporary PYTHONPYCACHEPREFIX (filled by the warm-up round), so that neither ggtool nor numpy
pays for compiling its sources on every run.

Another checkout (the code before a change, say) is timed with `--ggtool 'python -m ggtool'` and
PYTHONPATH pointing at it (its `commands/` linked as `ggtool/commands`); the commands run in a
temporary folder, so that `-m` does not pick up this checkout instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
STORIES = ROOT / "fixtures" / "stories260K.gguf"
PROGRAM = ROOT / "ggtool" / "programs" / "llama.gg"

N_PRODUCTS = 20

NUMPY_CHAIN = """
import sys
import numpy as np
w, x = np.load(sys.argv[1]), np.load(sys.argv[2])
s = x @ w.T
for _ in range(int(sys.argv[4])):
    s = s + x @ w.T
np.save(sys.argv[3], s)
"""


def chain_program(n: int = N_PRODUCTS) -> str:
    lines = ["s0 = mul_mat(w, x)"]
    for i in range(1, n + 1):
        lines += [f"y{i} = mul_mat(w, x)", f"s{i} = add(s{i - 1}, y{i})"]
    return "\n".join(lines) + f"\ns{n}\n"


GGTOOL: list[str] = []   # --ggtool


def ggtool_command() -> list[str]:
    """The installed `ggtool` script beside this Python (what a user runs), else `python -m ggtool`."""
    if GGTOOL:
        return list(GGTOOL)
    script = Path(sys.executable).parent / "ggtool"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "ggtool"]


def subprocess_env(cache: str, blas_threads: int | None = None) -> dict:
    env = dict(os.environ)
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        env["PYTHONPYCACHEPREFIX"] = cache
    if blas_threads is not None:
        for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[k] = str(blas_threads)
    return env


def run(cmd: list[str], env: dict, cwd=None) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stderr) of one command in a fresh process, until it exits (as
    a shell waits for it: stderr goes to a file, so a helper process that keeps it open, such as
    Python's resource tracker, is not waited for). The peak is the largest resident set of the
    process and of the children it waited for (its workers), as wait4 reports it."""
    with tempfile.TemporaryFile() as errf:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=errf)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        errf.seek(0)
        err = errf.read().decode()
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{err}")
    return wall, ru.ru_maxrss / 1024, err


PHASES = re.compile(r"(\w+) ([0-9.]+) ms")


def phases(stderr: str) -> dict:
    """ggtool's `--time` line: {phase: seconds}."""
    line = next((ln for ln in stderr.splitlines() if ln.startswith("time: ")), "")
    return {k: float(v) / 1e3 for k, v in PHASES.findall(line.split("(total")[0])}


def interleaved(cmds: dict, runs: int, cwd: str) -> dict:
    """{name: (median wall, max peak RSS MiB, {phase: median seconds})} over `runs` rounds after a
    warm-up, each command run in `cwd` (not this checkout: `python -m ggtool` would import it from
    there, whatever PYTHONPATH says)."""
    res = {k: [] for k in cmds}
    for c in cmds.values():
        run(*c, cwd=cwd)
    for _ in range(runs):
        for k, c in cmds.items():
            res[k].append(run(*c, cwd=cwd))
    out = {}
    for k, v in res.items():
        ph = [phases(e) for _, _, e in v]
        names = ph[0].keys() if ph and ph[0] else ()
        out[k] = (statistics.median(w for w, _, _ in v), max(r for _, r, _ in v),
                  {n: statistics.median(p.get(n, 0.0) for p in ph) for n in names})
    return out


def wait_idle(limit: float = 60.0) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_pool import wait_idle as idle

    idle(limit)


def fmt_phases(ph: dict) -> str:
    return ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in ph.items())


# -- chain -----------------------------------------------------------------------------------------
def chain(runs: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        rng = np.random.default_rng(0)
        w, x = os.path.join(d, "w.npy"), os.path.join(d, "x.npy")
        np.save(w, rng.standard_normal((2048, 2048), dtype=np.float32))   # ggml ne [2048, 2048]
        np.save(x, rng.standard_normal((512, 2048), dtype=np.float32))    # ggml ne [2048, 512]
        prog = os.path.join(d, "chain.gg")
        Path(prog).write_text(chain_program())
        cache = os.path.join(d, "pycache")
        gg = ggtool_command() + ["compute", "-f", prog, "--tensor", f"w={w}", "--tensor", f"x={x}",
                                 "--threads", "2", "--time"]
        cmds = {
            "numpy": ([sys.executable, "-c", NUMPY_CHAIN, w, x, os.path.join(d, "np.npy"), str(N_PRODUCTS)],
                      subprocess_env(cache, 2)),
            "graph": (gg + ["-o", os.path.join(d, "graph.npy")], subprocess_env(cache)),
            "context": (gg + ["--alloc", "context", "-o", os.path.join(d, "context.npy")], subprocess_env(cache)),
        }
        wait_idle()
        t = interleaved(cmds, runs, d)
        ref = np.load(os.path.join(d, "np.npy"))
        g, c = np.load(os.path.join(d, "graph.npy")), np.load(os.path.join(d, "context.npy"))
        same = g.tobytes() == c.tobytes()
        close = bool(np.allclose(g, ref, rtol=1e-4, atol=1e-2))
    print(f"\n== whole process: {N_PRODUCTS + 1} f32 mul_mats 2048x2048 by 512 rows summed, .npy in and out, "
          f"median of {runs} (interleaved)")
    print(f"  (graph and context results byte-identical: {same}; equal to numpy's within 1e-4: {close})")
    tn = t["numpy"][0]
    print(f"  numpy script, 2 BLAS threads              {tn:6.3f} s   peak RSS {t['numpy'][1]:6.0f} MiB")
    for k in ("graph", "context"):
        wall, rss, ph = t[k]
        print(f"  ggtool compute --threads 2 --alloc {k:<7} {wall:6.3f} s   peak RSS {rss:6.0f} MiB   "
              f"ratio {tn / wall:.2f}x numpy (target >= 0.9x)")
        print(f"      phases (--time): {fmt_phases(ph)}; outside them (start-up, imports, exit) "
              f"{(wall - sum(ph.values())) * 1e3:.0f} ms")


# -- llama -----------------------------------------------------------------------------------------
def llama(runs: int, n_tokens: int = 512) -> None:
    with tempfile.TemporaryDirectory() as d:
        tokens = os.path.join(d, "tokens.npy")
        ids = np.concatenate([[1], (np.arange(n_tokens - 1) * 37 + 3) % 500 + 2]).astype(np.int32)
        np.save(tokens, ids)
        cache = os.path.join(d, "pycache")
        env = subprocess_env(cache)
        base = ggtool_command()
        args = ["-f", str(PROGRAM), "--gguf", str(STORIES), "--tensor", f"tokens={tokens}"]
        plan = subprocess.run(base + ["plan", *args, "--json"], env=env, cwd=d, check=True, capture_output=True,
                              text=True)
        p = json.loads(plan.stdout)
        cmds = {}
        for n in (1, 2):
            for alloc in ("graph", "context"):
                cmds[(n, alloc)] = (base + ["compute", *args, "--threads", str(n), "--alloc", alloc, "--time",
                                            "-o", os.path.join(d, f"{alloc}{n}.npy")], env)
        wait_idle()
        t = interleaved(cmds, runs, d)
        outs = {k: np.load(os.path.join(d, f"{k[1]}{k[0]}.npy")).tobytes() for k in cmds}
        same = len(set(outs.values())) == 1
    cb, inter = p["compute_buffer_size"], p["intermediates_size"]
    print(f"\n== llama.gg on {STORIES.name}, {n_tokens} tokens, `ggtool compute -o logits.npy`, median of {runs} "
          f"(interleaved); logits byte-identical in all four: {same}")
    print(f"  plan --json: compute_buffer_size {cb} bytes ({cb / 2**20:.2f} MiB) against intermediates_size "
          f"{inter} bytes ({inter / 2**20:.2f} MiB): {inter / cb:.1f}x less")
    for n in (1, 2):
        tg, tc = t[(n, "graph")], t[(n, "context")]
        for alloc, (wall, rss, ph) in (("graph", tg), ("context", tc)):
            print(f"  --threads {n} --alloc {alloc:<7} {wall:6.3f} s   peak RSS {rss:6.0f} MiB   ({fmt_phases(ph)})")
        print(f"  --threads {n}: graph / context wall {tg[0] / tc[0]:.2f}x, peak RSS {tg[1] / tc[1]:.2f}x")


# -- overhead --------------------------------------------------------------------------------------
def overhead(n: int = 1000, runs: int = 9) -> None:
    """One graph per alloc mode (a graph computed in the other mode in between would be placed, or
    given its own memory back, on every compute: not the steady state measured here)."""
    import ggtool
    from ggtool.pool import get_pool

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_pool import add_chain, timed

    want = np.full(16, 1 + 0.5 * n, np.float32)
    pool = get_pool(2)
    graphs, plans = {}, {}
    for alloc in ("context", "graph", "in-process"):
        g, y, _ = add_chain(n)
        graphs[alloc] = (g, y)
        if alloc == "in-process":
            plans[alloc] = ggtool.graph_compute(g, 1)
        else:
            plans[alloc] = ggtool.graph_compute(g, 2, pool=pool, alloc=alloc, outputs=[y])   # warm: segment, graph sent
        assert np.array_equal(y.numpy().reshape(-1), want), alloc

    def on_pool(alloc):
        g, y = graphs[alloc]
        return lambda: ggtool.graph_compute(g, 2, pool=pool, plan=plans[alloc], alloc=alloc, outputs=[y])

    wait_idle()
    g1 = graphs["in-process"][0]
    tc, tg, t1 = timed(on_pool("context"), on_pool("graph"), lambda: ggtool.graph_compute(g1, 1, plan=plans["in-process"]),
                       runs=runs)
    us = 1e6 / n
    print(f"\n== per-node overhead: a chain of {n} adds on 16 floats, median of {runs} "
          f"(ggtool from {Path(ggtool.__file__).parent})")
    print(f"  2 participants (get_pool(2)), --alloc graph   {tg * us:6.1f} us/node (target <= 20)")
    print(f"  2 participants (get_pool(2)), --alloc context {tc * us:6.1f} us/node")
    print(f"  in-process, 1 participant                     {t1 * us:6.1f} us/node")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", nargs="*", metavar="FIGURE", help="chain, llama, overhead (default: all)")
    ap.add_argument("--runs", type=int, default=7, help="timed rounds (median); the first, a warm-up, is not counted")
    ap.add_argument("--ggtool", metavar="CMD", help="the command that runs ggtool (default: the `ggtool` script "
                    "beside this Python), e.g. 'python -m ggtool' with PYTHONPATH set to time another checkout")
    a = ap.parse_args()
    if a.ggtool:
        GGTOOL[:] = shlex.split(a.ggtool)
        if GGTOOL[0] == "python":   # this Python itself, not a `python` on PATH (pyenv's is a shell script)
            GGTOOL[0] = sys.executable
    which = a.which or ["chain", "llama", "overhead"]
    unknown = set(which) - {"chain", "llama", "overhead"}
    if unknown:
        ap.error(f"unknown figure(s): {', '.join(sorted(unknown))}")
    if "chain" in which:
        chain(a.runs)
    if "llama" in which:
        llama(a.runs)
    if "overhead" in which:
        overhead(runs=max(a.runs, 9))


if __name__ == "__main__":
    main()
