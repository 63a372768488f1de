"""What every weight type's dot product shares: the registries (``DotKernel``, ``register``: the
float types' dots, by type; ``PackedForm``, ``register_form``: the block types' packed layouts and
tiles, by name, which their records pick) and the interleaved row groups (``GROUP`` rows side by
side, ``store_group``).

It sits below the modules that register types (``dot``: the 32-value block types, ``dot_k``: the
K-quants, ``dot_bf16``), so each of them imports it and none imports another; ``dot`` loads all
three and dispatches (``dot.pack``, ``dot.dot``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import types as T
from . import simd
from .jit import njit

GROUP = simd.GROUP   # weight rows per interleaved group (128)

# U: unsigned indices for numba loops over rows (dot_bf16): numba wraps negative indices, and that
# select per lane would turn every contiguous load into a gather.
U = np.uint64


@dataclass(frozen=True)
class DotKernel:
    type: T.GGMLType
    block_bytes: int
    pack: Callable        # (w uint8 (n, row_bytes), f16 table) -> packed arrays (a tuple)
    dot: Callable         # (*packed, act uint8 (M, row_bytes of Q8_0), f16 table, out f32 (M, n)) -> None


DOTS: dict[T.GGMLType, DotKernel] = {}


def register(type_, block_bytes: int, pack, dot) -> None:
    DOTS[type_] = DotKernel(type_, block_bytes, pack, dot)


@dataclass(frozen=True)
class PackedForm:
    """An interleaved layout of decoded blocks and the dot that multiplies it. The block types'
    records (``ggtool.qtypes``) name theirs (``packed_form``) and give their decoder."""
    name: str
    pack: Callable        # (w uint8 (n, row_bytes), decode_rows, block bytes) -> packed arrays (a tuple)
    dot: Callable         # (*packed, act uint8 (M, row_bytes of vec_dot_type), f16 table, out f32 (M, n)) -> None


FORMS: dict[str, PackedForm] = {}


def register_form(name: str, pack, dot) -> None:
    FORMS[name] = PackedForm(name, pack, dot)


_UNITS = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def interleave_into(dst: np.ndarray, g0: int, rows: np.ndarray) -> None:
    """Rows (gs * GROUP, nb, X[, u]) -> dst[g0:g0 + gs] (dst (G, nb, C, X, L[, u])): ``simd``'s layout,
    [group][block][chunk of L rows][x][row in chunk][unit]. A unit of u bytes (the codes' quads: 4,
    the mins' pairs: 2) moves as one integer where rows and dst are bytes: a permutation of whole
    units, the same bytes, u times fewer strided copies (the packers' main cost)."""
    gs, nb, C, L = rows.shape[0] // GROUP, rows.shape[1], GROUP // simd.L, simd.L
    if rows.ndim == 4:
        u = rows.shape[-1]
        if not (rows.itemsize == dst.itemsize == 1 and rows.strides[-1] == 1 and u in _UNITS):
            dst[g0:g0 + gs] = rows.reshape(gs, C, L, nb, rows.shape[2], u).transpose(0, 3, 1, 4, 2, 5)
            return
        rows, dst = rows.view(_UNITS[u])[..., 0], dst.view(_UNITS[u])[..., 0]
    dst[g0:g0 + gs] = rows.reshape(gs, C, L, nb, rows.shape[2]).transpose(0, 3, 1, 4, 2)


@njit
def store_group(acc, out, g, n):
    """The results of row group g (acc: (M, GROUP)) into out (M, n), leaving out the padding rows."""
    for m in range(acc.shape[0]):
        for r in range(min(GROUP, n - g * GROUP)):
            out[m, g * GROUP + r] = acc[m, r]
