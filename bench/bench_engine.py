"""Issue 2 figures, each measured side by side with its reference in the same run.

    python bench/bench_engine.py

1. CLI start-up: `ggtool compute` of a tiny graph against `python -c "import numpy, gguf"`
   (target: ratio <= 1.5).
2. In-process f32 mul_mat K=N=2048, M=512 (one ggtool graph, 1 participant) against numpy's own
   `@` in the same process with the same BLAS threads (target: ratio >= 0.9). A participant is one
   thread (ggtool limits BLAS to 1 thread while computing; the pool gives the parallelism), so
   numpy is timed with 1 BLAS thread too; numpy with all BLAS threads is printed for reference.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import numpy as np

# Both commands run as a user's would: with bytecode caching on (numpy's and gguf's .pyc files were
# written by pip; ggtool's editable sources get theirs on the warm-up run).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def median_wall(cmd: list[str], runs: int = 9) -> float:
    subprocess.run(cmd, check=True, capture_output=True, env=ENV)  # warm-up (page cache, .pyc)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=ENV)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def best_of(fn, runs: int = 7) -> float:
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def startup() -> None:
    ref = median_wall([sys.executable, "-c", "import numpy, gguf"])
    ours = median_wall([sys.executable, "-m", "ggtool", "compute", "add(a, b)",
                        "--tensor", "a=[1,2,3]", "--tensor", "b=[4,5,6]"])
    print(f"CLI start-up (tiny compute): {ours * 1e3:7.1f} ms   python -c 'import numpy, gguf': "
          f"{ref * 1e3:7.1f} ms   ratio {ours / ref:.2f}x (target <= 1.5x)")


def mul_mat(K: int = 2048, N: int = 2048, M: int = 512) -> None:
    import ggtool
    import ggtool.compute
    from ggtool.ops import FUNCTIONS

    rng = np.random.default_rng(0)
    w = rng.standard_normal((N, K), dtype=np.float32)   # ggml ne [K, N]
    x = rng.standard_normal((M, K), dtype=np.float32)   # ggml ne [K, M]
    ctx = ggtool.Context()
    a = ctx.new_tensor_from(w, name="w")
    b = ctx.new_tensor_from(x, name="x")
    out = FUNCTIONS["mul_mat"](ctx, a, b)
    g = ggtool.Graph(ctx).expand(out)
    plan = ggtool.compute.prepare(g, 1)
    from ggtool import blas

    t_ours = best_of(lambda: ggtool.graph_compute(g, plan=plan))
    with blas.limit(1):
        t_np = best_of(lambda: x @ w.T)
    t_np_all = best_of(lambda: x @ w.T)
    assert np.allclose(out.data[0, 0], x @ w.T, rtol=1e-4, atol=1e-3)
    flops = 2 * K * N * M
    print(f"f32 mul_mat K={K} N={N} M={M}, in-process: ggtool {flops / t_ours / 1e9:6.1f} GFLOP/s, "
          f"numpy @ (1 BLAS thread) {flops / t_np / 1e9:6.1f} GFLOP/s, ratio {t_np / t_ours:.2f}x "
          f"(target >= 0.9x); numpy @ with all BLAS threads {flops / t_np_all / 1e9:6.1f} GFLOP/s")


if __name__ == "__main__":
    startup()
    mul_mat()
