"""Integer SIMD: the byte dot products of the int8-activation kernels (intdot.py), written
as LLVM vector instructions, on the instruction the CPU has (simd/__init__.py decides).

The product of one block of 32 weights of 4 rows with one block of x rounded to int8 is
16 int32 lanes, 4 per row (a row's dot product is the sum of its 4 lanes). Where it comes
from, by CPU:

- AVX-512 VNNI: `vpdpbusd`, 64 byte products summed 4 by 4 into 16 int32 lanes, in one
  instruction. Its first operand is unsigned: 4-bit codes are; int8 codes q are read as
  q + 128 (one xor) and 128 sum(x) is taken off after.
- AVX2 without VNNI (e.g. Zen 3): `vpmaddubsw` (pairs of byte products summed into int16,
  saturating) then `vpmaddwd` by ones (pairs of int16 into int32): the same lanes in
  two instructions per 32 bytes. No int16 pair can saturate: 4-bit codes are at most 15,
  and int8 codes go in as |q| with q's sign moved onto x (|x| <= 127, so a pair is at
  most 2 * 128 * 127 < 32768).
- neither (a portable build, NUMBA_CPU_NAME=x86-64): the same sums in plain LLVM integer
  vector code, which LLVM lowers to what the target has.

x rounded to int16 instead (dot "int16": v = rint(x 16256 / max|x|) per block) goes in as
two byte vectors, v = 128 h + l (h in -127..127, l in -64..63, intdot.quantize_x), each
multiplied by the same codes: (c . h) << 7 + (c . l) = c . v, exact in int32. Every
intrinsic here takes `lo`, where x's low bytes lie after its high ones (0: x is int8,
no low bytes); the kernels branch on it once per block.

"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from . import AVX2, VNNI

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
I8x64, I32x16 = ir.VectorType(I8, 64), ir.VectorType(I32, 16)
F32x16 = ir.VectorType(ir.FloatType(), 16)


def _call(builder, name: str, ret, args):
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ret, [a.type for a in args]), name
    )
    return builder.call(fn, args)


def _part(builder, v, n: int, k: int):
    """Part k of n equal parts of vector v."""
    size = v.type.count // n
    mask = ir.Constant(ir.VectorType(I32, size), list(range(k * size, (k + 1) * size)))
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), mask)


def concat(builder, a, b):
    """Two <n x T> -> <2n x T>."""
    n = a.type.count
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n))))


def dot_u8(builder, u, s, init=None):
    """<16 x i32>: lane l = sum over k < 4 of u[4l + k] * s[4l + k], u unsigned bytes, s
    signed (<64 x i8> each), plus init's lane l (a <16 x i32>, or none). Exact when no pair
    u s + u' s' leaves int16 (AVX2), as the callers ensure (module docstring)."""
    if init is not None:
        return dot_u8_add(builder, init, u, s)
    if VNNI:
        return _call(builder, "llvm.x86.avx512.vpdpbusd.512", I32x16,
                     [ir.Constant(I32x16, None), u, s])  # fmt: skip
    if not AVX2:
        wide = ir.VectorType(I32, 64)
        products = builder.mul(builder.zext(u, wide), builder.sext(s, wide))
        lanes = ir.VectorType(I32, 16)
        quarters = [builder.shuffle_vector(products, ir.Constant(wide, ir.Undefined),
                                           ir.Constant(lanes, [4 * j + k for j in range(16)]))
                    for k in range(4)]  # fmt: skip
        return builder.add(builder.add(quarters[0], quarters[1]),
                           builder.add(quarters[2], quarters[3]))  # fmt: skip
    ones = ir.Constant(ir.VectorType(I16, 16), [1] * 16)
    parts = []
    for k in range(2):
        pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(I16, 16),
                      [_part(builder, u, 2, k), _part(builder, s, 2, k)])  # fmt: skip
        parts.append(_call(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(I32, 8), [pairs, ones]))
    return concat(builder, parts[0], parts[1])


def dot_i8(builder, q, s, init=None):
    """dot_u8 for signed bytes q (int8 codes, -128..127) and s (x, -127..127). On VNNI q is
    read as q + 128, so the caller takes 128 sum(s) off each row's total (q8_block)."""
    if VNNI:
        return dot_u8(builder, builder.xor(q, ir.Constant(I8x64, [-128] * 64)), s, init)
    zero = ir.Constant(I8x64, None)
    negative = builder.icmp_signed("<", q, zero)
    magnitude = builder.select(negative, builder.sub(zero, q), q)  # -128 -> 128 unsigned
    return dot_u8(builder, magnitude, builder.select(negative, builder.sub(zero, s), s), init)


def _load(builder, context, sig, args, k: int, at: int, vt):
    ary = context.make_array(sig.args[k])(context, builder, args[k])
    ptr = builder.gep(ary.data, [args[at]])
    return builder.load(builder.bitcast(ptr, vt.as_pointer()), align=1)


def _repeat(builder, v, times: int):
    """v (<n x i8>) repeated `times` times: one broadcast from memory."""
    n = v.type.count
    mask = ir.Constant(ir.VectorType(I32, n * times), [j % n for j in range(n * times)])
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), mask)


def _spread_f16(builder, context, sig, args, k: int, at: int):
    """<16 x float>: the 4 float16 scales src[at:at + 4], each over its row's 4 lanes."""
    d = builder.fpext(_load(builder, context, sig, args, k, at, ir.VectorType(ir.HalfType(), 4)),
                      ir.VectorType(ir.FloatType(), 4))  # fmt: skip
    mask = ir.Constant(ir.VectorType(I32, 16), [j // 4 for j in range(16)])
    return builder.shuffle_vector(d, ir.Constant(d.type, ir.Undefined), mask)


def _splat_f32(builder, v):
    """<16 x float>: the float32 v in every lane."""
    one = builder.insert_element(
        ir.Constant(ir.VectorType(ir.FloatType(), 1), ir.Undefined), v, ir.Constant(I32, 0)
    )
    return _repeat(builder, one, 16)


def _add_into(builder, ptr, lanes, scale):
    """*ptr (16 float32 lanes) += float(lanes) * scale."""
    ptr = builder.bitcast(ptr, F32x16.as_pointer())
    product = builder.fmul(builder.sitofp(lanes, F32x16), scale, flags=["contract"])
    builder.store(
        builder.fadd(builder.load(ptr, align=4), product, flags=["contract"]), ptr, align=4
    )


def element_at(builder, context, aryty, value, i, j):
    """The address of element [i, j] of a 2-D C-contiguous array."""
    ary = context.make_array(aryty)(context, builder, value)
    width = builder.extract_value(ary.shape, 1)
    i, j = (v if v.type == width.type else builder.sext(v, width.type) for v in (i, j))
    return builder.gep(ary.data, [builder.add(builder.mul(i, width), j)])


def vectors(builder, sig, args, k: int) -> list:
    """The vectors' rows named by argument k, a tuple of integers (its length is the
    kernel's count of vectors, known when it is compiled)."""
    return [builder.extract_value(args[k], j) for j in range(sig.args[k].count)]


def at_offset(builder, context, sig, args, k: int, at: int, offset: int):
    """The address of argument k's element args[at] + offset (a 1-D array)."""
    ary = context.make_array(sig.args[k])(context, builder, args[k])
    return builder.gep(ary.data, [builder.add(args[at], ir.Constant(args[at].type, offset))])


def with_low(builder, lo, lanes, low):
    """lanes (a list of <16 x i32>), the dot products with x's high bytes; where lo != 0
    (x rounded to int16), each (lanes << 7) + the same dot products with x's low bytes, lo
    bytes on: low(inits) computes those, each summed into its inits[i] (the shifted
    lanes: the multiply-adds accumulate into them, no separate add). One branch for the
    whole list."""
    before = builder.block
    with builder.if_then(builder.icmp_signed("!=", lo, ir.Constant(lo.type, 0)), likely=True):
        seven = ir.Constant(I32x16, [7] * 16)
        both = low([builder.shl(h, seven) for h in lanes])
        wide = builder.block
    merged = []
    for h, b in zip(lanes, both, strict=True):
        merged.append(builder.phi(I32x16))
        merged[-1].add_incoming(h, before)
        merged[-1].add_incoming(b, wide)
    return merged


def _bytes_at(builder, ptr, n: int, offset: int = 0):
    if offset:
        ptr = builder.gep(ptr, [ir.Constant(I32, offset)])
    return builder.load(builder.bitcast(ptr, ir.VectorType(I8, n).as_pointer()), align=1)


def _splat_i32(builder, v):
    one = builder.insert_element(
        ir.Constant(ir.VectorType(I32, 1), ir.Undefined), v, ir.Constant(I32, 0)
    )
    return _repeat(builder, one, 16)


def _q8_into(builder, first, second, xs, lo, xsums, d, xds, accs):
    """One q8_0 block of 4 grouped rows (codes: `first` rows 0-1, `second` rows 2-3, as
    <64 x i8>) times the block of each vector: its x bytes at xs[j] (low bytes lo on), its
    sum xsums[j] (i32) and scale xds[j] (float), into the 16 float lanes at accs[j]; d:
    the rows' float16 scales spread (_spread_f16). The codes are loaded once for every
    vector; one branch on lo for all of them."""

    def dots(ptrs, inits=None):  # two lane vectors for each x: rows 0,1 | 2,3
        inits = inits or [None] * (2 * len(ptrs))
        out = []
        for j, at in enumerate(ptrs):
            x = _repeat(builder, _bytes_at(builder, at, 32), 2)
            out += [dot_i8(builder, first, x, inits[2 * j]),
                    dot_i8(builder, second, x, inits[2 * j + 1])]  # fmt: skip
        return out

    lanes = with_low(builder, lo, dots(xs), lambda i: dots([builder.gep(h, [lo]) for h in xs], i))
    lo_lanes = [8 * (j // 4) + j % 4 for j in range(16)]  # lanes 0-3 of each row's 8
    hi_lanes = [j + 4 for j in lo_lanes]
    pick = ir.VectorType(I32, 16)
    for j, acc in enumerate(accs):
        a, b = lanes[2 * j], lanes[2 * j + 1]
        folded = builder.add(builder.shuffle_vector(a, b, ir.Constant(pick, lo_lanes)),
                             builder.shuffle_vector(a, b, ir.Constant(pick, hi_lanes)))  # fmt: skip
        if VNNI:  # each row counted 128 sum(x) too: 32 sum(x) per lane
            bias = builder.mul(xsums[j], ir.Constant(I32, 32))
            folded = builder.sub(folded, _splat_i32(builder, bias))
        _add_into(builder, acc, folded, builder.fmul(d, _splat_f32(builder, xds[j])))


def _q8_codes(builder, context, sig, args):
    """The two <64 x i8> of a q8_0 block of 4 rows: codes (argument 1) from args[2]."""
    first = _load(builder, context, sig, args, 1, 2, I8x64)
    second = builder.load(builder.bitcast(at_offset(builder, context, sig, args, 1, 2, 64),
                                          I8x64.as_pointer()), align=1)  # fmt: skip
    return first, second


@intrinsic
def q8_block(typingctx, acc, codes, co, xq, xo, xsum, scales, so, xd, lo):
    """acc[0:16] += (the dot products of one q8_0 block of 4 grouped rows, codes[co:co +
    128] (uint8 holding int8, row after row), with x's block at xq[xo:xo + 32] (and its
    low bytes lo on: module docstring)) in 4 lanes per row, times scales[so + row]
    (float16 bits) * xd. xsum: the block's sum of x's integers (int32).
    Two dot_i8 (rows 0-1, rows 2-3), then their 8 lanes per row folded to 4."""

    def codegen(context, builder, sig, args):
        lo = args[9]
        high = at_offset(builder, context, sig, args, 3, 4, 0)  # x's high bytes
        first, second = _q8_codes(builder, context, sig, args)
        acc = context.make_array(sig.args[0])(context, builder, args[0]).data
        d = _spread_f16(builder, context, sig, args, 6, 7)
        _q8_into(builder, first, second, [high], lo, [args[5]], d, [args[8]], [acc])

    sig = types.void(acc, codes, types.intp, xq, types.intp, types.int32, scales, types.intp,
                     types.float32, types.intp)  # fmt: skip
    return sig, codegen


@intrinsic
def q8_block_n(typingctx, acc, codes, co, xq, vs, xo, xsum, b, scales, so, xd, lo):
    """q8_block for several vectors, each block of codes loaded and decoded once: vector j
    is row vs[j] (vs a tuple) of xq (its block at xo), xsum and xd (2-D; block b), into
    acc[16 j:16 j + 16]."""

    def codegen(context, builder, sig, args):
        lo, rows = args[11], vectors(builder, sig, args, 4)
        first, second = _q8_codes(builder, context, sig, args)
        acc = context.make_array(sig.args[0])(context, builder, args[0]).data
        d = _spread_f16(builder, context, sig, args, 8, 9)

        def each(k, at):
            return [element_at(builder, context, sig.args[k], args[k], v, at) for v in rows]

        xsums = [builder.load(p) for p in each(6, args[7])]
        xds = [builder.load(p) for p in each(10, args[7])]
        accs = [builder.gep(acc, [ir.Constant(I32, 16 * j)]) for j in range(len(rows))]
        _q8_into(builder, first, second, each(3, args[5]), lo, xsums, d, xds, accs)

    sig = types.void(acc, codes, types.intp, xq, vs, types.intp, xsum, types.intp, scales,
                     types.intp, xd, types.intp)  # fmt: skip
    return sig, codegen


def _fifth_bits(builder, context, sig, args, k: int, at: int, high: bool):
    """<64 x i8>: 16 where the fifth bit of a q5 code is set, else 0, for the low (element
    j, bit j) or high (element j + 16, bit j + 16) half of 4 rows' blocks: their 4 uint32
    bit words at src[at:at + 4], one byte shuffle, one test per lane."""
    words = _load(builder, context, sig, args, k, at, ir.VectorType(I8, 16))
    first = 2 if high else 0
    where = [4 * (lane // 16) + first + lane % 16 // 8 for lane in range(64)]
    spread = builder.shuffle_vector(
        words, ir.Constant(words.type, ir.Undefined), ir.Constant(ir.VectorType(I32, 64), where)
    )
    bit = builder.and_(spread, ir.Constant(I8x64, [1 << (lane % 8) for lane in range(64)]))
    zero = ir.Constant(I8x64, None)
    return builder.select(
        builder.icmp_unsigned("!=", bit, zero), ir.Constant(I8x64, [16] * 64), zero
    )


def dot_u8_add(builder, acc, u, s):
    """acc + dot_u8(u, s): on VNNI one `vpdpbusd` into acc itself."""
    if VNNI:
        return _call(builder, "llvm.x86.avx512.vpdpbusd.512", I32x16, [acc, u, s])
    return builder.add(acc, dot_u8(builder, u, s))


def _spread(builder, context, sig, args, k: int, at: int):
    """<16 x float>: the 4 float32 src[at:at + 4], each over its row's 4 lanes."""
    v = _load(builder, context, sig, args, k, at, ir.VectorType(ir.FloatType(), 4))
    mask = ir.Constant(ir.VectorType(I32, 16), [j // 4 for j in range(16)])
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), mask)


def _nibble_codes(builder, context, sig, args, five: bool):
    """The two <64 x i8> code vectors of a 4-bit block of 4 rows (codes: argument 1 from
    args[2]): elements 0-15 (the low nibbles) and 16-31 (the high ones), each with its
    fifth bit (bit words: arguments 3 and 4) when `five`."""
    v = _load(builder, context, sig, args, 1, 2, I8x64)
    low = builder.and_(v, ir.Constant(I8x64, [15] * 64))
    high = builder.lshr(v, ir.Constant(I8x64, [4] * 64))
    if five:
        low = builder.or_(low, _fifth_bits(builder, context, sig, args, 3, 4, False))
        high = builder.or_(high, _fifth_bits(builder, context, sig, args, 3, 4, True))
    return low, high


def _nibble_into(builder, low, high, xs, lo, scs, accs):
    """The 4-bit block (_nibble_codes) times each vector's block at xs[j] (low bytes lo
    on), times its rows' scales scs[j] (<16 x float>), into the lanes at accs[j]."""

    def dots(ptrs, inits=None):  # elements 0-15 by the low nibbles, 16-31 by the high ones
        inits = inits or [None] * len(ptrs)
        out = []
        for at, init in zip(ptrs, inits, strict=True):
            first = _repeat(builder, _bytes_at(builder, at, 16), 4)
            second = _repeat(builder, _bytes_at(builder, at, 16, 16), 4)
            out.append(dot_u8_add(builder, dot_u8(builder, low, first, init), high, second))
        return out

    lanes = with_low(builder, lo, dots(xs), lambda i: dots([builder.gep(h, [lo]) for h in xs], i))
    for j, acc in enumerate(accs):
        _add_into(builder, acc, lanes[j], scs[j])


def _nibble_dot(builder, context, sig, args, five: bool):
    """The codegen of q4_dot and q5_dot (five: its bit words are arguments 3 and 4, and
    the arguments after them shift by two)."""
    low, high = _nibble_codes(builder, context, sig, args, five)
    k = 5 if five else 3
    lo = args[k + 4]
    x_high = at_offset(builder, context, sig, args, k, k + 1, 0)
    acc = context.make_array(sig.args[0])(context, builder, args[0]).data
    sc = _spread(builder, context, sig, args, k + 2, k + 3)
    _nibble_into(builder, low, high, [x_high], lo, [sc], [acc])


def _nibble_dot_n(builder, context, sig, args, five: bool):
    """The codegen of q4_dot_n and q5_dot_n (arguments as _nibble_dot's, vs after xq)."""
    low, high = _nibble_codes(builder, context, sig, args, five)
    k = 5 if five else 3
    lo, rows = args[k + 5], vectors(builder, sig, args, k + 1)
    xs = [element_at(builder, context, sig.args[k], args[k], v, args[k + 2]) for v in rows]
    acc = context.make_array(sig.args[0])(context, builder, args[0]).data
    mask = ir.Constant(ir.VectorType(I32, 16), [j // 4 for j in range(16)])
    scs, accs = [], []
    for j in range(len(rows)):
        at = element_at(builder, context, sig.args[k + 3], args[k + 3], ir.Constant(I32, j),
                        args[k + 4])  # fmt: skip
        four = builder.load(builder.bitcast(at, ir.VectorType(ir.FloatType(), 4).as_pointer()),
                            align=1)  # fmt: skip
        scs.append(builder.shuffle_vector(four, ir.Constant(four.type, ir.Undefined), mask))
        accs.append(builder.gep(acc, [ir.Constant(I32, 16 * j)]))
    _nibble_into(builder, low, high, xs, lo, scs, accs)


@intrinsic
def q4_dot(typingctx, acc, codes, co, xq, xo, sc, so, lo):
    """acc[0:16] += (the dot products of one 4-bit block of 4 grouped rows, codes[co:co +
    64] (16 bytes a row: element j in the low nibble of byte j, j + 16 in the high one),
    with x's block at xq[xo:xo + 32] (and its low bytes lo on)) in 4 lanes per row,
    times sc[so + row] (float32: the block's scale times x's). Codes as stored (0..15):
    a format's offset or min is the caller's (intdot.rows_q4 adds it once per row, in
    float)."""

    def codegen(context, builder, sig, args):
        _nibble_dot(builder, context, sig, args, False)

    return types.void(acc, codes, types.intp, xq, types.intp, sc, types.intp, types.intp), codegen


@intrinsic
def q5_dot(typingctx, acc, codes, co, bits, bo, xq, xo, sc, so, lo):
    """q4_dot for q5_0 / q5_1: each code's fifth bit from the rows' uint32 words
    bits[bo:bo + 4] (bit j: element j); codes as stored (0..31)."""

    def codegen(context, builder, sig, args):
        _nibble_dot(builder, context, sig, args, True)

    sig = types.void(acc, codes, types.intp, bits, types.intp, xq, types.intp, sc, types.intp,
                     types.intp)  # fmt: skip
    return sig, codegen


@intrinsic
def q4_dot_n(typingctx, acc, codes, co, xq, vs, xo, sc, so, lo):
    """q4_dot for several vectors, the codes decoded once: vector j is row vs[j] of xq (a
    2-D array, its block at xo), times row j of sc (2-D) from so, into acc[16 j:16 j + 16]."""

    def codegen(context, builder, sig, args):
        _nibble_dot_n(builder, context, sig, args, False)

    sig = types.void(acc, codes, types.intp, xq, vs, types.intp, sc, types.intp, types.intp)
    return sig, codegen


@intrinsic
def q5_dot_n(typingctx, acc, codes, co, bits, bo, xq, vs, xo, sc, so, lo):
    """q5_dot for several vectors (q4_dot_n's arguments, the bit words after co)."""

    def codegen(context, builder, sig, args):
        _nibble_dot_n(builder, context, sig, args, True)

    sig = types.void(acc, codes, types.intp, bits, types.intp, xq, vs, types.intp, sc,
                     types.intp, types.intp)  # fmt: skip
    return sig, codegen


# --- x rounded to integers (intdot.quantize_x), one block of 32 values at a time

F32 = ir.FloatType()
ABS = ir.Constant(I32x16, [0x7FFFFFFF] * 16)
INF_BITS = 0x7F800000  # the bits of +infinity: |x|'s bits below them iff x is finite
I8x16 = ir.VectorType(I8, 16)


def _i32(n: int):
    return ir.Constant(I32, n)


@intrinsic
def quantize_block(typingctx, x, xq, xd, xsum, b, lo):
    """Block b of x (32 float32) rounded as intdot.quantize_x rounds it: q = rint(x top /
    max|x|) into xq (int16: high bytes h = (q + 64) >> 7, low ones q - 128 h lo further
    on), xd[b] = max|x| / top, xsum[b] = sum(q); top 16256 when lo, else 127. A block with
    NaN or infinity: q = 0 and xd[b] NaN. max|x| is the largest of the values' bits with the
    sign cleared (the same order as the floats for finite values, and infinity and NaN
    above them all): vpandd, vpmaxud, vmulps, vrndscaleps, vcvttps2dq. Arrays C-contiguous."""
    if not all(isinstance(a, types.Array) and a.layout == "C" for a in (x, xq, xd, xsum)):
        return None

    def codegen(context, builder, sig, args):
        x_, xq_, xd_, xsum_ = (context.make_array(t)(context, builder, a).data
                               for t, a in zip(sig.args[:4], args[:4], strict=True))  # fmt: skip
        b_, lo_ = args[4:]
        at = builder.mul(b_, ir.Constant(b_.type, 32))
        xs = [_load_f32x16(builder, builder.gep(x_, [_plus(builder, at, 16 * k)]))
              for k in range(2)]  # fmt: skip
        bits = [builder.and_(builder.bitcast(v, I32x16), ABS) for v in xs]
        top_bits = _call(builder, "llvm.vector.reduce.umax.v16i32", I32,
                         [_call(builder, "llvm.umax.v16i32", I32x16, bits)])  # fmt: skip
        finite = builder.icmp_unsigned("<", top_bits, _i32(INF_BITS))
        amax = builder.bitcast(top_bits, F32)
        wide = builder.icmp_signed("!=", lo_, ir.Constant(lo_.type, 0))
        top = builder.select(wide, ir.Constant(F32, 16256.0), ir.Constant(F32, 127.0))
        qs = _rounded(builder, xs, finite, amax, top)
        total = _call(builder, "llvm.vector.reduce.add.v16i32", I32, [builder.add(*qs)])
        _store_codes(builder, xq_, at, lo_, wide, qs)
        nan = ir.Constant(F32, float("nan"))
        builder.store(builder.select(finite, builder.fdiv(amax, top), nan),
                      builder.gep(xd_, [b_]))  # fmt: skip
        builder.store(total, builder.gep(xsum_, [b_]))
        return context.get_dummy_value()

    return types.void(x, xq, xd, xsum, types.intp, types.intp), codegen


def _plus(builder, i, n: int):
    return builder.add(i, ir.Constant(i.type, n))


def _rounded(builder, xs, finite, amax, top) -> list:
    """The <16 x i32> rint(x top / amax) of each <16 x float> in xs, zeros unless finite
    (and for a block of zeros: amax 0)."""
    usable = builder.and_(finite, builder.fcmp_ordered(">", amax, ir.Constant(F32, 0.0)))
    inv = builder.select(usable, builder.fdiv(top, amax), ir.Constant(F32, 0.0))
    inv16 = _splat_f32(builder, inv)
    zero = ir.Constant(I32x16, None)
    out = []
    for v in xs:
        r = _call(builder, "llvm.rint.v16f32", F32x16, [builder.fmul(v, inv16)])
        out.append(builder.select(finite, builder.fptosi(r, I32x16), zero))
    return out


def _load_f32x16(builder, ptr):
    return builder.load(builder.bitcast(ptr, F32x16.as_pointer()), align=4)


def _store_codes(builder, xq, at, lo, wide, qs):
    """The block's integers q (two <16 x i32>) into xq from `at`: as int8, or where `wide`
    as high bytes h = (q + 64) >> 7 and, lo further on, low ones q - 128 h."""
    seven = ir.Constant(I32x16, [7] * 16)
    for k, q in enumerate(qs):
        h = builder.select(wide, builder.ashr(builder.add(q, ir.Constant(I32x16, [64] * 16)),
                                              seven), q)  # fmt: skip
        p = builder.gep(xq, [_plus(builder, at, 16 * k)])
        builder.store(builder.trunc(h, I8x16), builder.bitcast(p, I8x16.as_pointer()), align=1)
        with builder.if_then(wide):
            low = builder.sub(q, builder.shl(h, seven))
            p = builder.gep(p, [lo])
            builder.store(builder.trunc(low, I8x16), builder.bitcast(p, I8x16.as_pointer()),
                          align=1)  # fmt: skip


@intrinsic
def sum16(typingctx, xq, at, lo):
    """The sum of the 16 integers of x from xq[at] as quantize_block stores them: int8, or
    where lo != 0, 128 h + l with l lo further on (vpmovsxbd, vpslld, vpaddd)."""
    if not (isinstance(xq, types.Array) and xq.layout == "C"):
        return None

    def codegen(context, builder, sig, args):
        xq_, at_, lo_ = args
        p = builder.gep(context.make_array(sig.args[0])(context, builder, xq_).data, [at_])
        h = builder.sext(builder.load(builder.bitcast(p, I8x16.as_pointer()), align=1), I32x16)
        low = builder.load(builder.bitcast(builder.gep(p, [lo_]), I8x16.as_pointer()), align=1)
        wide = builder.icmp_signed("!=", lo_, ir.Constant(lo_.type, 0))
        v = builder.select(wide, builder.add(builder.shl(h, ir.Constant(I32x16, [7] * 16)),
                                             builder.sext(low, I32x16)), h)  # fmt: skip
        return _call(builder, "llvm.vector.reduce.add.v16i32", I32, [v])

    return types.int32(xq, types.intp, types.intp), codegen
