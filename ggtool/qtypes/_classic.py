"""What the records of GGML's first block types (``legacy``: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0;
``kquant``: Q2_K .. Q6_K) share: their quantizers in the records' calling convention, and their dot
products, which are ``ggtool.kernels.dot``'s packed tiles (the compute path: ``types.DOT_TYPES``).

Their quantizers are compiled kernels of blocks (``kernels.quantize``: the 32-value types'
reference rows; ``_k_quantize``: the K-quants'; ``_weighted_quantize``: every importance-matrix
path); ``quantizer`` wraps a pair of them as ``QType.quantize_kernel``."""

from __future__ import annotations

import importlib

import numpy as np


def _kernel(where: str):
    """A compiled kernel named ``module:function``: ``kernels.quantize``'s (module "kernels") or one of
    this package's private modules; imported (numba with it) at first use."""
    module, name = where.split(":")
    if module == "kernels":
        from ..kernels import quantize
        return getattr(quantize, name), False
    return getattr(importlib.import_module(f"{__package__}.{module}"), name), True


class quantizer:
    """``QType.quantize_kernel`` of a type whose kernels quantize blocks: `plain` without quant_weights
    (its reference row), `weighted` with them (``quantize_row_*_impl``; None: the type ignores an
    importance matrix, as GGML's Q8_0 does), each ``module:function`` (``_kernel``)."""

    def __init__(self, plain: str, weighted: str | None):
        self.plain, self.weighted = plain, weighted

    def __get__(self, obj, cls):
        plain, weighted, qk, nbytes = self.plain, self.weighted, cls.block_size, cls.type_size

        def run(x, out, qw, *tables):
            rows, n = x.shape
            xb = x.reshape(rows * (n // qk), qk)
            ob = out.reshape(rows * (n // qk), nbytes)
            if qw.shape[0] == 0 or weighted is None:
                fn, takes_f16 = _kernel(plain)
                return fn(xb, ob, *tables) if takes_f16 else fn(xb, ob)
            fn, _ = _kernel(weighted)
            return fn(xb, ob, qw.reshape(n // qk, qk), *tables)

        return run


class packed_dot:
    """``QType.dot_kernel`` ("dot") or ``mul_mat_kernel`` ("mul_mat") of a type that ``kernels.dot``
    multiplies on its packed tiles: the rows packed, then the tile (the bits of ``mul_mat``)."""

    def __init__(self, what: str):
        self.what = what

    def __get__(self, obj, cls):
        t = cls.ggml_type

        def mul_mat(w, a, out):
            from ..kernels import dot
            dot.dot(t, dot.pack(t, w), a, out)

        def one(w, a):
            out = np.empty((1, 1), np.float32)
            mul_mat(w.reshape(1, -1), a.reshape(1, -1), out)
            return out[0, 0]

        return mul_mat if self.what == "mul_mat" else one


def gguf_dequantize(blocks: np.ndarray, t) -> np.ndarray:
    """gguf-py's dequantizer of blocks (its float32 arithmetic is GGML's dequantize_row_*)."""
    import gguf.quants as gq
    return np.asarray(gq.dequantize(blocks, t), np.float32).reshape(blocks.shape[0], -1)
