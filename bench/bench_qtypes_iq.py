"""Issue 31 figures for IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S: quantize wall time against
llama-quantize in the same run, and the mat-vec dot's GFLOP/s.

    python bench/bench_qtypes_iq.py quantize F16.gguf IMATRIX.gguf --llama-quantize BIN [--threads 2] [--runs 3]
    python bench/bench_qtypes_iq.py dot [--rows 2048] [--cols 2048] [--runs 5] [--ggml GGML_DIR --ggml-build BIN]

quantize: llama-quantize --pure --imatrix IMATRIX F16.gguf OUT FTYPE THREADS for each type (the
file type whose tensors get it: IQ2_M's are IQ2_S), timed as a whole process (loading, the
fallback tensors, writing included), and, as the process's fixed cost, the same run with Q8_0;
then ggtool.qtypes' quantizer on exactly the tensors llama-quantize gave the type (their F16
values as float32, their importances from the same imatrix), on THREADS threads, timed per call
(the F16 read and conversion left out), and its bytes compared with llama-quantize's. Rounds
interleave the two; medians of --runs.

dot: for a ROWS x COLS weight of each type (and Q4_K, a yardstick) times one F32 row, one thread,
GFLOP/s = 2*rows*cols / time: mul_mat's own path (quant.matmul.mul_mat_into: the K-quant tile on a
record's K form, its packed form, or its generic dot; weights packed once, as a model's are; the
row's conversion to the vec_dot_type included); beside it GGML's own mul_mat of the same bytes
(ggml_graph_compute_with_ctx on one thread) through the libggml of --ggml-build (a small C timer
compiled against it).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TYPES = ("iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s")
FTYPE = {"iq2_xxs": "IQ2_XXS", "iq2_xs": "IQ2_XS", "iq2_s": "IQ2_M", "iq3_xxs": "IQ3_XXS", "iq3_s": "IQ3_S"}


def load_maker():
    spec = importlib.util.spec_from_file_location("make_iquants", ROOT / "tests" / "golden" / "iquants" / "make_iquants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def threaded_runner(n_threads: int):
    """run(fn, n_items, chunk) on n_threads (the caller's thread one of them), as ggtool.quant's."""
    pool = ThreadPoolExecutor(max(1, n_threads - 1))

    def run(fn, n, chunk):
        starts = iter(range(0, n, chunk))
        import threading
        lock = threading.Lock()

        def worker():
            while True:
                with lock:
                    s = next(starts, None)
                if s is None:
                    return
                fn(s, min(s + chunk, n))

        futures = [pool.submit(worker) for _ in range(n_threads - 1)]
        worker()
        for f in futures:
            f.result()

    return run


def quantize_bench(a) -> None:
    from gguf import GGUFReader

    from ggtool import qtypes
    from ggtool.imatrix import read_imatrix

    imat = read_imatrix(a.imatrix)
    src = GGUFReader(a.model)
    f16 = {t.name: t for t in src.tensors}
    run = threaded_runner(a.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench-iq-"))
    print(f"llama-quantize: {a.llama_quantize}; {a.threads} threads; medians of {a.runs} runs; machine shared "
          f"(load {os.getloadavg()[0]:.1f})")

    def llama(ftype: str) -> tuple[float, Path]:
        out = tmp / f"{ftype}.gguf"
        t0 = time.perf_counter()
        subprocess.run([a.llama_quantize, "--pure", "--imatrix", a.imatrix, a.model, str(out), ftype, str(a.threads)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t0, out

    for t in a.types:
        rec = qtypes.get(t)
        base = []
        ref = []
        mine = []
        out = None
        for _ in range(a.runs):
            s, out = llama(FTYPE[t])
            ref.append(s)
            base.append(llama("Q8_0")[0])
            q = GGUFReader(str(out))
            names = [x.name for x in q.tensors if x.tensor_type.name == t.upper()]
            want = {x.name: np.asarray(x.data) for x in q.tensors if x.name in names}
            total = 0.0
            same = True
            blocks = 0
            for name in names:
                x = np.asarray(f16[name].data, np.float32)
                qw = imat.weights_for(name, tuple(int(v) for v in f16[name].shape))
                t0 = time.perf_counter()
                got = rec.quantize(x, qw, name=name, run=run)
                total += time.perf_counter() - t0
                same &= np.array_equal(got.reshape(-1), want[name].reshape(-1))
                blocks += x.size // 256
            mine.append(total)
        r, b, m = statistics.median(ref), statistics.median(base), statistics.median(mine)
        print(f"{t:8} {len(names):3} tensors, {blocks:7} blocks: llama-quantize {FTYPE[t]} {r:6.2f} s "
              f"(Q8_0 run {b:5.2f} s, so ~{r - b:6.2f} s on these), ggtool {m:6.2f} s: "
              f"ratio {m / r:.2f} of the whole run, {m / max(r - b, 1e-9):.2f} of the estimate; "
              f"bytes equal llama-quantize's: {same}", flush=True)


# GGML's own mul_mat (ggml_graph_compute_with_ctx, the CPU backend of the build given), timed in C:
# argv: type id, rows, cols, runs, threads, weight bytes file; prints the median seconds and y[0].
MULMAT_C = r"""
#include "ggml.h"
#include "ggml-cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static int cmp(const void * a, const void * b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char ** argv) {
    int type = atoi(argv[1]), rows = atoi(argv[2]), cols = atoi(argv[3]), runs = atoi(argv[4]), nth = atoi(argv[5]);
    struct ggml_init_params p = { (size_t)1 << 30, NULL, false };
    struct ggml_context * ctx = ggml_init(p);
    struct ggml_tensor * w = ggml_new_tensor_2d(ctx, type, cols, rows);
    FILE * f = fopen(argv[6], "rb");
    if (!f || fread(w->data, 1, ggml_nbytes(w), f) != ggml_nbytes(w)) return 2;
    fclose(f);
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, 1);
    for (int i = 0; i < cols; ++i) ((float *)x->data)[i] = (float)((i * 7919 % 1000) - 500) / 500.0f;
    struct ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_graph_compute_with_ctx(ctx, gf, nth);
    double * ts = malloc(sizeof(double) * runs);
    for (int r = 0; r < runs; ++r) { double t0 = now(); ggml_graph_compute_with_ctx(ctx, gf, nth); ts[r] = now() - t0; }
    qsort(ts, runs, sizeof(double), cmp);
    printf("%.9f %g\n", ts[runs / 2], ((float *)y->data)[0]);
    return 0;
}
"""


def ggml_mulmat(build: Path, ggml_dir: Path) -> Path:
    """The C timer above, compiled against the build's libggml."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-iq-mm-"))
    (tmp / "mm.c").write_text(MULMAT_C)
    exe = tmp / "mm"
    subprocess.run(["gcc", "-O2", tmp / "mm.c", "-I", ggml_dir / "include", "-L", build, f"-Wl,-rpath,{build}",
                    "-lggml", "-lggml-base", "-lggml-cpu", "-o", exe], check=True)
    return exe


def dot_bench(a) -> None:
    from ggtool import qtypes, quant
    from ggtool import types as T
    from ggtool.quant import matmul as qm

    rng = np.random.default_rng(1)
    x = (rng.standard_normal((a.rows, a.cols)) * 0.02).astype(np.float32)
    act = rng.standard_normal((1, a.cols)).astype(np.float32)
    exe = ggml_mulmat(Path(a.ggml_build), Path(a.ggml)) if a.ggml_build else None
    flops = 2.0 * a.rows * a.cols
    print(f"mat-vec {a.rows} x {a.cols} . 1 row, 1 thread, medians of {a.runs}; machine shared (load {os.getloadavg()[0]:.1f})")

    def timed(fn) -> float:
        fn()
        ts = []
        for _ in range(a.runs):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    def mul_mat(t, w):
        """mul_mat's own path (quant.matmul.mul_mat_into on weights packed once, as a model's are),
        the activation row's conversion to the vec_dot_type included as GGML's timing includes it."""
        tt = T.parse_type(t)
        packed = qm.pack_rows(tt, w)
        out = np.empty((1, a.rows), np.float32)
        vdt = T.vec_dot_type(tt)

        def run():
            q = quant.quantize_q8_k(act) if vdt == T.GGMLType.Q8_K else quant.quantize_q8_0_cpu(act)
            qm.mul_mat_into(tt, w, q, out, pack=lambda: packed)
        return run

    with quant.threads_set_to(1):
        for t in ["q4_K", *a.types]:
            w = quant.quantize(x, t, imatrix=np.ones(a.cols, np.float32))
            ours = timed(mul_mat(t, w))
            line = f"{t:8} ggtool {flops / ours / 1e9:6.2f} GFLOP/s"
            if exe is not None:
                wf = Path(tempfile.mkdtemp(prefix="bench-iq-w-")) / "w.bin"
                w.tofile(wf)
                got = subprocess.run([exe, str(int(T.parse_type(t))), str(a.rows), str(a.cols), str(4 * a.runs), "1", wf],
                                     check=True, capture_output=True, text=True).stdout.split()
                c = float(got[0])
                line += f"; GGML's mul_mat ({Path(a.ggml_build).parent.name}) {flops / c / 1e9:6.2f} GFLOP/s: ggtool/GGML {c / ours:.2f}"
            print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    q = sub.add_parser("quantize")
    q.add_argument("model")
    q.add_argument("imatrix")
    q.add_argument("--llama-quantize", required=True)
    q.add_argument("--threads", type=int, default=2)
    q.add_argument("--runs", type=int, default=3)
    q.add_argument("--types", nargs="+", default=list(TYPES))
    d = sub.add_parser("dot")
    d.add_argument("--rows", type=int, default=2048)
    d.add_argument("--cols", type=int, default=2048)
    d.add_argument("--runs", type=int, default=5)
    d.add_argument("--types", nargs="+", default=["iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s",
                                                  "iq4_nl", "iq4_xs", "tq1_0", "tq2_0", "mxfp4"])
    d.add_argument("--ggml", help="the ggml source folder (vendor/llama.cpp/ggml): its headers")
    d.add_argument("--ggml-build", help="a llama.cpp build's bin folder (libggml*.so): GGML's mul_mat timed beside")
    a = ap.parse_args()
    quantize_bench(a) if a.what == "quantize" else dot_bench(a)


if __name__ == "__main__":
    main()
