"""Decode kernels with int8 activations: y = W @ x for the block formats q8_0, q4_0 and
q4_1, with x rounded to int8 once per product and multiplied by the codes in integer
lanes, as llama.cpp does (its vec_dot_type q8_0 / q8_1).

x, per block of 32 values:  d = max|x| / 127,  xq = rint(x / d) (int8),  sum(xq).
Then for a row's block with scale w_d (and min w_m):

    q8_0   w_d d (q . xq)
    q4_0   w_d d ((q - 8) . xq)  =  w_d d (q . xq - 8 sum(xq))
    q4_1   w_d d (q . xq)  +  w_m d sum(xq)

The integer dot products are exact (simd.py: one `vpdpbusd` per 64 byte products on
AVX-512 VNNI); what differs from the float kernels (matvec.py) is x's rounding, a
relative error of at most 1/254 of a block's largest |x| per value. The layout is
matvec.py's (groups of 4 rows, interleaved block by block), so a weight reads the same
bytes either way and the meter counts the same.

`quant.intdot` is the NumPy reference of the same arithmetic; tests hold these kernels
to it exactly where no float rounding intervenes, and to the float kernels within a
measured bound."""

from __future__ import annotations

import numpy as np
from numba import carray, prange

from .jit import f16x4, kernel, stack_f32, zero16
from .matvec import CHUNK, GROUP, put
from .ops import prologue
from .simd import q4_block, q8_block

BLOCK = 32


@kernel
def quantize_x(x, xq, xd, xsum):
    """x (nb * 32,) float32 -> xq (nb * 32,) int8, xd (nb,) float32 scales, xsum (nb,)
    int32 sums of xq: per block, d = max|x| / 127 and xq = rint(x * (127 / max|x|))
    (ties to even; 0 for a block of zeros)."""
    for b in range(xd.shape[0]):
        amax = np.float32(0)
        for j in range(BLOCK):
            amax = max(amax, abs(x[BLOCK * b + j]))
        inv = np.float32(127) / amax if amax > 0 else np.float32(0)
        s = np.int32(0)
        for j in range(BLOCK):
            q = np.int32(np.rint(x[BLOCK * b + j] * inv))
            xq[BLOCK * b + j] = q
            s += q
        xd[b] = amax / np.float32(127)
        xsum[b] = s


@kernel(inline=True)
def quantized(x):
    nb = x.shape[0] // BLOCK
    xq, xd, xsum = np.empty(x.shape[0], np.int8), np.empty(nb, np.float32), np.empty(nb, np.int32)
    quantize_x(x, xq, xd, xsum)
    return xq, xd, xsum


@kernel(inline=True)
def row_sums(acc, extra, g, rows, add, out):
    """out[4 g + i] (+)= the 4 lanes of row i, plus extra[i]."""
    for i in range(min(GROUP, rows - GROUP * g)):
        s = acc[4 * i] + acc[4 * i + 1] + acc[4 * i + 2] + acc[4 * i + 3]
        put(out, GROUP * g + i, s + extra[i], add)


@kernel(parallel=True)
def matvec_q8_0(codes, scales, x, norm, eps, mode, add, out):
    """matvec.matvec_q8_0's arguments and layout, with x rounded to int8."""
    x = prologue(x, norm, eps, mode)
    xq, xd, xsum = quantized(x)
    groups, nb = scales.shape[0], scales.shape[1] // GROUP
    rows = out.shape[0]
    per = CHUNK // GROUP
    for c in prange((groups + per - 1) // per):
        acc = carray(stack_f32(16), 16)
        none = carray(stack_f32(4), 4)
        for i in range(4):
            none[i] = 0
        for g in range(c * per, min(groups, c * per + per)):
            zero16(acc, 0)
            q, s = codes[g], scales[g]
            for b in range(nb):
                q8_block(acc, q, 128 * b, xq, BLOCK * b, xsum[b], s, GROUP * b, xd[b])
            row_sums(acc, none, g, rows, add, out)


@kernel(parallel=True)
def matvec_q4(codes, scales, mins, factor, x, norm, eps, mode, add, out):
    """matvec.matvec_q4's arguments and layout, with x rounded to int8: q4_1 passes its
    mins and factor 1, q4_0 its scales and factor -8 (its offset goes into the integer
    sums, so `mins` is not read)."""
    x = prologue(x, norm, eps, mode)
    xq, xd, xsum = quantized(x)
    groups, nb = scales.shape[0], scales.shape[1] // GROUP
    rows = out.shape[0]
    has_min = factor > 0
    per = CHUNK // GROUP
    for c in prange((groups + per - 1) // per):
        acc = carray(stack_f32(16), 16)
        corr = carray(stack_f32(4), 4)
        m = carray(stack_f32(4), 4)
        for g in range(c * per, min(groups, c * per + per)):
            zero16(acc, 0)
            for i in range(4):
                corr[i] = 0
            q, s, mg = codes[g], scales[g], mins[g]
            for b in range(nb):
                if has_min:
                    f16x4(mg, GROUP * b, m)
                    xs = xd[b] * np.float32(xsum[b])
                    for i in range(4):
                        corr[i] += m[i] * xs
                    q4_block(acc, q, 64 * b, xq, BLOCK * b, np.int32(0), s, GROUP * b, xd[b])
                else:
                    bias = np.int32(2 * xsum[b])
                    q4_block(acc, q, 64 * b, xq, BLOCK * b, bias, s, GROUP * b, xd[b])
            row_sums(acc, corr, g, rows, add, out)
