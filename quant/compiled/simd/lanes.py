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

from .panels import I16x16, accumulate, first_lanes, masked_load, widen

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


def _masked(builder, ptr, kind: str, mask):
    """16 elements at ptr as <16 x float> (`kind`: float32, float16 or bfloat16 bits),
    only the lanes of `mask` (<16 x i1>) read and the others zero; all when mask is None."""
    vt = ir.VectorType(ir.FloatType(), LANES) if kind == "f32" else I16x16
    p = builder.bitcast(ptr, vt.as_pointer())
    if mask is None:
        v = builder.load(p, align=4 if kind == "f32" else 2)
    else:
        v = masked_load(builder, p, vt, mask)
    return v if kind == "f32" else widen(builder, v, kind)


def _i64(builder, v):
    return v if v.type == I64 else builder.sext(v, I64)


I64 = ir.IntType(64)


def _hsum(builder, v):
    """The 16 lanes of v added as a tree: halves, then quarters, down to one float."""
    width = LANES
    while width > 1:
        width //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                      list(range(width))))  # fmt: skip
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                      list(range(width, 2 * width))))  # fmt: skip
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))


def _fma(builder, a, b, c):
    """a * b + c rounded once (llvm.fma), whatever the optimizer would contract."""
    vt = a.type
    name = f"llvm.fma.v{vt.count}f32"
    fn = builder.module.globals.get(name) or ir.Function(
        builder.module, ir.FunctionType(vt, [vt] * 3), name
    )
    return builder.call(fn, [a, b, c])


def _rows_fma_n(kind: str, rows: int):
    unroll = 2 if rows == 1 else 1  # 16-lane sums per row and vector

    def fma16_rows_n(typingctx, w, r, nr, x, vs, acc):
        """acc[n i + k] = w[r + i] . x[vs[k]] for the rows i < nr (at most `rows`; the
        others read row r and are not to be used) of the 2-D C-contiguous `w` (`kind`:
        float32, or float16 / bfloat16 bits widened) and the n vectors k of vs (rows of
        the float32 x): one loop with the accumulators of 16 lanes in registers, each
        weight loaded once for every vector, the columns past the last 16 (32 for one
        row) in one masked step, then each sum's lanes added as a tree. One row keeps two
        sums of 16 lanes, alternate columns' (8 chains of FMAs for 4 vectors, where 4 would
        wait on the FMA's latency). Each row's and vector's sum is the same whichever
        vectors are beside it: each step an explicit fused multiply-add (llvm.fma), where
        an fmul and fadd allowed to contract were fused for some vectors and not others on
        AVX2 (16-bit weights, Zen 3). (A loop of one-row calls left the accumulators in memory,
        a load and a store around every FMA, read in the assembly; and a scalar loop over
        the last columns summed them in a different order for 4 vectors than for 1, LLVM
        vectorizing the other way.)"""

        def codegen(context, builder, sig, args):
            wa = context.make_array(sig.args[0])(context, builder, args[0])
            xa = context.make_array(sig.args[3])(context, builder, args[3])
            acc = context.make_array(sig.args[5])(context, builder, args[5])
            cols = builder.extract_value(wa.shape, 1)
            r, nr = (_i64(builder, v) for v in args[1:3])
            n = sig.args[4].count
            wrows = []
            for i in range(rows):
                ok = builder.icmp_signed("<", ir.Constant(I64, i), nr)
                row = builder.add(r, builder.select(ok, ir.Constant(I64, i), ir.Constant(I64, 0)))
                wrows.append(builder.gep(wa.data, [builder.mul(row, cols)]))
            xwidth = builder.extract_value(xa.shape, 1)
            xrows = []
            for k in range(n):
                v = _i64(builder, builder.extract_value(args[4], k))
                xrows.append(builder.gep(xa.data, [builder.mul(v, xwidth)]))

            def step(j, accs, masks=(None,) * unroll):
                """accs: per 16-column part u, then row i, then vector k."""
                new = []
                for u, mask in enumerate(masks):
                    at = builder.add(j, ir.Constant(I64, LANES * u))
                    xs = [_masked(builder, builder.gep(p, [at]), "f32", mask) for p in xrows]
                    for i in range(rows):
                        lanes = _masked(builder, builder.gep(wrows[i], [at]), kind, mask)
                        for k in range(n):
                            a = accs[(u * rows + i) * n + k]
                            new.append(_fma(builder, lanes, xs[k], a))
                return new

            span = LANES * unroll
            full = builder.mul(builder.sdiv(cols, ir.Constant(I64, span)), ir.Constant(I64, span))
            sums = accumulate(builder, full, span, unroll * rows * n, step, "rows_n")
            left = builder.trunc(builder.sub(cols, full), ir.IntType(32))
            masks = [first_lanes(builder, builder.sub(left, ir.Constant(left.type, LANES * u)))
                     for u in range(unroll)]  # fmt: skip
            tail = step(full, sums, masks)  # an empty mask reads nothing
            merged = []
            for u in range(unroll):
                some = builder.icmp_signed(">", left, ir.Constant(left.type, LANES * u))
                part = slice(u * rows * n, (u + 1) * rows * n)
                merged.append([builder.select(some, t, v)
                               for t, v in zip(tail[part], sums[part], strict=True)])  # fmt: skip
            totals = merged[0]
            for more in merged[1:]:
                totals = [builder.fadd(a, b) for a, b in zip(totals, more, strict=True)]
            for at, value in enumerate(totals):
                builder.store(_hsum(builder, value), builder.gep(acc.data, [ir.Constant(I64, at)]))

        return types.void(w, types.intp, types.intp, x, vs, acc), codegen

    fma16_rows_n.__name__ = f"fma16_rows{rows}_n_{kind}"
    return intrinsic(fma16_rows_n)


# a group of 4 rows of float weights, or one row, times several vectors (fewdot.rows_float)
KINDS = ("f32", "f16", "bf16")
fma16_rows_n_f32, fma16_rows_n_f16, fma16_rows_n_bf16 = (_rows_fma_n(k, 4) for k in KINDS)
fma16_row_n_f32, fma16_row_n_f16, fma16_row_n_bf16 = (_rows_fma_n(k, 1) for k in KINDS)
