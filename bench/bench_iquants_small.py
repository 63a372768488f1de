"""Issue 31 figures for IQ1_S, IQ1_M, IQ4_XS, TQ1_0, TQ2_0 and MXFP4 (ggtool.qtypes): quantize wall
time against llama-quantize's at 2 threads on the same tensors, and the bytes against its file.

    python bench/bench_iquants_small.py LLAMA_BIN MODEL_F16 IMATRIX [--runs 3] [--types IQ1_S TQ2_0 ...]

LLAMA_BIN holds llama-quantize (the bench environment's build-native/bin); MODEL_F16 is
gemma-3-270m as F16 (`ggtool quantize --type f16 --allow-requantize gemma-3-270m-q4_k_m.gguf
MODEL_F16`); IMATRIX is llama-imatrix's GGUF for it (used for IQ1_S and IQ1_M, and for IQ4_XS as a
second row).

Per file type, interleaved rounds after a warm-up round, medians of --runs:

* llama-quantize ``--pure --token-embedding-type f16 [--imatrix F] MODEL out TYPE 2`` with
  ``--tensor-type NAME=f16`` for every tensor that does not get the type (rows of 640 do not divide
  into 256-value blocks: llama.cpp would fall back to another type), so that only the type's
  tensors are quantized (A); and the same with every tensor kept F16 (B: copied). llama's time for
  the type's tensors is A - B (loading and writing cancel out).
* ggtool: the same tensors read from MODEL (F16 -> float32, as llama-quantize converts them) and
  quantized by the type's record (``ggtool.qtypes``) on 2 of ggtool.quant's threads.

The bytes of every one of those tensors are compared with A's output file. The machine may be
shared: ratios within one run are what count.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# file type -> (ggml type name, importance matrix paths to run)
FTYPES = {"IQ1_S": ("iq1_s", ("imatrix",)), "IQ1_M": ("iq1_m", ("imatrix",)), "IQ4_XS": ("iq4_xs", ("none", "imatrix")),
          "TQ1_0": ("tq1_0", ("none",)), "TQ2_0": ("tq2_0", ("none",)), "MXFP4_MOE": ("mxfp4", ("none",))}
LINE = re.compile(r"\]\s+(\S+)\s+- \[.*converting to (\S+) \.\.")


def llama(bin_dir: Path, model: Path, out: Path, ftype: str, imatrix: Path | None, keep: list[str]) -> tuple[float, str]:
    cmd = [str(bin_dir / "llama-quantize"), "--pure", "--token-embedding-type", "f16"]
    if imatrix is not None:
        cmd += ["--imatrix", str(imatrix)]
    for name in keep:
        cmd += ["--tensor-type", f"^{re.escape(name)}$=f16"]
    cmd += [str(model), str(out), ftype, "2"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    return wall, p.stdout + p.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bin", type=Path)
    ap.add_argument("model", type=Path)
    ap.add_argument("imatrix", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--types", nargs="+", default=list(FTYPES))
    args = ap.parse_args()

    from gguf import GGUFReader

    from ggtool import qtypes
    from ggtool import quant as Q
    from ggtool.imatrix import read_imatrix
    from ggtool.quant.threads import _run_chunks

    Q.set_threads(2)
    src = GGUFReader(str(args.model))
    by_name = {t.name: t for t in src.tensors}
    imat = read_imatrix(args.imatrix)
    print(f"llama-quantize vs ggtool.qtypes, 2 threads, median of {args.runs} (A - B: see the docstring)")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out.gguf"
        for ftype in args.types:
            tname, paths = FTYPES[ftype]
            rec = qtypes.get(tname)
            for path in paths:
                im = args.imatrix if path == "imatrix" else None
                _, log = llama(args.bin, args.model, out, ftype, im, [])
                found = LINE.findall(log)
                names = [n for n, t in found if t == tname]
                others = [n for n, t in found if t != tname]

                def run_ggtool():
                    t0 = time.perf_counter()
                    res = {}
                    for n in names:
                        x = np.asarray(by_name[n].data).astype(np.float32)
                        w = imat.weights_for(n, tuple(int(v) for v in by_name[n].shape)) if im is not None else None
                        res[n] = rec.quantize(x, w, name=n, run=_run_chunks)
                    return time.perf_counter() - t0, res

                run_ggtool()                                   # warm-up: kernels compiled, tables built
                la, lb, gg = [], [], []
                for _ in range(args.runs):
                    la.append(llama(args.bin, args.model, out, ftype, im, others)[0])
                    lb.append(llama(args.bin, args.model, Path(d) / "b.gguf", ftype, im, names + others)[0])
                    g, res = run_ggtool()
                    gg.append(g)
                got = {t.name: np.asarray(t.data) for t in GGUFReader(str(out)).tensors if t.name in res}
                same = sum(np.array_equal(got[n].reshape(-1).view(np.uint8), res[n].reshape(-1)) for n in names)
                a, b, g = statistics.median(la), statistics.median(lb), statistics.median(gg)
                values = sum(int(np.prod(by_name[n].shape)) for n in names)
                print(f"{ftype:9} {path:7} {len(names):3} tensors ({values / 1e6:.1f} M values): llama A {a:6.2f} s, "
                      f"B {b:6.2f} s, A-B {a - b:6.2f} s; ggtool {g:6.2f} s; ratio ggtool/(A-B) {g / max(a - b, 1e-9):.2f}; "
                      f"bytes equal to llama-quantize's in {same}/{len(names)} tensors", flush=True)


if __name__ == "__main__":
    main()
