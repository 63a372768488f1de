"""The test oracle of ggtool.kernels.dot: GGML's scalar Q4_0/Q8_0 x Q8_0 dot product in plain numpy
(per block: exact integer sum, then (sumi * d_w) * d_a added in block order, float32), and its
scalar BF16 x BF16 dot (``mul_mat_bf16``: float32 products summed in double, in order)."""

from __future__ import annotations

import numpy as np

from ggtool import types as T

Q4_0_BYTES, Q8_0_BYTES = 18, 34

# bytes per block, values per block, offsets of the block's fp16 scales
BLOCKS = {"q4_0": (18, 32, [0]), "q4_1": (20, 32, [0, 2]), "q5_0": (22, 32, [0]), "q5_1": (24, 32, [0, 2]), "q8_0": (34, 32, [0]),
          "q2_K": (84, 256, [80, 82]), "q3_K": (110, 256, [108]), "q4_K": (144, 256, [0, 2]),
          "q5_K": (176, 256, [0, 2]), "q6_K": (210, 256, [208])}


def random_blocks(t: str, n: int, k: int, seed: int) -> np.ndarray:
    """n rows of k values of random type-t blocks whose fp16 scales are small normal numbers."""
    nbytes, qk, scales = BLOCKS[t]
    w = np.random.default_rng(seed).integers(0, 256, (n, k // qk, nbytes), dtype=np.uint8)
    for o in scales:
        w[..., o + 1] = w[..., o + 1] % 0x20 + 0x08
    return w.reshape(n, -1)


def mul_mat_exact(w_raw, w_type, act_raw) -> np.ndarray:
    wt = T.parse_type(w_type)
    w_raw, act_raw = np.atleast_2d(w_raw), np.atleast_2d(act_raw)
    N, M = w_raw.shape[0], act_raw.shape[0]
    wb = Q4_0_BYTES if wt == T.Q4_0 else Q8_0_BYTES
    nb = w_raw.shape[1] // wb
    wblk = w_raw.reshape(N, nb, wb)
    dW = np.ascontiguousarray(wblk[:, :, :2]).view(np.float16).astype(np.float32)[..., 0]   # (N, nb)
    if wt == T.Q4_0:
        qs = wblk[:, :, 2:]
        cw = np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.int32) - 8                  # (N, nb, 32)
    else:
        cw = wblk[:, :, 2:].view(np.int8).astype(np.int32)
    ablk = act_raw.reshape(M, nb, Q8_0_BYTES)
    dA = np.ascontiguousarray(ablk[:, :, :2]).view(np.float16).astype(np.float32)[..., 0]  # (M, nb)
    qa = ablk[:, :, 2:].view(np.int8).astype(np.int32)                                     # (M, nb, 32)
    out = np.zeros((M, N), np.float32)
    for b in range(nb):
        sumi = (qa[:, b, :] @ cw[:, b, :].T).astype(np.float32)                             # exact ints
        out += (sumi * dW[None, :, b]) * dA[:, b, None]
    return out


def quantize_q8_k(x) -> np.ndarray:
    """quantize_row_q8_K_ref in numpy: per 256 values the signed value of largest |x| (first on ties)
    gives iscale = -127/max; q = min(127, nearest(iscale * x)); d = 1/iscale; bsums per 16."""
    x = np.asarray(x, np.float32).reshape(-1, 256)
    out = np.zeros((x.shape[0], 292), np.uint8)
    for i, row in enumerate(x):
        mx = row[int(np.argmax(np.abs(row)))]
        if mx == 0:
            continue
        iscale = np.float32(-127.0) / mx
        q = np.minimum(np.rint(iscale * row), 127).astype(np.int8)
        out[i, 0:4] = np.array([np.float32(1.0) / iscale], np.float32).view(np.uint8)
        out[i, 4:260] = q.view(np.uint8)
        out[i, 260:] = q.reshape(16, 16).astype(np.int32).sum(1).astype(np.int16).view(np.uint8)
    return out


def dequantize_q8_k(raw) -> np.ndarray:
    b = np.asarray(raw, np.uint8).reshape(-1, 292)
    d = b[:, 0:4].copy().view(np.float32)
    return (b[:, 4:260].view(np.int8).astype(np.float64) * d).reshape(np.asarray(raw).shape[0], -1)


def mul_mat_bf16(w_bits, act_bits) -> np.ndarray:
    """GGML's scalar ggml_vec_dot_bf16 in plain numpy: out[m, n] = (float) of the double sum, in k
    order from +0.0, of the float32 products of weight row n and activation row m (bf16 bits,
    widened exactly). np.cumsum adds in order (np.sum would add pairwise)."""
    w = (np.atleast_2d(w_bits).astype(np.uint32) << 16).view(np.float32)                # (N, K)
    a = (np.atleast_2d(act_bits).astype(np.uint32) << 16).view(np.float32)              # (M, K)
    out = np.empty((a.shape[0], w.shape[0]), np.float32)
    for m in range(a.shape[0]):
        prods = np.zeros((w.shape[0], w.shape[1] + 1))                                 # sumf = 0 first
        with np.errstate(all="ignore"):                                                # inf, NaN are values
            prods[:, 1:] = w * a[m]                                                    # float32 products
            out[m] = np.cumsum(prods, axis=1)[:, -1].astype(np.float32)
    return out
