"""Issue 22 figures: quantizer throughput, 1 thread, of every block type llama-quantize writes besides
Q4_0/Q8_0, without and with an importance matrix, against llama.cpp's own (ggml_quantize_chunk's
quantize_<type>) measured in the same run, and gguf-py's where it has one.

    python bench/bench_quants.py GGML_DIR [--mb 4] [--runs 5] [--types q4_1 iq4_nl q4_K]

GGML_DIR is the ggml folder of llama.cpp's source (vendor/llama.cpp/ggml of the llama-cpp-python
0.3.36 sdist): its ggml-quants.c is compiled as tests/golden/kquants/make_quants.py does (gcc -O2
-DNDEBUG, x86-64 baseline, as llama.cpp builds ggml-base) and called through ctypes on the same
float32 rows of 4096 (and the same importances, random positive). ggtool is timed through
`ggtool.quant.quantize` on one thread (the block driver, chunks and the NaN/inf check included).
MB/s is float32 input per second (median of --runs, interleaved rounds after a warm-up round);
ratio is ggtool's MB/s over the C's (gguf-py's likewise). The bytes are compared too.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from bench_kquants import interleaved_calls, load_maker  # bench/ is the script's folder: on sys.path

ROOT = Path(__file__).resolve().parent.parent
TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ggml")
    ap.add_argument("--mb", type=float, default=4.0, help="MiB of float32 input")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--types", nargs="+", default=list(TYPES))
    args = ap.parse_args()

    import gguf

    from ggtool import quant as Q

    make = load_maker("make_quants")
    rows = max(1, int(args.mb * 2**20 / 4 / 4096))
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((rows, 4096)) * rng.uniform(0.01, 1, (rows, 1))).astype(np.float32)
    w = (10.0 ** rng.uniform(-2, 2, 4096)).astype(np.float32)
    mb = x.nbytes / 1e6
    with tempfile.TemporaryDirectory() as d:
        lib = make.build(args.ggml, Path(d))
        print(f"{rows} rows of 4096 ({mb:.1f} MB f32), 1 thread, median of {args.runs}; C: gcc -O2 -DNDEBUG")
        print(f"{'type':7} {'path':8} {'C MB/s':>8} {'ggtool':>8} {'ratio':>6} {'gguf-py':>8} {'ratio':>6}  bytes")
        for t in args.types:
            for path, qw in (("ref", None), ("imatrix", w)):
                if t == "q4_0" and qw is None:
                    continue                      # Q4_0's reference path: bench/bench_quant.py
                gt = gguf.GGMLQuantizationType[t.upper()]
                fns = [lambda t=t, qw=qw: make.reference(lib, x, t, qw), lambda t=t, qw=qw: Q.quantize(x, t, imatrix=qw)]
                has_gguf = qw is None and t in ("q4_1", "q5_0", "q5_1")
                if has_gguf:
                    fns.append(lambda gt=gt: gguf.quants.quantize(x, gt))
                with Q.threads_set_to(1):
                    ts = interleaved_calls(fns, args.runs)
                    same = np.array_equal(Q.quantize(x, t, imatrix=qw), make.reference(lib, x, t, qw))
                g = f"{mb / ts[2]:8.1f} {ts[2] / ts[1]:6.1f}" if has_gguf else f"{'-':>8} {'-':>6}"
                print(f"{t:7} {path:8} {mb / ts[0]:8.1f} {mb / ts[1]:8.1f} {ts[0] / ts[1]:6.2f} {g}  "
                      f"{'identical' if same else 'DIFFER'}")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
