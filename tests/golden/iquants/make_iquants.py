"""Make iquants.npz: the bytes llama.cpp's quantizers write for IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and
IQ3_S (ggml_quantize_chunk's quantize_iq2_xxs .. quantize_iq3_s, with and without quant_weights
where GGML allows none), GGML's dequantize_row_* of them, its generic dot products with Q8_K, and
digests of iq2xs_init_impl / iq3xs_init_impl's tables; or compare ggtool with the C on N random
blocks a type and path (--check N).

    python tests/golden/iquants/make_iquants.py GGML_DIR                  # write iquants.npz
    python tests/golden/iquants/make_iquants.py GGML_DIR --check N [--types iq2_xxs ...]

GGML_DIR is the ggml folder of the llama.cpp llama-cpp-python 0.3.36 vendors (vendor/llama.cpp/ggml
of its sdist). src/ggml-quants.c (included by a small C file that also hands out its static
iq2_data/iq3_data tables) and the generic dot products of src/ggml-cpu/quants.c are compiled with
`gcc -O2 -DNDEBUG` (x86-64 baseline: no FMA, no F16C, as llama.cpp builds ggml-base), with stubs
for the few ggml symbols they reference, and called through ctypes. GGML aborts (GGML_ASSERT) on
blocks whose values overflow its searches: each call runs in a forked child, and where a child
aborts the rows are split until each aborting row is known (ggtool must refuse exactly those).
numpy only makes the inputs.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import mmap
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from ggml_c import TABLE_ACCESS, compile_ggml, grid_tables, weights

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]

STUBS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
void ggml_abort(const char * file, int line, const char * fmt, ...) { abort(); }
void ggml_log_internal(int level, const char * fmt, ...) {}
const char * ggml_type_name(int t) { return "?"; }
size_t ggml_type_size(int t) { abort(); }
size_t ggml_row_size(int t, int64_t n) { abort(); }
float ggml_table_f32_f16[1 << 16];
"""
# type -> (ggml id, bytes per block, GGML requires quant_weights, grid size, kmap size)
TYPES = {"iq2_xxs": (16, 66, True, 256, 43692), "iq2_xs": (17, 74, True, 512, 43692),
         "iq2_s": (22, 82, False, 1024, 43692), "iq3_xxs": (18, 98, False, 256, 4096),
         "iq3_s": (21, 110, False, 512, 4096)}
QK_K = 256
Q8_K_BYTES = 292


def build(ggml_dir: str, tmp: Path) -> ctypes.CDLL:
    lib = compile_ggml(ggml_dir, tmp, STUBS, TABLE_ACCESS)
    for t in TYPES:          # the tables, once, before any fork (as ggml_quantize_init)
        init_tables(lib, t)
    return lib


def init_tables(lib, t: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGML's (grid, map, neighbours) for t, copied out of its static tables."""
    gid, _, _, gsize, kmap = TYPES[t]
    if t.startswith("iq2"):
        return grid_tables(lib, "iq2", gid, gsize, 8, kmap)
    return grid_tables(lib, "iq3", gsize, gsize, 4, kmap)


def digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _call_quantize(lib, t: str, x: np.ndarray, out: np.ndarray, qw) -> None:
    fn = getattr(lib, f"quantize_{t}")
    fn.restype = ctypes.c_size_t
    fn(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(x.shape[0]),
       ctypes.c_int64(x.shape[1]), None if qw is None else qw.ctypes.data_as(ctypes.c_void_p))


def _forked(lib, t: str, x: np.ndarray, qw) -> np.ndarray | None:
    """quantize_<t> of x's rows in a forked child: the bytes, or None where GGML aborted."""
    nbytes = x.shape[0] * x.shape[1] // QK_K * TYPES[t][1]
    buf = mmap.mmap(-1, max(1, nbytes))
    pid = os.fork()
    if pid == 0:                                     # the child: quantize into the shared page, exit
        try:
            os.close(1)                              # GGML's "Oops" lines and abort messages
            os.close(2)
            out = np.frombuffer(buf, np.uint8, nbytes).reshape(x.shape[0], -1)
            _call_quantize(lib, t, x, out, qw)
            os._exit(0)
        except BaseException:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGABRT:
        return None
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status):
        raise RuntimeError(f"quantize_{t}: the child ended with status {status}")
    return np.frombuffer(buf, np.uint8, nbytes).reshape(x.shape[0], -1).copy()


def reference(lib, x: np.ndarray, t: str, qw: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """GGML's bytes of x's rows (zeros for a row it aborts on) and which rows it aborts on."""
    x = np.ascontiguousarray(x, np.float32)
    w = None if qw is None else np.ascontiguousarray(qw, np.float32)
    out = np.zeros((x.shape[0], x.shape[1] // QK_K * TYPES[t][1]), np.uint8)
    aborts = np.zeros(x.shape[0], bool)

    def go(r0, r1):
        got = _forked(lib, t, x[r0:r1], w)
        if got is not None:
            out[r0:r1] = got
        elif r1 - r0 == 1:
            aborts[r0] = True
        else:
            mid = (r0 + r1) // 2
            go(r0, mid)
            go(mid, r1)

    if len(x):
        go(0, len(x))
    return out, aborts


def dequantize_ref(lib, b: np.ndarray, t: str) -> np.ndarray:
    b = np.ascontiguousarray(b, np.uint8)
    out = np.zeros(b.size // TYPES[t][1] * QK_K, np.float32)
    getattr(lib, f"dequantize_row_{t}")(b.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                                        ctypes.c_int64(out.size))
    return out.reshape(-1, QK_K)


def dot_ref(lib, w: np.ndarray, a: np.ndarray, t: str) -> np.float32:
    """ggml_vec_dot_<t>_q8_K_generic of one weight row and one Q8_K row."""
    w = np.ascontiguousarray(w, np.uint8)
    a = np.ascontiguousarray(a, np.uint8)
    s = np.zeros(1, np.float32)
    getattr(lib, f"ggml_vec_dot_{t}_q8_K_generic")(
        ctypes.c_int(w.size // TYPES[t][1] * QK_K), s.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(0),
        w.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(0), a.ctypes.data_as(ctypes.c_void_p),
        ctypes.c_size_t(0), ctypes.c_int(1))
    return s[0]


def random_q8_k(rng, nblocks: int) -> np.ndarray:
    """Q8_K blocks: float32 d (random scale), int8 qs in -127..127, their bsums."""
    out = np.zeros((nblocks, Q8_K_BYTES), np.uint8)
    qs = rng.integers(-127, 128, (nblocks, QK_K)).astype(np.int8)
    d = (10.0 ** rng.uniform(-4, 1, nblocks)).astype(np.float32) * rng.choice([-1, 1], nblocks).astype(np.float32)
    out[:, :4] = d.view(np.uint8).reshape(nblocks, 4)
    out[:, 4:260] = qs.view(np.uint8)
    out[:, 260:] = qs.reshape(nblocks, 16, 16).sum(-1).astype("<i2").view(np.uint8).reshape(nblocks, 32)
    return out


def random_blocks(rng, t: str, nblocks: int) -> np.ndarray:
    """Random bytes of t's blocks with a finite fp16 d (every index, sign and scale pattern)."""
    b = rng.integers(0, 256, (nblocks, TYPES[t][1])).astype(np.uint8)
    d = (rng.standard_normal(nblocks) * 10.0 ** rng.uniform(-6, 4, nblocks)).astype(np.float16)
    b[:, :2] = d.view(np.uint8).reshape(nblocks, 2)
    return b


# -- the golden rows ------------------------------------------------------------------------------------
def _stories_rows(rng) -> tuple[list, list]:
    """Blocks of real weights: 256 consecutive values, two of each F32 weight of fixtures/stories260K.gguf."""
    from gguf import GGUFReader

    r = GGUFReader(str(ROOT / "fixtures" / "stories260K.gguf"))
    rows, cats = [], []
    for t in r.tensors:
        if t.name.endswith("weight") and len(t.shape) >= 2 and "norm" not in t.name:
            v = np.asarray(t.data, np.float32).reshape(-1)
            for s in rng.choice(v.size // QK_K, 2, replace=False):
                rows.append(v[s * QK_K:(s + 1) * QK_K])
                cats.append(f"stories260K:{t.name}")
    return rows, cats


def edge_rows(rng) -> tuple[np.ndarray, list[str]]:
    """Blocks that take each branch of the IQ searches."""
    rows, cats = [], []

    def add(cat, v):
        rows.append(np.asarray(v, np.float32).reshape(QK_K))
        cats.append(cat)

    g = rng.standard_normal
    add("zeros", np.zeros(QK_K))
    add("neg_zeros", np.full(QK_K, -0.0))
    add("mixed_zeros", np.where(rng.random(QK_K) < 0.5, -0.0, 0.0))
    for s in (1e-30, 1e-20, 1e-16, 1e-12, 1e-9, 1e-7):   # below and about GROUP_MAX_EPS (1e-15) and the IQ ones (1e-8)
        add(f"tiny_{s:g}", g(QK_K) * s)
    add("subnormal", g(QK_K) * 1e-41)
    for s in (1e4, 1e8, 1e12, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 3e38):   # up to and past where GGML aborts
        add(f"huge_{s:g}", np.clip(g(QK_K), -1, 1) * s)
    v = g(QK_K) * 1e-3
    v[37] = 50.0
    add("outlier", v)
    v = np.zeros(QK_K)
    v[200] = -3.0
    add("single_negative", v)
    v = np.zeros(QK_K)
    v[5] = 1.0
    add("single_positive", v)
    add("all_negative", -np.abs(g(QK_K)))
    add("all_positive", np.abs(g(QK_K)))
    v = np.abs(g(QK_K))
    v[::8] *= -1                                 # one minus sign per 8: every group's parity flips
    add("odd_signs", v)
    v = np.abs(g(QK_K)).reshape(32, 8)
    v[:, :3] *= -1                               # three per 8
    add("three_signs", v)
    add("constant", np.full(QK_K, 0.7))
    add("constant_neg", np.full(QK_K, -1.3))
    add("alternating", np.where(np.arange(QK_K) % 2, 1.0, -1.0))
    levels = np.array([1, 3, 5])
    add("iq2_levels", levels[rng.integers(0, 3, QK_K)] * 0.01 * np.where(rng.random(QK_K) < 0.5, -1, 1))
    add("iq3_levels", (2 * rng.integers(0, 8, QK_K) + 1) * 0.02 * np.where(rng.random(QK_K) < 0.5, -1, 1))
    add("integers", rng.integers(-8, 9, QK_K).astype(float))
    v = g(QK_K)
    v[:128] *= 1e-9                              # half the sub-blocks below the IQ eps
    add("half_tiny", v)
    v = g(QK_K).reshape(8, 32) * (10.0 ** np.arange(-3, 5))[:, None]   # sub-blocks of very different scales
    add("scales_spread", v)
    v = g(QK_K) * 0.1
    v[rng.random(QK_K) < 0.7] = 0.0
    add("sparse", v)
    add("laplace", rng.laplace(size=QK_K))
    add("student_t", rng.standard_t(2, QK_K))
    add("uniform", rng.uniform(-1, 1, QK_K))
    add("tie_magnitudes", np.where(np.arange(QK_K) % 3 == 0, -0.5, 0.5))
    return np.asarray(rows, np.float32), cats


def golden_rows(x_new: np.ndarray, cats_new) -> tuple[np.ndarray, np.ndarray]:
    """The golden rows: kquants.npz's 101 blocks (its edge rows and real weights), then iquants.npz's own."""
    k = np.load(ROOT / "tests" / "golden" / "kquants" / "kquants.npz")
    return np.concatenate([k["x"], x_new]).astype(np.float32), np.array([*k["category"], *cats_new])


def make(ggml_dir: str) -> None:
    rng = np.random.default_rng(3131)
    ex, ecats = edge_rows(rng)
    srows, scats = _stories_rows(rng)
    x_new = np.concatenate([ex, np.asarray(srows, np.float32)]).astype(np.float32)
    x, cats = golden_rows(x_new, [*ecats, *scats])
    w = weights(rng, QK_K)
    out: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as d:
        lib = build(ggml_dir, Path(d))
        for t, (_, nbytes, needs, _, _) in TYPES.items():
            g, m, nb = init_tables(lib, t)
            out[f"{t}_tables_sha256"] = np.array(digest(g, m, nb))
            paths = [("w0", w[0]), ("w1", w[1])] + ([] if needs else [("ref", None)])
            for path, qw in paths:
                b, ab = reference(lib, x, t, qw)
                out[f"{t}_{path}"] = b
                out[f"{t}_{path}_aborts"] = ab
            # GGML's dequantize_row_* of its own bytes (and of random bytes), and its generic dot
            b = out[f"{t}_w0"][~out[f"{t}_w0_aborts"]]
            rb = random_blocks(rng, t, 32)
            out[f"{t}_random_blocks"] = rb
            out[f"{t}_dequant_sha256"] = np.array(digest(dequantize_ref(lib, b, t), dequantize_ref(lib, rb, t)))
            a = random_q8_k(rng, len(rb))
            out[f"{t}_q8_k"] = a
            out[f"{t}_dot"] = np.array([dot_ref(lib, rb[i:i + 4].reshape(-1), a[i:i + 4].reshape(-1), t)
                                        for i in range(0, len(rb), 4)], np.float32)
    np.savez_compressed(HERE / "iquants.npz", x_new=x_new, category=cats, imatrix=w, **out)
    print(json.dumps({"rows": len(x), "bytes": os.path.getsize(HERE / "iquants.npz"),
                      "aborts": {k2: int(v.sum()) for k2, v in out.items() if k2.endswith("_aborts")}}))


# -- --check ---------------------------------------------------------------------------------------------
def _random_rows(rng, rows: int, width: int, extreme: bool) -> np.ndarray:
    if extreme:      # from fp32 subnormals to where GGML's searches overflow
        scale = 10.0 ** rng.uniform(-44, 38, (rows, 1))
    else:
        scale = 10.0 ** rng.uniform(-6, 6, (rows, 1))
    kind = rng.integers(0, 3, (rows, 1))
    x = np.where(kind == 0, rng.standard_normal((rows, width)),
                 np.where(kind == 1, rng.laplace(size=(rows, width)), rng.uniform(-1, 1, (rows, width))))
    x = np.clip(x * scale, -3e38, 3e38).astype(np.float32)
    x[rng.random(x.shape) < 0.02] = 0
    sub = x.reshape(rows, -1, 32)                 # a tenth of the rows: some 32-value sub-blocks all zero
    sub[(rng.random((rows, 1)) < 0.1) & (rng.random(sub.shape[:2]) < 0.3)] = 0
    return x


def mine(rec, x: np.ndarray, qw) -> tuple[np.ndarray, np.ndarray]:
    """ggtool's bytes of x's rows (zeros where it refuses a row) and which rows it refuses."""
    from ggtool.errors import QuantizationError

    out = np.zeros((x.shape[0], x.shape[1] // QK_K * rec.type_size), np.uint8)
    refused = np.zeros(x.shape[0], bool)

    def go(r0, r1):
        try:
            out[r0:r1] = rec.quantize(x[r0:r1], qw)
        except QuantizationError:
            if r1 - r0 == 1:
                refused[r0] = True
            else:
                go(r0, (r0 + r1) // 2)
                go((r0 + r1) // 2, r1)

    go(0, len(x))
    return out, refused


def check(ggml_dir: str, n: int, types: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    from ggtool import qtypes

    seed = int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    print(f"seed {seed}", flush=True)
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        lib = build(ggml_dir, Path(d))
        for t in types:
            rec = qtypes.get(t)
            g, m, nb = init_tables(lib, t)
            ours = rec.quantizer_tables()
            same = digest(g, m, nb) == digest(ours[0], ours[1], ours[2])
            print(f"{t:8} tables (grid, map, neighbours) equal GGML's: {same}", flush=True)
            failures += not same
            nbytes = TYPES[t][1]
            paths = ["imatrix"] + ([] if TYPES[t][2] else ["none"])
            for path in paths:
                for width in (256, 4096):
                    rows = max(1, n * QK_K // width)
                    t0 = time.perf_counter()
                    bad = aborts = blocks = 0
                    for s in range(0, rows, max(1, 65536 // width)):
                        r = min(rows - s, max(1, 65536 // width))
                        x = _random_rows(rng, r, width, extreme=rng.random() < 0.05)
                        qw = weights(rng, width)[rng.integers(2)] if path == "imatrix" else None
                        want, ab = reference(lib, x, t, qw)
                        got, refused = mine(rec, x, qw)
                        ok = ~ab & ~refused
                        bad += int((want[ok].reshape(-1, nbytes) != got[ok].reshape(-1, nbytes)).any(axis=1).sum())
                        bad += int((ab != refused).sum()) * (width // QK_K)
                        aborts += int(ab.sum())
                        blocks += r * width // QK_K
                    failures += bad
                    print(f"{t:8} {path:8} rows of {width:5}: {blocks:7} blocks, {bad} differ "
                          f"({aborts} rows GGML aborts on, refused alike) [{time.perf_counter() - t0:.0f} s]", flush=True)
            # dequantize and the dot on random bytes
            rb = random_blocks(rng, t, n // 16 * 4)
            same_dq = np.array_equal(dequantize_ref(lib, rb, t).view(np.uint32), rec.dequantize(rb).view(np.uint32))
            a = random_q8_k(rng, len(rb))
            dots = [(dot_ref(lib, rb[i:i + 4].reshape(-1), a[i:i + 4].reshape(-1), t),
                     rec.dot(rb[i:i + 4].reshape(-1), a[i:i + 4].reshape(-1))) for i in range(0, len(rb), 4)]
            dot_bad = sum(1 for p, q in dots if np.float32(p).view(np.uint32) != np.float32(q).view(np.uint32))
            print(f"{t:8} dequantize of {len(rb)} random blocks equals GGML's: {same_dq}; "
                  f"generic dot of {len(dots)} rows of 4 blocks: {dot_bad} differ", flush=True)
            failures += (not same_dq) + dot_bad
    print("all equal" if not failures else f"{failures} differences")
    return 1 if failures else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ggml", help="the ggml folder (vendor/llama.cpp/ggml)")
    ap.add_argument("--check", type=int, default=0, metavar="N", help="compare N random blocks a type and path")
    ap.add_argument("--types", nargs="+", default=list(TYPES))
    a = ap.parse_args()
    if a.check:
        sys.exit(check(a.ggml, a.check, a.types))
    make(a.ggml)


if __name__ == "__main__":
    main()
