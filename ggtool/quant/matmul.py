"""``mul_mat_q8_0``: GGML's quantized dot product (Q4_0 or Q8_0 weights x Q8_0 activations).

Numerics, the documented choice, by the number M of activation rows (a function of the shapes only,
so the same inputs always give the same bits):

* M <= SMALL_M (token generation): the weight codes are expanded to float32 *unscaled* (Q4_0 as
  nibbles 0..15: bit masks on 64-bit words, then one contiguous uint8 -> float32 cast) in blocks of
  rows, and BLAS forms every per-block dot with the int8 activation codes (a batched matmul over
  the blocks).  Those are integers below 2**24, hence exact whatever BLAS's order, so ``sumi``
  (minus 8 * sum(qa) for Q4_0) is GGML's exact integer sum; then ``(sumi * dW) * dA`` is summed over
  blocks in order in float32, which is GGML's scalar reference bit for bit.
* larger M: both operands are expanded exactly to float32 (every code times its fp16 scale is
  exact in float32) and multiplied with float32 BLAS (single-threaded, in column blocks of the
  weights of a size fixed by K, ~1 MiB).  Mathematically this is GGML's sum over blocks of
  ``(float(sumi) * dW) * dA``; only the float32 rounding/accumulation order differs, which GGML's
  own SIMD kernels also change (NMSE ~1e-14 against the golden results, the bound is 5e-4).

Results are reproducible run to run and between the worker pool and one process.  ``exact=True``
always takes the per-block integer route with a plain loop (slow; for tests and audits).
"""

from __future__ import annotations

import threading

import numpy as np

from .. import types as T
from ..errors import QuantizationError
from .blocks import _F32, Q4_0_BYTES, Q8_0_BYTES, QK, _gbuf
from .q4_0 import _Q4_LUT64
from .q8_0 import dequantize_q8_0


def _mul_mat_exact(w_raw, w_type, act_raw) -> np.ndarray:
    N, M = w_raw.shape[0], act_raw.shape[0]
    wb = Q4_0_BYTES if w_type == T.Q4_0 else Q8_0_BYTES
    nb = w_raw.shape[1] // wb
    wblk = w_raw.reshape(N, nb, wb)
    dW = np.ascontiguousarray(wblk[:, :, :2]).view(np.float16).astype(_F32)[..., 0]   # (N, nb)
    if w_type == T.Q4_0:
        qs = wblk[:, :, 2:]
        cw = np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.int32) - 8               # (N, nb, 32)
    else:
        cw = wblk[:, :, 2:].view(np.int8).astype(np.int32)
    ablk = act_raw.reshape(M, nb, Q8_0_BYTES)
    dA = np.ascontiguousarray(ablk[:, :, :2]).view(np.float16).astype(_F32)[..., 0]   # (M, nb)
    qa = ablk[:, :, 2:].view(np.int8).astype(np.int32)                                  # (M, nb, 32)
    out = np.zeros((M, N), _F32)
    for b in range(nb):
        sumi = (qa[:, b, :] @ cw[:, b, :].T).astype(_F32)                               # exact ints
        out += (sumi * dW[None, :, b]) * dA[:, b, None]
    return out


SMALL_M = 4            # activation rows up to which the per-block integer route is faster
# the fp16 scale and the codes of a block, as record fields of its bytes
_W4 = np.dtype({"names": ["d", "q"], "formats": ["<u2", "V16"], "offsets": [0, 2], "itemsize": Q4_0_BYTES})
_W8 = np.dtype({"names": ["d", "q"], "formats": ["<u2", "V32"], "offsets": [0, 2], "itemsize": Q8_0_BYTES})
_LO4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_F16_LUT: np.ndarray | None = None


def _f16_values(bits: np.ndarray) -> np.ndarray:
    """float32 values of fp16 bit patterns (a table lookup: numpy's float16 cast is slow)."""
    global _F16_LUT
    if _F16_LUT is None:
        _F16_LUT = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(_F32)
    return np.take(_F16_LUT, bits.astype(np.intp), mode="clip")


def _mul_mat_small(w_raw: np.ndarray, wt, act_raw: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out (M, N) for few activation rows: exact per-block integer dots (see the module docstring).

    Q4_0 codes are laid out per row as all low nibbles then all high nibbles ("planes": element
    b*32 + h*16 + j at column h*K/2 + b*16 + j), which 64-bit masks produce without any shuffle;
    the activations are arranged to match once."""
    q4 = wt == T.Q4_0
    wv = w_raw.view(_W4 if q4 else _W8)                                  # (N, nb) records
    av = act_raw.view(_W8)                                               # (M, nb)
    (N, nb), M = wv.shape, av.shape[0]
    K = nb * QK
    dW = _f16_values(wv["d"]).T                                          # (nb, N)
    dA = _f16_values(av["d"]).T[:, None, :]                              # (nb, 1, M)
    qa = np.ascontiguousarray(av["q"]).view(np.int8).reshape(M, nb, QK)
    if q4:   # (plane, block, j, m), and GGML's -8 offset as 8 * sum(qa) per block
        A = np.ascontiguousarray(qa.reshape(M, nb, 2, 16).transpose(2, 1, 3, 0), dtype=_F32)
        off = (qa.sum(axis=2, dtype=np.int32) * 8).astype(_F32).T[:, None, :]   # (nb, 1, M)
    else:    # (block, k, m)
        A = np.ascontiguousarray(qa.transpose(1, 2, 0), dtype=_F32)
    rows = max(16, min(512, (1 << 20) // K))                             # ~4 MiB of float32 codes
    qbuf = _gbuf.get(f"mq{int(q4)}x{rows}x{nb}", (rows, nb), wv.dtype["q"])
    ubuf = _gbuf.get(f"mu{rows}x{K}", (rows, K), np.uint8)
    cbuf = _gbuf.get(f"mc{rows}x{K}", (rows, K), _F32)
    for r0 in range(0, N, rows):
        r1 = min(N, r0 + rows)
        n = r1 - r0
        qb, C = qbuf[:n], cbuf[:n]
        np.copyto(qb, wv["q"][r0:r1])                                    # the codes, contiguous
        if q4:
            q64 = qb.view(np.uint64).reshape(n, 2 * nb)
            u64 = ubuf[:n].view(np.uint64).reshape(n, 2, 2 * nb)
            np.bitwise_and(q64, _LO4, out=u64[:, 0])                     # low nibbles
            np.right_shift(q64, np.uint64(4), out=u64[:, 1])
            np.bitwise_and(u64[:, 1], _LO4, out=u64[:, 1])               # high nibbles
            np.copyto(C, ubuf[:n], casting="unsafe")                     # codes 0..15 as float32
            P = np.matmul(C.reshape(n, 2, nb, 16).transpose(1, 2, 0, 3), A)   # (2, nb, n, M), exact
            s = P[0]
            s += P[1]
            s -= off                                                     # sumi, exact
        else:
            np.copyto(C, qb.view(np.int8).reshape(n, K), casting="unsafe")
            s = np.matmul(C.reshape(n, nb, QK).transpose(1, 0, 2), A)    # (nb, n, M): sumi, exact
        s *= dW[:, r0:r1, None]
        s *= dA
        out[:, r0:r1] = _sum_blocks(s).T
    return out


def _sum_blocks(s: np.ndarray) -> np.ndarray:
    """s (nb, ...) summed over axis 0 in order, starting from +0.0, in float32 (GGML's loop).

    With more than one output numpy's reduction adds whole rows one block after the other; a
    single output would be summed pairwise, so that case accumulates explicitly."""
    if s[0].size == 1:
        return np.add.accumulate(s.reshape(-1))[-1:].reshape(s.shape[1:]) + _F32(0)
    return np.add.reduce(s, axis=0, initial=_F32(0))


def mul_mat_q8_0(w_raw, w_type, act_raw, exact: bool = False) -> np.ndarray:
    """GGML's Q4_0/Q8_0 x Q8_0 dot products: float32 (M, N), out[m, n] = row n of W . row m of A.

    w_raw: uint8 (N, row_bytes) of Q4_0 or Q8_0 rows; act_raw: uint8 (M, row_bytes) of Q8_0 rows with
    the same number of blocks.  See the module docstring for the numerics (``exact`` = scalar order).
    """
    wt = T.parse_type(w_type)
    if wt not in (T.Q4_0, T.Q8_0):
        raise QuantizationError(f"mul_mat_q8_0: weights must be q4_0 or q8_0, not {T.type_name(wt)}")
    w_raw = np.asarray(w_raw, dtype=np.uint8)
    act_raw = np.asarray(act_raw, dtype=np.uint8)
    if w_raw.ndim == 1:
        w_raw = w_raw.reshape(1, -1)
    if act_raw.ndim == 1:
        act_raw = act_raw.reshape(1, -1)
    wb = Q4_0_BYTES if wt == T.Q4_0 else Q8_0_BYTES
    if w_raw.shape[1] % wb or act_raw.shape[1] % Q8_0_BYTES or \
            w_raw.shape[1] // wb != act_raw.shape[1] // Q8_0_BYTES:
        raise QuantizationError(f"mul_mat_q8_0: weight rows of {w_raw.shape[1]} bytes ({T.type_name(wt)}) "
                                f"and activation rows of {act_raw.shape[1]} bytes (q8_0) differ in length")
    if exact:
        return _mul_mat_exact(w_raw, wt, act_raw)
    N, M = w_raw.shape[0], act_raw.shape[0]
    nb = w_raw.shape[1] // wb
    K = nb * QK
    out = np.empty((M, N), _F32)
    if N == 0 or M == 0 or K == 0:
        out[...] = 0
        return out
    if M <= SMALL_M:
        with _one_blas_thread():
            return _mul_mat_small(np.ascontiguousarray(w_raw), wt, np.ascontiguousarray(act_raw), out)
    A = dequantize_q8_0(act_raw)                            # exact float32 (M, K)
    if wt == T.Q4_0:
        # the weights are expanded with each byte's two nibbles side by side (elements j, j+16 of a
        # block); permute the activations' columns the same way (a dot product does not mind)
        A = A.reshape(M, nb, 2, 16).transpose(0, 1, 3, 2).reshape(M, K)
    A = np.ascontiguousarray(A)
    # Every sgemm has the shape (M, K) x (K, cols) with cols fixed by K alone (~1 MiB of weights,
    # at most 512 rows; the last block padded with zero rows; M > SMALL_M so it is never a gemv).
    # BLAS runs on one thread meanwhile: OpenBLAS's multi-threaded sgemm may sum in another order.
    cols = max(8, min(512, (1 << 20) // (4 * K)))
    buf = _gbuf.get(f"mm{cols}x{K}", (cols, K), _F32)
    with _one_blas_thread():
        for n0 in range(0, N, cols):
            n1 = min(N, n0 + cols)
            if n1 - n0 < cols:
                buf[n1 - n0:] = 0
            _expand_weights(w_raw[n0:n1], wt, buf[:n1 - n0])   # exact float32
            out[:, n0:n1] = (A @ buf.T)[:M, :n1 - n0]
    return out


_blas_lock = threading.Lock()
_blas_users = 0
_blas_saved: int | None = None


class _one_blas_thread:
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


def _expand_weights(w_rows: np.ndarray, wt, W: np.ndarray) -> None:
    """float32 values of Q4_0 (nibble pairs side by side) or Q8_0 (element order) rows into W."""
    if wt == T.Q4_0:
        blocks = w_rows.reshape(-1, Q4_0_BYTES)
        d = np.ascontiguousarray(blocks[:, :2]).view(np.float16).astype(_F32)       # (n, 1)
        np.take(_Q4_LUT64, blocks[:, 2:], out=W.view(np.uint64).reshape(-1, 16), mode="clip")
    else:
        blocks = w_rows.reshape(-1, Q8_0_BYTES)
        d = np.ascontiguousarray(blocks[:, :2]).view(np.float16).astype(_F32)
        np.copyto(W.reshape(-1, QK), blocks[:, 2:].view(np.int8), casting="unsafe")
    W2 = W.reshape(-1, QK)
    np.multiply(W2, d, out=W2)
