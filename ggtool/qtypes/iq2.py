"""IQ2_XXS, IQ2_XS and IQ2_S: 2-bit "true" quants on lattice grids (ggml-common.h's block_iq2_*).

Each group of 8 values is one point of a grid of 8 magnitudes (levels 8, 25, 43: ``grids``'
iq2xxs/iq2xs/iq2s_grid, 256/512/1024 points) with 8 (IQ2_S) or 7 sign bits (the 8th makes the
count of minus signs even: ksigns_iq2xs), scaled per 32 (IQ2_XXS) or 16 values by a 4-bit scale
of the block's fp16 d: value = d * (0.5 + s) * 0.25 * grid * sign.

* IQ2_XXS (66 bytes, 2.06 bpw): fp16 d, then per 32 values two uint32: 4 grid indices (a byte
  each), and 4 x 7 sign bits with the scale in bits 28..31.
* IQ2_XS (74 bytes, 2.31 bpw): fp16 d, uint16 qs[32] (9-bit index | 7 sign bits << 9),
  scales[8] (two 4-bit scales, one per 16 values).
* IQ2_S (82 bytes, 2.56 bpw): fp16 d, qs[32] (index low bytes), signs[32] (a byte per 8 values),
  qh[8] (the index's 2 high bits, four per byte), scales[8].

The quantizers are ggml-quants.c's quantize_iq2_xxs / _xs / _s with iq2xs_init_impl's tables
(``_iq23_kernels``); IQ2_XXS and IQ2_XS need an importance matrix (GGML asserts one), IQ2_S takes
one or none (llama-quantize refuses all three without one). The dot is ggml_vec_dot_iq2_*_q8_K_generic (the integer sums exact, the float ones in
GGML's order).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from .. import types as T
from . import QType, compiled, grids, kform_x86, serial

F32 = np.float32
_K = "_iq23_kernels"


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The fp16 at bytes [at, at+2) of each block, as float32 (exact)."""
    return np.ascontiguousarray(b[:, at:at + 2]).view(np.float16)[:, 0].astype(F32)


def _signed(vals: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """vals (..., 8) float32 times -1 where bit j of signs (...,) is set, as C's `* (s ? -1.f : 1.f)`."""
    neg = (signs[..., None].astype(np.uint8) & grids.KMASK_IQ2XS) != 0
    return vals * np.where(neg, F32(-1.0), F32(1.0))


@cache
def _quant_tables(name: str) -> tuple:
    """iq2xs_init_impl's (grid, map, neighbours) of a type, built once per process."""
    from . import _iq23_kernels as k
    kgrid, nwant = {"iq2_xxs": (grids.KGRID_2BIT_256, 2), "iq2_xs": (grids.KGRID_2BIT_512, 2),
                    "iq2_s": (grids.KGRID_2BIT_1024, 1)}[name]
    return k.iq2_tables(kgrid, nwant)


@cache
def _dot_args(name: str) -> tuple:
    from ..kernels.tables import F16_TO_F32
    grid = {"iq2_xxs": grids.IQ2XXS_GRID, "iq2_xs": grids.IQ2XS_GRID, "iq2_s": grids.IQ2S_GRID}[name]
    return np.ascontiguousarray(grid.view(np.uint8)), np.ascontiguousarray(grids.KSIGNS_IQ2XS), F16_TO_F32


class _IQ2(QType):
    block_size = 256
    vec_dot_type = T.GGMLType.Q8_K
    llama_cpp = kform_x86(gemv_wrap=True, tiled_wrap=False)   # AVX2 vec_dot: signs on the activations

    @classmethod
    def quantizer_tables(cls) -> tuple:
        return _quant_tables(cls.name)

    @classmethod
    def dot_args(cls) -> tuple:
        return _dot_args(cls.name)


class IQ2_XXS(_IQ2, ggml_type=T.GGMLType.IQ2_XXS):
    type_size = 66
    needs_imatrix = True
    ggml_requires_imatrix = True
    quantize_ref = None                    # GGML has no quantize_row_iq2_xxs_ref
    quantize_kernel = compiled(_K, "quantize_iq2_xxs")
    dot_kernel = compiled(_K, "dot_iq2_xxs")
    mul_mat_kernel = compiled(_K, "mul_mat_iq2_xxs")
    k_form = compiled(_K, "k_form_iq2_xxs")
    dot_final = F32(0.125)

    @classmethod
    def grids(cls) -> dict[str, np.ndarray]:
        return {"iq2xxs_grid": grids.IQ2XXS_GRID, "ksigns_iq2xs": grids.KSIGNS_IQ2XS, "kmask_iq2xs": grids.KMASK_IQ2XS}

    @classmethod
    def dequantize_blocks(cls, b: np.ndarray) -> np.ndarray:
        """dequantize_row_iq2_xxs: db = d * (0.5 + (aux1 >> 28)) * 0.25 per 32 values."""
        n = b.shape[0]
        q = np.ascontiguousarray(b[:, 2:66]).view("<u4").reshape(n, 8, 2)
        db = (_f16(b, 0)[:, None] * (F32(0.5) + (q[:, :, 1] >> 28).astype(F32))) * F32(0.25)
        idx = np.ascontiguousarray(b[:, 2:66]).reshape(n, 8, 8)[:, :, :4]
        signs = grids.KSIGNS_IQ2XS[(q[:, :, 1:2] >> (7 * np.arange(4, dtype=np.uint32))) & 127]
        vals = grids.IQ2XXS_GRID.view(np.uint8).reshape(-1, 8)[idx].astype(F32)     # (n, 8, 4, 8)
        return _signed(db[:, :, None, None] * vals, signs).reshape(n, 256)


class IQ2_XS(_IQ2, ggml_type=T.GGMLType.IQ2_XS):
    type_size = 74
    needs_imatrix = True
    ggml_requires_imatrix = True
    quantize_ref = None                    # GGML has no quantize_row_iq2_xs_ref
    quantize_kernel = compiled(_K, "quantize_iq2_xs")
    dot_kernel = compiled(_K, "dot_iq2_xs")
    mul_mat_kernel = compiled(_K, "mul_mat_iq2_xs")
    k_form = compiled(_K, "k_form_iq2_xs")
    dot_final = F32(0.125)

    @classmethod
    def grids(cls) -> dict[str, np.ndarray]:
        return {"iq2xs_grid": grids.IQ2XS_GRID, "ksigns_iq2xs": grids.KSIGNS_IQ2XS, "kmask_iq2xs": grids.KMASK_IQ2XS}

    @classmethod
    def dequantize_blocks(cls, b: np.ndarray) -> np.ndarray:
        """dequantize_row_iq2_xs: db = d * (0.5 + nibble) * 0.25 per 16 values."""
        n = b.shape[0]
        qs = np.ascontiguousarray(b[:, 2:66]).view("<u2").reshape(n, 8, 4)
        sc = b[:, 66:74]
        nib = np.stack([sc & 15, sc >> 4], axis=-1).astype(F32)                       # (n, 8, 2)
        db = (_f16(b, 0)[:, None, None] * (F32(0.5) + nib)) * F32(0.25)
        db = np.repeat(db, 2, axis=2)                                                  # (n, 8, 4)
        vals = grids.IQ2XS_GRID.view(np.uint8).reshape(-1, 8)[qs & 511].astype(F32)
        return _signed(db[..., None] * vals, grids.KSIGNS_IQ2XS[qs >> 9]).reshape(n, 256)


class IQ2_S(_IQ2, ggml_type=T.GGMLType.IQ2_S):
    type_size = 82
    needs_imatrix = True                   # llama-quantize's rule; GGML's quantizer takes none too
    ggml_requires_imatrix = False
    quantize_kernel = compiled(_K, "quantize_iq2_s")
    dot_kernel = compiled(_K, "dot_iq2_s")
    mul_mat_kernel = compiled(_K, "mul_mat_iq2_s")
    k_form = compiled(_K, "k_form_iq2_s")
    dot_final = F32(0.125)

    @classmethod
    def quantize_ref(cls, x, *, name: str = "tensor", run=serial) -> np.ndarray:
        """quantize_row_iq2_s_ref: quantize_iq2_s without quant_weights."""
        return cls.quantize(x, None, name=name, run=run)

    @classmethod
    def grids(cls) -> dict[str, np.ndarray]:
        return {"iq2s_grid": grids.IQ2S_GRID, "kmask_iq2xs": grids.KMASK_IQ2XS}

    @classmethod
    def dequantize_blocks(cls, b: np.ndarray) -> np.ndarray:
        """dequantize_row_iq2_s: index qs | (qh << (8 - 2l)) & 0x300, a sign byte per 8 values."""
        n = b.shape[0]
        qs = b[:, 2:34].reshape(n, 8, 4).astype(np.int64)
        signs = b[:, 34:66].reshape(n, 8, 4)
        qh = b[:, 66:74].astype(np.int64)
        idx = qs | ((qh[:, :, None] << (8 - 2 * np.arange(4))) & 0x300)
        sc = b[:, 74:82]
        nib = np.stack([sc & 15, sc >> 4], axis=-1).astype(F32)
        db = np.repeat((_f16(b, 0)[:, None, None] * (F32(0.5) + nib)) * F32(0.25), 2, axis=2)
        vals = grids.IQ2S_GRID.view(np.uint8).reshape(-1, 8)[idx].astype(F32)
        return _signed(db[..., None] * vals, signs).reshape(n, 256)
