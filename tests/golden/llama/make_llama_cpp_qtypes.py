"""Make llama-cpp-qtypes.npz: llama.cpp's own mul_mat for the types of ggtool.qtypes' records (IQ1_S ..
IQ4_XS, TQ1_0, TQ2_0, MXFP4; IQ4_NL is in llama-cpp-types.npz), from the AVX2 build, for
tests/test_qtypes_x86.py's test of `--numerics llama.cpp-avx2`, bit for bit.

    PY=/work/bench-env/venv/bin/python
    python make_llama_cpp_qtypes.py $PY /work/bench-env/build-native/bin OUT.npz

Run with ggtool's python (it quantizes the weights with the records' quantizers, GGML's bytes) on a
host whose native build is llama.cpp's AVX2 one (no AVX-512: `grep avx512 /proc/cpuinfo` is empty);
llama.cpp runs through llama_cpp_ops.py in the bench python (numpy only), on one thread. MXFP4's rows
in eights go into the CPU_REPACK buffer (mxfp4_8x8), as llama.cpp's loader puts 2-D weights there.
Keys: as llama-cpp-types.npz's (README.md here), with y_avx2_{i} only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

TYPES = ("iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq3_s", "iq2_s", "iq4_xs", "iq1_m", "tq1_0", "tq2_0", "mxfp4")
REPACKED = ("mxfp4",)
ROWS = (1, 2, 5, 9)          # vec_dot; vec_dot per row; vec_dot per row; the tiled kernel (from 8)
K = 512                      # two 256-value blocks a row
N_ROWS = (16, 12)            # weight rows: in eights (repacked where the build repacks), and not


def cases() -> list[dict]:
    from ggtool import qtypes
    from ggtool import types as T

    rng = np.random.default_rng(37)
    xs = {m: rng.standard_normal((m, K)).astype(np.float32) for m in ROWS}
    xs[9][3, 5] = 0.0                     # a zero activation row block partly, and a large one
    xs[9][4] *= 1e3
    out = []
    for name in TYPES:
        rec = qtypes.get(name)
        for n in N_ROWS:
            wf = (rng.standard_normal((n, K)) * rng.uniform(0.01, 3, (n, 1))).astype(np.float32)
            qw = (10.0 ** rng.uniform(-1, 1, K)).astype(np.float32)
            w = rec.quantize(wf, qw)
            for m in ROWS:
                out.append({"type": name, "t": int(T.parse_type(name)), "w": np.ascontiguousarray(w), "x": xs[m],
                            "m": m, "k": K})
    return out


def main(bench_py: str, lib: str, dst: str) -> None:
    here = Path(__file__).resolve().parent
    cs = cases()
    res = {}
    inp = {}
    for i, c in enumerate(cs):
        n = c["w"].shape[0]
        res[f"op_{i}"] = np.array("mul_mat")
        res[f"case_{i}"] = np.array(f"{c['type']} {c['k']} {n} {c['m']}")
        res[f"w_{c['type']}_{c['k']}_{n}"] = c["w"]
        res[f"x_{c['m']}_{c['k']}"] = c["x"]
        inp[f"x_{i}"], inp[f"w_{i}"], inp[f"t_{i}"] = c["x"], c["w"], np.int32(c["t"])
        inp[f"repack_{i}"] = np.int32(c["type"] in REPACKED and n % 8 == 0)
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(os.path.join(tmp, "in.npz"), **inp)
        subprocess.run([bench_py, "-I", str(here / "llama_cpp_ops.py"), lib, os.path.join(tmp, "in.npz"),
                        os.path.join(tmp, "out.npz")], check=True, cwd=tmp)
        with np.load(os.path.join(tmp, "out.npz")) as z:
            for i in range(len(cs)):
                res[f"y_avx2_{i}"] = z[f"y_{i}"]
    np.savez_compressed(dst, **res)


if __name__ == "__main__":
    main(*sys.argv[1:4])
