"""Float weights times many vectors without a panel: each weight a broadcast operand.

For B vectors of x, transposed once per product into groups of 16 (xt: (groups, cols,
16), vector 16 g + l in lane l of group g), a tile of TILE_ROWS rows x 16 or 32 vectors
keeps one accumulator per row and group of 16 vectors: for each column k, one load of
xt[g, k] per group (16 vectors' k-th values) and, per row, one fused multiply-add per
group with w[r, k] broadcast from memory (`vfmadd231ps m32{1to16}`). The rows are read as
stored, a stream of 4 bytes a column each, and no panel is built: the float panels
(simd/panels.py) transpose 16 rows into a buffer first, a fixed cost of ~1.75 decode
passes. At the end the accumulators are transposed into each vector's rows and stored.
x itself is transposed into the groups in registers, a block of 16 columns of 16 (or 8)
vectors a call (transpose_block16, transpose_block8).
A product of at most 8 vectors takes groups of 8 (NARROW_LANES): 256-bit FMAs, half the
arithmetic of a group of 16 with half its lanes empty.
float16 and bfloat16 weights keep the panels: widening a broadcast weight costs more
instructions than the fused multiply-add it feeds (f16, 16 vectors: 1.7x the panels'
time on 3072 x 576).

8 rows, not 16: rows 8 KiB apart (2048 float32 columns) fall in one set of the 8-way L1,
and a tile of 16 such rows evicted its own lines: 2048 x 2048 at B = 64 ran 87 GFLOPS with
16 rows against 172 with 8 (Zen 4, 2 threads).

A tile of short rows (under SHORT_ROW bytes, 1023 columns or fewer) is 8 streams of 36-56
lines each, which the hardware prefetcher picks up too late (as the few-vector rows,
fewdot.rows_float): 3072 x 576 at B = 8 read DRAM at 12.8 GB/s where one vector's decode
reads 21-27. Every other column (one line of 8 rows' columns) a tile asks for a line of the
tile AHEAD_TILES on, into L2: 3072 x 576 B = 8 / 16 274 / 273-292 us where 552-554 /
597-649, 4864 x 896 B = 8 523 where 908 (2 threads, weights from DRAM, Xeon family 6 model
167). Long rows are left to the hardware: asking made 2048 x 2048 slower (709-788 us at
B = 8 where 595-632).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .panels import (
    F32x16,
    I32x16,
    accumulate,
    const,
    first_lanes,
    masked_load,
    put_rows,
    shuffle,
    splat,
    transpose16,
)
from .scalar import SHORT_ROW, prefetch_ir

TILE_ROWS = 8  # rows of a tile: one accumulator per group of vectors
# Short rows' tiles ask for the one this many tiles on (prefetcht1); see the module's text
AHEAD_TILES = 4
AHEAD_ROWS = AHEAD_TILES * TILE_ROWS
TILE_LANES = 16  # vectors of a group: the accumulators' lanes
NARROW_LANES = 8  # a product of at most 8 vectors: groups of 8 lanes


def _loop(builder, wrow, xbase, cols, lanes: int, ahead, short):
    """The loop over the columns: per group j and row r, acc[j][r] += w[r, k] xt[j, k]
    (<lanes x float>); returns the accumulators, by group then row (zeros when cols is 0).
    For short rows (`short`, an i1) every other column also asks for a line of the tile
    AHEAD_TILES on (`ahead`: its first float; k TILE_ROWS floats on, the tile's lines in
    order, each asked for once)."""
    rows, vt = len(wrow), ir.VectorType(ir.FloatType(), lanes)

    def body(k, accs):
        even = builder.icmp_signed("==", builder.and_(k, const(1)), const(0))
        with builder.if_then(builder.and_(short, even)):
            prefetch_ir(builder, builder.gep(ahead, [builder.mul(k, const(TILE_ROWS))]), 2)
        xk = builder.mul(k, const(lanes))
        xv = [builder.load(builder.bitcast(builder.gep(xb, [xk]), vt.as_pointer()), align=4)
              for xb in xbase]  # fmt: skip
        new = list(accs)
        for r, row in enumerate(wrow):
            wv = splat(builder, builder.load(builder.gep(row, [k])), vt)
            for j, x in enumerate(xv):
                product = builder.fmul(wv, x, flags=["contract"])
                new[rows * j + r] = builder.fadd(accs[rows * j + r], product, flags=["contract"])
        return new

    flat = accumulate(builder, cols, 1, rows * len(xbase), body, "bcast", vt)
    return [flat[rows * j : rows * (j + 1)] for j in range(len(xbase))]


def _widened(builder, v):
    """A <lanes x float> as <16 x i32>, lanes past its own zero."""
    if v.type.count < 16:
        zero = ir.Constant(v.type, None)
        v = shuffle(builder, v, zero, [min(i, v.type.count) for i in range(16)])
    return builder.bitcast(v, I32x16)


def _tile(groups: int, lanes: int = 16):
    @intrinsic
    def bcast_tile(typingctx, w, r0, nrows, xt, g0, nvec, add, out, col):
        """out[L g0 + l, col:col + nrows] (=, or += when add) w[r0:r0 + nrows] . x[L g0 + l]
        for l < nvec (at most L x groups), x given transposed in groups of L = `lanes`: xt
        (groups, cols, L) float32, zeros past the last vector; w (rows, cols) float32
        row-major; nrows at most TILE_ROWS (a row past it reads row r0 + nrows - 1 again,
        never stored)."""

        def codegen(context, builder, sig, args):
            w_, r0, nrows, xt_, g0, nvec, add, out_, col = args
            wa = context.make_array(sig.args[0])(context, builder, w_)
            cols = cgutils.unpack_tuple(builder, wa.shape, 2)[1]
            xa = context.make_array(sig.args[3])(context, builder, xt_)
            last = builder.sub(nrows, const(1))
            wrow = []
            for r in range(TILE_ROWS):
                row = builder.select(builder.icmp_signed("<", const(r), nrows), const(r), last)
                wrow.append(builder.gep(wa.data, [builder.mul(builder.add(r0, row), cols)]))
            group = builder.mul(cols, const(lanes))  # floats of one group of xt
            xbase = [builder.gep(xa.data, [builder.mul(builder.add(g0, const(j)), group)])
                     for j in range(groups)]  # fmt: skip
            ahead = builder.gep(wa.data, [builder.mul(builder.add(r0, const(AHEAD_ROWS)), cols)])
            short = builder.icmp_signed("<", cols, const(SHORT_ROW // 4))
            final = _loop(builder, wrow, xbase, cols, lanes, ahead, short)
            pad = [ir.Constant(I32x16, None)] * (16 - TILE_ROWS)
            for j in range(groups):
                rows = [_widened(builder, p) for p in final[j]]
                # accumulator r's lane l is (row r, vector l): transposed, vector l's rows
                by_vector = [builder.bitcast(v, F32x16) for v in transpose16(builder, rows + pad)]
                v0 = builder.mul(builder.add(g0, const(j)), const(lanes))
                left = builder.sub(nvec, const(lanes * j))
                store_vectors(context, builder, sig.args[7], out_, v0, left, col, nrows, add,
                              by_vector[:lanes])  # fmt: skip
            return context.get_dummy_value()

        sig = types.void(w, types.intp, types.intp, xt, types.intp, types.intp, types.intp, out,
                         types.intp)  # fmt: skip
        return sig, codegen

    return bcast_tile


# 16 and 32 vectors a tile; and 8 in 8 lanes, half the arithmetic of 16 for B <= 8: 0.88-0.95
# of the 16-lane time at 5 and 8 vectors, weights from DRAM (interleaved rounds, Zen 4)
bcast_tile1, bcast_tile2, bcast_tile8 = _tile(1), _tile(2), _tile(1, NARROW_LANES)


def store_vectors(context, builder, out_ty, out_, v0, nvec, r0, nrows, add, rows16):
    """out[v0 + l, r0:r0 + nrows] (=, or += when add) rows16[l] for l < nvec."""
    orows = [
        builder.select(
            builder.icmp_signed("<", const(l), nvec), builder.add(v0, const(l)), const(-1)
        )
        for l in range(len(rows16))
    ]
    put_rows(context, builder, out_ty, out_, orows, r0, nrows, add, rows16)


def _transpose(lanes: int):
    @intrinsic
    def transpose_block(typingctx, x, v0, k0, xt, g):
        """xt[g, k0 + j, l] = x[v0 + l, k0 + j] for j < min(16, cols - k0) and l < `lanes`,
        zeros for the rows past x's last: x (B, cols) float32 C-contiguous, xt (groups,
        cols, lanes). 16 masked loads of a row's 16 columns, a 16 x 16 transpose in
        registers (transpose16), a store of each column's lanes."""

        def codegen(context, builder, sig, args):
            x_, v0, k0, xt_, g = args
            xa = context.make_array(sig.args[0])(context, builder, x_)
            b, cols = cgutils.unpack_tuple(builder, xa.shape, 2)
            ta = context.make_array(sig.args[3])(context, builder, xt_)
            left = builder.sub(cols, k0)  # columns of this block: 16 or fewer
            kmask = first_lanes(builder, builder.trunc(left, I32x16.element))
            none = ir.Constant(kmask.type, None)
            rows = []
            for l in range(16):
                v = builder.add(v0, const(l))
                inside = builder.icmp_signed("<", v, b)
                if l >= lanes:
                    rows.append(ir.Constant(F32x16, None))
                    continue
                at = builder.add(builder.mul(builder.select(inside, v, const(0)), cols), k0)
                ptr = builder.bitcast(builder.gep(xa.data, [at]), F32x16.as_pointer())
                mask = builder.select(inside, kmask, none)
                rows.append(masked_load(builder, ptr, F32x16, mask, align=4))
            words = transpose16(builder, [builder.bitcast(r, I32x16) for r in rows])
            columns = [builder.bitcast(c, F32x16) for c in words]
            vt = ir.VectorType(F32x16.element, lanes)
            base = builder.mul(builder.add(builder.mul(g, cols), k0), const(lanes))
            for j, column in enumerate(columns):
                with builder.if_then(builder.icmp_signed("<", const(j), left)):
                    if lanes < 16:
                        column = shuffle(builder, column, column, list(range(lanes)))
                    at = builder.add(base, const(j * lanes))
                    ptr = builder.bitcast(builder.gep(ta.data, [at]), vt.as_pointer())
                    builder.store(column, ptr, align=4)
            return context.get_dummy_value()

        return types.void(x, types.intp, types.intp, xt, types.intp), codegen

    return transpose_block


# x into the float tiles' layout (igemm.transpose_groups): 16 columns of 16 or 8 vectors a call
transpose_block16, transpose_block8 = _transpose(TILE_LANES), _transpose(NARROW_LANES)
