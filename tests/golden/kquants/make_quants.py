"""Make quants.npz: the bytes ggml_quantize_chunk's per-type functions (quantize_q4_1, quantize_q5_0,
quantize_q5_1, quantize_iq4_nl, and with quant_weights every type whose bytes an importance matrix
changes) write, from the llama.cpp that llama-cpp-python 0.3.36 vendors.

    python tests/golden/kquants/make_quants.py GGML_DIR            # write quants.npz
    python tests/golden/kquants/make_quants.py GGML_DIR --check N [--types q4_1 ...]  # compare ggtool on N random blocks a type

GGML_DIR is that llama.cpp's ggml folder (vendor/llama.cpp/ggml of the sdist). src/ggml-quants.c
is compiled as make_kquants.py compiles ggml's (gcc -O2 -DNDEBUG, x86-64 baseline: no FMA, as
llama.cpp builds ggml-base) with stubs for the ggml symbols it references (ggml_row_size is real for
the types called), and called through ctypes with nrow rows of n_per_row values. numpy only makes
the inputs: the blocks of kquants.npz (rows of 256), extra 32-value edge blocks (ties, +-0,
subnormal and huge scales), and importance matrices (random positive; a quarter of them zero).
--check prints, per type and path, how many of N random blocks (rows of 256 and of 4096, random
scales per row, a fifth of them from fp32 subnormals to 3e38, random weights) differ from ggtool's bytes; nothing is written.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
STUBS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "abort %s:%d\n", file, line); abort(); }
void ggml_log_internal(int level, const char * fmt, ...) {}
const char * ggml_type_name(int t) { return "?"; }
static const int BLK[40] = {[2]=32,[3]=32,[6]=32,[7]=32,[8]=32,[10]=256,[11]=256,[12]=256,[13]=256,[14]=256,[20]=32};
static const int BYT[40] = {[2]=18,[3]=20,[6]=22,[7]=24,[8]=34,[10]=84,[11]=110,[12]=144,[13]=176,[14]=210,[20]=18};
size_t ggml_type_size(int t) { if (!BYT[t]) abort(); return BYT[t]; }
size_t ggml_row_size(int t, int64_t n) { if (!BYT[t]) abort(); return BYT[t] * (n / BLK[t]); }
"""
# type -> (values per block, bytes per block)
TYPES = {"q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "iq4_nl": (32, 18),
         "q2_K": (256, 84), "q3_K": (256, 110), "q4_K": (256, 144), "q5_K": (256, 176), "q6_K": (256, 210)}
UNWEIGHTED = ("q4_1", "q5_0", "q5_1", "iq4_nl")       # the new reference paths (the others: kquants.npz, q4_0.npz)


def build(ggml_dir: str, tmp: Path) -> ctypes.CDLL:
    g = Path(ggml_dir)
    (tmp / "stubs.c").write_text(STUBS)
    so = tmp / "libggmlq.so"
    subprocess.run(["gcc", "-O2", "-DNDEBUG", "-shared", "-fPIC", "-I", g / "src", "-I", g / "include",
                    "-I", g / "src/ggml-cpu", g / "src/ggml-quants.c", tmp / "stubs.c", "-o", so, "-lm"], check=True)
    return ctypes.CDLL(str(so))


def reference(lib: ctypes.CDLL, x: np.ndarray, t: str, qw: np.ndarray | None = None) -> np.ndarray:
    """quantize_<t>(x, dst, nrow, n_per_row, qw) over x's rows: uint8 (nrow, row bytes)."""
    x = np.ascontiguousarray(x, np.float32)
    qk, nb = TYPES[t]
    out = np.zeros((x.shape[0], x.shape[1] // qk * nb), np.uint8)
    fn = getattr(lib, f"quantize_{t}")
    fn.restype = ctypes.c_size_t
    w = None if qw is None else np.ascontiguousarray(qw, np.float32)
    fn(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(x.shape[0]),
       ctypes.c_int64(x.shape[1]), None if w is None else w.ctypes.data_as(ctypes.c_void_p))
    return out


def edge_rows(rng) -> np.ndarray:
    """Rows of 256 made of 32-value edge blocks."""
    b = []
    t = np.zeros(32)
    t[[3, 9]] = (2.0, -2.0)                           # a tie of magnitudes: the first wins
    b.append(t)
    b.append(-t)
    b.append(np.where(np.arange(32) % 2, 1.0, -1.0))  # all magnitudes tie
    b.append(np.full(32, 3.0))                        # max == min
    b.append(np.full(32, -0.0))
    b.append(np.where(rng.random(32) < 0.5, -0.0, 0.0))
    b.append(rng.standard_normal(32) * 1e-40)         # subnormal: 1/d overflows
    b.append(rng.standard_normal(32) * 1e-38)
    b.append(rng.standard_normal(32) * 1e-8)          # fp16-subnormal d
    b.append(np.clip(rng.standard_normal(32), -1, 1) * 3e38)   # max - min overflows
    b.append(np.linspace(-1, 1, 32))                  # values on rounding midpoints
    b.append(np.arange(32) / 31.0 * 15)
    b.append(rng.integers(-16, 16, 32).astype(float))
    b.append(rng.uniform(0.5, 2.0, 32))
    b.append(rng.uniform(-2.0, -0.5, 32))
    s = rng.standard_normal(32) * 1e-3
    s[7] = 50.0
    b.append(s)
    return np.asarray(b, np.float32).reshape(-1, 256)


def weights(rng, n: int) -> np.ndarray:
    """Two importance matrices for rows of n: random positive (10^U(-3, 3)), and the same with a quarter zero."""
    pos = (10.0 ** rng.uniform(-3, 3, n)).astype(np.float32)
    zer = pos.copy()
    zer[rng.random(n) < 0.25] = 0
    return np.stack([pos, zer])


def make(ggml_dir: str) -> None:
    k = np.load(HERE / "kquants.npz")
    rng = np.random.default_rng(2211)
    x = np.concatenate([k["x"], edge_rows(rng)]).astype(np.float32)
    cats = np.concatenate([k["category"], np.array(["edge_32"] * (len(x) - len(k["x"])))])
    wide = (rng.standard_normal((3, 1024)) * rng.uniform(0.01, 10, (3, 1))).astype(np.float32)
    w = weights(rng, 256)
    ww = weights(rng, 1024)
    out = {}
    with tempfile.TemporaryDirectory() as d:
        lib = build(ggml_dir, Path(d))
        for t in UNWEIGHTED:
            out[t] = reference(lib, x, t)
        for t in TYPES:
            out[f"{t}_w"] = np.stack([reference(lib, x, t, wi) for wi in w])
            out[f"{t}_wide"] = np.stack([reference(lib, wide, t, wi) for wi in ww])
    np.savez_compressed(HERE / "quants.npz", x=x, category=cats, imatrix=w, wide=wide, imatrix_wide=ww, **out)
    print(json.dumps({"rows": len(x), "bytes": os.path.getsize(HERE / "quants.npz")}))


def check(ggml_dir: str, n: int, types: list[str]) -> None:
    sys.path.insert(0, str(HERE.parent.parent.parent))
    from ggtool import quant as Q

    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    with tempfile.TemporaryDirectory() as d, Q.threads_set_to(1):
        lib = build(ggml_dir, Path(d))
        for t in types:
            qk = TYPES[t][0]
            for width in (256, 4096):
                rows = max(1, n * qk // width)
                scale = 10.0 ** np.where(rng.random((rows, 1)) < 0.8, rng.uniform(-4, 4, (rows, 1)),
                                         rng.uniform(-44, 38, (rows, 1)))      # a fifth at extreme scales
                x = np.clip(rng.standard_normal((rows, width)) * scale, -3e38, 3e38).astype(np.float32)
                x[rng.random(x.shape) < 0.02] = 0
                qw = weights(rng, width)[rng.integers(2)]
                paths = [("ref", None), ("imatrix", qw)] if t != "q4_0" else [("imatrix", qw)]
                for path, wi in paths:
                    want = reference(lib, x, t, wi).reshape(-1, TYPES[t][1])
                    got = Q.quantize(x, t, imatrix=wi).reshape(-1, TYPES[t][1])
                    bad = int((want != got).any(axis=1).sum())
                    print(f"{t:7} {path:8} rows of {width:5}: {len(want):7} blocks, {bad} differ", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ggml")
    ap.add_argument("--check", type=int, default=0)
    ap.add_argument("--types", nargs="+", default=list(TYPES))
    a = ap.parse_args()
    if a.check:
        check(a.ggml, a.check, a.types)
    else:
        make(a.ggml)


if __name__ == "__main__":
    main()
