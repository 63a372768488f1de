"""Node kernels for the compiled graph runner (``kernels.runner``), with one calling convention:

    int64 kernel(row, frow, ith, nth, wdata)      # 0, or an error code (the node is then re-run in
                                                  # Python for its message)

``row`` is the address of the node's int64 table row: the tensors (destination first, then the
sources), each as address, type, ne[4], nb[4] (``TENSOR`` words from ``DST``, ``SRC0``, ...; an address
is where the tensor's data starts in this process: its buffer's address plus its offset), then the
op's int parameters from ``P``; ``frow`` its float64 row; ``wdata`` the work buffer's address. Each
kernel is a ``numba.cfunc`` compiled (or loaded from the cache) on first use (``address(name)``), so a
process loads only the kernels its graphs use.

Every kernel computes exactly what the op's Python forward (``ggtool.ops``) computes, float operation
for float operation (the tests compare their bits), on GGML's split of the rows between participants
(an element-wise kernel with fewer rows than participants splits each row instead:
``elementwise_share``).
Which node a kernel may take (types, strides, alignment) is the op's to decide (its `compiled` entry),
never the kernel's: a kernel trusts its row.
"""

from __future__ import annotations

import numpy as np

from .float_rows import _exp64, _exp_f32
from .jit import njit, numba
from .native import view_as, voidptr
from .quantize import _f16_bits
from .x86 import fmaf, soft_max_rows

# -- the table row ----------------------------------------------------------------------------------
TENSOR = 10                       # address, type, ne0..ne3, nb0..nb3
DST, SRC0, SRC1, SRC2, SRC3 = 0, 10, 20, 30, 40
P = 50                            # the op's int parameters
ROW = 64                          # int64 words per row
CHUNK_ADDR = ROW - 1              # a step that deals out its units: the chunk counter's address (runner)
FROW = 8                          # float64 words per row
A, TY, NE, NB = 0, 1, 2, 6        # offsets inside a tensor's words

# error codes (the Python forward of the node then says what, in its own words)
E_INDEX = 1                       # an index outside its tensor (get_rows, set_rows)
E_VALUE = 2                       # a value a conversion refuses (NaN/inf into a quantized type)

F32 = np.float32
_BIG = 1 << 40                    # the length of an array over raw memory: indices are never checked
carray, cfunc, _i64 = numba.carray, numba.cfunc, numba.types.int64
_SIG = _i64(_i64, _i64, _i64, _i64, _i64)


@njit(inline="always")
def words(addr, n):
    return carray(voidptr(addr), (n,), np.int64)


@njit(inline="always")
def f32s(addr):
    return carray(voidptr(addr), (_BIG,), np.float32)


@njit(inline="always")
def f64s(addr):
    return carray(voidptr(addr), (_BIG,), np.float64)


@njit(inline="always")
def u8s(addr):
    return carray(voidptr(addr), (_BIG,), np.uint8)


@njit(inline="always")
def i8s(addr):
    return carray(voidptr(addr), (_BIG,), np.int8)


@njit(inline="always")
def u16s(addr):
    return carray(voidptr(addr), (_BIG,), np.uint16)


@njit(inline="always")
def i32s(addr):
    return carray(voidptr(addr), (_BIG,), np.int32)


@njit(inline="always")
def i64s(addr):
    return carray(voidptr(addr), (_BIG,), np.int64)


@njit(inline="always")
def row_block(nr, ith, nth):
    """GGML's contiguous split: dr = ceil(nr/nth), rows [dr*ith, min(dr*ith+dr, nr))."""
    dr = (nr + nth - 1) // nth
    r0 = min(dr * ith, nr)
    return r0, min(r0 + dr, nr)


@njit(inline="always")
def elementwise_share(nr, ne0, ith, nth):
    """An element-wise kernel's share (rows r0..r1, values c0..c1 of each): GGML's block of rows, or,
    with fewer rows than participants (a decode step's one row), a block of every row's values,
    whole cache lines: each result is the same whoever computes it, and one participant alone would
    keep the others waiting at the barrier (GGML's SIMD kernels make such a row cheap)."""
    if nr >= nth:
        r0, r1 = row_block(nr, ith, nth)
        return r0, r1, 0, ne0
    step = ((ne0 + nth - 1) // nth + 15) // 16 * 16
    c0 = min(ith * step, ne0)
    return 0, nr, c0, min(c0 + step, ne0)


@njit(inline="always")
def f16_to_f32(h, f16):
    return f16[np.int64(h)]


# x86 gives the first operand's NaN (quieted) where both operands of an operation are NaN, and numpy's
# loops put the operands in the forward's order; LLVM may swap the operands of a commutative one. These
# keep the first operand's NaN, so that the bits of a NaN are the forward's too.
@njit(inline="always")
def mul1(a, b):
    r = a * b
    if r != r and a != a:
        return a + F32(0.0)
    return r


@njit(inline="always")
def add1(a, b):
    r = a + b
    if r != r and a != a:
        return a + F32(0.0)
    return r


# -- element-wise binary ops: add, sub, mul, div (ops.binary) ----------------------------------------
OP_ADD, OP_SUB, OP_MUL, OP_DIV = 0, 1, 2, 3


@njit(inline="always")
def _apply(op, x, y):
    if op == OP_ADD:
        return add1(x, y)
    if op == OP_SUB:
        return x - y
    if op == OP_MUL:
        return mul1(x, y)
    return x / y


def binary_f32(row, frow, ith, nth, wdata):
    """a op b (b tiled over a, GGML's modulo broadcast), all f32: ADD and SUB take blocks of rows, MUL
    and DIV rows ith, ith+nth, ... (P: the op, interleaved); fewer rows than participants, a block
    of each row's values (``elementwise_share``)."""
    w = words(row, ROW)
    op, inter = w[P], w[P + 1]
    ne0, ne1, ne2, ne3 = w[DST + NE], w[DST + NE + 1], w[DST + NE + 2], w[DST + NE + 3]
    nr = ne1 * ne2 * ne3
    r0, r1, c0, c1 = elementwise_share(nr, ne0, ith, nth)
    step = 1
    if inter != 0 and nr >= nth:
        r0, r1, step = ith, nr, nth
    d, a, b = f32s(w[DST + A]), f32s(w[SRC0 + A]), f32s(w[SRC1 + A])
    ne10, ne11, ne12, ne13 = w[SRC1 + NE], w[SRC1 + NE + 1], w[SRC1 + NE + 2], w[SRC1 + NE + 3]
    d0, d1, d2, d3 = w[DST + NB] // 4, w[DST + NB + 1] // 4, w[DST + NB + 2] // 4, w[DST + NB + 3] // 4
    a0, a1, a2, a3 = w[SRC0 + NB] // 4, w[SRC0 + NB + 1] // 4, w[SRC0 + NB + 2] // 4, w[SRC0 + NB + 3] // 4
    b0, b1, b2, b3 = w[SRC1 + NB] // 4, w[SRC1 + NB + 1] // 4, w[SRC1 + NB + 2] // 4, w[SRC1 + NB + 3] // 4
    for r in range(r0, r1, step):
        i1 = r % ne1
        i2 = (r // ne1) % ne2
        i3 = r // (ne1 * ne2)
        do = i1 * d1 + i2 * d2 + i3 * d3
        ao = i1 * a1 + i2 * a2 + i3 * a3
        bo = (i1 % ne11) * b1 + (i2 % ne12) * b2 + (i3 % ne13) * b3
        if ne10 == ne0 and d0 == 1 and a0 == 1 and b0 == 1:
            for i0 in range(c0, c1):
                d[do + i0] = _apply(op, a[ao + i0], b[bo + i0])
        else:
            for i0 in range(c0, c1):
                d[do + i0 * d0] = _apply(op, a[ao + i0 * a0], b[bo + (i0 % ne10) * b0])
    return 0


# -- scale (ops.scale) ---------------------------------------------------------------------------------
def scale_f32(row, frow, ith, nth, wdata):
    """y = x*s in float32, rows in blocks (``elementwise_share``), row i at i*nb1 (GGML's walk) for a
    and the result."""
    w, f = words(row, ROW), f64s(frow)
    s = F32(f[0])
    ne0 = w[DST + NE]
    nr = w[DST + NE + 1] * w[DST + NE + 2] * w[DST + NE + 3]
    r0, r1, c0, c1 = elementwise_share(nr, ne0, ith, nth)
    d, a = f32s(w[DST + A]), f32s(w[SRC0 + A])
    dn, an = w[DST + NB + 1] // 4, w[SRC0 + NB + 1] // 4
    for r in range(r0, r1):
        for i0 in range(c0, c1):
            d[r * dn + i0] = mul1(a[r * an + i0], s)
    return 0


# -- rms_norm (ops.norm) -------------------------------------------------------------------------------
@njit
def seq_sum_f64(a, n):
    """GGML's ggml_float sum (``portable_math.seq_sum``): a double from +0.0, plus each term in order."""
    res = 0.0
    for i in range(n):
        res += a[i]
    return res


def rms_norm_f32(row, frow, ith, nth, wdata):
    """x / sqrt(mean(x*x) + eps) per row, rows i1 = ith, ith+nth, ... of every (i2, i3): the
    squares in float32, their sum in GGML's order (``seq_sum_f64``), the rest in float32.
    P: fused (1: the result multiplied by the f32 row SRC1 (broadcast over rows, a MUL node's b) into
    the tensor SRC2, the norm's own result left unwritten)."""
    w, f = words(row, ROW), f64s(frow)
    eps = F32(f[0])
    fused = w[P]
    ne0, ne1, ne2, ne3 = w[SRC0 + NE], w[SRC0 + NE + 1], w[SRC0 + NE + 2], w[SRC0 + NE + 3]
    x, y = f32s(w[SRC0 + A]), f32s(w[DST + A])
    x1, x2, x3 = w[SRC0 + NB + 1] // 4, w[SRC0 + NB + 2] // 4, w[SRC0 + NB + 3] // 4
    y1, y2, y3 = w[DST + NB + 1] // 4, w[DST + NB + 2] // 4, w[DST + NB + 3] // 4
    sq = np.empty(ne0, np.float64)
    n = np.float64(ne0)
    for i3 in range(ne3):
        for i2 in range(ne2):
            for i1 in range(ith, ne1, nth):
                xo = i1 * x1 + i2 * x2 + i3 * x3
                for i0 in range(ne0):
                    v = x[xo + i0]
                    sq[i0] = np.float64(mul1(v, v))
                mean = F32(seq_sum_f64(sq, ne0) / n)
                scale = F32(1.0) / np.sqrt(mean + eps)
                if fused == 0:
                    yo = i1 * y1 + i2 * y2 + i3 * y3
                    for i0 in range(ne0):
                        y[yo + i0] = mul1(x[xo + i0], scale)
                else:
                    _fused_mul(w, x, xo, scale, i1, i2, i3)
    return 0


@njit(inline="always")
def _fused_mul(w, x, xo, scale, i1, i2, i3):
    """(x * scale) * b into the MUL's result: b is SRC1 (tiled), the result SRC2."""
    b, z = f32s(w[SRC1 + A]), f32s(w[SRC2 + A])
    ne0 = w[SRC0 + NE]
    ne10, ne11, ne12, ne13 = w[SRC1 + NE], w[SRC1 + NE + 1], w[SRC1 + NE + 2], w[SRC1 + NE + 3]
    bo = (i1 % ne11) * (w[SRC1 + NB + 1] // 4) + (i2 % ne12) * (w[SRC1 + NB + 2] // 4) + \
        (i3 % ne13) * (w[SRC1 + NB + 3] // 4)
    zo = i1 * (w[SRC2 + NB + 1] // 4) + i2 * (w[SRC2 + NB + 2] // 4) + i3 * (w[SRC2 + NB + 3] // 4)
    for i0 in range(ne0):
        z[zo + i0] = mul1(mul1(x[xo + i0], scale), b[bo + i0 % ne10])


# -- get_rows (ops.rows) -------------------------------------------------------------------------------
K_F32, K_F16, K_I32, K_Q4_0, K_Q8_0 = 0, 1, 2, 3, 4       # the source kinds get_rows reads


@njit(inline="always")
def _dequant_row(kind, src, dst, n, f16):
    """n values of a row at byte address src into the f32 row at dst (exact, as GGML's to_float)."""
    d = f32s(dst)
    if kind == K_F32 or kind == K_I32:
        s = i32s(src)
        o = i32s(dst)
        for i in range(n):
            o[i] = s[i]
    elif kind == K_F16:
        s = u16s(src)
        for i in range(n):
            d[i] = f16[np.int64(s[i])]
    elif kind == K_Q8_0:
        q, qi = u8s(src), i8s(src)
        for b in range(n // 32):
            o = b * 34
            sc = f16[np.int64(q[o]) | (np.int64(q[o + 1]) << 8)]
            for j in range(32):
                d[b * 32 + j] = F32(qi[o + 2 + j]) * sc
    else:   # Q4_0
        q = u8s(src)
        for b in range(n // 32):
            o = b * 18
            sc = f16[np.int64(q[o]) | (np.int64(q[o + 1]) << 8)]
            for j in range(16):
                v = np.int32(q[o + 2 + j])
                d[b * 32 + j] = F32(np.int32((v & 15) - 8)) * sc
                d[b * 32 + j + 16] = F32(np.int32((v >> 4) - 8)) * sc


def get_rows(row, frow, ith, nth, wdata):
    """out[:, i10, i11, i12] = a[:, idx[i10, i11, i12], i11, i12] as f32 (I32 stays): the
    nelements(idx) rows in blocks (P: the source kind, the f16 table's address)."""
    w = words(row, ROW)
    kind, f16 = w[P], carray(voidptr(w[P + 1]), (65536,), np.float32)
    ne10, ne11 = w[SRC1 + NE], w[SRC1 + NE + 1]
    nr = ne10 * ne11 * w[SRC1 + NE + 2]
    r0, r1 = row_block(nr, ith, nth)
    idx = w[SRC1 + A]
    ne00, ne01 = w[SRC0 + NE], w[SRC0 + NE + 1]
    for r in range(r0, r1):
        i10 = r % ne10
        i11 = (r // ne10) % ne11
        i12 = r // (ne10 * ne11)
        k = np.int64(i32s(idx + i10 * w[SRC1 + NB] + i11 * w[SRC1 + NB + 1] + i12 * w[SRC1 + NB + 2])[0])
        if k < 0 or k >= ne01:
            return E_INDEX
        src = w[SRC0 + A] + k * w[SRC0 + NB + 1] + i11 * w[SRC0 + NB + 2] + i12 * w[SRC0 + NB + 3]
        dst = w[DST + A] + i10 * w[DST + NB + 1] + i11 * w[DST + NB + 2] + i12 * w[DST + NB + 3]
        _dequant_row(kind, src, dst, ne00, f16)
    return 0


# -- set_rows (ops.rows) -------------------------------------------------------------------------------
C_COPY4, C_COPY2, C_F32_F16, C_F16_F32 = 0, 1, 2, 3      # element conversions (set_rows, cpy)


@njit(inline="always")
def _convert(conv, src, dst, n, s0, d0, f16):
    """n elements from src (stride s0 bytes) to dst (stride d0 bytes), converted."""
    if conv == C_COPY4:
        s, d = i32s(src), i32s(dst)
        for i in range(n):
            d[i * (d0 // 4)] = s[i * (s0 // 4)]
    elif conv == C_COPY2:
        s, d = u16s(src), u16s(dst)
        for i in range(n):
            d[i * (d0 // 2)] = s[i * (s0 // 2)]
    elif conv == C_F32_F16:
        s, d = carray(voidptr(src), (_BIG,), np.uint32), u16s(dst)
        for i in range(n):
            d[i * (d0 // 2)] = np.uint16(_f16_bits(s[i * (s0 // 4)]))
    else:
        s, d = u16s(src), f32s(dst)
        for i in range(n):
            d[i * (d0 // 4)] = f16[np.int64(s[i * (s0 // 2)])]


def set_rows(row, frow, ith, nth, wdata):
    """dst[:, idx[i, i02 % ne11, i03 % ne12], i02, i03] = b[:, i, i02, i03], converted: b's rows
    (ne1) in blocks, for every (i02, i03). SRC0 is b, SRC1 the I32 or I64 indices (P: the
    conversion, the indices' width in bytes, the f16 table)."""
    w = words(row, ROW)
    conv, iw = w[P], w[P + 1]
    f16 = carray(voidptr(w[P + 2]), (65536,), np.float32)
    ne00, ne01, ne02, ne03 = w[SRC0 + NE], w[SRC0 + NE + 1], w[SRC0 + NE + 2], w[SRC0 + NE + 3]
    ne11, ne12 = w[SRC1 + NE + 1], w[SRC1 + NE + 2]
    r0, r1 = row_block(ne01, ith, nth)
    nrows = w[DST + NE + 1]
    for i03 in range(ne03):
        for i02 in range(ne02):
            for i in range(r0, r1):
                at = w[SRC1 + A] + i * w[SRC1 + NB] + (i02 % ne11) * w[SRC1 + NB + 1] + (i03 % ne12) * w[SRC1 + NB + 2]
                k = np.int64(i64s(at)[0]) if iw == 8 else np.int64(i32s(at)[0])
                if k < 0 or k >= nrows:
                    return E_INDEX
                src = w[SRC0 + A] + i * w[SRC0 + NB + 1] + i02 * w[SRC0 + NB + 2] + i03 * w[SRC0 + NB + 3]
                dst = w[DST + A] + k * w[DST + NB + 1] + i02 * w[DST + NB + 2] + i03 * w[DST + NB + 3]
                _convert(conv, src, dst, ne00, w[SRC0 + NB], w[DST + NB], f16)
    return 0


# -- cpy, cont, dup (ops.copy) ---------------------------------------------------------------------------
def copy(row, frow, ith, nth, wdata):
    """Elements of the source in its logical order to the destination's element of the same linear
    index (P+1 = 1: GGML's "copy by rows", to the same (i0..i3) indices), converted (P: the
    conversion): the source's rows (ne1) in blocks, for every (i2, i3)."""
    w = words(row, ROW)
    conv, same_idx = w[P], w[P + 1]
    f16 = carray(voidptr(w[P + 2]), (65536,), np.float32)
    ne00, ne01, ne02, ne03 = w[SRC0 + NE], w[SRC0 + NE + 1], w[SRC0 + NE + 2], w[SRC0 + NE + 3]
    ne0, ne1, ne2 = w[DST + NE], w[DST + NE + 1], w[DST + NE + 2]
    r0, r1 = row_block(ne01, ith, nth)
    s0, d0 = w[SRC0 + NB], w[DST + NB]
    for i3 in range(ne03):
        for i2 in range(ne02):
            for i1 in range(r0, r1):
                src = w[SRC0 + A] + i1 * w[SRC0 + NB + 1] + i2 * w[SRC0 + NB + 2] + i3 * w[SRC0 + NB + 3]
                if same_idx != 0:
                    dst = w[DST + A] + i1 * w[DST + NB + 1] + i2 * w[DST + NB + 2] + i3 * w[DST + NB + 3]
                    _convert(conv, src, dst, ne00, s0, d0, f16)
                    continue
                lin = ((i3 * ne02 + i2) * ne01 + i1) * ne00    # the row's first element, linear
                i0 = 0
                while i0 < ne00:
                    k = lin + i0
                    j0 = k % ne0
                    j1 = (k // ne0) % ne1
                    j2 = (k // (ne0 * ne1)) % ne2
                    j3 = k // (ne0 * ne1 * ne2)
                    n = min(ne0 - j0, ne00 - i0)               # a run that stays in one destination row
                    dst = w[DST + A] + j0 * d0 + j1 * w[DST + NB + 1] + j2 * w[DST + NB + 2] + j3 * w[DST + NB + 3]
                    _convert(conv, src + i0 * s0, dst, n, s0, d0, f16)
                    i0 += n
    return 0


# -- the registry -----------------------------------------------------------------------------------------
KERNELS = {f.__name__: f for f in (binary_f32, scale_f32, rms_norm_f32, get_rows, set_rows, copy)}
_COMPILED: dict[str, object] = {}


def register(fn) -> None:
    """Add a kernel of this calling convention (another module's: ``nodes_mm``, which its users import
    beside this one)."""
    KERNELS[fn.__name__] = fn


def compile_kernel(name: str):
    """The cfunc of kernel `name`, compiled or loaded from the cache."""
    got = _COMPILED.get(name)
    if got is None:
        got = _COMPILED[name] = cfunc(_SIG, nopython=True, cache=True, error_model="numpy")(KERNELS[name])
    return got


def address(name: str) -> int:
    """The address of kernel `name` (``kernels.runner``'s step rows hold it)."""
    return compile_kernel(name).address


# -- rope (ops.rope) -----------------------------------------------------------------------------------
def rope_f32(row, frow, ith, nth, wdata):
    """Rows (i1 fastest, then i2, i3) in blocks; pairs below n_dims rotated by the cos/sin caches of
    their token (i2: rows of P+3 and P+4, P+5 floats a row, made before the compute from the
    positions, as the forward makes them), the rest copied. P: NEOX (pairs i, i + n_dims/2, else 2i,
    2i + 1), n_dims, x86 (each rotation contracted to one FMA)."""
    w = words(row, ROW)
    neox, n_dims, fma = w[P], w[P + 1], w[P + 2]
    cs, sn, width = f32s(w[P + 3]), f32s(w[P + 4]), w[P + 5]
    ne0, ne1, ne2, ne3 = w[SRC0 + NE], w[SRC0 + NE + 1], w[SRC0 + NE + 2], w[SRC0 + NE + 3]
    r0, r1 = row_block(ne1 * ne2 * ne3, ith, nth)
    half = n_dims // 2
    x, y = f32s(w[SRC0 + A]), f32s(w[DST + A])
    for r in range(r0, r1):
        i1 = r % ne1
        i2 = (r // ne1) % ne2
        i3 = r // (ne1 * ne2)
        xo = (i1 * w[SRC0 + NB + 1] + i2 * w[SRC0 + NB + 2] + i3 * w[SRC0 + NB + 3]) // 4
        yo = (i1 * w[DST + NB + 1] + i2 * w[DST + NB + 2] + i3 * w[DST + NB + 3]) // 4
        co = i2 * width
        for i in range(half):
            if neox != 0:
                j0, j1 = i, i + half
            else:
                j0, j1 = 2 * i, 2 * i + 1
            x0, x1, c, s = x[xo + j0], x[xo + j1], cs[co + i], sn[co + i]
            if fma != 0:
                y0 = fmaf(x0, c, -mul1(x1, s))
                y1 = fmaf(x0, s, mul1(x1, c))
            else:
                y0 = mul1(x0, c) - mul1(x1, s)
                y1 = add1(mul1(x0, s), mul1(x1, c))
            y[yo + j0] = y0
            y[yo + j1] = y1
        for j in range(n_dims, ne0):
            y[yo + j] = x[xo + j]
    return 0


# -- gelu (ops.unary) ------------------------------------------------------------------------------------
@njit(inline="always")
def numpy_f16_bits(u):
    """The fp16 bits numpy's float32 -> float16 cast gives (npy_floatbits_to_halfbits): RNE like
    GGML's, but a NaN keeps its payload's top bits (made a NaN still if they are all zero)."""
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        h = ((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7C00) | ((u & np.uint32(0x7FFFFF)) >> np.uint32(13))
        if (h & np.uint32(0x3FF)) == 0:
            h += np.uint32(1)
        return h
    return _f16_bits(u)


def gelu_f32(row, frow, ith, nth, wdata):
    """GELU through GGML's fp16 table (P: its address): rows in blocks (``elementwise_share``), row i
    at i*nb1 (GGML's walk); the table's value at x's fp16 bits, x itself from 10 up, 0 from -10 down."""
    w = words(row, ROW)
    table = f32s(w[P])
    ne0 = w[DST + NE]
    r0, r1, c0, c1 = elementwise_share(w[DST + NE + 1] * w[DST + NE + 2] * w[DST + NE + 3], ne0, ith, nth)
    x, y = f32s(w[SRC0 + A]), f32s(w[DST + A])
    xu = carray(voidptr(w[SRC0 + A]), (_BIG,), np.uint32)
    xn, yn = w[SRC0 + NB + 1] // 4, w[DST + NB + 1] // 4
    for r in range(r0, r1):
        for i in range(c0, c1):
            v = x[r * xn + i]
            if v >= F32(10.0):
                out = v
            elif v <= F32(-10.0):
                out = F32(0.0)
            else:
                out = table[np.int64(numpy_f16_bits(xu[r * xn + i]))]
            y[r * yn + i] = out
    return 0


# -- silu (ops.unary) ------------------------------------------------------------------------------------
def silu_f32(row, frow, ith, nth, wdata):
    """SILU under GGML's numerics, as the forward's numpy: x / (1 + expf(-x)), expf ``float_rows``'
    (portable_math's exp, rounded once; P .. P+3: the addresses of its constants and tables, 8, 32,
    32 and 1201 float64s), a NaN's exp its bits made quiet; rows in blocks (``elementwise_share``),
    row i at i*nb1."""
    w = words(row, ROW)
    k0 = carray(voidptr(w[P]), (8,), np.float64)
    t_hi = carray(voidptr(w[P + 1]), (32,), np.float64)
    t_lo = carray(voidptr(w[P + 2]), (32,), np.float64)
    pow2 = carray(voidptr(w[P + 3]), (1201,), np.float64)
    ne0 = w[DST + NE]
    r0, r1, c0, c1 = elementwise_share(w[DST + NE + 1] * w[DST + NE + 2] * w[DST + NE + 3], ne0, ith, nth)
    x, y = f32s(w[SRC0 + A]), f32s(w[DST + A])
    xn, yn = w[SRC0 + NB + 1] // 4, w[DST + NB + 1] // 4
    nan = np.empty(1, np.uint32)
    nanf = view_as(nan, np.float32)
    for r in range(r0, r1):
        for i in range(c0, c1):
            v = x[r * xn + i]
            m = -v
            if m != m:
                nanf[0] = m
                nan[0] |= np.uint32(0x400000)
                e = nanf[0]
            else:
                e = F32(_exp64(np.float64(m), k0, t_hi, t_lo, pow2))
            y[r * yn + i] = v / add1(F32(1.0), e)
    return 0


# -- soft_max under GGML's numerics (ops.softmax) --------------------------------------------------------------
@njit(inline="always")
def _soft_max_rows(w, f, ith, nth):
    """What both soft_max kernels read of their row: the scale, ne0, ne1, this participant's rows,
    src0 and dst as f32 and their row strides in floats."""
    ne0, ne1 = w[SRC0 + NE], w[SRC0 + NE + 1]
    r0, r1 = row_block(ne1 * w[SRC0 + NE + 2] * w[SRC0 + NE + 3], ith, nth)
    return (F32(f[0]), ne0, ne1, r0, r1, f32s(w[SRC0 + A]), f32s(w[DST + A]),
            w[SRC0 + NB + 1] // 4, w[DST + NB + 1] // 4)


@njit(inline="always")
def ggml_max(m, v):
    """GGML's MAX(m, v), (m > v ? m : v): a NaN v is taken, and a NaN m gives way to the next value."""
    return m if m > v else v


def soft_max_f32(row, frow, ith, nth, wdata):
    """Rows in blocks (row i at i*nb1), as the forward's numpy: w = x*scale (plus the mask row
    i % ne1, packed, f32 or f16: P), m = GGML's max of w in order (``ggml_max``), e = expf(w - m)
    (P+1 .. P+4: exp's constants and tables), the sum of e in double in order, y = e * (float)(1/sum);
    where both operands of an operation are NaN the first one's bits, as x86 and numpy give them."""
    w, f = words(row, ROW), f64s(frow)
    mkind = w[P]
    k0 = carray(voidptr(w[P + 1]), (8,), np.float64)
    t_hi = carray(voidptr(w[P + 2]), (32,), np.float64)
    t_lo = carray(voidptr(w[P + 3]), (32,), np.float64)
    pow2 = carray(voidptr(w[P + 4]), (1201,), np.float64)
    f16 = carray(voidptr(w[P + 5]), (65536,), np.float32)
    scale, ne0, ne1, r0, r1, x, y, xn, yn = _soft_max_rows(w, f, ith, nth)
    mf, mh = f32s(w[SRC1 + A]), u16s(w[SRC1 + A])
    tw = np.empty(ne0, np.float32)
    for r in range(r0, r1):
        mx = F32(-np.inf)
        mo = (r % ne1) * ne0
        for i in range(ne0):
            v = mul1(x[r * xn + i], scale)
            if mkind != 0:
                m = mf[mo + i] if mkind == 1 else f16[np.int64(mh[mo + i])]
                v = add1(v, F32(1.0) * m)
            tw[i] = v
            mx = ggml_max(mx, v)
        for i in range(ne0):
            tw[i] = tw[i] - mx
        _exp_f32(tw, tw, k0, t_hi, t_lo, pow2)
        total = 0.0
        for i in range(ne0):        # a NaN is sticky: a sum that ends a number met none
            total += np.float64(tw[i])
        if total != total:          # again, where two NaNs meet the first one's bits (~2x the cost)
            total = 0.0
            for i in range(ne0):
                s = total + np.float64(tw[i])
                total = total + 0.0 if s != s and total != total else s
        inv = F32(1.0 / total)
        for i in range(ne0):
            y[r * yn + i] = mul1(tw[i], inv)
    return 0


# -- soft_max under llama.cpp's numerics (ops.softmax) ---------------------------------------------------------
def soft_max_x86(row, frow, ith, nth, wdata):
    """Rows in blocks (row i at i*nb1): w = x*scale, plus the mask row (i % ne1, packed, f32 or f16:
    P+1) through an FMA with slope 1, then ``x86.soft_max_rows`` (P: wide, P+2: its constants)."""
    w, f = words(row, ROW), f64s(frow)
    wide, mkind = w[P], w[P + 1]
    e = carray(voidptr(w[P + 2]), (9,), np.float32)
    f16 = carray(voidptr(w[P + 3]), (65536,), np.float32)
    scale, ne0, ne1, r0, r1, x, y, xn, yn = _soft_max_rows(w, f, ith, nth)
    tw = np.empty((1, ne0), np.float32)
    ty = np.empty((1, ne0), np.float32)
    mf, mh = f32s(w[SRC1 + A]), u16s(w[SRC1 + A])
    for r in range(r0, r1):
        for i in range(ne0):
            tw[0, i] = mul1(x[r * xn + i], scale)
        if mkind != 0:
            mo = (r % ne1) * ne0
            for i in range(ne0):
                m = mf[mo + i] if mkind == 1 else f16[np.int64(mh[mo + i])]
                tw[0, i] = fmaf(F32(1.0), m, tw[0, i])
        soft_max_rows(tw, ty, e, wide != 0)
        for i in range(ne0):
            y[r * yn + i] = ty[0, i]
    return 0


for _fn in (rope_f32, gelu_f32, silu_f32, soft_max_f32, soft_max_x86):
    KERNELS[_fn.__name__] = _fn
