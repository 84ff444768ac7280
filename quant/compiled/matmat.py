"""Products of several vectors in float32: Y = X @ W.T for B vectors. (Up to weights.FEW
vectors: fewdot.py, every format.)

The quantized formats with x in float32 (dot "f32"): each thread takes a panel of 16 rows
at a time, dequantized into a float32 buffer that stays in L1/L2 (the format's own
dequantization kernel, dequant.py or ggml.py), then `gemm_panel` multiplies it by the B
vectors, 4 rows x 4 vectors at a time: 16 accumulators of 8 lanes, each loaded weight
serving four vectors and each loaded x four rows. One driver per format family, alike
but for the dequantization kernel each calls by name. (With integer x, and for the float
formats, several vectors run igemm.py's panels.)
"""

from __future__ import annotations

import numba
import numpy as np
from numba import carray, get_thread_id, prange

from .dequant import dequant_q4, dequant_q5, dequant_q8_0
from .ggml import dequant_ggml
from .jit import kernel
from .matvec import GROUP
from .simd.scalar import stack_f32

ROWS = 16  # rows per piece of parallel work (4 groups): 16 x cols float32 in L1/L2


def scratch_for(cols: int) -> np.ndarray:
    """Each thread's buffer for ROWS dequantized rows: (threads, ROWS, cols) float32, made
    once per width. A buffer allocated inside the parallel loop instead made gemm_panel ten
    times slower (19.7 against 1.9 ms on 1024 x 1024 x 64, even with no dequantization)."""
    if cols not in _SCRATCH:
        _SCRATCH[cols] = np.empty((numba.config.NUMBA_NUM_THREADS, ROWS, cols), np.float32)
    return _SCRATCH[cols]


_SCRATCH: dict[int, np.ndarray] = {}


@kernel(inline=True)
def gemm_panel(w, x, out, r0, rows):
    """out[v, r0 + i] = w[i] . x[v] for i < rows and every v.
    w (>= rows, cols) float32, in cache; x (B, cols) float32; out (B, >= r0 + rows).
    Rows and vectors past the end (rows % 4, B % 4) repeat the last one and are not
    stored. 4 rows x 4 vectors x 8 lanes: 16 accumulators that fit the registers of AVX2
    and of LLVM's 256-bit AVX-512 code (4 x 4 x 16 lanes spilled: 48 against 67 GFLOPS
    here, Xeon, 1024 x 1024 x 64). Long on purpose: the 16 multiply-adds of the 4 x 4 must
    sit in one loop body for LLVM to keep its accumulators in registers."""
    nvec, cols = x.shape
    whole = cols // 8 * 8
    acc = carray(stack_f32(128), 128)  # (4 rows, 4 vectors, 8 lanes)
    for i0 in range(0, rows, 4):
        w0, w1 = w[min(i0, rows - 1)], w[min(i0 + 1, rows - 1)]
        w2, w3 = w[min(i0 + 2, rows - 1)], w[min(i0 + 3, rows - 1)]
        for v0 in range(0, nvec, 4):
            x0, x1 = x[min(v0, nvec - 1)], x[min(v0 + 1, nvec - 1)]
            x2, x3 = x[min(v0 + 2, nvec - 1)], x[min(v0 + 3, nvec - 1)]
            for k in range(128):
                acc[k] = 0
            for j in range(0, whole, 8):
                for lane in range(8):
                    c = j + lane
                    a0, a1, a2, a3 = w0[c], w1[c], w2[c], w3[c]
                    b0, b1, b2, b3 = x0[c], x1[c], x2[c], x3[c]
                    acc[0 + lane] += a0 * b0
                    acc[8 + lane] += a0 * b1
                    acc[16 + lane] += a0 * b2
                    acc[24 + lane] += a0 * b3
                    acc[32 + lane] += a1 * b0
                    acc[40 + lane] += a1 * b1
                    acc[48 + lane] += a1 * b2
                    acc[56 + lane] += a1 * b3
                    acc[64 + lane] += a2 * b0
                    acc[72 + lane] += a2 * b1
                    acc[80 + lane] += a2 * b2
                    acc[88 + lane] += a2 * b3
                    acc[96 + lane] += a3 * b0
                    acc[104 + lane] += a3 * b1
                    acc[112 + lane] += a3 * b2
                    acc[120 + lane] += a3 * b3
            for c in range(whole, cols):  # cols % 8: the last columns, into lane 0
                for i in range(4):
                    a = w[min(i0 + i, rows - 1), c]
                    for v in range(4):
                        acc[(4 * i + v) * 8] += a * x[min(v0 + v, nvec - 1), c]
            for i in range(min(4, rows - i0)):
                for v in range(min(4, nvec - v0)):
                    s = np.float32(0)
                    for lane in range(8):
                        s += acc[(4 * i + v) * 8 + lane]
                    out[v0 + v, r0 + i0 + i] = s


@kernel(inline=True)
def pieces(groups):
    """How many pieces of ROWS rows the groups of a grouped matrix make."""
    return -(-groups // (ROWS // GROUP))


@kernel(inline=True)
def piece_groups(c, groups):
    """Groups g0:g1 of piece c."""
    per = ROWS // GROUP
    return c * per, min(groups, c * per + per)


@kernel(parallel=True)
def matmat_q8_0(codes, scales, x, out, scratch):
    """codes, scales: a grouped q8_0 matrix (matvec.rows_q8_0); x (B, cols); out (B, rows)"""
    groups, rows = scales.shape[0], out.shape[1]
    for c in prange(pieces(groups)):
        g0, g1 = piece_groups(c, groups)
        buf = scratch[get_thread_id()]
        dequant_q8_0(codes, scales, g0, g1, buf)
        gemm_panel(buf, x, out, GROUP * g0, min(rows, GROUP * g1) - GROUP * g0)


@kernel(parallel=True)
def matmat_q4(codes, scales, mins, factor, x, out, scratch):
    """A grouped q4_0 / q4_1 matrix (dequant.dequant_q4); x (B, cols); out (B, rows)"""
    groups, rows = scales.shape[0], out.shape[1]
    for c in prange(pieces(groups)):
        g0, g1 = piece_groups(c, groups)
        buf = scratch[get_thread_id()]
        dequant_q4(codes, scales, mins, factor, g0, g1, buf)
        gemm_panel(buf, x, out, GROUP * g0, min(rows, GROUP * g1) - GROUP * g0)


@kernel(parallel=True)
def matmat_q5(codes, scales, mins, factor, bits, x, out, scratch):
    """A grouped q5_0 / q5_1 matrix (dequant.dequant_q5); x (B, cols); out (B, rows)"""
    groups, rows = scales.shape[0], out.shape[1]
    for c in prange(pieces(groups)):
        g0, g1 = piece_groups(c, groups)
        buf = scratch[get_thread_id()]
        dequant_q5(codes, scales, mins, factor, bits, g0, g1, buf)
        gemm_panel(buf, x, out, GROUP * g0, min(rows, GROUP * g1) - GROUP * g0)


@kernel(parallel=True)
def matmat_ggml(blocks, fmt, nbytes, weights, x, out, scratch):
    """A grouped K-quant matrix (ggml.dequant_ggml); x (B, cols); out (B, rows)"""
    groups, rows = blocks.shape[0], out.shape[1]
    for c in prange(pieces(groups)):
        g0, g1 = piece_groups(c, groups)
        buf = scratch[get_thread_id()]
        dequant_ggml(blocks, fmt, nbytes, weights, g0, g1, buf)
        gemm_panel(buf, x, out, GROUP * g0, min(rows, GROUP * g1) - GROUP * g0)
