"""GGML's Q4_0 / Q8_0 / F16 arithmetic in vectorised numpy, byte-exact with the C library.

Everything is float32 exactly as GGML computes it (spec sections 1-2, golden q4_0/q8_0/f16.npz):

* ``fp32_to_fp16``: round to nearest even, overflow to +-inf, subnormals kept, NaN -> 0x7e00 | sign.
* Q4_0 (``quantize_row_q4_0_ref``): the signed value of largest magnitude (first one on ties, and
  +0.0 for a block of +-0.0) gives ``d = max / -8``, ``id = 1/d`` from the unrounded d,
  ``code = min(15, trunc(x*id + 8.5))``, nibbles split-half (element j low, j+16 high).
* Q8_0 reference (``quantize_row_q8_0_ref``): ``d = amax/127``, ``id = 1/d``, ``roundf`` (half away
  from zero).  Q8_0 CPU (``quantize_q8_0_cpu``, the x86 AVX2 ``from_float`` mul_mat uses for its
  activations): ``id = 127/amax``, round half to even.

Large arrays are processed in cache-sized chunks of blocks, spread over a few threads (numpy
releases the GIL inside its loops), never as one giant temporary.  Data to quantize that holds NaN
or +-inf raises QuantizationError naming the tensor and the first bad index in numpy order.

``mul_mat_q8_0`` computes GGML's quantized dot product (Q4_0 or Q8_0 weights x Q8_0 activations).
Numerics, the documented choice: both operands are expanded exactly to float32 (every code times
its fp16 scale is exact in float32) and multiplied with float32 BLAS (single-threaded, in column
blocks of the weights of a size fixed by K, ~1 MiB).  Mathematically this is GGML's sum over blocks
of ``(float(sumi) * dW) * dA``; only the float32 rounding/accumulation order differs, which GGML's
own SIMD kernels also change (NMSE ~1e-14 against the golden results, the bound is 5e-4).  Results
are reproducible run to run and between the worker pool and one process; like the f32 mul_mat's
BLAS they may differ in the last bits between different (ith, nth) splits of a mul_mat.
``exact=True`` instead forms every per-block integer sum exactly and accumulates ``(sumi*dW)*dA``
over blocks in order in float32, i.e. GGML's scalar reference bit for bit and independent of any
split (slow; for tests and audits).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import types as T
from .errors import QuantizationError

QK = 32                       # elements per Q4_0 / Q8_0 block
Q4_0_BYTES = 18
Q8_0_BYTES = 34
CHUNK_BLOCKS = 8192           # blocks per work item: 1 MiB of f32 input, about the L2 size
_F32 = np.float32

__all__ = [
    "can_dequantize",
    "can_quantize",
    "check_finite",
    "convert",
    "dequantize",
    "dequantize_q4_0",
    "dequantize_q8_0",
    "fp16_to_fp32",
    "fp32_to_fp16",
    "get_threads",
    "mul_mat_q8_0",
    "quantize",
    "quantize_q4_0",
    "quantize_q8_0",
    "quantize_q8_0_cpu",
    "set_threads",
]

# ---------------------------------------------------------------------------------------------
# threads

_threads: int | None = None
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def set_threads(n: int | None) -> None:
    """Threads used by the array-level functions here (None: GGTOOL_QUANT_THREADS or cpu count)."""
    global _threads
    _threads = None if n is None else max(1, int(n))


def get_threads() -> int:
    if _threads is not None:
        return _threads
    env = os.environ.get("GGTOOL_QUANT_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, min(os.cpu_count() or 1, 8))


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ggtool-quant")
        return _executor


_tls = threading.local()
_CALLER_REDUCEAT = False   # measured: no gain when the caller holds the GIL in reduceat


def _run_chunks(fn, n_items: int, chunk: int) -> None:
    """Call fn(start, stop) over [0, n_items) in pieces of `chunk`, on up to get_threads() threads.

    Chunks are handed out dynamically. The calling thread uses the GIL-holding but faster
    ufunc.reduceat for per-block max/min; helper threads use GIL-free folds (see _row_max_min)."""
    starts = list(range(0, n_items, chunk))
    nt = min(get_threads(), len(starts))
    if nt <= 1:
        for s in starts:
            fn(s, min(s + chunk, n_items))
        return
    it = iter(starts)
    lock = threading.Lock()
    stop = []

    def run(solo: bool):
        _tls.solo = solo and _CALLER_REDUCEAT
        try:
            while not stop:
                with lock:
                    s = next(it, None)
                if s is None:
                    return
                fn(s, min(s + chunk, n_items))
        except BaseException:
            stop.append(1)
            raise
        finally:
            _tls.solo = None

    futures = [_pool().submit(run, False) for _ in range(nt - 1)]
    err = None
    try:
        run(True)
    except BaseException as e:  # noqa: BLE001 - re-raised below after the others finished
        err = e
    for f in futures:
        try:
            f.result()
        except BaseException as e:  # noqa: BLE001
            err = err or e
    if err is not None:
        raise err


# ---------------------------------------------------------------------------------------------
# fp16


def fp32_to_fp16(x) -> np.ndarray:
    """GGML_FP32_TO_FP16 elementwise: float16 array (RNE; NaN -> 0x7e00 with the input's sign)."""
    x = np.asarray(x, dtype=_F32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16)
    nan = np.isnan(x)
    if nan.any():
        bits = h.view(np.uint16)
        sign = (x.view(np.uint32)[nan] >> 16).astype(np.uint16) & np.uint16(0x8000)
        bits[nan] = np.uint16(0x7E00) | sign
    return h


def fp16_to_fp32(h) -> np.ndarray:
    """GGML_FP16_TO_FP32 (exact). Accepts float16 values or their uint16 bits."""
    h = np.asarray(h)
    if h.dtype == np.uint16:
        h = h.view(np.float16)
    return h.astype(_F32)


# ---------------------------------------------------------------------------------------------
# helpers


def _as_f32_rows(x, name: str, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim == 0:
        x = x.reshape(1)
    if x.shape[-1] % QK:
        raise QuantizationError(f"tensor '{name}': row length {x.shape[-1]} is not a multiple of "
                                f"{QK} ({what} block size)")
    if x.dtype.kind not in "fiub":
        raise QuantizationError(f"tensor '{name}': cannot quantize {x.dtype} data")
    return x


def _bad_value_error(x: np.ndarray, flat_index: int, name: str) -> QuantizationError:
    idx = np.unravel_index(int(flat_index), x.shape)
    idx = tuple(int(i) for i in idx)
    v = x.reshape(-1)[flat_index]
    what = "NaN" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    where = str(idx) if len(idx) != 1 else f"({idx[0]},)"
    return QuantizationError(f"tensor '{name}': cannot quantize {what} at index {where}")


def check_finite(x: np.ndarray, name: str = "tensor") -> None:
    """QuantizationError for the first NaN/inf of x (numpy order), if any."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        return
    flat = x.reshape(-1)
    step = 1 << 20
    for s in range(0, flat.size, step):
        part = flat[s:s + step]
        if not np.isfinite(part).all():
            raise _bad_value_error(x, s + int(np.argmin(np.isfinite(part))), name)


def _fold(op, xb: np.ndarray, bufs) -> np.ndarray:
    """Per-row reduction of (n, 32) with elementwise ops on strided views. Unlike ufunc.reduceat
    (faster on one thread) these release the GIL, so several threads can run them at once."""
    n = xb.shape[0]
    b16 = bufs[0][:n * 16].reshape(n, 16)
    op(xb[:, :16], xb[:, 16:], out=b16)
    a = b16.reshape(-1)
    for buf in bufs[1:]:
        m = a.size // 2
        out = buf[:m]
        a2 = a.reshape(m, 2)
        op(a2[:, 0], a2[:, 1], out=out)
        a = out
    return a


def _row_max_min(xb: np.ndarray, s, want_min: bool = True):
    """Per-block max (and min) of (n, 32) float32 blocks; NaN propagates."""
    n = xb.shape[0]
    solo = getattr(_tls, "solo", None)
    if solo or (solo is None and get_threads() == 1):
        flat = xb.reshape(-1)
        mx = np.maximum.reduceat(flat, s.starts[:n], out=s.mx[:n])
        mn = np.minimum.reduceat(flat, s.starts[:n], out=s.mn[:n]) if want_min else None
        return mx, mn
    mx = s.mx[:n]
    mx[...] = _fold(np.maximum, xb, s.f1)
    if not want_min:
        return mx, None
    mn = s.mn[:n]
    mn[...] = _fold(np.minimum, xb, s.f2)
    return mx, mn


class _Scratch(threading.local):
    """Per-thread scratch buffers for one chunk (reused across calls, no big temporaries)."""

    def get(self, nblk: int):
        cur = getattr(self, "n", 0)
        if cur < nblk:
            self.n = nblk
            self.v = np.empty((nblk, QK), _F32)
            self.q = np.empty((nblk, QK), np.uint8)
            self.c15 = np.full((nblk, QK), 15, np.uint8)
            self.h64 = np.empty((nblk, 2), np.uint64)
            self.starts = np.arange(0, nblk * QK, QK, dtype=np.intp)
            self.f1 = [np.empty(nblk * k, _F32) for k in (16, 8, 4, 2, 1)]
            self.f2 = [np.empty(nblk * k, _F32) for k in (16, 8, 4, 2, 1)]
            self.mx, self.mn, self.t1, self.d, self.id = (np.empty(nblk, _F32) for _ in range(5))
            self.b1, self.b2 = np.empty(nblk, bool), np.empty(nblk, bool)
        return self


_scratch = _Scratch()


def _chunk_f32(flat: np.ndarray, b0: int, b1: int) -> np.ndarray:
    xb = flat[b0 * QK:b1 * QK]
    if xb.dtype != _F32:
        xb = xb.astype(_F32)
    return xb.reshape(-1, QK)


# ---------------------------------------------------------------------------------------------
# Q4_0


def _q4_0_blocks(xb: np.ndarray, out: np.ndarray, s) -> int:
    """Quantize (n, 32) float32 blocks into out (n, 18). Returns -1, or the flat index of a NaN/inf."""
    n = xb.shape[0]
    flat = xb.reshape(-1)
    mx, mn = _row_max_min(xb, s)                              # NaN propagates, inf shows
    neg = np.negative(mn, out=s.t1[:n])
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(mx).all() and np.isfinite(neg).all()
    if not ok:
        bad = ~np.isfinite(flat)
        return int(np.argmax(bad))
    # signed value of largest magnitude; ties in magnitude between +a and -a: the first one wins
    tie = np.equal(neg, mx, out=s.b2[:n])
    m = mx
    np.copyto(m, mn, where=np.greater(neg, mx, out=s.b1[:n]))
    m += _F32(0.0)  # a block of +-0.0 has max +0.0 (GGML's scan starts at +0 and keeps it)
    if tie.any():
        tie = np.flatnonzero(tie & (m != 0))
        if tie.size:
            sub = xb[tie]
            j = np.argmax(np.abs(sub), axis=1)
            m[tie] = sub[np.arange(tie.size), j]
    d = np.multiply(m, _F32(-0.125), out=s.d[:n])              # == m / -8 exactly
    with np.errstate(divide="ignore", over="ignore"):
        idv = np.divide(_F32(1.0), d, out=s.id[:n])
    np.copyto(idv, _F32(0.0), where=(d == 0))
    v = s.v[:n]
    np.multiply(xb, idv[:, None], out=v)
    np.add(v, _F32(8.5), out=v)
    q = s.q[:n]
    with np.errstate(invalid="ignore", over="ignore"):
        np.copyto(q, v, casting="unsafe")        # trunc toward zero; v is in [0, 16.5]
    inf_id = np.flatnonzero(~np.isfinite(idv))
    if inf_id.size:                              # 1/d overflowed (fp32-subnormal block): x86 gives 0
        q[inf_id] = 0
    np.minimum(q, s.c15[:n], out=q)             # (an array operand: numpy's scalar path is slow)
    # pack: codes are <= 15, so shifting whole 64-bit words by 4 moves each code into its own
    # byte's high nibble; words 0-1 of a block hold elements 0..15, words 2-3 elements 16..31
    q64 = q.view(np.uint64)
    hi = s.h64[:n]
    np.left_shift(q64[:, 2:], np.uint64(4), out=hi)
    np.bitwise_or(hi, q64[:, :2], out=hi)
    out[:, 2:] = hi.view(np.uint8)
    with np.errstate(over="ignore"):
        out.view(np.uint16)[:, 0] = d.astype(np.float16).view(np.uint16)   # d is not NaN here
    return -1


def _quantize_blocks(x, name: str, what: str, nbytes: int, kernel) -> np.ndarray:
    x = _as_f32_rows(x, name, what)
    nblocks = x.size // QK
    out = np.empty((nblocks, nbytes), np.uint8)
    flat = x.reshape(-1)
    bad: list[int] = []

    def work(b0, b1):
        xb = _chunk_f32(flat, b0, b1)
        r = kernel(xb, out[b0:b1], _scratch.get(b1 - b0))
        if r >= 0:
            bad.append(b0 * QK + r)

    _run_chunks(work, nblocks, CHUNK_BLOCKS)
    if bad:
        raise _bad_value_error(x, min(bad), name)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK * nbytes)


def quantize_q4_0(x, name: str = "tensor") -> np.ndarray:
    """Q4_0 bytes of x: uint8 of shape (*x.shape[:-1], x.shape[-1] // 32 * 18)."""
    return _quantize_blocks(x, name, "Q4_0", Q4_0_BYTES, _q4_0_blocks)


def _scales(raw: np.ndarray, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    blocks = raw.reshape(-1, nbytes)
    d = np.ascontiguousarray(blocks[:, :2]).view(np.float16).astype(_F32)  # (n, 1)
    return blocks, d


# byte -> (lo - 8, hi - 8) as two float32 side by side
_Q4_LUT = np.stack([(np.arange(256) & 15) - 8, (np.arange(256) >> 4) - 8], axis=1).astype(_F32)
_Q4_LUT64 = _Q4_LUT.view(np.uint64).reshape(256)


def _dq4_0_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    d = np.ascontiguousarray(blocks[:, :2]).view(np.float16).astype(_F32)   # (n, 1)
    pairs = _gather(_Q4_LUT64, blocks[:, 2:]).view(_F32).reshape(n, 16, 2)  # [j] = (lo_j-8, hi_j-8)
    np.multiply(pairs.transpose(0, 2, 1), d[:, :, None], out=out.reshape(n, 2, 16))


class _GatherBuf(threading.local):
    def get(self, name: str, shape, dtype) -> np.ndarray:
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        buf = getattr(self, name, None)
        if buf is None or buf.size < size:
            buf = np.empty(size, np.uint8)
            setattr(self, name, buf)
        return buf[:size].view(dtype).reshape(shape)


_gbuf = _GatherBuf()


def _gather(lut: np.ndarray, idx: np.ndarray, slot: str = "g0") -> np.ndarray:
    """lut[idx] into a reused per-thread buffer (np.take with out= and mode="clip" is ~10x faster
    than fancy indexing or mode="raise"; idx are bytes, always in range)."""
    out = _gbuf.get(slot, idx.shape, lut.dtype)
    np.take(lut, idx, out=out, mode="clip")
    return out


def _raw_blocks(raw, nbytes: int, what: str) -> np.ndarray:
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    if raw.ndim == 0 or raw.shape[-1] % nbytes:
        raise QuantizationError(f"{what} data has rows of {raw.shape[-1] if raw.ndim else 0} bytes, "
                                f"not a multiple of the {nbytes}-byte block")
    return raw


def _dequantize_blocks(raw, nbytes: int, what: str, kernel) -> np.ndarray:
    raw = _raw_blocks(raw, nbytes, what)
    shape = (*raw.shape[:-1], raw.shape[-1] // nbytes * QK)
    blocks = np.ascontiguousarray(raw).reshape(-1, nbytes)
    out = np.empty((blocks.shape[0], QK), _F32)

    def work(b0, b1):
        kernel(blocks[b0:b1], out[b0:b1])

    _run_chunks(work, blocks.shape[0], CHUNK_BLOCKS)
    return out.reshape(shape)


def dequantize_q4_0(raw) -> np.ndarray:
    """float32 values of Q4_0 bytes (rows of 18-byte blocks): shape (..., row_bytes/18*32)."""
    return _dequantize_blocks(raw, Q4_0_BYTES, "Q4_0", _dq4_0_blocks)


# ---------------------------------------------------------------------------------------------
# Q8_0


def _amax(xb: np.ndarray, s) -> np.ndarray:
    a = s.v[:xb.shape[0]]
    np.abs(xb, out=a)
    return _row_max_min(a, s, want_min=False)[0]


def _q8_0_blocks(xb: np.ndarray, out: np.ndarray, s, cpu: bool) -> int:
    n = xb.shape[0]
    amax = _amax(xb, s)
    if not np.isfinite(amax).all():
        return int(np.argmax(~np.isfinite(xb.reshape(-1))))
    d = np.divide(amax, _F32(127.0))
    with np.errstate(divide="ignore", over="ignore"):
        if cpu:
            idv = np.divide(_F32(127.0), amax)
            idv[amax == 0] = 0
        else:
            idv = np.divide(_F32(1.0), d)
            idv[d == 0] = 0
    v = s.v[:n]
    np.multiply(xb, idv[:, None], out=v)
    inf_id = np.flatnonzero(~np.isfinite(idv))
    with np.errstate(invalid="ignore", over="ignore"):
        if cpu:
            np.rint(v, out=v)                      # _mm256_round_ps(NEAREST): half to even
        else:                                      # roundf: half away from zero, exactly
            t = np.trunc(v)
            f = np.subtract(v, t)                  # exact
            np.add(f, f, out=f)
            np.trunc(f, out=f)                     # +-1 where |frac| >= 0.5
            np.add(t, f, out=v)
        q = out[:, 2:].view(np.int8)
        np.copyto(q, v, casting="unsafe")
    out.view(np.uint16)[:, 0] = fp32_to_fp16(d).view(np.uint16)
    if inf_id.size:   # id overflowed (fp32-subnormal amax): x86 gives 0 (ref) or -128 (AVX2 packs)
        sub = q[inf_id]
        sub[~np.isfinite(v[inf_id])] = -128 if cpu else 0
        q[inf_id] = sub
    return -1


def quantize_q8_0(x, name: str = "tensor") -> np.ndarray:
    """Reference Q8_0 bytes (quantize_row_q8_0_ref: roundf), shape (..., row/32*34)."""
    return _quantize_blocks(x, name, "Q8_0", Q8_0_BYTES, lambda xb, o, s: _q8_0_blocks(xb, o, s, False))


def quantize_q8_0_cpu(x, name: str = "tensor") -> np.ndarray:
    """Q8_0 bytes as the x86 AVX2 CPU from_float makes them for mul_mat (id=127/amax, ties even)."""
    return _quantize_blocks(x, name, "Q8_0", Q8_0_BYTES, lambda xb, o, s: _q8_0_blocks(xb, o, s, True))


def _dq8_0_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    d = np.ascontiguousarray(blocks[:, :2]).view(np.float16).astype(_F32)
    np.multiply(blocks[:, 2:].view(np.int8), d, out=out)


def dequantize_q8_0(raw) -> np.ndarray:
    """float32 values of Q8_0 bytes (rows of 34-byte blocks): shape (..., row_bytes/34*32)."""
    return _dequantize_blocks(raw, Q8_0_BYTES, "Q8_0", _dq8_0_blocks)


# ---------------------------------------------------------------------------------------------
# other block types, dequantized natively with gguf-py's float32 arithmetic (bit-identical)

_NIB_LUT64 = np.stack([np.arange(256) & 15, np.arange(256) >> 4], axis=1).astype(_F32).view(np.uint64).reshape(256)
# byte -> its four 2-bit fields (shifts 0, 2, 4, 6) times 16, as float32
_Q6H_LUT = (((np.arange(256)[:, None] >> np.array([0, 2, 4, 6])) & 3) * 16).astype(_F32)
_Q6H_LUT128 = _Q6H_LUT.view(np.complex128).reshape(256)      # 16 bytes per entry, for a 1-D take


def _f16(col: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(col).view(np.float16).astype(_F32)


def _dq5_0_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    """Q5_0 (22 bytes: d, qh u32, qs[16]): x = (nibble | bit<<4) - 16, times d (all exact)."""
    n = blocks.shape[0]
    d = _f16(blocks[:, :2])                                              # (n, 1)
    bits = np.unpackbits(blocks[:, 2:6], axis=1, bitorder="little")     # (n, 32): element j's bit
    pairs = _gather(_NIB_LUT64, blocks[:, 6:]).view(_F32).reshape(n, 16, 2)   # (lo, hi) nibbles
    o3 = out.reshape(n, 2, 16)
    np.multiply(bits.reshape(n, 2, 16), _F32(16), out=o3)
    np.add(o3, pairs.transpose(0, 2, 1), out=o3)
    np.subtract(out, _F32(16), out=out)
    np.multiply(out, d, out=out)


def _dq4_k_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    """Q4_K (144 bytes): x = (d*sc) * q - (dmin*m) in float32, as gguf-py."""
    from gguf.quants import Q4_K as _G
    n = blocks.shape[0]
    d = _f16(blocks[:, 0:2])
    dmin = _f16(blocks[:, 2:4])
    sc, m = _G.get_scale_min(blocks[:, 4:16])
    a = (d * sc.astype(_F32))[:, :, None]                               # (n, 8, 1)
    b = (dmin * m.astype(_F32))[:, :, None]
    pairs = _gather(_NIB_LUT64, blocks[:, 16:]).view(_F32).reshape(n, 4, 32, 2)
    o3 = out.reshape(n, 4, 2, 32)
    np.multiply(pairs.transpose(0, 1, 3, 2), a.reshape(n, 4, 2, 1), out=o3)
    np.subtract(o3, b.reshape(n, 4, 2, 1), out=o3)


def _dq6_k_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    """Q6_K (210 bytes): x = (d*scale) * (ql | qh<<4 - 32) in float32, as gguf-py."""
    n = blocks.shape[0]
    scales = blocks[:, 192:208].view(np.int8).astype(_F32)
    d = _f16(blocks[:, 208:210])
    ds = (d * scales)                                                    # (n, 16)
    lo = _gather(_NIB_LUT64, blocks[:, :128]).view(_F32).reshape(n, 2, 64, 2)        # ql nibbles
    hi = _gather(_Q6H_LUT128, blocks[:, 128:192], "g1").view(_F32).reshape(n, 2, 32, 4)  # qh * 16
    o = out.reshape(n, 2, 2, 64)
    np.copyto(o, lo.transpose(0, 1, 3, 2))
    oh = out.reshape(n, 2, 4, 32)
    np.add(oh, hi.transpose(0, 1, 3, 2), out=oh)
    np.subtract(out, _F32(32), out=out)
    o16 = out.reshape(n, 16, 16)
    np.multiply(o16, ds[:, :, None], out=o16)


_NATIVE_DQ = {  # type -> (bytes per block, values per block, kernel)
    T.GGMLType.Q5_0: (22, 32, _dq5_0_blocks),
    T.GGMLType.Q4_K: (144, 256, _dq4_k_blocks),
    T.GGMLType.Q6_K: (210, 256, _dq6_k_blocks),
}


def _dequantize_native(raw, t) -> np.ndarray:
    nbytes, nval, kernel = _NATIVE_DQ[t]
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    if raw.ndim == 0 or raw.shape[-1] % nbytes:
        raise QuantizationError(f"{T.type_name(t)} data has rows of {raw.shape[-1] if raw.ndim else 0} bytes, "
                                f"not a multiple of the {nbytes}-byte block")
    shape = (*raw.shape[:-1], raw.shape[-1] // nbytes * nval)
    blocks = np.ascontiguousarray(raw).reshape(-1, nbytes)
    out = np.empty((blocks.shape[0], nval), _F32)
    step = max(1, CHUNK_BLOCKS * QK // nval)

    def work(b0, b1):
        with np.errstate(all="ignore"):
            kernel(blocks[b0:b1], out[b0:b1])

    _run_chunks(work, blocks.shape[0], step)
    return out.reshape(shape)


# ---------------------------------------------------------------------------------------------
# generic


def _gguf_quants():
    import gguf.quants as gq
    return gq


def can_quantize(t) -> bool:
    """Whether quantize() can produce type t (natively or through gguf-py)."""
    t = T.parse_type(t)
    if t in (T.F32, T.F16, T.Q4_0, T.Q8_0):
        return True
    gq = _gguf_quants()
    q = gq._type_traits.get(t)
    return q is not None and "quantize_blocks" in _own_methods(q)


def can_dequantize(t) -> bool:
    t = T.parse_type(t)
    if t in T._NP_DTYPES or t in (T.Q4_0, T.Q8_0, T.GGMLType.BF16):
        return True
    return t in _gguf_quants()._type_traits


def _own_methods(cls) -> set[str]:
    names = set()
    for c in cls.__mro__:
        if c.__name__.endswith("__Quant") or c is object:
            break
        names |= set(vars(c))
    return names


def quantize(x, ggml_type, name: str = "tensor") -> np.ndarray:
    """x (float values, numpy order) in ggml_type: a typed array for F32/F16/I32, bytes otherwise."""
    t = T.parse_type(ggml_type)
    if t == T.Q4_0:
        return quantize_q4_0(x, name)
    if t == T.Q8_0:
        return quantize_q8_0(x, name)
    x = np.asarray(x)
    if t == T.F32:
        return x.astype(_F32)
    if t == T.F16:
        return fp32_to_fp16(x)
    if t in T._NP_DTYPES:
        return _to_int(x, t, name)
    if not can_quantize(t):
        raise QuantizationError(f"tensor '{name}': cannot quantize to {T.type_name(t)} (not implemented)")
    blk = T.block_size(t)
    if x.ndim == 0 or x.shape[-1] % blk:
        n = x.shape[-1] if x.ndim else 1
        raise QuantizationError(f"tensor '{name}': row length {n} is not a multiple of {blk} "
                                f"({T.type_name(t)} block size)")
    check_finite(x, name)
    return np.asarray(_gguf_quants().quantize(x.astype(_F32, copy=False), t))


def dequantize(raw, ggml_type) -> np.ndarray:
    """float32 values of data stored as ggml_type (bytes (..., row_bytes) for block types)."""
    t = T.parse_type(ggml_type)
    if t == T.Q4_0:
        return dequantize_q4_0(raw)
    if t == T.Q8_0:
        return dequantize_q8_0(raw)
    raw = np.asarray(raw)
    if t in T._NP_DTYPES:
        dt = T.np_dtype(t)
        if raw.dtype != dt:
            raw = raw.view(dt) if raw.dtype == np.uint8 else raw.astype(dt)
        return raw.astype(_F32)
    if t in _NATIVE_DQ:
        return _dequantize_native(raw, t)
    if t == T.GGMLType.BF16 and raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    try:
        out = _gguf_quants().dequantize(np.ascontiguousarray(raw), t)
    except NotImplementedError:
        raise QuantizationError(f"cannot dequantize {T.type_name(t)} data (gguf-py has no "
                                f"dequantizer for it)") from None
    return np.asarray(out, dtype=_F32)


def _to_int(x: np.ndarray, t, name: str) -> np.ndarray:
    dt = T.np_dtype(t)
    if x.dtype.kind in "iub":
        info = np.iinfo(dt)
        if x.size and (x.min() < info.min or x.max() > info.max):
            bad = np.flatnonzero((x.reshape(-1) < info.min) | (x.reshape(-1) > info.max))[0]
            idx = tuple(int(i) for i in np.unravel_index(bad, x.shape))
            raise QuantizationError(f"tensor '{name}': value {x.reshape(-1)[bad]} at index {idx} "
                                    f"does not fit {T.type_name(t)}")
        return x.astype(dt)
    check_finite(x, name)
    info = np.iinfo(dt)
    flat = x.reshape(-1)
    badm = (flat != np.trunc(flat)) | (flat < info.min) | (flat > info.max)
    if badm.any():
        bad = int(np.argmax(badm))
        idx = tuple(int(i) for i in np.unravel_index(bad, x.shape))
        raise QuantizationError(f"tensor '{name}': value {flat[bad]!r} at index {idx} is not "
                                f"a {T.type_name(t)} integer")
    return x.astype(dt)


def convert(array, src_type, dst_type, name: str = "tensor") -> np.ndarray:
    """Typed conversion of `array` (data stored as src_type) to dst_type.

    Quantized data is uint8 bytes (..., row_bytes); other types are numpy arrays of their dtype.
    The result is bytes (..., row_bytes) for quantized dst types, else an array of dst's dtype.
    """
    src, dst = T.parse_type(src_type), T.parse_type(dst_type)
    a = np.asarray(array)
    if src == dst:
        if T.is_quantized(src) or src == T.GGMLType.BF16:
            return a if a.dtype == np.uint8 else a.view(np.uint8)
        return a.astype(T.np_dtype(src), copy=False)
    if src in T._NP_DTYPES and dst in T._NP_DTYPES and T.np_dtype(dst).kind in "iu":
        return _to_int(a.astype(T.np_dtype(src), copy=False), dst, name)
    if src in T._NP_DTYPES and T.np_dtype(src).kind in "iu":
        vals = a.astype(T.np_dtype(src), copy=False).astype(_F32)
    else:
        vals = dequantize(a, src)
    return quantize(vals, dst, name)


# ---------------------------------------------------------------------------------------------
# quantized dot product


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
    A = dequantize_q8_0(act_raw)                            # exact float32 (M, K)
    if wt == T.Q4_0:
        # the weights are expanded with each byte's two nibbles side by side (elements j, j+16 of a
        # block); permute the activations' columns the same way (a dot product does not mind)
        A = A.reshape(M, nb, 2, 16).transpose(0, 1, 3, 2).reshape(M, K)
    if M == 1:                                              # keep BLAS on its gemm path (not gemv)
        A = np.concatenate([A, np.zeros((1, K), _F32)])
    A = np.ascontiguousarray(A)
    # Every sgemm has the shape (M', K) x (K, cols) with cols fixed by K alone (~1 MiB of weights,
    # at most 512 rows; the last block padded with zero rows, M' >= 2 so it is never a gemv).
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
        from . import blas
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
        from . import blas
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
