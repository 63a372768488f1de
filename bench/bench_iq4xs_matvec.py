"""Issue 31 figure: IQ4_XS mat-vec GFLOP/s of ggtool.qtypes (packed weights, one thread) against GGML's
own CPU dot (libggml-cpu of llama.cpp's builds), measured in the same run.

    python bench/bench_iq4xs_matvec.py BUILD_BIN [BUILD_BIN ...] [--sizes 1024 4096] [--rounds 5]

BUILD_BIN is a folder with llama.cpp's libggml-cpu.so and libggml-base.so (the bench environment's
build-native/bin, AVX-512, and build-avx2/bin); the ggml headers are taken from the vendored
sources next to them (or --include). For each, a small C program is compiled against it that
quantizes a random N x N matrix to IQ4_XS (ggml_quantize_chunk), one random activation row to Q8_K
with the CPU's own from_float, and times N calls of type_traits_cpu[IQ4_XS].vec_dot (what
ggml_compute_forward_mul_mat runs per row for a single token), best of 20 repetitions. ggtool: the
same shape, ``IQ4_XS.pack`` once, then ``IQ4_XS.mul_mat_packed`` (the activation's pairs
included), best of 20. Rounds alternate between the two; medians of --rounds are reported, with
ggtool's over GGML's. Both are one thread; the machine may be shared: the ratio is what counts.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
INCLUDE = Path("/work/bench-env/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml/include")
HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "ggml.h"
#include "ggml-cpu.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char ** argv) {
    const int type = GGML_TYPE_IQ4_XS;
    const long n = atol(argv[1]);
    const int reps = atoi(argv[2]);
    ggml_cpu_init();
    const struct ggml_type_traits_cpu * tr = ggml_get_type_traits_cpu(type);
    const struct ggml_type_traits_cpu * tv = ggml_get_type_traits_cpu(tr->vec_dot_type);
    float * x = malloc(sizeof(float) * n * n), * a = malloc(sizeof(float) * n), * out = malloc(sizeof(float) * n);
    srand(1);
    for (long i = 0; i < n * n; i++) x[i] = rand() / (float) RAND_MAX - 0.5f;
    for (long i = 0; i < n; i++) a[i] = rand() / (float) RAND_MAX - 0.5f;
    const size_t rs = ggml_row_size(type, n), as = ggml_row_size(tr->vec_dot_type, n);
    char * w = malloc(rs * n), * q = malloc(as);
    ggml_quantize_chunk(type, x, w, 0, n, n, NULL);
    tv->from_float(a, q, n);
    double best = 1e9;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (long i = 0; i < n; i++) tr->vec_dot(n, out + i, 0, w + i * rs, 0, q, 0, 1);
        double t = now() - t0;
        if (t < best) best = t;
    }
    printf("%.9f\n", best);
    return 0;
}
"""


def build(bin_dir: Path, include: Path, tmp: Path) -> Path:
    src = tmp / "mv.c"
    src.write_text(HARNESS)
    exe = tmp / f"mv-{bin_dir.parent.name}"
    subprocess.run(["gcc", "-O2", str(src), "-I", str(include), "-L", str(bin_dir), "-lggml-cpu", "-lggml-base",
                    f"-Wl,-rpath,{bin_dir}", "-o", str(exe)], check=True)
    return exe


def ggtool_best(n: int, reps: int, packed, act) -> float:
    from ggtool import qtypes

    rec = qtypes.get("iq4_xs")
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        rec.mul_mat_packed(packed, act)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bins", nargs="+", type=Path)
    ap.add_argument("--include", type=Path, default=INCLUDE)
    ap.add_argument("--sizes", nargs="+", type=int, default=[1024, 2048, 4096])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    from ggtool import qtypes
    from ggtool import quant as Q

    rec = qtypes.get("iq4_xs")
    rng = np.random.default_rng(1)
    print(f"IQ4_XS mat-vec, 1 thread, GFLOP/s = 2 N^2 / time, medians of {args.rounds} rounds (best of 20 each)")
    with tempfile.TemporaryDirectory() as d:
        exes = {b: build(b, args.include, Path(d)) for b in args.bins}
        for n in args.sizes:
            x = (rng.random((n, n), np.float32) - 0.5)
            w = rec.quantize(x)
            act = Q.quantize_q8_k(rng.random((1, n), np.float32) - 0.5)
            packed = rec.pack(w)
            ref = rec.mul_mat(w[:64], act)
            assert np.array_equal(rec.mul_mat_packed(rec.pack(w[:64]), act).view(np.uint32), ref.view(np.uint32))
            ggtool_best(n, 3, packed, act)                     # warm-up
            times = {b: [] for b in args.bins}
            mine = []
            for _ in range(args.rounds):
                for b, exe in exes.items():
                    out = subprocess.run([str(exe), str(n), "20"], capture_output=True, text=True, check=True)
                    times[b].append(float(out.stdout))
                mine.append(ggtool_best(n, 20, packed, act))
            flop = 2.0 * n * n
            g = statistics.median(mine)
            line = f"N={n:5}: ggtool {flop / g / 1e9:6.1f}"
            for b in args.bins:
                t = statistics.median(times[b])
                line += f"; GGML {b.parent.name} {flop / t / 1e9:6.1f} (ggtool/GGML {t / g:.2f}x)"
            print(line, flush=True)


if __name__ == "__main__":
    main()
