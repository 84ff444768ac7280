"""The K-quants' integer SIMD: one super-block of 256 weights of a row, as stored in GGUF,
multiplied by x rounded to int8 (intdot.rows_k), all in vector registers.

Each K-quant is decoded here into the same form (intdot.py's table): 4 vectors of 64
unsigned codes c (elements 64 v .. 64 v + 63) and, per sub-block of 16, the float32
products D a_s and M b_s of its integer scale a_s and min b_s with the super-block's two
float16 numbers D and M, with x_e = D a_s c_e - M b_s.
Every code vector comes from byte loads, shifts and masks of whole 32- or 64-byte runs
(no gather, no per-byte loop), because the K-quants store a super-block's codes as bit
fields of 32-byte runs: element 128 h + 32 f + j sits in field f of byte j of half h
(q4_k's and q5_k's 4-bit codes repacked at load into q6_k's order: q45_k).
`int8.dot_u8` then multiplies each code vector by its 64 values of x (vpdpbusd on VNNI)."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

from ..kinds import CODE_OF, K_FORMATS
from .int8 import I8, I32, F32x16, I32x16, concat, dot_u8, element_at, vectors, with_low

Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = (CODE_OF[f] for f in K_FORMATS)  # the formats' codes


def _bytes(builder, base, offset: int, n: int):
    """<n x i8> from base + offset."""
    ptr = builder.gep(base, [ir.Constant(I32, offset)])
    return builder.load(builder.bitcast(ptr, ir.VectorType(I8, n).as_pointer()), align=1)


def _splat(v, k: int):
    return ir.Constant(v.type, [k] * v.type.count)


def _fields(builder, v, shifts: tuple[int, int], mask: int):
    """<64 x i8>: the field (byte >> shift) & mask of the 32 bytes v, first with shifts[0],
    then with shifts[1]. v twice (a broadcast load where v is loaded) shifted as 8 quad
    words, each half by its shift: a byte's field keeps none of the bits the next byte
    shifts in while mask < 2^(8 - shift). One shift and one mask, no lane insert (the
    shuffle port is the busy one): one thread, 512 x 2048 in L2, int16 x, q5_k 1.76-1.81
    ns a row's block of 32 where 1.92, q4_k unchanged (Xeon family 6 model 167)."""
    assert mask < 1 << (8 - max(shifts))
    both = concat(builder, v, v)
    quads = ir.VectorType(ir.IntType(64), 8)
    by = ir.Constant(quads, [shifts[0]] * 4 + [shifts[1]] * 4)
    both = builder.bitcast(builder.lshr(builder.bitcast(both, quads), by), both.type)
    return builder.and_(both, _splat(both, mask))


def _spread(builder, v, lanes: list[int]):
    """<len(lanes) x T>: lane l is v's lane lanes[l]."""
    mask = ir.Constant(ir.VectorType(I32, len(lanes)), lanes)
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), mask)


def _float16(builder, base, offset: int):
    """The float16 at base + offset as float32."""
    ptr = builder.bitcast(builder.gep(base, [ir.Constant(I32, offset)]), ir.HalfType().as_pointer())
    return builder.fpext(builder.load(ptr, align=1), ir.FloatType())


def _times(builder, v, f):
    """float(v) * f in every lane, for v <16 x i32> and f a float32 scalar."""
    fv = builder.insert_element(ir.Constant(F32x16, ir.Undefined), f, ir.Constant(I32, 0))
    return builder.fmul(builder.sitofp(v, F32x16), _spread(builder, fv, [0] * 16))


def q2_k(builder, b):
    codes = []
    for h in range(2):
        q = _bytes(builder, b, 16 + 32 * h, 32)
        codes += [_fields(builder, q, (4 * p, 4 * p + 2), 3) for p in range(2)]
    sc = builder.zext(_bytes(builder, b, 0, 16), I32x16)
    a, m = builder.and_(sc, _splat(sc, 15)), builder.lshr(sc, _splat(sc, 4))
    d, dmin = _float16(builder, b, 80), _float16(builder, b, 82)
    return codes, _times(builder, a, d), _times(builder, m, dmin)


def _scale_bits(builder, b, offset: int, n: int, step: int, mask: int):
    """<16 x i32>: lane s is (b[offset + s % n] >> (step (s // n))) & mask."""
    v = builder.zext(_spread(builder, _bytes(builder, b, offset, n), [s % n for s in range(16)]),
                     I32x16)  # fmt: skip
    shifts = ir.Constant(I32x16, [step * (s // n) for s in range(16)])
    return builder.and_(builder.lshr(v, shifts), _splat(v, mask))


def q3_k(builder, b):
    hmask, codes = _bytes(builder, b, 0, 32), []
    for h in range(2):
        q = _bytes(builder, b, 32 + 32 * h, 32)
        for p in range(2):
            high = _fields(builder, hmask, (4 * h + 2 * p, 4 * h + 2 * p + 1), 1)
            low = _fields(builder, q, (4 * p, 4 * p + 2), 3)
            codes.append(builder.or_(low, builder.shl(high, _splat(high, 2))))
    # scale s: 4 bits of byte 96 + s % 8 (shift 4 (s // 8)), 2 of byte 104 + s % 4 (2 (s // 4))
    low = _scale_bits(builder, b, 96, 8, 4, 15)
    high = _scale_bits(builder, b, 104, 4, 2, 3)
    a = builder.sub(builder.or_(low, builder.shl(high, _splat(high, 4))), _splat(low, 32))
    d = _float16(builder, b, 108)
    dmin = builder.fmul(d, ir.Constant(ir.FloatType(), 4.0))  # d a (c - 4)
    return codes, _times(builder, a, d), _times(builder, a, dmin)


def _dwords(builder, q, picks: list[int | None]):
    """<16 x i32>: lane l is byte picks[l] of the bytes q (zero where None): one byte
    shuffle (vpermb) with the lanes' upper bytes zeroed."""
    zero = len(picks)  # an index into the zero vector beside q
    mask = [b for p in picks for b in ([zero if p is None else p] + [zero] * 3)]
    both = builder.shuffle_vector(q, ir.Constant(q.type, None), ir.Constant(
        ir.VectorType(I32, 64), mask))  # fmt: skip
    return builder.bitcast(both, I32x16)


def _scale_min_k4(builder, b):
    """D a_s and M b_s (<16 x float> each, lane s: sub-block of 16 s) of q4_k / q5_k: the 8
    6-bit scales and mins in bytes 4..15 (q[0..11]), each over 2 lanes. Scale j < 4 is
    q[j] & 63, min j < 4 q[j + 4] & 63; for j >= 4 the low 4 bits are q[j + 4]'s low
    (scale) or high (min) nibble and the top 2 the top 2 of q[j - 4] (scale) or q[j]
    (min). All 16 at once, interleaved (lane 2 j scale j, 2 j + 1 min j): two byte
    shuffles, two shifts and one bitwise select; one conversion, then one product by
    d and dmin read as one broadcast pair of float16 (lanes alike), and two spreads."""
    q = _bytes(builder, b, 4, 16)
    old = [n // 2 if n % 2 == 0 else 8 + n // 2 for n in range(16)]  # new lane <- lane
    low_picks = [*range(4), *range(8, 12), *range(4, 12)]
    top_picks = [None] * 4 + [*range(4)] + [None] * 4 + [*range(4, 8)]
    shifts, keeps = [0] * 12 + [4] * 4, ([63] * 4 + [15] * 4) * 2
    low = _dwords(builder, q, [low_picks[k] for k in old])
    top = _dwords(builder, q, [top_picks[k] for k in old])
    nibble = builder.lshr(low, ir.Constant(I32x16, [shifts[k] for k in old]))
    keep = ir.Constant(I32x16, [keeps[k] for k in old])
    high = builder.lshr(top, _splat(top, 2))  # bits 6, 7 -> 4, 5 (and 0..5 -> 0..3)
    both = builder.or_(builder.and_(nibble, keep), builder.and_(high, builder.not_(keep)))
    pair = builder.bitcast(_bytes(builder, b, 0, 4), ir.VectorType(ir.HalfType(), 2))
    dd = builder.fpext(_spread(builder, pair, [0, 1] * 8), F32x16)  # d, dmin, d, dmin ...
    scaled = builder.fmul(builder.sitofp(both, F32x16), dd)
    return _spread(builder, scaled, [2 * (s // 2) for s in range(16)]), _spread(
        builder, scaled, [2 * (s // 2) + 1 for s in range(16)])  # fmt: skip


def q45_k(builder, b, five: bool):
    """q4_k / q5_k with their code bytes repacked at load (weights.repack_codes): byte j
    of half h holds element 128 h + j (low nibble) and 128 h + 64 + j (high), as q6_k's
    low bits: a half's 64-byte load, one shift of its 16-bit words and two masks give 128
    codes in order, where the stored order (4 runs of 32) took a broadcast and a shift per
    64."""
    qs, nibbles, codes = 48 if five else 16, [], []
    qh = _bytes(builder, b, 16, 32) if five else None
    words = ir.VectorType(ir.IntType(16), 32)
    four = ir.Constant(words, [4] * 32)
    for h in range(2):
        q = _bytes(builder, b, qs + 64 * h, 64)
        high = builder.bitcast(builder.lshr(builder.bitcast(q, words), four), q.type)
        nibbles += [builder.and_(q, _splat(q, 15)), builder.and_(high, _splat(high, 15))]
    for v, c in enumerate(nibbles):  # elements 64 v ..: sub-blocks of 32 2 v and 2 v + 1
        if five:
            high = _fields(builder, qh, (2 * v, 2 * v + 1), 1)
            c = builder.or_(c, builder.shl(high, _splat(high, 4)))
        codes.append(c)
    return (codes, *_scale_min_k4(builder, b))


def q6_k(builder, b):
    """q6_k with its top 2 bits repacked at load (weights.repack_codes): field v of byte k
    of qh is element 64 v + k's, so code vector v's are qh's 64 bytes shifted by 2 v,
    each byte's 4 in bits 4 and 5 after one shift of qh's 16-bit words and one mask (the
    stored order took a broadcast, a shift, a mask and a shift per vector)."""
    codes, words = [], ir.VectorType(ir.IntType(16), 32)
    qh = builder.bitcast(_bytes(builder, b, 128, 64), words)
    for h in range(2):
        ql = _bytes(builder, b, 64 * h, 64)
        for p in range(2):  # elements 128 h + 64 p ..: ql's nibble p, qh's field 2 h + p
            low = builder.and_(builder.lshr(ql, _splat(ql, 4 * p)) if p else ql, _splat(ql, 15))
            up = 4 - 2 * (2 * h + p)  # field 2 h + p to bits 4 and 5: 4, 2, 0 or -2
            moved = qh
            if up:
                by = ir.Constant(words, [abs(up)] * 32)
                moved = builder.shl(qh, by) if up > 0 else builder.lshr(qh, by)
            high = builder.and_(builder.bitcast(moved, ql.type), _splat(ql, 0x30))
            codes.append(builder.or_(low, high))
    a = builder.sext(_bytes(builder, b, 192, 16), I32x16)
    d = _float16(builder, b, 208)
    dmin = builder.fmul(d, ir.Constant(ir.FloatType(), 32.0))  # d a (c - 32)
    return codes, _times(builder, a, d), _times(builder, a, dmin)


DECODERS = {Q2_K: q2_k, Q3_K: q3_k, Q4_K: lambda bd, b: q45_k(bd, b, False),
            Q5_K: lambda bd, b: q45_k(bd, b, True), Q6_K: q6_k}  # fmt: skip


def _access(context, builder, sig, args):
    """A K-quant codegen's helpers: ptr(k, at) -> the address of argument k's element
    args[at]; lanes(k, at) -> the same as a pointer to 16 float32 lanes."""

    def ptr(k, at_arg):
        ary = context.make_array(sig.args[k])(context, builder, args[k])
        return builder.gep(ary.data, [args[at_arg]])

    def lanes(k, at_arg):
        return builder.bitcast(ptr(k, at_arg), F32x16.as_pointer())

    return ptr, lanes


def _k_into(builder, fmt: int, block, xs, lo, xd16s, xb16s, accs, mins):
    """One super-block of a row (its bytes at `block`), decoded once (DECODERS), times
    each vector's 256 values: its x bytes at xs[j] (low bytes lo on), its sub-blocks'
    scales and scaled sums at xd16s[j], xb16s[j] (<16 x float>*); accs[j] += the D a_s
    xd_s (c . xq), mins[j] -= the M b_s xd_s sum(xq) (<16 x float>* each)."""
    codes, da, mb = DECODERS[fmt](builder, block)

    def dots(ptrs, inits=None):  # the 4 code vectors by their 64 values of each x
        inits = inits or [None] * (4 * len(ptrs))
        return [dot_u8(builder, c, _bytes(builder, at, 64 * v, 64), inits[4 * j + v])
                for j, at in enumerate(ptrs) for v, c in enumerate(codes)]  # fmt: skip

    sums = with_low(builder, lo, dots(xs), lambda i: dots([builder.gep(x, [lo]) for x in xs], i))
    for j, acc_at in enumerate(accs):
        w = builder.fmul(da, builder.load(xd16s[j], align=4))
        total = builder.load(acc_at, align=4)
        for v in range(4):
            wv = _spread(builder, w, [4 * v + lane // 4 for lane in range(16)])
            product = builder.fmul(builder.sitofp(sums[4 * j + v], F32x16), wv, flags=["contract"])
            total = builder.fadd(total, product, flags=["contract"])
        builder.store(total, acc_at, align=4)
        taken = builder.fmul(mb, builder.load(xb16s[j], align=4), flags=["contract"])
        builder.store(builder.fsub(builder.load(mins[j], align=4), taken, flags=["contract"]),
                      mins[j], align=4)  # fmt: skip


def _k_block(fmt: int):
    @intrinsic
    def k_block(typingctx, acc, mins, at, blocks, bo, xq, xo, xd16, xb16, so, lo):
        """acc[at:at + 16] += the D a_s xd_s (c . xq) of one super-block of a row,
        blocks[bo:bo + nbytes], with x's integers at xq[xo:xo + 256] (and their low bytes
        lo on: int8.py); mins[at:at + 16] -= its M b_s xd_s sum(xq_s). xd16[so + s],
        xb16[so + s]: sub-block s's x scale and scale * sum(xq)."""

        def codegen(context, builder, sig, args):
            ptr, lanes = _access(context, builder, sig, args)
            _k_into(builder, fmt, ptr(3, 4), [ptr(5, 6)], args[10], [lanes(7, 9)],
                    [lanes(8, 9)], [lanes(0, 2)], [lanes(1, 2)])  # fmt: skip

        sig = types.void(acc, mins, types.intp, blocks, types.intp, xq, types.intp, xd16, xb16,
                         types.intp, types.intp)  # fmt: skip
        return sig, codegen

    return k_block


k_block_q2, k_block_q3, k_block_q4, k_block_q5, k_block_q6 = (
    _k_block(f) for f in (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)
)


def _k_block_n(fmt: int):
    @intrinsic
    def k_block_n(typingctx, acc, mins, at, blocks, bo, xq, vs, xo, xd16, xb16, so, lo):
        """k_block for several vectors, the super-block decoded once: vector j is row
        vs[j] of xq, xd16 and xb16 (2-D), into acc and mins from at + 64 j."""

        def codegen(context, builder, sig, args):
            ptr, _ = _access(context, builder, sig, args)
            rows = vectors(builder, sig, args, 6)

            def each(k, at):
                return [element_at(builder, context, sig.args[k], args[k], v, at) for v in rows]

            def lanes(ps):
                return [builder.bitcast(p, F32x16.as_pointer()) for p in ps]

            def per_vector(k):
                base = context.make_array(sig.args[k])(context, builder, args[k]).data
                start = builder.gep(base, [args[2]])
                return lanes(builder.gep(start, [ir.Constant(I32, 64 * j)])
                             for j in range(len(rows)))  # fmt: skip

            _k_into(builder, fmt, ptr(3, 4), each(5, args[7]), args[11],
                    lanes(each(8, args[10])), lanes(each(9, args[10])), per_vector(0),
                    per_vector(1))  # fmt: skip

        sig = types.void(acc, mins, types.intp, blocks, types.intp, xq, vs, types.intp, xd16,
                         xb16, types.intp, types.intp)  # fmt: skip
        return sig, codegen

    return k_block_n


kn_block_q2, kn_block_q3, kn_block_q4, kn_block_q5, kn_block_q6 = (
    _k_block_n(f) for f in (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)
)


def _k_block_f32(fmt: int):
    @intrinsic
    def k_block_f32(typingctx, acc, mins, at, blocks, bo, x, xo, xs16, so):
        """k_block for x in float32: acc[at:at + 16] += D a_s (c_e x_e) lane by lane over
        the super-block's 16 sub-blocks, blocks[bo:bo + nbytes] with x[xo:xo + 256];
        mins[at:at + 16] -= M b_s xs16[so + s] (xs16: x's sums per 16). The codes are
        decoded in registers as for int8 x (DECODERS), then widened to float."""

        def codegen(context, builder, sig, args):
            ptr, lanes = _access(context, builder, sig, args)
            codes, w, mb = DECODERS[fmt](builder, ptr(3, 4))

            x = builder.bitcast(ptr(5, 6), ir.FloatType().as_pointer())
            acc_at = lanes(0, 2)
            total = builder.load(acc_at, align=4)
            for v in range(4):
                for k in range(4):
                    c = builder.uitofp(_spread(builder, codes[v], list(range(16 * k, 16 * k + 16))),
                                       F32x16)  # fmt: skip
                    xp = builder.gep(x, [ir.Constant(I32, 64 * v + 16 * k)])
                    xv = builder.load(builder.bitcast(xp, F32x16.as_pointer()), align=4)
                    ws = _spread(builder, w, [4 * v + k] * 16)
                    total = builder.fadd(total, builder.fmul(builder.fmul(c, xv), ws,
                                                             flags=["contract"]),
                                         flags=["contract"])  # fmt: skip
            builder.store(total, acc_at, align=4)
            mins_at = lanes(1, 2)
            taken = builder.fmul(mb, builder.load(lanes(7, 8), align=4),
                                 flags=["contract"])  # fmt: skip
            builder.store(builder.fsub(builder.load(mins_at, align=4), taken, flags=["contract"]),
                          mins_at, align=4)  # fmt: skip

        sig = types.void(acc, mins, types.intp, blocks, types.intp, x, types.intp, xs16,
                         types.intp)  # fmt: skip
        return sig, codegen

    return k_block_f32


kf_block_q2, kf_block_q3, kf_block_q4, kf_block_q5, kf_block_q6 = (
    _k_block_f32(f) for f in (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)
)
