"""llama.cpp's own CPU ops through ctypes: mul_mat of any weight type on F32 activations, as the CPU
backend of one build computes it (llamafile's sgemm, the tiled K-quant kernel, the vec_dots, and, for
the types its CPU_REPACK buffer takes, the repacked gemm/gemv). A tool of the bench environment and
of the golden makers here, never of ggtool (numpy and ctypes only).

    PY=/work/bench-env/venv/bin/python
    $PY llama_cpp_ops.py /work/bench-env/build-native/bin IN.npz OUT.npz

IN.npz holds cases `w_{i}` (uint8 (N, row bytes)), `t_{i}` (the GGML type id), `x_{i}` (float32
(M, K)), `repack_{i}` (0/1: weights in the CPU_REPACK buffer); OUT.npz gets `y_{i}` (float32 (M, N)).
A case with `op_{i}` "silu" (x) or "swiglu" (x and `g_{i}`) is that op instead, y (M, K).
One process per build: a process loads one libggml.
"""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np

vp = ctypes.c_void_p


class _Params(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class Ggml:
    def __init__(self, lib_dir: str, n_threads: int = 1):
        self.base = b = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        self.cpu = c = ctypes.CDLL(os.path.join(lib_dir, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        b.ggml_init.restype, b.ggml_init.argtypes = vp, [_Params]
        b.ggml_free.argtypes = [vp]
        b.ggml_new_tensor_2d.restype = vp
        b.ggml_new_tensor_2d.argtypes = [vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        b.ggml_mul_mat.restype, b.ggml_mul_mat.argtypes = vp, [vp, vp, vp]
        b.ggml_silu.restype, b.ggml_silu.argtypes = vp, [vp, vp]
        b.ggml_swiglu_split.restype, b.ggml_swiglu_split.argtypes = vp, [vp, vp, vp]
        b.ggml_new_graph.restype, b.ggml_new_graph.argtypes = vp, [vp]
        b.ggml_build_forward_expand.argtypes = [vp, vp]
        b.ggml_tensor_overhead.restype = ctypes.c_size_t
        b.ggml_graph_overhead.restype = ctypes.c_size_t
        b.ggml_nbytes.restype, b.ggml_nbytes.argtypes = ctypes.c_size_t, [vp]
        b.ggml_backend_alloc_ctx_tensors_from_buft.restype = vp
        b.ggml_backend_alloc_ctx_tensors_from_buft.argtypes = [vp, vp]
        b.ggml_backend_alloc_ctx_tensors.restype = vp
        b.ggml_backend_alloc_ctx_tensors.argtypes = [vp, vp]
        b.ggml_backend_buffer_free.argtypes = [vp]
        b.ggml_backend_tensor_set.argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_size_t]
        b.ggml_backend_tensor_get.argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_size_t]
        b.ggml_backend_graph_compute.argtypes = [vp, vp]
        b.ggml_backend_cpu_buffer_type.restype = vp
        c.ggml_backend_cpu_init.restype = vp
        c.ggml_backend_cpu_set_n_threads.argtypes = [vp, ctypes.c_int]
        self.repack_buft = getattr(c, "_Z35ggml_backend_cpu_repack_buffer_typev")
        self.repack_buft.restype = vp
        c.ggml_cpu_init()
        self.backend = c.ggml_backend_cpu_init()
        c.ggml_backend_cpu_set_n_threads(self.backend, n_threads)

    def _ctx(self, n: int):
        size = n * self.base.ggml_tensor_overhead() + self.base.ggml_graph_overhead() + 1024
        return self.base.ggml_init(_Params(size, None, True))

    def mul_mat(self, wtype: int, w: np.ndarray, x: np.ndarray, repack: bool = False) -> np.ndarray:
        """y (M, N) = ggml_mul_mat(W, X): W N rows of K values of `wtype` (raw bytes w (N, row bytes)),
        X (M, K) float32."""
        b = self.base
        M, K = x.shape
        N = w.shape[0]
        cw = self._ctx(1)
        wt = b.ggml_new_tensor_2d(cw, wtype, K, N)
        assert b.ggml_nbytes(wt) == w.nbytes, (b.ggml_nbytes(wt), w.shape)
        buft = self.repack_buft() if repack else b.ggml_backend_cpu_buffer_type()
        wbuf = b.ggml_backend_alloc_ctx_tensors_from_buft(cw, buft)
        w = np.ascontiguousarray(w)
        b.ggml_backend_tensor_set(wt, w.ctypes.data, 0, w.nbytes)
        cx = self._ctx(3)
        xt = b.ggml_new_tensor_2d(cx, 0, K, M)
        yt = b.ggml_mul_mat(cx, wt, xt)
        graph = b.ggml_new_graph(cx)
        b.ggml_build_forward_expand(graph, yt)
        xbuf = b.ggml_backend_alloc_ctx_tensors(cx, self.backend)
        x = np.ascontiguousarray(x, np.float32)
        b.ggml_backend_tensor_set(xt, x.ctypes.data, 0, x.nbytes)
        b.ggml_backend_graph_compute(self.backend, graph)
        y = np.empty((M, N), np.float32)
        b.ggml_backend_tensor_get(yt, y.ctypes.data, 0, y.nbytes)
        for buf in (xbuf, wbuf):
            b.ggml_backend_buffer_free(buf)
        b.ggml_free(cx)
        b.ggml_free(cw)
        return y


    def unary(self, op: str, x: np.ndarray, g: np.ndarray | None = None) -> np.ndarray:
        """ggml_silu(X), or ggml_swiglu_split(X, G) (silu(X) * G), X (and G) float32 (M, K)."""
        b = self.base
        M, K = x.shape
        cx = self._ctx(4)
        xt = b.ggml_new_tensor_2d(cx, 0, K, M)
        gt = b.ggml_new_tensor_2d(cx, 0, K, M)
        yt = b.ggml_silu(cx, xt) if op == "silu" else b.ggml_swiglu_split(cx, xt, gt)
        graph = b.ggml_new_graph(cx)
        b.ggml_build_forward_expand(graph, yt)
        buf = b.ggml_backend_alloc_ctx_tensors(cx, self.backend)
        for t, a in ((xt, x), (gt, g if g is not None else x)):
            a = np.ascontiguousarray(a, np.float32)
            b.ggml_backend_tensor_set(t, a.ctypes.data, 0, a.nbytes)
        b.ggml_backend_graph_compute(self.backend, graph)
        y = np.empty((M, K), np.float32)
        b.ggml_backend_tensor_get(yt, y.ctypes.data, 0, y.nbytes)
        b.ggml_backend_buffer_free(buf)
        b.ggml_free(cx)
        return y


def main(lib_dir: str, src: str, dst: str, n_threads: int = 1) -> None:
    g = Ggml(lib_dir, n_threads)
    z = np.load(src)
    out = {}
    i = 0
    while f"x_{i}" in z:
        op = str(z[f"op_{i}"]) if f"op_{i}" in z else "mul_mat"
        if op == "mul_mat":
            out[f"y_{i}"] = g.mul_mat(int(z[f"t_{i}"]), z[f"w_{i}"], z[f"x_{i}"], bool(z[f"repack_{i}"]))
        else:
            out[f"y_{i}"] = g.unary(op, z[f"x_{i}"], z[f"g_{i}"] if f"g_{i}" in z else None)
        i += 1
    np.savez(dst, **out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], *(int(a) for a in sys.argv[4:5]))
