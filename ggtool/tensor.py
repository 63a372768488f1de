"""The tensor: GGML's `struct ggml_tensor` (336 bytes in the pool) with a numpy view of its data."""

from __future__ import annotations

import math
import sys
from typing import Protocol

import numpy as np

from . import types as T
from .errors import GGToolError, InputError, ShapeError

MAX_DIMS, MAX_SRC, MAX_NAME, MAX_OP_PARAMS = 4, 10, 64, 64
INT64_MAX, INT32_MIN, INT32_MAX = 2**63 - 1, -(2**31), 2**31 - 1

FLAG_INPUT, FLAG_OUTPUT, FLAG_PARAM, FLAG_LOSS = 1, 2, 4, 8

UNARY_OPS = ("ABS", "SGN", "NEG", "STEP", "TANH", "ELU", "RELU", "SIGMOID", "GELU",
             "GELU_QUICK", "SILU", "HARDSWISH", "HARDSIGMOID", "EXP")


def byte_extent(type, ne, nb) -> int:
    """One past the highest byte that elements `ne` with byte strides `nb` (all >= 0) touch; 0 if
    empty. A block type steps nb[0] per block of its row (a permuted one, whose ne[0] need not hold
    whole blocks, counts its part of a block as one)."""
    if 0 in ne:
        return 0
    blocks = -(-ne[0] // T.block_size(type))
    return (T.type_size(type) + (blocks - 1) * nb[0] + (ne[1] - 1) * nb[1] + (ne[2] - 1) * nb[2]
            + (ne[3] - 1) * nb[3])


class Owner(Protocol):
    """What a tensor needs of the context that made it: the pool's bytes, and a way to copy a
    memory-mapped tensor into them (`set_data`). ggtool.context.Context is one; a pool worker's
    stand-in has the bytes alone. The context imports this module, never the other way round."""

    buffer: np.ndarray

    def materialize(self, t: Tensor) -> None: ...


class Tensor:
    """One tensor of a Context. `ne[0]` is the innermost dimension; `nb` are byte strides.

    The numpy view (`.data`) has shape `(ne3, ne2, ne1, ne0)` and strides `nb` reversed, so it
    reads the same bytes GGML would, views and permutes included.
    """

    __slots__ = ("ctx", "type", "ne", "nb", "op", "op_params", "flags", "src", "view_src",
                 "view_offs", "_name", "struct_offset", "data_offset", "storage", "_view", "__weakref__")

    def __init__(self, ctx: Owner, type: T.GGMLType, ne, nb, struct_offset: int,
                 data_offset: int | None, storage=None):
        self.ctx = ctx
        self.type = type
        self.ne = tuple(int(n) for n in ne)
        self.nb = tuple(int(n) for n in nb)
        self.op = "NONE"
        self.op_params = np.zeros(MAX_OP_PARAMS // 4, dtype=np.int32)
        self.flags = 0
        self.src: list[Tensor] = []
        self.view_src: Tensor | None = None
        self.view_offs = 0
        self._name = ""
        self.struct_offset = struct_offset
        self.data_offset = data_offset
        self.storage = storage  # None: the context's pool; else an object with `.array` (uint8)
        self._view = None  # (buffer, ne, nb, data_offset, view): `.data` is on every kernel's path

    # -- name ------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        raw = str(value).encode("utf-8")[: MAX_NAME - 1]
        self._name = raw.decode("utf-8", errors="ignore")

    def set_name(self, name: str) -> Tensor:
        self.name = name
        return self

    # -- op -------------------------------------------------------------------------------
    @property
    def op_desc(self) -> str:
        """ggml_op_desc: the unary op's name for UNARY nodes, else the op name."""
        if self.op == "UNARY":
            return UNARY_OPS[int(self.op_params[0])]
        return self.op

    def param_f32(self, i: int) -> float:
        return float(self.op_params.view(np.float32)[i])

    def param_i32(self, i: int) -> int:
        return int(self.op_params[i])

    def set_params(self, *values) -> None:
        """Store op_params slot by slot: Python floats as float32 bits, ints as int32 (GGML's
        int32_t slots: an int they cannot hold is a ShapeError, never a wrapped value). A NaN, or
        a finite float that float32 cannot hold (it would become inf), is a ShapeError too; an
        infinity given as such (a clamp's open bound) is kept."""
        for i, v in enumerate(values):
            if isinstance(v, float):
                if math.isnan(v):
                    raise ShapeError(f"{self.op.lower()}: parameter {i} is NaN")
                with np.errstate(over="ignore"):
                    overflows = math.isfinite(v) and math.isinf(np.float32(v))
                if overflows:
                    raise ShapeError(f"{self.op.lower()}: parameter {i} = {v!r} does not fit GGML's float32 "
                                     f"op_params (it would be inf)")
                self.op_params.view(np.float32)[i] = v
            else:
                v = int(v)
                if not INT32_MIN <= v <= INT32_MAX:
                    raise ShapeError(f"{self.op.lower()}: parameter {i} = {v} does not fit GGML's int32 op_params")
                self.op_params[i] = v

    # -- shape ----------------------------------------------------------------------------
    @property
    def nelements(self) -> int:
        return self.ne[0] * self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def nrows(self) -> int:
        return self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def n_dims(self) -> int:
        return T.n_dims(self.ne)

    @property
    def nbytes(self) -> int:
        """ggml_nbytes: the byte extent of the strided tensor."""
        if any(n <= 0 for n in self.ne):
            return 0
        blck = T.block_size(self.type)
        if blck == 1:
            return T.type_size(self.type) + sum((self.ne[i] - 1) * self.nb[i] for i in range(4))
        return self.ne[0] * self.nb[0] // blck + sum((self.ne[i] - 1) * self.nb[i] for i in range(1, 4))

    @property
    def extent(self) -> int:
        """One past the highest byte any element touches, from the tensor's data: ggml_nbytes for
        every layout whose rows hold whole blocks (the strides are GGML's size_t, never negative)."""
        return byte_extent(self.type, self.ne, self.nb)

    @property
    def root(self) -> Tensor:
        """The tensor that owns the bytes: view_src for a view (views collapse onto their root)."""
        return self if self.view_src is None else self.view_src

    def check_reach(self, extent: int, what: str) -> None:
        """Refuse an access that reaches `extent` bytes from this tensor's data when that leaves the
        bytes of its root (a view's own layout, or a kernel's walk over it): nothing ggtool does
        reads or writes outside a tensor, whatever the strides a program gives."""
        root = self.root
        if self.view_offs + extent > root.nbytes:
            where = f"'{root.name}'" if root is not self else "its own data"
            raise ShapeError(f"{what} of '{self.name}' reaches byte {self.view_offs + extent} of {where}, "
                             f"which has {root.nbytes} bytes")

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy shape (ne3, ne2, ne1, ne0)."""
        return self.ne[::-1]

    def is_empty(self) -> bool:
        return 0 in self.ne

    def is_transposed(self) -> bool:
        return self.nb[0] > self.nb[1]

    def is_permuted(self) -> bool:
        nb = self.nb
        return nb[0] > nb[1] or nb[1] > nb[2] or nb[2] > nb[3]

    def is_contiguous(self, n: int = 0) -> bool:
        """ggml_is_contiguous_n at the reference commit (n=0: fully packed)."""
        nxt = T.type_size(self.type)
        blck = T.block_size(self.type)
        if self.ne[0] != blck and self.nb[0] != nxt:
            return False
        nxt *= self.ne[0] // blck
        for i in range(1, MAX_DIMS):
            if self.ne[i] != 1:
                if i > n:
                    if self.nb[i] != nxt:
                        return False
                    nxt *= self.ne[i]
                else:
                    nxt = self.ne[i] * self.nb[i]
        return True

    def is_padded_1d(self) -> bool:
        return (self.nb[0] == T.type_size(self.type) and self.nb[2] == self.nb[1] * self.ne[1]
                and self.nb[3] == self.nb[2] * self.ne[2])

    def is_matrix(self) -> bool:
        return self.ne[2] == 1 and self.ne[3] == 1

    def is_vector(self) -> bool:
        return self.ne[1] == 1 and self.ne[2] == 1 and self.ne[3] == 1

    def can_repeat(self, other: Tensor) -> bool:
        """ggml_can_repeat(self, other): other can be tiled from self."""
        if self.is_empty():
            return other.is_empty()
        return all(o % s == 0 for s, o in zip(self.ne, other.ne))

    # -- data -----------------------------------------------------------------------------
    @property
    def has_data(self) -> bool:
        return self.data_offset is not None

    def _buffer(self) -> np.ndarray:
        return self.ctx.buffer if self.storage is None else self.storage.array

    @property
    def data(self) -> np.ndarray:
        """Zero-copy numpy view honouring nb. Quantized types: raw row bytes (ne3, ne2, ne1, row);
        BF16: the uint16 bits of its values."""
        if self.data_offset is None:
            raise GGToolError(f"tensor '{self.name}' has no data (no_alloc context)")
        buf = self._buffer()
        c = self._view
        if c is not None and c[0] is buf and c[1] is self.ne and c[2] is self.nb and c[3] == self.data_offset:
            return c[4]
        view = self._make_view(buf)
        self._view = (buf, self.ne, self.nb, self.data_offset, view)
        return view

    def _make_view(self, buf: np.ndarray) -> np.ndarray:
        """The numpy view of the data. Its layout is inside its root already (Context.new_tensor
        checks views when they are made, a root's bytes are its own); what is checked here is the
        buffer: a mapped file that shrank before it was mapped, and strides set by hand."""
        if min(self.nb) < 0:
            raise ShapeError(f"tensor '{self.name}': negative byte strides nb={list(self.nb)} (GGML's are size_t)")
        end = self.data_offset + self.extent
        if end > len(buf):
            where = getattr(self.storage, "path", "the context's pool")
            raise InputError(f"tensor '{self.name}' needs bytes up to {end} of {where}, "
                             f"which has {len(buf)} (the file changed since it was opened?)")
        if T.is_quantized(self.type):
            if self.nb[0] != T.type_size(self.type):
                raise GGToolError(f"tensor '{self.name}': a quantized tensor with permuted blocks has no byte view")
            shape = (*self.ne[:0:-1], T.row_size(self.type, self.ne[0]))
            strides = (*self.nb[:0:-1], 1)
            return np.ndarray(shape, np.uint8, buffer=buf, offset=self.data_offset, strides=strides)
        return np.ndarray(self.shape, T.np_dtype(self.type), buffer=buf, offset=self.data_offset,
                          strides=self.nb[::-1])

    def numpy(self) -> np.ndarray:
        """A packed copy of the logical contents (f32 for quantized and bf16 tensors, dequantized)."""
        if self.type == T.BF16:
            from .quant import bf16_to_fp32
            return bf16_to_fp32(self.data)
        if T.is_quantized(self.type):
            from .quant import dequantize
            return dequantize(np.ascontiguousarray(self.data), self.type).reshape(self.shape)
        return np.array(self.data, copy=True)

    def set_data(self, values) -> Tensor:
        """Copy numpy data (shape (ne3..ne0) or anything with nelements values) into the tensor.
        Quantized types take raw row bytes. BF16 takes its bits (uint16, or their bytes as uint8)
        or values of any other dtype, converted as GGML_FP32_TO_BF16 does. A memory-mapped
        tensor (or view of one) is first copied into its context (Context.materialize): the file
        is never written."""
        arr = np.asarray(values)
        root = self.view_src if self.view_src is not None else self
        if root.storage is not None:
            root.ctx.materialize(root)
        dst = self.data
        if T.is_quantized(self.type):
            arr = arr.astype(np.uint8, copy=False)
        elif self.type == T.BF16:
            from .quant import bf16
            arr = bf16.bf16_bits(arr) if arr.dtype in (np.uint8, np.uint16) else bf16.fp32_to_bf16(arr)
        if arr.size != dst.size:
            raise GGToolError(f"tensor '{self.name}' holds {dst.size} values, got {arr.size}")
        dst[...] = arr.reshape(dst.shape)
        packs = sys.modules.get("ggtool.quant.matmul")   # loaded only once something was repacked
        if packs is not None:
            packs.forget(self)
        return self

    def __repr__(self) -> str:
        ne = ", ".join(str(n) for n in self.ne)
        return f"<Tensor {self.name!r} {T.type_name(self.type)} ne=[{ne}] op={self.op_desc}>"
