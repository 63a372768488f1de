"""Issue 30 figure: the cost of an empty node, ggtool's worker pool against GGML's thread pool in the same run.

    python bench/bench_overhead.py [--nodes 1000,20000] [--width 16] [--threads 1,2,4] [--rounds 5]
                                   [--ggml /work/bench-env/build-native/bin] [--ggml-headers DIR] [--python-path]

Chains of adds of `--width` floats (each node's work is a few nanoseconds: what is measured is the node's
dispatch and the barrier after it), of each length in `--nodes`, computed again and again:

- ggtool: `graph_compute(g, n, pool=WorkerPool(n))` on the compiled runner (the graph frozen: its steps
  are made once), and with `--python-path` node after node from Python as before the runner;
- GGML: the same chain through libggml's `ggml_graph_compute` on a thread pool of n threads
  (`ggml_threadpool_new`, as llama.cpp keeps one), from a small C program built here with `cc` against
  the headers of llama-cpp-python's source distribution (or `--ggml-headers`) and the libraries in
  `--ggml` (a llama.cpp build; skipped if either is missing).

Each timing is the median over `--rounds` computes. From the two chain lengths: the cost per node (the
slope: microseconds per node) and per compute (what a graph costs whatever its nodes: waking the workers
and hearing back; GGML's threads wait for the next graph polling, then on a condition variable). On a
loaded machine the short chain alone misleads: 1000 nodes at GGML's 0.6 us fit in one scheduling slice,
so its median is a run where every thread had a core throughout. Two conditions, each with every
thread count: the machine as it is (threads beyond the CPUs this process may use: oversubscribed), and
another process busy-looping on one CPU throughout ("busy"). Ratios ggtool/GGML in the same run; say
the machine (and its load) with them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VENDOR = Path("/work/bench-env/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml")

PROBE = r"""
#include "ggml.h"
#include "ggml-cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
    int n = atoi(argv[1]), width = atoi(argv[2]), rounds = atoi(argv[3]), nth = atoi(argv[4]);
    struct ggml_init_params ip = { (size_t) n * (width * 4 + 512) + (64 << 20), NULL, false };
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, width);
    struct ggml_tensor *b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, width);
    for (int i = 0; i < width; i++) { ((float *) x->data)[i] = i; ((float *) b->data)[i] = 0.5f; }
    struct ggml_tensor *y = x;
    for (int i = 0; i < n; i++) y = ggml_add(ctx, y, b);
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, n + 16, false);
    ggml_build_forward_expand(gf, y);
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(nth);
    struct ggml_threadpool *tp = ggml_threadpool_new(&tpp);
    struct ggml_cplan cp = ggml_graph_plan(gf, nth, tp);
    cp.work_data = malloc(cp.work_size + 1);
    double *t = malloc(sizeof(double) * rounds);
    for (int r = -2; r < rounds; r++) {
        double t0 = now();
        ggml_graph_compute(gf, &cp);
        if (r >= 0) t[r] = now() - t0;
    }
    qsort(t, rounds, sizeof(double), cmp);
    printf("%.4f %.1f\n", 1e6 * t[rounds / 2] / n, ((float *) y->data)[1]);
    ggml_threadpool_free(tp);
    return 0;
}
"""


def build_probe(ggml_bin: Path, where: Path, headers: Path = VENDOR / "include") -> Path | None:
    """The C program above, built against llama.cpp's libggml and ggml's `headers` (None if it cannot be)."""
    for need in (headers / "ggml.h", ggml_bin / "libggml.so"):
        if not need.exists():
            print(f"(GGML probe not built: no {need}; --ggml-headers names ggml's include folder, --ggml a"
                  " llama.cpp build's bin folder)", file=sys.stderr)
            return None
    src, exe = where / "probe.c", where / "probe"
    src.write_text(PROBE)
    r = subprocess.run(["cc", "-O2", "-o", str(exe), str(src), f"-I{headers}", f"-L{ggml_bin}",
                        "-lggml", "-lggml-base", "-lggml-cpu", f"-Wl,-rpath,{ggml_bin}"], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"(GGML probe not built: {r.stderr.strip()[:200]})", file=sys.stderr)
        return None
    return exe


def ggml_us(probe: Path, nodes: int, width: int, rounds: int, nth: int) -> float:
    out = subprocess.run([str(probe), str(nodes), str(width), str(rounds), str(nth)], capture_output=True, text=True,
                         check=True).stdout.split()
    assert float(out[1]) == 1 + 0.5 * nodes, out     # the chain was computed
    return float(out[0]) * nodes


def ggtool_us(nodes: int, width: int, rounds: int, nth: int, compiled: bool) -> float:
    """Microseconds of a compute of the chain on nth participants (a fresh process)."""
    code = f"""
import statistics, sys, time
import numpy as np
import ggtool
from ggtool import compute, runner
from ggtool.ops import FUNCTIONS as F
from ggtool.pool import WorkerPool
import ggtool.kernels.jit           # numba loaded: the compiled runner takes any graph
compute.COMPILED = {compiled}
if not {compiled}:
    runner.available = lambda: False
ctx = ggtool.Context()
x = ctx.new_tensor("f32", [{width}]); x.data[...] = np.arange({width})
b = ctx.new_tensor("f32", [{width}]); b.data[...] = 0.5
y = x
for _ in range({nodes}):
    y = F["add"](ctx, y, b)
g = ggtool.Graph(ctx, {nodes} + 16).expand(y)
pool = WorkerPool({nth}) if {nth} > 1 else None
compute.freeze(g)
if pool is not None:
    pool.freeze(g)
plan = ggtool.graph_compute(g, {nth}, pool=pool)
times = []
for r in range({rounds} + 2):
    t = time.perf_counter()
    ggtool.graph_compute(g, {nth}, pool=pool, plan=plan)
    times.append(time.perf_counter() - t)
assert float(y.numpy().reshape(-1)[1]) == 1 + 0.5 * {nodes}
print(1e6 * statistics.median(times[2:]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    return float(out.stdout.split()[-1])


class Busy:
    """Another process busy-looping on CPU 0 while it is open."""

    def __enter__(self):
        self.p = subprocess.Popen([sys.executable, "-c", "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass"])
        time.sleep(0.2)
        return self

    def __exit__(self, *exc):
        self.p.kill()
        self.p.wait()


def fit(times: dict) -> tuple[float, float]:
    """(us per node, us per compute) from {nodes: us} of two or more chain lengths (least squares)."""
    xs, ys = list(times), list(times.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1000,20000")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--threads", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ggml", type=Path, default=Path("/work/bench-env/build-native/bin"))
    ap.add_argument("--ggml-headers", type=Path, default=VENDOR / "include", help="ggml's include folder")
    ap.add_argument("--python-path", action="store_true", help="also the pool without the compiled runner")
    ap.add_argument("--no-busy", action="store_true", help="skip the run with a busy-looping process")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    lengths = [int(n) for n in args.nodes.split(",")]
    if len(lengths) < 2:
        raise SystemExit("--nodes: give two chain lengths or more (the cost per node is the slope)")
    cpus = len(os.sched_getaffinity(0))
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"# chains of {args.nodes} adds of {args.width} floats; {cpus} CPUs, load average {load}; medians of "
          f"{args.rounds} computes")
    with tempfile.TemporaryDirectory() as tmp:
        probe = build_probe(args.ggml, Path(tmp), args.ggml_headers)
        conditions = [("as is", None)] if args.no_busy else [("as is", None), ("busy", Busy)]
        head = ["condition", "threads", "ggtool us/node", "GGML us/node", "ggtool / GGML", "ggtool us/compute",
                "GGML us/compute"]
        if args.python_path:
            head.insert(3, "Python path us/node")
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for name, ctx in conditions:
            for nth in threads:
                over = " (oversubscribed)" if nth > cpus else ""
                busy = ctx() if ctx else None
                try:
                    if busy:
                        busy.__enter__()
                    ours = fit({n: ggtool_us(n, args.width, args.rounds, nth, True) for n in lengths})
                    py = fit({n: ggtool_us(n, args.width, args.rounds, nth, False) for n in lengths}) \
                        if args.python_path else None
                    theirs = fit({n: ggml_us(probe, n, args.width, args.rounds, nth) for n in lengths}) if probe else None
                finally:
                    if busy:
                        busy.__exit__(None, None, None)
                cols = [name + over, str(nth), f"{ours[0]:.2f}", f"{theirs[0]:.2f}" if theirs else "-",
                        f"{ours[0] / theirs[0]:.2f}" if theirs and theirs[0] > 0 else "-", f"{ours[1]:.0f}",
                        f"{theirs[1]:.0f}" if theirs else "-"]
                if args.python_path:
                    cols.insert(3, f"{py[0]:.2f}")
                print("| " + " | ".join(cols) + " |", flush=True)


if __name__ == "__main__":
    main()
