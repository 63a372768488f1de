"""The compiled helpers both kernel modules of the records share (``_iq23_kernels``,
``_lowbit_kernels``): float bits, GGML's fp32 -> fp16 rounding, little-endian stores and fp16 loads,
and the quantizers' grid tables (iq2xs_init_impl / iq3xs_init_impl: IQ1, IQ2 and IQ3 use them).
The kernel cache's key covers this file (``ggtool.kernels.cache.SHARED``): numba compiles these
into the kernels that call them and checks a cached kernel against its own file only.
``nearest_int`` is the K-quants' (``_k_quantize``)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..kernels.jit import njit, numba
from ._k_quantize import nearest_int  # noqa: F401 (for the kernel modules: one home)

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


# -- iq2xs_init_impl / iq3xs_init_impl: a grid's map and neighbour lists ----------------------------------
@njit
def grid_tables(kgrid, bits, npos, kmap_size, nwant):
    """iq2xs_init_impl / iq3xs_init_impl's tables of one grid (kgrid: each point's levels, `bits` a
    level, `npos` levels; IQ1_S/IQ1_M's grid is a 2-bit one of levels 0..2): grid (G, npos) int8 of
    levels 2l+1, map (kmap_size,) int32 (a point's index, or -(offset + 1) of its neighbour list), neighbours uint16 (lists of
    [count, index...] for every point off the grid, in increasing order of the point): each list
    holds the grid points at the nwant smallest distances, sorted by (distance, index), as the C's
    qsort with iq2_compare_func leaves them."""
    G = kgrid.shape[0]
    mask = (1 << bits) - 1
    grid = np.empty((G, npos), np.int8)
    gt = np.empty((npos, G), np.int32)           # the grid transposed: the distances vectorise over points
    kmap = np.full(kmap_size, -1, np.int32)
    for k in range(G):
        for i in range(npos):
            grid[k, i] = 2 * ((np.int64(kgrid[k]) >> (bits * i)) & mask) + 1
            gt[i, k] = grid[k, i]
        kmap[np.int64(kgrid[k])] = k
    maxd = npos * (2 * mask) * (2 * mask) + 1
    dist = np.empty(nwant, np.int32)
    d2 = np.empty(G, np.int32)
    out = np.empty(16 * kmap_size, np.uint16)
    at = 0
    for u in range(kmap_size):
        if kmap[u] >= 0:
            continue
        d2[:] = 0
        for i in range(npos):
            p = np.int32(2 * ((u >> (bits * i)) & mask) + 1)
            for j in range(G):
                t = gt[i, j] - p
                d2[j] += t * t
        # the distances kept: the nwant smallest distinct ones (min reductions: they vectorise)
        n = 0
        nd = 0
        lo = np.int32(-1)
        for _ in range(nwant):
            m = np.int32(maxd)
            for j in range(G):
                v = d2[j]
                m = v if (v > lo and v < m) else m
            if m == maxd:
                break
            dist[nd] = m
            nd += 1
            lo = m
        for j in range(G):
            n += d2[j] <= lo
        if at + 1 + n > out.shape[0]:
            bigger = np.empty(2 * out.shape[0] + n + 1, np.uint16)
            bigger[:at] = out[:at]
            out = bigger
        kmap[u] = -(at + 1)
        out[at] = n
        at += 1
        for q in range(nd):                      # sorted by distance, then index
            dq = dist[q]
            for j in range(G):
                if d2[j] == dq:
                    out[at] = j
                    at += 1
    return grid, kmap, out[:at].copy()


def read_only(tables):
    for a in tables:
        a.flags.writeable = False           # shared by every call of the process: nobody may change them
    return tables
