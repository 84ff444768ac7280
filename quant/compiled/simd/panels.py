"""Integer SIMD of the batched products (igemm.py): panels of 16 rows decoded into one
integer form, and the tile that multiplies a panel by 4 vectors of x rounded to integers.

The integer form of every quantized format, per row and sub-block s of 16 weights:
w = D_s c + M_s with c an unsigned byte code (q8_0's int8 codes + 128, with M = -128 D;
on AVX2 without VNNI q8_0 keeps its signed codes and M = 0, see `dot`). A panel's codes
are stored "transposed": for each sub-block, 4 runs of 64 bytes, run k holding bytes
4k..4k+3 of each of the 16 rows, so that one 64-byte dot product (vpdpbusd) with x's 4
bytes broadcast advances the 16 rows' sums at once, each in its own int32 lane; D and M
follow as 16 floats each per sub-block. A 16 x 16 transpose of 32-bit words (4 stages of
two-source shuffles) turns rows of codes into these runs.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from ..kinds import CODE_OF, K_FORMATS
from . import AVX2, VNNI
from .int8 import I8, I32, F32x16, I8x64, I32x16, dot_i8, dot_u8_add
from .kquants import DECODERS
from .scalar import prefetch_ir

I64 = ir.IntType(64)
F32 = ir.FloatType()
I32x4 = ir.VectorType(I32, 4)
# q8_0 keeps signed codes where the byte products saturate (vpmaddubsw pairs of 255 x 127)
SIGNED_Q8 = AVX2 and not VNNI


def const(n: int, t=I64):
    return ir.Constant(t, n)


def shuffle(builder, a, b, mask: list[int]):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, len(mask)), mask))


def splat(builder, value, vt):
    one = builder.insert_element(ir.Constant(vt, ir.Undefined), value, const(0, I32))
    return shuffle(builder, one, ir.Constant(vt, ir.Undefined), [0] * vt.count)


def transpose16(builder, rows: list) -> list:
    """16 vectors <16 x T> (rows) -> 16 vectors (columns): at each stage b = 8, 4, 2, 1,
    rows i and i + b swap the b x b blocks off the diagonal of their 2b x 2b block."""
    rows = list(rows)
    b = 8
    while b:
        for i in range(16):
            if i & b:
                continue
            j = i + b
            lo = [c if not c & b else 16 + c - b for c in range(16)]
            hi = [c + b if not c & b else 16 + c for c in range(16)]
            rows[i], rows[j] = (
                shuffle(builder, rows[i], rows[j], lo),
                shuffle(builder, rows[i], rows[j], hi),
            )
        b //= 2
    return rows


def array_ptr(context, builder, aty, a, offset):
    ary = context.make_array(aty)(context, builder, a)
    return builder.gep(ary.data, [offset])


def load(builder, ptr, vt):
    return builder.load(builder.bitcast(ptr, vt.as_pointer()), align=1)


def store(builder, value, ptr):
    builder.store(value, builder.bitcast(ptr, value.type.as_pointer()), align=1)


def accumulate(builder, n, step: int, count: int, body, name: str, vt=F32x16) -> list:
    """An LLVM loop `for i in range(0, n, step)` (i an i64) over `count` accumulators
    (<16 x float>, or vt) that start at zero: body(i, accs) returns their new values.
    Returns the accumulators after the loop (zeros when n <= 0)."""
    entry = builder.block
    loop = builder.append_basic_block(f"{name}.loop")
    done = builder.append_basic_block(f"{name}.done")
    zero = ir.Constant(vt, None)
    builder.cbranch(builder.icmp_signed(">", n, const(0)), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(I64)
    i.add_incoming(const(0), entry)
    accs = [builder.phi(vt) for _ in range(count)]
    for p in accs:
        p.add_incoming(zero, entry)
    new = body(i, accs)
    i1 = builder.add(i, const(step))
    latch = builder.block
    for p, v in zip(accs, new, strict=True):
        p.add_incoming(v, latch)
    i.add_incoming(i1, latch)
    builder.cbranch(builder.icmp_signed("<", i1, n), loop, done)
    builder.position_at_end(done)
    final = [builder.phi(vt) for _ in range(count)]
    for p, v in zip(final, new, strict=True):
        p.add_incoming(zero, entry)
        p.add_incoming(v, latch)
    return final


def guarded(builder, ok, ptr, safe, vt):
    """Load vt from ptr where ok, else zeros; the load reads `safe` instead (never faults)."""
    value = load(builder, builder.select(ok, ptr, safe), vt)
    return builder.select(ok, value, ir.Constant(vt, None))


def write_panel(builder, columns: list, dst, sub0, dms: list, dm, fill):
    """Store 16 transposed code vectors (<16 x i32>: column c is sub-block sub0 + c // 4,
    run c % 4) and, per sub-block sub0 + k of `dms`, D and M (<16 x float> each); `fill`
    the value added to every code byte (128: q8_0's signed codes made unsigned)."""
    for c, col in enumerate(columns):
        if fill:
            col = builder.xor(col, ir.Constant(I32x16, [0x80808080] * 16))
        at = builder.mul(builder.add(sub0, const(c // 4)), const(256))
        store(builder, col, builder.gep(dst, [builder.add(at, const(64 * (c % 4)))]))
    for k, (d, m) in enumerate(dms):
        at = builder.mul(builder.add(sub0, const(k)), const(32))
        store(builder, d, builder.gep(dm, [at]))
        store(builder, m, builder.gep(dm, [builder.add(at, const(16))]))


def group_vectors(builder, base, g0, gvalid, width, at, vt):
    """The 4 groups' vt at base[(g0 + g) * width + at] (zeros past gvalid) concatenated:
    the panel's 16 rows of a per-(group, block) run of 4 values, as one vector."""
    parts = []
    for g in range(4):
        ok = builder.icmp_signed("<", const(g), gvalid)
        offset = builder.add(builder.mul(builder.add(g0, const(g)), width), at)
        parts.append(guarded(builder, ok, builder.gep(base, [offset]), base, vt))
    n = vt.count
    pair = [
        shuffle(builder, parts[0], parts[1], list(range(2 * n))),
        shuffle(builder, parts[2], parts[3], list(range(2 * n))),
    ]
    return shuffle(builder, pair[0], pair[1], list(range(4 * n)))


def scales16(builder, base, g0, gvalid, width, block, ok):
    """The 16 rows' float16 scales (or mins) of a block, as <16 x float> (zeros unless ok)."""
    halves = builder.bitcast(base, ir.HalfType().as_pointer())
    v = group_vectors(
        builder,
        halves,
        g0,
        gvalid,
        width,
        builder.mul(block, const(4)),
        ir.VectorType(ir.HalfType(), 4),
    )
    return builder.select(ok, builder.fpext(v, F32x16), ir.Constant(F32x16, None))


def shape1(context, builder, sig, args, k):
    ary = context.make_array(sig.args[k])(context, builder, args[k])
    return cgutils.unpack_tuple(builder, ary.shape, 2)[1]


def code_rows(builder, base, g0, gvalid, width, b0, bvalid, per_block: int, split):
    """16 rows (<16 x i32>) of two blocks' codes: row r's bytes of blocks b0 and b0 + 1
    (zeros past bvalid), each block's `per_block` bytes turned into 8 words by `split`."""
    rows = []
    for r in range(16):
        g, i = r // 4, r % 4
        gok = builder.icmp_signed("<", const(g), gvalid)
        row_at = builder.mul(builder.add(g0, const(g)), width)
        words = []
        for h in range(2):
            ok = builder.and_(gok, builder.icmp_signed("<", const(h), bvalid))
            blk = builder.add(b0, const(h))
            at = builder.add(row_at, builder.add(builder.mul(blk, const(4 * per_block)),
                                                 const(per_block * i)))  # fmt: skip
            v = guarded(
                builder, ok, builder.gep(base, [at]), base, ir.VectorType(I32, per_block // 4)
            )
            words.append(split(v))
        rows.append(shuffle(builder, words[0], words[1], list(range(16))))
    return rows


@intrinsic
def panel_q8_0(typingctx, codes, scales, g0, gvalid, b0, bvalid, dst, dm):
    """Blocks b0, b0 + 1 (bvalid of them) of the 16 rows of groups g0..g0 + 3 (gvalid of
    them) of a grouped q8_0 matrix (matvec.rows_q8_0's layout) -> the panel's sub-blocks
    2 b0 .. 2 b0 + 3 in the integer form: dst (codes, uint8 1-D), dm (float32 1-D)."""

    def codegen(context, builder, sig, args):
        width, swidth = (
            shape1(context, builder, sig, args, 0),
            shape1(context, builder, sig, args, 1),
        )
        g0, gvalid, b0, bvalid = args[2], args[3], args[4], args[5]
        cbase = array_ptr(context, builder, sig.args[0], args[0], const(0))
        sbase = array_ptr(context, builder, sig.args[1], args[1], const(0))
        rows = code_rows(builder, cbase, g0, gvalid, width, b0, bvalid, 32, lambda v: v)
        dms = []
        for h in range(2):
            ok = builder.icmp_signed("<", const(h), bvalid)
            d = scales16(builder, sbase, g0, gvalid, swidth, builder.add(b0, const(h)), ok)
            m = (
                ir.Constant(F32x16, None)
                if SIGNED_Q8
                else builder.fmul(d, ir.Constant(F32x16, [-128.0] * 16))
            )
            dms += [(d, m), (d, m)]  # the block's two sub-blocks of 16 share its scale
        dst = array_ptr(context, builder, sig.args[6], args[6], const(0))
        dmp = array_ptr(context, builder, sig.args[7], args[7], const(0))
        write_panel(builder, transpose16(builder, rows), dst, builder.mul(b0, const(2)), dms, dmp,
                    0 if SIGNED_Q8 else 128)  # fmt: skip
        return context.get_dummy_value()

    sig = types.void(codes, scales, types.intp, types.intp, types.intp, types.intp, dst, dm)
    return sig, codegen


def fifth_bits(builder, words, column: int):
    """<16 x i32>: the fifth bits of column `column` of a q5 panel's 8 transposed words
    per block (half column // 4, word column % 4), as byte values 0 or 16: byte j of
    lane r is bit 16 half + 4 word + j of row r's `words`."""
    half, k = column // 4, column % 4
    t = builder.lshr(words, ir.Constant(I32x16, [16 * half + 4 * k] * 16))
    out = ir.Constant(I32x16, None)
    for j in range(4):
        bit = builder.and_(t, ir.Constant(I32x16, [1 << j] * 16))
        out = builder.or_(out, builder.shl(bit, ir.Constant(I32x16, [8 * j + 4 - j] * 16)))
    return out


@intrinsic
def panel_nibbles(typingctx, codes, scales, mins, factor, bits, g0, gvalid, b0, bvalid, dst, dm):
    """panel_q8_0 for q4_0 / q4_1 / q5_0 / q5_1 (matvec.rows_q4's layout, `bits` the q5
    words or an empty array): codes 0..15 (0..31 with the fifth bits), D = the block's
    scale, M = factor times its min (q4_1, q5_1: the min, factor 1; q4_0, q5_0: the scale,
    factor -8 or -16)."""

    def codegen(context, builder, sig, args):
        width, swidth = (
            shape1(context, builder, sig, args, 0),
            shape1(context, builder, sig, args, 1),
        )
        bwidth = shape1(context, builder, sig, args, 4)
        factor, g0, gvalid, b0, bvalid = args[3], args[5], args[6], args[7], args[8]
        cbase = array_ptr(context, builder, sig.args[0], args[0], const(0))
        sbase = array_ptr(context, builder, sig.args[1], args[1], const(0))
        mbase = array_ptr(context, builder, sig.args[2], args[2], const(0))
        low4 = ir.Constant(I32x4, [0x0F0F0F0F] * 4)

        def split(v):  # 16 bytes of a row's block -> its low nibbles' words, then its high
            hi = builder.and_(builder.lshr(v, ir.Constant(I32x4, [4] * 4)), low4)
            return shuffle(builder, builder.and_(v, low4), hi, list(range(8)))

        columns = transpose16(
            builder, code_rows(builder, cbase, g0, gvalid, width, b0, bvalid, 16, split)
        )
        dms = []
        for h in range(2):
            ok = builder.icmp_signed("<", const(h), bvalid)
            blk = builder.add(b0, const(h))
            d = scales16(builder, sbase, g0, gvalid, swidth, blk, ok)
            m = scales16(builder, mbase, g0, gvalid, swidth, blk, ok)
            m = builder.fmul(m, splat(builder, factor, F32x16))
            dms += [(d, m), (d, m)]  # the block's two sub-blocks of 16 share its scale
        dst = array_ptr(context, builder, sig.args[9], args[9], const(0))
        dmp = array_ptr(context, builder, sig.args[10], args[10], const(0))
        sub0 = builder.mul(b0, const(2))
        with builder.if_else(builder.icmp_signed(">", bwidth, const(0))) as (q5, q4):
            with q5:  # the fifth bits: each block's words of the 16 rows, one vector
                wbase = builder.bitcast(array_ptr(context, builder, sig.args[4], args[4], const(0)),
                                        I32.as_pointer())  # fmt: skip
                fives = []
                for h in range(2):
                    ok = builder.icmp_signed("<", const(h), bvalid)
                    at = builder.mul(builder.add(b0, const(h)), const(4))
                    words = group_vectors(builder, wbase, g0, gvalid, bwidth, at, I32x4)
                    words = builder.select(ok, words, ir.Constant(I32x16, None))
                    fives += [fifth_bits(builder, words, c) for c in range(8)]
                both = [builder.or_(c, f) for c, f in zip(columns, fives, strict=True)]
                write_panel(builder, both, dst, sub0, dms, dmp, 0)
            with q4:
                write_panel(builder, columns, dst, sub0, dms, dmp, 0)
        return context.get_dummy_value()

    sig = types.void(
        codes,
        scales,
        mins,
        types.float32,
        bits,
        types.intp,
        types.intp,
        types.intp,
        types.intp,
        dst,
        dm,
    )
    return sig, codegen


def _panel_k(fmt: int):
    @intrinsic
    def panel_k(typingctx, blocks, nbytes, g0, gvalid, blk, dst, dm):
        """Super-block blk of the 16 rows of groups g0.. (gvalid of them) of a grouped
        K-quant matrix (ggml.rows_ggml's layout) -> the panel's sub-blocks 16 blk ..
        16 blk + 15: the codes of simd/kquants.py's decoders, D = d a_s, M = -dmin b_s."""

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            width = cgutils.unpack_tuple(builder, ary.shape, 2)[1]
            nbytes, g0, gvalid, blk = args[1], args[2], args[3], args[4]
            base = ary.data
            chunks = [[None] * 16 for _ in range(4)]
            ds, ms = [], []
            for r in range(16):
                g, i = r // 4, r % 4
                ok = builder.icmp_signed("<", const(g), gvalid)
                at = builder.add(
                    builder.mul(builder.add(g0, const(g)), width),
                    builder.mul(builder.add(builder.mul(blk, const(4)), const(i)), nbytes),
                )
                b = builder.gep(base, [builder.select(ok, at, const(0))])
                codes, dv, mv = DECODERS[fmt](builder, b)
                for v in range(4):
                    chunks[v][r] = builder.select(
                        ok, builder.bitcast(codes[v], I32x16), ir.Constant(I32x16, None)
                    )
                mv = builder.fneg(mv)
                ds.append(builder.select(ok, dv, ir.Constant(F32x16, None)))
                ms.append(builder.select(ok, mv, ir.Constant(F32x16, None)))
            dst = array_ptr(context, builder, sig.args[5], args[5], const(0))
            dmp = array_ptr(context, builder, sig.args[6], args[6], const(0))
            d_cols = transpose16(builder, [builder.bitcast(x, I32x16) for x in ds])
            m_cols = transpose16(builder, [builder.bitcast(x, I32x16) for x in ms])
            for v in range(4):
                dms = [
                    (
                        builder.bitcast(d_cols[4 * v + k], F32x16),
                        builder.bitcast(m_cols[4 * v + k], F32x16),
                    )
                    for k in range(4)
                ]
                sub0 = builder.add(builder.mul(blk, const(16)), const(4 * v))
                write_panel(builder, transpose16(builder, chunks[v]), dst, sub0, dms, dmp, 0)
            return context.get_dummy_value()

        sig = types.void(blocks, types.intp, types.intp, types.intp, types.intp, dst, dm)
        return sig, codegen

    return panel_k


panel_q2_k, panel_q3_k, panel_q4_k, panel_q5_k, panel_q6_k = (
    _panel_k(CODE_OF[f]) for f in K_FORMATS
)

VECTORS = 4  # vectors a tile multiplies by one panel: 4 accumulators, the codes loaded once


def _dot_run(builder, acc, code, x4, signed: bool):
    """acc + the 16 rows' dot products of one 4-byte run with x's 4 bytes (broadcast)."""
    xv = builder.bitcast(splat(builder, x4, I32x16), I8x64)
    if signed:
        return builder.add(acc, dot_i8(builder, code, xv))
    return dot_u8_add(builder, acc, code, xv)


@intrinsic
def tile(typingctx, codes, dm, nsub, xq, xrows, lo, xd, xb, xoff, fold, signed, paired, out,
         orows, r0, nrows, add, ahead, ahead_at):  # fmt: skip
    """out[orows[v], r0:r0 + nrows] (=, or += when add) the sum over sub-blocks s of D_s
    xd[v, s // 2] (c_s . xq[v, 16 s:16 s + 16]) + M_s xb[v, s], for the 4 vectors v of
    xrows (their rows of xq, xd, xb) and a panel (codes, dm: write_panel's layout, nsub
    sub-blocks). x's integers: int8, or int16 as its high bytes and, lo further on, its
    low ones (int8.py); an orows entry below 0 is not stored. `signed`: codes are int8
    (SIGNED_Q8), not bytes. `paired`: every two sub-blocks 2 j, 2 j + 1 share D and M (a
    format with a scale per 32 weights; nsub even): their integer sums are added before
    the one conversion to float, as decode sums a block of 32 (the weight class's
    `paired`), and xb[v, j] is the pair's xb16[v, 2 j] + xb16[v, 2 j + 1] (igemm.paired_xb).
    `fold` (paired; M = a constant times D: q8_0, q4_0, q5_0): each pair's integer sum
    starts at xoff[v, j], that constant times the sum of x's integers over the pair, in
    place of the M xb multiply-add (one of the four float operations a vector pays a pair
    beside its 8 or 16 dot products; exact where that term rounds).
    Each sub-block s also asks for the 2 lines at byte ahead_at + 128 s of `ahead` (bytes;
    `prefetcht1`, into L2; `prefetcht0`, into L1 too, where the tiles read their panel,
    gained nothing from DRAM): the next panel's weights (igemm.matmat_int)."""

    def codegen(context, builder, sig, args):
        (codes_, dm_, nsub, xq_, xrows_, lo, xd_, xb_, xoff_, fold, signed_, paired_, out_,
         orows_, r0, nrows, add, ahead_, ahead_at) = args  # fmt: skip
        sa = sig.args
        cbase = array_ptr(context, builder, sa[0], codes_, const(0))
        dbase = builder.bitcast(array_ptr(context, builder, sa[1], dm_, const(0)), F32.as_pointer())

        def rows_of(k, arr_arg):
            a = context.make_array(sa[k])(context, builder, arr_arg)
            stride = cgutils.unpack_tuple(builder, a.strides, 2)[0]
            return builder.bitcast(a.data, I8.as_pointer()), stride

        (xqb, xqs), (xdb, xds), (xbb, xbs) = rows_of(3, xq_), rows_of(6, xd_), rows_of(7, xb_)
        xob, xos = rows_of(8, xoff_)
        xr = context.make_array(sa[4])(context, builder, xrows_)
        vrows = [builder.load(builder.gep(xr.data, [const(v)])) for v in range(VECTORS)]
        xrow = [builder.gep(xqb, [builder.mul(r, xqs)]) for r in vrows]
        xdrow = [
            builder.bitcast(builder.gep(xdb, [builder.mul(r, xds)]), F32.as_pointer())
            for r in vrows
        ]
        xbrow = [
            builder.bitcast(builder.gep(xbb, [builder.mul(r, xbs)]), F32.as_pointer())
            for r in vrows
        ]
        xorow = [
            builder.bitcast(builder.gep(xob, [builder.mul(r, xos)]), I32.as_pointer())
            for r in vrows
        ]
        abase = builder.gep(array_ptr(context, builder, sa[17], ahead_, const(0)), [ahead_at])
        offsets = xbrow, xorow
        accs = _tile_loop(builder, cbase, dbase, nsub, xrow, xdrow, offsets, lo, signed_, paired_,
                          fold, abase)  # fmt: skip
        store_rows(context, builder, sa[12], out_, sa[13], orows_, r0, nrows, add, accs)
        return context.get_dummy_value()

    sig = types.void(
        codes,
        dm,
        types.intp,
        xq,
        xrows,
        types.intp,
        xd,
        xb,
        xoff,
        types.intp,
        types.intp,
        types.intp,
        out,
        orows,
        types.intp,
        types.intp,
        types.intp,
        ahead,
        types.intp,
    )
    return sig, codegen


def _tile_loop(builder, cbase, dbase, nsub, xrow, xdrow, offsets, lo, signed, paired, fold, abase):
    """The loop over sub-blocks, its VECTORS float accumulators in registers; one loop body
    per kind of x (int8, int16), of codes (bytes, and int8 where SIGNED_Q8), of scales
    (per 16 weights, or shared by pairs of sub-blocks) and of offsets (M xb added, or
    folded into the integer sums: paired formats only). `offsets`: each vector's row of xb
    and of xoff."""
    result = [cgutils.alloca_once(builder, F32x16) for _ in range(VECTORS)]
    variants = [
        (w, sg, pr, fd)
        for w in (False, True)
        for sg in ((False, True) if SIGNED_Q8 else (False,))
        for pr in (False, True)
        for fd in ((False, True) if pr else (False,))
    ]
    wide = builder.icmp_signed("!=", lo, const(0))
    is_signed = builder.icmp_signed("!=", signed, const(0))
    is_paired = builder.icmp_signed("!=", paired, const(0))
    is_folded = builder.icmp_signed("!=", fold, const(0))
    end = builder.append_basic_block("tile.end")
    for w, sg, pr, fd in variants:
        cond = builder.and_(wide if w else builder.not_(wide),
                            is_paired if pr else builder.not_(is_paired))  # fmt: skip
        if pr:
            cond = builder.and_(cond, is_folded if fd else builder.not_(is_folded))
        if SIGNED_Q8:
            cond = builder.and_(cond, is_signed if sg else builder.not_(is_signed))
        body = builder.append_basic_block("tile.variant")
        skip = builder.append_basic_block("tile.next")
        builder.cbranch(cond, body, skip)
        builder.position_at_end(body)
        accs = _one_loop(builder, cbase, dbase, nsub, xrow, xdrow, offsets, lo, w, sg, pr, fd,
                         abase)  # fmt: skip
        for v in range(VECTORS):
            builder.store(accs[v], result[v])
        builder.branch(end)
        builder.position_at_end(skip)
    builder.branch(end)
    builder.position_at_end(end)
    return [builder.load(r) for r in result]


def _one_loop(builder, cbase, dbase, nsub, xrow, xdrow, offsets, lo, wide: bool, signed: bool,
              paired: bool, folded: bool, abase):  # fmt: skip
    """Sub-blocks one at a time, or (paired) two, their integer sums added first (from x's
    offsets where `folded`)."""
    step = 2 if paired else 1
    xbrow, xorow = offsets

    def body(s, accs):
        for k in range(2 * step):
            at = builder.add(builder.mul(s, const(128)), const(64 * k))
            prefetch_ir(builder, builder.gep(abase, [at]), 2)  # prefetcht1: into L2
        at = builder.mul(s, const(256))
        runs = [
            load(builder, builder.gep(cbase, [builder.add(at, const(64 * k))]), I8x64)
            for k in range(4 * step)
        ]
        dp = builder.gep(dbase, [builder.mul(s, const(32))])
        D = load(builder, dp, F32x16)
        M = load(builder, builder.gep(dp, [const(16)]), F32x16)
        half = builder.lshr(s, const(1))
        new = []
        for v in range(VECTORS):
            xp = builder.gep(xrow[v], [builder.mul(s, const(16))])

            def dots(base, acc):
                for k in range(4 * step):  # a sub-block's 16 bytes: 4 runs of 4 (each pair's next)
                    x4 = builder.load(
                        builder.bitcast(builder.gep(base, [const(4 * k)]), I32.as_pointer()),
                        align=1,
                    )
                    acc = _dot_run(builder, acc, runs[k], x4, signed)
                return acc

            start = zero = ir.Constant(I32x16, None)
            if folded:  # with int16 x, into its low bytes' sums: all of it added as integers
                start = splat(builder, builder.load(builder.gep(xorow[v], [half])), I32x16)
            if wide:
                sums = builder.add(builder.shl(dots(xp, zero), ir.Constant(I32x16, [7] * 16)),
                                   dots(builder.gep(xp, [lo]), start))  # fmt: skip
            else:
                sums = dots(xp, start)
            xd = builder.load(builder.gep(xdrow[v], [half]))
            w = builder.fmul(D, splat(builder, xd, F32x16))
            a = builder.fadd(
                accs[v],
                builder.fmul(builder.sitofp(sums, F32x16), w, flags=["contract"]),
                flags=["contract"],
            )
            if folded:
                new.append(a)
                continue
            xb = builder.load(builder.gep(xbrow[v], [half if paired else s]))
            a = builder.fadd(
                a,
                builder.fmul(M, splat(builder, xb, F32x16), flags=["contract"]),
                flags=["contract"],
            )
            new.append(a)
        return new

    return accumulate(builder, nsub, step, VECTORS, body, "tile")


# --- float weights: the same panels, in float32


FLOAT_VECTORS = 8  # vectors a float tile multiplies by one panel


I16x16 = ir.VectorType(ir.IntType(16), 16)


def widen(builder, v, kind: str):
    """<16 x i16> float16 or bfloat16 bits -> <16 x float>."""
    if kind == "f16":
        return builder.fpext(builder.bitcast(v, ir.VectorType(ir.HalfType(), 16)), F32x16)
    wide = builder.shl(builder.zext(v, I32x16), ir.Constant(I32x16, [16] * 16))
    return builder.bitcast(wide, F32x16)


def masked_load(builder, ptr, vt, mask, align: int = 2):
    """vt (<n x float> or <n x i16>, n 4 or 16) at ptr, only the lanes of mask (<n x i1>)
    read and the others zero: a lane masked off never faults."""
    elem = "f32" if isinstance(vt.element, ir.FloatType) else "i16"
    name = f"llvm.masked.load.v{vt.count}{elem}.p0"
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vt, [vt.as_pointer(), I32, mask.type, vt]), name
    )
    return builder.call(fn, [ptr, const(align, I32), mask, ir.Constant(vt, None)])


def first_lanes(builder, count):
    """<16 x i1>: the lanes below count (an i32)."""
    return builder.icmp_signed("<", ir.Constant(I32x16, list(range(16))),
                               splat(builder, count, I32x16))  # fmt: skip


def _panel_float(kind: str):
    @intrinsic
    def panel(typingctx, w, r0, nrows, k0, dst):
        """Columns k0..k0 + 15 of rows r0..r0 + nrows - 1 (at most 16) of a row-major
        matrix of `kind` (float32, or float16 / bfloat16 bits) -> dst[16 k:16 k + 16] for
        each column k: its 16 rows' weights in float32 (zeros past nrows, and past the
        matrix's last column)."""

        def codegen(context, builder, sig, args):
            w_, r0, nrows, k0, dst_ = args
            ary = context.make_array(sig.args[0])(context, builder, w_)
            cols = cgutils.unpack_tuple(builder, ary.shape, 2)[1]
            vt = F32x16 if kind == "f32" else I16x16
            i1x16 = ir.VectorType(ir.IntType(1), 16)
            # the columns from k0 to the end
            lanes = first_lanes(builder, builder.trunc(builder.sub(cols, k0), I32))
            rows = []
            for r in range(16):
                ok = builder.icmp_signed("<", const(r), nrows)
                keep = builder.select(
                    ok, ir.Constant(i1x16, [1] * 16), ir.Constant(i1x16, [0] * 16)
                )
                mask = builder.and_(lanes, keep)
                row = builder.add(r0, builder.select(ok, const(r), const(0)))
                at = builder.add(builder.mul(row, cols), k0)
                p = builder.bitcast(builder.gep(ary.data, [at]), vt.as_pointer())
                v = masked_load(builder, p, vt, mask)
                rows.append(
                    builder.bitcast(v if kind == "f32" else widen(builder, v, kind), I32x16)
                )
            dst = builder.bitcast(array_ptr(context, builder, sig.args[4], dst_, const(0)),
                                  F32.as_pointer())  # fmt: skip
            for c, col in enumerate(transpose16(builder, rows)):
                at = builder.mul(builder.add(k0, const(c)), const(16))
                store(builder, builder.bitcast(col, F32x16), builder.gep(dst, [at]))
            return context.get_dummy_value()

        return types.void(w, types.intp, types.intp, types.intp, dst), codegen

    return panel


panel_f16, panel_bf16 = _panel_float("f16"), _panel_float("bf16")


@intrinsic
def float_tile(typingctx, panel, cols, x, xrows, out, orows, r0, nrows, add):
    """out[orows[v], r0:r0 + nrows] (=, or += when add) panel . x[xrows[v]] for the
    FLOAT_VECTORS vectors of xrows: the panel as the panel_ functions lay it out (16 float32
    per column, cols columns), each column's 16 weights loaded once and multiplied by each
    vector's value broadcast (one fused multiply-add per 16 weights and vector)."""

    def codegen(context, builder, sig, args):
        panel_, cols, x_, xrows_, out_, orows_, r0, nrows, add = args
        pbase = builder.bitcast(array_ptr(context, builder, sig.args[0], panel_, const(0)),
                                F32.as_pointer())  # fmt: skip
        xa = context.make_array(sig.args[2])(context, builder, x_)
        xstride = cgutils.unpack_tuple(builder, xa.strides, 2)[0]
        xbase = builder.bitcast(xa.data, I8.as_pointer())
        xr = context.make_array(sig.args[3])(context, builder, xrows_)
        xrow = []
        for v in range(FLOAT_VECTORS):
            row = builder.load(builder.gep(xr.data, [const(v)]))
            xrow.append(
                builder.bitcast(builder.gep(xbase, [builder.mul(row, xstride)]), F32.as_pointer())
            )

        def body(k, accs):
            wv = load(builder, builder.gep(pbase, [builder.mul(k, const(16))]), F32x16)
            new = []
            for v in range(FLOAT_VECTORS):
                xv = splat(builder, builder.load(builder.gep(xrow[v], [k])), F32x16)
                new.append(builder.fadd(accs[v], builder.fmul(wv, xv, flags=["contract"]),
                                        flags=["contract"]))  # fmt: skip
            return new

        final = accumulate(builder, cols, 1, FLOAT_VECTORS, body, "ftile")
        store_rows(context, builder, sig.args[4], out_, sig.args[5], orows_, r0, nrows, add,
                   final)  # fmt: skip
        return context.get_dummy_value()

    sig = types.void(panel, types.intp, x, xrows, out, orows, types.intp, types.intp, types.intp)
    return sig, codegen


def store_rows(context, builder, out_ty, out_, orows_ty, orows_, r0, nrows, add, accs):
    """out[orows[v], r0:r0 + nrows] (=, or += when add) accs[v], where orows[v] >= 0."""
    orr = context.make_array(orows_ty)(context, builder, orows_)
    orows = [builder.load(builder.gep(orr.data, [const(v)])) for v in range(len(accs))]
    put_rows(context, builder, out_ty, out_, orows, r0, nrows, add, accs)


def put_rows(context, builder, out_ty, out_, orows: list, r0, nrows, add, accs):
    """out[orows[v], r0:r0 + nrows] (=, or += when add) accs[v] (<16 x float>), where the
    i64 orows[v] >= 0: a masked load and store of the nrows lanes."""
    oa = context.make_array(out_ty)(context, builder, out_)
    ostride = cgutils.unpack_tuple(builder, oa.strides, 2)[0]
    obase = builder.bitcast(oa.data, I8.as_pointer())
    mask = builder.sub(builder.shl(const(1, I32), builder.trunc(nrows, I32)), const(1, I32))
    i1x16 = ir.VectorType(ir.IntType(1), 16)
    f32p = F32x16.as_pointer()
    store_fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [F32x16, f32p, I32, i1x16]),
        "llvm.masked.store.v16f32.p0")  # fmt: skip
    bits = builder.bitcast(builder.trunc(mask, ir.IntType(16)), i1x16)
    adding = builder.icmp_signed("!=", add, const(0))
    for orow, acc in zip(orows, accs, strict=True):
        with builder.if_then(builder.icmp_signed(">=", orow, const(0))):
            row = builder.bitcast(
                builder.gep(obase, [builder.mul(orow, ostride)]), F32.as_pointer()
            )
            p = builder.bitcast(builder.gep(row, [r0]), f32p)
            old = masked_load(builder, p, F32x16, bits, align=4)
            builder.call(store_fn, [builder.select(adding, builder.fadd(old, acc), acc), p,
                                    const(4, I32), bits])  # fmt: skip
