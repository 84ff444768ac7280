"""What the 4-bit and 5-bit integer kernels do once per group of 4 interleaved rows, in
vector registers: the blocks' scales times x's with the mins' correction
(`group_scales16`), and the 16 lanes of the group's sums added into its 4 rows' results
(`put_sums4`).

As numba loops (the scales 16 at a time and the last n mod 16 one by one; the sums
stored, then loaded and added lane by lane) these cost a thread ~11 cycles a row on the
Xeon (family 6 model 167), against ~1.5 a row's block of 32 inside the loop: 40% more
on a 576-column row (SmolLM2-135M), 11% on a 2048-column one (DEVELOPERS.md). A row's 4
lanes are added ((a0 + a1) + a2) + a3, and the decode kernels and the few-vector ones
call these same functions, so they agree bit for bit."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .panels import (
    F32x16,
    I16x16,
    accumulate,
    const,
    first_lanes,
    masked_load,
    shuffle,
    splat,
    widen,
)

F32 = ir.FloatType()
F32x4 = ir.VectorType(F32, 4)
I32 = ir.IntType(32)
I64 = ir.IntType(64)


def _data(context, builder, ty, value, at=None):
    """The pointer to element `at` (flat; default 0) of a C-contiguous array."""
    data = context.make_array(ty)(context, builder, value).data
    return data if at is None else builder.gep(data, [at])


def _at(builder, ptr, i, vt):
    return builder.bitcast(builder.gep(ptr, [i]), vt.as_pointer())


def masked_store(builder, value, ptr, mask) -> None:
    """Store the lanes of value (<16 x float> or <4 x float>) that `mask` selects at ptr."""
    vt = value.type
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [vt, vt.as_pointer(), I32, mask.type]),
        f"llvm.masked.store.v{vt.count}f32.p0",
    )  # fmt: skip
    builder.call(fn, [value, ptr, const(4, I32), mask])


def _quarters(builder, v, lanes):
    """((v[l0] + v[l1]) + v[l2]) + v[l3] for each of 4 outputs, lanes(k) giving output
    i's k-th lane as a list over i; each add with a flag of its own, nsz, which allows no
    reordering: numba gives every float operation without flags the kernels' `reassoc`
    (numba.core.fastmathpass), and LLVM once vectorized a copy of such a sum as
    (a0 + a1) + (a2 + a3), 1-2 ulp from decode's (docs/performance.md)."""
    parts = [shuffle(builder, v, v, lanes(k)) for k in range(4)]
    total = builder.fadd(parts[0], parts[1], flags=["nsz"])
    total = builder.fadd(total, parts[2], flags=["nsz"])
    return builder.fadd(total, parts[3], flags=["nsz"])


@intrinsic
def group_scales16(typingctx, scales, mins, at, xd4, xs4, sc, corr):
    """For n = sc.shape[0] (a multiple of 4) and every j < n: sc[j] = float16
    scales.flat[at + j] * xd4[j]; and corr[i] = ((c[i] + c[4 + i]) + c[8 + i]) + c[12 + i]
    (i < 4) for c[l] the sum, in order of j, of float16 mins.flat[at + j] * xs4[j] over
    the j = l mod 16 (one multiply-add each). 16 at a time; the last n mod 16 in one
    masked step. scales, mins: uint16 (float16 bits); the others float32; C-contiguous."""

    def codegen(context, builder, sig, args):
        s_base = _data(context, builder, sig.args[0], args[0], args[2])
        m_base = _data(context, builder, sig.args[1], args[1], args[2])
        xd, xs, out, cr = (_data(context, builder, sig.args[k], args[k]) for k in (3, 4, 5, 6))
        n = builder.extract_value(context.make_array(sig.args[5])(context, builder,
                                                                   args[5]).shape, 0)  # fmt: skip

        def step(i, acc, mask=None):
            def load(ptr, vt):
                p = _at(builder, ptr, i, vt)
                if mask is None:
                    return builder.load(p, align=2 if vt == I16x16 else 4)
                return masked_load(builder, p, vt, mask, 2 if vt == I16x16 else 4)

            s = builder.fmul(widen(builder, load(s_base, I16x16), "f16"), load(xd, F32x16))
            p = _at(builder, out, i, F32x16)
            if mask is None:
                builder.store(s, p, align=4)
            else:
                masked_store(builder, s, p, mask)
            m = builder.fmul(widen(builder, load(m_base, I16x16), "f16"), load(xs, F32x16),
                             flags=["contract"])  # fmt: skip
            return builder.fadd(acc, m, flags=["contract"])

        full = builder.mul(builder.sdiv(n, const(16)), const(16))
        (acc,) = accumulate(builder, full, 16, 1, lambda i, a: [step(i, a[0])], "scales")
        left = builder.trunc(builder.sub(n, full), I32)
        acc = step(full, acc, first_lanes(builder, left))  # an empty mask reads nothing
        corr = _quarters(builder, acc, lambda k: [4 * k + i for i in range(4)])
        builder.store(corr, builder.bitcast(cr, F32x4.as_pointer()), align=4)

    sig = types.void(scales, mins, types.intp, xd4, xs4, sc, corr)
    return sig, codegen


@intrinsic
def put_sums4(typingctx, acc, at, extra, out, r0, nrows, add):
    """out[r0 + i] (=, or += when add) the 4 lanes acc[at + 4 i:][:4] + extra[i] for
    i < nrows (at most 4): the lanes of row i added ((a0 + a1) + a2) + a3.
    float32, C-contiguous; out's lanes past nrows untouched."""

    def codegen(context, builder, sig, args):
        a = _data(context, builder, sig.args[0], args[0], args[1])
        v = builder.load(builder.bitcast(a, F32x16.as_pointer()), align=4)
        s = _quarters(builder, v, lambda k: [4 * i + k for i in range(4)])
        e = _data(context, builder, sig.args[2], args[2])
        s = builder.fadd(s, builder.load(builder.bitcast(e, F32x4.as_pointer()), align=4),
                         flags=["nsz"])  # fmt: skip
        o = builder.bitcast(_data(context, builder, sig.args[3], args[3], args[4]),
                            F32x4.as_pointer())  # fmt: skip
        i64x4 = ir.VectorType(I64, 4)
        nrows = args[5] if args[5].type == I64 else builder.sext(args[5], I64)
        lanes = builder.icmp_signed("<", ir.Constant(i64x4, list(range(4))),
                                    splat(builder, nrows, i64x4))  # fmt: skip
        old = masked_load(builder, o, F32x4, lanes, 4)
        adding = builder.icmp_signed("!=", builder.zext(args[6], I32), const(0, I32))
        s = builder.select(adding, builder.fadd(old, s, flags=["nsz"]), s)
        masked_store(builder, s, o, lanes)

    return types.void(acc, types.intp, extra, out, types.intp, types.intp, types.boolean), codegen
