"""GGML's quantized mul_mat: block-type weights x activations in its vec_dot_type (Q8_0 for
Q4_0/Q5_0/Q8_0, Q8_K for Q4_K/Q5_K/Q6_K), on compiled kernels.

One path for every M: GGML's integer block dot on weights repacked into groups of rows
(``ggtool.kernels.dot``): exact integer sums per block, then the float32 scaling block after block
(for Q4_0/Q8_0, ``(sumi * d_w) * d_a``: GGML's scalar reference bit for bit), whatever the number
of participants. (Measured on 2 cores: faster than expanding the weights to float32 for BLAS up to
M=512, and exact.)

Where the dot of a type is not compiled yet in ggtool's command line, its numpy twin computes the
same bits from the weights as they are, as long as the work is small; large work compiles the
kernel (``compiling.first_run``, ``kernels.twins``). F32/F16 weights (``kernels.dot_float``) take the
twin below FLOAT_TWIN_SMALL products before numba is loaded, or while not compiled up to FLOAT_TWIN_MAX.

Repacked weights are cached for the life of their storage (``weight_pack``): a weight read from a
mapped GGUF file is repacked once per process (once per file identity for a large file: ``packs``),
one in a context once per tensor.
"""

from __future__ import annotations

import functools
import sys
import weakref

import numpy as np

from .. import types as T
from ..errors import QuantizationError
from . import packs
from .blocks import _F32


@functools.cache
def dot_types() -> tuple:
    """Every block (and BF16) type mul_mat multiplies as it is: ``qtypes.DOT_TYPES`` (a compiled dot
    each) and the other records' types (their K form, levels or generic dot), the registry imported
    at the first call (not with the engine: ~15 ms)."""
    from .. import qtypes
    return qtypes.DOT_TYPES + tuple(t for t in qtypes.REGISTRY if t not in qtypes.DOT_TYPES)


def _check(w_raw, wt, act_raw):
    if wt not in dot_types():
        raise QuantizationError(f"mul_mat: no quantized dot product for {T.type_name(wt)} weights "
                                f"(there is one for {', '.join(T.type_name(t) for t in dot_types())})")
    vdt = T.vec_dot_type(wt)
    wb, ab = T.type_size(wt), T.type_size(vdt)
    if w_raw.shape[1] % wb or act_raw.shape[1] % ab or \
            w_raw.shape[1] // wb * T.block_size(wt) != act_raw.shape[1] // ab * T.block_size(vdt):
        raise QuantizationError(f"mul_mat: weight rows of {w_raw.shape[1]} bytes ({T.type_name(wt)}) "
                                f"and activation rows of {act_raw.shape[1]} bytes ({T.type_name(vdt)}) "
                                "differ in length")


def _rows(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.uint8:
        x = x.view(np.uint8)
    return x.reshape(1, -1) if x.ndim == 1 else x


def mul_mat_quantized(w_raw, w_type, act_raw) -> np.ndarray:
    """GGML's quantized dot products: float32 (M, N), out[m, n] = row n of W . row m of A.

    w_raw: uint8 (N, row_bytes) rows of a type of dot_types(); act_raw: uint8 (M, row_bytes) rows of
    its vec_dot_type (Q8_0, or Q8_K for the K-quants) with as many values. See the module
    docstring for the numerics.
    """
    wt = T.parse_type(w_type)
    w_raw, act_raw = _rows(w_raw), _rows(act_raw)
    _check(w_raw, wt, act_raw)
    out = np.empty((act_raw.shape[0], w_raw.shape[0]), _F32)
    mul_mat_into(wt, w_raw, act_raw, out)
    return out


@functools.cache
def _record(wt):
    """The qtypes record of block type wt (the registry imported at the first call)."""
    from .. import qtypes
    return qtypes.get(wt)


class _Kernels:
    """ggtool.kernels' modules that mul_mat calls, imported at first use (the dots load numba)."""

    def __getattr__(self, module: str):
        import importlib

        m = importlib.import_module(f"..kernels.{module}", __package__)
        setattr(self, module, m)
        return m


_kernels = _Kernels()


def _into(multiply, out: np.ndarray) -> None:
    """multiply(o) writes a C-contiguous result: out itself where it is one."""
    if out.flags.c_contiguous:
        multiply(out)
    else:
        tmp = np.empty(out.shape, _F32)
        multiply(tmp)
        out[...] = tmp


def mul_mat_into(wt, w_raw: np.ndarray, act_raw: np.ndarray, out: np.ndarray, pack=None) -> None:
    """out (M, N) = w_raw (N rows of wt) . act_raw (M rows of wt's vec_dot_type); `pack()` may
    supply the cached repacked weights (else they are repacked here)."""
    N, M = w_raw.shape[0], act_raw.shape[0]
    if N == 0 or M == 0 or w_raw.shape[1] == 0:
        out[...] = 0
        return
    if wt in (T.F32, T.F16, T.BF16):
        if wt != T.BF16 and _twin(wt, M, N, w_raw.shape[1] * w_raw.itemsize // T.type_size(wt) * T.block_size(wt)):
            _kernels.twins.dot(wt, w_raw, act_raw, out)     # the same bits
            return
        dot = _kernels.dot
        packed = pack() if pack is not None else dot.pack(wt, w_raw)
        _into(lambda o: dot.dot(wt, packed, act_raw, o), out)
        return
    record = _record(wt)
    if record.packed_form is None:
        _record_mul_mat(wt, w_raw, act_raw, out, pack)
        return
    # a classic type: while its tile is not compiled, its twin (the same bits) where the work is small
    from ..compiling import first_run

    name = f"dot:{record.name}"
    packed = None
    if pack is not None and first_run.compiling_ahead(name):
        packed = pack()             # the weights repacked while their kernel compiles
    k = w_raw.shape[1] // record.type_size * record.block_size
    if not first_run.use_compiled(name, lambda: first_run.dot_seconds(record.name, N, k, M)):
        record.mul_mat_twin(w_raw, act_raw, out)
        return
    if packed is None:
        packed = pack() if pack is not None else record.pack(w_raw)
    _into(lambda o: record.mul_mat_packed_into(packed, act_raw, o), out)


def pack_rows(wt, w_raw: np.ndarray) -> tuple:
    """The packed form of weight rows w_raw (uint8 (n, row bytes)) of wt that mul_mat_into multiplies:
    ``kernels.dot``'s interleaved groups (a classic record's form, or a float type's); for another
    qtypes record, the K-quant dots' layout where its dot has their form (``k_form``), its own packed
    form (``pack``), or ``()``: the rows as they are."""
    if wt in (T.F32, T.F16, T.BF16):
        return _kernels.dot.pack(wt, w_raw)
    record = _record(wt)
    if record.k_form is not None:
        return _kernels.dot_k.pack_k_form(w_raw, record.decode_k, record.type_size)
    return record.pack(w_raw) if hasattr(record, "mul_mat_packed") else ()


def _record_mul_mat(wt, w_raw, act_raw, out, pack) -> None:
    """A qtypes record's product, the bits of its generic dot (GGML's ``*_generic`` vec_dot) whichever
    way: the K-quant tile on its K form, then its final factor (``dot_final``); its packed mat-mul
    (``pack``/``mul_mat_packed``), the packed forms cached as the others' are (``pack``); else its
    mul_mat kernel, row by row."""
    record = _record(wt)
    if record.k_form is None and not hasattr(record, "mul_mat_packed"):
        out[...] = record.mul_mat(w_raw, act_raw)
        return
    packed = pack() if pack is not None else pack_rows(wt, w_raw)
    if record.k_form is not None:
        from ..kernels.tables import F16_TO_F32

        res = np.empty((act_raw.shape[0], w_raw.shape[0]), _F32)
        _kernels.dot_k.dot_packed_k(packed, act_raw, F16_TO_F32, res)
        np.multiply(res, record.dot_final, out=res)
    else:
        res = record.mul_mat_packed(packed, act_raw)
    out[...] = res


# F32 and F16 products (mul_mat's float weights, attention's K and V): below FLOAT_TWIN_SMALL products
# the numpy twin costs less than loading numba (0.3-0.9 s), so a process that has not loaded it does
# not for them (f32-only computes keep numpy's start-up); above FLOAT_TWIN_MAX (the twin at 1-7 ns a
# product, the kernel ~25x faster) compiling the kernel here costs less than the twin, even in a
# first-ever run of the command line. Between them the first-ever-run policy weighs the twin's calls
# against compiling, as for the block types (a generation's attention: once a step to come).
FLOAT_TWIN_SMALL = 1 << 21
FLOAT_TWIN_MAX = 1 << 28


def _twin(wt, M: int, N: int, K: int) -> bool:
    """Whether the numpy twin computes this F32/F16 product (the same bits as the kernel): where it is
    cheaper than loading numba, or the kernel is not compiled yet in ggtool's command line and the
    work is small for the twin (``compiling.first_run``)."""
    products = M * N * K
    if products <= FLOAT_TWIN_SMALL and "numba" not in sys.modules:
        return True
    from ..compiling import first_run

    cost = float("inf") if products > FLOAT_TWIN_MAX else (lambda: first_run.dot_seconds(T.type_name(wt), N, K, M))
    return not first_run.use_compiled(f"dot:{T.type_name(wt)}", cost)


_TENSOR_PACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # context leaf -> {key: packed}


def _root(t):
    while t.view_src is not None:
        t = t.view_src
    return t


def weight_pack(a, key, make, source=None):
    """The repacked form of (part of) weight tensor `a`, made by make() once for the life of its
    storage: per mapped file for GGUF weights (``FileStorage.derived``; for a large file, once on
    disk too: ``packs``), per tensor for a context's leaf (dropped when the leaf is written through
    ``Tensor.set_data``). A weight computed by the graph changes from run to run and is repacked on
    every use. `source`, the raw rows make() packs: for a mapped file, their pages leave this
    process's memory once packed (``FileStorage.release``)."""
    root = _root(a)
    if root.op != "NONE":
        return make()
    key = (a.type, a.ne, a.nb, a.data_offset, *key)
    if root.storage is not None:
        cache = root.storage.derived
    else:
        cache = _TENSOR_PACKS.get(root)
        if cache is None:
            cache = _TENSOR_PACKS[root] = {}
    packed = cache.get(key)
    if packed is None:
        path = getattr(root.storage, "path", None)
        where = packs.folder(path) if path is not None else None
        packed = packs.load(where, key) if where is not None else None
        if packed is None:
            packed = make()
            if where is not None:
                packs.store(where, key, packed)
            if source is not None and root.storage is not None:
                root.storage.release(source)
        cache[key] = packed
    return packed


def packs_shared(a) -> bool:
    """Whether `weight_pack` maps weight `a`'s repacked tiles from the cache's packs/ (a large model
    file's leaf): pages every process shares, so that each can bind all of them for nothing."""
    root = _root(a)
    path = getattr(root.storage, "path", None) if root.op == "NONE" else None
    return path is not None and packs.folder(path) is not None


# Bumped whenever repacked weights are dropped: what holds on to repacked arrays itself (the compiled
# runner's bound steps, ggtool.runner) makes them anew when it has changed
EPOCH = [0]


def forget(t) -> None:
    """Drop the repacked weights made from t's leaf (its data is being rewritten)."""
    if _TENSOR_PACKS.pop(_root(t), None) is not None:
        EPOCH[0] += 1
