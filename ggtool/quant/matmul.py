"""GGML's quantized mul_mat: Q4_0 or Q8_0 weights x Q8_0 activations, on compiled kernels.

By the number M of activation rows (a function of the shapes only, so the same inputs always give
the same bits, whatever the number of participants):

* M <= SMALL_M (token generation, short prompts): GGML's integer block dot on weights repacked
  into groups of rows (``ggtool.kernels.dot``): exact integer sums per block, then
  ``(sumi * d_w) * d_a`` summed over blocks in order in float32 -- GGML's scalar reference bit for bit.
* larger M: both operands are expanded exactly to float32 (every code times its fp16 scale is exact
  in float32) and multiplied with float32 BLAS on one thread, in column blocks of the weights of a
  size fixed by K (~1 MiB): as GGML's BLAS backend does for batches. Mathematically the same sum;
  only the float32 accumulation order differs, as GGML's own SIMD kernels differ from its scalar one.

Repacked weights are cached for the life of their storage (``weight_pack``): a weight read from a
mapped GGUF file is repacked once per process, one in a context once per tensor.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from .. import types as T
from ..errors import QuantizationError
from .blocks import _F32, Q4_0_BYTES, Q8_0_BYTES, QK

SMALL_M = 16       # activation rows up to which the integer kernel is faster than expand + sgemm


def _check(w_raw, wt, act_raw):
    if wt not in (T.Q4_0, T.Q8_0):
        raise QuantizationError(f"mul_mat_q8_0: weights must be q4_0 or q8_0, not {T.type_name(wt)}")
    wb = Q4_0_BYTES if wt == T.Q4_0 else Q8_0_BYTES
    if w_raw.shape[1] % wb or act_raw.shape[1] % Q8_0_BYTES or \
            w_raw.shape[1] // wb != act_raw.shape[1] // Q8_0_BYTES:
        raise QuantizationError(f"mul_mat_q8_0: weight rows of {w_raw.shape[1]} bytes ({T.type_name(wt)}) "
                                f"and activation rows of {act_raw.shape[1]} bytes (q8_0) differ in length")


def _rows(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.uint8:
        x = x.view(np.uint8)
    return x.reshape(1, -1) if x.ndim == 1 else x


def mul_mat_q8_0(w_raw, w_type, act_raw) -> np.ndarray:
    """GGML's Q4_0/Q8_0 x Q8_0 dot products: float32 (M, N), out[m, n] = row n of W . row m of A.

    w_raw: uint8 (N, row_bytes) of Q4_0 or Q8_0 rows; act_raw: uint8 (M, row_bytes) of Q8_0 rows
    with the same number of blocks. See the module docstring for the numerics.
    """
    wt = T.parse_type(w_type)
    w_raw, act_raw = _rows(w_raw), _rows(act_raw)
    _check(w_raw, wt, act_raw)
    out = np.empty((act_raw.shape[0], w_raw.shape[0]), _F32)
    mul_mat_into(wt, w_raw, act_raw, out)
    return out


def mul_mat_into(wt, w_raw: np.ndarray, act_raw: np.ndarray, out: np.ndarray, pack=None) -> None:
    """out (M, N) = w_raw (N rows of wt) . act_raw (M Q8_0 rows); `pack()` may supply the cached
    repacked weights (else they are repacked here)."""
    N, M = w_raw.shape[0], act_raw.shape[0]
    if N == 0 or M == 0 or w_raw.shape[1] == 0:
        out[...] = 0
        return
    if M <= SMALL_M:
        from ..kernels import dot
        packed = pack() if pack is not None else dot.pack(wt, w_raw)
        if out.flags.c_contiguous:
            dot.dot(wt, packed, act_raw, out)
        else:
            tmp = np.empty(out.shape, _F32)
            dot.dot(wt, packed, act_raw, tmp)
            out[...] = tmp
        return
    _mul_mat_blas(wt, w_raw, act_raw, out)


_TENSOR_PACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # context leaf -> {key: packed}


def _root(t):
    while t.view_src is not None:
        t = t.view_src
    return t


def weight_pack(a, key, make):
    """The repacked form of (part of) weight tensor `a`, made by make() once for the life of its
    storage: per mapped file for GGUF weights (``FileStorage.derived``), per tensor for a context's
    leaf (dropped when the leaf is written through ``Tensor.set_data``). A weight computed by the
    graph changes from run to run and is repacked on every use."""
    root = _root(a)
    if root.op != "NONE":
        return make()
    key = (a.type, a.ne, a.nb, a.data_offset, *key)
    if root.storage is not None:
        cache = root.storage.derived
    else:
        cache = _TENSOR_PACKS.get(root)
        if cache is None:
            cache = _TENSOR_PACKS[root] = {}
    packed = cache.get(key)
    if packed is None:
        packed = cache[key] = make()
    return packed


def forget(t) -> None:
    """Drop the repacked weights made from t's leaf (its data is being rewritten)."""
    _TENSOR_PACKS.pop(_root(t), None)


def _mul_mat_blas(wt, w_raw, act_raw, out) -> None:
    from . import dequantize
    from .q8_0 import dequantize_q8_0

    K = act_raw.shape[1] // Q8_0_BYTES * QK
    M, N = act_raw.shape[0], w_raw.shape[0]
    A = np.ascontiguousarray(dequantize_q8_0(act_raw))               # exact float32 (M, K)
    # Every sgemm has the shape (M, K) x (K, cols) with cols fixed by K alone (~1 MiB of weights,
    # at most 512 rows; the last block padded with zero rows; M > SMALL_M so it is never a gemv).
    # BLAS runs on one thread meanwhile: OpenBLAS's multi-threaded sgemm may sum in another order.
    cols = max(8, min(512, (1 << 20) // (4 * K)))
    buf = np.zeros((cols, K), _F32)
    with one_blas_thread():
        for n0 in range(0, N, cols):
            n1 = min(N, n0 + cols)
            buf[:n1 - n0] = dequantize(w_raw[n0:n1], wt)              # exact float32
            if n1 - n0 < cols:
                buf[n1 - n0:] = 0
            out[:, n0:n1] = (A @ buf.T)[:M, :n1 - n0]


_blas_lock = threading.Lock()
_blas_users = 0
_blas_saved: int | None = None


class one_blas_thread:
    """Process-wide 'BLAS on one thread' while any thread is inside (reference counted)."""

    def __enter__(self):
        global _blas_users, _blas_saved
        from .. import blas
        with _blas_lock:
            if _blas_users == 0:
                n = blas.get_threads()
                _blas_saved = n
                if n is not None and n > 1:
                    blas.set_threads(1)
            _blas_users += 1
        return self

    def __exit__(self, *exc):
        global _blas_users
        from .. import blas
        with _blas_lock:
            _blas_users -= 1
            if _blas_users == 0 and _blas_saved is not None and _blas_saved > 1:
                blas.set_threads(_blas_saved)
        return False
