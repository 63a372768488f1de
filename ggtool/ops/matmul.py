"""mul_mat: out[i, j, k, l] = row i of a . row j of b (spec 6.7, 8.2, 9.3).

With C-order arrays A (M, K) and B (N, K) the result is B @ A.T. Dims 2/3 broadcast by block
repeat: b-matrix (i12, i13) uses a-matrix (i12 // r2, i13 // r3).

When b's type is not vec_dot_type(a) (Q8_0 for Q4_0/Q8_0 weights, F16 for F16 weights), every
thread first converts its interleaved b rows into the work buffer (packed rows at
i13*nbw3 + i12*nbw2 + i11*nbw1), then all threads meet at the barrier. The output is then cut
into GGML's chunks; each thread takes a static, contiguous run of chunk numbers (GGML hands
them out dynamically, which changes nothing in the result) and computes it with one BLAS call
or one quantized dot per rectangle and matrix.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from .base import ALL, check, fmt_ne, function, kernel, new_op
from .walk import require, require_type, with_shape

WEIGHT_TYPES = (T.F32, T.F16, T.Q4_0, T.Q8_0)


def _work_size(node, n_tasks: int) -> int:
    """row_size(vec_dot_type, nelements(b)) when b must be converted, else 0 (not per thread)."""
    a, b = node.src
    vdt = T.vec_dot_type(a.type)
    return 0 if b.type == vdt else T.row_size(vdt, b.nelements)


def _check_layout(node, a, b) -> None:
    require(node.ne == (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), "mul_mat", "result shape does not match a and b")
    require(a.nb[0] == T.type_size(a.type) and b.nb[0] == T.type_size(b.type), "mul_mat",
            "a and b must not be permuted in dim 0 (nb0 == type size)")
    nb = node.nb
    require(nb[0] == 4 and nb[0] <= nb[1] <= nb[2] <= nb[3], "mul_mat", "the result must not be transposed or permuted")


def _convert_src1(b, vdt, work, ith: int, nth: int) -> np.ndarray:
    """Rows i11 = ith, ith+nth, ... of every b matrix, converted to vdt into the work buffer."""
    from .. import quant

    ne10, ne11, ne12, ne13 = b.ne
    nbw1 = T.row_size(vdt, ne10)
    raw = work.wdata[: ne13 * ne12 * ne11 * nbw1].reshape(ne13, ne12, ne11, nbw1)
    x = b.data[:, :, ith::nth]
    if x.size:
        if vdt == T.F16:
            conv = quant.fp32_to_fp16(np.ascontiguousarray(x)).view(np.uint8)
        else:  # Q8_0: the CPU (AVX2) from_float, as GGML's mul_mat
            conv = quant.quantize_q8_0_cpu(np.ascontiguousarray(x).reshape(-1, ne10))
        raw[:, :, ith::nth] = conv.reshape(*x.shape[:3], nbw1)
    return raw.view(np.float16) if vdt == T.F16 else raw


def _chunking(nr0: int, nr1: int, nth: int) -> tuple[int, int, int, int]:
    """GGML's chunk grid: (nchunk0, nchunk1, dr0, dr1)."""
    size = 64 if nr0 == 1 or nr1 == 1 else 16
    nchunk0, nchunk1 = -(-nr0 // size), -(-nr1 // size)
    if nchunk0 * nchunk1 < 4 * nth:  # too few chunks: one per thread along the longer side
        nchunk0, nchunk1 = (nth, 1) if nr0 > nr1 else (1, nth)
    return nchunk0, nchunk1, -(-nr0 // nchunk0), -(-nr1 // nchunk1)


def _my_rectangles(nr0: int, nr1: int, ith: int, nth: int):
    """This thread's output as (row0, row1, col0, col1) rectangles (rows = flattened i11..i13)."""
    nchunk0, nchunk1, dr0, dr1 = _chunking(nr0, nr1, nth)
    total = nchunk0 * nchunk1
    lo, hi = (ith, min(ith + 1, total)) if nth >= total else (ith * total // nth, (ith + 1) * total // nth)
    c = lo
    while c < hi:
        c1, c0 = divmod(c, nchunk0)
        if c0 == 0 and c + nchunk0 <= hi:  # whole rows of chunks
            n = (hi - c) // nchunk0
            span = (c1, c1 + n, 0, nchunk0)
        else:
            end = min(hi, (c1 + 1) * nchunk0)
            span = (c1, c1 + 1, c0, end - c1 * nchunk0)
        c += (span[1] - span[0]) * (span[3] - span[2])
        r0, r1 = span[0] * dr1, min(span[1] * dr1, nr1)
        k0, k1 = span[2] * dr0, min(span[3] * dr0, nr0)
        if r0 < r1 and k0 < k1:
            yield r0, r1, k0, k1


def _dot_block(a, w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out (m, n) = x (m, K) . w (n, K)^T in a's arithmetic."""
    if a.type == T.F32:
        np.matmul(x, w.T, out=out)
    elif a.type == T.F16:  # f16 x f16 products are exact in float32; sums in float32
        np.matmul(x.astype(np.float32), w.astype(np.float32).T, out=out)
    else:
        from .. import quant
        out[...] = quant.mul_mat_q8_0(np.ascontiguousarray(w), a.type, np.ascontiguousarray(x))


def _whole(a, act, out, r2: int, r3: int) -> bool:
    """The whole result in one batched BLAS call (float weights, nth == 1). False if the
    layouts cannot be regrouped without copying."""
    ne03, ne02, _, k = a.shape
    w = a.data if a.type == T.F32 else a.data.astype(np.float32)
    x = act if act.dtype == np.float32 else act.astype(np.float32)
    if ne03 == ne02 == 1 and out.shape[:2] == (1, 1):
        np.matmul(x[0, 0], w[0, 0].T, out=out[0, 0])
        return True
    ne11, ne0 = out.shape[2], out.shape[3]
    x6 = with_shape(x, (ne03, r3, ne02, r2, ne11, k))
    o6 = with_shape(out, (ne03, r3, ne02, r2, ne11, ne0))
    if x6 is None or o6 is None:
        return False
    np.matmul(x6, w[:, None, :, None].swapaxes(-1, -2), out=o6)
    return True


@kernel("MUL_MAT", n_tasks=ALL, work_size=_work_size)
def forward_mul_mat(node, ith, nth, work):
    a, b = node.src
    _check_layout(node, a, b)
    require_type(a, "mul_mat", WEIGHT_TYPES)
    vdt = T.vec_dot_type(a.type)
    if b.type != vdt:
        require(b.type == T.F32, "mul_mat",
                f"b '{b.name}' is {T.type_name(b.type)}; it must be f32 (converted to {T.type_name(vdt)}) or {T.type_name(vdt)}")
        act = _convert_src1(b, vdt, work, ith, nth)
        work.barrier()
    else:
        act = b.data
    out = node.data
    ne0, ne1, ne2, _ = node.ne
    r2, r3 = b.ne[2] // a.ne[2], b.ne[3] // a.ne[3]
    if nth == 1 and a.type in (T.F32, T.F16) and _whole(a, act, out, r2, r3):
        return
    for row0, row1, col0, col1 in _my_rectangles(ne0, ne1 * ne2 * b.ne[3], ith, nth):
        for m in range(row0 // ne1, (row1 - 1) // ne1 + 1):  # one b matrix (i12, i13) at a time
            i13, i12 = divmod(m, ne2)
            i0, i1 = max(row0 - m * ne1, 0), min(row1 - m * ne1, ne1)
            _dot_block(a, a.data[i13 // r3, i12 // r2, col0:col1], act[i13, i12, i0:i1], out[i13, i12, i0:i1, col0:col1])


@function("mul_mat", "ggml_mul_mat(ctx, a, b)",
          "a . b^T row by row: result ne = [a.ne1, b.ne1, b.ne2, b.ne3] (F32); a's matrices repeat over b's dims 2/3")
def mul_mat(ctx, a, b):
    check(a.ne[0] == b.ne[0], "mul_mat", f"a '{a.name}' {fmt_ne(a)} and b '{b.name}' {fmt_ne(b)} need the same ne0")
    check(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0, "mul_mat",
          f"b '{b.name}' {fmt_ne(b)}: ne2/ne3 must be multiples of a '{a.name}' {fmt_ne(a)}'s ne2/ne3")
    check(not a.is_transposed(), "mul_mat", f"a '{a.name}' {fmt_ne(a)} nb={list(a.nb)} must not be transposed")
    return new_op(ctx, "MUL_MAT", T.F32, [a.ne[1], b.ne[1], b.ne[2], b.ne[3]], (a, b))
