"""Decode attention in one kernel per layer: RoPE on q and k, the new key and value
appended to the cache in its stored format, then softmax(q K^T / sqrt(d)) V over the
cached positions, read in their stored format (f32, f16 or q8_0) without a dequantized
copy of the prefix.

Work is split over (KV head, run of keys), so both cores share even one head's keys; each
piece keeps its own running maximum and sum, and the pieces are merged at the end (the
"split-K" of flash-decoding). Query heads that share a KV head (GQA) read its keys once.
"""

from __future__ import annotations

import numpy as np
from numba import carray, prange
from numba.extending import overload

from ..ggml import BLOCK
from ..kv import TILE
from .jit import kernel
from .ops import exp_neg
from .simd.lanes import add16, fma16, fma16_f16, fma16_i8, set16, zero16
from .simd.scalar import f16, f32, stack_f32, to_f16

TILES_PER_TASK = 16  # tiles of 16 keys one piece of parallel work reads, at least
CHAINS = 8  # independent accumulators in a tile's dot products (any rest: one chain)


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


def tile_scores(keys, h, t, q, acc, tmp):
    """acc[0:16] = q . key for the 16 keys of tile t of head h: one vector operation per
    element of q (acc, tmp: CHAINS * 16 float32 of scratch)."""


def weigh_values(values, h, k0, k1, probs, o, at, stride):
    """For each query r sharing KV head h: o[at + r * stride : ... + head_dim] +=
    sum over slots i in k0:k1 of probs[r, i - k0] * value (h, i).
    Four slots per step: a run of four fused multiply-adds on each 16 lanes of o between
    a load and a store, not one store-to-load round trip per slot."""


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


@kernel(inline=True)
def fold_chains(acc):
    """acc[0:16] = the sum of the CHAINS partial sums acc[16 c : 16 c + 16]."""
    for c in range(1, CHAINS):
        add16(acc, 0, acc, TILE * c)


@overload(tile_scores, inline="always")
def _tile_scores(keys, h, t, q, acc, tmp):
    # acc holds CHAINS partial sums of 16 lanes: one fused multiply-add chain would wait
    # 4 cycles per element of q (its latency) instead of issuing two per cycle.
    if _is_q8_0(keys):

        def scores_q8_0(keys, h, t, q, acc, tmp):
            codes, scales = keys
            hd = codes.shape[2]
            base = (h * codes.shape[1] + t) * hd
            zero(acc, TILE)
            for b in range(hd // BLOCK):
                zero(tmp, CHAINS * TILE)
                for j in range(0, BLOCK, CHAINS):
                    for c in range(CHAINS):
                        jj = BLOCK * b + j + c
                        fma16_i8(tmp, TILE * c, q[jj], codes, (base + jj) * TILE)
                fold_chains(tmp)
                fma16_f16(
                    acc, 0, tmp, scales, ((h * codes.shape[1] + t) * (hd // BLOCK) + b) * TILE
                )

        return scores_q8_0
    if _is_f16(keys):

        def scores_f16(keys, h, t, q, acc, tmp):
            hd = keys[0].shape[2]
            base = (h * keys[0].shape[1] + t) * hd
            whole = hd // CHAINS * CHAINS
            zero(acc, CHAINS * TILE)
            for j in range(0, whole, CHAINS):
                for c in range(CHAINS):
                    fma16_f16(acc, TILE * c, q[j + c], keys[0], (base + j + c) * TILE)
            for j in range(whole, hd):  # head_dim % 8: the last elements, one chain
                fma16_f16(acc, 0, q[j], keys[0], (base + j) * TILE)
            fold_chains(acc)

        return scores_f16

    def scores_f32(keys, h, t, q, acc, tmp):
        hd = keys[0].shape[2]
        base = (h * keys[0].shape[1] + t) * hd
        whole = hd // CHAINS * CHAINS
        zero(acc, CHAINS * TILE)
        for j in range(0, whole, CHAINS):
            for c in range(CHAINS):
                fma16(acc, TILE * c, q[j + c], keys[0], (base + j + c) * TILE)
        for j in range(whole, hd):  # head_dim % 8: the last elements, one chain
            fma16(acc, 0, q[j], keys[0], (base + j) * TILE)
        fold_chains(acc)

    return scores_f32


@overload(weigh_values, inline="always")
def _weigh_values(values, h, k0, k1, probs, o, at, stride):
    if _is_q8_0(values):

        def weigh_q8_0(values, h, k0, k1, probs, o, at, stride):
            codes, scales = values
            hd, slots = codes.shape[2], codes.shape[1]
            two = k0 + (k1 - k0) // 2 * 2
            for r in range(probs.shape[0]):
                out = at + r * stride
                for i in range(k0, two, 2):
                    row = (h * slots + i) * hd
                    for b in range(hd // BLOCK):
                        p0 = probs[r, i - k0] * f16(scales[h, i, b])
                        p1 = probs[r, i + 1 - k0] * f16(scales[h, i + 1, b])
                        for half in range(BLOCK * b, BLOCK * (b + 1), 16):
                            fma16_i8(o, out + half, p0, codes, row + half)
                            fma16_i8(o, out + half, p1, codes, row + hd + half)
                for i in range(two, k1):
                    row = (h * slots + i) * hd
                    for b in range(hd // BLOCK):
                        p0 = probs[r, i - k0] * f16(scales[h, i, b])
                        for half in range(BLOCK * b, BLOCK * (b + 1), 16):
                            fma16_i8(o, out + half, p0, codes, row + half)

        return weigh_q8_0
    fma = fma16_f16 if _is_f16(values) else fma16
    widen = f16 if _is_f16(values) else f32

    def weigh_float(values, h, k0, k1, probs, o, at, stride):
        v = values[0]
        hd, slots = v.shape[2], v.shape[1]
        whole = hd // 16 * 16  # elements of a value the 16-lane steps cover
        four = k0 + (k1 - k0) // 4 * 4
        for r in range(probs.shape[0]):
            out = at + r * stride
            for i in range(k0, four, 4):
                p0, p1 = probs[r, i - k0], probs[r, i + 1 - k0]
                p2, p3 = probs[r, i + 2 - k0], probs[r, i + 3 - k0]
                row = (h * slots + i) * hd
                for j in range(0, whole, 16):
                    fma(o, out + j, p0, v, row + j)
                    fma(o, out + j, p1, v, row + hd + j)
                    fma(o, out + j, p2, v, row + 2 * hd + j)
                    fma(o, out + j, p3, v, row + 3 * hd + j)
            for i in range(four, k1):
                row = (h * slots + i) * hd
                for j in range(0, whole, 16):
                    fma(o, out + j, probs[r, i - k0], v, row + j)
            for i in range(k0, k1):  # head_dim % 16: the last elements, one at a time
                for j in range(whole, hd):
                    o[out + j] += probs[r, i - k0] * widen(v[h, i, j])

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


@kernel(inline=True)
def append(qkv, cos, sin, keys, values, slot, h, n_heads):
    """KV head h of the token (in qkv, after the n_heads queries): its key rotated, both
    stored at `slot` in the stores' format."""
    n_kv, hd = values[0].shape[0], cos.shape[0] * 2
    k = qkv[(n_heads + h) * hd : (n_heads + h + 1) * hd].copy()
    rope(k, cos, sin)
    put_key(keys, h, slot, k)
    put_value(values, h, slot, qkv[(n_heads + n_kv + h) * hd : (n_heads + n_kv + h + 1) * hd])


@kernel(inline=True)
def queries(qkv, cos, sin, h, rep, hd):
    """The rep query heads that share KV head h, rotated and scaled by 1/sqrt(hd)."""
    q = qkv[h * rep * hd : (h + 1) * rep * hd].copy()
    scale = np.float32(1) / np.sqrt(np.float32(hd))
    for r in range(rep):
        rope(q[r * hd : (r + 1) * hd], cos, sin)
        for j in range(hd):
            q[r * hd + j] *= scale
    return q


@kernel
def attend_task(qkv, cos, sin, keys, values, slot, n, task, run, top, total, part):
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
        append(qkv, cos, sin, keys, values, slot, h, n_heads)
    q = queries(qkv, cos, sin, h, rep, hd)
    scores = np.empty((rep, (t1 - t0) * TILE), np.float32)
    acc = carray(stack_f32(128), 128)
    tmp = carray(stack_f32(128), 128)
    for t in range(t0, t1):
        for r in range(rep):
            tile_scores(keys, h, t, q[r * hd : (r + 1) * hd], acc, tmp)
            set16(scores, r * scores.shape[1] + (t - t0) * TILE, acc, 0)
    for r in range(rep):
        hq = h * rep + r
        sc = scores[r, : k1 - k0]
        m = sc.max()
        s = np.float32(0)
        for i in range(k1 - k0):
            sc[i] = exp_neg(sc[i] - m)
            s += sc[i]
        top[hq, piece], total[hq, piece] = m, s
        part[hq, piece, :] = 0
    at = (h * rep * pieces + piece) * hd
    weigh_values(values, h, k0, k1, scores, part.reshape(-1), at, pieces * hd)


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
def attend(qkv, cos, sin, keys, values, slot, n, out):
    """One decode step of one layer.
    qkv (n_heads * hd + 2 * n_kv * hd,) the token's projections, q then k then v;
    cos, sin (hd / 2,) the token's RoPE angle; keys (tiled), values: the layer's stores.
    The new key and value go to `slot`, then the token attends to slots 0..n-1 (a ring's
    slots in any order: attention does not care). out (n_heads * hd,) float32."""
    n_kv, hd = values[0].shape[0], cos.shape[0] * 2
    top, total, part, run = pieces_of(qkv, hd, n_kv, n)
    for task in prange(n_kv * part.shape[1]):  # prange counts in uint64: as the team's int64
        attend_task(qkv, cos, sin, keys, values, slot, n, np.int64(task), run, top, total, part)
    combine(top, total, part, out)
