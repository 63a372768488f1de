"""GGML's block types, one record each: layout, decoding, quantizers and dot kernel in one class.

A type is a subclass of ``QType`` that names its ggml type, as gguf-py's ``class Q4_0(__Quant,
qtype=...)`` and GGML's ``type_traits`` rows::

    class IQ2_XXS(QType, ggml_type=GGMLType.IQ2_XXS):
        block_size = 256
        type_size = 66
        ...

Defining the class registers it in ``REGISTRY``; every family module of this package (a module
whose name has no leading underscore, ``grids`` apart) is imported with the package, so ``get``
knows every type and adding a type is writing one module. What each record must set is
``FIELDS`` (a test fails for a record that leaves one unset). Compiled code lives in private
modules (``_*.py``) that a record loads at first use (``compiled``): importing the registry does
not load numba. Shared lookup tables are in ``grids``, generated from llama.cpp's sources.

Layer: beside the K-quants (types, errors and the kernels' helpers below it, nothing above);
``quant`` runs the records' quantizers over arrays on its threads (``QType.quantize``'s ``run``).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from .. import types as T
from ..errors import QuantizationError

REGISTRY: dict[T.GGMLType, type[QType]] = {}
X86_BUILDS = ("llama.cpp-avx2", "llama.cpp-avx512")      # the numerics of llama.cpp's x86 builds

# What a record sets (class attributes, or methods that a subclass overrides): the registry's
# completeness test checks every one.
FIELDS = ("block_size", "type_size", "vec_dot_type", "needs_imatrix", "ggml_requires_imatrix", "grids", "dequantize_blocks",
          "quantize_kernel", "quantizer_tables", "quantize_ref", "dot_kernel", "dot_args", "mul_mat_kernel",
          "k_form", "dot_final", "llama_cpp")


class compiled:
    """A class attribute that is a compiled kernel (``name`` in the private module ``module`` of
    this package), imported, numba with it, at first access."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __get__(self, obj, cls):
        return getattr(importlib.import_module(f"{__name__}.{self.module}"), self.name)


def f16_table() -> tuple:
    """The fp16 -> f32 table, the dot kernels' last argument (kernels.tables, imported when first used)."""
    from ..kernels.tables import F16_TO_F32
    return (F16_TO_F32,)


def serial(fn: Callable[[int, int], None], n_items: int, chunk: int) -> None:
    """fn(start, stop) over [0, n_items) in pieces of `chunk`, in this thread (``quant`` passes its
    threaded runner of the same signature instead)."""
    for s in range(0, n_items, chunk):
        fn(s, min(s + chunk, n_items))


class QType:
    """One GGML block type. Subclasses set the class attributes and override the methods below
    (``FIELDS`` lists them); the base class holds what every block type shares: the checks and
    the chunked drivers of ``dequantize`` and ``quantize``."""

    ggml_type: ClassVar[T.GGMLType]
    name: ClassVar[str]                  # ggml_type_name: "iq2_xxs"
    block_size: ClassVar[int]            # values per block (must equal types' table)
    type_size: ClassVar[int]             # bytes per block
    vec_dot_type: ClassVar[T.GGMLType]   # what mul_mat converts the activations to (type_traits_cpu)
    # llama-quantize refuses the type without an importance matrix (tensor_requires_imatrix of
    # llama-quant.cpp: a file-type rule, token_embd and output apart)
    needs_imatrix: ClassVar[bool] = False
    # ggml_quantize_requires_imatrix: GGML's quantizer asserts one is given (quantize refuses None)
    ggml_requires_imatrix: ClassVar[bool] = False
    quantize_ref: ClassVar[Callable | None] = None   # quantize_row_*_ref where GGML has one (set by each record)
    # the x86 forms of mul_mat (ggml-cpu/arch/x86/quants.c's vec_dot, the tiled kernel, the repacked
    # gemv/gemm, llamafile's tinyBLAS_Q0: the orders of llama.cpp's AVX2 and AVX-512 builds),
    # "llama.cpp-avx2" / "llama.cpp-avx512" -> run(cls, w, act, out, path, rows, i0) (``mul_mat_x86``)
    llama_cpp: ClassVar[dict] = {}
    # the builds (X86_BUILDS) whose CPU_REPACK buffer takes the type's 2-D weights of rows in eights
    x86_repacked: ClassVar[tuple] = ()
    # the compiled runner's kernel for the type's llama.cpp x86 order (``kernels.nodes_mm``'s X_* name,
    # and the ``kernels.x86`` kind it takes or None), for its weights as laid out and as repacked
    # (x86_repacked); None: that order runs from Python (``mul_mat_x86``) between compiled stretches
    runner_x86: ClassVar[tuple | None] = None
    runner_x86_repacked: ClassVar[tuple | None] = None
    # the packed form of ``kernels.dot`` (its ``FORMS``) that the blocks decoded by the record's
    # ``decode_rows`` take, for the classic types (``_classic.ClassicType``); None: the record
    # multiplies its own way (its K form, ``pack``/``mul_mat_packed``, or ``mul_mat_kernel``)
    packed_form: ClassVar[str | None] = None
    CHUNK_BLOCKS: ClassVar[int] = 64     # blocks per work item of quantize (a few ms of work)

    def __init_subclass__(cls, ggml_type: T.GGMLType | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if ggml_type is None:            # a family's shared base: not a type
            return
        if ggml_type in REGISTRY:
            raise TypeError(f"{T.type_name(ggml_type)} has two records: {REGISTRY[ggml_type].__qualname__} "
                            f"and {cls.__qualname__}")
        cls.ggml_type = ggml_type
        cls.name = T.type_name(ggml_type)
        REGISTRY[ggml_type] = cls

    # -- what each record provides --------------------------------------------------------------
    @classmethod
    def grids(cls) -> dict[str, np.ndarray]:
        """The lookup tables the type's decoding uses (``grids``' arrays), by name."""
        raise NotImplementedError

    @classmethod
    def dequantize_blocks(cls, b: np.ndarray) -> np.ndarray:
        """GGML's dequantize_row_* of blocks b (uint8 (n, type_size)): float32 (n, block_size), numpy."""
        raise NotImplementedError

    @classmethod
    def quantizer_tables(cls) -> tuple:
        """The tables the quantize kernel takes after (x, out, qw), built once (cached)."""
        raise NotImplementedError

    @classmethod
    def dot_args(cls) -> tuple:
        """The tables the dot and mul_mat kernels take after their operands."""
        raise NotImplementedError

    # quantize_kernel(x float32 (rows, n), out uint8 (rows, row bytes), qw float32 (n,) or (0,),
    #   *quantizer_tables()) -> -1 | flat index of x's first NaN/inf | -2 - b (GGML aborts on block b)
    # dot_kernel(w uint8 (row bytes,), a uint8 (row bytes of vec_dot_type,), *dot_args()) -> float32
    # mul_mat_kernel(w uint8 (n, row bytes), a uint8 (m, ...), out float32 (m, n), *dot_args())
    # k_form(w uint8 (n, row bytes), *dot_args()) -> (codes int8 (n, nb, 256), scales int32 (n, nb, 16),
    #   d float32 (n, nb)): the rows in the form of the K-quant dots (kernels.dot_k: an integer scale
    #   per 16 codes, no min); sum over blocks of (d * d_act) * sum_j scale_j * (codes_j . act_j),
    #   in block order, times dot_final is the dot, bit for bit (both None: the type's dot has another form)
    quantize_kernel: ClassVar[Callable]
    dot_kernel: ClassVar[Callable]
    mul_mat_kernel: ClassVar[Callable]
    k_form: ClassVar[Callable | None]
    dot_final: ClassVar[np.float32 | None]

    # -- shared drivers ---------------------------------------------------------------------------
    @classmethod
    def dequantize(cls, raw) -> np.ndarray:
        """float32 values of raw bytes (uint8 (..., k * type_size)): (..., k * block_size)."""
        raw = np.asarray(raw)
        if raw.dtype != np.uint8:
            raw = raw.view(np.uint8)
        if raw.ndim == 0 or raw.shape[-1] % cls.type_size:
            raise QuantizationError(f"{cls.name} data has rows of {raw.shape[-1] if raw.ndim else 0} bytes, "
                                    f"not a multiple of the {cls.type_size}-byte block")
        shape = (*raw.shape[:-1], raw.shape[-1] // cls.type_size * cls.block_size)
        b = np.ascontiguousarray(raw).reshape(-1, cls.type_size)
        return cls.dequantize_blocks(b).reshape(shape)

    @classmethod
    def quantize(cls, x, imatrix=None, *, name: str = "tensor", run=serial) -> np.ndarray:
        """GGML's bytes of x (rows of a multiple of block_size values) as ggml_quantize_chunk writes
        them: with `imatrix` (one importance per column) its quant_weights path, without it the
        path GGML takes with none (QuantizationError where GGML asserts one: ``ggml_requires_imatrix``).
        QuantizationError for NaN/inf (naming the first), for an imatrix of another length or not
        finite, and for a block GGML's quantizer aborts on. `run(fn, n_items, chunk)` runs
        fn(start, stop) over the rows (``serial``; ``quant`` passes its threads)."""
        x = np.asarray(x)
        if x.ndim == 0:
            x = x.reshape(1)
        if x.dtype.kind not in "fiub":
            raise QuantizationError(f"tensor '{name}': cannot quantize {x.dtype} data")
        n = x.shape[-1]
        if n % cls.block_size:
            raise QuantizationError(f"tensor '{name}': row length {n} is not a multiple of "
                                    f"{cls.block_size} ({cls.name} block size)")
        if imatrix is None:
            if cls.ggml_requires_imatrix:
                raise QuantizationError(f"tensor '{name}': {cls.name} needs an importance matrix "
                                        "(GGML's quantizer refuses to work without one)")
            qw = np.zeros(0, np.float32)
        else:
            qw = np.asarray(imatrix)
            if qw.shape != (n,):
                raise QuantizationError(f"tensor '{name}': the importance matrix has {qw.size} values for "
                                        f"rows of {n}")
            qw = np.ascontiguousarray(qw, np.float32)
            if not np.isfinite(qw).all():
                raise QuantizationError(f"tensor '{name}': the importance matrix holds NaN or inf "
                                        f"(column {int(np.argmin(np.isfinite(qw)))})")
        rows = np.ascontiguousarray(x.reshape(-1, n) if n else x.reshape(-1, 0), np.float32)
        row_bytes = n // cls.block_size * cls.type_size
        out = np.empty((rows.shape[0], row_bytes), np.uint8)
        kernel, tables = cls.quantize_kernel, cls.quantizer_tables()
        nbr = n // cls.block_size
        found: list[tuple[int, int]] = []   # (flat index of a value, -1) for NaN/inf; (its first value, block) for an abort

        def work(r0: int, r1: int) -> None:
            r = kernel(rows[r0:r1], out[r0:r1], qw, *tables)
            if r >= 0:
                found.append((r0 * n + r, -1))
            elif r <= -2:
                b = r0 * nbr + (-2 - r)
                found.append((b * cls.block_size, b))

        if n and rows.shape[0]:
            run(work, rows.shape[0], max(1, cls.CHUNK_BLOCKS * cls.block_size // n))
        if found:                  # NaN/inf first (every chunk looks for them before it works)
            bad = [at for at, b in found if b < 0]
            if bad:
                raise _bad_value(x, min(bad), name)
            b = min(b for _, b in found)
            raise QuantizationError(
                f"tensor '{name}': cannot quantize row {b // nbr}, values {b % nbr * cls.block_size}.."
                f"{(b % nbr + 1) * cls.block_size - 1} to {cls.name}: GGML's quantizer aborts on them "
                f"(its search finds no grid point or no scale: values too large for the type)")
        return out.reshape(*x.shape[:-1], row_bytes)

    @classmethod
    def dot(cls, w, a) -> np.float32:
        """The dot product of one row of blocks and one row of vec_dot_type blocks, in GGML's order."""
        return cls.dot_kernel(np.ascontiguousarray(w, np.uint8).reshape(-1), np.ascontiguousarray(a, np.uint8).reshape(-1),
                              *cls.dot_args())

    @classmethod
    def decode_k(cls, w) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """k_form of weight rows w (uint8 (n, row bytes)): (codes, scales, d)."""
        return cls.k_form(np.ascontiguousarray(w, np.uint8), *cls.dot_args())

    @classmethod
    def x86_form(cls, w) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Weight rows in the K form llama.cpp's x86 kernels sum (``kform_x86``): the type's k_form,
        unless its generic dot has another shape (IQ4_XS)."""
        return cls.decode_k(w)

    @classmethod
    def mul_mat_x86(cls, numerics: str, w, a, path: str, rows: int = 0, i0: int = 0) -> np.ndarray:
        """out[m, r] = row r of w . row m of a (its vec_dot_type) in llama.cpp's x86 order for `numerics`
        ("llama.cpp-avx2" / "-avx512"), on the path ggml_compute_forward_mul_mat would take for a type
        that has it: "repacked" (CPU_REPACK weights), "tiled" (from 8 activation rows), else "vec_dot".
        `rows`: the activation rows of the whole product (src1's ne1; 0: a's), `i0`: a's first among
        them (the repacked gemm takes rows in fours, the gemv the rest; IQ4_NL's vec_dot one row)."""
        w = np.ascontiguousarray(w, np.uint8)
        a = np.ascontiguousarray(a, np.uint8)
        out = np.empty((a.shape[0], w.shape[0]), np.float32)
        cls.llama_cpp[numerics](cls, w, a, out, path, rows or a.shape[0], i0)
        return out

    @classmethod
    def mul_mat(cls, w, a) -> np.ndarray:
        """out[m, r] = dot(w[r], a[m]): float32 (rows of a, rows of w)."""
        w = np.ascontiguousarray(w, np.uint8)
        a = np.ascontiguousarray(a, np.uint8)
        out = np.empty((a.shape[0], w.shape[0]), np.float32)
        cls.mul_mat_kernel(w, a, out, *cls.dot_args())
        return out


class LevelRows:
    """What a 32-value type whose values are int8 levels times a scale per block (IQ4_NL, MXFP4) adds
    to its record: its rows packed into Q8_0's layout and multiplied on the levels tile
    (``kernels.dot.pack_levels`` / ``dot_levels``), the bits of its generic dot. The record provides
    ``levels(rows)`` -> (levels int8 (k, nb, 32) in value order, d (k, nb): fp16 bits or float32) and
    ``scale_dtype``, d's dtype (the compiled runner's step picks its tile by it)."""

    scale_dtype: ClassVar[type] = np.uint16

    @classmethod
    def pack(cls, w) -> tuple:
        """Weight rows (uint8 (N, row bytes)) as int8 levels in Q8_0's packed form."""
        from ..kernels import dot
        return dot.pack_levels(np.ascontiguousarray(w, np.uint8), cls.levels, cls.type_size)

    @classmethod
    def mul_mat_packed(cls, packed: tuple, a) -> np.ndarray:
        """mul_mat(w, a) from pack(w) on the vector tile: float32 (rows of a, rows of w), the same bits."""
        from ..kernels import dot
        a = np.ascontiguousarray(a, np.uint8)
        out = np.empty((a.shape[0], packed[2]), np.float32)
        dot.dot_levels(packed, a, out)
        return out


def kform_x86(gemv_wrap: bool = True, tiled_wrap: bool = False) -> dict:
    """``llama_cpp`` for a type whose x86 kernels have the K-quants' shape (``_x86_kernels``: the
    AVX2 vec_dot, which the AVX-512 build compiles too, and the tiled kernel): `gemv_wrap` /
    `tiled_wrap`, whether that kernel puts the codes' signs on the int8 activations (-(-128) = -128)."""

    def run(cls, w, a, out, path, rows, i0):
        from . import _x86_kernels as X

        codes, scales, d = cls.x86_form(w)
        factor = cls.dot_final if cls.dot_final is not None else np.float32(1.0)
        tiled = path == "tiled"
        (X.tiled if tiled else X.gemv)(codes, scales.astype(np.int32), d, a, factor, tiled_wrap if tiled else gemv_wrap, out)

    return {"llama.cpp-avx2": run, "llama.cpp-avx512": run}


def _bad_value(x: np.ndarray, flat_index: int, name: str) -> QuantizationError:
    idx = tuple(int(i) for i in np.unravel_index(int(flat_index), x.shape))
    v = x.reshape(-1)[flat_index]
    what = "NaN" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    where = str(idx) if len(idx) != 1 else f"({idx[0]},)"
    return QuantizationError(f"tensor '{name}': cannot quantize {what} at index {where}")


def get(t: T.GGMLType | str | int) -> type[QType]:
    """The record of a type (a GGMLType, its ggml name or id); KeyError for a type with none."""
    t = T.parse_type(t) if not isinstance(t, T.GGMLType) else t
    try:
        return REGISTRY[t]
    except KeyError:
        raise KeyError(f"no record for {T.type_name(t)} in ggtool.qtypes") from None


def _load_families() -> None:
    for m in pkgutil.iter_modules(__path__):
        if not m.name.startswith("_") and m.name != "grids":
            importlib.import_module(f"{__name__}.{m.name}")


_load_families()

# The weight types with a compiled dot of their own (``dot:<type>``, what the background compiler
# builds): the records that name a packed form of kernels.dot (the classic types), and BF16
# (kernels.dot_bf16). The other records multiply by their K form, their levels or their generic dot.
DOT_TYPES = tuple(sorted((t for t, r in REGISTRY.items() if r.packed_form is not None), key=int)) + (T.BF16,)
