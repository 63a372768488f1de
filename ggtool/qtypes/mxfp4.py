"""MXFP4 (OCP microscaling FP4, gpt-oss's experts): 32 values a block of 17 bytes.

Layout (ggml-common.h ``block_mxfp4``): ``e`` (1 byte, an E8M0 exponent) then ``qs[16]``: 4-bit codes
into ``kvalues_mxfp4`` (the E2M1 levels doubled: 0, 1, 2, 3, 4, 6, 8, 12 and their negatives), value
j in the low nibble of byte j, value j + 16 in the high one. A value is ``kvalues[code] * d`` with
``d = 2**(e - 128)`` (``GGML_E8M0_TO_FP32_HALF``: half the E8M0 scale, as the levels are doubled;
e = 0 and 1 are the fp32 subnormals 2**-128 and 2**-127).

Quantizer (``quantize_row_mxfp4_ref``, which ``quantize_mxfp4`` runs; quant_weights ignored):
``e = floor(log2f(amax)) - 2 + 127`` converted to uint8 as x86 truncates it (an amax below 2**-125
wraps round: 1e-45 gives 232), 0 for an all-zero block; each code the first level of least
``|kvalues[i] * d - x|``. vec_dot_type Q8_0: ``sumf += (d_a * d) * float(sumi)`` block after block
(``ggml_vec_dot_mxfp4_q8_0_generic``). llama-quantize writes it for MXFP4_MOE's expert tensors.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from . import X86_BUILDS, LevelRows, QType, compiled, f16_table, grids, serial

F32 = np.float32
_K = "_lowbit_kernels"


def e8m0_half(e) -> np.ndarray:
    """GGML_E8M0_TO_FP32_HALF of uint8 exponents, as float32 (2**(e - 128); e < 2 the subnormals)."""
    e = np.asarray(e, np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(F32)


def _x86(fused_tail: bool):
    """The repacked gemv/gemm (rows in eights), else ggml_vec_dot_mxfp4_q8_0's AVX2 code (never
    tiled), whose odd last block GCC contracts to an FMA in the AVX2 build (`fused_tail`) and not
    in the AVX-512 one, as IQ4_NL's (the same code: bench/check_x86_forms.py)."""

    def run(cls, w, a, out, path, rows, i0):
        from . import _x86_kernels as X
        levels, d = cls.levels(w)
        if path == "repacked":
            X.repacked_b32(levels, d, a, *f16_table(), out)
        else:
            X.gemv_pairs(levels, d, a, fused_tail, *f16_table(), out)

    return run


class MXFP4(LevelRows, QType, ggml_type=T.GGMLType.MXFP4):
    block_size = 32
    scale_dtype = np.float32      # its E8M0 exponent as the float32 it is (LevelRows)
    type_size = 17
    vec_dot_type = T.GGMLType.Q8_0
    needs_imatrix = False
    ggml_requires_imatrix = False
    x86_repacked = X86_BUILDS     # mxfp4_8x8 where the CPU has AVX2

    llama_cpp = {"llama.cpp-avx2": _x86(True), "llama.cpp-avx512": _x86(False)}
    k_form = None                # the dot is not in the K-quants' form (no int scale per 16 codes)
    dot_final = None
    quantize_kernel = compiled(_K, "quantize_mxfp4")
    dot_kernel = compiled(_K, "dot_mxfp4")
    mul_mat_kernel = compiled(_K, "mul_mat_mxfp4")

    @staticmethod
    def levels(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows (uint8 (k, nb * 17)) as (levels int8 (k, nb, 32) in value order, d float32 (k, nb))."""
        b = rows.reshape(rows.shape[0], -1, 17)
        qs = b[:, :, 1:17]
        codes = np.concatenate([qs & 15, qs >> 4], axis=2)
        return grids.KVALUES_MXFP4.astype(np.int8)[codes], e8m0_half(b[:, :, 0])

    @classmethod
    def quantize_ref(cls, x, *, name: str = "tensor", run=serial) -> np.ndarray:
        """quantize_row_mxfp4_ref: the bytes quantize_mxfp4 writes (it ignores quant_weights)."""
        return cls.quantize(x, None, name=name, run=run)

    @classmethod
    def grids(cls) -> dict[str, np.ndarray]:
        return {"kvalues_mxfp4": grids.KVALUES_MXFP4}

    @classmethod
    def quantizer_tables(cls) -> tuple:
        return ()                                   # the quantizer needs no table

    @classmethod
    def dot_args(cls) -> tuple:
        return f16_table()

    @classmethod
    def dequantize_blocks(cls, b: np.ndarray) -> np.ndarray:
        d = e8m0_half(b[:, 0])[:, None]
        kv = grids.KVALUES_MXFP4.astype(F32)
        qs = b[:, 1:17]
        with np.errstate(over="ignore"):                     # 12 * 2**127: inf, as GGML's floats give
            return np.concatenate([kv[qs & 15] * d, kv[qs >> 4] * d], axis=1)
