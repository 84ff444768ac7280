"""The recurrent token mixers of the hybrid models, the NumPy reference: Qwen3.5's gated
delta net and LFM2's short convolution. Each carries a sequence's past in a fixed
state (llama_np.model.kvcache.State) instead of a KV cache, and runs token by token, as
transformers' recurrent form (its chunked prefill is the same sums in another order).

The gated delta net, per value head h, with q and k of the key head it reads (DeltaNet.
key_head), the state S (k_dim, v_dim) and for each token:

    S <- S * exp(g)                    g = -exp(A_log) * softplus(a + dt_bias): the decay
    S <- S + k (x) beta * (v - S^T k)  beta = sigmoid(b): how much of the error is written
    o  = S^T q                         q, k L2-normed, q times 1 / sqrt(k_dim)

after a causal depthwise convolution (and SiLU) over q, k and v; o is RMS-normed and
multiplied by silu(z) before out_proj. The short convolution: C * conv(B * x), no
activation, B, C and x the three parts of one input projection.
"""

from __future__ import annotations

import math

import numpy as np

from llama_arch import Config
from llama_np.model.ops import rmsnorm

L2_EPS = np.float32(1e-6)  # transformers' l2norm (llama.cpp takes rms_norm_eps: 1e-6 too)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), with sigmoid through tanh (no overflowing exp)."""
    return x * sigmoid(x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    half = np.float32(0.5)
    return half + half * np.tanh(x * half)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), as torch's (x itself past 20)."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(np.float32)


def l2norm(x: np.ndarray) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps) over the last axis."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def causal_conv(u: np.ndarray, past: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A depthwise causal convolution of u (T, C) continuing `past` (K - 1, C), the last
    inputs before it (oldest first; updated in place to the newest K - 1): out[t, c] =
    sum_j w[j, c] * u'[t + j, c] over u' = past then u, so w[K - 1] multiplies the
    newest. w (K, C) -> (T, C)"""
    t, k = u.shape[0], w.shape[0]
    seq = np.concatenate([past, u])  # (K - 1 + T, C)
    out = seq[0:t] * w[0]
    for j in range(1, k):
        out += seq[j : j + t] * w[j]
    past[...] = seq[t:]
    return out


def delta_rule(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
               s: np.ndarray, heads: np.ndarray) -> np.ndarray:  # fmt: skip
    """The gated delta rule over T tokens, state s (Hv, Dk, Dv) updated in place.
    q, k (T, Hk, Dk): normed and scaled; v (T, Hv, Dv); g, beta (T, Hv); heads (Hv,): the
    key head of each value head. -> (T, Hv, Dv)"""
    out = np.empty_like(v)
    for t in range(v.shape[0]):
        kt, qt = k[t, heads], q[t, heads]  # (Hv, Dk)
        s *= np.exp(g[t])[:, None, None]
        mem = np.einsum("hkv,hk->hv", s, kt)
        delta = (v[t] - mem) * beta[t][:, None]
        s += kt[:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", s, qt)
    return out


def delta_net(c: Config, h: np.ndarray, state, m) -> np.ndarray:
    """A gated delta net's mixing of T tokens of one sequence: h (T, conv_dim + value_dim
    + 2 v_heads) the input projection's rows (q, k, v | z | b | a), `state` its State, `m`
    its DeltaMixer.
    -> (T, value_dim), what out_proj multiplies"""
    d, t = c.delta, h.shape[0]
    qkv, z = h[:, : d.conv_dim], h[:, d.conv_dim : d.conv_dim + d.value_dim]
    b, a = h[:, d.conv_dim + d.value_dim :].reshape(t, 2, d.v_heads).transpose(1, 0, 2)
    qkv = silu(causal_conv(qkv, state.conv, m.conv))
    q = l2norm(qkv[:, : d.key_dim].reshape(t, d.k_heads, d.k_dim))
    q *= np.float32(1 / math.sqrt(d.k_dim))
    k = l2norm(qkv[:, d.key_dim : 2 * d.key_dim].reshape(t, d.k_heads, d.k_dim))
    v = qkv[:, 2 * d.key_dim :].reshape(t, d.v_heads, d.v_dim)
    g = m.a * softplus(a + m.dt_bias)  # (T, Hv), <= 0
    heads = np.array([d.key_head(j) for j in range(d.v_heads)])
    o = delta_rule(q, k, v, g, sigmoid(b), state.s, heads)  # (T, Hv, Dv)
    o = rmsnorm(o, m.norm, c.norm_eps) * silu(z.reshape(t, d.v_heads, d.v_dim))
    return o.reshape(t, d.value_dim)


def short_conv(c: Config, h: np.ndarray, state, m) -> np.ndarray:
    """A short convolution's mixing of T tokens of one sequence: h (T, 3 dim) = B, C, x.
    -> (T, dim): C * conv(B * x)"""
    b, cc, x = h[:, : c.dim], h[:, c.dim : 2 * c.dim], h[:, 2 * c.dim :]
    return cc * causal_conv(b * x, state.conv, m.conv)
