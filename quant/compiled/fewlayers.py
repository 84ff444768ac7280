"""A small batch's decode step in one compiled call: layers.decode_layers for B <= FEW
sequences.

Run call by call, a batched step of SmolLM2-135M makes ~330 kernel calls (each product's
rows rounded to integers in a call of their own, the prologues, the attention of each
layer), ~8.5 us of fixed cost each against products of 22-52 us: B = 2 cost 1.9x B = 1,
where the kernels themselves cost 1.2-1.5x. Here the step is one call and one parallel
loop, as decode_layers runs one sequence: each thread walks every layer's phases
(team.py), and a product's chunks of rows are multiplied by the B vectors at once with
fewdot's kernels (each block of weights decoded once for every vector), after the thread
ran the prologue and the rounding of all B into its own buffers.

The same functions in the same order as the calls one by one (ops.prepare_rows,
intdot.quantize_x and per16 as igemm.quantize_rows runs them, fewdot's few_ entries,
attention.attend_task and combine): every
sequence gets the bits the batched step gives it call by call (compiled in one process:
jit.kernel). The products multiply x
as integers (`ints` 8 or 16), or as float32 where every matrix is in a float format.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from . import attention, fewdot, intdot
from .jit import kernel
from .layers import (
    ATTENTION,
    BF16,
    CODE,
    F16,
    F32,
    GATED,
    KIND,
    KQUANT,
    KV_HEADS,
    NBYTES,
    PHASES,
    Q8_0,
    ROWS,
    Angles,
    Stores,
    attention_shape,
    batch_piece,
    batch_tasks,
    chunks,
    gate_rows,
    lay,
    layer_spec,
    mixer_phase,
    mixer_scratch,
    operand,
    out_rows,
    pieces_of_sequence,
    residual_phase,
    task_at,
    ungate,
    widest,
)
from .matvec import CHUNK
from .ops import NORM, PLAIN, prepare_rows
from .team import LINE, finish, grain_of, start, take


@kernel
def scratch(b, n, stack):
    """A thread's buffers for b vectors of at most n values: the prologues h, x's integers
    xq (room for int16's low bytes), xd, xsum, xd16, xb16 (igemm.quantized_rows), the
    part of a stack a product runs (b x `stack` rows), and the attention's output."""
    f32 = np.float32
    return (np.empty(b * n, f32), np.empty(2 * b * n, np.int8), np.empty(b * n // 32, f32),
            np.empty(b * n // 32, np.int32), np.empty(b * n // 16, f32),
            np.empty(b * n // 16, f32), np.empty(b * stack, f32), np.empty(b * n, f32))  # fmt: skip


@kernel(inline=True)
def heads(x, norm, eps, mode, buf):
    """The prologue of every row of x (B, cols) (ops.prepare_rows) into buf's h: what a
    product multiplies (x itself when PLAIN)."""
    if mode == PLAIN:
        return x
    h = lay(buf[0], x.shape[0], x.shape[1] if mode == NORM else x.shape[1] // 2, np.float32)
    prepare_rows(x, norm, eps, mode, h)
    return h


@kernel(inline=True)
def rounded(rows, p0, p1, h, buf, ints):
    """h's rows rounded into buf as igemm.quantized_rows rounds them (xq, xd, xsum, xd16,
    xb16, lo), when a matrix of the stack p0:p1 is quantized and `ints`."""
    b, n = h.shape
    lo = n if ints == 16 else 0
    xs = (lay(buf[1], b, n + lo, np.int8), lay(buf[2], b, n // 32, np.float32),
          lay(buf[3], b, n // 32, np.int32), lay(buf[4], b, n // 16, np.float32),
          lay(buf[5], b, n // 16, np.float32), lo)  # fmt: skip
    quantized = False
    for p in range(p0, p1):
        quantized |= rows[p, KIND] >= Q8_0
    if ints and quantized:
        xq, xd, xsum, xd16, xb16, _ = xs
        for v in range(b):
            intdot.quantize_x(h[v], xq[v], xd[v], xsum[v], lo)
            intdot.per16(xq[v], xd[v], lo, xd16[v], xb16[v])
    return xs


@kernel(inline=True)
def run_rows(rows, factors, p, h, xs, vs, c0, c1, add, out):
    """Chunks c0:c1 of out (B, rows of W_p) (=, or += when add) the vectors vs of h
    times W_p.T by fewdot's kernel of its format: a quantized W_p's on x's integers xs,
    a float one's on h."""
    kind = rows[p, KIND]
    if kind == F32:
        fewdot.few_f32((operand(rows, p, 0, np.float32),), h, vs, c0, c1, add, out)
    elif kind == F16:
        fewdot.few_f16((operand(rows, p, 0, np.uint16),), h, vs, c0, c1, add, out)
    elif kind == BF16:
        fewdot.few_bf16((operand(rows, p, 0, np.uint16),), h, vs, c0, c1, add, out)
    elif kind == KQUANT:
        w = (operand(rows, p, 0, np.uint8), rows[p, CODE], rows[p, NBYTES])
        fewdot.few_k(w, xs, vs, c0, c1, add, out)
    elif kind == Q8_0:
        w = (operand(rows, p, 0, np.uint8), operand(rows, p, 1, np.uint16))
        fewdot.few_q8_0(w, xs, vs, c0, c1, add, out)
    else:
        codes, scales = operand(rows, p, 0, np.uint8), operand(rows, p, 1, np.uint16)
        mins, bits = operand(rows, p, 2, np.uint16), operand(rows, p, 3, np.uint32)
        fewdot.few_q4((codes, scales, mins, factors[p], bits), xs, vs, c0, c1, add, out)


@kernel(inline=True)
def stack_rows(rows, factors, p0, p1, h, xs, vs, c0, c1, add, out, bias, part):
    """Chunks c0:c1 of the product of the stack p0:p1 (layers.chunks numbers them), then
    `bias` (empty: none) added to the rows they wrote. A stack of several matrices runs
    each into a C-contiguous part of its own (buf `part`), then copies or adds it into its
    columns of out, as the calls one by one concatenate the parts' products."""
    first, r0, nb = 0, 0, out.shape[0]
    for p in range(p0, p1):
        n = rows[p, ROWS]
        a, b = max(c0 - first, 0), min(c1 - first, -(-n // CHUNK))
        if a < b:
            r1 = min(n, b * CHUNK)
            if p1 - p0 == 1:
                run_rows(rows, factors, p, h, xs, vs, a, b, add, out)
            else:
                y = lay(part, nb, n, np.float32)
                run_rows(rows, factors, p, h, xs, vs, a, b, False, y)
                for v in range(nb):
                    for r in range(a * CHUNK, r1):
                        out[v, r0 + r] = out[v, r0 + r] + y[v, r] if add else y[v, r]
            for v in range(nb if bias.shape[0] else 0):
                for r in range(r0 + a * CHUNK, r0 + r1):
                    out[v, r] += bias[r]
        first, r0 = first + -(-n // CHUNK), r0 + n


@kernel
def product(sync, k, threads, rows, factors, p0, p1, x, norm, eps, mode, add, out, bias, vs,
            buf, ints):  # fmt: skip
    """Phase k: out (B, rows) (=, or += when add) prologue(x) @ W.T (+ bias) for W the
    stack p0:p1, by chunks taken from the phase's counter; every thread that takes one
    runs the prologues and the rounding into its own buffers first."""
    n = chunks(rows, p0, p1)
    grain = grain_of(n, threads)
    c = take(sync, k, grain, n)
    finished = 0
    if c < n:
        h = heads(x, norm, eps, mode, buf)
        xs = rounded(rows, p0, p1, h, buf, ints)
        while c < n:
            c1 = min(n, c + grain)
            stack_rows(rows, factors, p0, p1, h, xs, vs, c, c1, add, out, bias, buf[6])
            finished += c1 - c
            c = take(sync, k, grain, n)
    finish(sync, k, finished, n)


@kernel(inline=True)
def product_of(sync, k, threads, rows, factors, p0, p1, x, norm, eps, mode, add, out, bias,
               buf, ints):  # fmt: skip
    """`product` for the B = 2 ... FEW rows of x: fewdot's kernels take the vectors as a
    tuple whose length they are compiled for, the walker B as a value (one walker for
    every B)."""
    nb = x.shape[0]
    if nb == 2:
        product(sync, k, threads, rows, factors, p0, p1, x, norm, eps, mode, add, out, bias,
                (0, 1), buf, ints)  # fmt: skip
    elif nb == 3:
        product(sync, k, threads, rows, factors, p0, p1, x, norm, eps, mode, add, out, bias,
                (0, 1, 2), buf, ints)  # fmt: skip
    else:
        product(sync, k, threads, rows, factors, p0, p1, x, norm, eps, mode, add, out, bias,
                (0, 1, 2, 3), buf, ints)  # fmt: skip


@kernel
def attend(sync, k, qkv, cos, sin, spec, layout, kv_at, hd, slots, ns, tasks, att):
    """Phase k: every sequence's attention tasks (layers.task_at on its stores at kv_at[b]),
    one at a time; then each thread combines every sequence's pieces into its own att (B,
    q_dim)."""
    first, at, _, top, total, part = tasks
    n, n_kv = first[-1], layout[KV_HEADS]
    finished = 0
    t = take(sync, k, 1, n)
    while t < n:
        b, task, run, top_b, total_b, part_b = batch_piece(tasks, t, n_kv, hd)
        task_at(qkv[b], cos[b], sin[b], spec, layout, kv_at[b], hd, slots[b], ns[b], task, run,
                top_b, total_b, part_b)  # fmt: skip
        finished += 1
        t = take(sync, k, 1, n)
    finish(sync, k, finished, n)
    for b in range(qkv.shape[0]):
        attention.combine(*pieces_of_sequence(first, at, b, n_kv, hd, top, total, part), att[b])


@kernel
def member(sync, threads, x, weights, eps, form, angles, stores, kind, ints, mixing, bufs, q_dim,
           hd):  # fmt: skip
    """One thread's walk through every phase of every layer (decode_few); bufs: (qkv,
    gate_up: flat, room for the widest layer's; y; tasks0, tasks1: the attention's tasks
    laid out for the spans slots[0], ns[0] and slots[1], ns[1]; mixer_scratch's, B times)."""
    start(sync)  # the step's start (team.phase_seconds)
    rows, factors, plan, norms, biases = weights
    cos, sin, spec = angles
    layout, kv_at, slots, ns = stores
    qkv, gate_up, y, tasks0, tasks1, mixer_bufs = bufs
    nb, dim = x.shape
    kinds, mix_at, dims = mixing[0], mixing[1], mixing[2]
    wide = widest(rows, plan, 0)
    buf = scratch(nb, max(dim, widest(rows, plan, 2) // 2, q_dim, mixer_bufs[0].shape[0] // nb),
                  max(wide, widest(rows, plan, 2)))  # fmt: skip
    att = lay(buf[7], nb, q_dim, np.float32)
    gated = dims[GATED] != 0  # qwen3_5: each head's q then its gate (layers.ungate)
    qv = np.empty(nb * wide if gated else 0, np.float32)
    gate = np.empty((nb, q_dim if gated else 0), np.float32)
    none = biases[0, :0]  # no bias: an array of the caller's (see layers.member)
    pre, gate_mode, post, scale = form
    fused = not post and scale == np.float32(1)  # the residual add inside the products
    post_n = dim if post else 0  # the post-norms' length (0: none)
    for i in range(plan.shape[0]):
        p, k, j = plan[i], PHASES * i, kind[i]
        h = lay(qkv, nb, out_rows(rows, p[0, 0], p[0, 1]), np.float32)
        g = lay(gate_up, nb, out_rows(rows, p[2, 0], p[2, 1]), np.float32)
        product_of(sync, k, threads, rows, factors, p[0, 0], p[0, 1], x, norms[i, 0], eps, pre,
                   False, h, biases[i], buf, ints)  # fmt: skip
        if kinds[i] == ATTENTION:
            a = h
            if gated:
                a = lay(qv, nb, h.shape[1] - q_dim, np.float32)
                for b in range(nb):
                    ungate(h[b], q_dim, hd, a[b], gate[b])
            attend(sync, k + 1, a, cos[i], sin[i], layer_spec(spec, i, mixing[5][i]), layout,
                   kv_at[i], hd, slots[j], ns[j], tasks0 if j == 0 else tasks1, att)  # fmt: skip
            for b in range(nb if gated else 0):
                gate_rows(att[b], gate[b])
            mixed = att
        else:  # a recurrent mixer: each sequence's state's addresses in its row of kv_at
            mixed = mixer_phase(sync, k + 1, kinds[i], h, mixing, mix_at[i], kv_at[i], eps, dim,
                                mixer_bufs)  # fmt: skip
        product_of(sync, k + 2, threads, rows, factors, p[1, 0], p[1, 1], mixed, norms[i, 0],
                   eps, PLAIN, fused, x if fused else y, none, buf, ints)  # fmt: skip
        if not fused:
            residual_phase(sync, k + 3, x, y, norms[i, 2, :post_n], eps, scale)
        product_of(sync, k + 4, threads, rows, factors, p[2, 0], p[2, 1], x, norms[i, 1], eps,
                   pre, False, g, none, buf, ints)  # fmt: skip
        product_of(sync, k + 5, threads, rows, factors, p[3, 0], p[3, 1], g, norms[i, 1], eps,
                   gate_mode, fused, x if fused else y, none, buf, ints)  # fmt: skip
        if not fused:
            residual_phase(sync, k + 6, x, y, norms[i, 3, :post_n], eps, scale)


@kernel(parallel=True)
def decode_few(x, weights, eps, form, angles, stores, kind, ints, threads, mixing):
    """The decoder blocks of one decode step of B (2 ... FEW) sequences on their residual
    streams x (B, dim), in place: one compiled kernel for every B and KV format. angles:
    cos, sin (L, B, rotary / 2): each layer's RoPE angle of each token. stores: kv_at (L,
    B, arrays of both): each layer's KV stores of each sequence at their addresses (a
    recurrent layer's: the sequence's state's conv and s; every sequence's stores have
    the first attending layer's shapes and format: layout); slots, n_keys (2, B):
    where each sequence appends and how many keys it attends in each of (at most) two
    spans (a window's layers, the others); kind (L,): which span a layer's attention
    takes. The rest as layers.decode_layers takes it, and the same `sync` returned: each
    phase's row, then the step's start (team.phase_seconds)."""
    cos, sin, spec = angles
    layout, kv_at, slots, ns = stores
    nb, rows, plan, dims = x.shape[0], weights.rows, weights.plan, mixing[2]
    n_kv = layout[KV_HEADS]
    qkv = np.empty(nb * widest(rows, plan, 0), np.float32)
    gate_up = np.empty(nb * widest(rows, plan, 2), np.float32)
    y = np.empty_like(x)
    q_dim, hd = attention_shape(mixing[0], mixing[5])  # (every layer's: gemma4's declined)
    tasks0 = batch_tasks(ns[0], n_kv, q_dim // hd, hd)
    tasks1 = batch_tasks(ns[1], n_kv, q_dim // hd, hd)
    width, conv_qkv, bx = mixer_scratch(mixing[0], dims, x.shape[1])
    mixer_bufs = (np.empty(nb * width.shape[0], np.float32),
                  np.empty(nb * conv_qkv.shape[0], np.float32),
                  np.empty(nb * bx.shape[0], np.float32))  # fmt: skip
    sync = np.zeros((PHASES * plan.shape[0] + 1, LINE), np.int64)
    for _ in prange(threads):  # (the groups made again in the loop: layers.IN_THE_LOOP)
        member(sync, threads, x, weights, eps, form, Angles(cos, sin, spec),
               Stores(layout, kv_at, slots, ns), kind, ints, mixing,
               (qkv, gate_up, y, tasks0, tasks1, mixer_bufs), q_dim, hd)  # fmt: skip
    return sync
