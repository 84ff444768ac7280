"""Decode kernels with int8 activations: y = W @ x for every quantized format (q8_0, q4_0,
q4_1, q5_0, q5_1 and the K-quants q2_k..q6_k), with x rounded to int8 once per product
and multiplied by the codes in integer lanes, as llama.cpp does (its vec_dot_type q8_0 /
q8_1; for the K-quants it rounds per 256 values, q8_K, where these round per 32).

x, per block of 32 values:  d = max|x| / 127,  xq = rint(x / d) (int8),  sum(xq).
Or rounded to int16 (dot "int16", x's error 128 times smaller): d = max|x| / 16256,
xq = rint(x / d), held as two int8 halves, high bytes then low ones `lo` further on
(quantize_x; simd/int8.py multiplies both by the same codes). Then for a row's block with
scale w_d (and min w_m):

    q8_0   w_d d (q . xq)
    q4_0   w_d d ((q - 8) . xq)  =  w_d d (q . xq - 8 sum(xq))
    q4_1   w_d d (q . xq)  +  w_m d sum(xq)
    q5_x   as q4_x, with each code's fifth bit (offset 16 for q5_0)
    K      per sub-block of 16, D a_s d (c . xq) - M b_s d sum(xq) (simd/kquants.py)

The integer dot products are exact (simd/int8.py: one `vpdpbusd` per 64 byte products on
AVX-512 VNNI); what differs from the float kernels (matvec.py) is x's rounding, a
relative error of at most 1/254 of a block's largest |x| per value. The layouts are
the float kernels' (groups of 4 rows, interleaved block by block: matvec.py, ggml.py),
so a weight reads the same bytes either way and the meter counts the same.

`quant.intdot` is the NumPy reference of the same arithmetic; tests hold these kernels
to it exactly where no float rounding intervenes, and to the float kernels within a
measured bound."""

from __future__ import annotations

import numpy as np
from numba import carray

from ..ggml import BLOCK
from .ggml import Q2_K, Q3_K, Q4_K, Q5_K
from .jit import kernel
from .matvec import GROUP, PER, lane_sum, put
from .simd.groups import group_scales16, put_sums4
from .simd.int8 import q4_dot, q5_dot, q8_block, quantize_block, sum16
from .simd.kquants import Q6_K, k_block_q2, k_block_q3, k_block_q4, k_block_q5, k_block_q6
from .simd.lanes import zero16
from .simd.scalar import ahead, row, stack_f32


@kernel
def quantize_x(x, xq, xd, xsum, lo):
    """x (nb * 32,) float32 -> its integers q in xq (int8), xd (nb,) float32 scales, xsum
    (nb,) int32 sums of q: per block, q = rint(x * (top / max|x|)) (ties to even; 0 for a
    block of zeros) and d = max|x| / top, with top = 127 (lo = 0: q is int8, in
    xq[:nb * 32]) or 16256 (q is int16: its high bytes h = (q + 64) >> 7 in xq[:nb * 32],
    its low bytes q - 128 h, -64..63, lo further on). A block holding NaN or infinity
    gets q = 0 and d = NaN, so every product with it is NaN, as in float: rounded, a NaN
    would become ordinary integers and the logits finite garbage. One block in vector
    registers at a time (simd/int8.quantize_block)."""
    for b in range(xd.shape[0]):
        quantize_block(x, xq, xd, xsum, b, lo)


@kernel(inline=True)
def quantized(x, wide):
    """x's integers (quantize_x), as int16 when wide: xq, xd, xsum and lo."""
    n = x.shape[0]
    lo = n if wide else 0
    xq = np.empty(2 * n if wide else n, np.int8)
    xd, xsum = np.empty(n // BLOCK, np.float32), np.empty(n // BLOCK, np.int32)
    quantize_x(x, xq, xd, xsum, lo)
    return xq, xd, xsum, lo


@kernel(inline=True)
def row_sums(acc, extra, g, rows, add, out):
    """out[4 g + i] (+)= the 4 lanes of row i, plus extra[i]."""
    put_sums4(acc, 0, extra, out, GROUP * g, min(GROUP, rows - GROUP * g), add)


@kernel
def rows_q8_0(codes, scales, xq, xd, xsum, lo, c0, c1, add, out):
    """matvec.rows_q8_0's layout, on x as quantize_x rounds it; chunks c0:c1"""
    groups, nb = scales.shape[0], scales.shape[1] // GROUP
    rows = out.shape[0]
    acc = carray(stack_f32(16), 16)
    none = carray(stack_f32(4), 4)
    for i in range(4):
        none[i] = 0
    for g in range(c0 * PER, min(groups, c1 * PER)):
        zero16(acc, 0)
        q, s = row(codes, g), row(scales, g)
        for b in range(nb):
            ahead(q, 128 * b, 128)
            q8_block(acc, q, 128 * b, xq, BLOCK * b, xsum[b], s, GROUP * b, xd[b], lo)
        row_sums(acc, none, g, rows, add, out)


@kernel(inline=True)
def per_row(xd, xsum, xd4, xs4):
    """x's scale d and d sum(xq) of each block, repeated for the 4 rows of a group:
    xd4[4 b + i] = xd[b], xs4[4 b + i] = xd[b] xsum[b]."""
    for j in range(xd4.shape[0]):
        xd4[j] = xd[j // 4]
        xs4[j] = xd[j // 4] * np.float32(xsum[j // 4])


@kernel(inline=True)
def group_scales(scales, mins, g, xd4, xs4, sc, corr):
    """For group g of 4 rows: sc[4 b + i] = (row i's scale of block b) xd[b], and
    corr[i] = sum_b (row i's min of block b) xd[b] xsum[b] (scales, mins: float16 bits,
    as stored). In vector registers (simd/groups.py), flat offsets: a row view per group
    costs a reference count taken and dropped (NRT calls) in the hot loop."""
    group_scales16(scales, mins, g * sc.shape[0], xd4, xs4, sc, corr)


@kernel
def rows_q4(codes, scales, mins, factor, bits, xq, xd, xsum, lo, c0, c1, add, out):
    """matvec.rows_q4's layout (and rows_q5's `bits` for q5_0 / q5_1, an empty array for
    q4), on x as quantize_x rounds it; chunks c0:c1. The integer dot products take the
    codes as stored (0..15, 0..31); the offset or min goes in once per row, in float,
    as in the float kernels: y = sum_b d_b xd_b (q_b . xq_b) + factor m_b xd_b sum(xq_b).
    q4_1 and q5_1 pass their mins and factor 1; q4_0 and q5_0 their scales and -8, -16."""
    groups, nb = scales.shape[0], scales.shape[1] // GROUP
    rows = out.shape[0]
    five = bits.shape[1] > 0
    xd4, xs4 = np.empty(4 * nb, np.float32), np.empty(4 * nb, np.float32)
    sc = np.empty(4 * nb, np.float32)
    per_row(xd, xsum, xd4, xs4)
    acc = carray(stack_f32(16), 16)
    corr = carray(stack_f32(4), 4)
    for g in range(c0 * PER, min(groups, c1 * PER)):
        group_scales(scales, mins, g, xd4, xs4, sc, corr)
        for i in range(4):
            corr[i] *= factor
        zero16(acc, 0)
        q, w = g * codes.shape[1], g * bits.shape[1]
        if five:
            for b in range(nb):
                ahead(codes, q + 64 * b, 64)
                q5_dot(acc, codes, q + 64 * b, bits, w + GROUP * b, xq, BLOCK * b, sc,
                       GROUP * b, lo)  # fmt: skip
        else:
            for b in range(nb):
                ahead(codes, q + 64 * b, 64)
                q4_dot(acc, codes, q + 64 * b, xq, BLOCK * b, sc, GROUP * b, lo)
        row_sums(acc, corr, g, rows, add, out)


# --- K-quants: simd/kquants.py decodes a super-block of a row into integer codes, scales and
# mins in vector registers; x is rounded per block of 32 as for every other format.


@kernel
def per16(xq, xd, lo, xd16, xb16):
    """For x rounded by quantize_x (xq, xd, lo), per 16 values: xd16 their block's scale,
    xb16 the scale times the sum of their integers: the operands of the K-quant kernels."""
    for h in range(xd16.shape[0]):
        xd16[h] = xd[h // 2]
        xb16[h] = xd[h // 2] * np.float32(sum16(xq, 16 * h, lo))


@kernel(inline=True)
def k_block(fmt, acc, mins, at, b, o, xq, xo, xd16, xb16, so, lo):
    if fmt == Q2_K:
        k_block_q2(acc, mins, at, b, o, xq, xo, xd16, xb16, so, lo)
    elif fmt == Q3_K:
        k_block_q3(acc, mins, at, b, o, xq, xo, xd16, xb16, so, lo)
    elif fmt == Q4_K:
        k_block_q4(acc, mins, at, b, o, xq, xo, xd16, xb16, so, lo)
    elif fmt == Q5_K:
        k_block_q5(acc, mins, at, b, o, xq, xo, xd16, xb16, so, lo)
    else:
        k_block_q6(acc, mins, at, b, o, xq, xo, xd16, xb16, so, lo)


@kernel
def rows_k(blocks, fmt, nbytes, xq, xd16, xb16, lo, c0, c1, add, out):
    """ggml.rows_ggml's layout for the K-quants, on x as quantize_x and per16 give it;
    chunks c0:c1. One loop per format (rows_k_of, inlined with the format a constant),
    the branch on it taken once, not per super-block and row: the jump table in the loop,
    with the formats' tails merged after it, cost q4_k 3-5 cycles of a super-block and
    row's 37-41 (one thread, 2048 columns, int16 x, Zen 4; against a copy of the loop
    calling q4_k's block directly, alternated)."""
    if fmt == Q4_K:
        rows_k_of(blocks, Q4_K, nbytes, xq, xd16, xb16, lo, c0, c1, add, out)
    elif fmt == Q6_K:
        rows_k_of(blocks, Q6_K, nbytes, xq, xd16, xb16, lo, c0, c1, add, out)
    elif fmt == Q5_K:
        rows_k_of(blocks, Q5_K, nbytes, xq, xd16, xb16, lo, c0, c1, add, out)
    elif fmt == Q3_K:
        rows_k_of(blocks, Q3_K, nbytes, xq, xd16, xb16, lo, c0, c1, add, out)
    else:
        rows_k_of(blocks, Q2_K, nbytes, xq, xd16, xb16, lo, c0, c1, add, out)


@kernel(inline=True)
def rows_k_of(blocks, fmt, nbytes, xq, xd16, xb16, lo, c0, c1, add, out):
    groups, nblocks = blocks.shape[0], blocks.shape[1] // (GROUP * nbytes)
    rows = out.shape[0]
    acc, mins = carray(stack_f32(64), 64), carray(stack_f32(64), 64)
    for g in range(c0 * PER, min(groups, c1 * PER)):
        for i in range(4):
            zero16(acc, 16 * i)
            zero16(mins, 16 * i)
        bg = row(blocks, g)
        for blk in range(nblocks):
            ahead(bg, GROUP * blk * nbytes, GROUP * nbytes)
            for i in range(GROUP):
                o = (GROUP * blk + i) * nbytes
                k_block(fmt, acc, mins, 16 * i, bg, o, xq, 256 * blk, xd16, xb16, 16 * blk, lo)
        for i in range(min(GROUP, rows - GROUP * g)):
            s = lane_sum(acc, 16 * i) + lane_sum(mins, 16 * i)
            put(out, GROUP * g + i, s, add)


@kernel(inline=True)
def quantized16(x, wide):
    xq, xd, _, lo = quantized(x, wide)
    xd16, xb16 = np.empty(x.shape[0] // 16, np.float32), np.empty(x.shape[0] // 16, np.float32)
    per16(xq, xd, lo, xd16, xb16)
    return xq, xd16, xb16, lo


# --- each format's entry to matvec.matvec, the one decode driver: x rounded, and its rows


@kernel
def as_ints(x, wide):
    """x rounded per block of 32 to int8 (int16 when wide): xq, xd, xsum, lo."""
    return quantized(x, wide)


@kernel
def as_ints16(x, wide):
    """as_ints, with the K-quants' per-16 operands: xq, xd16, xb16, lo (per16)."""
    return quantized16(x, wide)


@kernel
def vec_q8_0(w, xs, c0, c1, add, out):
    codes, scales = w
    xq, xd, xsum, lo = xs
    rows_q8_0(codes, scales, xq, xd, xsum, lo, c0, c1, add, out)


@kernel
def vec_q4(w, xs, c0, c1, add, out):
    """q4_0, q4_1, q5_0, q5_1: w codes, scales, mins, factor, fifth bits (rows_q4)."""
    codes, scales, mins, factor, bits = w
    xq, xd, xsum, lo = xs
    rows_q4(codes, scales, mins, factor, bits, xq, xd, xsum, lo, c0, c1, add, out)


@kernel
def vec_k(w, xs, c0, c1, add, out):
    blocks, fmt, nbytes = w
    xq, xd16, xb16, lo = xs
    rows_k(blocks, fmt, nbytes, xq, xd16, xb16, lo, c0, c1, add, out)
