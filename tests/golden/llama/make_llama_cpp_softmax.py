"""Make softmax-tails.npz: llama.cpp's own soft_max on rows whose length is no multiple of its lanes,
as they are and as attention meets them (in a KV cache of 256 cells, the rest masked with -inf).

Run with a bench environment's python (numpy only; ggml through ctypes, never ggtool's):

    PY=/work/bench-env/venv/bin/python
    LIB=$($PY -c "import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))")/lib
    $PY make_llama_cpp_softmax.py $LIB /work/bench-env/lib-avx2 softmax-tails.npz

The first directory holds the native (AVX-512) build's libggml-base.so and libggml-cpu.so, the
second the AVX2 one's. Each build runs in a subprocess of its own (one libggml per process):
`ggml_soft_max_ext(ctx, x, NULL, 1.0f, 0.0f)` on one thread. See README.md here for the keys.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np

KV_CELLS = 256      # llama.cpp's n_kv: attention rows are this long, the cells past the tokens masked
WIDTHS = (13, 37)   # 13: one AVX2 chunk and a tail, all tail for AVX-512; 37: two AVX-512 chunks, four AVX2 ones


def inputs() -> dict:
    """24 rows of n: standard normal times 3, the last four from 0 down to -110 and -200 (the expf
    tails below 2^-126 and past -192*ln 2, where AVX2's ggml_v_expf scales in two steps)."""
    rng = np.random.default_rng(23)
    res = {}
    for n in WIDTHS:
        x = (rng.standard_normal((24, n)) * 3).astype(np.float32)
        x[20:22] = np.linspace(0, -110, n, dtype=np.float32)
        x[22:] = np.linspace(0, -200, n, dtype=np.float32)
        res[f"x_{n}"] = x
    return res


def soft_max(lib_dir: str, x: np.ndarray) -> np.ndarray:
    """x (R, n) through this build's ggml_soft_max_ext."""
    base = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(lib_dir, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)

    class Params(ctypes.Structure):
        _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]

    vp = ctypes.c_void_p
    base.ggml_init.restype, base.ggml_init.argtypes = vp, [Params]
    base.ggml_new_tensor_2d.restype = vp
    base.ggml_new_tensor_2d.argtypes = [vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_soft_max_ext.restype = vp
    base.ggml_soft_max_ext.argtypes = [vp, vp, vp, ctypes.c_float, ctypes.c_float]
    base.ggml_new_graph.restype, base.ggml_new_graph.argtypes = vp, [vp]
    base.ggml_build_forward_expand.argtypes = [vp, vp]
    base.ggml_get_data.restype, base.ggml_get_data.argtypes = vp, [vp]
    cpu.ggml_graph_compute_with_ctx.argtypes = [vp, vp, ctypes.c_int]
    cpu.ggml_cpu_init()
    x = np.ascontiguousarray(x, np.float32)
    ctx = base.ggml_init(Params(16 << 20, None, False))
    a = base.ggml_new_tensor_2d(ctx, 0, x.shape[1], x.shape[0])          # GGML_TYPE_F32
    ctypes.memmove(base.ggml_get_data(a), x.ctypes.data, x.nbytes)
    y = base.ggml_soft_max_ext(ctx, a, None, 1.0, 0.0)
    graph = base.ggml_new_graph(ctx)
    base.ggml_build_forward_expand(graph, y)
    cpu.ggml_graph_compute_with_ctx(ctx, graph, 1)
    out = np.empty_like(x)
    ctypes.memmove(out.ctypes.data, base.ggml_get_data(y), out.nbytes)
    return out


def main(native: str, avx2: str, out: str) -> None:
    res = inputs()
    for build, lib_dir in (("avx512", native), ("avx2", avx2)):
        for n in WIDTHS:
            x = res[f"x_{n}"]
            cache = np.full((x.shape[0], KV_CELLS), -np.inf, np.float32)
            cache[:, :n] = x
            for key, rows in ((f"y_{n}_{build}", x), (f"y_kv_{n}_{build}", cache)):
                tmp = f"{out}.{key}.npy"
                np.save(tmp, rows)
                subprocess.run([sys.executable, __file__, "--one", lib_dir, tmp], check=True)
                res[key] = np.load(tmp)[:, :n]
                os.remove(tmp)
    np.savez_compressed(out, **res)


if __name__ == "__main__":
    if sys.argv[1] == "--one":      # a subprocess: one build, one input, the result in its place
        np.save(sys.argv[3], soft_max(sys.argv[2], np.load(sys.argv[3])))
    else:
        main(*sys.argv[1:4])
