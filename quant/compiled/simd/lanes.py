"""Sixteen float32 lanes: where a loop must run across 16 lanes that LLVM would rather
unroll and reduce one by one (16 scores of a tile of keys, 16 weights of a row being
dequantized), these say it directly. Each is one load of 16 elements, at most one
conversion (vcvtph2ps for float16, vpmovsxbd + vcvtdq2ps for int8 codes), one vector
operation (vfmadd231ps, vmulps, vaddps) and one store: a zmm register on AVX-512, two ymm
on AVX2. Arrays must be C-contiguous; offsets are flat indices."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

LANES = 16


def _lanes(builder, ary, offset, kind: str):
    """Sixteen elements of `ary` from flat index `offset`, as a <16 x float>."""
    elem = {"f32": ir.FloatType(), "f16": ir.HalfType(), "i8": ir.IntType(8)}[kind]
    ptr = builder.gep(ary.data, [offset])
    v = builder.load(builder.bitcast(ptr, ir.VectorType(elem, LANES).as_pointer()), align=1)
    f32x16 = ir.VectorType(ir.FloatType(), LANES)
    if kind == "f16":
        return builder.fpext(v, f32x16)
    if kind == "i8":
        return builder.sitofp(v, f32x16)
    return v


def _splat(builder, x):
    vt = ir.VectorType(x.type, LANES)
    one = builder.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(
        one, ir.Constant(vt, ir.Undefined), ir.Constant(vt.__class__(ir.IntType(32), LANES), None)
    )


def _fma_lanes(kind: str):
    def fma16(typingctx, acc, at, a, src, offset):
        """acc.flat[at:at + 16] += a * src.flat[offset:offset + 16]: `a` a float32, or an
        array whose first 16 elements are used; src float32, float16 bits or int8 codes,
        by `kind`. Arrays must be C-contiguous."""
        scalar = isinstance(a, types.Float)

        def codegen(context, builder, sig, args):
            acc_ary = context.make_array(sig.args[0])(context, builder, args[0])
            f32x16 = ir.VectorType(ir.FloatType(), LANES).as_pointer()
            acc_ptr = builder.bitcast(builder.gep(acc_ary.data, [args[1]]), f32x16)
            if scalar:
                av = _splat(builder, args[2])
            else:
                a_ary = context.make_array(sig.args[2])(context, builder, args[2])
                av = _lanes(builder, a_ary, ir.Constant(ir.IntType(64), 0), "f32")
            src_ary = context.make_array(sig.args[3])(context, builder, args[3])
            src = _lanes(builder, src_ary, args[4], kind)
            product = builder.fmul(av, src, flags=["contract"])
            total = builder.fadd(builder.load(acc_ptr, align=4), product, flags=["contract"])
            builder.store(total, acc_ptr, align=4)

        return types.void(acc, types.intp, a, src, types.intp), codegen

    fma16.__name__ = f"fma16_{kind}"
    return intrinsic(fma16)


def _mul_lanes(kind: str):
    def mul16(typingctx, dst, at, a, src, offset):
        """dst.flat[at:at + 16] = a * src.flat[offset:offset + 16]: `a` a float32, src
        int8 codes (or float16 bits, float32), by `kind`. Arrays must be C-contiguous."""

        def codegen(context, builder, sig, args):
            dst_ary = context.make_array(sig.args[0])(context, builder, args[0])
            f32x16 = ir.VectorType(ir.FloatType(), LANES).as_pointer()
            dst_ptr = builder.bitcast(builder.gep(dst_ary.data, [args[1]]), f32x16)
            src_ary = context.make_array(sig.args[3])(context, builder, args[3])
            src = _lanes(builder, src_ary, args[4], kind)
            builder.store(builder.fmul(_splat(builder, args[2]), src), dst_ptr, align=4)

        return types.void(dst, types.intp, a, src, types.intp), codegen

    mul16.__name__ = f"mul16_{kind}"
    return intrinsic(mul16)


mul16_i8 = _mul_lanes("i8")  # dst[at:at + 16] = a * int8 codes[offset:offset + 16]


def _nibble_lanes(high: bool):
    def nib16(typingctx, dst, at, d, m, src, offset):
        """dst.flat[at:at + 16] = d * q + m for q the low (or high) nibbles of the 16 bytes
        src.flat[offset:offset + 16] (uint8). Arrays must be C-contiguous."""

        def codegen(context, builder, sig, args):
            dst_ary = context.make_array(sig.args[0])(context, builder, args[0])
            src_ary = context.make_array(sig.args[4])(context, builder, args[4])
            i8x16 = ir.VectorType(ir.IntType(8), LANES)
            ptr = builder.bitcast(builder.gep(src_ary.data, [args[5]]), i8x16.as_pointer())
            raw = builder.load(ptr, align=1)
            if high:
                q = builder.lshr(raw, ir.Constant(i8x16, [4] * LANES))
            else:
                q = builder.and_(raw, ir.Constant(i8x16, [15] * LANES))
            f = builder.uitofp(q, ir.VectorType(ir.FloatType(), LANES))
            value = builder.fadd(
                builder.fmul(_splat(builder, args[2]), f), _splat(builder, args[3])
            )
            f32x16 = ir.VectorType(ir.FloatType(), LANES).as_pointer()
            builder.store(value, builder.bitcast(builder.gep(dst_ary.data, [args[1]]), f32x16),
                          align=4)  # fmt: skip

        return types.void(dst, types.intp, d, m, src, types.intp), codegen

    nib16.__name__ = "hi16" if high else "lo16"
    return intrinsic(nib16)


lo16 = _nibble_lanes(False)  # dst[at:at + 16] = d * (low nibbles of 16 bytes) + m
hi16 = _nibble_lanes(True)  # ... the high nibbles

fma16 = _fma_lanes("f32")  # acc[at:at + 16] += a * src[offset:offset + 16]
fma16_f16 = _fma_lanes("f16")  # ... with src float16 bits
fma16_i8 = _fma_lanes("i8")  # ... with src int8 codes


def _dst_src(context, builder, sig, args):
    """The <16 x float> pointers of (dst, at, src, src_at): dst.flat[at], src.flat[src_at]."""
    f32x16 = ir.VectorType(ir.FloatType(), LANES).as_pointer()
    d = context.make_array(sig.args[0])(context, builder, args[0])
    s = context.make_array(sig.args[2])(context, builder, args[2])
    dp = builder.bitcast(builder.gep(d.data, [args[1]]), f32x16)
    return dp, builder.bitcast(builder.gep(s.data, [args[3]]), f32x16)


@intrinsic
def add16(typingctx, dst, at, src, src_at):
    """dst.flat[at:at + 16] += src.flat[src_at:src_at + 16] (float32, C-contiguous)."""

    def codegen(context, builder, sig, args):
        dp, sp = _dst_src(context, builder, sig, args)
        total = builder.fadd(builder.load(dp, align=4), builder.load(sp, align=4))
        builder.store(total, dp, align=4)

    return types.void(dst, types.intp, src, types.intp), codegen


@intrinsic
def set16(typingctx, dst, at, src, src_at):
    """dst.flat[at:at + 16] = src.flat[src_at:src_at + 16] (float32, C-contiguous)."""

    def codegen(context, builder, sig, args):
        dp, sp = _dst_src(context, builder, sig, args)
        builder.store(builder.load(sp, align=4), dp, align=4)

    return types.void(dst, types.intp, src, types.intp), codegen


@intrinsic
def max16(typingctx, dst, at, src, src_at):
    """dst.flat[at:at + 16] = the lane-wise maximum of it and src.flat[src_at:src_at + 16]
    (float32, C-contiguous), a NaN in either kept: one compare for greater, one for NaN,
    one blend."""

    def codegen(context, builder, sig, args):
        dp, sp = _dst_src(context, builder, sig, args)
        old, new = builder.load(dp, align=4), builder.load(sp, align=4)
        take = builder.or_(
            builder.fcmp_ordered(">", new, old), builder.fcmp_unordered("uno", new, new)
        )
        builder.store(builder.select(take, new, old), dp, align=4)

    return types.void(dst, types.intp, src, types.intp), codegen


@intrinsic
def zero16(typingctx, dst, at):
    """dst.flat[at:at + 16] = 0 (float32, C-contiguous)."""

    def codegen(context, builder, sig, args):
        f32x16 = ir.VectorType(ir.FloatType(), LANES)
        d = context.make_array(sig.args[0])(context, builder, args[0])
        dp = builder.bitcast(builder.gep(d.data, [args[1]]), f32x16.as_pointer())
        builder.store(ir.Constant(f32x16, None), dp, align=4)

    return types.void(dst, types.intp), codegen


def _vv(kind: str, accumulate: bool):
    def vv(typingctx, dst, at, a, a_at, b, b_at):
        """dst.flat[at:at + 16] (+)= a.flat[a_at:a_at + 16] * b.flat[b_at:b_at + 16]: dst
        and b float32, a float32 or float16 bits by `kind`; `accumulate`: += or =."""

        def codegen(context, builder, sig, args):
            def ary(k: int):
                return context.make_array(sig.args[k])(context, builder, args[k])

            f32x16 = ir.VectorType(ir.FloatType(), LANES).as_pointer()
            dp = builder.bitcast(builder.gep(ary(0).data, [args[1]]), f32x16)
            a_val, b_val = (
                _lanes(builder, ary(2), args[3], kind),
                _lanes(builder, ary(4), args[5], "f32"),
            )
            product = builder.fmul(a_val, b_val, flags=["contract"])
            if accumulate:
                product = builder.fadd(builder.load(dp, align=4), product, flags=["contract"])
            builder.store(product, dp, align=4)

        return types.void(dst, types.intp, a, types.intp, b, types.intp), codegen

    vv.__name__ = ("fma16" if accumulate else "mul16") + ("_f16v" if kind == "f16" else "vv")
    return intrinsic(vv)


fma16_f16v = _vv("f16", True)  # acc[at:at + 16] += float16 a[a_at:a_at + 16] * b[b_at:...]
mul16_f16v = _vv("f16", False)  # dst[at:at + 16] = float16 a[...] * b[...]


def _row_lanes(builder, context, sig, args, kind: str):
    """16 weights of row args[1] of the 2-D C-contiguous args[0] from column args[2], as
    <16 x float>: float32, or float16 / bfloat16 bit patterns (uint16) widened."""
    ary = context.make_array(sig.args[0])(context, builder, args[0])
    width = builder.extract_value(ary.shape, 1)
    r, j = (v if v.type == width.type else builder.sext(v, width.type) for v in args[1:3])
    ptr = builder.gep(ary.data, [builder.add(builder.mul(r, width), j)])
    f32x16 = ir.VectorType(ir.FloatType(), LANES)
    if kind == "f32":
        return builder.load(builder.bitcast(ptr, f32x16.as_pointer()), align=4)
    bits = builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(16), LANES).as_pointer()),
                        align=2)  # fmt: skip
    if kind == "f16":
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), LANES)), f32x16)
    wide = builder.shl(builder.zext(bits, ir.VectorType(ir.IntType(32), LANES)),
                       ir.Constant(ir.VectorType(ir.IntType(32), LANES), [16] * LANES))  # fmt: skip
    return builder.bitcast(wide, f32x16)


def _row_fma_n(kind: str):
    def fma16_row_n(typingctx, w, r, j, x, vs, acc, at):
        """For each vector k of vs (a tuple of rows of the 2-D C-contiguous float32 x):
        acc[at + 16 k : at + 16 k + 16] += w[r, j:j + 16] * x[vs[k], j:j + 16]. The
        weights are loaded (and widened: `kind` f32, f16, bf16) once for every vector."""

        def codegen(context, builder, sig, args):
            lanes = _row_lanes(builder, context, sig, args, kind)
            f32x16 = ir.VectorType(ir.FloatType(), LANES)
            xa = context.make_array(sig.args[3])(context, builder, args[3])
            width = builder.extract_value(xa.shape, 1)
            acc = context.make_array(sig.args[5])(context, builder, args[5])
            j = args[2] if args[2].type == width.type else builder.sext(args[2], width.type)
            for k in range(sig.args[4].count):
                v = builder.extract_value(args[4], k)
                v = v if v.type == width.type else builder.sext(v, width.type)
                xp = builder.gep(xa.data, [builder.add(builder.mul(v, width), j)])
                xv = builder.load(builder.bitcast(xp, f32x16.as_pointer()), align=4)
                at = builder.add(args[6], ir.Constant(args[6].type, LANES * k))
                ap = builder.bitcast(builder.gep(acc.data, [at]), f32x16.as_pointer())
                total = builder.fadd(builder.load(ap, align=4),
                                     builder.fmul(lanes, xv, flags=["contract"]),
                                     flags=["contract"])  # fmt: skip
                builder.store(total, ap, align=4)

        return types.void(w, types.intp, types.intp, x, vs, acc, types.intp), codegen

    fma16_row_n.__name__ = f"fma16_row_n_{kind}"
    return intrinsic(fma16_row_n)


# rows of float weights times several vectors (fewdot.rows_float)
fma16_row_n_f32, fma16_row_n_f16, fma16_row_n_bf16 = (_row_fma_n(k) for k in ("f32", "f16", "bf16"))
