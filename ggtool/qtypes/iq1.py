"""IQ1_S and IQ1_M: groups of 8 values from a grid of 2048 points in {-1, 0, +1}^8 (``iq1s_grid``),
shifted by +-1/8, 256 values a block (1.5625 and 1.75 bits a value).

Layouts (ggml-common.h):

* ``block_iq1_s`` (50 bytes): fp16 ``d``, ``qs[32]`` (the low 8 bits of each group's grid index),
  ``qh[8]`` uint16 per 32 values: bits 3l..3l+2 the high 3 bits of group l's index, bits 12..14 a
  3-bit scale ls, bit 15 the shift's sign. A value is ``d * (2 ls + 1) * (grid + delta)``, delta
  = -1/8 if bit 15 is set, else +1/8.
* ``block_iq1_m`` (56 bytes): ``qs[32]`` (low 8 bits of the indices), ``qh[16]`` per 16 values
  (two groups: bits 0..2 and 4..6 the high index bits, bits 3 and 7 the groups' shift signs),
  ``scales[8]``: four uint16, each holding 3-bit scales of 4 groups of 16 values in its low 12
  bits; their top 4 bits together are the fp16 super-block scale d. A value is
  ``d * (2 ls + 1) * (grid + delta)`` per group.

Quantizers (``quantize_iq1_s`` / ``quantize_iq1_m``; ``_lowbit_kernels``): per 32 (IQ1_S) or 16 (IQ1_M)
values an exhaustive search of the two boundaries splitting the sorted values into -1, 0, +1 (and
of the shift's sign), weights ``qw * sqrt(sigma2 + x*x)`` (IQ1_M without an importance matrix:
``x*x``; IQ1_S requires one, as GGML asserts); groups of 8 not on the grid move to their nearest
neighbour in the grid (``iq2xs_init_impl``'s neighbour lists, built once a process:
``quantizer_tables()``); then the 3-bit scales against ``max_scale / 15`` and GGML's fudge factors (1.125,
1.1125), with stable sorting of equal values as glibc's qsort (a merge sort) keeps them. Where
the values overflow float32 in the neighbour search (magnitudes around 1e13..1e19 with large
importances), llama.cpp reads past its 8 values or aborts: ggtool refuses those blocks
(QuantizationError) rather than guess. vec_dot_type Q8_K:
``sumf += (d_w * d_a) * (float(sumi) + 0.125 * float(sumi1))`` block after block (GGML's generic).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from .. import types as T
from . import QType, compiled, f16_table, grids

F32 = np.float32
_K = "_lowbit_kernels"
GRID_VALUES = grids.IQ1S_GRID.view(np.int8).reshape(2048, 8)    # the grid's values, -1/0/+1 (little-endian bytes)


@cache
def quantizer_tables() -> tuple:
    """(grid (2048, 8) int64 of the values + 1, kmap int32, neighbours uint16): the quantizers'
    lookup tables as iq2xs_init_impl builds them for IQ1_S/IQ1_M (kgrid_1bit_2048: the grid's
    values + 1, 2 bits each; the 3 nearest distances), built once a process (compiled; not worth a
    file on disk)."""
    from ._kernel_base import grid_tables, read_only
    grid = GRID_VALUES.astype(np.int64) + 1
    kgrid = (grid << (2 * np.arange(8))).sum(axis=1).astype(np.uint16)
    _, kmap, neighbours = grid_tables(kgrid, 2, 8, 43692, 3)
    return read_only((grid, kmap, neighbours))


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(F32)


class _IQ1(QType):
    block_size = 256
    vec_dot_type = T.GGMLType.Q8_K
    quantize_ref = None                         # GGML has no quantize_row_iq1_*_ref
    # The K form: codes 8 grid + delta's sign, the odd scales, d; times 1/8. The generic dot adds
    # (d_w d_a) (sumi + sumi1 / 8) a block; sumi + sumi1 / 8 is (8 sumi + sumi1) / 8 exactly (both
    # below 2**22), and scaling by 1/8 commutes with float32 rounding: the same bits, unless a
    # block's product leaves float32's normal range (|(d_w d_a) s| below 2**-123 or above 2**127),
    # where the last bit may differ (llama.cpp's tiled kernel takes the same form: d / 8).
    dot_final = F32(0.125)

    @classmethod
    def grids(cls) -> dict[str, np.ndarray]:
        return {"iq1s_grid": grids.IQ1S_GRID}

    @classmethod
    def x86_parts(cls, w) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Weight rows (uint8 (n, nb * type_size)) as llama.cpp's x86 kernels take them apart: the grid
        values int8 (n, nb, 256), the odd scale 2 ls + 1 of each 16 int32 (n, nb, 16), the sign of each
        value's delta int8 (n, nb, 256), d float32 (n, nb)."""
        raise NotImplementedError

    @classmethod
    def k_form(cls, w, f16=None):
        """Rows in the K form (codes int8 (n, nb, 256), scales int32 (n, nb, 16), d float32 (n, nb))."""
        g, ls, sign, d = cls.x86_parts(np.ascontiguousarray(w, np.uint8))
        return (8 * g.astype(np.int16) + sign).astype(np.int8), ls, d

    def _x86(cls, w, a, out, path, rows, i0):
        """From 8 activation rows the tiled kernel (codes 8 grid + delta, d / 8), else the AVX2 vec_dot."""
        from . import _x86_kernels as X
        g, ls, sign, d = cls.x86_parts(np.ascontiguousarray(w, np.uint8))
        if path == "tiled":
            X.tiled((8 * g.astype(np.int16) + sign).astype(np.int8), ls, d, a, F32(0.125), False, out)
        else:
            X.gemv_iq1(g, ls, sign, d, a, cls.ggml_type == T.GGMLType.IQ1_M, True, out)

    llama_cpp = {"llama.cpp-avx2": _x86, "llama.cpp-avx512": _x86}

    @classmethod
    def quantizer_tables(cls) -> tuple:
        return quantizer_tables()

    @classmethod
    def dot_args(cls) -> tuple:
        return f16_table()


class IQ1_S(_IQ1, ggml_type=T.GGMLType.IQ1_S):
    type_size = 50
    needs_imatrix = True                        # llama-quantize refuses it without one
    ggml_requires_imatrix = True                # and GGML asserts quant_weights
    quantize_kernel = compiled(_K, "quantize_iq1_s")
    dot_kernel = compiled(_K, "dot_iq1_s")
    mul_mat_kernel = compiled(_K, "mul_mat_iq1_s")

    @classmethod
    def x86_parts(cls, w):
        n, nb = w.shape[0], w.shape[1] // 50
        blocks = w.reshape(n * nb, 50)
        qs = blocks[:, 2:34].astype(np.int64).reshape(-1, 8, 4)
        qh = np.ascontiguousarray(blocks[:, 34:50]).view(np.uint16).astype(np.int64)   # (n nb, 8)
        idx = qs | (((qh[:, :, None] >> (3 * np.arange(4))) & 7) << 8)
        g = GRID_VALUES[idx].reshape(n, nb, 256)
        ls = np.repeat(2 * ((qh >> 12) & 7) + 1, 2, axis=1).astype(np.int32).reshape(n, nb, 16)
        sign = np.repeat(np.where(qh & 0x8000, -1, 1), 32, axis=1).astype(np.int8).reshape(n, nb, 256)
        return g, ls, sign, _f16(blocks[:, 0:2]).reshape(n, nb)

    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, 0:2])                                               # (n, 1)
        qs = blocks[:, 2:34].astype(np.int64).reshape(n, 8, 4)
        qh = np.ascontiguousarray(blocks[:, 34:50]).view(np.uint16).astype(np.int64)   # (n, 8)
        delta = np.where(qh & 0x8000, F32(-0.125), F32(0.125))
        idx = qs | (((qh[:, :, None] >> (3 * np.arange(4))) & 7) << 8)        # (n, 8, 4)
        g = GRID_VALUES[idx].astype(F32)                                      # (n, 8, 4, 8)
        with np.errstate(over="ignore"):                     # an fp16 d near 65504 times 15: inf, as in GGML
            dl = d * (2 * ((qh >> 12) & 7) + 1).astype(F32)
            return (dl[:, :, None, None] * (g + delta[:, :, None, None])).reshape(n, 256)


class IQ1_M(_IQ1, ggml_type=T.GGMLType.IQ1_M):
    type_size = 56
    needs_imatrix = True                        # llama-quantize refuses it without one
    ggml_requires_imatrix = False               # GGML takes none (weights x*x)
    quantize_kernel = compiled(_K, "quantize_iq1_m")
    dot_kernel = compiled(_K, "dot_iq1_m")
    mul_mat_kernel = compiled(_K, "mul_mat_iq1_m")

    @staticmethod
    def scale_bits(blocks: np.ndarray) -> np.ndarray:
        """The fp16 bits of d: the top 4 bits of the four uint16 scales."""
        sc = np.ascontiguousarray(blocks[:, 48:56]).view(np.uint16).astype(np.uint32)
        return ((sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)).astype(np.uint16)

    @classmethod
    def x86_parts(cls, w):
        n, nb = w.shape[0], w.shape[1] // 56
        blocks = w.reshape(n * nb, 56)
        sc = np.ascontiguousarray(blocks[:, 48:56]).view(np.uint16).astype(np.int64)     # (n nb, 4)
        ib = np.arange(8)
        s = sc[:, ib // 2]
        ls = np.stack([(s >> (6 * (ib % 2))) & 7, (s >> (6 * (ib % 2) + 3)) & 7], axis=2)   # (n nb, 8, 2)
        qs = blocks[:, 0:32].astype(np.int64).reshape(-1, 8, 4)
        qh4 = np.repeat(blocks[:, 32:48].astype(np.int64).reshape(-1, 8, 2), 2, axis=2)
        idx = qs | ((qh4 << np.array([8, 4, 8, 4])) & 0x700)
        sign = np.where(qh4 & np.array([0x08, 0x80, 0x08, 0x80]), -1, 1)                  # (n nb, 8, 4)
        g = GRID_VALUES[idx].reshape(n, nb, 256)
        d = cls.scale_bits(blocks).view(np.float16).astype(F32).reshape(n, nb)
        return (g, (2 * ls + 1).astype(np.int32).reshape(n, nb, 16),
                np.repeat(sign.reshape(-1, 32), 8, axis=1).astype(np.int8).reshape(n, nb, 256), d)

    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = cls.scale_bits(blocks).view(np.float16).astype(F32)[:, None, None]
        sc = np.ascontiguousarray(blocks[:, 48:56]).view(np.uint16).astype(np.int64)     # (n, 4)
        ib = np.arange(8)
        s = sc[:, ib // 2]                                                               # (n, 8)
        ls = np.stack([(s >> (6 * (ib % 2))) & 7, (s >> (6 * (ib % 2) + 3)) & 7], axis=2)   # (n, 8, 2)
        qs = blocks[:, 0:32].astype(np.int64).reshape(n, 8, 4)
        qh = blocks[:, 32:48].astype(np.int64).reshape(n, 8, 2)
        qh4 = np.repeat(qh, 2, axis=2)                                                    # group l: qh[l // 2]
        shift = np.array([8, 4, 8, 4])
        idx = qs | ((qh4 << shift) & 0x700)
        mask = np.array([0x08, 0x80, 0x08, 0x80])
        delta = np.where(qh4 & mask, F32(-0.125), F32(0.125))               # (n, 8, 4)
        g = GRID_VALUES[idx].astype(F32)                                           # (n, 8, 4, 8)
        with np.errstate(over="ignore"):                     # an fp16 d near 65504 times 15: inf, as in GGML
            dl = d * (2 * ls + 1).astype(F32)                                             # (n, 8, 2)
            scale = np.repeat(dl, 2, axis=2)                                              # groups 0,1: dl1; 2,3: dl2
            return (scale[..., None] * (g + delta[..., None])).reshape(n, 256)
