"""TQ1_0 and TQ2_0 (ternary: BitNet b1.58, TriLMs): 256 values a block, each -1, 0 or +1 times d.

Layouts (ggml-common.h):

* ``block_tq1_0`` (54 bytes): ``qs[48]``, 5 trits a byte, then ``qh[4]``, 4 trits a byte, then fp16
  ``d``. A byte holds its trits t0..t4 (t = value + 1) as ``ceil(q * 256 / 243)``, q = the base-3
  number t0 t1 t2 t3 t4 (t0 most significant; qh's bytes hold 4 trits and a 0); trit n is read back
  as ``((uint8)(byte * 3**n) * 3) >> 8``. Byte m of qs[0:32] holds values m + 32n (n = 0..4), byte m
  of qs[32:48] values 160 + m + 16n, byte j of qh values 240 + j + 4n (n = 0..3).
* ``block_tq2_0`` (66 bytes): ``qs[64]``, 2 bits a value (value + 1), then fp16 ``d``; byte m of
  each 32 holds values 128h + m + 32n in bits 2n (h the half).

Quantizers (``quantize_row_tq{1,2}_0_ref``, run by ``quantize_tq{1,2}_0``; importance ignored):
``d = amax``, trit ``lroundf(x / d) + 1`` with ``1/d`` from the unrounded d. A block whose amax is
an fp32 subnormal has ``1/d = inf``: lroundf of inf/NaN is x86's 0x8000000000000000, so every
trit is 1 (zero), as GGML writes it. vec_dot_type Q8_K: ``sumf += float(sumi) * (d_w * d_a)``
(TQ1_0) and ``sumf += float(sumi) * (d_a * d_w)`` (TQ2_0), block after block: the K-quant dots'
form (``k_form``: the codes value - 1, every scale 1, d; final factor 1), so mul_mat runs them on
the K-quant tile.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from . import QType, compiled, f16_table, serial

F32 = np.float32
_K = "_lowbit_kernels"


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def tq1_trits(qs: np.ndarray, n: int) -> np.ndarray:
    """Trit n (0..2) of each byte: ((uint8)(byte * 3**n) * 3) >> 8."""
    q = (qs.astype(np.uint32) * 3 ** n) & 0xFF
    return ((q * 3) >> 8).astype(np.int32)


class _Ternary(QType):
    block_size = 256
    vec_dot_type = T.GGMLType.Q8_K
    needs_imatrix = False
    ggml_requires_imatrix = False
    dot_final = F32(1.0)

    def _x86(cls, w, a, out, path, rows, i0):
        """ggml_vec_dot_tq*_0_q8_K's AVX2 code (``_x86_kernels.gemv_ternary``) for any number of rows."""
        from . import _x86_kernels as X
        codes, _, d = cls.k_form(w)
        X.gemv_ternary(codes, d, a, True, out)

    llama_cpp = {"llama.cpp-avx2": _x86, "llama.cpp-avx512": _x86}
    d_at: int                    # the fp16 d's offset in the block

    @classmethod
    def trits(cls, blocks: np.ndarray) -> np.ndarray:
        """Each block's 256 values - 1 .. + 1 (the stored trit - 1), in value order: int32 (n, 256)."""
        raise NotImplementedError

    @classmethod
    def dequantize_blocks(cls, blocks):
        d = _f16(blocks, cls.d_at)
        with np.errstate(invalid='ignore', over='ignore'):   # inf * 0: NaN, as GGML's floats give
            return cls.trits(blocks).astype(np.float32) * d

    @classmethod
    def k_form(cls, w, f16=None):
        """Rows (uint8 (n, nb * type_size)) in the K form: the trits as codes, scale 1, d."""
        n, nb = w.shape[0], w.shape[1] // cls.type_size
        blocks = w.reshape(n * nb, cls.type_size)
        codes = cls.trits(blocks).astype(np.int8).reshape(n, nb, 256)
        return codes, np.ones((n, nb, 16), np.int32), _f16(blocks, cls.d_at).reshape(n, nb)

    @classmethod
    def quantize_ref(cls, x, *, name: str = "tensor", run=serial) -> np.ndarray:
        """quantize_row_tq*_0_ref: the bytes quantize_tq*_0 writes (it ignores quant_weights)."""
        return cls.quantize(x, None, name=name, run=run)

    @classmethod
    def grids(cls) -> dict[str, np.ndarray]:
        return {}                                   # no tables: trits are arithmetic

    @classmethod
    def quantizer_tables(cls) -> tuple:
        return ()                                   # the quantizer needs no table

    @classmethod
    def dot_args(cls) -> tuple:
        return f16_table()


class TQ1_0(_Ternary, ggml_type=T.GGMLType.TQ1_0):
    type_size = 54
    quantize_kernel = compiled(_K, "quantize_tq1_0")
    dot_kernel = compiled(_K, "dot_tq1_0")
    mul_mat_kernel = compiled(_K, "mul_mat_tq1_0")
    d_at = 52

    @classmethod
    def trits(cls, blocks):
        parts = []
        for start, width in ((0, 32), (32, 16)):
            qs = blocks[:, start:start + width]
            parts += [tq1_trits(qs, n) for n in range(5)]
        qh = blocks[:, 48:52]
        parts += [tq1_trits(qh, n) for n in range(4)]
        return np.concatenate(parts, axis=1) - 1


class TQ2_0(_Ternary, ggml_type=T.GGMLType.TQ2_0):
    type_size = 66
    quantize_kernel = compiled(_K, "quantize_tq2_0")
    dot_kernel = compiled(_K, "dot_tq2_0")
    mul_mat_kernel = compiled(_K, "mul_mat_tq2_0")
    d_at = 64

    @classmethod
    def trits(cls, blocks):
        parts = []
        for j in range(0, 64, 32):
            qs = blocks[:, j:j + 32].astype(np.int32)
            parts += [(qs >> (2 * n)) & 3 for n in range(4)]
        return np.concatenate(parts, axis=1) - 1
