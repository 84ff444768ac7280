"""Compiled kernels for GGML's 5-bit and K-quant formats (quant.ggml), on their stored bytes.

Layout: the GGUF blocks themselves, in groups of 4 rows interleaved block by block, as
the other block formats (matvec.py). A kernel decodes one block of each of the 4 rows
into float32 values on the stack, exactly as gguf.quants decodes them (x = D c + M per
sub-block, bit for bit), then multiplies 16 lanes at a time. The decoding costs more
than the fused loops of q8_0 and q4 (every weight is written once and read back from
L1), in exchange for one generic loop behind seven formats: `decode` branches on the
format once per block.
"""

from __future__ import annotations

import numpy as np
from numba import carray, prange

from .jit import f16, fma16vv, kernel, stack_f32, zero16
from .matvec import CHUNK, GROUP, lane_sum, put
from .ops import prologue

# format codes for `decode`
Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = range(7)
CODES = {"q5_0": Q5_0, "q5_1": Q5_1, "q2_k": Q2_K, "q3_k": Q3_K, "q4_k": Q4_K,
         "q5_k": Q5_K, "q6_k": Q6_K}  # fmt: skip
MAX_WEIGHTS = 256  # per block (a K-quant super-block)


@kernel(inline=True)
def half(b, o):
    """The float16 stored little-endian at b[o], b[o + 1], as float32."""
    return f16(np.uint16(np.uint16(b[o]) | (np.uint16(b[o + 1]) << np.uint16(8))))


@kernel(inline=True)
def decode_q5(b, o, out, at, has_min):
    """q5_1: x = d q + m; q5_0: x = d (q - 16) (no addition: -0.0 stays -0.0)."""
    d = half(b, o)
    m = half(b, o + 2) if has_min else np.float32(0)
    h = o + 4 if has_min else o + 2
    bits = np.int64(b[h]) | (np.int64(b[h + 1]) << 8) | (np.int64(b[h + 2]) << 16)
    bits |= np.int64(b[h + 3]) << 24  # bit j: the fifth bit of element j
    for j in range(16):
        q = b[h + 4 + j]
        lo = (q & 15) | (((bits >> j) & 1) << 4)
        hi = (q >> 4) | (((bits >> (j + 16)) & 1) << 4)
        if has_min:
            out[at + j] = d * np.float32(lo) + m
            out[at + j + 16] = d * np.float32(hi) + m
        else:
            out[at + j] = d * np.float32(lo - 16)
            out[at + j + 16] = d * np.float32(hi - 16)


@kernel(inline=True)
def decode_q2_k(b, o, out, at):
    d, dmin = half(b, o + 80), half(b, o + 82)
    for s in range(16):  # sub-blocks of 16: elements 16 s .. 16 s + 15
        sc = b[o + s]
        ds, ms = d * np.float32(sc & 15), -(dmin * np.float32(sc >> 4))
        for j in range(16):
            e = 16 * s + j  # element e: half e // 128, 2-bit field (e % 128) // 32, byte e % 32
            q = (b[o + 16 + 32 * (e // 128) + e % 32] >> (2 * ((e % 128) // 32))) & 3
            out[at + e] = ds * np.float32(q) + ms


@kernel(inline=True)
def decode_q3_k(b, o, out, at):
    d = half(b, o + 108)
    for s in range(16):
        low = (b[o + 96 + s % 8] >> (4 * (s // 8))) & 15
        high = (b[o + 104 + s % 4] >> (2 * (s // 4))) & 3
        ds = d * np.float32(np.int32(low | (high << 4)) - 32)
        for j in range(16):
            e = 16 * s + j
            q = np.int32((b[o + 32 + 32 * (e // 128) + e % 32] >> (2 * ((e % 128) // 32))) & 3)
            h = np.int32((b[o + e % 32] >> (e // 32)) & 1)
            out[at + e] = ds * np.float32(q - 4 * (1 - h))


@kernel(inline=True)
def scale_min_k4(b, o, s):
    """The 6-bit scale and min of sub-block s of q4_k / q5_k (scales at b[o + 4:o + 16])."""
    if s < 4:
        return b[o + 4 + s] & 63, b[o + 8 + s] & 63
    sc = (b[o + 12 + s - 4] & 15) | ((b[o + 4 + s - 4] >> 6) << 4)
    mn = (b[o + 12 + s - 4] >> 4) | ((b[o + 8 + s - 4] >> 6) << 4)
    return sc, mn


@kernel(inline=True)
def decode_q45_k(b, o, out, at, five):
    d, dmin = half(b, o), half(b, o + 2)
    qs = o + 48 if five else o + 16
    for s in range(8):  # sub-blocks of 32: nibble s % 2 of bytes 32 (s // 2) ..
        sc, mn = scale_min_k4(b, o, s)
        ds, ms = d * np.float32(sc), -(dmin * np.float32(mn))
        for j in range(32):
            q = (b[qs + 32 * (s // 2) + j] >> (4 * (s % 2))) & 15
            if five:
                q |= ((b[o + 16 + j] >> s) & 1) << 4
            out[at + 32 * s + j] = ds * np.float32(q) + ms


@kernel(inline=True)
def decode_q6_k(b, o, out, at):
    d = half(b, o + 208)
    for e in range(256):
        hf, r = e // 128, e % 128  # half, then 64 low nibbles and 64 high nibbles of ql
        low = (b[o + 64 * hf + r % 64] >> (4 * (r // 64))) & 15
        high = (b[o + 128 + 32 * hf + r % 32] >> (2 * (r // 32))) & 3
        ds = d * np.float32(np.int8(b[o + 192 + e // 16]))
        out[at + e] = ds * np.float32(np.int32(low | (high << 4)) - 32)


@kernel(inline=True)
def decode(fmt, b, o, out, at):
    """Block of format `fmt` at b[o:] -> its float32 values at out[at:]."""
    if fmt == Q5_0:
        decode_q5(b, o, out, at, False)
    elif fmt == Q5_1:
        decode_q5(b, o, out, at, True)
    elif fmt == Q2_K:
        decode_q2_k(b, o, out, at)
    elif fmt == Q3_K:
        decode_q3_k(b, o, out, at)
    elif fmt == Q4_K:
        decode_q45_k(b, o, out, at, False)
    elif fmt == Q5_K:
        decode_q45_k(b, o, out, at, True)
    else:
        decode_q6_k(b, o, out, at)


@kernel(parallel=True)
def matvec_ggml(blocks, fmt, nbytes, weights, x, norm, eps, mode, add, out):
    """blocks (G, nblocks * 4 * nbytes) uint8: per group of 4 rows, per block, the rows'
    GGUF blocks; x (nblocks * weights,); out (rows <= 4 G,)"""
    x = prologue(x, norm, eps, mode)
    groups, nblocks = blocks.shape[0], blocks.shape[1] // (GROUP * nbytes)
    rows = out.shape[0]
    per = CHUNK // GROUP
    for c in prange((groups + per - 1) // per):
        vals = carray(stack_f32(1024), 1024)  # GROUP * MAX_WEIGHTS
        acc = carray(stack_f32(64), 64)
        for g in range(c * per, min(groups, c * per + per)):
            for i in range(4):
                zero16(acc, 16 * i)
            bg = blocks[g]
            for blk in range(nblocks):
                for i in range(GROUP):
                    decode(fmt, bg, (GROUP * blk + i) * nbytes, vals, i * weights)
                for j in range(0, weights, 16):
                    for i in range(GROUP):
                        fma16vv(acc, 16 * i, vals, i * weights + j, x, blk * weights + j)
            for i in range(min(GROUP, rows - GROUP * g)):
                put(out, GROUP * g + i, lane_sum(acc, 16 * i), add)


@kernel
def dequant_ggml(blocks, fmt, nbytes, weights, g0, g1, out):
    """Groups g0:g1 -> out (GROUP * (g1 - g0), cols) float32, as gguf.quants decodes."""
    nblocks = blocks.shape[1] // (GROUP * nbytes)
    for g in range(g0, g1):
        for blk in range(nblocks):
            for i in range(GROUP):
                row = out[GROUP * (g - g0) + i]
                decode(fmt, blocks[g], (GROUP * blk + i) * nbytes, row, blk * weights)
