"""The small operations of a decode step between the matrix products, one compiled call
each instead of three to six NumPy calls (a NumPy call costs ~1 us whatever its size;
a call here ~0.3 us). float32 throughout."""

from __future__ import annotations

import numpy as np
from numba import prange

from .jit import kernel
from .simd.scalar import pow2, recip

# --- exp that vectorizes -----------------------------------------------------------------


@kernel(inline=True)
def exp_neg(x):
    """exp(x) for float32 x <= 0 (scores minus their maximum), within 2 ulp: Cephes' expf
    with the power of two built from bits. libm's expf is a scalar call per element (~20
    cycles); this inlines and vectorizes. Below -87, where float32 underflows, ~1e-38."""
    x = max(x, np.float32(-87.0))
    z = np.floor(x * np.float32(1.4426950408889634) + np.float32(0.5))
    r = x - z * np.float32(0.693359375) - z * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    return (p * r * r + r + np.float32(1.0)) * pow2(np.int32(z))


@kernel
def rmsnorm(x, weight, eps, out):
    """out = x / sqrt(mean(x^2) + eps) * weight; x, weight, out (dim,) float32"""
    s = np.float32(0)
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    inv = np.float32(1) / np.sqrt(s / np.float32(x.shape[0]) + np.float32(eps))
    for i in range(x.shape[0]):
        out[i] = x[i] * inv * weight[i]


@kernel(inline=True)
def sigmoid(g):
    """1 / (1 + exp(-g)), from exp(-|g|) so that no exp overflows; vectorizes."""
    e = exp_neg(-abs(g))
    sig = recip(np.float32(1) + e)  # vectorizes, where `/` would not
    return e * sig if g < 0 else sig


@kernel
def swiglu(gate_up, out):
    """out = silu(gate) * up for gate_up = [gate | up] (2 * hidden,), out (hidden,):
    silu(g) = g * sigmoid(g)."""
    n = out.shape[0]
    for i in range(n):
        g = gate_up[i]
        out[i] = g * sigmoid(g) * gate_up[n + i]


GELU_2C = np.float32(2 * 0.7978845608028654)  # 2 sqrt(2 / pi)


@kernel
def geglu(gate_up, out):
    """out = gelu_tanh(gate) * up (Gemma's GeGLU) for gate_up = [gate | up]: GELU's tanh
    approximation 0.5 g (1 + tanh(z)), z = sqrt(2/pi) (g + 0.044715 g^3), computed as
    g * sigmoid(2 z), the same number without a tanh call per element."""
    n = out.shape[0]
    for i in range(n):
        g = gate_up[i]
        z = GELU_2C * (g + np.float32(0.044715) * g * g * g)
        out[i] = g * sigmoid(z) * gate_up[n + i]


@kernel
def residual(x, y, norm, eps, scale):
    """x += scale * rmsnorm(y) * norm, the residual add of a family with a norm after
    attention or the MLP (gemma, olmo2: `norm`; empty: none) or a residual multiplier
    (granite's `scale`). y (dim,) is a product's output, normed in place."""
    if norm.shape[0]:
        rmsnorm(y, norm, eps, y)
    if scale == np.float32(1):
        for i in range(x.shape[0]):
            x[i] += y[i]
    else:
        for i in range(x.shape[0]):
            x[i] += scale * y[i]


# --- a mixture of experts: the router's choice and the sum of the chosen experts, as the
# one-call decode step (layers.member) and the calls one by one (llama_np's CompiledOps.moe)
# both run them


@kernel
def route(logits, k, renorm, sel, w):
    """The router's choice from its logits (E,): the k largest of their softmax (exp_neg;
    ties to the lower expert, as llama_np.model.ops.top_k), into sel (k,) in ascending
    expert order and their probabilities into w (k,), renormalized to sum 1 when renorm.
    Logits holding NaN still choose k distinct experts (the first ones), their weights NaN."""
    n = logits.shape[0]
    top = logits[0]
    for e in range(1, n):
        top = max(top, logits[e])
    p, taken = np.empty(n, np.float32), np.zeros(n, np.bool_)
    total = np.float32(0)
    for e in range(n):
        p[e] = exp_neg(logits[e] - top)
        total += p[e]
    for j in range(k):
        best = -1
        for e in range(n):
            if not taken[e] and (best < 0 or p[e] > p[best]):
                best = e
        taken[best], sel[j], w[j] = True, best, p[best] / total
    if renorm:
        s = np.float32(0)
        for j in range(k):
            s += w[j]
        for j in range(k):
            w[j] = w[j] / s
    for j in range(1, k):  # insertion sort by expert: the order the sum adds them in
        e, v, i = sel[j], w[j], j - 1
        while i >= 0 and sel[i] > e:
            sel[i + 1], w[i + 1] = sel[i], w[i]
            i -= 1
        sel[i + 1], w[i + 1] = e, v


@kernel
def experts_add(x, outs, w, norm, eps, scale, y):
    """x += scale * rmsnorm(y) * norm (residual) for y = sum_j w[j] outs[j], the chosen
    experts' outputs (k, dim) added in their order (ascending expert numbers)."""
    for i in range(y.shape[0]):
        y[i] = 0
    for j in range(w.shape[0]):
        wj = w[j]
        for i in range(y.shape[0]):
            y[i] += wj * outs[j, i]
    residual(x, y, norm, eps, scale)


# What a matrix product may do before and after itself, so that a decode step calls one
# kernel where it would call three (a call costs ~2 us here: dispatch and a parallel
# launch). Before: nothing, RMSNorm, or SwiGLU or GeGLU of the input. After: store, or add.
PLAIN, NORM, SWIGLU, GEGLU = 0, 1, 2, 3
GATED = {"silu": SWIGLU, "gelu_tanh": GEGLU}  # the prologue of the MLP's down product
NO_NORM, ZERO = np.zeros(1, np.float32), np.float32(0)  # a product's norm and eps without one


@kernel(inline=True)
def gated(x, mode, out):
    """out = act(gate) * up for x = [gate | up]: SwiGLU or GeGLU by `mode`."""
    if mode == SWIGLU:
        swiglu(x, out)
    else:
        geglu(x, out)


@kernel(inline=True)
def prologue(x, norm, eps, mode):
    """The vector a product multiplies: x (PLAIN), rmsnorm(x) * norm (NORM), or
    act(gate) * up for x = [gate | up] (SWIGLU, GEGLU). Runs once, before the parallel
    loop."""
    if mode == NORM:
        h = np.empty_like(x)
        rmsnorm(x, norm, eps, h)
        return h
    if mode == SWIGLU or mode == GEGLU:
        h = np.empty(x.shape[0] // 2, np.float32)
        gated(x, mode, h)
        return h
    return x


@kernel
def prepare(x, norm, eps, mode):
    """prologue() on its own, for a product that is not one kernel (a stack of formats)."""
    return prologue(x, norm, eps, mode)


@kernel(inline=True)
def prepare_row(x, norm, eps, mode, out):
    if mode == NORM:
        rmsnorm(x, norm, eps, out)
    else:
        gated(x, mode, out)


@kernel
def prepare_rows(x, norm, eps, mode, out):
    """prologue() of every row of x (B, n) into out (B, n or n / 2): each row the very
    arithmetic a decode step applies to its one vector, on the calling thread (a team
    member's own buffers, fewlayers.py: a parallel kernel there would nest a region)."""
    for v in range(x.shape[0]):
        prepare_row(x[v], norm, eps, mode, out[v])


@kernel(parallel=True)
def prepare_rows_shared(x, norm, eps, mode, out):
    """prepare_rows with the rows shared by the threads: a batch's or a prompt's rows."""
    for v in prange(x.shape[0]):
        prepare_row(x[v], norm, eps, mode, out[v])
