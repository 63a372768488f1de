"""Issue 4 figures: the worker pool, each figure with its reference measured in the same run.

    python bench/bench_pool.py            # all figures (about a minute on 2 cores)
    python bench/bench_pool.py overhead   # only some: startup overhead f32 q4_0 scaling

1. Pool start-up: WorkerPool(2) until its worker is ready, and the first compute.
2. Per-node overhead: a chain of 1000 adds on 16-float tensors, us/node in-process and with 2
   participants (target <= 20 us; GGML pays 0.4 us with 2 threads), and a chain of 1000 empty
   all-participant nodes (the barrier and dispatch alone).
3. f32 mul_mat K=N=2048 M=512 and K=N=4096 M=64 on the pool with 2 participants against numpy's
   `a @ w.T` with 2 BLAS threads (measured in a subprocess with OPENBLAS_NUM_THREADS=2). Issue 4's
   target, 0.9x, was met through BLAS; the default numerics no longer use BLAS (its order of sums
   follows the CPU: docs/engine.md, "One order on every host"), so F32 runs GGML's order compiled,
   at about 0.25-0.3x BLAS, and the figure is shown for what it is.
4. Scaling: 1 participant (in-process, one thread) -> 2 on the large f32 mul_mat: target >= 1.8x;
   next to numpy's own scaling from 1 to 2 BLAS threads on the same product (what the two cores allow).
5. Q4_0 x f32 mul_mat (the two shapes above and M=1, K=N=4096) with 2 participants, GFLOP/s against
   GGML's CPU backend on this machine (nth=2: 71-74 standalone ggml, 105-110 llama.cpp's build).

Timings are the median of several runs after a warm-up. FLOPs = 2*K*N*M.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import numpy as np

import ggtool

# GGML on this machine, nth = 2 (shared/research/peer-baselines.md: M2/M3 f32, Q5/Q6/Q7 Q4_0)
GGML_F32 = {(2048, 2048, 512): 49.7, (4096, 4096, 64): 45.6}
GGML_Q4_0 = {(2048, 2048, 512): 71.1, (4096, 4096, 64): 73.6, (4096, 4096, 1): 74.3}
LLAMA_CPP_Q4_0 = {(2048, 2048, 512): 105.4, (4096, 4096, 64): 109.6, (4096, 4096, 1): 75.0}


def empty_kernel(node, ith, nth, work):
    """An all-participant node that does nothing: what is left is dispatch and the barrier."""


def timed(*fns, runs: int = 7, settle: float = 0.0) -> list[float]:
    """Median seconds of each fn, their runs interleaved (fn1, fn2, fn1, ...) after a warm-up, so
    that a figure and its reference see the same background load. A fn may return its own time.
    `settle`: a pause before each run, for OpenBLAS threads of the previous one to stop spinning."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(runs):
        for fn, ts in zip(fns, times):
            time.sleep(settle)
            t0 = time.perf_counter()
            r = fn()
            ts.append(r if isinstance(r, float) else time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def _busy_fraction(seconds: float = 1.0) -> float:
    """Share of the machine's CPU time used while we sleep (by other processes)."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    t0, i0 = snap()
    time.sleep(seconds)
    t1, i1 = snap()
    return 1 - (i1 - i0) / max(1, t1 - t0)


def wait_idle(limit: float = 120.0) -> None:
    """Wait (up to `limit` s) until the machine was idle (< 5% CPU) for 1 s, as the baselines did."""
    end = time.monotonic() + limit
    try:
        busy = _busy_fraction()
        while busy > 0.05 and time.monotonic() < end:
            busy = _busy_fraction()
    except OSError:
        return
    if busy > 0.05:
        print(f"  (warning: the machine is busy, {busy:.0%} CPU used by other processes: figures are pessimistic)")


def has_ops(*names) -> bool:
    from ggtool.ops import FUNCTIONS
    return all(n in FUNCTIONS for n in names)


# -- 1 -----------------------------------------------------------------------------------------
def startup() -> None:
    import ggtool
    from ggtool.ops import FUNCTIONS
    from ggtool.pool import WorkerPool

    times, first = [], []
    for _ in range(3):
        ctx = ggtool.Context()
        a = ctx.new_tensor("f32", [16])
        g = ggtool.Graph(ctx)
        g.expand(FUNCTIONS["add"](ctx, a, a))
        t0 = time.perf_counter()
        with WorkerPool(2) as pool:
            pool._ensure(2)
            t1 = time.perf_counter()
            ggtool.graph_compute(g, 2, pool=pool)
            t2 = time.perf_counter()
        times.append(t1 - t0)
        first.append(t2 - t1)
    (ref,) = timed(lambda: subprocess.run([sys.executable, "-c", "import numpy, gguf"], check=True), runs=3)
    print(f"pool start-up (2 participants, worker ready): {statistics.median(times) * 1e3:6.0f} ms; "
          f"first compute (segment + graph): {statistics.median(first) * 1e3:5.1f} ms; "
          f"for reference `python -c 'import numpy, gguf'`: {ref * 1e3:.0f} ms")


# -- 2 -----------------------------------------------------------------------------------------
def add_chain(n: int):
    """(graph, its result, its input x): y = x + b + b + ... (n adds) on 16 floats."""
    import ggtool
    from ggtool.ops import FUNCTIONS

    ctx = ggtool.Context()
    x = ctx.new_tensor("f32", [16])
    b = ctx.new_tensor("f32", [16])
    x.data[...] = 1
    b.data[...] = 0.5
    y = x
    for _ in range(n):
        y = FUNCTIONS["add"](ctx, y, b)
    g = ggtool.Graph(ctx, 2 * n)
    g.expand(y)
    return g, y, x


def overhead(n: int = 1000) -> None:
    from ggtool.compute import Work, run_node, work_view
    from ggtool.ops import KERNELS, Kernel
    from ggtool.ops.base import ALL, new_op
    from ggtool.pool import WorkerPool

    g, y, x = add_chain(n)
    ctx = x.ctx

    KERNELS["BENCH_EMPTY"] = Kernel("BENCH_EMPTY", empty_kernel, ALL, None)
    e = x
    for _ in range(n):
        e = new_op(ctx, "BENCH_EMPTY", e.type, e.ne, (e,))
    ge = ggtool.Graph(ctx, 2 * n)
    ge.expand(e)

    p1 = ggtool.graph_compute(g, 1)
    want = y.numpy()
    pe1 = ggtool.graph_compute(ge, 1)
    with WorkerPool(2) as pool:
        p2 = ggtool.graph_compute(g, 2, pool=pool)
        assert np.array_equal(y.numpy(), want)
        pe = ggtool.graph_compute(ge, 2, pool=pool)
        # the kernels alone, as participant 0 of 2 runs them (the split has its own cost in the kernel)
        work = Work(work_view(g, p2))
        t2, t1, tk, te, te1 = timed(lambda: ggtool.graph_compute(g, 2, pool=pool, plan=p2), lambda: ggtool.graph_compute(g, 1, plan=p1),
                                    lambda: [run_node(i, node, 0, 2, work) for i, node in enumerate(g.nodes)],
                                    lambda: ggtool.graph_compute(ge, 2, pool=pool, plan=pe), lambda: ggtool.graph_compute(ge, 1, plan=pe1),
                                    runs=9)
    us = 1e6 / n
    print(f"add chain, {n} nodes of 16 floats: 2 participants {t2 * us:5.1f} us/node (target <= 20; GGML 0.4); "
          f"in-process {t1 * us:5.1f} us/node; the kernel as participant 0 of 2 {tk * us:5.1f} us/node, "
          f"so the pool adds {(t2 - tk) * us:4.1f} us/node")
    print(f"empty all-participant nodes: 2 participants {te * us:5.2f} us/node, in-process {te1 * us:5.2f} "
          f"us/node: the pool adds {(te - te1) * us:4.2f} us/node (graph check, dispatch, barrier)")


# -- 3, 4, 5 -----------------------------------------------------------------------------------
NUMPY_SERVER = """
import sys, time
import numpy as np
K, N, M = map(int, sys.argv[1:4])
rng = np.random.default_rng(0)
w = rng.standard_normal((N, K), dtype=np.float32)
x = rng.standard_normal((M, K), dtype=np.float32)
print("ready", flush=True)
for line in sys.stdin:   # a line "n": n timed `x @ w.T` back to back, seconds per product
    n = int(line or 1)
    t0 = time.perf_counter()
    for _ in range(n):
        x @ w.T
    print((time.perf_counter() - t0) / n, flush=True)
"""


class NumpyTimer:
    """numpy's `x @ w.T` with `threads` BLAS threads, in its own process (ours has BLAS on one
    thread while it computes on the pool); each call times one product there."""

    def __init__(self, K: int, N: int, M: int, threads: int):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen([sys.executable, "-c", NUMPY_SERVER, str(K), str(N), str(M)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def __call__(self, reps: int = 1) -> float:
        self.proc.stdin.write(f"{reps}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def mul_mat_graph(K: int, N: int, M: int, wtype: str):
    import ggtool
    from ggtool.ops import FUNCTIONS

    rng = np.random.default_rng(0)
    w = rng.standard_normal((N, K), dtype=np.float32)   # ggml ne [K, N]
    x = rng.standard_normal((M, K), dtype=np.float32)   # ggml ne [K, M]
    ctx = ggtool.Context()
    a = ctx.new_tensor_from(w, type=wtype, name="w")
    b = ctx.new_tensor_from(x, name="x")
    out = FUNCTIONS["mul_mat"](ctx, a, b)
    g = ggtool.Graph(ctx)
    g.expand(out)
    return g, out, w, x


def one_vs_pool(g, pool) -> tuple[float, float]:
    """Seconds for `g` in-process on one thread (one BLAS thread, one ggtool.quant thread) and on
    the pool with 2 participants, runs interleaved."""
    from ggtool.threads import single_threaded

    p1 = ggtool.graph_compute(g, 1)
    p2 = ggtool.graph_compute(g, 2, pool=pool)

    def one():
        with single_threaded():
            ggtool.graph_compute(g, 1, plan=p1)

    return tuple(timed(one, lambda: ggtool.graph_compute(g, 2, pool=pool, plan=p2), settle=0.2))


def f32(pool, shapes=((2048, 2048, 512), (4096, 4096, 64))) -> None:
    for K, N, M in shapes:
        g, out, w, x = mul_mat_graph(K, N, M, "f32")
        plan = ggtool.graph_compute(g, 2, pool=pool)
        assert np.allclose(out.numpy()[0, 0], x @ w.T, rtol=1e-3, atol=1e-2)
        numpy2 = NumpyTimer(K, N, M, threads=2)
        t, tn = timed(lambda: ggtool.graph_compute(g, 2, pool=pool, plan=plan), numpy2, runs=15, settle=0.2)  # noqa: B023
        numpy2.close()
        fl = 2 * K * N * M
        print(f"f32 mul_mat K={K} N={N} M={M}: pool(2) {fl / t / 1e9:6.1f} GFLOP/s, numpy @ with 2 BLAS threads "
              f"{fl / tn / 1e9:6.1f}: ratio {tn / t:.2f}x (GGML's order, not BLAS's); GGML nth=2 {GGML_F32[(K, N, M)]}")


def scaling(pool, K: int = 2048, N: int = 2048, M: int = 512) -> None:
    """1 -> 2 participants, next to numpy's own 1 -> 2 BLAS threads on the same product, all four
    interleaved: how far two cores of this machine scale at all."""
    from ggtool.threads import single_threaded

    g = mul_mat_graph(K, N, M, "f32")[0]
    p1, p2 = ggtool.graph_compute(g, 1), ggtool.graph_compute(g, 2, pool=pool)
    np1, np2 = NumpyTimer(K, N, M, threads=1), NumpyTimer(K, N, M, threads=2)

    def one():
        with single_threaded():
            ggtool.graph_compute(g, 1, plan=p1)

    t1, t2, tn1, tn2 = timed(one, lambda: ggtool.graph_compute(g, 2, pool=pool, plan=p2), np1, np2, runs=15, settle=0.2)
    np1.close()
    np2.close()
    fl = 2 * K * N * M
    print(f"scaling f32 mul_mat K={K} N={N} M={M}: 1 participant (in-process, 1 thread) {fl / t1 / 1e9:6.1f} GFLOP/s, "
          f"2 participants {fl / t2 / 1e9:6.1f}: {t1 / t2:.2f}x (target >= 1.8x); numpy's own 1 -> 2 BLAS threads "
          f"{fl / tn1 / 1e9:.1f} -> {fl / tn2 / 1e9:.1f} GFLOP/s: {tn1 / tn2:.2f}x")


def quantized_graph(K: int, N: int, M: int, wtype: str):
    """mul_mat(w, x) with w of a block type: quantized from N(0,1) where ggtool quantizes to it
    (Q4_0, Q8_0), else random blocks with small normal fp16 scales (K-quants: no quantizer here)."""
    if wtype in ("q4_0", "q8_0"):
        return mul_mat_graph(K, N, M, wtype)[0]
    import ggtool
    from ggtool import types as T
    from ggtool.ops import FUNCTIONS

    t = T.parse_type(wtype)
    nbytes, qk = T.type_size(t), T.block_size(t)
    scales = {"q4_K": (0, 2), "q5_K": (0, 2), "q6_K": (208,), "q2_K": (80, 82), "q3_K": (108,)}.get(wtype, (0,))
    rng = np.random.default_rng(0)
    w = rng.integers(0, 256, (N, K // qk, nbytes), dtype=np.uint8)
    for o in scales:
        w[..., o + 1] = w[..., o + 1] % 0x20 + 0x08
    ctx = ggtool.Context()
    a = ctx.new_tensor(wtype, [K, N]).set_data(w.reshape(N, -1))
    b = ctx.new_tensor_from(rng.standard_normal((M, K), dtype=np.float32), name="x")
    g = ggtool.Graph(ctx)
    g.expand(FUNCTIONS["mul_mat"](ctx, a, b))
    return g


def q4_0(pool, shapes=((4096, 4096, 1), (4096, 4096, 64), (2048, 2048, 512)), wtype: str = "q4_0") -> None:
    """Quantized weights x f32 activations on the pool (2 participants) against numpy's f32 `x @ w.T`
    on the same shape with 2 BLAS threads, interleaved in the same run (issues 9 and 10). As in the
    peer baselines, a fast product is repeated back to back for ~0.2 s and timed per product (a
    single product after an idle pause mostly measures waking up)."""
    from ggtool.threads import single_threaded

    for K, N, M in shapes:
        g = quantized_graph(K, N, M, wtype)
        p1, p2 = ggtool.graph_compute(g, 1), ggtool.graph_compute(g, 2, pool=pool)
        numpy2 = NumpyTimer(K, N, M, threads=2)
        t0 = time.perf_counter()
        ggtool.graph_compute(g, 2, pool=pool, plan=p2)
        reps = max(1, int(0.2 / (time.perf_counter() - t0)))

        def many(fn, reps=reps):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - t0) / reps

        def one(g=g, p1=p1):
            with single_threaded():
                return many(lambda: ggtool.graph_compute(g, 1, plan=p1))

        t1, t, tn = timed(one, lambda g=g, p2=p2: many(lambda: ggtool.graph_compute(g, 2, pool=pool, plan=p2)),
                          lambda n=numpy2, r=reps: n(r), runs=9, settle=0.05)
        numpy2.close()
        fl = 2 * K * N * M
        target = ("2.0x" if wtype == "q4_0" else "1.5x") if M == 1 else "0.85x"
        ggml = f"GGML nth=2: {GGML_Q4_0[(K, N, M)]}, llama.cpp {LLAMA_CPP_Q4_0[(K, N, M)]}" if wtype == "q4_0" else "GGML Q4_K ~ its Q4_0"
        print(f"{wtype} x f32 mul_mat K={K} N={N} M={M}: pool(2) {fl / t / 1e9:6.1f} GFLOP/s, numpy f32 @ with 2 BLAS "
              f"threads {fl / tn / 1e9:6.1f}: ratio {tn / t:.2f}x (target >= {target}); 1 participant "
              f"{fl / t1 / 1e9:6.1f} GFLOP/s; {t * 1e3:.2f} ms per mul_mat, {reps} back to back ({ggml}, "
              "measured on another day)")


def main(which) -> None:
    from ggtool.pool import WorkerPool

    if "startup" in which:
        wait_idle()
        startup()
    if "overhead" in which:
        wait_idle()
        overhead()
    if not has_ops("mul_mat"):
        print("mul_mat is not registered yet: the mul_mat figures are skipped")
        return
    with WorkerPool(2) as pool:
        if "f32" in which:
            wait_idle()
            f32(pool)
        if "scaling" in which:
            wait_idle()
            scaling(pool)
        if "q4_0" in which:
            try:
                import ggtool.quant  # noqa: F401
            except ImportError:
                print("ggtool.quant is not there yet: the Q4_0 figures are skipped")
            else:
                wait_idle()
                q4_0(pool)
                for wtype in ("q4_K", "q6_K"):
                    q4_0(pool, ((4096, 4096, 1),), wtype)


if __name__ == "__main__":
    # Import this file as the module `bench_pool` (its folder is sys.path[0], which the workers
    # share) so that the pool can send `bench_pool.empty_kernel` to them by reference.
    import bench_pool

    bench_pool.main(sys.argv[1:] or ["startup", "overhead", "f32", "scaling", "q4_0"])
