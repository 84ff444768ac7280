"""The recurrent token mixers of the hybrid models, compiled: Qwen3.5's gated delta net
and LFM2's short convolution, T tokens of one sequence per call (a decode step is T = 1,
a prompt any T), the sequence's state updated in place. The NumPy reference and the math
are llama_np/model/recurrent.py; these read and write the same float32 state.

A delta net's token reads and writes its state whole: per value head a (k_dim, v_dim)
matrix, 64 KiB at Qwen3.5's 128 x 128. Each head is one parallel item, walking its tokens
in order; its state is read once for S^T k and S^T q together and once more, from L2,
for the update, written once: the loops run along v_dim, contiguous, and vectorize. The
convolutions walk blocks of channels (contiguous, vectorized), each block its tokens."""

from __future__ import annotations

import numpy as np
from numba import prange

from .jit import kernel
from .ops import exp_neg, sigmoid
from .simd.scalar import recip

BLOCK = 64  # channels a convolution's parallel item takes


@kernel(inline=True)
def softplus(x):
    """log(1 + exp(x)): x past 20 (torch's threshold), else from exp(-|x|)."""
    if x > np.float32(20):
        return x
    return max(x, np.float32(0)) + np.log1p(exp_neg(-abs(x)))


@kernel(inline=True)
def conv_rows(u, state, w, t, c0, c1, out):
    """out[c0:c1] = the causal convolution of token t over channels c0:c1: taps j of w (K,
    C) times input t + j - (K - 1), a row of u (T, >= C) or, before it, of the state (K - 1,
    C), oldest first. Each tap a loop along the channels, contiguous: it vectorizes."""
    k = w.shape[0]
    for c in range(c0, c1):
        out[c] = w[k - 1, c] * u[t, c]
    for j in range(k - 1):
        i = t + j - (k - 1)
        if i >= 0:
            for c in range(c0, c1):
                out[c] += w[j, c] * u[i, c]
        else:
            for c in range(c0, c1):
                out[c] += w[j, c] * state[i + k - 1, c]


@kernel(inline=True)
def shift_state(u, state, t_n, c0, c1):
    """The state's channels c0:c1 become the last K - 1 inputs, u's rows after its own:
    ascending, row j reads row j + T of the old state before a later row is written."""
    for j in range(state.shape[0]):
        i = t_n + j - state.shape[0]
        if i >= 0:
            for c in range(c0, c1):
                state[j, c] = u[i, c]
        else:
            for c in range(c0, c1):
                state[j, c] = state[i + state.shape[0], c]


@kernel(inline=True)
def conv_silu(h, state, w, c0, c1, out):
    """delta_conv's channels c0:c1: each token's convolution, then SiLU, then the state's
    channels shifted (each channel's arithmetic its own: any split gives the same bits)."""
    for t in range(h.shape[0]):
        row = out[t]
        conv_rows(h, state, w, t, c0, c1, row)
        for c in range(c0, c1):
            row[c] = row[c] * sigmoid(row[c])
    shift_state(h, state, h.shape[0], c0, c1)


@kernel(parallel=True)
def delta_conv(h, state, w, out):
    """The causal depthwise convolution of a delta net over q, k and v, then SiLU:
    h (T, >= C) the input projection's rows, whose first C columns it convolves; state
    (K - 1, C) updated to the last K - 1 inputs; w (K, C); out (T, C)."""
    c_n = w.shape[1]
    for b in prange((c_n + BLOCK - 1) // BLOCK):
        conv_silu(h, state, w, b * BLOCK, min(c_n, (b + 1) * BLOCK), out)


@kernel(inline=True)
def l2_head(x, scale):
    """x (one head) L2-normed in place, x / sqrt(sum(x^2) + 1e-6) (transformers' l2norm),
    times scale."""
    s = np.float32(0)
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    f = recip(np.sqrt(s + np.float32(1e-6))) * scale
    for i in range(x.shape[0]):
        x[i] *= f


@kernel(parallel=True)
def l2_heads(qkv, k_heads, k_dim, scale):
    """Each token's q and k heads (the first 2 k_heads * k_dim columns of qkv (T, ...))
    L2-normed in place, q times scale."""
    for t in prange(qkv.shape[0]):
        for head in range(2 * k_heads):
            f = scale if head < k_heads else np.float32(1)
            l2_head(qkv[t, head * k_dim : (head + 1) * k_dim], f)


@kernel(parallel=True)
def delta_rule(h, qkv, s, dt_bias, a, norm, eps, heads, k_heads, k_dim, out):
    """The gated delta rule over T tokens and the gated RMSNorm of its output, a value
    head per parallel item (delta_head). h (T, in_dim): the projection's rows (its z, b
    and a columns after the conv_dim convolved ones); qkv (T, conv_dim): q, k (L2-normed,
    q scaled) and v; s (Hv, Dk, Dv) in place; heads (Hv,): the key head of each value
    head; out (T, Hv * Dv)."""
    for hv in prange(s.shape[0]):
        sk, sq = np.empty(s.shape[2], np.float32), np.empty(s.shape[2], np.float32)
        delta_head(h, qkv, s, dt_bias, a, norm, eps, hv, heads[hv], k_heads, k_dim, out, sk, sq)


@kernel(inline=True)
def delta_head(h, qkv, s, dt_bias, a, norm, eps, hv, kh, k_heads, k_dim, out, sk, sq):
    """Value head hv (reading key head kh) over T tokens: two passes over its state a
    token, one reading S^T k and S^T q, the other writing S <- decay S + k (x) delta; the
    output S_new^T q = decay S^T q + (k . q) delta, from the vectors, then gated_norm.
    sk, sq (Dv,): scratch."""
    v_heads, v_dim, conv_dim = s.shape[0], s.shape[2], qkv.shape[1]
    key_dim, value_dim = k_heads * k_dim, v_heads * v_dim
    q0, k0, v0 = kh * k_dim, key_dim + kh * k_dim, 2 * key_dim + hv * v_dim
    for t in range(h.shape[0]):
        g = a[hv] * softplus(h[t, conv_dim + value_dim + v_heads + hv] + dt_bias[hv])
        decay = np.exp(g)
        beta = sigmoid(h[t, conv_dim + value_dim + hv])
        sk[:] = 0
        sq[:] = 0
        kq = np.float32(0)
        for i in range(k_dim):
            ki, qi = qkv[t, k0 + i], qkv[t, q0 + i]
            kq += ki * qi
            for j in range(v_dim):
                sk[j] += s[hv, i, j] * ki
                sq[j] += s[hv, i, j] * qi
        for j in range(v_dim):  # delta: the error the decayed state makes, times beta
            sk[j] = (qkv[t, v0 + j] - decay * sk[j]) * beta
            sq[j] = decay * sq[j] + kq * sk[j]  # the output, S_new^T q
        for i in range(k_dim):
            ki = qkv[t, k0 + i]
            for j in range(v_dim):
                s[hv, i, j] = s[hv, i, j] * decay + ki * sk[j]
        gated_norm(sq, norm, eps, h[t, conv_dim + hv * v_dim : conv_dim + (hv + 1) * v_dim],
                   out[t, hv * v_dim : (hv + 1) * v_dim])  # fmt: skip


@kernel(inline=True)
def gated_norm(o, norm, eps, z, out):
    """out = o / sqrt(mean(o^2) + eps) * norm * silu(z)"""
    ss = np.float32(0)
    for j in range(o.shape[0]):
        ss += o[j] * o[j]
    inv = recip(np.sqrt(ss / np.float32(o.shape[0]) + eps))
    for j in range(o.shape[0]):
        out[j] = o[j] * inv * norm[j] * z[j] * sigmoid(z[j])


def delta_net(h, state_conv, state_s, conv_w, dt_bias, a, norm, eps, heads, k_heads, k_dim, out):
    """A delta net's mixing of T tokens of one sequence (llama_np.model.recurrent.delta_net):
    the convolution, q and k L2-normed, the delta rule and the gated norm, into out (T,
    value_dim)."""
    qkv = np.empty((h.shape[0], conv_w.shape[1]), np.float32)
    delta_conv(h, state_conv, conv_w, qkv)
    l2_heads(qkv, k_heads, k_dim, np.float32(1 / np.sqrt(k_dim)))
    delta_rule(h, qkv, state_s, dt_bias, a, norm, np.float32(eps), heads, k_heads, k_dim, out)


@kernel(inline=True)
def short_block(h, state, w, bx, c0, c1, out):
    """short_conv's channels c0:c1 (each channel's arithmetic its own)."""
    t_n, dim = h.shape[0], w.shape[1]
    for t in range(t_n):
        for c in range(c0, c1):
            bx[t, c] = h[t, c] * h[t, 2 * dim + c]
    for t in range(t_n):
        row = out[t]
        conv_rows(bx, state, w, t, c0, c1, row)
        for c in range(c0, c1):
            row[c] *= h[t, dim + c]
    shift_state(bx, state, t_n, c0, c1)


@kernel(parallel=True)
def short_conv(h, state, w, bx, out):
    """LFM2's short convolution of T tokens of one sequence: h (T, 3 dim) = B, C, x; out
    (T, dim) = C * conv(B * x); state (K - 1, dim), the last K - 1 values of B * x, updated;
    w (K, dim); bx (T, dim): scratch for B * x."""
    dim = w.shape[1]
    for b in prange((dim + BLOCK - 1) // BLOCK):
        short_block(h, state, w, bx, b * BLOCK, min(dim, (b + 1) * BLOCK), out)


@kernel(inline=True)
def delta_key_head(h, w, conv, s, dt_bias, a, norm, eps, heads, k_heads, k_dim, scale, kh,
                   qkv, out, sk, sq):  # fmt: skip
    """A delta net's work for key head kh, one parallel item of a decode step
    (layers.mixer_phase): the convolution of its q and k and of its value heads' v, q and
    k L2-normed, each value head's delta rule; as delta_net computes them (each channel's,
    each head's arithmetic its own). h (T, in_dim), qkv (T, conv_dim) scratch, conv and s
    the state, out (T, value_dim): what delta_net takes."""
    key_dim, v_dim = k_heads * k_dim, s.shape[2]
    q0, k0 = kh * k_dim, key_dim + kh * k_dim
    conv_silu(h, conv, w, q0, q0 + k_dim, qkv)
    conv_silu(h, conv, w, k0, k0 + k_dim, qkv)
    for t in range(h.shape[0]):
        l2_head(qkv[t, q0 : q0 + k_dim], scale)
        l2_head(qkv[t, k0 : k0 + k_dim], np.float32(1))
    for hv in range(s.shape[0]):
        if heads[hv] == kh:
            v0 = 2 * key_dim + hv * v_dim
            conv_silu(h, conv, w, v0, v0 + v_dim, qkv)
            delta_head(h, qkv, s, dt_bias, a, norm, eps, hv, kh, k_heads, k_dim, out, sk, sq)
