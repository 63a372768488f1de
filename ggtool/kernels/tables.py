"""Lookup tables the kernels share (passed to them as arguments: numba freezes global arrays
into the compiled code, and a 256 KiB constant would be copied into every cached kernel)."""

from __future__ import annotations

import numpy as np

# GGML_FP16_TO_FP32 of every fp16 bit pattern (exact; NaN payloads as numpy's cast keeps them)
F16_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)

# kvalues_iq4nl: IQ4_NL's 16 levels (ggml-common.h), as float32 (C compares and multiplies them so);
# small enough that numba freezing it into a kernel costs nothing
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)

# GGML_BF16_TO_FP32 of every bf16 bit pattern (the bits shifted up: exact)
BF16_TO_F32 = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
