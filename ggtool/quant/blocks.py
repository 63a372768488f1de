"""Block-format plumbing shared by the Q4_0/Q8_0 (and other) kernels: input checks, NaN/inf
reporting, and the chunked quantize/dequantize drivers that run a per-chunk kernel (compiled, from
``ggtool.kernels.quantize``) over an array on the quantizer threads."""

from __future__ import annotations

import numpy as np

from ..errors import QuantizationError
from .threads import _run_chunks

QK = 32                       # elements per Q4_0 / Q8_0 block
Q4_0_BYTES = 18
Q8_0_BYTES = 34
CHUNK_BLOCKS = 8192           # blocks per work item: 1 MiB of f32 input, about the L2 size
_F32 = np.float32


def kernel(kind: str, name: str, values: int = 0):
    """The compiled kernel `name` (``ggtool.kernels.quantize``), or its
    numpy twin of the same name (``kernels.twins``, the same bytes) while the quantizer `kind` is
    not compiled in the command line's cache and the work (`values` to quantize) is small
    (``compiling.first_run``)."""
    from ..compiling import first_run
    if not first_run.use_compiled(f"quantize:{kind}", first_run.quantize_seconds(values)):
        from ..kernels import twins
        return getattr(twins, name)
    from ..kernels import quantize
    return getattr(quantize, name)


def dequantizer(raw, nbytes: int, name: str):
    """Q4_0/Q8_0's dequantizer `name` for raw: its numpy twin for at most SMALL_BLOCKS blocks
    (without loading numba), else the compiled kernel."""
    from ..kernels import twins
    if np.asarray(raw).nbytes // nbytes <= twins.SMALL_BLOCKS:
        return getattr(twins, name)
    from ..kernels import quantize
    return getattr(quantize, name)


def _as_f32_rows(x, name: str, what: str, qk: int = QK) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim == 0:
        x = x.reshape(1)
    if x.shape[-1] % qk:
        raise QuantizationError(f"tensor '{name}': row length {x.shape[-1]} is not a multiple of "
                                f"{qk} ({what} block size)")
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


def _chunk_f32(flat: np.ndarray, b0: int, b1: int, qk: int = QK) -> np.ndarray:
    xb = flat[b0 * qk:b1 * qk]
    if xb.dtype != _F32 or not xb.flags.aligned:     # the kernels take aligned native float32
        xb = xb.astype(_F32)
    return xb.reshape(-1, qk)


def _quantize_blocks(x, name: str, what: str, nbytes: int, kernel, qk: int = QK) -> np.ndarray:
    """kernel(xb (n, qk) float32, out (n, nbytes) uint8) -> -1 or the flat index in xb of its
    first NaN/inf, run over chunks of x; raises QuantizationError for the first NaN/inf of x."""
    x = _as_f32_rows(x, name, what, qk)
    nblocks = x.size // qk
    out = np.empty((nblocks, nbytes), np.uint8)
    flat = x.reshape(-1)
    bad: list[int] = []

    def work(b0, b1):
        xb = _chunk_f32(flat, b0, b1, qk)
        r = kernel(xb, out[b0:b1])
        if r >= 0:
            bad.append(b0 * qk + r)

    _run_chunks(work, nblocks, max(1, CHUNK_BLOCKS * QK // qk))
    if bad:
        raise _bad_value_error(x, min(bad), name)
    return out.reshape(*x.shape[:-1], x.shape[-1] // qk * nbytes)


def _quantize_weighted(x, name: str, what: str, nbytes: int, kernel, qk: int, weights) -> np.ndarray:
    """kernel(xb (n, qk) float32 of whole rows, out (n, nbytes) uint8, qw (blocks per row, qk)
    float32) -> -1 or the flat index of xb's first NaN/inf, run over chunks of x's rows with
    `weights`, one importance per column (ggml_quantize_chunk's imatrix, x.shape[-1] values)."""
    x = _as_f32_rows(x, name, what, qk)
    n = x.shape[-1]
    qw = np.asarray(weights)
    if qw.shape != (n,):
        raise QuantizationError(f"tensor '{name}': the importance matrix has {qw.size} values for "
                                f"rows of {n}")
    qw = np.ascontiguousarray(qw, _F32)
    if not np.isfinite(qw).all():
        raise QuantizationError(f"tensor '{name}': the importance matrix holds NaN or inf "
                                f"(column {int(np.argmin(np.isfinite(qw)))})")
    qw = qw.reshape(-1, qk)
    nbpr = n // qk
    nrows = x.size // n if n else 0
    out = np.empty((nrows * nbpr, nbytes), np.uint8)
    flat = x.reshape(-1)
    bad: list[int] = []

    def work(r0, r1):
        xb = _chunk_f32(flat, r0 * nbpr, r1 * nbpr, qk)
        r = kernel(xb, out[r0 * nbpr:r1 * nbpr], qw)
        if r >= 0:
            bad.append(r0 * n + r)

    _run_chunks(work, nrows, max(1, CHUNK_BLOCKS * QK // max(n, 1)))
    if bad:
        raise _bad_value_error(x, min(bad), name)
    return out.reshape(*x.shape[:-1], nbpr * nbytes)


def _raw_blocks(raw, nbytes: int, what: str) -> np.ndarray:
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    if raw.ndim == 0 or raw.shape[-1] % nbytes:
        raise QuantizationError(f"{what} data has rows of {raw.shape[-1] if raw.ndim else 0} bytes, "
                                f"not a multiple of the {nbytes}-byte block")
    return raw


def _dequantize_blocks(raw, nbytes: int, what: str, kernel, nval: int = QK) -> np.ndarray:
    """kernel(blocks (n, nbytes) uint8, out (n, nval) float32) run over chunks of raw (about
    CHUNK_BLOCKS * 32 values each)."""
    raw = _raw_blocks(raw, nbytes, what)
    shape = (*raw.shape[:-1], raw.shape[-1] // nbytes * nval)
    blocks = np.ascontiguousarray(raw).reshape(-1, nbytes)
    out = np.empty((blocks.shape[0], nval), _F32)

    def work(b0, b1):
        kernel(blocks[b0:b1], out[b0:b1])

    _run_chunks(work, blocks.shape[0], max(1, CHUNK_BLOCKS * QK // nval))
    return out.reshape(shape)
