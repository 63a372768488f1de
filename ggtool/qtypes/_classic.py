"""What the records of GGML's first block types (``legacy``: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0;
``kquant``: Q2_K .. Q6_K) share (``ClassicType``): their quantizers in the records' calling
convention, their dequantizers, and their dot products: each record decodes its blocks
(``decode_rows``) and names the packed form of ``ggtool.kernels.dot`` they take (``packed_form``),
and the numpy twin multiplies the same decoded blocks (the compute path: ``qtypes.DOT_TYPES``).

Their quantizers are compiled kernels of blocks (``kernels.quantize``: the 32-value types'
reference rows; ``_k_quantize``: the K-quants'; ``_weighted_quantize``: every importance-matrix
path); ``quantizer`` wraps a pair of them as ``QType.quantize_kernel``."""

from __future__ import annotations

import importlib

import numpy as np

from .. import types as T
from . import QType, f16_table, serial


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
    """``QType.dot_kernel`` ("dot") or ``mul_mat_kernel`` ("mul_mat") of a classic type: its rows
    packed (``ClassicType.pack``), then its form's tile (the bits of ``mul_mat``)."""

    def __init__(self, what: str):
        self.what = what

    def __get__(self, obj, cls):
        def mul_mat(w, a, out):
            cls.mul_mat_packed_into(cls.pack(w), a, out)

        def one(w, a):
            out = np.empty((1, 1), np.float32)
            mul_mat(w.reshape(1, -1), a.reshape(1, -1), out)
            return out[0, 0]

        return mul_mat if self.what == "mul_mat" else one


class dequantizer:
    """``QType.dequantize_blocks`` of blocks by GGML's dequantize_row_* float32 arithmetic: "gguf"
    (gguf-py's, numpy), "twin:<name>" (``kernels.twins``' numpy kernel of blocks, out), or
    "compiled:<name>" (``_dequantize``'s kernel of blocks, f16 table, out: the source types
    ``ggtool quantize`` reads most)."""

    def __init__(self, how: str):
        self.how = how

    def __get__(self, obj, cls):
        how, name = self.how.partition(":")[::2]

        def dequantize_blocks(b):
            if how == "gguf":
                import gguf.quants as gq
                return np.asarray(gq.dequantize(b, cls.ggml_type), np.float32).reshape(b.shape[0], -1)
            out = np.empty((b.shape[0], cls.block_size), np.float32)
            if how == "twin":
                from ..kernels import twins
                getattr(twins, name)(b, out)
            else:
                from ..kernels.tables import F16_TO_F32
                from . import _dequantize
                getattr(_dequantize, name)(b, F16_TO_F32, out)
            return out

        return dequantize_blocks


class ClassicType(QType):
    """The base of the classic records: no grids, no imatrix rule; their blocks decoded in numpy
    (``decode_rows``), which both their packed tiles (``kernels.dot``'s forms) and their numpy twin
    (``kernels.twins``, what a first-ever run computes with before the tile is compiled) multiply."""
    needs_imatrix = False
    ggml_requires_imatrix = False
    k_form = None                 # packed by their own form (packed_form)
    dot_final = None
    dot_kernel = packed_dot("dot")
    mul_mat_kernel = packed_dot("mul_mat")
    dequantize_blocks = dequantizer("gguf")
    # what each classic record sets beside QType's FIELDS (a test fails for one left unset)
    CLASSIC_FIELDS = ("decode_rows", "packed_form", "twin_decode_seconds")
    # what the twin's decoding costs a weight value (seconds, one BLAS thread; compiling.first_run)
    twin_decode_seconds: float

    @classmethod
    def decode_rows(cls, w) -> tuple:
        """Weight rows (uint8 (n, row bytes)) decoded: the codes of every block in value order and
        its scales (32-value types: (codes int8 (n, nb, 32), d float32 (n, nb), m or None); K-quants:
        (codes int8 (n, nb, 256), scales int32 (n, nb, 16), mins int32 (n, nb, 16), d, dmin))."""
        raise NotImplementedError

    @classmethod
    def pack(cls, w) -> tuple:
        """Weight rows (uint8 (n, row bytes)) in the type's packed form (``mul_mat_packed``'s)."""
        from ..kernels import dot
        return dot.pack_form(cls.packed_form, np.ascontiguousarray(w, np.uint8), cls.decode_rows, cls.type_size)

    @classmethod
    def mul_mat_packed_into(cls, packed: tuple, a, out) -> None:
        """out (M, n) = rows packed by ``pack`` . rows a of vec_dot_type (uint8 (M, row bytes))."""
        from ..kernels import dot
        dot.dot_form(cls.packed_form, packed, a, out)

    @classmethod
    def mul_mat_packed(cls, packed: tuple, a) -> np.ndarray:
        """mul_mat(w, a) from pack(w): float32 (rows of a, rows of w), the same bits."""
        from ..kernels import dot
        a = np.ascontiguousarray(a, np.uint8)
        out = np.empty((a.shape[0], dot.packed_rows(cls.packed_form, packed)), np.float32)
        cls.mul_mat_packed_into(packed, a, out)
        return out

    @classmethod
    def mul_mat_twin(cls, w, a, out) -> None:
        """out (M, n) = weight rows w . rows a of vec_dot_type, the numpy twin of the packed tile
        (the same bits, nothing compiled: ``kernels.twins``)."""
        from ..kernels import twins
        twins.block_dot(cls.decode_rows, T.type_size(cls.vec_dot_type), w, a, out)

    @classmethod
    def quantize_ref(cls, x, *, name: str = "tensor", run=serial) -> np.ndarray:
        """quantize_row_*_ref: the bytes without quant_weights."""
        return cls.quantize(x, None, name=name, run=run)

    @classmethod
    def grids(cls) -> dict[str, np.ndarray]:
        return {}

    @classmethod
    def quantizer_tables(cls) -> tuple:
        return f16_table()

    @classmethod
    def dot_args(cls) -> tuple:
        return ()
