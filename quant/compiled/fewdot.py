"""Products of a few vectors in integers at decode's cost: Y = X @ W.T for B <= FEW vectors
(a small batch's decode step), every quantized format.

Decode's kernels (intdot.py) with one change: each block of 4 rows is loaded and decoded
into registers once and multiplied by every vector (the simd `_n` intrinsics: q8_block_n,
q4_dot_n, q5_dot_n, kn_block_*), so a step of B sequences reads and decodes its weights
once, as one sequence does, and pays B times only the multiply-adds. Which vectors: `vs`,
a tuple of rows of X, whose length numba compiles into the kernel (one specialization per
B). Each vector's lanes are summed in decode's order: it gets the bits a decode step alone
gives it.

x is rounded as decode rounds it (igemm.quantized_rows: xq (B, cols or 2 cols), xd, xsum,
xd16, xb16, lo)."""

from __future__ import annotations

import numpy as np
from numba import carray, prange

from ..ggml import BLOCK
from .ggml import Q2_K, Q3_K, Q4_K, Q5_K
from .intdot import group_scales, per_row
from .jit import kernel
from .matvec import CHUNK, GROUP, PER, lane_sum, put, spread
from .simd.groups import put_sums4
from .simd.int8 import q4_dot_n, q5_dot_n, q8_block_n
from .simd.kquants import kn_block_q2, kn_block_q3, kn_block_q4, kn_block_q5, kn_block_q6
from .simd.lanes import (
    fma16_row_n_bf16,
    fma16_row_n_f16,
    fma16_row_n_f32,
    fma16_rows_n_bf16,
    fma16_rows_n_f16,
    fma16_rows_n_f32,
    zero16,
)
from .simd.scalar import SHORT_ROW, ahead, ask_row, row, stack_f32

FEW = 4  # vectors at most: stack_f32 sizes below are 16 lanes x FEW (K-quants: 64 x FEW)


@kernel(inline=True)
def put_rows(acc, at, corr, g, rows, v, add, out):
    """out[v, 4 g + i] (+)= the 4 lanes of row i at acc[at + 4 i], plus corr[i]."""
    put_sums4(acc, at, corr, row(out, v), GROUP * g, min(GROUP, rows - GROUP * g), add)


@kernel
def rows_q8_0(codes, scales, xq, xd, xsum, lo, vs, c0, c1, add, out):
    """intdot.rows_q8_0 for the vectors vs of X; chunks c0:c1; out (B, rows)"""
    groups, nb = scales.shape[0], scales.shape[1] // GROUP
    rows, n = out.shape[1], len(vs)
    acc = carray(stack_f32(64), 64)
    none = carray(stack_f32(4), 4)
    for i in range(4):
        none[i] = 0
    for g in range(c0 * PER, min(groups, c1 * PER)):
        for j in range(n):
            zero16(acc, 16 * j)
        q, s = row(codes, g), row(scales, g)
        for b in range(nb):
            ahead(q, 128 * b, 128)
            q8_block_n(acc, q, 128 * b, xq, vs, BLOCK * b, xsum, b, s, GROUP * b, xd, lo)
        for j in range(n):
            put_rows(acc, 16 * j, none, g, rows, vs[j], add, out)


@kernel
def rows_q4(codes, scales, mins, factor, bits, xq, xd, xsum, lo, vs, c0, c1, add, out):
    """intdot.rows_q4 (q4_0, q4_1, q5_0, q5_1) for the vectors vs of X; chunks c0:c1"""
    groups, nb = scales.shape[0], scales.shape[1] // GROUP
    rows, n = out.shape[1], len(vs)
    five = bits.shape[1] > 0
    xd4, xs4 = np.empty((n, 4 * nb), np.float32), np.empty((n, 4 * nb), np.float32)
    sc = np.empty((n, 4 * nb), np.float32)
    for j in range(n):
        per_row(xd[vs[j]], xsum[vs[j]], xd4[j], xs4[j])
    acc = carray(stack_f32(64), 64)
    corr = carray(stack_f32(16), (FEW, 4))
    for g in range(c0 * PER, min(groups, c1 * PER)):
        for j in range(n):
            group_scales(scales, mins, g, row(xd4, j), row(xs4, j), row(sc, j), row(corr, j))
            for i in range(4):
                corr[j, i] *= factor
        for j in range(n):
            zero16(acc, 16 * j)
        q, w = g * codes.shape[1], g * bits.shape[1]
        if five:
            for b in range(nb):
                ahead(codes, q + 64 * b, 64)
                q5_dot_n(acc, codes, q + 64 * b, bits, w + GROUP * b, xq, vs, BLOCK * b, sc,
                         GROUP * b, lo)  # fmt: skip
        else:
            for b in range(nb):
                ahead(codes, q + 64 * b, 64)
                q4_dot_n(acc, codes, q + 64 * b, xq, vs, BLOCK * b, sc, GROUP * b, lo)
        for j in range(n):
            put_rows(acc, 16 * j, row(corr, j), g, rows, vs[j], add, out)


@kernel(inline=True)
def kn_block(fmt, acc, mins, at, b, o, xq, vs, xo, xd16, xb16, so, lo):
    if fmt == Q2_K:
        kn_block_q2(acc, mins, at, b, o, xq, vs, xo, xd16, xb16, so, lo)
    elif fmt == Q3_K:
        kn_block_q3(acc, mins, at, b, o, xq, vs, xo, xd16, xb16, so, lo)
    elif fmt == Q4_K:
        kn_block_q4(acc, mins, at, b, o, xq, vs, xo, xd16, xb16, so, lo)
    elif fmt == Q5_K:
        kn_block_q5(acc, mins, at, b, o, xq, vs, xo, xd16, xb16, so, lo)
    else:
        kn_block_q6(acc, mins, at, b, o, xq, vs, xo, xd16, xb16, so, lo)


@kernel
def rows_k(blocks, fmt, nbytes, xq, xd16, xb16, lo, vs, c0, c1, add, out):
    """intdot.rows_k (the K-quants) for the vectors vs of X; chunks c0:c1"""
    groups, nblocks = blocks.shape[0], blocks.shape[1] // (GROUP * nbytes)
    rows, n = out.shape[1], len(vs)
    acc, mins = carray(stack_f32(256), 256), carray(stack_f32(256), 256)
    for g in range(c0 * PER, min(groups, c1 * PER)):
        for i in range(4 * n):
            zero16(acc, 16 * i)
            zero16(mins, 16 * i)
        bg = row(blocks, g)
        for blk in range(nblocks):
            for i in range(GROUP):
                o = (GROUP * blk + i) * nbytes
                kn_block(fmt, acc, mins, 16 * i, bg, o, xq, vs, 256 * blk, xd16, xb16, 16 * blk,
                         lo)  # fmt: skip
        for j in range(n):
            for i in range(min(GROUP, rows - GROUP * g)):
                s = lane_sum(acc, 64 * j + 16 * i) + lane_sum(mins, 64 * j + 16 * i)
                if add:
                    out[vs[j], GROUP * g + i] += s
                else:
                    out[vs[j], GROUP * g + i] = s


@kernel(inline=True)
def float_rows(w, x, vs, r, nr, add, out, fma, acc):
    """out[vs[k], r:r + nr] (=, or += when add) rows r:r + nr of the float weights w times
    each vector: `fma` (simd.lanes' fma16_rows_n_ or fma16_row_n_ of w's kind) sums them
    in registers, each row's weights loaded once for every vector, into acc[n i + k]."""
    n = len(vs)
    fma(w, r, nr, x, vs, acc)
    for i in range(nr):
        for k in range(n):
            put(out[vs[k]], r + i, acc[n * i + k], add)


@kernel(inline=True)
def rows_float(w, x, vs, c0, c1, add, out, fma4, fma1):
    """Chunks c0:c1 of out (B, rows) (=, or += when add) the vectors vs of x (B, cols)
    times the float weights w (rows, cols) (float_rows): GROUP rows at a time (fma4), each
    x loaded once for 4 rows, or, for rows shorter than SHORT_ROW bytes, one row at a time
    (fma1), so that a thread's weights are one sequential stream, which the hardware
    prefetcher follows where 4 streams of short rows it does not (DEVELOPERS.md, "f32
    rows one at a time"), each asking for one further on (ask_row): 3072 x 576 f32 at B =
    4 from DRAM 208-222 us where 385-410 (2 threads, Xeon family 6 model 167; a scratch
    copy asking 16 or 32 rows on). Long rows' groups of 4 do not ask: 2048 x 2048 at B =
    2-4 ran slower asking 16 rows on (535-628 us where 467-499)."""
    r0, end = c0 * CHUNK, min(w.shape[0], c1 * CHUNK)
    acc = carray(stack_f32(16), 16)  # GROUP rows x FEW vectors
    if w.shape[1] * w.itemsize < SHORT_ROW:
        for r in range(r0, end):
            ask_row(w, r, end)
            float_rows(w, x, vs, r, 1, add, out, fma1, acc)
    else:
        for r in range(r0, end, GROUP):
            float_rows(w, x, vs, r, min(GROUP, end - r), add, out, fma4, acc)


# --- the formats' entries for matmat_few: (w: the weight's row operands, xs: igemm's
# quantized_rows, vs, chunks, add, out)


@kernel
def few_q8_0(w, xs, vs, c0, c1, add, out):
    codes, scales = w
    xq, xd, xsum, _, _, lo = xs
    rows_q8_0(codes, scales, xq, xd, xsum, lo, vs, c0, c1, add, out)


@kernel
def few_q4(w, xs, vs, c0, c1, add, out):
    codes, scales, mins, factor, bits = w
    xq, xd, xsum, _, _, lo = xs
    rows_q4(codes, scales, mins, factor, bits, xq, xd, xsum, lo, vs, c0, c1, add, out)


@kernel
def few_k(w, xs, vs, c0, c1, add, out):
    blocks, fmt, nbytes = w
    xq, _, _, xd16, xb16, lo = xs
    rows_k(blocks, fmt, nbytes, xq, xd16, xb16, lo, vs, c0, c1, add, out)


@kernel
def few_f32(w, xs, vs, c0, c1, add, out):
    rows_float(w[0], xs, vs, c0, c1, add, out, fma16_rows_n_f32, fma16_row_n_f32)


@kernel
def few_f16(w, xs, vs, c0, c1, add, out):
    rows_float(w[0], xs, vs, c0, c1, add, out, fma16_rows_n_f16, fma16_row_n_f16)


@kernel
def few_bf16(w, xs, vs, c0, c1, add, out):
    rows_float(w[0], xs, vs, c0, c1, add, out, fma16_rows_n_bf16, fma16_row_n_bf16)


@kernel(parallel=True)
def matmat_few(rows, w, xs, vs, add, out):
    """out (B, rows) (=, or += when add) X @ W.T for the vectors vs of X (a tuple, at most
    FEW): the rows in chunks over the threads as decode splits them; rows: few_q8_0,
    few_q4 or few_k, w its operands, xs as igemm.quantized_rows gives X."""
    m, g, n = spread(out.shape[1])
    for i in prange(m):
        rows(w, xs, vs, i * g, min(n, i * g + g), add, out)
