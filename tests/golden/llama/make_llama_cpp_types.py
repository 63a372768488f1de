"""Make llama-cpp-types.npz: llama.cpp's own mul_mat for every weight type ggtool computes, and its
silu and swiglu, from both x86 builds (the AVX-512 native one and the AVX2 one), for
tests/test_kernels_x86.py's test of `--numerics llama.cpp-avx512` / `-avx2`, bit for bit.

    PY=/work/bench-env/venv/bin/python
    python make_llama_cpp_types.py $PY /work/bench-env/build-native/bin /work/bench-env/build-avx2/bin OUT.npz

Run with ggtool's python (it quantizes the weights: any bytes of the type would do, these are
GGML's); llama.cpp runs through llama_cpp_ops.py here, one subprocess per build, in the bench python
(numpy only), on one thread. The weights of the types each build's CPU_REPACK buffer takes (Q4_0,
Q4_K, IQ4_NL, and Q2_K on AVX-512) go into that buffer where their rows come in eights, as
llama.cpp's model loader puts them. See README.md here for the keys.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

TYPES = ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl",
         "q2_K", "q3_K", "q4_K", "q5_K", "q6_K")
REPACKED = {"avx512": ("q4_0", "q4_K", "iq4_nl", "q2_K"), "avx2": ("q4_0", "q4_K", "iq4_nl")}
ROWS = (1, 2, 5, 9)          # vec_dot; sgemm / gemm; gemm groups + gemv rows; the tiled K-quant kernel
K_BLOCK = 256                # every type's rows
K_FLOAT = (172, 8)           # F32/F16/BF16 rows tinyBLAS refuses (stories260K's ffn_down, a head of 8)
N_ROWS = (16, 12)            # weight rows: in eights (repacked where the build repacks), and not
UNARY_K = (172, 64, 37)      # silu / swiglu rows: a tail in both builds, none, a tail in AVX-512's only


def cases() -> list[dict]:
    from ggtool import quant
    from ggtool import types as T

    rng = np.random.default_rng(31)
    xs = {(m, k): rng.standard_normal((m, k)).astype(np.float32) for k in (K_BLOCK, *K_FLOAT) for m in ROWS}
    out = []
    for name in TYPES:
        t = T.GGMLType[name.upper()] if name not in ("f32", "f16", "bf16") else {"f32": T.F32, "f16": T.F16,
                                                                               "bf16": T.BF16}[name]
        for k in (K_BLOCK, *(K_FLOAT if name in ("f32", "f16", "bf16") else ())):
            for n in N_ROWS:
                wf = rng.standard_normal((n, k)).astype(np.float32)
                w = wf.view(np.uint8) if t == T.F32 else quant.quantize(wf, t).reshape(n, -1).view(np.uint8)
                for m in ROWS:
                    out.append({"op": "mul_mat", "type": name, "t": int(t), "w": np.ascontiguousarray(w),
                                "x": xs[m, k], "m": m, "k": k})
    for k in UNARY_K:
        x = (rng.standard_normal((5, k)) * 4).astype(np.float32)
        x[0, :10] = [0, -0.0, 88, -88, 100, -100, 1e-30, -1e-30, 30, -30]
        g = rng.standard_normal((5, k)).astype(np.float32)
        out.append({"op": "silu", "x": x})
        out.append({"op": "swiglu", "x": x, "g": g})
    return out


def main(bench_py: str, native: str, avx2: str, dst: str) -> None:
    here = Path(__file__).resolve().parent
    cs = cases()
    res = {}
    for i, c in enumerate(cs):
        res[f"op_{i}"] = np.array(c["op"])
        if c["op"] == "mul_mat":         # the activations are shared: x_{m}_{k}; case_{i}: "type k n m"
            n = c["w"].shape[0]          # the weights are shared too: w_{type}_{k}_{n}
            res[f"case_{i}"] = np.array(f"{c['type']} {c['k']} {n} {c['m']}")
            res[f"w_{c['type']}_{c['k']}_{n}"] = c["w"]
            res[f"x_{c['m']}_{c['k']}"] = c["x"]
        else:
            res[f"x_{i}"] = c["x"]
            if c["op"] == "swiglu":
                res[f"g_{i}"] = c["g"]
    with tempfile.TemporaryDirectory() as tmp:
        for build, lib in (("avx512", native), ("avx2", avx2)):
            inp = {}
            for i, c in enumerate(cs):
                inp[f"x_{i}"] = c["x"]
                if c["op"] == "mul_mat":
                    inp[f"w_{i}"], inp[f"t_{i}"] = c["w"], np.int32(c["t"])
                    inp[f"repack_{i}"] = np.int32(c["type"] in REPACKED[build] and c["w"].shape[0] % 8 == 0)
                else:
                    inp[f"op_{i}"] = np.array(c["op"])
                    if "g" in c:
                        inp[f"g_{i}"] = c["g"]
            np.savez(os.path.join(tmp, "in.npz"), **inp)
            subprocess.run([bench_py, "-I", str(here / "llama_cpp_ops.py"), lib, os.path.join(tmp, "in.npz"),
                            os.path.join(tmp, "out.npz")], check=True, cwd=tmp)
            with np.load(os.path.join(tmp, "out.npz")) as z:
                for i in range(len(cs)):
                    res[f"y_{build}_{i}"] = z[f"y_{i}"]
    np.savez_compressed(dst, **res)


if __name__ == "__main__":
    main(*sys.argv[1:5])
