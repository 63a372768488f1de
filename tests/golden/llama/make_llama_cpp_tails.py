"""Make llama-cpp-tails.npz: llama.cpp's own mul_mat of IQ4_NL and MXFP4 rows of an odd number of
blocks, where `ggml_vec_dot_iq4_nl_q8_0` / `_mxfp4_q8_0` add the last block alone
(``sumf += d * sumi``, after the block pairs) and GCC's tuning decides whether that is one FMA: the
generic AVX2 build fuses it, a native build for an AMD Zen CPU (``znver3`` tuning, which avoids chains
of FMAs: the AVX2 EPYC here and, with GCC 12.2, the AVX-512 one) does not. For tests/test_qtypes_x86.py's
test that `--numerics llama.cpp-avx2` is the first and `-avx512` the second, bit for bit.

    PY=/work/bench-env/venv/bin/python
    python make_llama_cpp_tails.py $PY AVX2_LIB ZEN_LIB OUT.npz

AVX2_LIB: libggml-base/-cpu of llama-cpp-python 0.3.36's vendored llama.cpp built with
``-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
-DGGML_AVX512=OFF``; ZEN_LIB: the same built natively on an AVX2 AMD EPYC (GCC 12.2: ``-march=znver3``).
`bench/check_x86_forms.py` shows that the float operations of these two functions in that build are
those of GCC 12.2's native build on an AVX-512 Zen 4 (the same optimized GIMPLE dataflow), which
this host cannot run. Run with ggtool's python (it quantizes the weights); llama.cpp runs through
llama_cpp_ops.py in the bench python, one process per build, one thread. Keys as
llama-cpp-qtypes.npz's, with `y_avx2_{i}` and `y_zen_{i}`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

K = 480                      # 15 blocks of 32: seven pairs and a last block alone
N = 44                       # weight rows not in eights: the vec_dot, never the repacked gemv/gemm
CASES = (("iq4_nl", 1), ("mxfp4", 1), ("mxfp4", 5))   # IQ4_NL: tinyBLAS_Q0 from 2 rows


def cases() -> list[dict]:
    from ggtool import qtypes
    from ggtool import types as T

    rng = np.random.default_rng(41)
    # every row's last block: activations and weights of one sign pattern and near their largest
    # magnitude, so that its integer sum is large (~40000); the activation's Q8_0 scale an fp16 whose
    # last bit is set, so that the sum's product with the scales is inexact
    sign = rng.choice((-1.0, 1.0), 32)
    xs = {}
    for m in sorted({m for _, m in CASES}):
        x = rng.standard_normal((m, K))
        d = (np.float16(rng.uniform(0.004, 0.03, m)).view(np.uint16) | 1).view(np.float16).astype(np.float64)
        mag = rng.uniform(0.8, 1, (m, 32))
        mag[:, 0] = 1.0                           # amax / 127 is d exactly
        x[:, -32:] = sign * mag * (127 * d)[:, None]
        xs[m] = x.astype(np.float32)
    ws = {}
    for name in sorted({t for t, _ in CASES}):
        wf = rng.standard_normal((N, K)) * rng.uniform(0.01, 3, (N, 1))
        wf[:, -32:] = sign * rng.uniform(0.5, 1, (N, 32)) * rng.uniform(8, 64, (N, 1))   # it dominates
        wf = wf.astype(np.float32)
        ws[name] = np.ascontiguousarray(qtypes.get(name).quantize(wf))
    return [{"type": t, "t": int(T.parse_type(t)), "w": ws[t], "x": xs[m], "m": m} for t, m in CASES]


def _run(bench_py: str, lib: str, inp: dict, tmp: str, tag: str) -> dict:
    src, dst = os.path.join(tmp, f"in-{tag}.npz"), os.path.join(tmp, f"out-{tag}.npz")
    np.savez(src, **inp)
    here = Path(__file__).resolve().parent
    subprocess.run([bench_py, "-I", str(here / "llama_cpp_ops.py"), lib, src, dst], check=True, cwd=tmp)
    with np.load(dst) as z:
        return {k: z[k] for k in z.files}


def main(bench_py: str, avx2_lib: str, zen_lib: str, dst: str) -> None:
    cs = cases()
    res, inp = {}, {}
    for i, c in enumerate(cs):
        res[f"op_{i}"] = np.array("mul_mat")
        res[f"case_{i}"] = np.array(f"{c['type']} {K} {N} {c['m']}")
        res[f"w_{c['type']}_{K}_{N}"] = c["w"]
        res[f"x_{c['m']}_{K}"] = c["x"]
        inp[f"x_{i}"], inp[f"w_{i}"], inp[f"t_{i}"], inp[f"repack_{i}"] = c["x"], c["w"], np.int32(c["t"]), np.int32(0)
    with tempfile.TemporaryDirectory() as tmp:
        for tag, lib in (("avx2", avx2_lib), ("zen", zen_lib)):
            y = _run(bench_py, lib, inp, tmp, tag)
            for i in range(len(cs)):
                res[f"y_{tag}_{i}"] = y[f"y_{i}"]
    for i, c in enumerate(cs):    # the case is only worth keeping where the two builds part
        assert (res[f"y_avx2_{i}"] != res[f"y_zen_{i}"]).any(), f"case {i} ({c['type']}): the builds agree"
    np.savez_compressed(dst, **res)


if __name__ == "__main__":
    main(*sys.argv[1:5])
