"""Prefill and lookup kernels: stored codes to float32 rows, exactly as the formats define
them (bit for bit what gguf.quants gives), for BLAS to multiply or an embedding to use.

They run on the calling thread. Prefill alternates them with BLAS products on both cores,
and both thread pools spin for a while after their work: a parallel dequantization here
left OpenMP's threads spinning through the next sgemm, which then ran at a third of its
speed (SmolLM2's matrices at 128 tokens: 442 ms in parallel, 162 ms on one thread; the
dequantization is ~8% of a product's work)."""

from __future__ import annotations

import numpy as np

from .jit import kernel
from .matvec import GROUP
from .simd.lanes import hi16, lo16, mul16_i8
from .simd.scalar import f16


@kernel
def dequant_f16(bits, out):
    """bits (rows, cols) float16 patterns -> out (rows, cols) float32"""
    for r in range(bits.shape[0]):
        for j in range(bits.shape[1]):
            out[r, j] = f16(bits[r, j])


@kernel
def dequant_q8_0(codes, scales, g0, g1, out):
    """Groups g0:g1 of a grouped q8_0 matrix -> out (GROUP * (g1 - g0), cols) C-contiguous:
    x = d q. Sixteen codes per instruction (mul16_i8): the plain loop over out[row, j]
    compiled to one scalar conversion and multiply per weight (0.8 ns)."""
    nb, cols, width = scales.shape[1] // GROUP, out.shape[1], codes.shape[1]
    for g in range(g0, g1):
        s = scales[g]
        for b in range(nb):
            for i in range(GROUP):
                d = f16(s[GROUP * b + i])
                at = (GROUP * (g - g0) + i) * cols + 32 * b
                src = g * width + (GROUP * b + i) * 32
                mul16_i8(out, at, d, codes, src)
                mul16_i8(out, at + 16, d, codes, src + 16)


@kernel
def dequant_q4(codes, scales, mins, factor, g0, g1, out):
    """Groups g0:g1 of a grouped q4_0 / q4_1 matrix -> out (GROUP * (g1 - g0), cols)
    C-contiguous: x = d q + factor m (q4_1: factor 1, m its minimum; q4_0: factor -8,
    m = d)."""
    nb, cols, width = scales.shape[1] // GROUP, out.shape[1], codes.shape[1]
    for g in range(g0, g1):
        s, mg = scales[g], mins[g]
        for b in range(nb):
            for i in range(GROUP):
                d, m = f16(s[GROUP * b + i]), factor * f16(mg[GROUP * b + i])
                at = (GROUP * (g - g0) + i) * cols + 32 * b
                src = g * width + 64 * b + 16 * i
                lo16(out, at, d, m, codes, src)  # 16 weights per instruction, as mul16_i8
                hi16(out, at + 16, d, m, codes, src)


@kernel
def dequant_q5(codes, scales, mins, factor, bits, g0, g1, out):
    """Groups g0:g1 of a grouped q5_0 / q5_1 matrix -> out (GROUP * (g1 - g0), cols):
    q = nibble + 16 fifth bit; q5_1 (factor 1): x = d q + m; q5_0 (factor -16, mins = the
    scales): x = d (q - 16), as gguf.quants computes it (so -0.0 stays -0.0)."""
    nb, has_min = scales.shape[1] // GROUP, factor == np.float32(1)
    for g in range(g0, g1):
        q, s, mg, hb = codes[g], scales[g], mins[g], bits[g]
        for b in range(nb):
            for i in range(GROUP):
                d, m = f16(s[GROUP * b + i]), f16(mg[GROUP * b + i])
                word = np.int64(hb[GROUP * b + i])
                row = GROUP * (g - g0) + i
                for j in range(16):
                    byte = q[64 * b + 16 * i + j]
                    lo = np.int64(byte & 15) | (((word >> j) & 1) << 4)
                    hi = np.int64(byte >> 4) | (((word >> (j + 16)) & 1) << 4)
                    if has_min:
                        out[row, 32 * b + j] = d * np.float32(lo) + m
                        out[row, 32 * b + 16 + j] = d * np.float32(hi) + m
                    else:
                        out[row, 32 * b + j] = d * (np.float32(lo) + factor)
                        out[row, 32 * b + 16 + j] = d * (np.float32(hi) + factor)
