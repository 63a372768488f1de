"""Vector tiles of the quantized dot products, written as portable LLVM vector IR (numba
``@intrinsic``): the inner loops of ``dot`` and ``dot_k``.

Why not plain numba loops: the integer block dot wants one instruction per pair of products
(x86 ``pmaddwd``, and ``vpdpwssd`` where AVX512-VNNI / AVX-VNNI add the accumulator too), and a
register tile of several activation rows sharing each decoded weight vector. LLVM's loop vectoriser
finds ``pmaddwd`` in a simple one-row loop but loses it (falling back to 64-bit lanes) as soon as a
loop body updates more than one accumulator, and it cannot keep accumulators in registers across
the k loop. So the tile is spelled out here with LLVM's generic vector types (``<32 x i16>``,
``<16 x i32>``, ``<16 x float>``): the same IR compiles on any CPU numba targets (AVX2 machines get
two 256-bit halves; no target intrinsics are used), and the x86 backend turns the canonical pattern
``sext, mul, add(even lanes, odd lanes)`` into ``pmaddwd`` (then ``+ acc`` into ``vpdpwssd``).

Every tile covers ``GROUP`` weight rows (``GROUP // L`` vectors of ``L`` rows) of one block and
``mt`` (1..``MT``) activation rows: ``MT`` in one unrolled body, fewer a row at a time (``switch_rows``).

Layout the tiles read (the packers in ``dot`` / ``dot_k`` write it): the weight codes of one block
and row group in chunks of L rows, each chunk's quads one after another:
``q[((chunk * quads + quad) * L + r % L) * 4 + t]`` = byte ``t`` of quad ``quad`` of row ``r``
(chunk = r // L), so one 64-byte load holds 4 bytes of each of 16 rows, viewed as 32 words, and a
tile reads its weights front to back (a layout with whole-group quads strided 512 bytes apart ran
at half speed once the weights no longer fit in the cache). The activations are
prepared as pairs: one int32 = two int16 values ``a_x | a_y << 16``, the pair each word pair of a
decoded weight vector is multiplied with.

- Nibbles (Q4_0: 16 bytes per row and block, 4 quads): word ``w`` holds bytes ``4jq + t, 4jq + t + 1``
  (t = 0 or 2 for the two words of a lane); ``w & 15``, ``(w >> 4) & 15``, ``(w >> 8) & 15`` and
  ``w >> 12`` are the codes of values ``(4jq, 4jq+2)``, ``(16+4jq, 16+4jq+2)``, ``(4jq+1, 4jq+3)`` and
  ``(17+4jq, 17+4jq+2)`` of the block (the low nibble of byte j is value j, the high one j + 16):
  pair ``p = 4jq + k`` of a row and block is activations ``(x, x + 2)``, ``x = 4jq + k//2 + 16(k%2)``.
- int8 codes (Q8_0, Q5_0, Q4_1, Q5_1: 32 per row and block, 8 quads; K-quants: 256, 64 quads):
  the sign-extended low and high bytes of the words are the codes of values ``(4q, 4q+2)`` and
  ``(4q+1, 4q+3)``: pair ``p = 2q + k`` is activations ``(4q + k, 4q + k + 2)``.

Numerics: the integer sums are exact (no product or pair sum can leave int32: codes fit in 6 bits
with a sign, activations in int8, K-quant sub-block scales in int8), and the float epilogue is the
scalar kernels' own, operation for operation: no fast-math flags, so LLVM neither reorders nor fuses.

The tiles are compiled into the numba functions that call them (``dot``, ``dot_k``), and numba's
cache checks those against their own source files only: so ``jit.cache_dir()`` names its folder
after a digest of this module, and an edit here gets a fresh cache.
"""

from __future__ import annotations

from llvmlite import ir

from .jit import numba  # first: jit sets numba's cache directory before numba is imported

types = numba.types
cgutils = numba.core.cgutils
intrinsic = numba.core.extending.intrinsic

GROUP = 128   # weight rows per interleaved group (dot.GROUP)
L = 16        # weight rows per vector: int32 lanes
MT = 4        # activation rows per register tile (4 measured best on AVX-512; 6 and 8 no faster)

_I16, _I32, _I64, _F32 = ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
_W = ir.VectorType(_I16, 2 * L)          # 16 rows x 2 words
_D = ir.VectorType(_I32, L)
_F = ir.VectorType(_F32, L)
_H = ir.VectorType(_I16, L)                # 16 fp16 scales as their bits
_HF = ir.VectorType(ir.HalfType(), L)
_EVEN = ir.Constant(ir.VectorType(_I32, L), list(range(0, 2 * L, 2)))
_ODD = ir.Constant(ir.VectorType(_I32, L), list(range(1, 2 * L, 2)))


def _c(v, t=_I64):
    return ir.Constant(t, v)


def splat(b, val, n):
    vt = ir.VectorType(val.type, n)
    v = b.insert_element(ir.Constant(vt, None), val, _c(0, _I32))
    return b.shuffle_vector(v, ir.Constant(vt, None), ir.Constant(ir.VectorType(_I32, n), [0] * n))


def _wsplat(b, v):
    return splat(b, ir.Constant(_I16, v), 2 * L)


def madd(b, acc, x, pair):
    """acc + (x . splat(pair)) word pair by word pair: x <32 x i16>, pair an i32 of two i16."""
    a = b.bitcast(splat(b, pair, L), _W)
    wide = ir.VectorType(_I32, 2 * L)
    p = b.mul(b.sext(x, wide), b.sext(a, wide), flags=["nsw"])
    e = b.shuffle_vector(p, ir.Constant(wide, None), _EVEN)
    o = b.shuffle_vector(p, ir.Constant(wide, None), _ODD)
    return b.add(acc, b.add(e, o))


class _Args:
    """The intrinsic's arguments as element pointers: arrays (C-contiguous) at their offsets."""

    def __init__(self, context, builder, sig, args, names):
        self.b = builder
        self.p = {}
        for name, ty, val in zip(names, sig.args, args):
            if isinstance(ty, types.Array):
                self.p[name] = context.make_array(ty)(context, builder, val).data
            else:
                self.p[name] = val

    def at(self, name, off):
        """Pointer to element `off` (i64) of array `name`."""
        return self.b.gep(self.p[name], [off])

    def load(self, name, off, vt=None, align=1):
        ptr = self.at(name, off)
        if vt is not None:
            ptr = self.b.bitcast(ptr, vt.as_pointer())
        return self.b.load(ptr, align=align)

    def load_scales(self, name, off, half: bool):
        """L float32 scales of array `name` at `off`: float32 as they are, or fp16 bits (uint16)
        widened exactly (x86's vcvtph2ps where the CPU has F16C), the same values as the
        table F16_TO_F32 gives."""
        if not half:
            return self.load(name, off, _F, align=4)
        return self.b.fpext(self.b.bitcast(self.load(name, off, _H, align=2), _HF), _F)

    def store(self, name, off, val, align=4):
        ptr = self.b.bitcast(self.at(name, off), val.type.as_pointer())
        self.b.store(val, ptr, align=align)


def switch_rows(builder, mt, body):
    """body(m_rows, i0) for the activation rows i0 .. i0 + m_rows - 1 (i0 an i64): mt = MT rows
    unrolled at once, one row (a decode step's) in a body of its own with i0 a constant, and 2 to
    MT - 1 rows (a batch's last) a row at a time in a loop. Three bodies, not one unrolled body for
    each count: those made a tile's compile ~1.3x as long (Q6_K's dot: ~0.7 s CPU of a first-ever
    run on an AVX2 host). Each activation row's sums are its own, so the bits are the same either
    way; only the last 2 or 3 rows of a batch decode the weights once a row."""
    end = builder.append_basic_block("mt.end")
    full, one, rows = (builder.append_basic_block(f"mt.{k}") for k in ("full", "one", "rows"))
    sw = builder.switch(mt, rows)
    sw.add_case(_c(MT, mt.type), full)
    sw.add_case(_c(1, mt.type), one)
    builder.position_at_end(full)
    body(MT, _c(0))
    builder.branch(end)
    builder.position_at_end(one)
    body(1, _c(0))
    builder.branch(end)
    builder.position_at_end(rows)
    with cgutils.for_range(builder, builder.sext(mt, _I64) if mt.type.width < 64 else mt) as loop:
        body(1, loop.index)
    builder.branch(end)
    builder.position_at_end(end)


def _check(sig_args, names):
    for name, ty in zip(names, sig_args):
        if isinstance(ty, types.Array) and ty.layout != "C":
            raise TypeError(f"simd tile: {name} must be C-contiguous")


_NAMES_32 = ("qs", "qo", "d", "mn", "wo", "ap", "po", "off", "da", "sa", "so", "acc", "ao", "mt")


def _tile_32(nibbles: bool, q1: bool, dd: bool = False):
    """One block (32 values) of GROUP weight rows x mt activation rows, added into acc.

    Arguments (arrays flat; offsets in elements): qs (codes, the block's quads at qo), d and mn
    (the rows' scale and min at wo: float32, or fp16 bits as uint16, widened in the tile), ap (mt x
    16 pairs at po, 16 per activation row), off (int32: each activation row's start of sumi, at so),
    da and sa (float32 per activation row at so), acc (float32, mt rows of GROUP at ao) and mt. Per row r and activation row i:
    ``acc += (float(sumi) * d) * da`` (Q4_0, Q8_0, Q5_0), or with q1
    ``acc += (d * da) * float(sumi) + mn * sa`` (Q4_1, Q5_1), or with dd
    ``acc += (d * da) * float(sumi)`` (IQ4_NL, MXFP4: GGML's generic dots of ``ggtool.qtypes``)."""

    def codegen(context, builder, sig, args):
        A = _Args(context, builder, sig, args, _NAMES_32)
        qo, wo, po, so, ao = (A.p[k] for k in ("qo", "wo", "po", "so", "ao"))
        quads = 4 if nibbles else 8
        half = sig.args[_NAMES_32.index("d")].dtype == types.uint16

        def body(mt, i0):
            b = builder
            so_, po_, ao_ = b.add(so, i0), b.add(po, b.mul(i0, _c(16))), b.add(ao, b.mul(i0, _c(GROUP)))
            offs = [b.load(A.at("off", b.add(so_, _c(i)))) for i in range(mt)]
            das = [b.load(A.at("da", b.add(so_, _c(i)))) for i in range(mt)]
            sas = [b.load(A.at("sa", b.add(so_, _c(i)))) for i in range(mt)] if q1 else []
            with cgutils.for_range(b, _c(GROUP // L)) as loop:
                c = loop.index
                r0 = b.mul(c, _c(L))
                accs = [splat(b, offs[i], L) for i in range(mt)]
                for q in range(quads):
                    v = A.load("qs", b.add(qo, b.mul(b.add(b.mul(c, _c(quads)), _c(q)), _c(4 * L))), _W)
                    if nibbles:
                        xs = [b.and_(v, _wsplat(b, 15)), b.and_(b.lshr(v, _wsplat(b, 4)), _wsplat(b, 15)),
                              b.and_(b.lshr(v, _wsplat(b, 8)), _wsplat(b, 15)), b.lshr(v, _wsplat(b, 12))]
                    else:
                        xs = [b.ashr(b.shl(v, _wsplat(b, 8)), _wsplat(b, 8)), b.ashr(v, _wsplat(b, 8))]
                    for i in range(mt):
                        for k, x in enumerate(xs):
                            pair = A.load("ap", b.add(po_, _c(i * 16 + q * len(xs) + k)))
                            accs[i] = madd(b, accs[i], x, pair)
                dv = A.load_scales("d", b.add(wo, r0), half)
                mv = A.load_scales("mn", b.add(wo, r0), half) if q1 else None
                for i in range(mt):
                    f = b.sitofp(accs[i], _F)
                    if q1:
                        t = b.fadd(b.fmul(b.fmul(dv, splat(b, das[i], L)), f), b.fmul(mv, splat(b, sas[i], L)))
                    elif dd:
                        t = b.fmul(b.fmul(dv, splat(b, das[i], L)), f)
                    else:
                        t = b.fmul(b.fmul(f, dv), splat(b, das[i], L))
                    o = b.add(b.add(ao_, _c(i * GROUP)), r0)
                    A.store("acc", o, b.fadd(A.load("acc", o, _F, align=4), t))

        switch_rows(builder, A.p["mt"], body)
        return context.get_dummy_value()

    @intrinsic
    def tile(typingctx, qs, qo, d, mn, wo, ap, po, off, da, sa, so, acc, ao, mt):
        sig = types.void(qs, qo, d, mn, wo, ap, po, off, da, sa, so, acc, ao, mt)
        _check(sig.args, _NAMES_32)
        return sig, codegen

    return tile


tile_q4_0 = _tile_32(nibbles=True, q1=False)     # Q4_0 x Q8_0
tile_q8_0 = _tile_32(nibbles=False, q1=False)    # Q8_0, Q5_0 x Q8_0
tile_q8_1 = _tile_32(nibbles=False, q1=True)     # Q4_1, Q5_1 x Q8_1
tile_levels = _tile_32(nibbles=False, q1=False, dd=True)   # int8 levels (IQ4_NL, MXFP4) x Q8_0


_NAMES_K = ("codes", "co", "sc", "mp", "sco", "d", "dmin", "wo", "ap", "po", "bp", "bo", "da", "so",
            "acc", "ao", "mt", "hm")
_B16 = ir.VectorType(ir.IntType(8), L)           # 16 int8 scales, one per row of a vector
_B32 = ir.VectorType(ir.IntType(8), 2 * L)       # 16 rows x 2 int8 mins


def _tile_k_codegen(context, builder, sig, args):
    A = _Args(context, builder, sig, args, _NAMES_K)
    co, sco, wo, po, bo, so, ao = (A.p[k] for k in ("co", "sco", "wo", "po", "bo", "so", "ao"))
    has_mins = builder.icmp_signed("!=", A.p["hm"], ir.Constant(A.p["hm"].type, 0))

    def body(mt, i0):
        b = builder
        so_, po_, bo_ = b.add(so, i0), b.add(po, b.mul(i0, _c(128))), b.add(bo, b.mul(i0, _c(8)))
        ao_ = b.add(ao, b.mul(i0, _c(GROUP)))
        das = [b.load(A.at("da", b.add(so_, _c(i)))) for i in range(mt)]
        zero = ir.Constant(_D, None)
        with cgutils.for_range(b, _c(GROUP // L)) as loop:
            c = loop.index
            r0 = b.mul(c, _c(L))
            sumi = [cgutils.alloca_once_value(b, zero) for _ in range(mt)]
            with cgutils.for_range(b, _c(16)) as sub:          # sub-blocks of 16 values
                j = sub.index
                ts = [zero] * mt
                for qq in range(4):
                    quad = b.add(b.mul(j, _c(4)), _c(qq))
                    v = A.load("codes", b.add(co, b.mul(b.add(b.mul(c, _c(64)), quad), _c(4 * L))), _W)
                    xs = [b.ashr(b.shl(v, _wsplat(b, 8)), _wsplat(b, 8)), b.ashr(v, _wsplat(b, 8))]
                    for i in range(mt):
                        for k, x in enumerate(xs):
                            pair = A.load("ap", b.add(po_, b.add(_c(i * 128 + k), b.mul(quad, _c(2)))))
                            ts[i] = madd(b, ts[i], x, pair)
                scv = b.sext(A.load("sc", b.add(sco, b.mul(b.add(b.mul(c, _c(16)), j), _c(L))), _B16), _D)
                for i in range(mt):
                    b.store(b.add(b.load(sumi[i]), b.mul(scv, ts[i])), sumi[i])
            dv = A.load("d", b.add(wo, r0), _F, align=4)
            os_ = [b.add(b.add(ao_, _c(i * GROUP)), r0) for i in range(mt)]
            for i in range(mt):
                a = A.load("acc", os_[i], _F, align=4)
                A.store("acc", os_[i], b.fadd(a, b.fmul(b.fmul(dv, splat(b, das[i], L)), b.sitofp(b.load(sumi[i]), _F))))
            with b.if_then(has_mins):                         # mins x bsums, two sub-blocks a pair
                summ = [zero] * mt
                for jp in range(8):
                    mv = b.sext(A.load("mp", b.add(sco, b.mul(b.add(b.mul(c, _c(8)), _c(jp)), _c(2 * L))), _B32), _W)
                    for i in range(mt):
                        summ[i] = madd(b, summ[i], mv, A.load("bp", b.add(bo_, _c(i * 8 + jp))))
                dmv = A.load("dmin", b.add(wo, r0), _F, align=4)
                for i in range(mt):
                    a = A.load("acc", os_[i], _F, align=4)
                    A.store("acc", os_[i], b.fsub(a, b.fmul(b.fmul(dmv, splat(b, das[i], L)), b.sitofp(summ[i], _F))))

    switch_rows(builder, A.p["mt"], body)
    return context.get_dummy_value()


@intrinsic
def tile_k(typingctx, codes, co, sc, mp, sco, d, dmin, wo, ap, po, bp, bo, da, so, acc, ao, mt, hm):
    """One K-quant block (256 values) of GROUP weight rows x mt activation rows, added into acc.

    codes (int8 quads at co), sc (int8 sub-block scales, [16][GROUP] at sco), mp (int8 mins in
    pairs of sub-blocks, [8][GROUP][2] at sco; read only where hm, the type has mins), d / dmin
    (float32 per row at wo; dmin read only where hm), ap (mt x 128 pairs at po), bp (mt x 8 pairs
    of the activation's 16 bsums at bo), da (float32 at so), acc (mt rows of GROUP at ao), mt.
    ``sumi = sum_j sc_j * (codes_j . a_j)``, ``acc += (d * da) * float(sumi)``; where hm, then
    ``summ = sum_j m_j * bsums_j`` and ``acc -= (dmin * da) * float(summ)``."""
    sig = types.void(codes, co, sc, mp, sco, d, dmin, wo, ap, po, bp, bo, da, so, acc, ao, mt, hm)
    _check(sig.args, _NAMES_K)
    return sig, _tile_k_codegen


_NAMES_K6 = ("codes", "co", "hi", "ho", "sc", "sco", "d", "wo", "ap", "po", "da", "so", "acc", "ao", "mt")
_PAIRS = ir.Constant(ir.VectorType(_I32, 2 * L), [i // 2 for i in range(2 * L)])   # each row's word, twice


def _tile_k6_codegen(context, builder, sig, args):
    A = _Args(context, builder, sig, args, _NAMES_K6)
    co, ho, sco, wo, po, so, ao = (A.p[k] for k in ("co", "ho", "sco", "wo", "po", "so", "ao"))

    def body(mt, i0):
        b = builder
        so_, po_, ao_ = b.add(so, i0), b.add(po, b.mul(i0, _c(128))), b.add(ao, b.mul(i0, _c(GROUP)))
        das = [b.load(A.at("da", b.add(so_, _c(i)))) for i in range(mt)]
        zero = ir.Constant(_D, None)
        with cgutils.for_range(b, _c(GROUP // L)) as loop:
            c = loop.index
            r0 = b.mul(c, _c(L))
            sumi = [cgutils.alloca_once_value(b, zero) for _ in range(mt)]
            with cgutils.for_range(b, _c(8)) as pbl:           # pairs of sub-blocks (32 values)
                pb = pbl.index
                ts = [[zero] * mt, [zero] * mt]                # the pair's first and second sub-block
                for jq in range(4):
                    quad = b.add(b.add(b.mul(c, _c(32)), b.mul(pb, _c(4))), _c(jq))
                    v = A.load("codes", b.add(co, b.mul(quad, _c(4 * L))), _W)
                    h = A.load("hi", b.add(ho, b.mul(quad, _c(L))), _H, align=2)
                    hw = b.shuffle_vector(h, ir.Constant(_H, None), _PAIRS)
                    nibs = [b.and_(v, _wsplat(b, 15)), b.and_(b.lshr(v, _wsplat(b, 4)), _wsplat(b, 15)),
                            b.and_(b.lshr(v, _wsplat(b, 8)), _wsplat(b, 15)), b.lshr(v, _wsplat(b, 12))]
                    for k, nib in enumerate(nibs):
                        shifts = ir.Constant(_W, [4 * k + 2 * (i % 2) for i in range(2 * L)])
                        top = b.shl(b.and_(b.lshr(hw, shifts), _wsplat(b, 3)), _wsplat(b, 4))
                        x = b.sub(b.or_(nib, top), _wsplat(b, 32))
                        for i in range(mt):
                            pair = A.load("ap", b.add(po_, b.add(_c(i * 128 + jq * 4 + k), b.mul(pb, _c(16)))))
                            ts[k % 2][i] = madd(b, ts[k % 2][i], x, pair)
                for half in range(2):
                    j = b.add(b.mul(pb, _c(2)), _c(half))
                    scv = b.sext(A.load("sc", b.add(sco, b.mul(b.add(b.mul(c, _c(16)), j), _c(L))), _B16), _D)
                    for i in range(mt):
                        b.store(b.add(b.load(sumi[i]), b.mul(scv, ts[half][i])), sumi[i])
            dv = A.load("d", b.add(wo, r0), _F, align=4)
            for i in range(mt):
                o = b.add(b.add(ao_, _c(i * GROUP)), r0)
                a = A.load("acc", o, _F, align=4)
                A.store("acc", o, b.fadd(a, b.fmul(b.fmul(dv, splat(b, das[i], L)), b.sitofp(b.load(sumi[i]), _F))))

    switch_rows(builder, A.p["mt"], body)
    return context.get_dummy_value()


@intrinsic
def tile_k6(typingctx, codes, co, hi, ho, sc, sco, d, wo, ap, po, da, so, acc, ao, mt):
    """One block (256 values) of a K-quant type without mins whose codes fit 6 bits (Q6_K, Q3_K), of
    GROUP weight rows x mt activation rows, added into acc; the codes stored in 6 bits, as Q6_K
    stores them: the low 4 bits as nibbles, Q4_0's way (a byte holds value j of a pair of
    sub-blocks and value j + 16, quads of 4 bytes: codes at co, [chunk][32 quads][L][4]), the top 2
    bits in one 16-bit word per row and quad (hi at ho, [chunk][32][L]: bits 4k and 4k + 2 go with
    the low and high word of the nibbles' k-th pair). Code minus 32 is the value's integer.
    sc (int8 per 16 values, [16][GROUP] at sco), d (float32 per row at wo), ap (mt x 128 pairs at
    po, in the nibbles' order: pair 16 * pb + 4 * quad + k is values (x, x + 2) of pair-block pb,
    x = 4 * quad + k // 2 + 16 * (k % 2)), da (float32 at so), acc (mt rows of GROUP at ao), mt.
    ``sumi = sum_j sc_j * (codes_j . a_j)``, ``acc += (d * da) * float(sumi)``, as ``tile_k``."""
    sig = types.void(codes, co, hi, ho, sc, sco, d, wo, ap, po, da, so, acc, ao, mt)
    _check(sig.args, _NAMES_K6)
    return sig, _tile_k6_codegen
