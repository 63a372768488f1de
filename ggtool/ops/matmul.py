"""mul_mat: out[i, j, k, l] = row i of a . row j of b (ggml_mul_mat;
ggml_compute_forward_mul_mat, and its work size in ggml_graph_plan).

With C-order arrays A (M, K) and B (N, K) the result is B @ A.T. Dims 2/3 broadcast by block
repeat: b-matrix (i12, i13) uses a-matrix (i12 // r2, i13 // r3).

When b's type is not vec_dot_type(a) (Q8_0 for Q4_0/Q5_0/Q8_0 weights, Q8_1 for Q4_1/Q5_1, Q8_K for K-quants, F16 for F16,
BF16 for BF16), every
thread first converts its interleaved b rows into the work buffer (packed rows at
i13*nbw3 + i12*nbw2 + i11*nbw1), then all threads meet at the barrier. The output is then cut
into tiles that depend on the shapes only (see tile_shape); each thread takes a contiguous run
of them and computes each with one compiled dot: for F32/F16 weights GGML's scalar
ggml_vec_dot_f32/_f16 (``kernels.dot_float``: a double sum per output, in order, the same bits on
every host; never numpy's BLAS, whose order is its CPU kernel set's), for the block types their
integer block dots, under ``numerics="llama.cpp*"`` llama.cpp's x86 orders (``kernels.x86``).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .. import types as T
from ..errors import GGToolError, QuantizationError
from ..kernels.numerics import is_llama_cpp, wide
from .base import ALL, CompiledStep, check, fmt_ne, function, kernel, new_op
from .walk import grid_chunks, plain, require, require_type


def weight_types() -> tuple:
    """The weight types mul_mat multiplies (F32, F16 and ``quant.matmul.dot_types()``)."""
    from ..quant import matmul as qm
    return (T.F32, T.F16, *qm.dot_types())


def _work_size(node, n_tasks: int) -> int:
    """row_size(vec_dot_type, nelements(b)) when b must be converted, else 0 (not per thread)."""
    a, b = node.src
    vdt = T.vec_dot_type(a.type)
    return 0 if b.type == vdt else T.row_size(vdt, b.nelements)


def _check_layout(node, a, b) -> None:
    require(node.ne == (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), "mul_mat", "result shape does not match a and b")
    require(a.nb[0] == T.type_size(a.type) and b.nb[0] == T.type_size(b.type), "mul_mat",
            "a and b must not be permuted in dim 0 (nb0 == type size)")
    nb = node.nb
    require(nb[0] == 4 and nb[0] <= nb[1] <= nb[2] <= nb[3], "mul_mat", "the result must not be transposed or permuted")


def _not_finite(b, vdt) -> GGToolError:
    """The error of a NaN or inf in b, which cannot be quantized to vdt: its first in b's logical order,
    whichever participant met one (each converts its own part of b)."""
    x = b.data
    bad = np.argwhere(~np.isfinite(x))[0]
    v = x[tuple(bad)]
    what = "NaN" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    where = ", ".join(str(int(i)) for i in bad[::-1])
    return GGToolError(f"mul_mat: b '{b.name}' holds {what} at [{where}] (ne order), which cannot be converted "
                       f"to {T.type_name(vdt)}, the weights' vec_dot_type")


def _convert_src1(b, vdt, work, ith: int, nth: int) -> np.ndarray:
    """Rows i11 = ith, ith+nth, ... of every b matrix, converted to vdt into the work buffer."""
    from .. import quant

    ne10, ne11, ne12, ne13 = b.ne
    nbw1 = T.row_size(vdt, ne10)
    raw = work.wdata[: ne13 * ne12 * ne11 * nbw1].reshape(ne13, ne12, ne11, nbw1)
    mine, out = b.data[:, :, ith::nth], raw[:, :, ith::nth]
    for c in grid_chunks(mine.shape[:3], 4 * ne10) if mine.size else ():   # rows a chunk at a time
        x = mine[c]
        if vdt == T.F16:
            conv = quant.fp32_to_fp16(np.ascontiguousarray(x)).view(np.uint8)
        elif vdt == T.BF16:    # the CPU from_float: GGML_FP32_TO_BF16 per value
            conv = quant.fp32_to_bf16(x).view(np.uint8)
        elif vdt == T.GGMLType.Q8_K:
            conv = quant.quantize_q8_k(np.ascontiguousarray(x).reshape(-1, ne10))
        elif vdt == T.GGMLType.Q8_1:
            conv = quant.quantize_q8_1_cpu(np.ascontiguousarray(x).reshape(-1, ne10))
        else:  # Q8_0: the CPU (AVX2) from_float, as GGML's mul_mat
            conv = quant.quantize_q8_0_cpu(np.ascontiguousarray(x).reshape(-1, ne10))
        out[c] = conv.reshape(*x.shape[:3], nbw1)
    return raw.view(np.float16) if vdt == T.F16 else raw


# The output is cut into tiles whose size depends on the shapes and a's type only, never on nth:
# each tile is one call of a dot kernel, so every element is computed by the same call whatever the
# number of participants, and results are bit-identical for 1..N of them (GGML's own chunks give
# that property to its dot products). The F32/F16 dot of the default numerics sums each element on
# its own, so there any cut gives the same bits; its tiles (TILE_FLOAT) group the b matrices that
# share an a matrix (_float_tiles). (b rows, a rows) per tile: the quantized dots repack a column
# tile once and prefer long ones (fewer calls per mat-vec).
TILE_FLOAT = (512, 512)
FLOAT_GROUP = 64      # the weight rows of one of kernels.dot_float's register tiles (NC chunks of L rows)
TILE_QUANT = (256, 1024)


def tile_shape(a_type) -> tuple[int, int]:
    return TILE_FLOAT if a_type in (T.F32, T.F16) else TILE_QUANT


def _tiles(nr0: int, nr1: int, ne1: int, shape=TILE_QUANT):
    """Every tile as (row0, row1, col0, col1): rows are flattened (i11, i12, i13), never crossing
    a matrix boundary, columns are a's rows."""
    rows, cols = shape
    for m0 in range(0, nr1, ne1):                       # one b matrix at a time
        for r0 in range(m0, m0 + ne1, rows):
            for c0 in range(0, nr0, cols):
                yield r0, min(r0 + rows, m0 + ne1), c0, min(c0 + cols, nr0)


def _my_tiles(nr0: int, nr1: int, ne1: int, ith: int, nth: int, shape=TILE_QUANT):
    """A contiguous share of the tiles for participant ith (GGML hands chunks out dynamically;
    who computes a tile changes nothing in its result)."""
    tiles = list(_tiles(nr0, nr1, ne1, shape))
    n = len(tiles)
    return tiles[ith * n // nth: (ith + 1) * n // nth]


def _dot_block(a, w: np.ndarray, x: np.ndarray, out: np.ndarray, tile: tuple) -> None:
    """out (m, n) = x (m, K) . w (n, K)^T for a's block type; tile names w's rows within a (the
    key of their repacked form, made once per weight's storage)."""
    from ..quant import matmul as qm

    def repack():       # imports the compiled packers (numba) only when the kernel runs
        return qm.pack_rows(a.type, w)

    w = np.ascontiguousarray(w)
    qm.mul_mat_into(a.type, w, np.ascontiguousarray(x), out, pack=lambda: qm.weight_pack(a, tile, repack, w))


def tile_packers(node):
    """Callables that each repack one weight tile of mul_mat `node` as its Python path's first call
    would (``_dot_block``: the same tiles, keys and keeping; F32/F16 weights have tiles of their own,
    not repacked ahead), for a first-ever run to do while its dot compiles elsewhere
    (``compiling.first_run.meanwhile``). None of a weight the graph computes (repacked at every use)."""
    a = node.src[0]
    if a.type in (T.F32, T.F16) or not a.has_data or 0 in a.ne or a.root.op != "NONE":
        return
    cols = tile_shape(a.type)[1]
    for m3 in range(a.ne[3]):
        for m2 in range(a.ne[2]):
            for c0 in range(0, a.ne[1], cols):
                yield partial(_pack_tile, a, (m3, m2, c0, min(c0 + cols, a.ne[1])))


def _pack_tile(a, tile: tuple) -> tuple:
    """The repacked form of weight tile (m3, m2, col0, col1) of `a` (``quant.matmul.weight_pack``:
    made once), as the runner's units and the tiles repacked ahead read it."""
    from ..quant import matmul as qm

    m3, m2, c0, c1 = tile
    w = np.ascontiguousarray(a.data[m3, m2, c0:c1])
    return qm.weight_pack(a, tile, lambda: qm.pack_rows(a.type, w), w)


# -- the compiled runner's steps (kernels.nodes_mm) ----------------------------------------------------
_CONVERT = {T.Q8_0: 0, T.GGMLType.Q8_1: 1, T.GGMLType.Q8_K: 2, T.F16: 3}         # nodes_mm.CV_*
# the runner's step for each packed form of kernels.dot that a classic type's record names
# (``packed_form``): its kernel and argument (mm_q32's kind, nodes_mm.Q32_*; mm_k's hm: mins)
_FORM_STEPS = {"nibbles": ("mm_q32", 0), "int8": ("mm_q32", 1), "int8_min": ("mm_q32", 2),
               "k": ("mm_k", 1), "k6": ("mm_k6", None)}
_UNIT = 16          # nodes_mm.UNIT
_GROUP = 128        # kernels.dot_base.GROUP: weight rows per repacked row group


def _f16_table(ith: int, nth: int, shared: dict):
    """mm_f32's last int: the fp16 table's address (dot_float's kernel takes it; F32 rows never read it)."""
    from ..kernels.tables import F16_TO_F32
    return (int(F16_TO_F32.ctypes.data),), F16_TO_F32, None


# F32 x F32 products of up to this many activation rows a matrix run on the runner's ``mm_f32`` (a
# decode step's attention: no Python step); from more, the Python path's tiles (``kernels.dot_float``,
# 16 lanes) cost less than the step saves.
MM_F32_ROWS = 8


def _mul_mat_compiled(node, numerics):
    """mul_mat as the compiled runner runs it: src1 converted into the work buffer (``mm_convert``,
    then the barrier), then each participant's units (``mm_q32``, ``mm_k``, ``mm_k6``; ``mm_x86`` under
    llama.cpp's numerics); F32 weights with F32 activations under GGML's numerics in one step
    (``mm_f32``). F16 weights under GGML's numerics (``kernels.dot_float``) and BF16 stay in Python."""
    a, b = node.src
    if not (a.has_data and b.has_data and node.has_data and plain(node)):
        return None
    ne = node.ne
    if ne != (a.ne[1], b.ne[1], b.ne[2], b.ne[3]) or a.nb[0] != T.type_size(a.type) or \
            b.nb[0] != T.type_size(b.type) or node.nb[0] != 4 or not node.nb[0] <= node.nb[1] <= node.nb[2] <= node.nb[3]:
        return None
    vdt = T.vec_dot_type(a.type)
    x86 = is_llama_cpp(numerics) and x86_order(a)
    if a.type == b.type == T.F32 and not x86:
        if b.ne[1] > MM_F32_ROWS or not a.ne[0] or not plain(a, b) or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
            return None
        return (CompiledStep("mm_f32", (TILE_FLOAT[0], float_cols(a.type, b.ne[1])), tensors=(node, a, b), bind=_f16_table),)
    if x86:
        which = _runner_x86(a, numerics)
        if which is None:
            return None         # llama.cpp's order from Python (_x86_block)
    elif _packed_form(a.type) is not None or _k_form(a.type) is not None or _levels(a.type) is not None:
        which = None
    else:
        return None
    steps = []
    if b.type != vdt:
        if b.type != T.F32 or vdt not in _CONVERT or not plain(b) or b.ne[0] % T.block_size(vdt):
            return None
        steps.append(CompiledStep("mm_convert", (_CONVERT[vdt], T.row_size(vdt, b.ne[0])), tensors=(node, a, b)))
        act = (0, T.row_size(vdt, b.ne[0]), T.row_size(vdt, b.ne[0] * b.ne[1]), T.row_size(vdt, b.ne[0] * b.ne[1] * b.ne[2]))
    elif vdt == T.F32 and x86:
        if not plain(a, b):
            return None
        act = None       # b's own rows (bound per process: its address)
    else:
        if b.nb[1] != T.row_size(b.type, b.ne[0]) or b.data_offset % 2 or any(nb % 2 for nb in b.nb):
            return None
        act = None
    rb = T.row_size(vdt, b.ne[0])
    if x86:
        from ..kernels import nodes_mm
        args = (rb, getattr(nodes_mm, which[0]), _x86_sub(a, b, which, numerics), T.row_size(a.type, a.ne[0]))
        kernel = "mm_x86"
    elif _packed_form(a.type) is not None:    # a classic type: its record's packed form
        kernel, arg = _FORM_STEPS[_packed_form(a.type)]
        args = (rb,) if arg is None else (rb, arg)
    elif _levels(a.type) is not None:         # a record's int8 levels in Q8_0's packed form
        args, kernel = (rb, 4 if _levels(a.type).scale_dtype == np.float32 else 3), "mm_q32"   # nodes_mm.Q32_LEVELS*
    else:                                     # a record's K form (no mins), then its final factor
        args, kernel = (rb, 0), "mm_k"
    k_form = _k_form(a.type) if not x86 else None
    floats = (float(k_form.dot_final),) if k_form is not None else ()
    # the packers run in bind (the records' are numpy: nothing to compile)
    needs = () if x86 or _packed_form(a.type) is None else (f"dot:{T.type_name(a.type)}",)
    # dealt out where every process can bind every unit at no cost: llama.cpp's orders read the
    # weights in place, the default kernels' repacked tiles are mapped from the cache's packs/
    from ..quant import matmul as qm
    deals = x86 or qm.packs_shared(a)
    steps.append(CompiledStep(kernel, floats=floats, tensors=(node, a, b), bind=_UnitsBind(node, act, args, x86, deals),
                              needs=needs, stable=() if x86 else (a,), deals=deals))
    return tuple(steps)


def _packed_form(t) -> str | None:
    """The packed form of kernels.dot that t's record multiplies (the classic types), else None."""
    if not T.is_quantized(t):
        return None
    record = _record(t)
    return None if record is None else record.packed_form


def _k_form(t):
    """The ggtool.qtypes record of t where the K-quant tile multiplies it in its K form (``k_form``:
    IQ1_*, IQ2_*, IQ3_*, TQ*; ``quant.matmul._record_mul_mat``'s path), else None."""
    if not T.is_quantized(t):
        return None
    record = _record(t)
    return record if record is not None and record.k_form is not None else None


def _levels(t):
    """The ggtool.qtypes record of t where its rows are int8 levels on Q8_0's packed form
    (``qtypes.LevelRows``: IQ4_NL, MXFP4), else None."""
    if not T.is_quantized(t):
        return None
    from .. import qtypes

    record = _record(t)
    return record if record is not None and issubclass(record, qtypes.LevelRows) else None


def _runner_x86(a, numerics) -> tuple | None:
    """(nodes_mm.mm_x86's X_* kernel, the kernels.x86 kind it takes or None) that runs llama.cpp's x86
    order of weights `a` on the compiled runner: F32's, else the record's (``runner_x86``, or
    ``runner_x86_repacked`` where that build repacks `a`); None where the order runs from Python."""
    if a.type == T.F32:
        return ("X_F32", None)
    record = _record(a.type) if T.is_quantized(a.type) else None
    if record is None:
        return None
    return record.runner_x86_repacked if x86_repacked(a, wide(numerics)) else record.runner_x86


def _x86_sub(a, b, which, numerics) -> int:
    """The x86 kernel's own argument: Q0's kind, Q4_K's gemm rows, Q6_K's tiled, F32's tiny | wide."""
    from ..kernels import x86

    kernel, kind = which
    ne11 = b.ne[1]
    if kind is not None:
        return getattr(x86, kind)
    if kernel == "X_Q4_K":
        return ne11 - ne11 % 4
    if kernel == "X_Q6_K":
        return int(ne11 >= 8)
    if kernel == "X_F32":
        tiny = _sgemm_takes(a, b, 16 if wide(numerics) else 8) and b.is_contiguous()   # as _x86_block
        return int(tiny) | (2 if wide(numerics) else 0)
    return 0


class _UnitsBind:
    """The dot step's per-process part: this participant's units (nodes_mm.UNIT words each: the tiles
    of `_tiles` cut into row groups; where the step deals them out, `deals`, every unit, a row group
    each, else a contiguous share each, in order), the repacked tiles they read (made here as
    `_dot_block` makes them, in the same cache), and the activations' place."""

    def __init__(self, node, act, args, x86: bool, deals: bool):
        self.node, self.act, self.args, self.x86, self.deals = node, act, args, x86, deals

    def __call__(self, ith: int, nth: int, shared: dict):
        from ..kernels.tables import F16_TO_F32

        node = self.node
        a, b = node.src
        ne0, ne1, ne2, _ = node.ne
        r2, r3 = b.ne[2] // a.ne[2], b.ne[3] // a.ne[3]
        every = []
        for row0, row1, col0, col1 in _tiles(ne0, ne1 * ne2 * b.ne[3], ne1, tile_shape(a.type)):
            i13, i12 = divmod(row0 // ne1, ne2)
            i0 = row0 % ne1
            n = col1 - col0
            for g in range(-(-n // _GROUP)):
                every.append((i13, i12, i0, i0 + (row1 - row0), col0, g, n, i12 // r2, i13 // r3))
        mine = every if self.deals else every[ith * len(every) // nth: (ith + 1) * len(every) // nth]
        units, keep = [], []
        for i13, i12, r0, r1, col0, g, n, m2, m3 in mine:
            last = units[-1] if units and not self.deals else None
            if last is not None and last[:5] == [i13, i12, r0, r1, col0] and last[6] == g:
                last[6] = g + 1
                continue
            units.append([i13, i12, r0, r1, col0, g, g + 1, n, 0, m2, m3])
        table = np.zeros((max(len(units), 1), _UNIT), np.int64)
        nb = a.ne[0] // T.block_size(a.type)          # blocks a row
        tile_arrays: dict = {}      # the row groups of a tile read one repacked tile: looked up once
        for k, u in enumerate(units):
            table[k, :11] = u
            if not self.x86:
                tile = (u[9], u[10], u[4], u[7])        # m2, m3, col0, n
                addresses = tile_arrays.get(tile)
                if addresses is None:
                    packed = self._pack(a, u)
                    keep.append(packed)
                    addresses = tile_arrays[tile] = [p.ctypes.data for p in packed if isinstance(p, np.ndarray)]
                table[k, 8] = nb
                table[k, 11:11 + len(addresses)] = addresses
        if self.act is not None:
            act = self.act
        else:
            act = (int(b.data.ctypes.data), *b.nb[1:])
        keep.append(table)
        return (int(table.ctypes.data), len(units), int(F16_TO_F32.ctypes.data), *act, *self.args), (keep, F16_TO_F32), None

    @staticmethod
    def _pack(a, u):
        m2, m3, col0, n = u[9], u[10], u[4], u[7]
        return _pack_tile(a, (m3, m2, col0, col0 + n))


@kernel("MUL_MAT", n_tasks=ALL, work_size=_work_size, compiled=_mul_mat_compiled)
def forward_mul_mat(node, ith, nth, work):
    a, b = node.src
    _check_layout(node, a, b)
    llama_cpp = is_llama_cpp(work.numerics)
    require_type(a, "mul_mat", weight_types())
    vdt = T.vec_dot_type(a.type)
    if b.type != vdt:
        require(b.type == T.F32, "mul_mat",
                f"b '{b.name}' is {T.type_name(b.type)}; it must be f32 (converted to {T.type_name(vdt)}) or {T.type_name(vdt)}")
        try:
            act = _convert_src1(b, vdt, work, ith, nth)
        except QuantizationError:
            raise _not_finite(b, vdt) from None
        work.barrier()
    else:
        act = b.data
    out = node.data
    ne0, ne1, ne2, _ = node.ne
    r2, r3 = b.ne[2] // a.ne[2], b.ne[3] // a.ne[3]
    w = a.data
    x86 = _x86_block(a, b, wide(work.numerics)) if llama_cpp else None
    if x86 is None and a.type in (T.F32, T.F16):
        return _float_mul_mat(a, act, out, r2, r3, ith, nth)
    for row0, row1, col0, col1 in _my_tiles(ne0, ne1 * ne2 * b.ne[3], ne1, ith, nth, tile_shape(a.type)):
        i13, i12 = divmod(row0 // ne1, ne2)
        i0, i1 = row0 % ne1, row0 % ne1 + (row1 - row0)
        m3, m2 = i13 // r3, i12 // r2
        args = (w[m3, m2, col0:col1], act[i13, i12, i0:i1], out[i13, i12, i0:i1, col0:col1])
        if x86 is not None:
            x86(*args, i0)
        else:
            _dot_block(a, *args, (m3, m2, col0, col1))


def float_cols(a_type, ne11: int) -> int:
    """The weight rows of an F32/F16 tile (`_float_tiles`) for ne11 activation rows a matrix: TILE_FLOAT's,
    or one FLOAT_GROUP for F32 weights with up to MM_F32_ROWS activation rows (a decode step's
    attention, which the runner's mm_f32 takes). There a K or V of a few hundred cells made one tile,
    which one participant computed while the others waited; as 64-row tiles it is shared out, as GGML
    cuts mul_mat by thread when its chunks are too few. The Python path (a first-ever run's twins, a
    layout mm_f32 does not take) cuts such products alike and pays ~12 us more a tile: an F32 output
    matrix of 32000 rows is 500 tiles a token there, not 63. F16 weights keep TILE_FLOAT's. The tiles
    never depend on the participants: each is computed by one call of dot_float's kernel with the
    same arguments whoever computes it, so a participant count changes no bit."""
    return FLOAT_GROUP if a_type == T.F32 and ne11 <= MM_F32_ROWS else TILE_FLOAT[1]


def _float_tiles(a, ne11: int, r2: int, r3: int):
    """F32/F16 tiles as (m3, m2, row0, row1, col0, col1): the b matrices that read a's matrix (m2, m3)
    (mul_mat's broadcast: a grouped-query attention's heads read one K) form one run of r3*r2*ne11 rows,
    cut with a's rows into tiles of `float_cols` rows, so that a's rows are transposed once for all of them."""
    rows, cols = TILE_FLOAT[0], float_cols(a.type, ne11)
    for m3 in range(a.ne[3]):
        for m2 in range(a.ne[2]):
            for r0 in range(0, r3 * r2 * ne11, rows):
                for c0 in range(0, a.ne[1], cols):
                    yield m3, m2, r0, min(r0 + rows, r3 * r2 * ne11), c0, min(c0 + cols, a.ne[1])


def _float_mul_mat(a, act, out, r2: int, r3: int, ith: int, nth: int) -> None:
    """F32/F16 weights, default numerics: participant ith's share of _float_tiles. Every output is its
    own sum in GGML's scalar order (kernels.dot_float), so neither the tiles nor the share change a bit."""
    from ..quant import matmul as qm

    tiles = list(_float_tiles(a, act.shape[2], r2, r3))
    ne11 = act.shape[2]
    for m3, m2, row0, row1, col0, col1 in tiles[ith * len(tiles) // nth: (ith + 1) * len(tiles) // nth]:
        u3, rem = np.divmod(np.arange(row0, row1), r2 * ne11)
        u2, i11 = np.divmod(rem, ne11)
        i13, i12 = m3 * r3 + u3, m2 * r2 + u2
        res = np.empty((row1 - row0, col1 - col0), np.float32)
        qm.mul_mat_into(a.type, a.data[m3, m2, col0:col1], act[i13, i12, i11], res)
        out[i13, i12, i11, col0:col1] = res


# the float weight types whose llama.cpp x86 forms are ops' own (kernels.x86, x86_float); every block
# type's are its qtypes record's (``llama_cpp``)
X86_FLOAT = (T.F32, T.F16, T.BF16)
TILED_ROWS = 8        # ggml-cpu's tiled K-quant kernel from 8 activation rows (ggml_tiled_min_batch)


def x86_covered() -> str:
    """The weight types whose llama.cpp x86 order mul_mat follows, by name: the float types and the
    qtypes records that carry their forms."""
    from .. import qtypes
    records = [t for t, r in qtypes.REGISTRY.items() if r.llama_cpp]
    return ", ".join(T.type_name(t) for t in (*X86_FLOAT, *sorted(records, key=int)))


def x86_repacked(a, wide_lanes: bool = True) -> bool:
    """Whether llama.cpp's x86 build (`wide_lanes`: the AVX-512 one) repacks weights `a` for mul_mat
    (ggml-cpu's CPU_REPACK, the record's ``x86_repacked``: q4_0_8x8, q4_K_8x8, iq4_nl_8x8, mxfp4_8x8,
    and q2_K_8x8 on AVX-512): 2-D, rows in eights. A tied output projection is repacked too: llama.cpp
    loads it as the output layer's own copy of the token embeddings."""
    record = _record(a.type) if _record_x86(a.type) else None
    if record is None or _numerics(wide_lanes) not in record.x86_repacked:
        return False
    return a.ne[1] % 8 == 0 and a.ne[2] == a.ne[3] == 1


def _numerics(wide_lanes: bool) -> str:
    return "llama.cpp-avx512" if wide_lanes else "llama.cpp-avx2"


def _record(t):
    """The ggtool.qtypes record of type t, or None."""
    from .. import qtypes
    return qtypes.REGISTRY.get(t)


def _record_x86(t) -> dict:
    """The llama.cpp x86 forms of a ggtool.qtypes record's type ({} for the float types, and where not modelled)."""
    if not T.is_quantized(t):
        return {}
    record = _record(t)
    return record.llama_cpp if record is not None else {}


def x86_order(a) -> bool:
    """Whether mul_mat with weights `a` has llama.cpp's x86 order here (X86_FLOAT, and the qtypes
    records that carry their x86 forms)."""
    return a.type in X86_FLOAT or bool(_record_x86(a.type))


def without_x86_order(nodes) -> list:
    """The MUL_MAT nodes among `nodes` whose weights have no llama.cpp x86 order here: under
    llama.cpp's numerics they sum in GGML's order (the same products, other roundings than llama.cpp's)."""
    return [n for n in nodes if n.op == "MUL_MAT" and not x86_order(n.src[0])]


def _sgemm_takes(a, b, lanes: int) -> bool:
    """Whether llamafile_sgemm takes F32/F16/BF16 weights `a` (tinyBLAS<lanes>): 2 rows of b or more,
    k a multiple of the lanes, a's rows in fours; b contiguous where it is not converted first. A product
    of attention (a computed, not a tensor of the model: kq . v) runs over llama.cpp's KV cache,
    whose cells come in multiples of 256 (the padding adds zeros): k passes."""
    converted = b.type != T.vec_dot_type(a.type)
    k_fits = a.ne[0] % lanes == 0 or a.root.op != "NONE"
    return b.ne[1] >= 2 and k_fits and a.ne[1] % 4 == 0 and (converted or b.is_contiguous())


def _x86_block(a, b, wide_lanes: bool = True):
    """llama.cpp's x86-64 order for a's type, as (w, x, out, i0) -> None, i0 being x's first row in
    its matrix; None for the types it leaves to the default kernels. `wide_lanes`: the AVX-512 build
    (16 F32 lanes, vdpbf16ps, Q2_K repacked), else AVX2's (8 lanes). Which of llama.cpp's paths a
    mul_mat takes (ggml_compute_forward_mul_mat): the repacked gemm/gemv for CPU_REPACK weights; the
    tiled kernel for K-quants from 8 rows; llamafile's sgemm (F32/F16/BF16 tinyBLAS, tinyBLAS_Q0 for
    Q8_0/Q5_0/Q4_0/IQ4_NL) from 2 rows; else the vec_dot of the type. A block type's forms are its
    qtypes record's (``mul_mat_x86``), given the path and the rows."""
    if not x86_order(a):
        return None
    from ..kernels import x86
    from ..kernels.tables import F16_TO_F32 as f16

    t, ne11 = a.type, b.ne[1]
    if _record_x86(t):         # a qtypes record's own forms, on the path llama.cpp takes for it
        record, numerics = _record(t), _numerics(wide_lanes)
        path = "repacked" if x86_repacked(a, wide_lanes) else ("tiled" if ne11 >= TILED_ROWS else "vec_dot")

        def record_block(w, x, out, i0):
            out[...] = record.mul_mat_x86(numerics, w, x, path, ne11, i0)
        return record_block
    if t == T.F32:
        tiny = _sgemm_takes(a, b, 16 if wide_lanes else 8)
        tiny = tiny and b.is_contiguous()
    else:
        from ..kernels import x86_float
        from ..kernels.tables import BF16_TO_F32

        kind, table = (x86_float.F16_KIND, f16) if t == T.F16 else (x86_float.BF16_KIND, BF16_TO_F32)
        lanes = 32 if (t == T.BF16 and wide_lanes) else (16 if wide_lanes else 8)
        tiny = _sgemm_takes(a, b, lanes)

    def block(w, x, out, i0):
        w, x = np.ascontiguousarray(w), np.ascontiguousarray(x)
        tmp = np.empty(out.shape, np.float32)
        if t == T.F32:
            x86.dot_f32(w, x, tmp, tiny, wide_lanes)
        else:
            x86_float.dot_half(w.view(np.uint16), kind, x.view(np.uint16), tmp, tiny, wide_lanes, table)
        out[...] = tmp
    return block


@function("mul_mat", "ggml_mul_mat(ctx, a, b)",
          "a . b^T row by row: result ne = [a.ne1, b.ne1, b.ne2, b.ne3] (F32); a's matrices repeat over b's dims 2/3")
def mul_mat(ctx, a, b):
    check(a.ne[0] == b.ne[0], "mul_mat", f"a '{a.name}' {fmt_ne(a)} and b '{b.name}' {fmt_ne(b)} need the same ne0")
    check(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0, "mul_mat",
          f"b '{b.name}' {fmt_ne(b)}: ne2/ne3 must be multiples of a '{a.name}' {fmt_ne(a)}'s ne2/ne3")
    check(not a.is_transposed(), "mul_mat", f"a '{a.name}' {fmt_ne(a)} nb={list(a.nb)} must not be transposed")
    return new_op(ctx, "MUL_MAT", T.F32, [a.ne[1], b.ne[1], b.ne[2], b.ne[3]], (a, b))
