"""How GGML kernels walk memory, as numpy views: GGML's row walks, its thread slices and
writes in logical (linear) order. Shared by the family modules; no op lives here."""

from __future__ import annotations

import math

import numpy as np

from .. import types as T
from ..errors import GGToolError
from ..tensor import Tensor


# Kernels evaluate their numpy expressions over rows this many bytes at a time (at least one row):
# each expression makes temporaries of its operands' size, so a kernel over a whole tensor would
# hold several copies of it at once (a 128 MiB soft_max peaked at 4x its size); in chunks its
# temporaries stay small, and peak memory follows the planned buffers. Rows are computed
# independently, so chunking changes no result (as the thread split does not). 128 KiB is glibc's
# mmap threshold: larger temporaries are fresh pages from the kernel on every call (1 MiB chunks
# made llama.gg's soft_max 1.2x slower than whole tensors), these come from the heap and stay in
# cache (0.6x).
CHUNK_BYTES = 128 << 10


def chunks(r0: int, r1: int, row_bytes: int, budget: int | None = None):
    """Row ranges (c0, c1) covering [r0, r1), each about `budget` bytes of rows (CHUNK_BYTES, read at
    each call), at least one row."""
    budget = CHUNK_BYTES if budget is None else budget
    step = max(1, budget // max(1, row_bytes))
    for c0 in range(r0, r1, step):
        yield c0, min(c0 + step, r1)


def grid_chunks(shape, row_bytes: int, budget: int | None = None):
    """Indices covering a grid of rows of `shape` (an array's leading dims, its rows innermost),
    each about `budget` bytes of rows: whole inner dims where they fit, blocks of the next, one
    index at a time of the outer ones; the dims are kept (`...` when the whole grid fits)."""
    n = max(1, (CHUNK_BYTES if budget is None else budget) // max(1, row_bytes))
    if math.prod(shape) <= n:
        yield ...
        return
    k, inner = len(shape), 1
    while k > 0 and inner * shape[k - 1] <= n:
        k -= 1
        inner *= shape[k]
    if k == 0:
        yield ...
        return
    step, whole = max(1, n // inner), tuple(slice(None) for _ in shape[k:])
    for outer in np.ndindex(*shape[:k - 1]):
        for b0 in range(0, shape[k - 1], step):
            yield (*(slice(i, i + 1) for i in outer), slice(b0, b0 + step), *whole)


def map_rows(fn, x: np.ndarray, y: np.ndarray, r0: int, r1: int, budget: int | None = None) -> None:
    """y[r0:r1] = fn(x[r0:r1]) for an element-wise fn on (rows, ne0) views, in chunks of rows (a
    row longer than `budget` in pieces)."""
    ne0 = x.shape[1]
    budget = CHUNK_BYTES if budget is None else budget
    if (r1 - r0) * ne0 * x.itemsize <= budget:     # one chunk: most nodes of a small graph
        y[r0:r1] = fn(x[r0:r1])
        return
    cols = max(1, budget // x.itemsize)
    for c0, c1 in chunks(r0, r1, x.itemsize * ne0, budget):
        if ne0 <= cols:
            y[c0:c1] = fn(x[c0:c1])
        else:
            for k0 in range(0, ne0, cols):
                y[c0:c1, k0:k0 + cols] = fn(x[c0:c1, k0:k0 + cols])


def require(cond: bool, op: str, msg: str) -> None:
    """A compute-time GGML_ASSERT / "fatal error": the driver reports it with the node's name."""
    if not cond:
        raise GGToolError(f"{op}: {msg}")


def require_type(t: Tensor, op: str, allowed, what: str = "a") -> None:
    if t.type not in allowed:
        names = ", ".join(T.type_name(x) for x in allowed)
        raise GGToolError(f"{op}: {what} '{t.name}' is {T.type_name(t.type)}; GGML computes it for {names} only")


def row_walk(t: Tensor) -> np.ndarray:
    """(nrows, ne0) view where row i starts at `data + i*nb1` and holds ne0 packed elements.

    Kernels such as sqr, the unaries, scale and clamp address rows this way (ignoring nb0, nb2
    and nb3). For the usual layouts this is the logical tensor; for others it reproduces what
    GGML reads. A walk that would leave the tensor's bytes is refused instead of reading there.
    """
    arr = t.data
    nr, ne0, size = t.nrows, t.ne[0], arr.itemsize
    if nr and ne0:
        t.check_reach((nr - 1) * t.nb[1] + ne0 * size, "GGML's row walk (row i at i*nb1)")
    return np.lib.stride_tricks.as_strided(arr, shape=(nr, ne0), strides=(t.nb[1], size))


def packed_rows(t: Tensor) -> np.ndarray:
    """t's logical shape with rows addressed by nb1..nb3 but elements read packed (ignoring nb0),
    the way kernels that call a ggml_vec_* on `data + i1*nb1 + i2*nb2 + i3*nb3` see it."""
    arr = t.data
    if arr.strides[-1] == arr.itemsize:
        return arr
    return strided_as_strides(t, arr.shape, (*arr.strides[:-1], arr.itemsize))


def with_shape(arr: np.ndarray, shape) -> np.ndarray | None:
    """`arr` reshaped without copying (so writes land in place), or None if that needs a copy."""
    try:
        return _reshape_in_place(arr, tuple(shape))
    except (AttributeError, ValueError):
        return None


if np.lib.NumpyVersion(np.__version__) >= "2.1.0":
    def _reshape_in_place(arr, shape):
        return np.reshape(arr, shape, copy=False)
else:  # numpy < 2.1 has no reshape(copy=False); assigning .shape (deprecated since 2.5) was its way
    def _reshape_in_place(arr, shape):
        v = arr.view()
        v.shape = shape
        return v


def strided_as(t: Tensor, shape) -> np.ndarray:
    """t's memory indexed with another logical shape but t's own strides (GGML's same-index
    row copies between tensors whose dims 1..3 differ). Bounds-checked like row_walk."""
    return strided_as_strides(t, shape, t.data.strides)


def strided_as_strides(t: Tensor, shape, strides) -> np.ndarray:
    arr = t.data
    shape, strides = tuple(shape), tuple(strides)
    if all(shape):
        t.check_reach(sum((n - 1) * s for n, s in zip(shape, strides)) + arr.itemsize, "GGML's walk over the rows")
    return np.lib.stride_tricks.as_strided(arr, shape=shape, strides=strides)


def unravel_rows(rows: np.ndarray, ne1: int, ne2: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat row numbers over (i3, i2, i1) -> index arrays (i3, i2, i1)."""
    i3, rem = np.divmod(rows, ne1 * ne2)
    i2, i1 = np.divmod(rem, ne1)
    return i3, i2, i1


def write_linear(dst: Tensor, src_shape, values: np.ndarray, row_sel: slice) -> None:
    """Write `values` (src_shape[:2] + (rows in row_sel,) + src_shape[3:]) to the dst elements
    that have the same linear index as src elements [:, :, row_sel, :] in src's logical shape.

    This is the element order of GGML's cpy/dup/cont: source logical order, written to the
    destination's logical positions in the same linear order.
    """
    view = with_shape(dst.data, src_shape)
    if view is not None:
        view[:, :, row_sel] = values
        return
    # the destination's layout cannot be regrouped as the source's shape: scatter by index
    d3, d2, d1, d0 = src_shape                  # the linear indices of the selected rows only
    lin = (np.arange(d3, dtype=np.int64)[:, None, None, None] * (d2 * d1 * d0)
           + np.arange(d2, dtype=np.int64)[None, :, None, None] * (d1 * d0)
           + np.arange(d1, dtype=np.int64)[row_sel][None, None, :, None] * d0
           + np.arange(d0, dtype=np.int64)).reshape(-1)
    idx = np.unravel_index(lin, dst.shape)
    dst.data[idx] = values.reshape(-1)


def cpu_from_float(x: np.ndarray, dst_type) -> np.ndarray:
    """F32 values (..., n) -> dst_type elements (F32/F16, BF16 as uint16 bits) or row bytes
    (Q4_0/Q8_0), as the CPU backend's from_float does it (cpy, add into quantized tensors)."""
    from .. import quant

    if dst_type == T.F32:
        return x.astype(np.float32, copy=False)
    if dst_type == T.F16:
        return quant.fp32_to_fp16(np.ascontiguousarray(x, dtype=np.float32))
    if dst_type == T.BF16:
        return quant.fp32_to_bf16(x)
    rows = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    if dst_type == T.Q4_0:
        q = quant.quantize_q4_0(rows)       # the CPU from_float for Q4_0 is the reference quantizer
    elif dst_type == T.Q8_0:
        q = quant.quantize_q8_0_cpu(rows)   # ... for Q8_0 it is the AVX2 variant
    else:
        raise GGToolError(f"no conversion from f32 to {T.type_name(dst_type)}")
    return q.reshape(*x.shape[:-1], -1)


def plain(*tensors) -> bool:
    """Whether compiled kernels may address these tensors by their words (``kernels.nodes``): each has
    data, its type is not a block type, and its offset and strides are multiples of its element size
    (a kernel reads element i0 of row (i1, i2, i3) at offset i0*nb0 + i1*nb1 + ... in elements)."""
    for t in tensors:
        if t is None or not t.has_data or T.is_quantized(t.type):
            return False
        size = T.type_size(t.type)
        if t.data_offset % size or any(nb % size for nb in t.nb):
            return False
    return True


def packed_rows_of(t) -> bool:
    """Whether t's elements are packed within its rows (nb0 == the type's size)."""
    return t.nb[0] == T.type_size(t.type)


def f16_table(ith: int, nth: int, shared: dict):
    """A CompiledStep's bind: the address of the f16 -> f32 table (``kernels.tables``) in this process."""
    from ..kernels.tables import F16_TO_F32

    return (int(F16_TO_F32.ctypes.data),), F16_TO_F32, None


def walks_inside(*tensors) -> bool:
    """Whether GGML's row walk (row i at i*nb1, ne0 packed elements) stays inside each tensor's root,
    as `row_walk` checks before the forward reads or writes through it."""
    for t in tensors:
        nr, ne0 = t.nrows, t.ne[0]
        if nr and ne0 and t.view_offs + (nr - 1) * t.nb[1] + ne0 * T.type_size(t.type) > t.root.nbytes:
            return False
    return True
