"""Issue 9 figures: the compiled kernels, each measured against its reference in the same run.

    python bench/bench_kernels.py                 # everything (a few minutes on 2 cores)
    python bench/bench_kernels.py startup llama   # only some: startup quantize-npy llama matmul quantize gemma

- startup: `ggtool compute 'add(a, b)'` on tiny inputs against `python -c "import numpy, gguf"`
  (fresh processes, interleaved, median); a Q4_0 compute the first time ever (empty kernel cache:
  compiling) and cached.
- quantize-npy: `ggtool quantize x.npy out.gguf` for 64 Mi N(0,1) floats against a gguf-py script
  doing the same load / quantize / write (wall time and peak RSS of each process).
- llama: the 16-token llama pass of fixtures/stories260K.gguf quantized to Q4_0, compute alone on a
  built graph, in-process, 1 thread. For "before", run the same steps with an older checkout's
  ggtool first on sys.path (an editable install's import finder removed from sys.meta_path): at
  5a0c7f9, the last numpy-only kernels, 6.58 ms against 2.93 ms here (2026-11-24).
- matmul: Q4_0 x f32 mul_mat on 2 participants against numpy's f32 `@` with 2 BLAS threads
  (bench_pool.q4_0); quantize: Q4_0 quantization against gguf-py (bench_quant.bench_q4_0);
  gemma: gemma-3-270m requantized to Q4_0 (bench_quant.bench_gemma).
"""

from __future__ import annotations

import argparse
import os
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


def _run(cmd: list[str], env=None) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one command in a fresh process (its own maximum resident set
    and its children's, as wait4 reports them)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode()
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err}")
    return wall, ru.ru_maxrss / 1024


def _interleaved(cmds: dict, runs: int) -> dict:
    res = {k: [] for k in cmds}
    for c in cmds.values():       # warm-up (page cache, kernel cache)
        _run(*c)
    for _ in range(runs):
        for k, c in cmds.items():
            res[k].append(_run(*c))
    return {k: (statistics.median(w for w, _ in v), max(r for _, r in v)) for k, v in res.items()}


def compile_pyc() -> None:
    """ggtool's modules as an installed package has them: compiled (pip compiles a wheel's .py files
    to .pyc at install, as it did numpy's and gguf's). Without .pyc files, and with
    PYTHONDONTWRITEBYTECODE set (as on some machines), every module is compiled again on every run."""
    import compileall
    for d in ("ggtool", "commands"):
        compileall.compile_dir(str(ROOT / d), quiet=1)


def startup(runs: int) -> None:
    ggtool = [sys.executable, "-m", "ggtool"]
    tiny = ggtool + ["compute", "add(a, b)", "--tensor", "a=[1,2]", "--tensor", "b=[3,4]"]
    row = "[" + ",".join(["0.5"] * 64) + "]"
    q4 = ggtool + ["compute", "mul_mat(w, x)", "--tensor", f"w=q4_0:[{row},{row}]", "--tensor", f"x=[{row}]"]
    compile_pyc()
    t = _interleaved({"ref": ([sys.executable, "-c", "import numpy, gguf"],), "add": (tiny,), "q4": (q4,)}, runs)
    print(f"\n== start-up, fresh processes, median of {runs} (ggtool's .pyc files compiled, as installed)")
    print(f"  python -c 'import numpy, gguf'           {t['ref'][0] * 1e3:7.0f} ms")
    print(f"  ggtool compute 'add(a, b)' (tiny)         {t['add'][0] * 1e3:7.0f} ms   x{t['add'][0] / t['ref'][0]:.2f} "
          "(target <= 1.5x)")
    print(f"  ggtool compute Q4_0 mul_mat, cached       {t['q4'][0] * 1e3:7.0f} ms   x{t['q4'][0] / t['ref'][0]:.2f}")
    with tempfile.TemporaryDirectory() as d:
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
        env["GGTOOL_CACHE_DIR"] = d
        first = _run(q4, env)[0]
    print(f"  ggtool compute Q4_0 mul_mat, first ever   {first * 1e3:7.0f} ms   (empty kernel cache: compiles)")


GGUF_PY_QUANTIZE = """
import sys
import numpy as np
import gguf
x = np.load(sys.argv[1])
q = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0)
w = gguf.GGUFWriter(sys.argv[2], "ggtool-bench")
w.add_tensor("x.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
"""


def quantize_npy(runs: int) -> None:
    compile_pyc()
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "x.npy")
        np.save(src, np.random.default_rng(0).standard_normal((16384, 4096), dtype=np.float32))
        ours, theirs = os.path.join(d, "ggtool.gguf"), os.path.join(d, "gguf-py.gguf")
        cmds = {"gguf-py": ([sys.executable, "-c", GGUF_PY_QUANTIZE, src, theirs],),
                "ggtool": ([sys.executable, "-m", "ggtool", "quantize", src, ours, "-q", "--force", "--name", "x.weight"],)}
        t = _interleaved(cmds, runs)
        from gguf import GGUFReader
        a, b = GGUFReader(ours).tensors[0], GGUFReader(theirs).tensors[0]
        same = np.array_equal(np.asarray(a.data), np.asarray(b.data))
    print(f"\n== whole process: 64 Mi floats .npy -> Q4_0 GGUF, median of {runs}; tensor bytes identical: {same}")
    for k, (w, rss) in t.items():
        print(f"  {k:8s} {w:6.2f} s  peak RSS {rss:7.0f} MiB")
    print(f"  ratio {t['gguf-py'][0] / t['ggtool'][0]:.2f}x gguf-py (target >= 1.5x)")


def llama(runs: int) -> None:
    """Compute alone on a built graph, best of `runs`, after one warm-up (compiles or loads kernels)."""
    import ggtool
    from ggtool.dsl import build, parse
    from ggtool.tensor_io import Inputs, parse_source

    z = np.load(ROOT / "tests" / "golden" / "llama" / "stories260K-logits.npz")
    tokens = "i32:[" + ",".join(str(int(t)) for t in z["tokens_1"]) + "]"
    with tempfile.TemporaryDirectory() as d:
        model = os.path.join(d, "stories-q4_0.gguf")
        subprocess.run([sys.executable, "-m", "ggtool", "quantize", str(STORIES), model, "-q"], check=True)
        built = build(parse(PROGRAM.read_text(), str(PROGRAM)), ggtool.Context(),
                      Inputs([parse_source("tokens", tokens)], [model]))
        logits = built.outputs[0][1]
        g = built.graph
        plan = ggtool.graph_compute(g, 1)
        same = bool((logits.numpy().reshape(len(z["tokens_1"]), -1).argmax(1) == z["logits_1"].argmax(1)).all())
        best = float("inf")
        for _ in range(runs):
            t0 = time.perf_counter()
            ggtool.graph_compute(g, 1, plan=plan)
            best = min(best, time.perf_counter() - t0)
    print(f"\n== llama pass, stories260K as Q4_0, {len(z['tokens_1'])} tokens, in-process compute, 1 thread, best of "
          f"{runs}: {best * 1e3:.2f} ms (argmax as llama.cpp's f32 logits: {same}; code from {ggtool.__file__})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", nargs="*", default=["startup", "quantize-npy", "llama", "matmul", "quantize", "gemma"])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--llama-python", metavar="PYTHON", help="a python with llama-cpp-python installed (a bench "
                    "environment, e.g. `python -m venv /tmp/benchenv && /tmp/benchenv/bin/pip install "
                    "llama-cpp-python`): llama.cpp's quantize joins the gemma runs")
    a = ap.parse_args()
    if "startup" in a.which:
        startup(a.runs)
    if "quantize-npy" in a.which:
        quantize_npy(max(3, a.runs // 2))
    if "llama" in a.which:
        llama(a.runs * 3)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if "matmul" in a.which:
        import bench_pool

        from ggtool.pool import WorkerPool
        with WorkerPool(2) as pool:
            bench_pool.q4_0(pool)
    if "quantize" in a.which:
        import bench_quant
        bench_quant.bench_q4_0(a.runs)
    if "gemma" in a.which:
        import bench_quant
        compile_pyc()
        bench_quant.bench_gemma(max(3, a.runs // 2), a.llama_python, loop=False)


if __name__ == "__main__":
    main()
