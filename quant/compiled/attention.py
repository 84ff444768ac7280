"""Decode attention in one kernel per layer: RoPE on q and k, the new key and value
appended to the cache in its stored format, then softmax(q K^T / sqrt(d)) V over the
cached positions, read in their stored format (f32, f16 or q8_0) without a dequantized
copy of the prefix.

Work is split over (KV head, run of keys), so both cores share even one head's keys; each
piece keeps its own running maximum and sum, and the pieces are merged at the end (the
"split-K" of flash-decoding). Query heads that share a KV head (GQA) read its keys once:
GROUPs of four queries share each loaded key or value in registers (padded with zero
queries up to a whole group), and every group has its turn at two tiles of keys, or a
CHUNK of values, while they sit in L1, so each byte comes from memory once.
"""

from __future__ import annotations

import numpy as np
from numba import carray, prange
from numba.extending import overload

from ..ggml import BLOCK
from ..kv import TILE
from .jit import kernel
from .ops import exp_neg
from .simd.lanes import add16, fma16, fma16_f16, fma16_i8, max16, set16, zero16
from .simd.scalar import f16, f32, prefetch, stack_f32, to_f16

TILES_PER_TASK = 16  # tiles of 16 keys one piece of parallel work reads, at least
GROUP = 4  # query heads of one KV head that one pass over its keys or values serves
WIDE = 64  # elements of a value each query of a group accumulates in registers a pass
PAIR = 2 * GROUP * 16  # accumulators of a group's scores over two tiles of keys
SPAN = GROUP * WIDE  # accumulators of a group's weighed values
CHUNK = 32  # slots whose values every group weighs in turn (8 KiB of f32 at head_dim 64)
# How far ahead the float loops ask for lines (simd.scalar.prefetch). A tile is one 4 KiB
# page at head_dim 64, and the hardware prefetcher stops at a page's end: without these,
# compute and reads took turns (TinyLlama's shape from DRAM, B = 16 at 4096 keys: 7.5 ms
# a layer, 6.9 with; the same loops on keys in L3 4.0). The next pair of tiles and 32
# slots ahead, not 4 tiles and 64: farther lines were evicted before their turn (the
# same shape, scripts/bench_attention.py, 3 alternations: 6.5-6.9 ms against 7.7-7.9;
# Qwen's 14/2 heads 3.3 against 3.7-3.9, B = 1 0.38 against 0.42-0.49; Zen 4, 2026-11-26).
KEYS_AHEAD = 2  # tiles
VALUES_AHEAD = 32  # slots


# --- the KV stores, by format --------------------------------------------------------
# A store reaches a kernel as the tuple of its arrays (quant.kv.KVStore.arrays): its first
# array's type names the format (STORE_FORMATS): float32 values, float16 bits (uint16),
# or q8_0's int8 codes, followed by one float16 scale per block of 32. Keys are tiled,
# (n_kv, slots / 16, width, 16); values head-major, (n_kv, slots, width).
STORE_FORMATS = {"float32": "f32", "uint16": "f16", "int8": "q8_0"}


def put_key(keys, h, slot, vec):
    """keys[h, slot] = vec (head_dim,) float32, in the store's format (tiled)."""


def put_value(values, h, slot, vec):
    """values[h, slot] = vec (head_dim,) float32, in the store's format (head-major)."""


def pair_scores(keys, h, ta, tb, q, g, acc):
    """acc[16 r : 16 r + 16] = q[g + r] . key for the 16 keys of tile ta of head h, and
    acc[16 (GROUP + r) : ...] for tile tb, r < GROUP (q: (queries, head_dim), 2-D so that
    numba's check for a negative index, on the row, leaves the inner loop). Each 16
    elements of the keys are loaded once for GROUP fused multiply-adds, 2 x GROUP
    accumulators in all (registers: acc must be on the stack)."""


def weigh_group(values, h, k0, i0, i1, probs, g, rows, o, at, stride):
    """For the queries g + r sharing KV head h, r < rows <= GROUP (the group's rest is
    padding): o[at + r * stride : ... + head_dim] += sum over slots i in i0:i1 of
    probs[g + r, i - k0] * value (h, i). A value's 16 elements are loaded once for GROUP
    fused multiply-adds, into accumulators held in registers over all of i0:i1 (64
    elements of every query a pass, then 16), added to o at the end."""


def store_format(store) -> str:
    """The KV format of a store's tuple of arrays, from the numba type of its first array."""
    return STORE_FORMATS[store.types[0].dtype.name]


def _is_q8_0(store) -> bool:
    return store_format(store) == "q8_0"


def _is_f16(store) -> bool:
    return store_format(store) == "f16"


@kernel(inline=True)
def roundf(v):
    """C's roundf (half away from zero), as quant.ggml.np_roundf computes it."""
    a = abs(v)
    fl = np.floor(a)
    r = fl + np.floor(np.float32(2) * (a - fl))
    return r if v >= 0 else -r


@kernel(inline=True)
def q8_0_block(vec, b, codes):
    """Quantize block b of vec into codes (32,) int8; returns the scale d. The arithmetic
    of quant.ggml.quantize_q8_0, so both backends store the same codes."""
    amax = np.float32(0)
    for j in range(BLOCK):
        amax = max(amax, abs(vec[BLOCK * b + j]))
    d = amax / np.float32(127)
    inv = np.float32(0) if d == 0 else np.float32(1) / d
    for j in range(BLOCK):
        codes[j] = np.int8(roundf(vec[BLOCK * b + j] * inv))
    return min(d, np.float32(65504))


@kernel(inline=True)
def f16_saturated(v):
    return to_f16(min(max(v, np.float32(-65504)), np.float32(65504)))


@overload(put_key, inline="always")
def _put_key(keys, h, slot, vec):
    if _is_q8_0(keys):

        def put_q8_0(keys, h, slot, vec):
            codes, scales = keys
            t, lane = slot // TILE, slot % TILE
            block = np.empty(BLOCK, np.int8)
            for b in range(vec.shape[0] // BLOCK):
                scales[h, t, b, lane] = to_f16(q8_0_block(vec, b, block))
                for j in range(BLOCK):
                    codes[h, t, BLOCK * b + j, lane] = block[j]

        return put_q8_0
    if _is_f16(keys):

        def put_f16(keys, h, slot, vec):
            for j in range(vec.shape[0]):
                keys[0][h, slot // TILE, j, slot % TILE] = f16_saturated(vec[j])

        return put_f16

    def put_f32(keys, h, slot, vec):
        for j in range(vec.shape[0]):
            keys[0][h, slot // TILE, j, slot % TILE] = vec[j]

    return put_f32


@overload(put_value, inline="always")
def _put_value(values, h, slot, vec):
    if _is_q8_0(values):

        def put_q8_0(values, h, slot, vec):
            codes, scales = values
            for b in range(vec.shape[0] // BLOCK):
                scales[h, slot, b] = to_f16(q8_0_block(vec, b, codes[h, slot, BLOCK * b :]))

        return put_q8_0
    if _is_f16(values):

        def put_f16(values, h, slot, vec):
            for j in range(vec.shape[0]):
                values[0][h, slot, j] = f16_saturated(vec[j])

        return put_f16

    def put_f32(values, h, slot, vec):
        values[0][h, slot, :] = vec

    return put_f32


@kernel(inline=True)
def zero(a, n):
    """a[:n] = 0 for n a multiple of 16 (numba lowers slice assignment generically, and
    LLVM vectorizes the plain loop across the wrong axis)."""
    for i in range(0, n, TILE):
        zero16(a, i)


@overload(pair_scores, inline="always")
def _pair_scores(keys, h, ta, tb, q, g, acc):
    if _is_q8_0(keys):

        def scores_q8_0(keys, h, ta, tb, q, g, acc):
            codes, scales = keys
            hd, tiles = codes.shape[2], codes.shape[1]
            a, b = (h * tiles + ta) * hd, (h * tiles + tb) * hd
            tmp = carray(stack_f32(PAIR), PAIR)
            zero(acc, 2 * GROUP * TILE)
            for blk in range(hd // BLOCK):
                zero(tmp, 2 * GROUP * TILE)
                for j in range(BLOCK * blk, BLOCK * (blk + 1)):
                    for r in range(GROUP):
                        x = q[g + r, j]
                        fma16_i8(tmp, TILE * r, x, codes, (a + j) * TILE)
                        fma16_i8(tmp, TILE * (GROUP + r), x, codes, (b + j) * TILE)
                sa = ((h * tiles + ta) * (hd // BLOCK) + blk) * TILE
                sb = ((h * tiles + tb) * (hd // BLOCK) + blk) * TILE
                for r in range(GROUP):
                    fma16_f16(acc, TILE * r, tmp[TILE * r :], scales, sa)
                    fma16_f16(acc, TILE * (GROUP + r), tmp[TILE * (GROUP + r) :], scales, sb)

        return scores_q8_0
    fma = fma16_f16 if _is_f16(keys) else fma16

    def scores_float(keys, h, ta, tb, q, g, acc):
        k = keys[0]
        hd, tiles = k.shape[2], k.shape[1]
        a, b = (h * tiles + ta) * hd, (h * tiles + tb) * hd
        zero(acc, 2 * GROUP * TILE)
        for j in range(hd):
            prefetch(k, (a + j) * TILE + KEYS_AHEAD * hd * TILE)
            prefetch(k, (b + j) * TILE + KEYS_AHEAD * hd * TILE)
            for r in range(GROUP):
                x = q[g + r, j]
                fma(acc, TILE * r, x, k, (a + j) * TILE)
                fma(acc, TILE * (GROUP + r), x, k, (b + j) * TILE)

    return scores_float


@kernel(inline=True)
def put_group(acc, width, rows, o, at, stride, c):
    """o[at + r * stride + c : ... + width] += acc[r * width : (r + 1) * width] for the
    group's first `rows` queries (the rest: padding)."""
    for r in range(rows):
        out = at + r * stride + c
        for v in range(0, width, TILE):
            add16(o, out + v, acc, r * width + v)


@kernel(inline=True)
def q8_0_values(values, h, k0, i0, i1, probs, g, acc, c, nb):
    """acc[r * 32 nb : (r + 1) * 32 nb] = the GROUP queries' weighed sum of the nb (a
    constant) blocks of q8_0 values from element c: each block's scale folded into the
    probability, the codes widened once for GROUP fused multiply-adds."""
    codes, scales = values
    hd, slots = codes.shape[2], codes.shape[1]
    zero(acc, GROUP * nb * BLOCK)
    for i in range(i0, i1):
        row = (h * slots + i) * hd + c
        for blk in range(nb):
            d = f16(scales[h, i, c // BLOCK + blk])
            for r in range(GROUP):
                p = probs[g + r, i - k0] * d
                for v in range(0, BLOCK, TILE):
                    at = (r * nb + blk) * BLOCK + v
                    fma16_i8(acc, at, p, codes, row + BLOCK * blk + v)


@overload(weigh_group, inline="always")
def _weigh_group(values, h, k0, i0, i1, probs, g, rows, o, at, stride):
    if _is_q8_0(values):

        def weigh_q8_0(values, h, k0, i0, i1, probs, g, rows, o, at, stride):
            hd = values[0].shape[2]
            acc = carray(stack_f32(SPAN), SPAN)
            wide = hd // WIDE * WIDE
            for c in range(0, wide, WIDE):  # two blocks a pass, then one
                q8_0_values(values, h, k0, i0, i1, probs, g, acc, c, WIDE // BLOCK)
                put_group(acc, WIDE, rows, o, at, stride, c)
            if wide < hd:
                q8_0_values(values, h, k0, i0, i1, probs, g, acc, wide, 1)
                put_group(acc, BLOCK, rows, o, at, stride, wide)

        return weigh_q8_0
    fma = fma16_f16 if _is_f16(values) else fma16
    widen = f16 if _is_f16(values) else f32

    def weigh_float(values, h, k0, i0, i1, probs, g, rows, o, at, stride):
        v = values[0]
        hd, slots = v.shape[2], v.shape[1]
        wide, whole = hd // WIDE * WIDE, hd // TILE * TILE
        acc = carray(stack_f32(SPAN), SPAN)
        for c in range(0, wide, WIDE):
            zero(acc, GROUP * WIDE)
            for i in range(i0, i1):
                row = (h * slots + i) * hd + c
                for j in range(0, WIDE, TILE):
                    prefetch(v, row + VALUES_AHEAD * hd + j)
                for r in range(GROUP):
                    p = probs[g + r, i - k0]
                    for j in range(0, WIDE, TILE):
                        fma(acc, r * WIDE + j, p, v, row + j)
            put_group(acc, WIDE, rows, o, at, stride, c)
        for c in range(wide, whole, TILE):
            zero(acc, GROUP * TILE)
            for i in range(i0, i1):
                row = (h * slots + i) * hd + c
                for r in range(GROUP):
                    fma(acc, r * TILE, probs[g + r, i - k0], v, row)
            put_group(acc, TILE, rows, o, at, stride, c)
        for r in range(rows):  # head_dim % 16: the last elements, one at a time
            out = at + r * stride
            for j in range(whole, hd):
                for i in range(i0, i1):
                    o[out + j] += probs[g + r, i - k0] * widen(v[h, i, j])

    return weigh_float


# --- the kernel ------------------------------------------------------------------------


@kernel(inline=True)
def rope(x, cos, sin):
    """Rotate-half RoPE in place on x (head_dim,): the pair (j, j + half) turns by the
    angle whose cos and sin are given (half,)."""
    half = cos.shape[0]
    for j in range(half):
        a, b = x[j], x[j + half]
        x[j] = a * cos[j] - b * sin[j]
        x[j + half] = b * cos[j] + a * sin[j]


@kernel(inline=True)
def split(tiles):
    """(pieces, tiles per piece) for the parallel work over `tiles` tiles of one head: at
    least TILES_PER_TASK tiles a piece, at most 64 pieces, and none left empty (rounding
    the run up could leave the last pieces without a tile: from 4609 keys on, such a
    piece once made the kernel fail)."""
    pieces = max(1, min(tiles // TILES_PER_TASK, 64))
    run = -(-tiles // pieces)
    return -(-tiles // run), run


# What a layer's attention does beyond llama's, as the kernels take it: `spec` = (q_norm,
# k_norm, eps, scale, cap): the RMSNorm weights of q and of k before RoPE (empty: none;
# head_dim of them: each head normed alone, qwen3 and gemma3; q_dim / kv_dim: each whole
# projection, olmo2), their eps, the scores' scale (1 / sqrt(head_dim) for llama) and
# the scores' soft-cap (gemma2: cap * tanh(s / cap); 0: none).


def spec_of(q_norm, k_norm, eps, scale, cap):
    """A spec from its parts (float32 arrays, numbers)."""
    return (q_norm, k_norm, np.float32(eps), np.float32(scale), np.float32(cap))


@kernel(inline=True)
def norm_head(v, whole, w, eps, h):
    """RMSNorm of head h's vector v (head_dim,) in place: over v itself when w holds a
    head's weights, else over the whole projection `whole` (w: its weights)."""
    hd = v.shape[0]
    s = np.float32(0)
    if w.shape[0] == hd:
        for i in range(hd):
            s += v[i] * v[i]
        inv = np.float32(1) / np.sqrt(s / np.float32(hd) + eps)
        for j in range(hd):
            v[j] = v[j] * inv * w[j]
    else:
        for i in range(whole.shape[0]):
            s += whole[i] * whole[i]
        inv = np.float32(1) / np.sqrt(s / np.float32(whole.shape[0]) + eps)
        for j in range(hd):
            v[j] = v[j] * inv * w[h * hd + j]


@kernel(inline=True)
def append(qkv, cos, sin, spec, keys, values, slot, h, n_heads):
    """KV head h of the token (in qkv, after the n_heads queries): its key normed (spec)
    and rotated, both stored at `slot` in the stores' format."""
    n_kv, hd = values[0].shape[0], values[0].shape[2]
    k = qkv[(n_heads + h) * hd : (n_heads + h + 1) * hd].copy()
    if spec[1].shape[0]:
        norm_head(k, qkv[n_heads * hd : (n_heads + n_kv) * hd], spec[1], spec[2], h)
    rope(k, cos, sin)
    put_key(keys, h, slot, k)
    put_value(values, h, slot, qkv[(n_heads + n_kv + h) * hd : (n_heads + n_kv + h + 1) * hd])


@kernel(inline=True)
def queries(qkv, cos, sin, spec, h, rep, hd):
    """The rep query heads that share KV head h, normed (spec), rotated and scaled, then
    zeros up to a whole number of GROUPs ((groups * GROUP * hd,) float32)."""
    padded = -(-rep // GROUP) * GROUP
    q = np.zeros(padded * hd, np.float32)
    q[: rep * hd] = qkv[h * rep * hd : (h + 1) * rep * hd]
    for r in range(rep):
        if spec[0].shape[0]:  # the whole q: qkv's first q_dim (a head's weights: unread)
            whole = qkv[: spec[0].shape[0]]
            norm_head(q[r * hd : (r + 1) * hd], whole, spec[0], spec[2], h * rep + r)
        rope(q[r * hd : (r + 1) * hd], cos, sin)
        for j in range(hd):
            q[r * hd + j] *= spec[3]
    return q


@kernel(inline=True)
def maximum(x):
    """x.max() for x (n,) float32, NaN if any element is NaN (as NumPy's), 16 lanes at a
    time: NumPy's max compiles to a scalar loop with a branch for NaN on every element."""
    n = x.shape[0] // TILE * TILE
    m = x[0]
    if n > 0:
        lanes = carray(stack_f32(TILE), TILE)
        set16(lanes, 0, x, 0)
        for i in range(TILE, n, TILE):
            max16(lanes, 0, x, i)
        for j in range(TILE):
            if lanes[j] > m or lanes[j] != lanes[j]:
                m = lanes[j]
    for i in range(n, x.shape[0]):
        if x[i] > m or x[i] != x[i]:  # a NaN stays
            m = x[i]
    return m


@kernel(inline=True)
def group_scores(keys, h, t0, t1, q, scores):
    """scores[r, 16 (t - t0) : ... + 16] = q_r . the keys of tile t for every query r of
    q (rows: a whole number of GROUPs) and the tiles t0:t1 of head h, two at a time (an
    odd last one paired with itself), every group's while the two are in L1: each byte
    comes from memory once, and the reads keep going through the whole phase."""
    acc = carray(stack_f32(PAIR), PAIR)
    for t in range(t0, t1, 2):
        tb = min(t + 1, t1 - 1)
        for g in range(0, q.shape[0], GROUP):
            pair_scores(keys, h, t, tb, q, g, acc)
            for r in range(GROUP):
                row = (g + r) * scores.shape[1]
                set16(scores, row + (t - t0) * TILE, acc, TILE * r)
                if tb > t:
                    set16(scores, row + (tb - t0) * TILE, acc, TILE * (GROUP + r))


@kernel
def attend_task(qkv, cos, sin, spec, keys, values, slot, n, task, run, top, total, part):
    """One piece of a decode step's attention: KV head h = task // pieces and its run of
    tiles number task % pieces, for the queries that share h. The piece whose tiles hold
    `slot` (or the last, for a slot past them) first appends the new key and value. Its
    results: top, total (n_heads, pieces): the scores' maximum and sum of exp(score - top);
    part (n_heads, pieces, hd): the values weighed by those exp. (qkv ... n: as attend.)"""
    n_heads, pieces, hd = part.shape
    rep = n_heads // values[0].shape[0]
    h, piece = task // pieces, task % pieces
    tiles = -(-n // TILE)
    t0, t1 = piece * run, min(tiles, (piece + 1) * run)
    k0, k1 = t0 * TILE, min(n, t1 * TILE)
    if t0 <= slot // TILE < t1 or (piece == pieces - 1 and slot // TILE >= t1):
        append(qkv, cos, sin, spec, keys, values, slot, h, n_heads)
    q = queries(qkv, cos, sin, spec, h, rep, hd)
    scores = np.empty((q.shape[0] // hd, (t1 - t0) * TILE), np.float32)
    group_scores(keys, h, t0, t1, q.reshape((-1, hd)), scores)
    cap = spec[4]
    for r in range(rep):
        hq = h * rep + r
        sc = scores[r, : k1 - k0]
        if cap != np.float32(0):  # gemma2: cap * tanh(s / cap), before the softmax
            for i in range(k1 - k0):
                sc[i] = cap * np.tanh(sc[i] / cap)
        m = maximum(sc)
        s = np.float32(0)
        for i in range(k1 - k0):
            sc[i] = exp_neg(sc[i] - m)
            s += sc[i]
        top[hq, piece], total[hq, piece] = m, s
        part[hq, piece, :] = 0
    o = part.reshape(-1)
    for i0 in range(k0, k1, CHUNK):  # every group's, while the chunk's values are in L1
        for g in range(0, rep, GROUP):
            at = ((h * rep + g) * pieces + piece) * hd
            i1 = min(i0 + CHUNK, k1)
            weigh_group(values, h, k0, i0, i1, scores, g, min(GROUP, rep - g), o, at, pieces * hd)


@kernel
def combine(top, total, part, out):
    """The pieces of every query head merged: out (n_heads * hd,) = softmax-weighed values."""
    n_heads, pieces, hd = part.shape
    for hq in range(n_heads):
        m = top[hq].max()
        s = np.float32(0)
        o = out[hq * hd : (hq + 1) * hd]
        o[:] = 0
        for piece in range(pieces):
            w = exp_neg(top[hq, piece] - m)
            s += w * total[hq, piece]
            for j in range(hd):
                o[j] += w * part[hq, piece, j]
        inv = np.float32(1) / s
        for j in range(hd):
            o[j] *= inv


@kernel(inline=True)
def pieces_of(qkv, hd, n_kv, n):
    """Scratch for the pieces of a decode attention over n keys: top, total, part (see
    attend_task), and the run of tiles per piece."""
    n_heads = (qkv.shape[0] - 2 * n_kv * hd) // hd
    pieces, run = split(-(-n // TILE))
    top = np.empty((n_heads, pieces), np.float32)
    total = np.empty((n_heads, pieces), np.float32)
    return top, total, np.empty((n_heads, pieces, hd), np.float32), run


@kernel(parallel=True)
def attend(qkv, cos, sin, spec, keys, values, slot, n, out):
    """One decode step of one layer.
    qkv (n_heads * hd + 2 * n_kv * hd,) the token's projections, q then k then v;
    cos, sin (rotary / 2,) the token's RoPE angle (partial rotary: fewer than hd / 2);
    spec: what the layer does beyond llama's (spec_of); keys (tiled), values: the
    layer's stores. The new key and value go to `slot`, then the token attends to slots
    0..n-1 (a ring's slots in any order: attention does not care). out (n_heads * hd,)."""
    n_kv, hd = values[0].shape[0], values[0].shape[2]
    top, total, part, run = pieces_of(qkv, hd, n_kv, n)
    for task in prange(n_kv * part.shape[1]):  # prange counts in uint64: as the team's int64
        attend_task(qkv, cos, sin, spec, keys, values, slot, n, np.int64(task), run, top, total,
                    part)  # fmt: skip
    combine(top, total, part, out)
