"""Make iquants_small.npz: the bytes llama.cpp's quantizers write for IQ1_S, IQ1_M, IQ4_XS, TQ1_0, TQ2_0
and MXFP4 (ggml_quantize_chunk's quantize_<type>, with and without quant_weights where the type
takes them), the values its dequantize_row_<type> gives back, and its generic dot products
(ggml-cpu/quants.c ``ggml_vec_dot_<type>_<vec_dot_type>_generic``), from the llama.cpp that
llama-cpp-python 0.3.36 vendors.

    python tests/golden/iquants/make_iquants_small.py GGML_DIR             # write iquants_small.npz
    python tests/golden/iquants/make_iquants_small.py GGML_DIR --check N   # compare ggtool on N random blocks a type and path

GGML_DIR is that llama.cpp's ggml folder (vendor/llama.cpp/ggml of the sdist). src/ggml-quants.c
and src/ggml-cpu/quants.c (the generic dots) are compiled with ``gcc -O2 -DNDEBUG`` (x86-64
baseline: no FMA, as llama.cpp builds ggml-base) with stubs for the few ggml symbols they reference
(ggml_row_size for these types; the CPU's fp16 table, filled from numpy's exact conversion), and
called through ctypes with nrow rows of n_per_row values. IQ1_S/IQ1_M call iq2xs_init_impl first
(ggml_quantize_init's work: the grid's map and neighbours). numpy only makes the inputs.

--check prints, per type and path, how many of N random blocks (rows of 256 and of 4096, random
scales per row, a fifth of them from fp32 subnormals to 3e38, 2% zeros, random importances)
differ from ggtool's bytes, how many blocks ggtool refuses because llama.cpp's result there is
undefined (IQ1's grid search overflowing: see ggtool/qtypes/iq1.py) and on how many of those
llama.cpp aborts (each refused row is run alone), and on how many others llama.cpp aborts (none
should); nothing is written. Each batch of C runs in a forked child, so that a GGML_ASSERT abort
is reported, not fatal.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from ggml_c import TABLE_ACCESS, compile_ggml, grid_tables, weights

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
STUBS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "abort %s:%d\n", file, line); abort(); }
void ggml_log_internal(int level, const char * fmt, ...) {}
const char * ggml_type_name(int t) { return "?"; }
static const int BLK[40] = {[8]=32,[15]=256,[19]=256,[23]=256,[29]=256,[34]=256,[35]=256,[39]=32};
static const int BYT[40] = {[8]=34,[15]=292,[19]=50,[23]=136,[29]=56,[34]=54,[35]=66,[39]=17};
size_t ggml_type_size(int t) { if (!BYT[t]) abort(); return BYT[t]; }
size_t ggml_row_size(int t, int64_t n) { if (!BYT[t]) abort(); return BYT[t] * (n / BLK[t]); }
float ggml_table_f32_f16[1 << 16];
"""
# ggml name -> (type id, values per block, bytes per block, paths: "ref" = quant_weights NULL, "imatrix")
TYPES = {
    "iq1_s": (19, 256, 50, ("imatrix",)),          # GGML asserts quant_weights
    "iq1_m": (29, 256, 56, ("ref", "imatrix")),
    "iq4_xs": (23, 256, 136, ("ref", "imatrix")),
    "tq1_0": (34, 256, 54, ("ref",)),              # quant_weights ignored
    "tq2_0": (35, 256, 66, ("ref",)),
    "mxfp4": (39, 32, 17, ("ref",)),
}
VEC_DOT = {"iq1_s": "q8_K", "iq1_m": "q8_K", "iq4_xs": "q8_K", "tq1_0": "q8_K", "tq2_0": "q8_K", "mxfp4": "q8_0"}
ACT = {"q8_K": (256, 292), "q8_0": (32, 34)}


def build(ggml_dir: str, tmp: Path) -> ctypes.CDLL:
    lib = compile_ggml(ggml_dir, tmp, STUBS, TABLE_ACCESS)
    iq1_tables(lib)                                # iq2xs_init_impl: IQ1_S and IQ1_M share one grid entry
    return lib


def iq1_tables(lib) -> tuple[np.ndarray, np.ndarray]:
    """GGML's (map, neighbours) of IQ1's grid (iq2xs_init_impl(GGML_TYPE_IQ1_S))."""
    _, m, n = grid_tables(lib, "iq2", 19, 2048, 8, 43692)
    return m, n


def _p(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def reference(lib: ctypes.CDLL, x: np.ndarray, t: str, qw: np.ndarray | None = None) -> np.ndarray:
    """quantize_<t>(x, dst, nrow, n_per_row, qw) over x's rows: uint8 (nrow, row bytes)."""
    x = np.ascontiguousarray(x, np.float32)
    _, qk, nb, _ = TYPES[t]
    out = np.zeros((x.shape[0], x.shape[1] // qk * nb), np.uint8)
    fn = getattr(lib, f"quantize_{t}")
    fn.restype = ctypes.c_size_t
    w = None if qw is None else np.ascontiguousarray(qw, np.float32)
    fn(_p(x), _p(out), ctypes.c_int64(x.shape[0]), ctypes.c_int64(x.shape[1]), None if w is None else _p(w))
    return out


def reference_forked(lib, x, t, qw=None):
    """reference() in a forked child: (bytes, None), or (None, how the child ended)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: compute, send, leave without cleanup
        os.close(r)
        try:
            data = pickle.dumps(reference(lib, x, t, qw))
            with os.fdopen(w, "wb") as f:
                f.write(data)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) or not data:
        return None, f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else "no output"
    return pickle.loads(data), None


def reference_rows(lib, x, t, qw=None) -> tuple[np.ndarray, np.ndarray]:
    """reference() of x's rows (forked), and which rows GGML aborts on (their bytes left zero)."""
    b, _ = reference_forked(lib, x, t, qw)
    if b is not None:
        return b, np.zeros(len(x), bool)
    _, qk, nb, _ = TYPES[t]
    out = np.zeros((x.shape[0], x.shape[1] // qk * nb), np.uint8)
    aborts = np.zeros(len(x), bool)
    for i in range(len(x)):
        bi, _ = reference_forked(lib, x[i:i + 1], t, qw)
        if bi is None:
            aborts[i] = True
        else:
            out[i] = bi[0]
    return out, aborts


def abort_rows(lib, rng, count: int = 2) -> np.ndarray:
    """Rows of 256 that IQ1_M's quantizer aborts on without quant_weights (GGML_ASSERT(scale >= 0):
    a NaN scale from overflowing sums), found among random rows at extreme scales (ggtool screens
    them: it refuses exactly these)."""
    sys.path.insert(0, str(ROOT))
    from ggtool import qtypes

    rec = qtypes.get("iq1_m")
    found = []
    while len(found) < count:
        scale = 10.0 ** rng.uniform(20, 38, (2000, 1))
        x = np.clip(rng.standard_normal((2000, 256)) * scale, -3e38, 3e38).astype(np.float32)
        x[rng.random(x.shape) < 0.02] = 0
        _, und = ggtool_rows(rec, x, None)
        for i in np.nonzero(und)[0]:
            if reference_forked(lib, x[i:i + 1], "iq1_m")[0] is None and len(found) < count:
                found.append(x[i])
    return np.asarray(found, np.float32)


def dequantize(lib, raw: np.ndarray, t: str) -> np.ndarray:
    _, qk, nb, _ = TYPES[t]
    raw = np.ascontiguousarray(raw)
    out = np.zeros((raw.shape[0], raw.shape[1] // nb * qk), np.float32)
    fn = getattr(lib, f"dequantize_row_{t}")
    for i in range(raw.shape[0]):
        fn(_p(raw[i]), _p(out[i]), ctypes.c_int64(out.shape[1]))
    return out


def activations(lib, a: np.ndarray, vt: str) -> np.ndarray:
    """quantize_row_<vt>_ref of float rows: the activation blocks a dot takes."""
    qk, nb = ACT[vt]
    a = np.ascontiguousarray(a, np.float32)
    out = np.zeros((a.shape[0], a.shape[1] // qk * nb), np.uint8)
    fn = getattr(lib, f"quantize_row_{vt}_ref")
    for i in range(a.shape[0]):
        fn(_p(a[i]), _p(out[i]), ctypes.c_int64(a.shape[1]))
    return out


def dots(lib, w: np.ndarray, act: np.ndarray, t: str) -> np.ndarray:
    """ggml_vec_dot_<t>_<vec_dot_type>_generic of w[i] . act[i]."""
    _, qk, nb, _ = TYPES[t]
    fn = getattr(lib, f"ggml_vec_dot_{t}_{VEC_DOT[t]}_generic")
    out = np.zeros(w.shape[0], np.float32)
    s = ctypes.c_float()
    w, act = np.ascontiguousarray(w), np.ascontiguousarray(act)
    for i in range(w.shape[0]):
        fn(ctypes.c_int(w.shape[1] // nb * qk), ctypes.byref(s), ctypes.c_size_t(0), _p(w[i]), ctypes.c_size_t(0),
           _p(act[i]), ctypes.c_size_t(0), ctypes.c_int(1))
        out[i] = s.value
    return out


# -- the inputs ------------------------------------------------------------------------------------------
def edge_rows(rng) -> tuple[np.ndarray, list[str]]:
    """Rows of 256: the corners of the quantizers."""
    rows, cats = [], []

    def add(cat, v):
        rows.append(np.asarray(v, np.float64).reshape(256))
        cats.append(cat)

    n = lambda s=1.0: rng.standard_normal(256) * s  # noqa: E731
    add("zeros", np.zeros(256))
    add("neg_zeros", np.full(256, -0.0))
    add("signed_zeros", np.where(rng.random(256) < 0.5, -0.0, 0.0))
    for s in (1e-40, 1e-38, 1e-30, 1e-13, 1e-11, 1e-8, 1e-6, 1e-5):
        add(f"tiny_{s:g}", n(s))
    for s in (1e6, 1e12, 1e15, 1e17, 1e19, 1e30):
        add(f"huge_{s:g}", n(s))
    add("huge_3e38", np.clip(n(), -1, 1) * 3e38)
    add("fp32_max", np.full(256, 3.4028234e38) * np.where(rng.random(256) < 0.5, -1, 1))
    s = n(1e-3)
    s[77] = 50.0
    add("outlier", s)
    s = n(1e-3)
    s[200] = -50.0
    add("outlier_neg", s)
    s = np.zeros(256)
    s[13] = 1.5
    add("single", s)
    s = np.zeros(256)
    s[250] = -7e-3
    add("single_neg", s)
    add("constant", np.full(256, 3.0))
    add("constant_neg", np.full(256, -1.0))
    add("alternating", np.where(np.arange(256) % 2, 1.0, -1.0))
    add("linspace", np.linspace(-1, 1, 256))
    add("ramp", np.arange(256) / 255.0 * 15)
    add("integers", rng.integers(-16, 16, 256).astype(float))
    add("uniform_pos", rng.uniform(0.5, 2.0, 256))
    add("uniform_neg", rng.uniform(-2.0, -0.5, 256))
    s = n()
    s[rng.permutation(8)[:4, None] * 32 + np.arange(32)] = 0
    add("half_zero_subblocks", s)
    add("subblock_scales", n() * np.repeat(10.0 ** rng.uniform(-4, 2, 8), 32))
    add("ternary", rng.integers(-1, 2, 256) * 0.7)
    add("ternary_half", (rng.integers(-1, 2, 256) + rng.choice([-0.5, 0.5], 256)) * 0.3)
    lv = np.array([0, 1, 2, 3, 4, 6, 8, 12]) / 2.0          # E2M1 levels and their midpoints
    mids = (lv[1:] + lv[:-1]) / 2
    add("fp4_levels", rng.choice(np.concatenate([lv, -lv]), 256) * 2.0 ** rng.integers(-3, 4))
    add("fp4_midpoints", rng.choice(np.concatenate([mids, -mids]), 256) * 4.0)
    add("powers_of_two", 2.0 ** rng.integers(-10, 10, 256) * rng.choice([-1, 1], 256))
    add("sparse", np.where(rng.random(256) < 0.05, n(), 0.0))
    add("heavy_tail", rng.standard_t(2, 256))
    for s in (1e-3, 0.01, 1.0, 100.0):
        for _ in range(12):
            add(f"normal_{s:g}", n(s))
    for _ in range(12):
        add("uniform", rng.uniform(-1, 1, 256))
        add("laplace", rng.laplace(0, 0.05, 256))
        add("mixed_scales", n() * 10.0 ** rng.uniform(-3, 1, 256))
        add("positive_skew", np.abs(n(0.1)) + rng.uniform(0, 0.02))
    return np.asarray(rows, np.float32), cats


def real_rows() -> tuple[np.ndarray, list[str]]:
    """Rows of 256 from fixtures/stories260K.gguf's F32 weights (flattened, first 16 rows a tensor)."""
    from gguf import GGUFReader

    rows, cats = [], []
    r = GGUFReader(str(ROOT / "fixtures" / "stories260K.gguf"))
    for t in r.tensors:
        if t.name not in ("token_embd.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight",
                          "blk.2.ffn_up.weight", "blk.4.attn_output.weight", "output.weight"):
            continue
        v = np.asarray(t.data, np.float32).reshape(-1)
        v = v[:v.size // 256 * 256].reshape(-1, 256)[:16]
        rows.append(v)
        cats += [f"stories260K:{t.name}"] * len(v)
    return np.concatenate(rows), cats


def random_blocks(rng, t: str, n: int) -> np.ndarray:
    """n blocks of random bytes (every index, sign, scale and trit pattern) whose scales are finite
    and moderate: fp16 d in 1e-3..10 where the type has one, MXFP4's exponent in 100..140."""
    _, qk, nb, _ = TYPES[t]
    b = rng.integers(0, 256, (n, nb)).astype(np.uint8)
    d = (rng.choice([-1, 1], n) * 10.0 ** rng.uniform(-3, 1, n)).astype(np.float16).view(np.uint16)
    if t == "iq1_s" or t == "iq4_xs":
        b[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    elif t in ("tq1_0", "tq2_0"):
        b[:, nb - 2:] = d.view(np.uint8).reshape(n, 2)
    elif t == "iq1_m":                  # d's 16 bits in the top nibbles of the four uint16 scales
        sc = b[:, 48:56].copy().view(np.uint16) & 0x0FFF
        for k in range(4):
            sc[:, k] |= ((d >> (4 * k)) & 0xF) << 12
        b[:, 48:56] = sc.view(np.uint8)
    elif t == "mxfp4":
        b[:, 0] = rng.integers(100, 141, n)
    return b


def make(ggml_dir: str) -> None:
    rng = np.random.default_rng(3131)
    xe, ce = edge_rows(rng)
    xr, cr = real_rows()
    w = weights(rng, 256)
    out = {}
    with tempfile.TemporaryDirectory() as d:
        lib = build(ggml_dir, Path(d))
        xa = abort_rows(lib, rng)
        x = np.concatenate([xe, xr, xa])
        cats = np.array(ce + cr + ["iq1_m_aborts"] * len(xa))
        act = (rng.standard_normal(x.shape) * rng.uniform(0.1, 10, (len(x), 1))).astype(np.float32)
        acts = {vt: activations(lib, act, vt) for vt in ACT}
        racts = {vt: activations(lib, (rng.standard_normal((32, 4 * ACT[vt][0])) * rng.uniform(0.1, 10, (32, 1))).astype(np.float32),
                                 vt) for vt in ACT}               # rows of 4 blocks, for the random blocks
        h = hashlib.sha256()
        for a in iq1_tables(lib):
            h.update(np.ascontiguousarray(a).tobytes())
        out["iq1_tables_sha256"] = np.array(h.hexdigest())
        for t, (_, qk, nb, paths) in TYPES.items():
            for path in paths:
                key = t if path == "ref" else f"{t}_w"
                qs = [None] if path == "ref" else list(w)
                got = [reference_rows(lib, x, t, qw) for qw in qs]
                out[key] = got[0][0] if path == "ref" else np.stack([b for b, _ in got])
                out[f"{key}_aborts"] = got[0][1] if path == "ref" else np.stack([a for _, a in got])
            main = out[t] if "ref" in paths else out[f"{t}_w"][0]
            out[f"{t}_dequantized_sha256"] = np.array(hashlib.sha256(dequantize(lib, main, t).tobytes()).hexdigest())
            out[f"{t}_dot"] = dots(lib, main, acts[VEC_DOT[t]], t)
            rb = random_blocks(rng, t, 128).reshape(32, -1)                          # rows of 4 blocks
            out[f"{t}_random_blocks"] = rb
            out[f"{t}_random_dot"] = dots(lib, rb, racts[VEC_DOT[t]], t)
            out[f"{t}_random_dequantized_sha256"] = np.array(hashlib.sha256(dequantize(lib, rb, t).tobytes()).hexdigest())
            wide = main[:len(main) // 16 * 16].reshape(-1, 16 * main.shape[1])      # rows of 4096: the sum's order
            awide = acts[VEC_DOT[t]][:len(wide) * 16].reshape(len(wide), -1)
            out[f"{t}_dot_wide"] = dots(lib, wide, awide, t)
    np.savez_compressed(HERE / "iquants_small.npz", x=x, category=cats, imatrix=w, q8_K=acts["q8_K"], q8_0=acts["q8_0"],
                        random_q8_K=racts["q8_K"], random_q8_0=racts["q8_0"], **out)
    print(json.dumps({"rows": len(x), "bytes": os.path.getsize(HERE / "iquants_small.npz")}))


# -- the random check ------------------------------------------------------------------------------------
def ggtool_rows(rec, x: np.ndarray, qw) -> tuple[np.ndarray, np.ndarray]:
    """ggtool's bytes of x row by row (the record's compiled kernel), and which rows ggtool refuses
    as undefined in llama.cpp."""
    n = x.shape[1]
    out = np.zeros((x.shape[0], n // rec.block_size * rec.type_size), np.uint8)
    undefined = np.zeros(x.shape[0], bool)
    q = np.zeros(0, np.float32) if qw is None else np.ascontiguousarray(qw, np.float32)
    kernel, tables = rec.quantize_kernel, rec.quantizer_tables()
    for i in range(x.shape[0]):
        r = kernel(np.ascontiguousarray(x[i:i + 1]), out[i:i + 1], q, *tables)
        if r <= -2:
            undefined[i] = True
        elif r != -1:
            raise SystemExit(f"ggtool refused row {i}: code {r}")
    return out, undefined


def check(ggml_dir: str, n: int, types: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    from ggtool import qtypes

    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    with tempfile.TemporaryDirectory() as d:
        lib = build(ggml_dir, Path(d))
        for t in types:
            tid, qk, nb, paths = TYPES[t]
            rec = qtypes.get(tid)
            for width in (256, 4096):
                for path in paths:
                    total = bad = undef = undef_aborts = aborted = 0
                    t_c = t_g = 0.0
                    left = max(1, -(-n * qk // width))
                    while left > 0:
                        rows = min(left, max(1, (1 << 20) // width))
                        left -= rows
                        scale = 10.0 ** np.where(rng.random((rows, 1)) < 0.8, rng.uniform(-4, 4, (rows, 1)),
                                                 rng.uniform(-44, 38, (rows, 1)))
                        x = np.clip(rng.standard_normal((rows, width)) * scale, -3e38, 3e38).astype(np.float32)
                        x[rng.random(x.shape) < 0.02] = 0
                        qw = weights(rng, width)[rng.integers(2)] if path == "imatrix" else None
                        t0 = time.perf_counter()
                        got, und = ggtool_rows(rec, x, qw)
                        t_g += time.perf_counter() - t0
                        t0 = time.perf_counter()
                        want, why = reference_forked(lib, x[~und], t, qw)
                        t_c += time.perf_counter() - t0
                        per_row = width // qk
                        total += rows * per_row
                        undef += int(und.sum()) * per_row
                        for i in np.nonzero(und)[0]:     # what llama.cpp does there
                            if reference_forked(lib, x[i:i + 1], t, qw)[0] is None:
                                undef_aborts += per_row
                        if want is None:          # a GGML abort: find the rows one by one
                            for i in np.nonzero(~und)[0]:
                                wi, why = reference_forked(lib, x[i:i + 1], t, qw)
                                if wi is None:
                                    aborted += per_row
                                else:
                                    bad += int((wi.reshape(per_row, -1) != got[i].reshape(per_row, -1)).any(axis=1).sum())
                            continue
                        diff = (want.reshape(-1, nb) != got[~und].reshape(-1, nb)).any(axis=1)
                        bad += int(diff.sum())
                    print(f"{t:6} {path:8} rows of {width:4}: {total:7} blocks, {bad} differ; ggtool refuses {undef} "
                          f"(in rows llama.cpp aborts on: {undef_aborts}); llama.cpp aborts on {aborted} others "
                          f"(C {t_c:.1f} s, ggtool {t_g:.1f} s)",
                          flush=True)


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
