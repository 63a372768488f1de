"""Quantized dot products: weights of a block type x their vec_dot_type activations (Q8_0 or Q8_1
here, Q8_K in ``dot_k``), GGML's integer block dot.

Each packed form registers a ``PackedForm`` (``dot_base``, the registry this module and ``dot_k``
share; importing this module loads both): its pack (rows of GGML blocks, decoded by the type's
record, ``ggtool.qtypes``' ``decode_rows`` -> an interleaved layout where the codes of 16 rows sit
side by side in groups of ``GROUP`` rows, as ``simd``'s vector tiles read them; GGML's CPU backend
repacks Q4_0 for the same reason) and its dot (packed weights x activation rows -> float32: the
activations prepared as ``simd``'s int16 pairs, then per row group and block one tile for up to
``simd.MT`` activation rows at a time). A type's record names its form (``packed_form``); a new form
is one pack function, one dot and one ``register_form`` call. The float types (BF16, F32, F16)
register their dots by type (``DotKernel``, ``register``).

Numerics: per block the integer sum ``sumi`` of code products is exact, then the float32 scaling
is added to the output block after block. For Q4_0 and Q8_0 that is ``(float(sumi) * d_w) * d_a``
from +0.0: GGML's scalar reference (``ggml_vec_dot_q4_0_q8_0`` without SIMD) bit for bit; Q5_0
shares Q8_0's kernel (GGML's scalar Q5_0 multiplies ``(d_w * d_a) * sumi``: the last bit may differ);
Q4_1/Q5_1 add ``(d_w * d_a) * sumi + m_w * s_a`` as GGML's scalar code does.
The order never depends on how rows are split between participants, so results are bit-identical
for 1..N of them.
"""

from __future__ import annotations

import numpy as np

from . import decode, dot_bf16, dot_float, dot_k, simd  # noqa: F401 - the BF16, F32/F16 dots and the K-quant forms register themselves
from .dot_base import DOTS, FORMS, GROUP, interleave_into, register_form, store_group
from .jit import njit
from .native import view_as
from .tables import F16_TO_F32

Q8_0_BYTES, QK = 34, 32


def pack(type_, w: np.ndarray) -> tuple:
    """The interleaved form of weight rows w (uint8 (n, row_bytes)) of type_, one of the float types
    (BF16, F32, F16: ``DOTS``); a block type's record packs its own (``pack_form``)."""
    return DOTS[type_].pack(np.ascontiguousarray(w), F16_TO_F32)


def dot(type_, packed: tuple, act: np.ndarray, out: np.ndarray) -> None:
    """out (M, n) = packed weight rows of float type_ . activation rows act."""
    DOTS[type_].dot(*packed, np.ascontiguousarray(act), F16_TO_F32, out)


def pack_form(form: str, w: np.ndarray, decode_rows, nbytes: int) -> tuple:
    """Weight rows w (uint8 (n, row_bytes), blocks of `nbytes`) decoded by decode_rows (a record's)
    and interleaved in packed form `form` (``FORMS``: "nibbles", "int8", "int8_min", "k", "k6")."""
    return FORMS[form].pack(np.ascontiguousarray(w), decode_rows, nbytes)


def packed_rows(form: str, packed: tuple) -> int:
    """The weight rows packed in `packed` (form `form`'s tuple ends n, nb; the "k" form's hm after them)."""
    return packed[-3] if form == "k" else packed[-2]


def dot_form(form: str, packed: tuple, act: np.ndarray, out: np.ndarray) -> None:
    """out (M, n) = weight rows in packed form `form` . activation rows act (the type's vec_dot_type)."""
    FORMS[form].dot(*packed, np.ascontiguousarray(act), F16_TO_F32, out)


# -- shared by the 32-value block types ------------------------------------------------------------
PACK_ROWS = 8 * GROUP      # weight rows decoded at a time while packing (bounds the temporaries)


def _pack_32(w: np.ndarray, decoder, nbytes: int, quads: int, mins: bool, raw_nibbles: bool):
    """32-value block rows -> (qs, d[, mn], n, nb): the codes of each row and block in quads
    (``interleave_into``; Q4_0 keeps its 16 nibble bytes as they are, the others int8 codes in value
    order), the block's fp16 scale (and min) per [group][block][row], as their bits (uint16: the
    tile widens them, exactly; half the bytes of float32, and a mat-vec streams them all); rows
    past n are zeros. numpy, from ``decode``'s blocks: nothing to compile."""
    w = np.ascontiguousarray(w)
    n = w.shape[0]
    nb = w.shape[1] // nbytes
    G = (n + GROUP - 1) // GROUP
    qs = np.zeros((G, nb, GROUP // simd.L, quads, simd.L, 4), np.uint8 if raw_nibbles else np.int8)
    d = np.zeros((G, nb, GROUP), np.uint16)
    mn = np.zeros((G, nb, GROUP), np.uint16) if mins else None
    for r0 in range(0, n, PACK_ROWS):
        rows = w[r0:r0 + PACK_ROWS]
        k = rows.shape[0]
        g0, gs = r0 // GROUP, -(-k // GROUP)
        b = decode.blocks(rows, nbytes)
        codes = b[:, :, 2:18] if raw_nibbles else decoder(rows)[0]   # Q4_0: the nibble bytes as they are
        codes = codes.reshape(k, nb, quads, 4)
        dd = np.ascontiguousarray(b[:, :, 0:2]).view(np.uint16)[:, :, 0]
        mm = np.ascontiguousarray(b[:, :, 2:4]).view(np.uint16)[:, :, 0] if mins else None
        pad = gs * GROUP - k
        if pad:
            codes, dd = (np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)]) for x in (codes, dd))
            mm = None if mm is None else np.concatenate([mm, np.zeros((pad, nb), mm.dtype)])
        interleave_into(qs, g0, codes)
        d[g0:g0 + gs] = dd.reshape(gs, GROUP, nb).transpose(0, 2, 1)
        if mins:
            mn[g0:g0 + gs] = mm.reshape(gs, GROUP, nb).transpose(0, 2, 1)
    if mins:
        return qs.reshape(-1), d.reshape(-1), mn.reshape(-1), n, nb
    return qs.reshape(-1), d.reshape(-1), n, nb


@njit
def _act_pairs(act, f16, nbytes, nibbles, sums):
    """Q8_0 (34-byte) or Q8_1 (36-byte: s at byte 2) activation rows as ``simd``'s tiles read them,
    indexed [block, row]: ap (16 int16 pairs per block and row, in the order of the weight
    codes: ``simd``'s docstring), off (-8 * sum of the 32 codes if sums, else 0: Q4_0's codes are
    nibble - 8), d and s as float32. Its callers pass nbytes, nibbles and sums as values (np.int64,
    np.bool_), never constants: numba compiles a function apart for each constant argument, and the
    runner's ``nodes_mm.mm_q32`` passes values, so one compiled form serves every dot (~0.3 s CPU of
    a compile)."""
    M, nb = act.shape[0], act.shape[1] // nbytes
    qa = view_as(act, np.int8)
    q0 = nbytes - 32
    ap = np.empty((nb, M, 16), np.int32)
    off = np.empty((nb, M), np.int32)       # np.empty, each element written below: np.zeros is
    da = np.empty((nb, M), np.float32)      # compiled apart (~0.2 s CPU of a first-ever run)
    sa = np.empty((nb, M), np.float32)
    for m in range(M):
        for b in range(nb):
            o = b * nbytes
            da[b, m] = f16[np.int64(act[m, o]) | (np.int64(act[m, o + 1]) << 8)]
            if nbytes == 36:
                sa[b, m] = f16[np.int64(act[m, o + 2]) | (np.int64(act[m, o + 3]) << 8)]
            else:
                sa[b, m] = 0.0
            t = 0
            if sums:
                for k in range(QK):
                    t += np.int32(qa[m, o + q0 + k])
            off[b, m] = -8 * t
            for p in range(16):
                x = 4 * (p // 4) + (p % 4) // 2 + 16 * (p % 2) if nibbles else 4 * (p // 2) + p % 2
                ap[b, m, p] = (np.int32(qa[m, o + q0 + x]) & 0xFFFF) | (np.int32(qa[m, o + q0 + x + 2]) << 16)
    return ap, off, da, sa


# The dots of the three tiles (one each, so that a type compiles only its own tile): the activations
# prepared (``_act_pairs``, compiled once for every 32-value type and called from compiled code),
# then per group of GROUP weight rows and block, ``simd``'s tile for MT activation rows at a time,
# into acc (M, GROUP). The tile loop is in the dot itself: a driver of its own, called from a
# compiled dot, would be compiled twice, once alone and once into the dot (~1 s a type of a
# first-ever run), and a driver called from Python would cost each call a second dispatch.
@njit
def _dot_q4_0(qs, d, n, nb, act, f16, out):
    ap, off, da, _ = _act_pairs(act, f16, np.int64(Q8_0_BYTES), np.bool_(True), np.bool_(True))
    M, G = ap.shape[1], (n + GROUP - 1) // GROUP
    acc = np.empty((M, GROUP), np.float32)
    for g in range(G):
        acc[:, :] = 0
        for b in range(nb):
            wo = (g * nb + b) * GROUP
            for m0 in range(0, M, simd.MT):
                so = b * M + m0
                simd.tile_q4_0(qs, wo * 16, d, d, wo, ap, so * 16, off, da, da, so, acc, m0 * GROUP, min(simd.MT, M - m0))
        store_group(acc, out, g, n)


@njit
def _dot_q8_0(qs, d, n, nb, act, f16, out):
    ap, off, da, _ = _act_pairs(act, f16, np.int64(Q8_0_BYTES), np.bool_(False), np.bool_(False))
    M, G = ap.shape[1], (n + GROUP - 1) // GROUP
    acc = np.empty((M, GROUP), np.float32)
    for g in range(G):
        acc[:, :] = 0
        for b in range(nb):
            wo = (g * nb + b) * GROUP
            for m0 in range(0, M, simd.MT):
                so = b * M + m0
                simd.tile_q8_0(qs, wo * QK, d, d, wo, ap, so * 16, off, da, da, so, acc, m0 * GROUP, min(simd.MT, M - m0))
        store_group(acc, out, g, n)


@njit
def _dot_q8_1(qs, d, mn, n, nb, act, f16, out):
    """GGML's scalar vec_dot_q4_1_q8_1 / q5_1: out += (d_w * d_a) * sumi + m_w * s_a per block."""
    ap, off, da, sa = _act_pairs(act, f16, np.int64(36), np.bool_(False), np.bool_(False))
    M, G = ap.shape[1], (n + GROUP - 1) // GROUP
    acc = np.empty((M, GROUP), np.float32)
    for g in range(G):
        acc[:, :] = 0
        for b in range(nb):
            wo = (g * nb + b) * GROUP
            for m0 in range(0, M, simd.MT):
                so = b * M + m0
                simd.tile_q8_1(qs, wo * QK, d, mn, wo, ap, so * 16, off, da, sa, so, acc, m0 * GROUP, min(simd.MT, M - m0))
        store_group(acc, out, g, n)


@njit
def _dot_levels(qs, d, n, nb, act, f16, out):
    """Rows of int8 levels (``pack_levels``) x Q8_0: out += (d_w * d_a) * float(sumi) per block, the
    order of GGML's generic IQ4_NL and MXFP4 dots (ggml_vec_dot_iq4_nl_q8_0_generic, _mxfp4_)."""
    ap, off, da, _ = _act_pairs(act, f16, np.int64(Q8_0_BYTES), np.bool_(False), np.bool_(False))
    M, G = ap.shape[1], (n + GROUP - 1) // GROUP
    acc = np.empty((M, GROUP), np.float32)
    for g in range(G):
        acc[:, :] = 0
        for b in range(nb):
            wo = (g * nb + b) * GROUP
            for m0 in range(0, M, simd.MT):
                so = b * M + m0
                simd.tile_levels(qs, wo * QK, d, d, wo, ap, so * 16, off, da, da, so, acc, m0 * GROUP, min(simd.MT, M - m0))
        store_group(acc, out, g, n)


def pack_levels(w: np.ndarray, decoder, nbytes: int) -> tuple:
    """Rows of a 32-value type whose values are int8 levels times a scale per block (``ggtool.qtypes``'
    IQ4_NL, MXFP4) -> (qs, d, n, nb) in Q8_0's packed form, for ``dot_levels``. decoder(rows) gives
    (levels int8 (k, nb, 32) in value order, d (k, nb): fp16 bits as uint16, or float32)."""
    w = np.ascontiguousarray(w)
    n, nb = w.shape[0], w.shape[1] // nbytes
    G = (n + GROUP - 1) // GROUP
    qs = np.zeros((G, nb, GROUP // simd.L, 8, simd.L, 4), np.int8)
    d = None
    for r0 in range(0, max(n, 1), PACK_ROWS):
        rows = w[r0:r0 + PACK_ROWS]
        codes, dd = decoder(rows)
        if d is None:
            d = np.zeros((G, nb, GROUP), dd.dtype)
        k = rows.shape[0]
        g0, gs = r0 // GROUP, -(-k // GROUP)
        pad = gs * GROUP - k
        if pad:
            codes, dd = (np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)]) for x in (codes, dd))
        interleave_into(qs, g0, codes.reshape(-1, nb, 8, 4))
        d[g0:g0 + gs] = dd.reshape(gs, GROUP, nb).transpose(0, 2, 1)
    return qs.reshape(-1), d.reshape(-1), n, nb


def dot_levels(packed: tuple, act: np.ndarray, out: np.ndarray) -> None:
    """out (M, n) = rows packed by ``pack_levels`` . Q8_0 rows act (uint8 (M, row bytes))."""
    _dot_levels(*packed, np.ascontiguousarray(act), F16_TO_F32, out)


# -- the 32-value forms: every classic type's block starts with its fp16 d (and, with a min, its fp16 m) --
register_form("nibbles", lambda w, decode_rows, nbytes: _pack_32(w, decode_rows, nbytes, 4, False, True), _dot_q4_0)
register_form("int8", lambda w, decode_rows, nbytes: _pack_32(w, decode_rows, nbytes, 8, False, False), _dot_q8_0)
register_form("int8_min", lambda w, decode_rows, nbytes: _pack_32(w, decode_rows, nbytes, 8, True, False), _dot_q8_1)
