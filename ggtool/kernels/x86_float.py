"""llama.cpp's x86-64 orders for F16 and BF16 weights (``ggtool.kernels.x86`` holds F32; docs/engine.md,
numerics). llama.cpp converts the activations to the weights' type first (F16: round to nearest even,
BF16: GGML_FP32_TO_BF16), so every product is exact in float32; the sums follow the build:

- from 2 activation rows, with K a multiple of the lanes and the weights' rows in fours, llamafile's
  tinyBLAS: F16 as F32's tinyBLAS (16 FMA lanes over k, ``_mm512_reduce_add_ps``; AVX2: 8 lanes,
  hsum_float_8); BF16 on the AVX-512 build ``tinyBLAS<32, __m512, __m512bh>``: 16 lanes, each step one
  ``vdpbf16ps`` over a pair of values, on AVX2 8 FMA lanes.
- otherwise ``ggml_vec_dot_f16`` (F32's 4 x 16 / 4 x 8 lanes and their reduce, then the tail's
  products added in double) and ``ggml_vec_dot_bf16`` (AVX-512 BF16: two accumulators of ``vdpbf16ps``
  over steps of 64, each reduced and added in double; AVX2: 4 x 8 lanes over steps of 32, ``(c1 + c3) +
  (c2 + c4)`` then hsum_float_8; then the tail in double).

``vdpbf16ps`` (the AVX-512 build is one for a CPU with AVX512_BF16, as -march=native makes on this
machine class: Zen 4, Sapphire Rapids) adds the odd pair's product, then the even one's, each rounded
to nearest even, treating denormal inputs and results as zero (measured on the bench's native build).
"""

from __future__ import annotations

import numpy as np

from .jit import njit
from .x86 import V0, _fold, hsum_float_8, _reduce16, fmaf

F32, F64 = np.float32, np.float64
F16_KIND, BF16_KIND = 0, 1
_TINY = np.float32(2.0 ** -126)


@njit
def _ftz(x):
    return F32(0.0) * x if abs(x) < _TINY else x


@njit
def _dpbf16(c, a_even, b_even, a_odd, b_odd):
    """One lane of vdpbf16ps: c + a_odd * b_odd, then + a_even * b_even, denormals flushed."""
    t = _ftz(c + _ftz(_ftz(a_odd) * _ftz(b_odd)))
    return _ftz(t + _ftz(_ftz(a_even) * _ftz(b_even)))


@njit
def dot_half(a, kind, b, out, tiny, wide, table):
    """out (M, N) = b (M, K) . a (N, K)^T for F16 or BF16 (`kind`) bits (uint16) in both, `table` their
    float32 values (``tables.F16_TO_F32`` or ``BF16_TO_F32``): tinyBLAS if `tiny`, else the vec_dot;
    `wide`: the AVX-512 build (module docstring)."""
    N, M, K = a.shape[0], b.shape[0], a.shape[1]
    dp = kind == BF16_KIND and wide             # vdpbf16ps pairs
    if tiny:
        lanes = 16 if wide else 8
        step = 32 if dp else lanes
    elif dp:
        lanes, step = 32, 64                    # c1: values 0..31 of each 64 (pairs), c2: 32..63
    elif kind == BF16_KIND:
        lanes, step = 32, 32                    # c1..c4: 8 lanes each
    else:
        lanes = 64 if wide else 32
        step = lanes
    k_lanes = K - K % step
    at = np.empty((K, V0), F32)
    bm = np.empty(K, F32)
    acc = np.empty((lanes, V0), F32)
    c8 = np.empty(8, F32)
    red = np.empty(V0, F32)
    for n0 in range(0, N, V0):
        count = min(V0, N - n0)
        at[:, :] = 0
        for r in range(count):
            for k in range(K):
                at[k, r] = table[a[n0 + r, k]]
        for m in range(M):
            for k in range(K):
                bm[k] = table[b[m, k]]
            acc[:, :] = 0
            if dp:                              # lane j: values 2j, 2j + 1 of a step
                for k0 in range(0, k_lanes, 2):
                    al, ae, ao = acc[(k0 % step) // 2], at[k0], at[k0 + 1]
                    be, bo = bm[k0], bm[k0 + 1]
                    for r in range(count):
                        al[r] = _dpbf16(al[r], ae[r], be, ao[r], bo)
            else:
                for k in range(k_lanes):
                    al, ak, bk = acc[k % lanes], at[k], bm[k]
                    for r in range(V0):
                        al[r] = fmaf(ak[r], bk, al[r])
            if not tiny and not dp and kind == F16_KIND:
                _fold(acc, lanes, red, 0, count)    # F32's reduce
            for r in range(count):
                if tiny:
                    res = F64(_reduce16(acc[:16, r]) if wide else hsum_float_8(acc[:8, r]))
                elif dp:
                    res = F64(_reduce16(acc[:16, r]))
                    res += F64(_reduce16(acc[16:, r]))
                elif kind == BF16_KIND:         # (c1 + c3) + (c2 + c4), then hsum_float_8
                    for i in range(8):
                        c8[i] = (acc[i, r] + acc[16 + i, r]) + (acc[8 + i, r] + acc[24 + i, r])
                    res = F64(hsum_float_8(c8))
                else:
                    res = F64(red[r])
                for k in range(k_lanes, K):     # the tail's products in double
                    res += F64(at[k, r] * bm[k])
                out[m, n0 + r] = F32(res)
