"""Native dequantizers for Q5_0, Q4_K, Q6_K and IQ4_NL (compiled: ``ggtool.kernels.kquants``),
bit-identical to GGML's float32 arithmetic (other block types go through gguf-py in
``generic.dequantize``); Q8_K, the activations K-quant weights are multiplied with; and the
quantizers of ``ggtool.kquants`` (Q2_K..Q6_K, Q4_1, Q5_0, Q5_1, IQ4_NL, and every importance-matrix
path, GGML's bit for bit) run over an array's blocks on the quantizer threads."""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..errors import QuantizationError
from .blocks import _dequantize_blocks, _quantize_blocks, _quantize_weighted, kernel

Q8_K_BYTES = 292

_NATIVE_DQ = {  # type -> (bytes per block, values per block, name of the kernel in ggtool.kernels.kquants)
    T.GGMLType.Q5_0: (22, 32, "dequantize_q5_0"),
    T.GGMLType.Q4_K: (144, 256, "dequantize_q4_k"),
    T.GGMLType.Q6_K: (210, 256, "dequantize_q6_k"),
    T.GGMLType.IQ4_NL: (18, 32, "dequantize_iq4_nl"),
}


def _dequantize_native(raw, t) -> np.ndarray:
    from ..kernels import kquants
    from ..kernels.tables import F16_TO_F32

    nbytes, nval, name = _NATIVE_DQ[t]
    kernel = getattr(kquants, name)
    return _dequantize_blocks(raw, nbytes, T.type_name(t), lambda b, o: kernel(b, F16_TO_F32, o), nval)


# the K types ggtool.kquants quantizes (gguf-py quantizes none of them)
K_QUANTIZE = (T.GGMLType.Q2_K, T.GGMLType.Q3_K, T.GGMLType.Q4_K, T.GGMLType.Q5_K, T.GGMLType.Q6_K)
# the 32-value types it quantizes besides Q4_0/Q8_0 (gguf-py has Q4_1/Q5_0/Q5_1, not GGML's bytes at the edges)
LEGACY_QUANTIZE = (T.GGMLType.Q4_1, T.GGMLType.Q5_0, T.GGMLType.Q5_1, T.GGMLType.IQ4_NL)
# the types whose bytes an importance matrix changes (llama.cpp's Q8_0/F16/BF16/F32 ignore it)
WEIGHTED = (T.GGMLType.Q4_0, *LEGACY_QUANTIZE, *K_QUANTIZE)


def quantize_k(x, t, name: str = "tensor", imatrix=None) -> np.ndarray:
    """Bytes of x in t (one of WEIGHTED), as ggml_quantize_chunk writes them: without `imatrix`
    the reference path (quantize_row_qN_ref; quantize_iq4_nl), with it (one float per column, the
    length of x's rows; or (n_expert, columns) for x of shape (n_expert, rows, columns), as
    llama-quantize gives each expert of a 3-d weight its own) the quant_weights path
    (quantize_row_qN_impl). QuantizationError for a row
    that is not a multiple of the block size, for NaN/inf, or for an imatrix of another length."""
    from .. import kquants

    what = T.type_name(t)
    qk, nbytes = kquants.BLOCKS[what][:2]
    if imatrix is not None:
        weighted = kquants.weighted_kernel(what)
        qw = np.asarray(imatrix)
        if qw.ndim != 2:
            return _quantize_weighted(x, name, what, nbytes, weighted, qk, qw)
        x = np.asarray(x)          # a 3-d (MoE) weight: expert e's rows take the importances qw[e]
        if x.ndim != 3 or x.shape[0] != qw.shape[0]:
            raise QuantizationError(f"tensor '{name}': an importance matrix of {qw.shape[0]} experts "
                                    f"does not fit data of shape {x.shape}")
        if not len(qw):            # no experts: no bytes (the rows still checked)
            return _quantize_weighted(x, name, what, nbytes, weighted, qk, np.ones(x.shape[-1], np.float32))
        return np.stack([_quantize_weighted(x[e], name, what, nbytes, weighted, qk, qw[e]) for e in range(len(qw))])
    return _quantize_blocks(x, name, what, nbytes, kquants.kernel(what), qk)


def quantize_q8_k(x, name: str = "tensor") -> np.ndarray:
    """Q8_K bytes of x (quantize_row_q8_K_ref, which is also GGML's CPU from_float): rows of 256-value
    blocks of 292 bytes (float32 d, int8 qs[256], int16 bsums[16])."""
    return _quantize_blocks(x, name, "Q8_K", Q8_K_BYTES, kernel("Q8_K", "quantize_q8_k", np.size(x)), 256)
