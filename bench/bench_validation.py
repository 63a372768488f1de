"""What checking every output costs: the share of a whole-model quantization spent in
`validate_piece` (ggml_validate_row_data on every converted piece and every copied tensor).

The validation is timed inside the run it belongs to (the writing loop's one call, wrapped), so the
share does not depend on the load of a shared machine as a before/after pair of runs does. The
model is an F16 GGUF (gemma-3-270m's: `ggtool quantize gemma-3-270m-q4_k_m.gguf gemma-f16.gguf
--type f16 --allow-requantize`); F16 -> F16 copies every tensor, the case where checking costs most
(each byte is read, where copy_file_range alone would read none in user space).

    python bench/bench_validation.py gemma-f16.gguf [--types Q4_K_M Q8_0 IQ4_NL F16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import ggtool.quantize_model.write as W
from ggtool import quantize_model as QM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--types", nargs="+", default=["Q4_K_M", "Q8_0", "IQ4_NL", "F16"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    spent = [0.0]
    validate = W.validate_piece

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return validate(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t0

    W.validate_piece = timed
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "q.gguf")
        print(f"{'type':8s} {'total s':>8s} {'checking s':>10s} {'share':>6s}   (median of {args.repeat}, "
              f"{args.threads} thread(s))")
        for ftype in args.types:
            totals, checks = [], []
            for _ in range(args.repeat):
                spent[0] = 0.0
                t0 = time.perf_counter()
                QM.quantize_file(args.model, out, QM.QuantizeOptions(type=ftype, threads=args.threads), force=True)
                totals.append(time.perf_counter() - t0)
                checks.append(spent[0])
            total, check = statistics.median(totals), statistics.median(checks)
            print(f"{ftype:8s} {total:8.2f} {check:10.3f} {100 * check / total:5.1f}%")


if __name__ == "__main__":
    main()
