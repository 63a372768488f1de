"""The test oracle of ggtool.kernels.dot: GGML's scalar Q4_0/Q8_0 x Q8_0 dot product in plain numpy
(per block: exact integer sum, then (sumi * d_w) * d_a added in block order, float32)."""

from __future__ import annotations

import numpy as np

from ggtool import types as T

Q4_0_BYTES, Q8_0_BYTES = 18, 34


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
