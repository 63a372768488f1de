"""fp32 <-> fp16 exactly as GGML_FP32_TO_FP16 / GGML_FP16_TO_FP32 (RNE, overflow to +-inf,
subnormals kept, NaN -> 0x7e00 | sign): the conversion every other module builds on. fp32 -> fp16
is compiled (``ggtool.kernels.quantize``: 5x numpy's cast, which also needs a NaN fix-up)."""

from __future__ import annotations

import numpy as np

from .blocks import _F32, CHUNK_BLOCKS, QK, kernel
from .threads import _run_chunks


def fp32_to_fp16(x) -> np.ndarray:
    """GGML_FP32_TO_FP16 elementwise: float16 array (RNE; NaN -> 0x7e00 with the input's sign)."""
    fp16 = kernel("F16", "fp32_to_fp16", np.size(x))
    x = np.asarray(x, dtype=_F32)
    flat = x.reshape(-1)
    if not flat.flags.aligned:
        flat = flat.copy()
    out = np.empty(flat.size, np.uint16)
    _run_chunks(lambda a, b: fp16(flat[a:b], out[a:b]), flat.size, CHUNK_BLOCKS * QK)
    return out.view(np.float16).reshape(x.shape)


def fp16_to_fp32(h) -> np.ndarray:
    """GGML_FP16_TO_FP32 (exact). Accepts float16 values or their uint16 bits."""
    h = np.asarray(h)
    if h.dtype == np.uint16:
        h = h.view(np.float16)
    return h.astype(_F32)
