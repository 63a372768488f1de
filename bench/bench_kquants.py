"""Issue 22 figures: K-quant quantizer throughput, 1 thread, against GGML's reference quantizers
(quantize_row_qN_K_ref) measured in the same run.

    python bench/bench_kquants.py GGML_GIT_DIR [--commit C] [--mb 4] [--runs 7] [--types q4_K q6_K]

GGML_GIT_DIR is a clone of github.com/ggml-org/ggml: its ggml-quants.c is compiled as
tests/golden/kquants/make_kquants.py does (gcc -O2 -DNDEBUG, the reference build of the golden
bytes) and called through ctypes on the same float32 array. ggtool is timed twice: its compiled
kernel alone over the whole array (kernel), and `ggtool.quant.quantize` on one thread (api: the
block driver, chunks and the NaN/inf check included). MB/s is float32 input per second (median of
--runs, timed in interleaved rounds after a warm-up round); the ratio is ggtool's MB/s over GGML's. The bytes are compared too.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TYPES = ("q2_K", "q3_K", "q4_K", "q5_K", "q6_K")


def load_maker(name: str = "make_kquants"):
    """tests/golden/kquants/NAME.py as a module: it compiles GGML's C, the reference timed here."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "golden" / "kquants" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def interleaved_calls(fns, runs: int) -> list[float]:
    """Median seconds of each of fns, timed in rounds (one call of each per round, after a warm-up
    round), so that a change in the machine's load hits all alike."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ggml")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--mb", type=float, default=4.0, help="MiB of float32 input")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--types", nargs="+", default=list(TYPES))
    args = ap.parse_args()

    from ggtool import kquants
    from ggtool import quant as Q

    make = load_maker()
    nblocks = int(args.mb * 2**20 / 1024)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((nblocks, 256)) * rng.uniform(0.01, 1, (nblocks, 1))).astype(np.float32)
    mb = x.nbytes / 1e6
    with tempfile.TemporaryDirectory() as d:
        lib, sha = make.build(args.ggml, args.commit, Path(d))
        print(f"ggml {sha[:12]} (gcc -O2 -DNDEBUG), {nblocks} blocks ({mb:.1f} MB f32), 1 thread, median of {args.runs}")
        print(f"{'type':6} {'GGML MB/s':>10} {'kernel MB/s':>12} {'ratio':>6} {'api MB/s':>9} {'ratio':>6}  bytes")
        for t in args.types:
            k = kquants.kernel(t)
            out = np.empty((nblocks, kquants.BLOCKS[t][0]), np.uint8)
            with Q.threads_set_to(1):
                t_ref, t_ker, t_api = interleaved_calls([lambda: make.reference(lib, x, t), lambda: k(x, out),
                                                    lambda: Q.quantize(x, t)], args.runs)
                same = np.array_equal(Q.quantize(x, t), make.reference(lib, x, t))
            print(f"{t:6} {mb / t_ref:10.1f} {mb / t_ker:12.1f} {t_ref / t_ker:6.2f} {mb / t_api:9.1f} "
                  f"{t_ref / t_api:6.2f}  {'identical' if same else 'DIFFER'}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
