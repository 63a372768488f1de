"""Compiled kernels (numba): the hot loops of quantized compute, byte-exact with GGML.

Nothing here imports numba until a kernel is first needed: ``ggtool.kernels`` itself is light, and
each kernel module (``quantize``, ``dot``, ...) imports it through ``jit`` when it is loaded. So
The command line's help, `inspect`, `plan` and f32-only computes keep numpy + gguf's start-up.

Where the compiled code is cached, and how to move it: see ``jit``.
"""

from __future__ import annotations

from ..errors import GGToolError


class KernelError(GGToolError):
    """The compiled kernels cannot be loaded (numba missing or broken)."""

