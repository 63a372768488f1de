"""GGML's Q4_0 / Q8_0 / F16 / BF16 arithmetic, and every block type's through its ``ggtool.qtypes``
record, byte-exact with the C library: the array-level API.

Everything is float32 exactly as GGML computes it (ggml-quants.c's quantize_row_q4_0_ref and
quantize_row_q8_0_ref, GGML_FP32_TO_FP16; checked by tests/golden/q4_0.npz, q8_0.npz, f16.npz):

* ``fp32_to_fp16``: round to nearest even, overflow to +-inf, subnormals kept, NaN -> 0x7e00 | sign.
* ``fp32_to_bf16`` / ``bf16_to_fp32`` (GGML_FP32_TO_BF16): round to nearest even on the bits, NaN
  made quiet (``(bits >> 16) | 64``); bf16 data is held as uint16 bits (``bf16``).
* Q4_0 (``quantize_row_q4_0_ref``): the signed value of largest magnitude (first one on ties, and
  +0.0 for a block of +-0.0) gives ``d = max / -8``, ``id = 1/d`` from the unrounded d,
  ``code = min(15, trunc(x*id + 8.5))``, nibbles split-half (element j low, j+16 high).
* Q8_0 reference (``quantize_row_q8_0_ref``): ``d = amax/127``, ``id = 1/d``, ``roundf`` (half away
  from zero).  Q8_0 CPU (``quantize_q8_0_cpu``, the x86 AVX2 ``from_float`` mul_mat uses for its
  activations): ``id = 127/amax``, round half to even.

The per-block loops are compiled kernels (``ggtool.kernels.quantize``, numba, loaded on first use;
their numpy predecessors are the test oracles in ``tests/numpy_oracle.py``).  Large arrays are
processed in cache-sized chunks of blocks, spread over a few threads (the kernels release the GIL).
Data to quantize that holds NaN or +-inf raises QuantizationError naming the tensor and the first
bad index in numpy order.

``mul_mat_quantized`` computes GGML's quantized dot products (Q4_0/Q5_0/Q8_0 x Q8_0, K-quants x Q8_K,
BF16 x BF16);
its numerics are described in ``ggtool/quant/matmul.py``.

Modules: ``threads`` (worker threads), ``blocks`` (shared block plumbing), ``f16``, ``bf16``, ``q4_0``,
``q8_0``, ``q8_k`` (the K-quants' activations), ``generic`` (quantize/dequantize/convert for any
type, ``quantize(..., imatrix=)``: the records' quantizers over arrays on the threads), ``matmul``
(``mul_mat_quantized``), ``validate`` (GGML's ggml_validate_row_data, which every output is checked
with before it is written).  This package re-exports the public names.
"""

from __future__ import annotations

from .bf16 import bf16_to_fp32, fp32_to_bf16
from .blocks import CHUNK_BLOCKS, Q4_0_BYTES, Q8_0_BYTES, QK, check_finite  # noqa: F401 (constants, as before)
from .f16 import fp16_to_fp32, fp32_to_fp16
from .generic import can_dequantize, can_quantize, convert, dequantize, quantize
from .matmul import mul_mat_quantized
from .q4_0 import dequantize_q4_0, quantize_q4_0
from .q8_0 import dequantize_q8_0, quantize_q8_0, quantize_q8_0_cpu, quantize_q8_1_cpu
from .q8_k import quantize_q8_k
from .threads import get_threads, set_threads, threads_set_to

__all__ = [
    "bf16_to_fp32",
    "can_dequantize",
    "can_quantize",
    "check_finite",
    "convert",
    "dequantize",
    "dequantize_q4_0",
    "dequantize_q8_0",
    "fp16_to_fp32",
    "fp32_to_bf16",
    "fp32_to_fp16",
    "get_threads",
    "mul_mat_quantized",
    "quantize",
    "quantize_q4_0",
    "quantize_q8_0",
    "quantize_q8_0_cpu",
    "quantize_q8_1_cpu",
    "quantize_q8_k",
    "set_threads",
    "threads_set_to",
]

