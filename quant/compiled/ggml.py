"""Compiled float-activation kernels for GGML's K-quant formats (quant.ggml), on their
stored bytes (q5_0 and q5_1 have fused kernels of their own: matvec.rows_q5).

Layout: the GGUF blocks themselves, in groups of 4 rows interleaved block by block, as
the other block formats (matvec.py). The decode kernel (`rows_ggml`) decodes each
super-block of a row in vector registers into integer codes, sub-block scales and mins
(simd/kquants.py, the int8 kernels' decoders), widens the codes to float and multiplies
them by x 16 lanes at a time: x = D a_s c - M b_s per sub-block, the mins term taken once
per sub-block from x's sums. (It decoded every block to float32 values on the stack
first, as `decode` below still does for prefill's dequantization: 2-3x slower.)
`decode` decodes one block exactly as gguf.quants does, bit for bit, branching on the
format once per block.
"""

from __future__ import annotations

import numpy as np
from numba import carray, prange

from .jit import kernel
from .matvec import GROUP, PER, lane_sum, put
from .simd.kquants import (
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    kf_block_q2,
    kf_block_q3,
    kf_block_q4,
    kf_block_q5,
    kf_block_q6,
)
from .simd.lanes import zero16
from .simd.scalar import f16, field, row, stack_f32


@kernel(inline=True)
def half(b, o):
    """The float16 stored little-endian at b[o], b[o + 1], as float32."""
    return f16(np.uint16(np.uint16(b[o]) | (np.uint16(b[o + 1]) << np.uint16(8))))


# The decoders below walk the stored bytes in runs of 16 or 32 contiguous bytes with one
# shift and one mask per run, and read each bit field in 8-bit lanes (`field`): loops LLVM
# turns into byte-vector instructions. K-quants store a super-block's 256 codes as
# 2-bit or 4-bit fields of 32-byte (q6_k's low bits: 64-byte) runs: element 128 h + 32 f
# + j sits in field f of byte j of half h.


@kernel(inline=True)
def decode_q2_k(b, out):
    d, dmin = half(b, 80), half(b, 82)
    for hf in range(2):
        for f in range(4):  # a run of 32 bytes: sub-blocks s and s + 1 of 16 elements
            s = 8 * hf + 2 * f
            d0, m0 = d * np.float32(b[s] & 15), -(dmin * np.float32(b[s] >> 4))
            d1, m1 = d * np.float32(b[s + 1] & 15), -(dmin * np.float32(b[s + 1] >> 4))
            src, dst = 16 + 32 * hf, 16 * s
            for j in range(32):
                ds, ms = (d0, m0) if j < 16 else (d1, m1)
                out[dst + j] = ds * field(b[src + j], 2 * f, 3) + ms


@kernel(inline=True)
def q3_scale(b, d, s):
    """The scale of sub-block s of q3_k: 6 bits, signed, under d."""
    low = (b[96 + s % 8] >> (4 * (s // 8))) & 15
    high = (b[104 + s % 4] >> (2 * (s // 4))) & 3
    return d * np.float32(np.int64(low | (high << 4)) - 32)


@kernel(inline=True)
def decode_q3_k(b, out):
    d = half(b, 108)
    for hf in range(2):
        for f in range(4):  # element 128 hf + 32 f + j: hmask bit 4 hf + f of byte j
            s = 8 * hf + 2 * f
            d0, d1 = q3_scale(b, d, s), q3_scale(b, d, s + 1)
            src, dst = 32 + 32 * hf, 16 * s
            for j in range(32):
                ds = d0 if j < 16 else d1
                q = field(b[src + j], 2 * f, 3) + np.float32(4) * field(b[j], 4 * hf + f, 1)
                out[dst + j] = ds * (q - np.float32(4))


@kernel(inline=True)
def scale_min_k4(b, s):
    """The 6-bit scale and min of sub-block s of q4_k / q5_k (scales at b[4:16])."""
    if s < 4:
        return b[4 + s] & 63, b[8 + s] & 63
    sc = (b[12 + s - 4] & 15) | ((b[4 + s - 4] >> 6) << 4)
    mn = (b[12 + s - 4] >> 4) | ((b[8 + s - 4] >> 6) << 4)
    return sc, mn


@kernel(inline=True)
def decode_q45_k(b, out, five):
    d, dmin = half(b, 0), half(b, 2)
    qs = 48 if five else 16
    for s in range(8):  # sub-blocks of 32, the codes repacked (weights.repack_codes):
        # nibble (s % 4) // 2 of the bytes 64 (s // 4) + 32 (s % 2) ...
        sc, mn = scale_min_k4(b, s)
        ds, ms = d * np.float32(sc), -(dmin * np.float32(mn))
        src, dst, shift = qs + 64 * (s // 4) + 32 * (s % 2), 32 * s, 4 * ((s % 4) // 2)
        if five:  # bit s of byte j of qh: the fifth bit of element j
            for j in range(32):
                q = field(b[src + j], shift, 15) + np.float32(16) * field(b[16 + j], s, 1)
                out[dst + j] = ds * q + ms
        else:
            for j in range(32):
                out[dst + j] = ds * field(b[src + j], shift, 15) + ms


@kernel(inline=True)
def decode_q6_k(b, out):
    d = half(b, 208)
    for hf in range(2):
        for f in range(4):  # element 128 hf + 32 f + j: nibble f // 2 of ql, field f of qh
            s = 8 * hf + 2 * f
            d0 = d * np.float32(np.int8(b[192 + s]))
            d1 = d * np.float32(np.int8(b[192 + s + 1]))
            # qh repacked (weights.repack_codes): field v of byte k is element 64 v + k's
            lo, hi, dst = 64 * hf + 32 * (f & 1), 128 + 32 * (f & 1), 16 * s
            v = 2 * hf + (f >> 1)
            for j in range(32):
                ds = d0 if j < 16 else d1
                q = field(b[lo + j], 4 * (f >> 1), 15) + np.float32(16) * field(b[hi + j], 2 * v, 3)
                out[dst + j] = ds * (q - np.float32(32))


@kernel(inline=True)
def decode(fmt, b, out):
    """The bytes of one block of format `fmt` -> its float32 values. Both are views that
    start at the block: an index that may be negative costs numba a wrap-around test per
    access, and LLVM then loads byte by byte."""
    if fmt == Q2_K:
        decode_q2_k(b, out)
    elif fmt == Q3_K:
        decode_q3_k(b, out)
    elif fmt == Q4_K:
        decode_q45_k(b, out, False)
    elif fmt == Q5_K:
        decode_q45_k(b, out, True)
    else:
        decode_q6_k(b, out)


@kernel(inline=True)
def kf_block(fmt, acc, mins, at, b, o, x, xo, xs16, so):
    if fmt == Q2_K:
        kf_block_q2(acc, mins, at, b, o, x, xo, xs16, so)
    elif fmt == Q3_K:
        kf_block_q3(acc, mins, at, b, o, x, xo, xs16, so)
    elif fmt == Q4_K:
        kf_block_q4(acc, mins, at, b, o, x, xo, xs16, so)
    elif fmt == Q5_K:
        kf_block_q5(acc, mins, at, b, o, x, xo, xs16, so)
    else:
        kf_block_q6(acc, mins, at, b, o, x, xo, xs16, so)


@kernel
def rows_ggml(blocks, fmt, nbytes, weights, x, c0, c1, add, out):
    """blocks (G, nblocks * 4 * nbytes) uint8: per group of 4 rows, per block, the rows'
    GGUF blocks; x (nblocks * weights,); out (rows <= 4 G,); chunks c0:c1.
    Each super-block is decoded in vector registers (simd/kquants.py, as for int8 x) and
    its codes widened to float: y = sum_s D a_s (c_s . x_s) - M b_s sum(x_s)."""
    groups, nblocks = blocks.shape[0], blocks.shape[1] // (GROUP * nbytes)
    rows = out.shape[0]
    xs16 = np.empty(x.shape[0] // 16, np.float32)
    for h in range(xs16.shape[0]):
        s = np.float32(0)
        for j in range(16):
            s += x[16 * h + j]
        xs16[h] = s
    acc, mins = carray(stack_f32(64), 64), carray(stack_f32(64), 64)
    for g in range(c0 * PER, min(groups, c1 * PER)):
        for i in range(4):
            zero16(acc, 16 * i)
            zero16(mins, 16 * i)
        bg = row(blocks, g)
        for blk in range(nblocks):
            for i in range(GROUP):
                o = (GROUP * blk + i) * nbytes
                kf_block(fmt, acc, mins, 16 * i, bg, o, x, weights * blk, xs16, 16 * blk)
        for i in range(min(GROUP, rows - GROUP * g)):
            put(out, GROUP * g + i, lane_sum(acc, 16 * i) + lane_sum(mins, 16 * i), add)


@kernel
def dequant_ggml(blocks, fmt, nbytes, weights, g0, g1, out):
    """Groups g0:g1 -> out (GROUP * (g1 - g0), cols) float32, as gguf.quants decodes."""
    nblocks = blocks.shape[1] // (GROUP * nbytes)
    for g in range(g0, g1):
        for blk in range(nblocks):
            for i in range(GROUP):
                o = (GROUP * blk + i) * nbytes
                row = out[GROUP * (g - g0) + i, blk * weights : (blk + 1) * weights]
                decode(fmt, blocks[g, o : o + nbytes], row)


@kernel
def vec_ggml(w, x, c0, c1, add, out):
    """matvec.matvec's entry for the K-quants with x in float32 (matvec.as_float)."""
    blocks, fmt, nbytes, weights = w
    rows_ggml(blocks, fmt, nbytes, weights, x, c0, c1, add, out)


# --- q4_k's, q5_k's and q6_k's codes in the order their kernels load them (weights.repack_codes)


@kernel(inline=True)
def nibble(src, e, repacked):
    """Element e's 4-bit code among the 128 code bytes src: stored, 4 runs of 32
    (element 64 v + 32 h + j: nibble h of byte 32 v + j); repacked, 2 halves of 64
    (element 128 t + 64 h + j: nibble h of byte 64 t + j)."""
    if repacked:
        at, shift = 64 * (e // 128) + e % 64, 4 * ((e % 128) // 64)
    else:
        at, shift = 32 * (e // 64) + e % 32, 4 * ((e % 64) // 32)
    return (src[at] >> shift) & 15


@kernel(inline=True)
def high2(src, e, repacked):
    """Element e's top 2 bits among q6_k's 64 bytes qh (src): stored, 2 halves of 32
    (element 128 h + 32 f + j: field f of byte 32 h + j); repacked, field v of byte k is
    element 64 v + k's."""
    if repacked:
        return (src[e % 64] >> (2 * (e // 64))) & 3
    return (src[32 * (e // 128) + e % 32] >> (2 * ((e % 128) // 32))) & 3


@kernel(parallel=True)
def repack_codes(flat, start, inverse, chunk):
    """In place, the 128 code bytes at `start` of every super-block (a row of flat): from
    the stored order to the repacked one, or back (`inverse`); chunk super-blocks a task."""
    n = flat.shape[0]
    for c in prange(-(-n // chunk)):
        src = np.empty(128, np.uint8)
        for i in range(c * chunk, min(n, c * chunk + chunk)):
            src[:] = flat[i, start : start + 128]
            for k in range(128):  # byte k: the elements of its low and high nibble
                if inverse:
                    e = 64 * (k // 32) + k % 32  # stored: 64 v + j and 64 v + 32 + j
                    lo, hi = nibble(src, e, True), nibble(src, e + 32, True)
                else:
                    e = 128 * (k // 64) + k % 64  # repacked: 128 t + j and 128 t + 64 + j
                    lo, hi = nibble(src, e, False), nibble(src, e + 64, False)
                flat[i, start + k] = lo | (hi << 4)


@kernel(parallel=True)
def repack_high2(flat, start, inverse, chunk):
    """repack_codes for q6_k's top 2 bits, the 64 bytes qh at `start`: field v of byte k
    element 64 v + k's (q6_k's decoder takes code vector v's with one shift and one mask)."""
    n = flat.shape[0]
    for c in prange(-(-n // chunk)):
        src = np.empty(64, np.uint8)
        for i in range(c * chunk, min(n, c * chunk + chunk)):
            src[:] = flat[i, start : start + 64]
            for k in range(64):
                byte = 0
                for f in range(4):  # the byte's field f: the element it holds
                    if inverse:  # stored: byte 32 h + j, field f = element 128 h + 32 f + j
                        e = 128 * (k // 32) + 32 * f + k % 32
                    else:
                        e = 64 * f + k
                    byte |= high2(src, e, inverse) << (2 * f)
                flat[i, start + k] = byte
