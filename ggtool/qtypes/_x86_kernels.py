"""llama.cpp's x86 orders for the types of ggtool.qtypes' records whose dots share the K-quants' shape
(IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS): ggml-cpu/arch/x86/quants.c's AVX2 vec_dots (the
AVX-512 build compiles the same code: they have no AVX-512 branch) and ggml-cpu's tiled kernel
(tiled/, from 8 activation rows).

The weights come in the K form (``QType.x86_form``): per value a signed integer code, per 16 values
an integer scale, per block d. The integers are exact; what the x86 code adds in float32 is placed as
it places it:

- ``gemv``: per 256-value block 8 int32 lanes, lane l holding values 4l .. 4l+3 of every 32 (the
  pairs ``maddubs`` then ``madd`` forms), ``acc_l = fma(d_w * d_a, float(lane_l), acc_l)``; the result
  ``factor * hsum_float_8(acc)``. The codes' signs are put on the activations (``_mm256_sign_epi8``,
  or xor and subtract): an activation of -128 whose weight is negative stays -128 (int8 wraps), so
  that product is the weight's magnitude times -128 (``wrap``).
- ``tiled``: per block the integer sum s1 (exact: the IQ2/IQ3 codes are biased into unsigned bytes;
  IQ4_XS's signs go on the activations as above: ``wrap``), ``r = (d_w * factor) * float(s1)``,
  ``acc = fma(r, d_a, acc)``.

One activation row of Q8_K at a time (llama.cpp's from_float: quantize_row_q8_K_ref); scalar loops,
exact integers in int64.
"""

from __future__ import annotations

import numpy as np

from ..kernels.jit import njit
from ..kernels.x86 import hsum_float_8, fmaf

F32 = np.float32
Q8_K_BYTES = 292


@njit
def _q8_k_row(a):
    """A Q8_K row: (d float32 (nb,), codes int64 (nb, 256))."""
    nb = a.shape[0] // Q8_K_BYTES
    d = np.empty(nb, F32)
    q = np.empty((nb, 256), np.int64)
    for b in range(nb):
        o = Q8_K_BYTES * b
        d[b] = a[o:o + 4].copy().view(np.float32)[0]
        for k in range(256):
            q[b, k] = np.int8(a[o + 4 + k])
    return d, q


@njit
def _product(c, q, wrap):
    """code c times activation q, as the x86 code multiplies them: with `wrap`, |c| times q with c's
    sign put on q in int8 (-(-128) is -128)."""
    if wrap and c < 0 and q == -128:
        return -c * q
    return c * q


@njit
def _lanes(codes, scales, r, b, q, wrap, lanes):
    """Row r, block b: the 8 lanes of scale x code x activation (values 4l .. 4l+3 of every 32)."""
    lanes[:] = 0
    for e in range(256):
        lanes[(e % 32) // 4] += np.int64(scales[r, b, e // 16]) * _product(np.int64(codes[r, b, e]), q[e], wrap)


@njit
def gemv(codes, scales, d, act, factor, wrap, out):
    """out (M, n) = rows (codes int8 (n, nb, 256), scales int32 (n, nb, 16), d float32 (n, nb)) .
    Q8_K rows act (uint8 (M, nb * 292)): the AVX2 vec_dot's order."""
    n, nb = codes.shape[0], codes.shape[1]
    lanes = np.empty(8, np.int64)
    acc = np.empty(8, F32)
    for m in range(act.shape[0]):
        da, q = _q8_k_row(act[m])
        for r in range(n):
            acc[:] = 0
            for b in range(nb):
                _lanes(codes, scales, r, b, q[b], wrap, lanes)
                dd = F32(d[r, b] * da[b])
                for l in range(8):
                    acc[l] = fmaf(dd, F32(lanes[l]), acc[l])
            out[m, r] = F32(factor * hsum_float_8(acc))


@njit
def tiled(codes, scales, d, act, factor, wrap, out):
    """out (M, n) as ggml-cpu's tiled kernel: per block r = (d_w * factor) * float(s1), acc = fma(r, d_a, acc)."""
    n, nb = codes.shape[0], codes.shape[1]
    lanes = np.empty(8, np.int64)
    for m in range(act.shape[0]):
        da, q = _q8_k_row(act[m])
        for r in range(n):
            acc = F32(0.0)
            for b in range(nb):
                _lanes(codes, scales, r, b, q[b], wrap, lanes)
                res = F32(F32(d[r, b] * factor) * F32(lanes.sum()))
                acc = fmaf(res, da[b], acc)
            out[m, r] = acc


@njit
def gemv_ternary(codes, d, act, fused, out):
    """TQ1_0 / TQ2_0 (codes int8 (n, nb, 256): the trit - 1; d float32 (n, nb)) . Q8_K rows, as
    ggml_vec_dot_tq{1,2}_0_q8_K's AVX2 code: the stored trits (code + 1) times the activations in
    int16 lanes, the bsums subtracted, lane l of 8 holding values 4l .. 4l+3 of every 32 minus the
    bsums of values 32l .. 32l+31; ``acc_l = acc_l + float(lane_l) * (d_a * d_w)`` (`fused`: one FMA,
    as a compiler may contract it), then hsum_float_8. Never tiled: the tiled kernel has no TQ types."""
    n, nb = codes.shape[0], codes.shape[1]
    lanes = np.empty(8, np.int64)
    acc = np.empty(8, F32)
    for m in range(act.shape[0]):
        da, q = _q8_k_row(act[m])
        for r in range(n):
            acc[:] = 0
            for b in range(nb):
                lanes[:] = 0
                for e in range(256):
                    lanes[(e % 32) // 4] += (np.int64(codes[r, b, e]) + 1) * q[b, e]
                    lanes[e // 32] -= q[b, e]
                dd = F32(da[b] * d[r, b])
                for l in range(8):
                    acc[l] = fmaf(F32(lanes[l]), dd, acc[l]) if fused else F32(acc[l] + F32(F32(lanes[l]) * dd))
            out[m, r] = hsum_float_8(acc)


@njit
def _q8_0_row(a, nb, f16):
    """A Q8_0 row: d float32 (nb,), codes int64 (nb, 32)."""
    d = np.empty(nb, F32)
    q = np.empty((nb, 32), np.int64)
    for b in range(nb):
        o = 34 * b
        d[b] = f16[np.int64(a[o]) | (np.int64(a[o + 1]) << 8)]
        for k in range(32):
            q[b, k] = np.int8(a[o + 2 + k])
    return d, q


@njit
def gemv_pairs(levels, d, act, fused_tail, f16, out):
    """Rows of int8 levels (n, nb, 32) with a float32 scale per block (MXFP4) . Q8_0 rows, as the AVX2
    vec_dot of the 32-value LUT types (ggml_vec_dot_mxfp4_q8_0, as IQ4_NL's): blocks in pairs into two
    8-lane accumulators, lane l values 4l .. 4l+3, ``acc = fma(d_a * d_w, float(lane), acc)``, then
    hsum_float_8(acc1 + acc2); an odd last block ``sumf += (d_a * d_w) * float(sum)`` (`fused_tail`:
    contracted to one FMA)."""
    n, nb = levels.shape[0], levels.shape[1]
    c = np.empty((2, 8), F32)
    for m in range(act.shape[0]):
        da, q = _q8_0_row(act[m], nb, f16)
        for r in range(n):
            c[:, :] = 0
            for b in range(nb - nb % 2):
                dd = F32(da[b] * d[r, b])
                for l in range(8):
                    s = np.int64(0)
                    for t in range(4):
                        s += np.int64(levels[r, b, 4 * l + t]) * q[b, 4 * l + t]
                    c[b % 2, l] = fmaf(dd, F32(s), c[b % 2, l])
            tot = np.empty(8, F32)
            for l in range(8):
                tot[l] = c[0, l] + c[1, l]
            sumf = hsum_float_8(tot)
            if nb % 2:
                b = nb - 1
                s = np.int64(0)
                for k in range(32):
                    s += np.int64(levels[r, b, k]) * q[b, k]
                dd = F32(da[b] * d[r, b])
                sumf = fmaf(dd, F32(s), sumf) if fused_tail else F32(sumf + F32(dd * F32(s)))
            out[m, r] = sumf


@njit
def repacked_b32(levels, d, act, f16, out):
    """Rows of int8 levels with a float32 scale per block, as llama.cpp's x86 repacked gemv/gemm of the
    32-value types (mxfp4_8x8: gemv_q4_b32_8x8_q8_0_lut_avx): per block the exact sum,
    ``acc = fma(float(isum), d_w * d_a, acc)``."""
    n, nb = levels.shape[0], levels.shape[1]
    for m in range(act.shape[0]):
        da, q = _q8_0_row(act[m], nb, f16)
        for r in range(n):
            acc = F32(0.0)
            for b in range(nb):
                s = np.int64(0)
                for k in range(32):
                    s += np.int64(levels[r, b, k]) * q[b, k]
                acc = fmaf(F32(s), F32(d[r, b] * da[b]), acc)
            out[m, r] = acc


@njit
def gemv_iq1(grid, ls, sign, d, act, per_lane_delta, fused, out):
    """IQ1_S / IQ1_M (grid int8 (n, nb, 256) -1/0/+1; ls int32 (n, nb, 16) the odd scale of each 16;
    sign int8 (n, nb, 256) the delta's sign of each value's group; d float32 (n, nb)) . Q8_K rows, as
    the AVX2 vec_dots: lanes of grid x q8 x scale (values 4l .. 4l+3 of every 32),
    ``acc = fma(d_a * d_w, float(lane), acc)``; the delta part IQ1_M's way (`per_lane_delta`: a second
    8-lane accumulator alike, the result ``hsum(acc) + 0.125 * hsum(acc2)``) or IQ1_S's (one integer
    per block, ``accum1 += (d_a * d_w) * float(sumi1)``, `fused`: contracted to an FMA; the result
    ``hsum(acc) + 0.125 * accum1``)."""
    n, nb = grid.shape[0], grid.shape[1]
    lanes = np.empty(8, np.int64)
    lanes2 = np.empty(8, np.int64)
    acc = np.empty(8, F32)
    acc2 = np.empty(8, F32)
    delta = F32(0.125)
    for m in range(act.shape[0]):
        da, q = _q8_k_row(act[m])
        for r in range(n):
            acc[:] = 0
            acc2[:] = 0
            accum1 = F32(0.0)
            for b in range(nb):
                _lanes(grid, ls, r, b, q[b], False, lanes)
                _lanes(sign, ls, r, b, q[b], False, lanes2)
                dd = F32(da[b] * d[r, b])
                for l in range(8):
                    acc[l] = fmaf(dd, F32(lanes[l]), acc[l])
                    if per_lane_delta:
                        acc2[l] = fmaf(dd, F32(lanes2[l]), acc2[l])
                if not per_lane_delta:
                    s1 = np.int64(0)
                    for l in range(8):
                        s1 += lanes2[l]
                    accum1 = fmaf(dd, F32(s1), accum1) if fused else F32(accum1 + F32(dd * F32(s1)))
            if per_lane_delta:
                out[m, r] = F32(hsum_float_8(acc) + F32(delta * hsum_float_8(acc2)))
            else:
                out[m, r] = F32(hsum_float_8(acc) + F32(delta * accum1))
