"""Native dequantizers for Q5_0, Q4_K and Q6_K (compiled: ``ggtool.kernels.kquants``), bit-identical
to gguf-py's float32 arithmetic and ~10x faster (other block types go through gguf-py in
``generic.dequantize``); Q8_K, the activations K-quant weights are multiplied with; and the
K-quant quantizers (Q2_K..Q6_K, GGML's reference bit for bit: ``ggtool.kquants``) run over an
array's blocks on the quantizer threads."""

from __future__ import annotations

import numpy as np

from .. import types as T
from .blocks import _dequantize_blocks, _quantize_blocks, kernel

Q8_K_BYTES = 292

_NATIVE_DQ = {  # type -> (bytes per block, values per block, name of the kernel in ggtool.kernels.kquants)
    T.GGMLType.Q5_0: (22, 32, "dequantize_q5_0"),
    T.GGMLType.Q4_K: (144, 256, "dequantize_q4_k"),
    T.GGMLType.Q6_K: (210, 256, "dequantize_q6_k"),
}


def _dequantize_native(raw, t) -> np.ndarray:
    from ..kernels import kquants
    from ..kernels.tables import F16_TO_F32

    nbytes, nval, name = _NATIVE_DQ[t]
    kernel = getattr(kquants, name)
    return _dequantize_blocks(raw, nbytes, T.type_name(t), lambda b, o: kernel(b, F16_TO_F32, o), nval)


# the K types ggtool.kquants quantizes (gguf-py quantizes none of them)
K_QUANTIZE = (T.GGMLType.Q2_K, T.GGMLType.Q3_K, T.GGMLType.Q4_K, T.GGMLType.Q5_K, T.GGMLType.Q6_K)


def quantize_k(x, t, name: str = "tensor") -> np.ndarray:
    """Bytes of x in the K type t (one of K_QUANTIZE): rows of 256-value blocks, as GGML's
    quantize_row_qN_K_ref writes them (QuantizationError for a row that is not a multiple of 256,
    or for NaN/inf)."""
    from .. import kquants

    what = T.type_name(t)
    return _quantize_blocks(x, name, what, kquants.BLOCKS[what][0], kquants.kernel(what), kquants.QK_K)


def quantize_q8_k(x, name: str = "tensor") -> np.ndarray:
    """Q8_K bytes of x (quantize_row_q8_K_ref, which is also GGML's CPU from_float): rows of 256-value
    blocks of 292 bytes (float32 d, int8 qs[256], int16 bsums[16])."""
    return _quantize_blocks(x, name, "Q8_K", Q8_K_BYTES, kernel("Q8_K", "quantize_q8_k"), 256)
