"""IQ4_XS: IQ4_NL's non-linear 4-bit levels with a 6-bit scale per 32 values, 256 values a block of
136 bytes.

Layout (ggml-common.h ``block_iq4_xs``): fp16 ``d``, uint16 ``scales_h`` (the high 2 bits of the 8
scales, 2 bits each), ``scales_l[4]`` (their low 4 bits, sub-block 2k in the low nibble of byte k,
2k + 1 in the high one), ``qs[128]``: 4-bit indices into ``kvalues_iq4nl`` (ggtool.kernels.tables,
IQ4_NL's table), per 32 values 16 bytes: value j in the low nibble of byte j, j + 16 in the high one.
A value is ``d * (ls - 32) * kvalues[code]``.

Quantizer (``quantize_iq4_xs``, also ``quantize_row_iq4_xs_ref``): per 32 values IQ4_NL's own
search (``_iq4nl_quantize``'s ``iq4_nl_block``, 7 steps either side; weights x*x, or with quant
weights ``qw * sqrt(sigma2 + x*x)``, sigma2 = 2 * sum(x*x) / 256 over the block), then
``d = -max_scale / 32`` (max_scale the sub-block scale of largest magnitude), each 6-bit scale
``nearest_int(scale / d)`` clamped to -32..31 and the codes found again from ``d * l``.
vec_dot_type Q8_K: per 32 values ``sumf += ((d_w * d_a) * float(ls - 32)) * float(sumi)``.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..kernels.tables import KVALUES_IQ4NL
from . import QType, compiled, f16_table, kform_x86, serial

_K = "_lowbit_kernels"


class IQ4_XS(QType, ggml_type=T.GGMLType.IQ4_XS):
    block_size = 256
    type_size = 136
    vec_dot_type = T.GGMLType.Q8_K
    needs_imatrix = False
    ggml_requires_imatrix = False
    llama_cpp = kform_x86(gemv_wrap=True, tiled_wrap=True)    # mul_add_epi8 / the sign trick in both
    k_form = None                # the dot is not in the K-quants' form (no int scale per 16 codes)
    dot_final = None
    quantize_kernel = compiled(_K, "quantize_iq4_xs")
    dot_kernel = compiled(_K, "dot_iq4_xs")
    mul_mat_kernel = compiled(_K, "mul_mat_iq4_xs")

    # mat-vec speed: the weights unpacked once into int8 levels and a vector tile (same numbers)
    pack_kernel = compiled(_K, "pack_iq4_xs")
    mul_mat_packed_kernel = compiled(_K, "mul_mat_iq4_xs_packed")

    @classmethod
    def pack(cls, w) -> tuple:
        """The packed form of weight rows w (uint8 (N, row bytes)) that mul_mat_packed multiplies."""
        return cls.pack_kernel(np.ascontiguousarray(w, np.uint8), *f16_table())

    @classmethod
    def mul_mat_packed(cls, packed: tuple, a) -> np.ndarray:
        """mul_mat(w, a) from pack(w): float32 (rows of a, rows of w), the same bits."""
        a = np.ascontiguousarray(a, np.uint8)
        out = np.empty((a.shape[0], packed[3]), np.float32)
        cls.mul_mat_packed_kernel(*packed, a, out)
        return out

    @classmethod
    def x86_form(cls, w):
        """The rows as llama.cpp's x86 kernels sum them: the levels as codes, ls - 32 the scale of each
        16 (per 32 in the block), d; no final factor."""
        w = np.ascontiguousarray(w, np.uint8)
        n, nb = w.shape[0], w.shape[1] // 136
        blocks = w.reshape(n * nb, 136)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32).reshape(n, nb)
        sh = blocks[:, 2].astype(np.int32) | (blocks[:, 3].astype(np.int32) << 8)
        ib = np.arange(8)
        ls = ((blocks[:, 4 + ib // 2].astype(np.int32) >> (4 * (ib % 2))) & 15) | (((sh[:, None] >> (2 * ib)) & 3) << 4)
        qs = blocks[:, 8:].reshape(-1, 8, 16)
        codes = KVALUES_IQ4NL.astype(np.int8)[np.concatenate([qs & 15, qs >> 4], axis=2)].reshape(n, nb, 256)
        return codes, np.repeat(ls - 32, 2, axis=1).reshape(n, nb, 16), d

    @classmethod
    def quantize_ref(cls, x, *, name: str = "tensor", run=serial) -> np.ndarray:
        """quantize_row_iq4_xs_ref: quantize_iq4_xs without quant_weights."""
        return cls.quantize(x, None, name=name, run=run)

    @classmethod
    def grids(cls) -> dict[str, np.ndarray]:
        return {"kvalues_iq4nl": KVALUES_IQ4NL}

    @classmethod
    def quantizer_tables(cls) -> tuple:
        return ()                                   # the quantizer needs no table

    @classmethod
    def dot_args(cls) -> tuple:
        return f16_table()

    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)       # (n, 1)
        sh = blocks[:, 2].astype(np.int32) | (blocks[:, 3].astype(np.int32) << 8)
        ib = np.arange(8)
        ls = ((blocks[:, 4 + ib // 2].astype(np.int32) >> (4 * (ib % 2))) & 15) | (((sh[:, None] >> (2 * ib)) & 3) << 4)
        qs = blocks[:, 8:].reshape(n, 8, 16)
        codes = np.concatenate([qs & 15, qs >> 4], axis=2)                      # (n, 8, 32)
        with np.errstate(invalid="ignore", over="ignore"):   # inf * 0: NaN, as GGML's floats give
            dl = d * (ls - 32).astype(np.float32)                              # (n, 8)
            return (dl[:, :, None] * KVALUES_IQ4NL[codes]).reshape(n, 256)
