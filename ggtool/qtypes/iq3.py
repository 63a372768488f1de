"""IQ3_XXS and IQ3_S: 3-bit "true" quants on lattice grids (ggml-common.h's block_iq3_*).

Each group of 4 values is one point of a grid of 4 magnitudes (``grids``' iq3xxs_grid: 256
points of levels 4..62; iq3s_grid: 512 points of levels 1..15), signs per 8 values as in IQ2.

* IQ3_XXS (98 bytes, 3.06 bpw): fp16 d, qs[64] (a grid index a byte per 4 values), then per 32
  values a uint32 of 4 x 7 sign bits (ksigns_iq2xs) and a 4-bit scale s in bits 28..31:
  value = d * (0.5 + s) * 0.5 * grid * sign.
* IQ3_S (110 bytes, 3.44 bpw): fp16 d, qs[64] (index low bytes), qh[8] (the 9th bits), signs[32]
  (a byte per 8 values), scales[4] (a 4-bit s per 32 values): value = d * (1 + 2s) * grid * sign.

The quantizers are ggml-quants.c's quantize_iq3_xxs / quantize_iq3_s (block size 32) with
iq3xs_init_impl's tables (``_iq23_kernels``); both take an importance matrix or none (without one
the weights are x*x), but llama-quantize refuses IQ3_XXS tensors without one. The dot is ggml_vec_dot_iq3_*_q8_K_generic.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from .. import types as T
from . import QType, compiled, grids, kform_x86, serial

F32 = np.float32
_K = "_iq23_kernels"


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, at:at + 2]).view(np.float16)[:, 0].astype(F32)


def _signed4x2(g1: np.ndarray, g2: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """Two 4-value points (..., 4) side by side, times -1 where bit j of signs (...,) is set."""
    vals = np.concatenate([g1, g2], axis=-1)
    neg = (signs[..., None].astype(np.uint8) & grids.KMASK_IQ2XS) != 0
    return vals * np.where(neg, F32(-1.0), F32(1.0))


@cache
def _quant_tables(name: str) -> tuple:
    """iq3xs_init_impl's (grid, map, neighbours), built once per process."""
    from . import _iq23_kernels as k
    kgrid, nwant = {"iq3_xxs": (grids.KGRID_3BIT_256, 2), "iq3_s": (grids.KGRID_3BIT_512, 3)}[name]
    return k.iq3_tables(kgrid, nwant)


@cache
def _dot_args(name: str) -> tuple:
    from ..kernels.tables import F16_TO_F32
    grid = {"iq3_xxs": grids.IQ3XXS_GRID, "iq3_s": grids.IQ3S_GRID}[name]
    return np.ascontiguousarray(grid.view(np.uint8)), np.ascontiguousarray(grids.KSIGNS_IQ2XS), F16_TO_F32


class _IQ3(QType):
    block_size = 256
    vec_dot_type = T.GGMLType.Q8_K
    ggml_requires_imatrix = False
    llama_cpp = kform_x86(gemv_wrap=True, tiled_wrap=False)   # AVX2 vec_dot: signs on the activations

    @classmethod
    def quantizer_tables(cls) -> tuple:
        return _quant_tables(cls.name)

    @classmethod
    def dot_args(cls) -> tuple:
        return _dot_args(cls.name)

    @classmethod
    def quantize_ref(cls, x, *, name: str = "tensor", run=serial) -> np.ndarray:
        """quantize_row_iq3_*_ref: the quantizer without quant_weights."""
        return cls.quantize(x, None, name=name, run=run)


class IQ3_XXS(_IQ3, ggml_type=T.GGMLType.IQ3_XXS):
    type_size = 98
    needs_imatrix = True                   # llama-quantize's rule; GGML's quantizer takes none too
    quantize_kernel = compiled(_K, "quantize_iq3_xxs")
    dot_kernel = compiled(_K, "dot_iq3_xxs")
    mul_mat_kernel = compiled(_K, "mul_mat_iq3_xxs")
    k_form = compiled(_K, "k_form_iq3_xxs")
    dot_final = F32(0.25)

    @classmethod
    def grids(cls) -> dict[str, np.ndarray]:
        return {"iq3xxs_grid": grids.IQ3XXS_GRID, "ksigns_iq2xs": grids.KSIGNS_IQ2XS, "kmask_iq2xs": grids.KMASK_IQ2XS}

    @classmethod
    def dequantize_blocks(cls, b: np.ndarray) -> np.ndarray:
        """dequantize_row_iq3_xxs: db = d * (0.5 + (aux >> 28)) * 0.5 per 32 values."""
        n = b.shape[0]
        qs = b[:, 2:66].reshape(n, 8, 4, 2)
        aux = np.ascontiguousarray(b[:, 66:98]).view("<u4").reshape(n, 8)
        db = (_f16(b, 0)[:, None] * (F32(0.5) + (aux >> 28).astype(F32))) * F32(0.5)
        signs = grids.KSIGNS_IQ2XS[(aux[:, :, None] >> (7 * np.arange(4, dtype=np.uint32))) & 127]   # (n, 8, 4)
        g = grids.IQ3XXS_GRID.view(np.uint8).reshape(-1, 4)
        vals = np.concatenate([g[qs[..., 0]], g[qs[..., 1]]], axis=-1).astype(F32)   # (n, 8, 4, 8)
        neg = (signs[..., None] & grids.KMASK_IQ2XS) != 0
        return ((db[:, :, None, None] * vals) * np.where(neg, F32(-1.0), F32(1.0))).reshape(n, 256)


class IQ3_S(_IQ3, ggml_type=T.GGMLType.IQ3_S):
    type_size = 110
    needs_imatrix = False
    quantize_kernel = compiled(_K, "quantize_iq3_s")
    dot_kernel = compiled(_K, "dot_iq3_s")
    mul_mat_kernel = compiled(_K, "mul_mat_iq3_s")
    k_form = compiled(_K, "k_form_iq3_s")
    dot_final = F32(1.0)

    @classmethod
    def grids(cls) -> dict[str, np.ndarray]:
        return {"iq3s_grid": grids.IQ3S_GRID, "kmask_iq2xs": grids.KMASK_IQ2XS}

    @classmethod
    def dequantize_blocks(cls, b: np.ndarray) -> np.ndarray:
        """dequantize_row_iq3_s: db = d * (1 + 2 * nibble) per 32 values; index qs | 9th bit of qh."""
        n = b.shape[0]
        qs = b[:, 2:66].reshape(n, 8, 4, 2).astype(np.int64)
        qh = b[:, 66:74].astype(np.int64)[:, :, None]                                  # (n, 8, 1)
        l4 = np.arange(4)
        i1 = qs[..., 0] | ((qh << (8 - 2 * l4)) & 256)
        i2 = qs[..., 1] | ((qh << (7 - 2 * l4)) & 256)
        signs = b[:, 74:106].reshape(n, 8, 4)
        sc = b[:, 106:110]
        nib = np.stack([sc & 15, sc >> 4], axis=-1).reshape(n, 8).astype(np.int64)
        db = _f16(b, 0)[:, None] * (1 + 2 * nib).astype(F32)
        g = grids.IQ3S_GRID.view(np.uint8).reshape(-1, 4)
        vals = np.concatenate([g[i1], g[i2]], axis=-1).astype(F32)
        neg = (signs[..., None] & grids.KMASK_IQ2XS) != 0
        return ((db[:, :, None, None] * vals) * np.where(neg, F32(-1.0), F32(1.0))).reshape(n, 256)
