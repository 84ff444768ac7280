"""Decode kernels: y = W @ x for one float32 vector x, one per weight format, reading the
stored codes and scales directly (no float32 copy of any panel), rows split across threads.

The loop shape that runs at memory speed (DEVELOPERS.md, "Compiled kernels"): a row keeps
a vector of float32 accumulator lanes on the stack, adds `scale * (code * x)` lane by lane
block after block, and sums its lanes once at the end. One scalar sum per block instead makes LLVM
vectorize across blocks with gathers, 8x slower.

Block formats are stored in groups of GROUP = 4 rows, interleaved block by block (as
llama.cpp repacks Q4_0 for its fast CPU paths): for each block b, the codes of the four
rows follow each other, then the next block. A thread then streams one contiguous run of
memory (four separate row streams of 2 KiB each measured 1.4x slower from DRAM), each x
value it loads serves four rows, and four independent accumulator chains hide the
latency of the fused multiply-adds. The four scales of a block are converted from float16
in one instruction (`f16x4`). The float formats keep the GGUF's rows (memory-mapped), so
`rows_float` (float32) and `rows_wide` (float16, bfloat16) multiply them one row at a
time: one stream all the same.

Every kernel takes `norm, eps, mode` (what to apply to x first: ops.prologue) and `add`
(whether to add y into `out` instead of storing it), so that a decode step fuses RMSNorm,
SwiGLU and the residual additions into its matrix products.

Each format's kernel is two functions: `rows_<format>`, the loop over a range of chunks
(CHUNK rows each) on x as prepared for the format, and how x is prepared (`as_float`,
`as_nibbles`, `as_five`; intdot.py's `as_ints`, `as_ints16` round it to integers). One
driver, `matvec`, takes both as arguments: it prepares x once and runs the chunks in a
parallel loop through the format's `vec_` function (its operands as one tuple). A decode
step in one parallel region (layers.py) runs the same `rows_` functions on the chunks its
threads take, so both give the same bits.
"""

from __future__ import annotations

import numpy as np
from numba import carray, prange

from .jit import kernel
from .ops import prologue
from .simd.lanes import fma16_row_n_bf16, fma16_row_n_f16
from .simd.scalar import ahead, ask_row, bit, f16x4, f32, i8, lo4, row, stack_f32, u8

GROUP = 4  # rows interleaved in a block format's compiled layout
CHUNK = 16  # rows per unit of parallel work
PER = CHUNK // GROUP  # groups per chunk
PIECES = 32  # at most, in a parallel loop over rows: split among its threads evenly


@kernel(inline=True)
def lane_sum(acc, at):
    """acc[at] + ... + acc[at + 15]"""
    s = np.float32(0)
    for j in range(16):
        s += acc[at + j]
    return s


@kernel(inline=True)
def spread(rows):
    """How a parallel loop splits `rows` rows: (pieces, chunks per piece, chunks); at most
    PIECES pieces, each one call of a rows_ function. (numba.get_num_threads() inside a
    kernel would keep it out of the disk cache: it reads a pointer at run time.)"""
    n = -(-rows // CHUNK)
    g = -(-n // PIECES)
    return -(-n // g), g, n


@kernel(inline=True)
def put(out, r, s, add):
    """The epilogue: out[r] = s, or out[r] += s."""
    if add:
        out[r] += s
    else:
        out[r] = s


@kernel(inline=True)
def rows_float(w, x, c0, c1, add, out, widen):
    """w (rows, cols) of floats, widen(w[r, j]) their float32 (`f32` for float32 itself;
    16-bit rows take rows_wide); x (cols,); out (rows,); chunks c0:c1.
    A row at a time: a thread's weights are one sequential stream. (Four rows at a time,
    x loaded once for four, is four streams of short rows, which the hardware prefetcher
    does not follow: on Zen 4, 1536 x 576 f32 from DRAM took 205-209 us that way and
    142-156 one row at a time; DEVELOPERS.md, "f32 rows one at a time".)"""
    rows, cols = w.shape
    for r in range(c0 * CHUNK, min(rows, c1 * CHUNK)):
        s = np.float32(0)
        for j in range(cols):
            s += widen(w[r, j]) * x[j]
        put(out, r, s, add)


@kernel
def rows_f32(w, x, c0, c1, add, out):
    """w (rows, cols) float32; x (cols,); out (rows,); chunks c0:c1 (rows_float)."""
    rows_float(w, x, c0, c1, add, out, f32)


@kernel(inline=True)
def rows_wide(bits, x, c0, c1, add, out, fma1):
    """16-bit float rows (bits: their patterns) one at a time, each asking for one further
    on (ask_row), widened and multiplied 16 lanes at a time by simd.lanes' one-row kernel
    `fma1`: what a few vectors' short rows use (fewdot.rows_float), so a row under
    SHORT_ROW bytes gets the same sum alone and in a batch (a few vectors take longer rows
    4 at a time). Where rows_float's scalar loop widened them: 1536 x 576 from
    DRAM, 2 threads, f16 106 us where 139, bf16 111 where 126; SmolLM2-135M bf16 13.2 ms a
    token where 16.2-16.3 (alternated; Xeon family 6 model 167)."""
    xs = x.reshape(1, x.shape[0])
    acc = carray(stack_f32(16), 16)
    end = min(bits.shape[0], c1 * CHUNK)
    for r in range(c0 * CHUNK, end):
        ask_row(bits, r, end)
        fma1(bits, r, 1, xs, (0,), acc)
        put(out, r, acc[0], add)


@kernel
def rows_f16(bits, x, c0, c1, add, out):
    """bits (rows, cols) uint16 float16 patterns; x (cols,); out (rows,); chunks c0:c1."""
    rows_wide(bits, x, c0, c1, add, out, fma16_row_n_f16)


@kernel
def rows_bf16(bits, x, c0, c1, add, out):
    """bits (rows, cols) uint16 bfloat16 patterns; x (cols,); out (rows,); chunks c0:c1."""
    rows_wide(bits, x, c0, c1, add, out, fma16_row_n_bf16)


@kernel
def rows_q8_0(codes, scales, x, c0, c1, add, out):
    """codes (G, nb * 4 * 32) int8 as uint8, per block the 4 rows' 32 codes;
    scales (G, nb * 4) float16 bits; x (nb * 32,); out (rows <= 4 G,); chunks c0:c1
    y = sum_b d_b * (q_b . x_b)"""
    groups, nb = scales.shape[0], scales.shape[1] // GROUP
    rows = out.shape[0]
    acc = carray(stack_f32(64), 64)  # 16 lanes for each of the 4 rows
    d = carray(stack_f32(4), 4)
    for g in range(c0 * PER, min(groups, c1 * PER)):
        for j in range(64):
            acc[j] = 0
        q, s = row(codes, g), row(scales, g)
        for b in range(nb):
            ahead(q, 128 * b, 128)
            f16x4(s, 4 * b, d)
            o = 128 * b
            for j in range(16):
                lo, hi = x[32 * b + j], x[32 * b + 16 + j]
                acc[j] += d[0] * (i8(q[o + j]) * lo + i8(q[o + 16 + j]) * hi)
                acc[16 + j] += d[1] * (i8(q[o + 32 + j]) * lo + i8(q[o + 48 + j]) * hi)
                acc[32 + j] += d[2] * (i8(q[o + 64 + j]) * lo + i8(q[o + 80 + j]) * hi)
                acc[48 + j] += d[3] * (i8(q[o + 96 + j]) * lo + i8(q[o + 112 + j]) * hi)
        for i in range(min(GROUP, rows - GROUP * g)):
            put(out, GROUP * g + i, lane_sum(acc, 16 * i), add)


@kernel
def nibble_operands(x, xa, xb, xs):
    """x transformed once per call for 4-bit codes. With a = x[j], b = x[j + 16] of a block
    and byte = lo + 16 hi:  lo a + hi b = lo (a - b/16) + byte (b/16),
    so a kernel converts the low nibble and the whole byte, never the shifted high one.
    xa, xb (nb * 16,) get a - b/16 and b/16; xs (nb,) the block sums of x."""
    for b in range(xs.shape[0]):
        s = np.float32(0)
        for j in range(16):
            a, h = x[32 * b + j], x[32 * b + 16 + j]
            xb[16 * b + j] = h * np.float32(1 / 16)
            xa[16 * b + j] = a - xb[16 * b + j]
            s += a + h
        xs[b] = s


@kernel(inline=True)
def five_operands(x, x16):
    """x16 = 16 x: what a q5 code's fifth bit multiplies."""
    for j in range(x.shape[0]):
        x16[j] = np.float32(16) * x[j]


@kernel(inline=True)
def nibbles(x):
    """nibble_operands into new arrays: (xa, xb, xs)."""
    nb = x.shape[0] // 32
    xa, xb = np.empty(16 * nb, np.float32), np.empty(16 * nb, np.float32)
    xs = np.empty(nb, np.float32)
    nibble_operands(x, xa, xb, xs)
    return xa, xb, xs


@kernel
def rows_q4(codes, scales, mins, factor, xa, xb, xs, c0, c1, add, out):
    """codes (G, nb * 4 * 16) uint8, per block the 4 rows' 16 bytes (element j in the low
    nibble of byte j, element j + 16 in the high one); scales, mins (G, nb * 4) float16 bits;
    x as nibble_operands gives it; out (rows <= 4 G,); chunks c0:c1
    y = sum_b d_b (q_b . x_b) + factor * m_b * sum(x_b):
    q4_1 passes its mins and factor 1; q4_0 (x = d (q - 8)) its scales and factor -8."""
    groups, nb = scales.shape[0], scales.shape[1] // GROUP
    rows = out.shape[0]
    acc = carray(stack_f32(64), 64)
    corr = carray(stack_f32(4), 4)
    d = carray(stack_f32(4), 4)
    m = carray(stack_f32(4), 4)
    for g in range(c0 * PER, min(groups, c1 * PER)):
        for j in range(64):
            acc[j] = 0
        for i in range(4):
            corr[i] = 0
        q, s, mg = row(codes, g), row(scales, g), row(mins, g)
        for b in range(nb):
            ahead(q, 64 * b, 64)
            f16x4(s, 4 * b, d)
            f16x4(mg, 4 * b, m)
            for i in range(4):
                corr[i] += m[i] * xs[b]
            o = 64 * b
            for j in range(16):
                a, h = xa[16 * b + j], xb[16 * b + j]
                acc[j] += d[0] * (lo4(q[o + j]) * a + u8(q[o + j]) * h)
                acc[16 + j] += d[1] * (lo4(q[o + 16 + j]) * a + u8(q[o + 16 + j]) * h)
                acc[32 + j] += d[2] * (lo4(q[o + 32 + j]) * a + u8(q[o + 32 + j]) * h)
                acc[48 + j] += d[3] * (lo4(q[o + 48 + j]) * a + u8(q[o + 48 + j]) * h)
        for i in range(min(GROUP, rows - GROUP * g)):
            put(out, GROUP * g + i, lane_sum(acc, 16 * i) + factor * corr[i], add)


@kernel
def rows_q5(codes, scales, mins, factor, bits, xa, xb, xs, x16, c0, c1, add, out):
    """q5_0 / q5_1: rows_q4's layout and loop, plus `bits` (G, nb * 4) uint32, the fifth
    bit of each of a block's 32 codes (bit j: element j), added as 16 x in float:
    q . x = nibbles . x + 16 (bits . x). q5_1 passes its mins and factor 1; q5_0
    (x = d (q - 16)) its scales and factor -16. Long on purpose: the row loop must stay
    in one function for LLVM to keep the 8 accumulator chains in registers (rows_q4 has
    the same shape)."""
    groups, nb = scales.shape[0], scales.shape[1] // GROUP
    rows = out.shape[0]
    acc = carray(stack_f32(64), 64)
    corr = carray(stack_f32(4), 4)
    d = carray(stack_f32(4), 4)
    m = carray(stack_f32(4), 4)
    for g in range(c0 * PER, min(groups, c1 * PER)):
        for j in range(64):
            acc[j] = 0
        for i in range(4):
            corr[i] = 0
        q, s, mg, hb = row(codes, g), row(scales, g), row(mins, g), row(bits, g)
        for b in range(nb):
            ahead(q, 64 * b, 64)
            f16x4(s, 4 * b, d)
            f16x4(mg, 4 * b, m)
            for i in range(4):
                corr[i] += m[i] * xs[b]
            o, w = 64 * b, 4 * b
            for j in range(16):
                a, h = xa[16 * b + j], xb[16 * b + j]
                lo, hi = x16[32 * b + j], x16[32 * b + 16 + j]
                acc[j] += d[0] * (
                    lo4(q[o + j]) * a
                    + u8(q[o + j]) * h
                    + bit(hb[w], j) * lo
                    + bit(hb[w], j + 16) * hi
                )
                acc[16 + j] += d[1] * (
                    lo4(q[o + 16 + j]) * a
                    + u8(q[o + 16 + j]) * h
                    + bit(hb[w + 1], j) * lo
                    + bit(hb[w + 1], j + 16) * hi
                )
                acc[32 + j] += d[2] * (
                    lo4(q[o + 32 + j]) * a
                    + u8(q[o + 32 + j]) * h
                    + bit(hb[w + 2], j) * lo
                    + bit(hb[w + 2], j + 16) * hi
                )
                acc[48 + j] += d[3] * (
                    lo4(q[o + 48 + j]) * a
                    + u8(q[o + 48 + j]) * h
                    + bit(hb[w + 3], j) * lo
                    + bit(hb[w + 3], j + 16) * hi
                )
        for i in range(min(GROUP, rows - GROUP * g)):
            put(out, GROUP * g + i, lane_sum(acc, 16 * i) + factor * corr[i], add)


# --- the one driver, and each format's entry to it: its x preparation and its rows -------


@kernel(parallel=True)
def matvec(prepare, rows, w, x, norm, eps, mode, add, out, wide):
    """out (=, or += when add) W @ prologue(x) for one vector x: `prepare(x, wide)` makes
    what the format's row function reads of x (x itself, or x rounded to integers: int16
    when wide), then `rows(w, xs, c0, c1, add, out)` runs chunks c0:c1 of W's rows, w its
    operands, the chunks spread over the threads (`spread`)."""
    xs = prepare(prologue(x, norm, eps, mode), wide)
    m, g, n = spread(out.shape[0])
    for i in prange(m):
        rows(w, xs, i * g, min(n, i * g + g), add, out)


@kernel
def as_float(x, wide):
    """x as the float formats' and q8_0's float rows read it: itself."""
    return x


@kernel
def as_nibbles(x, wide):
    """x as rows_q4 reads it (nibble_operands)."""
    return nibbles(x)


@kernel
def as_five(x, wide):
    """x as rows_q5 reads it: nibble_operands, and x times 16 (five_operands)."""
    xa, xb, xs = nibbles(x)
    x16 = np.empty_like(x)
    five_operands(x, x16)
    return xa, xb, xs, x16


@kernel
def vec_f32(w, x, c0, c1, add, out):
    rows_f32(w[0], x, c0, c1, add, out)


@kernel
def vec_f16(w, x, c0, c1, add, out):
    rows_f16(w[0], x, c0, c1, add, out)


@kernel
def vec_bf16(w, x, c0, c1, add, out):
    rows_bf16(w[0], x, c0, c1, add, out)


@kernel
def vec_q8_0(w, x, c0, c1, add, out):
    codes, scales = w
    rows_q8_0(codes, scales, x, c0, c1, add, out)


@kernel
def vec_q4(w, xs, c0, c1, add, out):
    """w: codes, scales, mins, factor (and a q5's fifth bits, unread here)."""
    codes, scales, mins, factor, _ = w
    xa, xb, sums = xs
    rows_q4(codes, scales, mins, factor, xa, xb, sums, c0, c1, add, out)


@kernel
def vec_q5(w, xs, c0, c1, add, out):
    codes, scales, mins, factor, bits = w
    xa, xb, sums, x16 = xs
    rows_q5(codes, scales, mins, factor, bits, xa, xb, sums, x16, c0, c1, add, out)
