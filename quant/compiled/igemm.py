"""Batched products in integers: Y = X @ W.T for B vectors at once (a batch's decode step,
or a prompt's tokens), every quantized format, its codes multiplied by x's integers.

Each row of X is rounded once per product exactly as decode rounds x (intdot.quantize_x,
int8 or int16 per block of 32, and per16's sums). The matrix is taken a panel of 16 rows
(4 groups of the compiled layout) at a time: the panel is decoded once into the thread's
scratch, in one integer form for every format (simd/panels.py: byte codes and a float
scale and offset per row and sub-block of 16, the codes laid out so that one vpdpbusd
advances 16 rows), then multiplied by the vectors 4 at a time (panels.tile: the codes
loaded once for 4 vectors, 4 float accumulators in registers). The weights are read from
memory once per product whatever B is; decoding them costs once per weight, the integer
multiply-adds B times.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import get_thread_id, prange

from .intdot import per16, quantize_x
from .jit import kernel
from .simd import AVX512
from .simd.broadcast import (
    NARROW_LANES,
    TILE_LANES,
    TILE_ROWS,
    bcast_tile1,
    bcast_tile2,
    bcast_tile8,
    transpose_block8,
    transpose_block16,
)
from .simd.panels import (
    FLOAT_VECTORS,
    VECTORS,
    float_tile,
    panel_bf16,
    panel_f16,
    panel_nibbles,
    panel_q2_k,
    panel_q3_k,
    panel_q4_k,
    panel_q5_k,
    panel_q6_k,
    panel_q8_0,
    tile,
)
from .simd.scalar import SHORT_ROW, ask_l2, prefetch

ROWS = 16  # rows of a panel


def scratch_for(cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Each thread's panel: codes (threads, cols / 16 * 256) uint8 and scales and offsets
    (threads, cols / 16 * 32) float32, made once per width."""
    if cols not in _SCRATCH:
        threads, nsub = numba.config.NUMBA_NUM_THREADS, -(-cols // 256) * 16
        _SCRATCH[cols] = (np.empty((threads, nsub * 256), np.uint8),
                          np.empty((threads, nsub * 32), np.float32))  # fmt: skip
    return _SCRATCH[cols]


_SCRATCH: dict[int, tuple[np.ndarray, np.ndarray]] = {}


@kernel(parallel=True)
def quantize_rows(x, xq, xd, xsum, xd16, xb16, lo):
    """Every row of x (B, cols) rounded as decode rounds x (intdot.quantize_x, per16):
    xq (B, 2 cols) its integers (int16: high bytes, then the low ones lo on), xd and xsum
    (B, cols / 32) the scales and sums of the integers, xd16 and xb16 (B, cols / 16) the
    scales and the scale times the sum of each 16 integers."""
    for v in prange(x.shape[0]):
        quantize_x(x[v], xq[v], xd[v], xsum[v], lo)
        per16(xq[v], xd[v], lo, xd16[v], xb16[v])


def quantized_rows(x: np.ndarray, wide: bool) -> tuple:
    """x (B, cols) rounded (quantize_rows): (xq, xd, xsum, xd16, xb16, lo)."""
    b, n = x.shape
    lo = n if wide else 0
    xq = np.empty((b, 2 * n if wide else n), np.int8)
    xd, xsum = np.empty((b, n // 32), np.float32), np.empty((b, n // 32), np.int32)
    xd16, xb16 = np.empty((b, n // 16), np.float32), np.empty((b, n // 16), np.float32)
    quantize_rows(x, xq, xd, xsum, xd16, xb16, lo)
    return xq, xd, xsum, xd16, xb16, lo


def folded_offsets(fold: int, xsum: np.ndarray, paired: int) -> tuple[np.ndarray, int]:
    """(xoff, fold) for panels.tile: where a format's offset is a constant times its scale
    (`fold`: q8_0's -128, q4_0's -8, q5_0's -16; 0 for the others) and one scale covers a
    pair of sub-blocks, that constant times x's integer sums (B, cols / 32; int16 x's
    whole integers: at most 128 x 32 x 16256 in magnitude), where the tile starts each
    pair's integer sum; else nothing to fold (0)."""
    if fold and paired:
        return (fold * xsum).astype(np.int32), fold
    return xsum[:, :0], 0


def paired_xb(xb16: np.ndarray) -> np.ndarray:
    """(B, cols / 32): the sums xb16[:, 2 j] + xb16[:, 2 j + 1], the offsets' factor of a
    format with one scale and offset per 32 weights (the tile's `paired`), added once per
    product instead of once per panel."""
    return xb16[:, 0::2] + xb16[:, 1::2]


# The panel decoders, one per kind of grouped matrix: (its arrays as layers.Operands names
# them: a0..a3, factor, code, nbytes; the panel's first group and how many of its 4 are
# rows of the matrix; the scratch). A driver takes one as an argument (numba compiles the
# driver once per decoder: one function holding every decoder compiled ten times slower).


@kernel(inline=True)
def ask_ahead(a, g0, part, parts):
    """Ask for part `part` of `parts` of groups g0..g0 + 3 of a (simd.scalar.prefetch):
    a decoder asks for the next panel's scales (and q5's bits) while it decodes its own.
    A thread's panels follow one another in memory, but a panel reads its 4 groups as 4
    short streams, which the hardware prefetcher picked up too late. The codes, the bulk,
    are asked for by the tiles (matmat_int)."""
    width = a.shape[1]
    line = max(1, 64 // a.itemsize)
    at = g0 * width
    for i in range(at + 4 * width * part // parts, at + 4 * width * (part + 1) // parts, line):
        prefetch(a, i)


@kernel
def panels_q8_0(a0, a1, a2, factor, a3, code, nbytes, g0, gvalid, dst, dm):
    nb = a1.shape[1] // 4
    steps = -(-nb // 2)
    for b in range(0, nb, 2):
        ask_ahead(a1, g0 + 4, b // 2, steps)
        panel_q8_0(a0, a1, g0, gvalid, b, min(2, nb - b), dst, dm)


@kernel
def panels_nibbles(a0, a1, a2, factor, a3, code, nbytes, g0, gvalid, dst, dm):
    nb = a1.shape[1] // 4
    steps = -(-nb // 2)
    for b in range(0, nb, 2):
        ask_ahead(a1, g0 + 4, b // 2, steps)
        ask_ahead(a2, g0 + 4, b // 2, steps)
        ask_ahead(a3, g0 + 4, b // 2, steps)
        panel_nibbles(a0, a1, a2, factor, a3, g0, gvalid, b, min(2, nb - b), dst, dm)


@kernel
def panels_k(a0, a1, a2, factor, a3, code, nbytes, g0, gvalid, dst, dm):
    # no ask_ahead (the tiles ask for the next panel's bytes, matmat_int): asked for here,
    # into L1, the next panel made Qwen's q4_k and q6_k products slower (B = 16, 2
    # alternations: 0.66-0.72 / 0.78-0.87 ms against 0.64-0.65 / 0.73-0.74)
    for blk in range(a0.shape[1] // (4 * nbytes)):
        if code == 0:
            panel_q2_k(a0, nbytes, g0, gvalid, blk, dst, dm)
        elif code == 1:
            panel_q3_k(a0, nbytes, g0, gvalid, blk, dst, dm)
        elif code == 2:
            panel_q4_k(a0, nbytes, g0, gvalid, blk, dst, dm)
        elif code == 3:
            panel_q5_k(a0, nbytes, g0, gvalid, blk, dst, dm)
        else:
            panel_q6_k(a0, nbytes, g0, gvalid, blk, dst, dm)


@kernel(parallel=True)
def matmat_int(decode, a0, a1, a2, factor, a3, code, nbytes, signed, paired, xq, xd, xb, xoff,
               fold, lo, add, out, codes, dms):  # fmt: skip
    """out (B, rows) (=, or += when add) X @ W.T for W decoded by `decode` (a panels_
    function, its arrays after it; `signed`: its codes are int8, SIGNED_Q8; `paired`: its
    scales are per 32 weights, panels.tile) and X as quantize_rows rounds it (xb: its
    xb16, or paired_xb of it when `paired`, unread when folded; xoff, fold: folded_offsets,
    panels.tile);
    codes, dms: scratch_for(cols)."""
    groups = a0.shape[0]
    rows, nvec = out.shape[1], xq.shape[0]
    nsub = xd.shape[1] * 2
    # Each tile asks for its share of the next panel's bytes (128 per sub-block, into L2:
    # panels.tile), so that they arrive while the tiles compute. Asked for during the
    # decode only (ask_ahead), from DRAM a panel cost ~5 cycles a row's block more than in
    # cache; asked for by the tiles, about what it costs in cache (DEVELOPERS.md)
    weights = a0.reshape(-1).view(np.uint8)
    span = 128 * nsub  # bytes of the next panel each tile asks for (panels.tile)
    for p in prange(-(-groups // 4)):
        t = get_thread_id()
        dst, dm = codes[t], dms[t]
        g0 = 4 * p
        decode(a0, a1, a2, factor, a3, code, nbytes, g0, min(4, groups - g0), dst, dm)
        xrows, orows = np.empty(VECTORS, np.int64), np.empty(VECTORS, np.int64)
        for v0 in range(0, nvec, VECTORS):
            for v in range(VECTORS):
                xrows[v] = min(v0 + v, nvec - 1)  # past the end: the last again, not stored
                orows[v] = v0 + v if v0 + v < nvec else -1
            ahead = (g0 + 4) * a0.shape[1] * a0.itemsize + span * (v0 // VECTORS)
            tile(dst, dm, nsub, xq, xrows, lo, xd, xb, xoff, fold, signed, paired, out, orows,
                 ROWS * p, min(ROWS, rows - ROWS * p), add, weights, ahead)  # fmt: skip


# --- float weights (f16, bf16): the same shape, in float32 (simd/panels.float_tile); f32
# takes its weights as broadcast operands, no panel (matmat_f32, below)


@kernel(inline=True)
def ask_panel(w, r0, k):
    """Where w's rows are short (under SHORT_ROW bytes), ask for the share of the next
    panel (rows r0 + ROWS on, the thread's next: they follow in memory) that this panel's
    decode step at column k matches: 16 rows x 16 columns' bytes, in the next panel's own
    order. A panel of short rows is 16 short streams, which the hardware prefetcher picks
    up too late (as the f32 tiles', simd/broadcast.py): 3072 x 576 bf16 from DRAM, 2
    threads, B = 8 / 16 380 / 516 us where 487 / 624. Long rows are left to it: asking
    made 2048 x 2048 slower (860 / 1243 where 725 / 1022; Xeon family 6 model 167)."""
    cols = w.shape[1]
    if cols * w.itemsize < SHORT_ROW:
        ask_l2(w, (r0 + ROWS) * cols + k * ROWS, ROWS * 16)


@kernel
def panels_f16(w, r0, nrows, dst):
    for k in range(0, w.shape[1], 16):
        ask_panel(w, r0, k)
        panel_f16(w, r0, nrows, k, dst)


@kernel
def panels_bf16(w, r0, nrows, dst):
    for k in range(0, w.shape[1], 16):
        ask_panel(w, r0, k)
        panel_bf16(w, r0, nrows, k, dst)


def float_scratch(cols: int) -> np.ndarray:
    """Each thread's float panel: (threads, 16 x cols rounded up to 16) float32."""
    key = ("float", cols)
    if key not in _SCRATCH:
        _SCRATCH[key] = np.empty((numba.config.NUMBA_NUM_THREADS, 16 * (-(-cols // 16) * 16)),
                                 np.float32)  # fmt: skip
    return _SCRATCH[key]


@kernel(parallel=True)
def matmat_float(decode, w, x, add, out, panels):
    """out (B, rows) (=, or += when add) X @ W.T for a row-major float matrix, a panel of
    16 rows at a time decoded into float32 (`decode`: a panels_ function) and multiplied by
    FLOAT_VECTORS vectors at a time."""
    rows, nvec, cols = w.shape[0], x.shape[0], w.shape[1]
    for p in prange(-(-rows // ROWS)):
        dst = panels[get_thread_id()]
        r0 = ROWS * p
        n = min(ROWS, rows - r0)
        decode(w, r0, n, dst)
        xrows, orows = np.empty(FLOAT_VECTORS, np.int64), np.empty(FLOAT_VECTORS, np.int64)
        for v0 in range(0, nvec, FLOAT_VECTORS):
            for v in range(FLOAT_VECTORS):
                xrows[v] = min(v0 + v, nvec - 1)
                orows[v] = v0 + v if v0 + v < nvec else -1
            float_tile(dst, cols, x, xrows, out, orows, r0, n, add)


@kernel(parallel=True)
def transpose_groups(x, xt):
    """xt[g, k, l] = x[L g + l, k], zeros past x's last row: x (B, cols) as the float
    tiles read it (xt: (groups, cols, L), L = 16 lanes, or NARROW_LANES), a block of 16
    columns at a time (simd/broadcast.transpose_block16, 8)."""
    lanes, blocks = xt.shape[2], -(-x.shape[1] // 16)
    for i in prange(xt.shape[0] * blocks):
        g, k0 = i // blocks, 16 * (i % blocks)
        if lanes == NARROW_LANES:
            transpose_block8(x, lanes * g, k0, xt, g)
        else:
            transpose_block16(x, lanes * g, k0, xt, g)


@kernel(parallel=True)
def matmat_bcast(w, xt, nvec, add, out, col):
    """out[:, col:col + rows] (B, rows) (=, or += when add) X @ W.T for row-major float32
    weights, X as transpose_groups lays it out: tiles of TILE_ROWS rows x 32 vectors (x 16
    for an odd last group, and every group on AVX2; x 8 in narrow lanes for B <= 8;
    simd/broadcast.py), a tile's rows read from memory once for all groups."""
    rows, groups = w.shape[0], xt.shape[0]
    narrow = xt.shape[2] == NARROW_LANES
    # two groups a tile: AVX2's 16 registers hold only one group's 8 rows
    pairs = groups // 2 if AVX512 and not narrow else 0
    for p in prange(-(-rows // TILE_ROWS)):
        r0 = TILE_ROWS * p
        n = min(TILE_ROWS, rows - r0)
        if narrow:
            bcast_tile8(w, r0, n, xt, 0, nvec, add, out, col + r0)
            continue
        for g in range(0, 2 * pairs, 2):
            bcast_tile2(w, r0, n, xt, g, nvec - TILE_LANES * g, add, out, col + r0)
        for g in range(2 * pairs, groups):
            bcast_tile1(w, r0, n, xt, g, nvec - TILE_LANES * g, add, out, col + r0)


def transposed(x: np.ndarray) -> np.ndarray:
    """x (B, cols) as matmat_bcast reads it (transpose_groups: in 8 lanes for B <= 8)."""
    x = np.ascontiguousarray(x, np.float32)  # the transpose reads rows from its data
    lanes = NARROW_LANES if x.shape[0] <= NARROW_LANES else TILE_LANES
    xt = np.empty((-(-x.shape[0] // lanes), x.shape[1], lanes), np.float32)
    transpose_groups(x, xt)
    return xt


def matmat_f32(ws: list[np.ndarray], x: np.ndarray, add: bool, out: np.ndarray) -> None:
    """out (B, rows) (=, or += when add) x (B, cols) @ W.T for W the row-major float32
    matrices ws stacked (their rows one after the other in out's columns): x transposed
    once, then matmat_bcast per matrix."""
    xt, col = transposed(x), 0
    for w in ws:
        matmat_bcast(w, xt, x.shape[0], add, out, col)
        col += w.shape[0]
