"""K-quant dot products: Q2_K, Q3_K, Q4_K, Q5_K and Q6_K weights x Q8_K activations.

The K-quant types with mins (Q2_K, Q4_K, Q5_K) are repacked into one form, "k" (in numpy, from
their records' ``decode_rows``: nothing to compile): per block of 256, int8 codes (the stored integer, offset
applied: Q2_K 0..3, Q4_K 0..15, Q5_K 0..31), an int8 scale and min per 16 values, and float32 d
and dmin, interleaved across rows as ``dot``'s types are (``simd``'s layout; 1.16 bytes a value for
Q4_K, where int32 scales and int16 mins took 1.39: a decode step streams the weights, so the
bytes are the time). Then one dot, ``simd.tile_k``, serves them (GGML's generic
``ggml_vec_dot_qN_K_q8_K``, integer parts exact): ``sumi = sum_j sc_j * (codes_j . a_j)``,
``summ = sum_j m_j * bsums_j``, then ``out += (d_w * d_a) * sumi`` and ``out -= (dmin_w * d_a) *
summ``, block after block. Q6_K and Q3_K have no mins and codes within -32..31: they are packed
in 6 bits, as Q6_K stores them ("k6", ``_pack_k6``: 0.81 bytes a value), for ``simd.tile_k6``, which
adds only the ``sumi`` part. (GGML sums
the scaled parts in 8 float lanes: the last bits may differ; the order never depends on the split
between participants.) A K-quant record names its form (``packed_form``) and decodes its blocks.
"""

from __future__ import annotations

import numpy as np

from . import simd
from .dot_base import GROUP, interleave_into, register_form, store_group
from .jit import njit
from .native import view_as

Q8_K_BYTES = 292


PACK_ROWS = 8 * GROUP      # weight rows decoded at a time while packing (bounds the temporaries)


def _pack_k(w: np.ndarray, decoder, nbytes: int, mins: bool):
    """K-quant rows -> (codes, sc, mn, d, dmin, n, nb, hm): the decoded block (``decode``) laid out per
    group of GROUP rows and block (gb = g * nb + b), in chunks of L rows (``simd``): codes in quads
    [gb][chunk][64][L][4] (int8), scales [gb][chunk][16][L] (int8), mins in pairs of sub-blocks
    [gb][chunk][8][L][2] (int8; none where the type has no mins, hm = 0), d and dmin per
    [gb][row] (float32). Rows past n are zeros."""
    n, nb = w.shape[0], w.shape[1] // nbytes
    G, C, L = (n + GROUP - 1) // GROUP, GROUP // simd.L, simd.L
    codes = np.zeros((G, nb, C, 64, L, 4), np.int8)
    sc = np.zeros((G, nb, C, 16, L), np.int8)
    mn = np.zeros((G, nb, C, 8, L, 2) if mins else (0,), np.int8)
    dw = np.zeros((G, nb, GROUP), np.float32)
    dmw = np.zeros((G, nb, GROUP) if mins else (0,), np.float32)
    for r0 in range(0, n, PACK_ROWS):
        rows = w[r0:r0 + PACK_ROWS]
        k = rows.shape[0]
        g0, gs = r0 // GROUP, -(-k // GROUP)
        pad = gs * GROUP - k
        q, s, m, d, dmin = (np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)]) if pad else x
                            for x in decoder(rows))
        interleave_into(codes, g0, q.reshape(-1, nb, 64, 4))
        interleave_into(sc, g0, s)
        dw[g0:g0 + gs] = d.reshape(gs, GROUP, nb).transpose(0, 2, 1)
        if mins:
            interleave_into(mn, g0, m.reshape(-1, nb, 8, 2))
            dmw[g0:g0 + gs] = dmin.reshape(gs, GROUP, nb).transpose(0, 2, 1)
    return codes.reshape(-1), sc.reshape(-1), mn.reshape(-1), dw.reshape(-1), dmw.reshape(-1), n, nb, int(mins)


@njit
def _scale_min_k4(q, o, j):
    """ggml's get_scale_min_k4: 6-bit scale and min of sub-block j from the 12 bytes at q[o:]
    (``x86``'s Q4_K decoder)."""
    if j < 4:
        return np.int32(q[o + j]) & 63, np.int32(q[o + j + 4]) & 63
    sc = (np.int32(q[o + j + 4]) & 15) | ((np.int32(q[o + j - 4]) >> 6) << 4)
    m = (np.int32(q[o + j + 4]) >> 4) | ((np.int32(q[o + j]) >> 6) << 4)
    return sc, m


@njit
def _act_pairs_k(act, nibbles):
    """Q8_K activation rows as ``simd.tile_k`` (or, with nibbles, ``simd.tile_k6``) reads them,
    indexed [block, row]: ap (128 int16 pairs of the 256 codes, in the order of the weight codes),
    bp (the 16 bsums in 8 pairs), d (float32). `nibbles` is passed as a value (np.bool_), never a
    constant, which numba would compile a form apart for (``dot._act_pairs``)."""
    M, nb = act.shape[0], act.shape[1] // Q8_K_BYTES
    qa = view_as(act, np.int8)
    ap = np.empty((nb, M, 128), np.int32)
    bp = np.empty((nb, M, 8), np.int32)
    du = np.empty((nb, M), np.uint32)      # d's bits (little-endian float32), seen as float32 below:
    for m in range(M):                      # numba compiles ``.view`` apart (~0.3 s CPU), view_as costs nothing
        for b in range(nb):
            o = b * Q8_K_BYTES
            du[b, m] = (np.uint32(act[m, o]) | (np.uint32(act[m, o + 1]) << 8) | (np.uint32(act[m, o + 2]) << 16)
                        | (np.uint32(act[m, o + 3]) << 24))
            for p in range(128):
                if nibbles:    # pair-block p // 16, quad (p % 16) // 4, nibble k = p % 4
                    x = o + 4 + 32 * (p // 16) + 4 * ((p % 16) // 4) + (p % 4) // 2 + 16 * (p % 2)
                else:
                    x = o + 4 + 4 * (p // 2) + p % 2
                ap[b, m, p] = (np.int32(qa[m, x]) & 0xFFFF) | (np.int32(qa[m, x + 2]) << 16)
            for p in range(8):
                x = o + 260 + 4 * p          # bsums 2p and 2p + 1: two little-endian int16, one int32
                lo = np.int32(act[m, x]) | (np.int32(act[m, x + 1]) << 8)
                hi = np.int32(act[m, x + 2]) | (np.int32(act[m, x + 3]) << 8)
                bp[b, m, p] = lo | (hi << 16)
    return ap, bp, view_as(du, np.float32)


@njit
def _dot_k(codes, sc, mn, dw, dmw, n, nb, hm, act, f16, out):
    M = act.shape[0]
    G = (n + GROUP - 1) // GROUP
    ap, bp, da = _act_pairs_k(act, np.bool_(False))
    acc = np.empty((M, GROUP), np.float32)
    for g in range(G):
        acc[:, :] = 0
        for b in range(nb):
            gb = g * nb + b
            for m0 in range(0, M, simd.MT):
                so = b * M + m0
                simd.tile_k(codes, gb * 256 * GROUP, sc, mn, gb * 16 * GROUP, dw, dmw, gb * GROUP, ap, so * 128,
                            bp, so * 8, da, so, acc, m0 * GROUP, min(simd.MT, M - m0), hm)
        store_group(acc, out, g, n)


@njit
def _dot_k6(codes, hi, sc, dw, n, nb, act, f16, out):
    """Q6_K / Q3_K packed in 6 bits (``_pack_k6``) x Q8_K rows: ``simd.tile_k6``."""
    M = act.shape[0]
    G = (n + GROUP - 1) // GROUP
    ap, _, da = _act_pairs_k(act, np.bool_(True))
    acc = np.empty((M, GROUP), np.float32)
    for g in range(G):
        acc[:, :] = 0
        for b in range(nb):
            gb = g * nb + b
            for m0 in range(0, M, simd.MT):
                so = b * M + m0
                simd.tile_k6(codes, gb * 128 * GROUP, hi, gb * 32 * GROUP, sc, gb * 16 * GROUP, dw, gb * GROUP,
                             ap, so * 128, da, so, acc, m0 * GROUP, min(simd.MT, M - m0))
        store_group(acc, out, g, n)


_LOW4 = np.uint64(0x0F0F0F0F0F0F0F0F)      # the low nibble of each byte of a word
_TOP2 = np.uint64(0x0303030303030303)      # bits 4-5 of each byte of a word, once shifted down by 4


def _pack_k6(w: np.ndarray, decoder, nbytes: int):
    """K-quant rows without mins whose codes fit -32..31 (Q6_K, Q3_K) -> (codes, hi, sc, d, n, nb):
    code + 32 in 6 bits as ``simd.tile_k6`` reads them (0.75 bytes a value: Q6_K's own size),
    int8 scales [gb][chunk][16][L], d per [gb][row] (float32); rows past n are zeros."""
    n, nb = w.shape[0], w.shape[1] // nbytes
    G, C, L = (n + GROUP - 1) // GROUP, GROUP // simd.L, simd.L
    codes = np.zeros((G, nb, C, 32, L, 4), np.uint8)
    hi = np.zeros((G, nb, C, 32, L), np.uint16)
    sc = np.zeros((G, nb, C, 16, L), np.int8)
    dw = np.zeros((G, nb, GROUP), np.float32)
    for r0 in range(0, n, PACK_ROWS):
        rows = w[r0:r0 + PACK_ROWS]
        k = rows.shape[0]
        g0, gs = r0 // GROUP, -(-k // GROUP)
        pad = gs * GROUP - k
        q, s, _, d, _ = (np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)]) if pad else x
                         for x in decoder(rows))
        # codes + 32 (6 bits), 8 at a time in a little-endian u64 (results made little-endian again before
        # their bytes are read, whatever the host): [row][block][pair-block][4 words]
        u = (q.view(np.uint8) + np.uint8(32)).reshape(-1, nb, 8, 32).view("<u8")
        # byte j of a pair-block: value j's low nibble | value j + 16's << 4
        nib = (((u[..., 2:] & _LOW4) << np.uint64(4)) | (u[..., :2] & _LOW4)).astype("<u8", copy=False)
        # the top 2 bits of value v = 16c + 4q + 2par + a go at bit 4(2a + c) + 2par of quad q's word
        # (tile_k6): as bytes [c][q][par][a], a u32 per (c, q) holds [par][a]; its two low bytes (par 0)
        # | its two high ones (par 1) << 2 is byte a of the word's bits 4c..
        t = ((u >> np.uint64(4)) & _TOP2).astype("<u8", copy=False).view("<u4").reshape(-1, nb, 8, 2, 4)
        t |= t >> np.uint32(14)
        words = ((t[..., 0, :] | (t[..., 1, :] << np.uint32(4))) & np.uint32(0xFFFF)).astype(np.uint16)
        interleave_into(codes, g0, nib.view(np.uint8).reshape(-1, nb, 32, 4))
        interleave_into(hi, g0, words.reshape(-1, nb, 32))
        interleave_into(sc, g0, s)
        dw[g0:g0 + gs] = d.reshape(gs, GROUP, nb).transpose(0, 2, 1)
    return codes.reshape(-1), hi.reshape(-1), sc.reshape(-1), dw.reshape(-1), n, nb


def pack_k_form(w: np.ndarray, decode_k, nbytes: int):
    """Rows of a type whose dot has the K-quants' form without mins (``ggtool.qtypes``' ``k_form``:
    IQ2_XXS .. IQ3_S), decoded by decode_k(rows) -> (codes int8 (n, nb, 256), scales (n, nb, 16),
    d float32 (n, nb)), in ``_pack_k``'s layout for ``_dot_k`` (hm = 0): the same integer sums and
    ``(d_w * d_a) * sumi`` block after block as the type's generic dot (its final factor apart)."""

    def decoder(rows):
        codes, scales, d = decode_k(rows)
        if scales.size and (scales.min() < -128 or scales.max() > 127):
            raise ValueError("a K-form scale does not fit int8")
        k = rows.shape[0]
        return codes, scales.astype(np.int8), np.zeros((k, 0), np.int8), d, np.zeros((k, 0), np.float32)

    return _pack_k(np.ascontiguousarray(w), decoder, nbytes, False)


def dot_packed_k(packed: tuple, act: np.ndarray, f16, out: np.ndarray) -> None:
    """out (M, n) = rows packed by ``pack_k_form`` (or a K-quant's ``_pack_k``) . Q8_K rows act."""
    _dot_k(*packed, np.ascontiguousarray(act), f16, out)


register_form("k", lambda w, decode_rows, nbytes: _pack_k(np.ascontiguousarray(w), decode_rows, nbytes, True), _dot_k)
register_form("k6", lambda w, decode_rows, nbytes: _pack_k6(np.ascontiguousarray(w), decode_rows, nbytes), _dot_k6)
