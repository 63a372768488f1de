"""IQ4_NL: 32 values a block of 18 bytes, 4-bit indices into a non-linear table.

Layout (ggml-common.h ``block_iq4_nl``): fp16 ``d``, then ``qs[16]``: indices into ``kvalues_iq4nl``
(-127 .. 113), value j in the low nibble of byte j, value j + 16 in the high one; a value is
``d * kvalues[index]``. Quantizer: ``quantize_iq4_nl`` (its search of 7 scales:
``_iq4nl_quantize`` without quant_weights, ``_weighted_quantize`` with them; llama-quantize never writes the reference
row). vec_dot_type Q8_0: ``sumf += (d_a * d_w) * float(sumi)`` block after block
(``ggml_vec_dot_iq4_nl_q8_0_generic``). llama.cpp's x86 builds repack it (iq4_nl_8x8) or take
``ggml_vec_dot_iq4_nl_q8_0``'s AVX2 order, or tinyBLAS_Q0's (``llama_cpp``: ``kernels.x86``, ``x86_legacy``).
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..kernels.tables import KVALUES_IQ4NL
from . import X86_BUILDS, LevelRows, QType, compiled, f16_table, serial

_K = "_lowbit_kernels"


def _x86(avx2: bool):
    """The repacked iq4_nl_8x8 gemm/gemv; for one activation row ggml_vec_dot_iq4_nl_q8_0's own code
    (its odd last block fused by FMA in the AVX2 build, `avx2`, not in the AVX-512 one); else
    llamafile's tinyBLAS_Q0."""

    def run(cls, w, a, out, path, rows, i0):
        from ..kernels import x86, x86_legacy
        from ..kernels.tables import F16_TO_F32

        if path == "repacked":
            x86.dot_b32_repacked(w, x86.IQ4_NL_KIND, a, out, F16_TO_F32)
        elif rows == 1:
            x86_legacy.vec_dot_iq4_nl(w, a, out, avx2, F16_TO_F32)
        else:
            x86.dot_q0(w, x86.IQ4_NL_KIND, a, out, F16_TO_F32)

    return run


class IQ4_NL(LevelRows, QType, ggml_type=T.GGMLType.IQ4_NL):
    block_size = 32
    type_size = 18
    vec_dot_type = T.GGMLType.Q8_0
    needs_imatrix = False
    ggml_requires_imatrix = False
    llama_cpp = {"llama.cpp-avx2": _x86(True), "llama.cpp-avx512": _x86(False)}
    x86_repacked = X86_BUILDS     # iq4_nl_8x8
    k_form = None                 # the dot is not in the K-quants' form (no int scale per 16 codes)
    dot_final = None
    quantize_kernel = compiled(_K, "quantize_iq4_nl")
    dot_kernel = compiled(_K, "dot_iq4_nl")
    mul_mat_kernel = compiled(_K, "mul_mat_iq4_nl")

    @staticmethod
    def levels(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows (uint8 (k, nb * 18)) as (levels int8 (k, nb, 32) in value order, d as fp16 bits (k, nb))."""
        b = rows.reshape(rows.shape[0], -1, 18)
        qs = b[:, :, 2:18]
        codes = np.concatenate([qs & 15, qs >> 4], axis=2)
        return KVALUES_IQ4NL.astype(np.int8)[codes], np.ascontiguousarray(b[:, :, 0:2]).view(np.uint16)[:, :, 0]

    @classmethod
    def quantize_ref(cls, x, *, name: str = "tensor", run=serial) -> np.ndarray:
        """quantize_iq4_nl without quant_weights (the bytes llama-quantize writes without an imatrix)."""
        return cls.quantize(x, None, name=name, run=run)

    @classmethod
    def grids(cls) -> dict[str, np.ndarray]:
        return {"kvalues_iq4nl": KVALUES_IQ4NL}

    @classmethod
    def quantizer_tables(cls) -> tuple:
        return f16_table()

    @classmethod
    def dot_args(cls) -> tuple:
        return f16_table()

    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)       # (n, 1)
        qs = blocks[:, 2:18]
        codes = np.concatenate([qs & 15, qs >> 4], axis=1)                      # (n, 32)
        with np.errstate(invalid="ignore", over="ignore"):   # inf * 0: NaN, as GGML's floats give
            return (d * KVALUES_IQ4NL[codes]).reshape(n, 32)
