"""Float weights times many vectors without a panel: each weight a broadcast operand.

For B vectors of x, transposed once per product into groups of 16 (xt: (groups, cols,
16), vector 16 g + l in lane l of group g), a tile of TILE_ROWS rows x 16 or 32 vectors
keeps one accumulator per row and group of 16 vectors: for each column k, one load of
xt[g, k] per group (16 vectors' k-th values) and, per row, one fused multiply-add per
group with w[r, k] broadcast from memory (`vfmadd231ps m32{1to16}`). The rows are read as
stored, a stream of 4 bytes a column each, and no panel is built: the float panels
(simd/panels.py) transpose 16 rows into a buffer first, a fixed cost of ~1.75 decode
passes. At the end the accumulators are transposed into each vector's rows and stored.
float16 and bfloat16 weights keep the panels: widening a broadcast weight costs more
instructions than the fused multiply-add it feeds (f16, 16 vectors: 1.7x the panels'
time on 3072 x 576).

8 rows, not 16: rows 8 KiB apart (2048 float32 columns) fall in one set of the 8-way L1,
and a tile of 16 such rows evicted its own lines: 2048 x 2048 at B = 64 ran 87 GFLOPS with
16 rows against 172 with 8 (Zen 4, 2 threads).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .panels import F32, I64, F32x16, I32x16, const, splat, transpose16

TILE_ROWS = 8  # rows of a tile: one accumulator per group of vectors
TILE_LANES = 16  # vectors of a group: the accumulators' lanes


def _loop(builder, wrow, xbase, cols):
    """The loop over the columns: per group j and row r, acc[j][r] += w[r, k] xt[j, k];
    returns the accumulators (zeros when cols is 0)."""
    groups, entry = len(xbase), builder.block
    loop = builder.append_basic_block("bcast.loop")
    done = builder.append_basic_block("bcast.done")
    zero = ir.Constant(F32x16, None)
    builder.cbranch(builder.icmp_signed(">", cols, const(0)), loop, done)
    builder.position_at_end(loop)
    k = builder.phi(I64)
    k.add_incoming(const(0), entry)
    accs = [[builder.phi(F32x16) for _ in wrow] for _ in xbase]
    for p in (p for row_accs in accs for p in row_accs):
        p.add_incoming(zero, entry)
    xk = builder.mul(k, const(TILE_LANES))
    xv = [builder.load(builder.bitcast(builder.gep(xb, [xk]), F32x16.as_pointer()), align=4)
          for xb in xbase]  # fmt: skip
    new = [[None] * len(wrow) for _ in range(groups)]
    for r, row in enumerate(wrow):
        wv = splat(builder, builder.load(builder.gep(row, [k])), F32x16)
        for j in range(groups):
            product = builder.fmul(wv, xv[j], flags=["contract"])
            new[j][r] = builder.fadd(accs[j][r], product, flags=["contract"])
    k1 = builder.add(k, const(1))
    for j in range(groups):
        for r in range(len(wrow)):
            accs[j][r].add_incoming(new[j][r], builder.block)
    k.add_incoming(k1, builder.block)
    builder.cbranch(builder.icmp_signed("<", k1, cols), loop, done)
    builder.position_at_end(done)
    final = [[builder.phi(F32x16) for _ in wrow] for _ in xbase]
    for j in range(groups):
        for r in range(len(wrow)):
            final[j][r].add_incoming(zero, entry)
            final[j][r].add_incoming(new[j][r], loop)
    return final


def _tile(groups: int):
    @intrinsic
    def bcast_tile(typingctx, w, r0, nrows, xt, g0, nvec, add, out):
        """out[16 g0 + l, r0:r0 + nrows] (=, or += when add) w[r0:r0 + nrows] . x[16 g0 + l]
        for l < nvec (at most 16 x groups), x given transposed in groups of 16: xt (groups,
        cols, 16) float32, zeros past the last vector; w (rows, cols) float32 row-major;
        nrows at most TILE_ROWS (a row past it reads row r0 + nrows - 1 again, never
        stored)."""

        def codegen(context, builder, sig, args):
            w_, r0, nrows, xt_, g0, nvec, add, out_ = args
            wa = context.make_array(sig.args[0])(context, builder, w_)
            cols = cgutils.unpack_tuple(builder, wa.shape, 2)[1]
            xa = context.make_array(sig.args[3])(context, builder, xt_)
            last = builder.sub(nrows, const(1))
            wrow = []
            for r in range(TILE_ROWS):
                row = builder.select(builder.icmp_signed("<", const(r), nrows), const(r), last)
                wrow.append(builder.gep(wa.data, [builder.mul(builder.add(r0, row), cols)]))
            group = builder.mul(cols, const(TILE_LANES))  # floats of one group of xt
            xbase = [builder.gep(xa.data, [builder.mul(builder.add(g0, const(j)), group)])
                     for j in range(groups)]  # fmt: skip
            final = _loop(builder, wrow, xbase, cols)
            pad = [ir.Constant(I32x16, None)] * (16 - TILE_ROWS)
            for j in range(groups):
                rows = [builder.bitcast(p, I32x16) for p in final[j]]
                # accumulator r's lane l is (row r, vector l): transposed, vector l's rows
                by_vector = [builder.bitcast(v, F32x16) for v in transpose16(builder, rows + pad)]
                v0 = builder.mul(builder.add(g0, const(j)), const(TILE_LANES))
                left = builder.sub(nvec, const(TILE_LANES * j))
                store_vectors(context, builder, sig.args[7], out_, v0, left, r0, nrows, add,
                              by_vector)  # fmt: skip
            return context.get_dummy_value()

        sig = types.void(w, types.intp, types.intp, xt, types.intp, types.intp, types.intp, out)
        return sig, codegen

    return bcast_tile


bcast_tile1, bcast_tile2 = _tile(1), _tile(2)  # 16 and 32 vectors a tile


def store_vectors(context, builder, out_ty, out_, v0, nvec, r0, nrows, add, rows16):
    """out[v0 + l, r0:r0 + nrows] (=, or += when add) rows16[l] for l < nvec."""
    oa = context.make_array(out_ty)(context, builder, out_)
    ostride = cgutils.unpack_tuple(builder, oa.strides, 2)[0]
    obase = builder.bitcast(oa.data, ir.IntType(8).as_pointer())
    i32 = ir.IntType(32)
    mask = builder.sub(builder.shl(const(1, i32), builder.trunc(nrows, i32)), const(1, i32))
    i1x16 = ir.VectorType(ir.IntType(1), 16)
    bits = builder.bitcast(builder.trunc(mask, ir.IntType(16)), i1x16)
    f32p = F32x16.as_pointer()
    store_fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [F32x16, f32p, i32, i1x16]),
        "llvm.masked.store.v16f32.p0")  # fmt: skip
    load_fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(F32x16, [f32p, i32, i1x16, F32x16]),
        "llvm.masked.load.v16f32.p0")  # fmt: skip
    adding = builder.icmp_signed("!=", add, const(0))
    for l, value in enumerate(rows16):
        with builder.if_then(builder.icmp_signed("<", const(l), nvec)):
            row = builder.mul(builder.add(v0, const(l)), ostride)
            p = builder.gep(builder.bitcast(builder.gep(obase, [row]), F32.as_pointer()), [r0])
            p = builder.bitcast(p, f32p)
            old = builder.call(load_fn, [p, const(4, i32), bits, ir.Constant(F32x16, None)])
            builder.call(store_fn, [builder.select(adding, builder.fadd(old, value), value), p,
                                    const(4, i32), bits])  # fmt: skip
