"""The machine's arithmetic ceilings, measured with the instructions the kernels use: int8
multiply-adds by the integer products' own byte dot (simd/int8.dot_u8_add: vpdpbusd on
AVX-512 VNNI, vpmaddubsw on AVX2), and float32 fused multiply-adds on 16 lanes (the float
kernels' vectors). Each thread runs CHAINS independent accumulators in registers, so
neither memory nor a dependency chain limits them: what is left is the issue rate of
the execution units. bench/probe.py times them; the speed-of-light model holds batches
against them.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .jit import kernel
from .simd.int8 import I32, F32x16, I8x64, I32x16, dot_u8_add

CHAINS = 12  # independent accumulators: more than an instruction's latency x throughput
I64 = ir.IntType(64)


def _loop(builder, n, make, step):
    """n rounds of `step` on CHAINS accumulators from `make()`; their lane 0, summed."""
    entry = builder.block
    loop, done = builder.append_basic_block("peak.loop"), builder.append_basic_block("peak.done")
    builder.branch(loop)
    builder.position_at_end(loop)
    i = builder.phi(I64)
    i.add_incoming(ir.Constant(I64, 0), entry)
    accs = []
    for _ in range(CHAINS):
        p = builder.phi(make().type)
        p.add_incoming(make(), entry)
        accs.append(p)
    new = [step(a) for a in accs]
    for p, v in zip(accs, new, strict=True):
        p.add_incoming(v, builder.block)
    i1 = builder.add(i, ir.Constant(I64, 1))
    i.add_incoming(i1, builder.block)
    builder.cbranch(builder.icmp_signed("<", i1, n), loop, done)
    builder.position_at_end(done)
    return new


@intrinsic
def _int8_rounds(typingctx, n, seed):
    """n rounds of CHAINS 64-byte dot products (64 int8 multiply-adds each)."""

    def codegen(context, builder, sig, args):
        a = builder.insert_element(ir.Constant(I32x16, [0x01020304] * 16),
                                   builder.trunc(args[1], I32), ir.Constant(I32, 0))  # fmt: skip
        a, b = (
            builder.bitcast(a, I8x64),
            builder.bitcast(ir.Constant(I32x16, [0x05060708] * 16), I8x64),
        )
        new = _loop(builder, args[0], lambda: ir.Constant(I32x16, None),
                    lambda acc: dot_u8_add(builder, acc, a, b))  # fmt: skip
        total = new[0]
        for v in new[1:]:
            total = builder.add(total, v)
        return builder.sext(builder.extract_element(total, ir.Constant(I32, 0)), I64)

    return types.int64(types.int64, types.int64), codegen


@intrinsic
def _fma_rounds(typingctx, n, seed):
    """n rounds of CHAINS 16-lane float32 fused multiply-adds."""

    def codegen(context, builder, sig, args):
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(F32x16, [F32x16] * 3), "llvm.fma.v16f32"
        )
        seed = builder.sitofp(args[1], ir.FloatType())
        x = builder.insert_element(ir.Constant(F32x16, [0.999] * 16), seed, ir.Constant(I32, 0))
        y = ir.Constant(F32x16, [1e-3] * 16)
        new = _loop(builder, args[0], lambda: ir.Constant(F32x16, [1.0] * 16),
                    lambda acc: builder.call(fma, [acc, x, y]))  # fmt: skip
        total = new[0]
        for v in new[1:]:
            total = builder.fadd(total, v)
        return builder.fpext(builder.extract_element(total, ir.Constant(I32, 0)), ir.DoubleType())

    return types.float64(types.int64, types.int64), codegen


@kernel(parallel=True)
def int8_peak(n, threads):
    """Every thread n rounds of _int8_rounds: n CHAINS 64 threads multiply-adds."""
    out = np.zeros(threads, np.int64)
    for t in prange(threads):
        out[t] = _int8_rounds(n, t)
    return out.sum()


@kernel(parallel=True)
def fma_peak(n, threads):
    """Every thread n rounds of _fma_rounds: n CHAINS 16 threads fused multiply-adds."""
    out = np.zeros(threads, np.float64)
    for t in prange(threads):
        out[t] = _fma_rounds(n, t)
    return out.sum()


INT8_PER_ROUND = CHAINS * 64  # multiply-adds a round, per thread
FMA_PER_ROUND = CHAINS * 16
