"""A mixture of experts' MLP for several tokens (a batch's decode step, a prompt) in one
compiled call per layer: llama_np's CompiledOps.moe, once the router has chosen.

Each token goes through k experts; a step reads each expert its tokens chose once. The
call is one parallel region (team.py) of five phases: every (token, expert) pair's input
prologue and rounding, the chosen experts' gate_up products, the pairs' SwiGLU and
rounding, the down products, and each token's weighted sum added to its residual stream.
A product phase's work items are chunks of rows of the chosen experts, one expert after
another: a thread streams an expert's chunk once and multiplies it by every pair routed
to that expert, four vectors at a time with fewdot's kernels (the codes decoded once for
the four) and the rest (one to three) together, while the chunk is in its caches.

The pairs are rows p = t k + j (token t's j-th expert, the experts of a token in
ascending order): the rows of the inputs, of the outputs and of `members`, which lists
each chosen expert's pairs (`first` their offsets, expert by expert in `union`).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from . import intdot
from .fewlayers import run_rows
from .jit import kernel
from .layers import KIND, Q8_0, ROWS, chunks, lay
from .matvec import CHUNK
from .ops import PLAIN, experts_add, prepare_row
from .team import LINE, finish, grain_of, take

PHASES = 5


@kernel
def round_phase(sync, k, x, per, norm, eps, mode, h, xs, quantize):
    """Phase k: each pair p's input, the prologue of x's row p // per, into h[p] (x's row
    itself when PLAIN); rounded into xs (igemm.quantized_rows' layout) when quantize."""
    n = h.shape[0]
    xq, xd, xsum, xd16, xb16, lo = xs
    finished = 0
    p = take(sync, k, 1, n)
    while p < n:
        if mode == PLAIN:
            h[p, :] = x[p // per]
        else:
            prepare_row(x[p // per], norm, eps, mode, h[p])
        if quantize:
            intdot.quantize_x(h[p], xq[p], xd[p], xsum[p], lo)
            intdot.per16(xq[p], xd[p], lo, xd16[p], xb16[p])
        finished += 1
        p = take(sync, k, 1, n)
    finish(sync, k, finished, n)


@kernel(inline=True)
def run_part(rows, factors, p, h, xs, members, m0, m1, c0, c1, out):
    """Chunks c0:c1 of W_p times the pairs members[m0:m1], into their rows of out: four at
    a time (the codes decoded once for the four), then the last one, two or three
    together: fewdot's kernels for one to four vectors, each vector the bits it gets alone.
    Two or three padded to four would pay four's multiply-adds (four vectors take 3-3.2x
    one's time)."""
    m = m0
    while m1 - m >= 4:
        vs = (members[m], members[m + 1], members[m + 2], members[m + 3])
        run_rows(rows, factors, p, h, xs, vs, c0, c1, False, out)
        m += 4
    if m1 - m == 3:
        vs3 = (members[m], members[m + 1], members[m + 2])
        run_rows(rows, factors, p, h, xs, vs3, c0, c1, False, out)
    elif m1 - m == 2:
        run_rows(rows, factors, p, h, xs, (members[m], members[m + 1]), c0, c1, False, out)
    elif m1 - m == 1:
        run_rows(rows, factors, p, h, xs, (members[m],), c0, c1, False, out)


@kernel(inline=True)
def expert_rows(rows, factors, a, b, h, xs, members, m0, m1, c0, c1, out, part):
    """Chunks c0:c1 (layers.chunks numbers them) of the stack a:b, times the pairs
    members[m0:m1], into their rows of out; a stack of several matrices runs each into its
    own rows of `part` (P, its rows) and copies the pairs' rows into its columns of out."""
    first, r0 = 0, 0
    for p in range(a, b):
        n = rows[p, ROWS]
        lo, hi = max(c0 - first, 0), min(c1 - first, -(-n // CHUNK))
        if lo < hi:
            if b - a == 1:
                run_part(rows, factors, p, h, xs, members, m0, m1, lo, hi, out)
            else:
                y = lay(part, out.shape[0], n, np.float32)
                run_part(rows, factors, p, h, xs, members, m0, m1, lo, hi, y)
                for m in range(m0, m1):
                    v = members[m]
                    for r in range(lo * CHUNK, min(n, hi * CHUNK)):
                        out[v, r0 + r] = y[v, r]
        first, r0 = first + -(-n // CHUNK), r0 + n


@kernel
def product_phase(sync, k, threads, rows, factors, p0, p1, stride, union, first, members, h,
                  xs, out, part):  # fmt: skip
    """Phase k: out[p] = W_e @ h[p] for every pair p of every chosen expert e (W_e: table
    rows p0:p1 plus e stride), the chosen experts' chunks one list of items."""
    per = chunks(rows, p0, p1)
    n = union.shape[0] * per
    grain = grain_of(n, threads)
    finished = 0
    c = take(sync, k, grain, n)
    while c < n:
        end = min(n, c + grain)
        while c < end:
            u, at = c // per, union[c // per] * stride
            stop = min(end, (u + 1) * per)
            expert_rows(rows, factors, p0 + at, p1 + at, h, xs, members, first[u],
                        first[u + 1], c - u * per, stop - u * per, out, part)  # fmt: skip
            finished += stop - c
            c = stop
        c = take(sync, k, grain, n)
    finish(sync, k, finished, n)


@kernel
def sum_phase(sync, k, x, outs, w, norm, eps, scale, y):
    """Phase k: each token t's experts' outputs (pairs t k:t k + k) weighted and added to
    x[t] (ops.experts_add)."""
    n, per = x.shape[0], w.shape[1]
    finished = 0
    t = take(sync, k, 1, n)
    while t < n:
        experts_add(x[t], outs[t * per : (t + 1) * per], w[t], norm, eps, scale, y)
        finished += 1
        t = take(sync, k, 1, n)
    finish(sync, k, finished, n)


@kernel(inline=True)
def quantized(rows, p0, p1, ints):
    """Whether the products of the stack p0:p1 multiply x as integers."""
    q = False
    for p in range(p0, p1):
        q |= rows[p, KIND] >= Q8_0
    return ints != 0 and q


@kernel(inline=True)
def pairs_rounded(pairs, n, ints):
    """h (pairs, n) and x's integers for them (igemm.quantized_rows' layout)."""
    lo = n if ints == 16 else 0
    return np.empty((pairs, n), np.float32), (
        np.empty((pairs, n + lo), np.int8), np.empty((pairs, n // 32), np.float32),
        np.empty((pairs, n // 32), np.int32), np.empty((pairs, n // 16), np.float32),
        np.empty((pairs, n // 16), np.float32), lo)  # fmt: skip


@kernel(parallel=True)
def experts_batch(x, rows, factors, gate_up, down, stride, norm, eps, pre, gate, w, union,
                  first, members, post_norm, scale, ints, threads):  # fmt: skip
    """x (T, dim) += each token's chosen experts' weighted sum, in place. gate_up, down
    (2,): expert 0's table rows (expert e's: plus e stride); w (T, k): the weights of each
    token's experts in ascending expert order (the pairs' order); union, first, members:
    the chosen experts and their pairs (the module's docstring); pre, gate: the prologues
    of gate_up and down (ops.NORM with `norm`; SWIGLU or GEGLU); post_norm, scale: the
    residual's (ops.residual). `threads`: numba.get_num_threads()."""
    t, per = w.shape
    hidden = 0
    for p in range(gate_up[0], gate_up[1]):
        hidden += rows[p, ROWS]
    h, xs = pairs_rounded(t * per, x.shape[1], ints)
    gate_ups = np.empty((t * per, hidden), np.float32)
    hd, xsd = pairs_rounded(t * per, hidden // 2, ints)
    outs = np.empty((t * per, x.shape[1]), np.float32)
    stacked = gate_up[1] - gate_up[0] > 1 or down[1] - down[0] > 1
    sync = np.zeros((PHASES, LINE), np.int64)
    for _ in prange(threads):
        part = np.empty(t * per * max(hidden, x.shape[1]) if stacked else 0, np.float32)
        round_phase(sync, 0, x, per, norm, eps, pre, h, xs,
                    quantized(rows, gate_up[0], gate_up[1], ints))  # fmt: skip
        product_phase(sync, 1, threads, rows, factors, gate_up[0], gate_up[1], stride, union,
                      first, members, h, xs, gate_ups, part)  # fmt: skip
        round_phase(sync, 2, gate_ups, 1, norm, eps, gate, hd, xsd,
                    quantized(rows, down[0], down[1], ints))  # fmt: skip
        product_phase(sync, 3, threads, rows, factors, down[0], down[1], stride, union, first,
                      members, hd, xsd, outs, part)  # fmt: skip
        sum_phase(sync, 4, x, outs, w, post_norm, eps, scale, np.empty(x.shape[1], np.float32))
