"""How GGML kernels walk memory, as numpy views: GGML's row walks, its thread slices and
writes in logical (linear) order. Shared by the family modules; no op lives here."""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..errors import GGToolError
from ..tensor import Tensor


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
    ne = src_shape
    lin = np.arange(int(np.prod(ne)), dtype=np.int64).reshape(ne)[:, :, row_sel].reshape(-1)
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
