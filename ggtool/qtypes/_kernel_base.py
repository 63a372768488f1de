"""The compiled helpers both kernel modules of the records share (``_iq23_kernels``,
``_lowbit_kernels``): float bits, GGML's fp32 -> fp16 rounding, little-endian stores and fp16 loads.
The kernel cache's key covers this file (``ggtool.kernels.cache.SHARED``): numba compiles these
into the kernels that call them and checks a cached kernel against its own file only.
``nearest_int`` is the K-quants' (``ggtool.kquants.blocks``)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..kernels.jit import njit, numba
from ..kquants.blocks import nearest_int  # noqa: F401 (for the kernel modules: one home)

F32 = np.float32
_ABS = np.uint32(0x7FFFFFFF)
_INF = np.uint32(0x7F800000)
_types = numba.types


@numba.extending.intrinsic
def _bits(typingctx, v):
    """The bits of a float32 as an int32 (C's memcpy from float to int): an LLVM bitcast."""
    if not isinstance(v, _types.Float) or v.bitwidth != 32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return _types.int32(_types.float32), codegen


@numba.extending.intrinsic
def _float(typingctx, v):
    """The float32 with the bits of an int32."""
    if not isinstance(v, _types.Integer) or v.bitwidth != 32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return _types.float32(v), codegen


@njit
def fp16_bits(f):
    """GGML_FP32_TO_FP16 (ggml_compute_fp32_to_fp16's float trick: round to nearest even, overflow
    to inf, NaN to 0x7e00 with the sign), as a uint16."""
    base = F32(F32(abs(f) * F32(5.192296858534828e33)) * F32(7.703719777548943e-34))   # 2**112, 2**-110
    w = np.uint32(_bits(f)) & np.uint32(0xFFFFFFFF)
    shl1_w = np.uint32(w + w)
    sign = w & np.uint32(0x80000000)
    bias = shl1_w & np.uint32(0xFF000000)
    if bias < np.uint32(0x71000000):
        bias = np.uint32(0x71000000)
    base = F32(_float(np.int32((bias >> np.uint32(1)) + np.uint32(0x07800000))) + base)
    b = np.uint32(_bits(base)) & np.uint32(0xFFFFFFFF)
    nonsign = ((b >> np.uint32(13)) & np.uint32(0x7C00)) + (b & np.uint32(0x0FFF))
    h = np.uint32(0x7E00) if shl1_w > np.uint32(0xFF000000) else nonsign
    return np.uint16((sign >> np.uint32(16)) | h)


@njit
def _first_bad(x):
    """-1, or the flat index of the first NaN/inf of x (C order)."""
    xi = x.reshape(-1).view(np.uint32)
    for k in range(xi.shape[0]):
        if (xi[k] & _ABS) >= _INF:
            return k
    return -1


@njit
def _put16(out, r, at, v):
    """Bytes [at, at + 2) of out's row r: v's low 16 bits, little-endian."""
    out[r, at] = np.uint8(v & 0xFF)
    out[r, at + 1] = np.uint8((v >> 8) & 0xFF)


@njit
def _put32(out, r, at, v):
    """Bytes [at, at + 4) of out's row r: v's low 32 bits, little-endian."""
    for b in range(4):
        out[r, at + b] = np.uint8((v >> (8 * b)) & 0xFF)


@njit
def _f16_at(w, o, f16):
    """The fp16 at bytes [o, o + 2) of w, as float32 (the table: exact)."""
    return f16[np.int64(w[o]) | (np.int64(w[o + 1]) << 8)]
