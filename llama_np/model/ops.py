"""The math of the decoder block as small pure functions, float32 in and float32 out.

Scalars are Python floats or np.float32 on purpose: a NumPy float64 scalar is not "weak"
under NumPy 2 promotion and would turn the next matrix product into a float64 copy.
"""

from __future__ import annotations

import math

import numpy as np

from llama_arch import Config
from llama_np.model.kvcache import KVCache, Span
from quant import Matrix


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis. (T, dim) -> (T, dim)"""
    if x.shape[0] == 1:  # decode: one BLAS dot, scalar math, one product (a call costs ~3 us)
        inv = 1.0 / math.sqrt(float(x[0] @ x[0]) / x.shape[1] + eps)
        return x * (weight * np.float32(inv))
    ms = np.mean(np.square(x), axis=-1, keepdims=True)
    return x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps))) * weight


def rope_inv_freq(config: Config) -> np.ndarray:
    """Inverse frequencies of RoPE, computed in float32 as transformers does. (head_dim/2,)"""
    hd = config.head_dim
    exponents = np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)
    inv_freq = np.float32(1.0) / np.power(np.float32(config.rope_theta), exponents)
    if config.rope_freq_factors is not None:
        inv_freq = inv_freq / np.asarray(config.rope_freq_factors, dtype=np.float32)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    factor = np.float32(scaling.factor)
    if scaling.kind == "linear":
        return inv_freq / factor
    # llama3: long wavelengths are divided by `factor`, short ones kept, the band between
    # interpolated smoothly (transformers' _compute_llama3_parameters).
    old_ctx = np.float32(scaling.original_max_position_embeddings)
    low_wavelen = old_ctx / np.float32(scaling.low_freq_factor)
    high_wavelen = old_ctx / np.float32(scaling.high_freq_factor)
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - np.float32(scaling.low_freq_factor)) / np.float32(
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (np.float32(1.0) - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


class Rotary:
    """RoPE at the given positions, in transformers' rotate-half convention: the pair
    (i, i + head_dim/2) turns by position * inv_freq[i].

    For one position (decode) the rotation is a (head_dim, head_dim) matrix built once per
    token and shared by every layer: applying it is one small matmul instead of six
    elementwise passes (`matrix=False` when a compiled kernel applies cos and sin)."""

    def __init__(self, positions: np.ndarray, inv_freq: np.ndarray, matrix: bool = True) -> None:
        angles = positions.astype(np.float32)[:, None] * inv_freq[None, :]  # (T, hd/2)
        self.cos, self.sin = np.cos(angles), np.sin(angles)
        self.matrix = None
        if len(positions) == 1 and matrix:
            h = inv_freq.size
            i = np.arange(h)
            r = np.zeros((2 * h, 2 * h), np.float32)
            r[i, i] = r[i + h, i + h] = self.cos[0]
            r[i, i + h], r[i + h, i] = self.sin[0], -self.sin[0]
            self.matrix = r  # out[j] = x[j] cos - x[j+h] sin;  out[j+h] = x[j+h] cos + x[j] sin

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x (T, heads, head_dim) -> (T, heads, head_dim)"""
        if self.matrix is not None:
            return np.matmul(x, self.matrix)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = self.cos[:, None, :], self.sin[:, None, :]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; rows that are all -inf would be NaN, and never occur
    because every query sees at least itself."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None
) -> np.ndarray:
    """Grouped-query attention: each of the n_kv key/value heads serves n_rep query heads.

    q (T, n_heads, hd); k, v (n_kv, L, hd); mask (T, L) of 0 / -inf or None
    -> (T, n_heads * hd)
    """
    t, n_heads, hd = q.shape
    n_kv = k.shape[0]
    n_rep = n_heads // n_kv
    scale = np.float32(1.0 / math.sqrt(hd))
    if t == 1 and mask is None:  # decode: the fewest NumPy calls
        # Q @ K^T per KV head. Measured at 4096 keys against K @ Q^T, an all-heads GEMM
        # with a block-diagonal Q, and per-query gemv: this stays the fastest (~0.9 ms a
        # layer for SmolLM2); OpenBLAS is slow on products this skinny (n_rep = 3 rows).
        s = np.matmul(q.reshape(n_kv, n_rep, hd), k.transpose(0, 2, 1))  # (n_kv, n_rep, L)
        s *= scale
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        out = np.matmul(s, v)  # (n_kv, n_rep, hd), normalized after: fewer elements
        out /= s.sum(axis=-1, keepdims=True)
        return out.reshape(1, n_heads * hd)
    # (T, n_kv, n_rep, hd) -> (n_kv, n_rep * T, hd): one batched matmul per KV head
    qg = q.reshape(t, n_kv, n_rep, hd).transpose(1, 2, 0, 3).reshape(n_kv, n_rep * t, hd)
    scores = np.matmul(qg, k.transpose(0, 2, 1)) * scale
    if mask is not None:
        scores = scores.reshape(n_kv, n_rep, t, -1) + mask
    probs = softmax(scores).reshape(n_kv, n_rep * t, -1)
    out = np.matmul(probs, v)  # (n_kv, n_rep * T, hd)
    return out.reshape(n_kv, n_rep, t, hd).transpose(2, 0, 1, 3).reshape(t, n_heads * hd)


def causal_mask(q_pos: np.ndarray, k_pos: np.ndarray, window: int | None) -> np.ndarray:
    """0 where query i may see key j (j <= i, and within the window), -inf elsewhere. (T, L)"""
    allowed = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        allowed &= k_pos[None, :] > q_pos[:, None] - window
    return np.where(allowed, np.float32(0.0), np.float32(-np.inf))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The MLP's gated activation silu(gate) * up = gate * up * sigmoid(gate), with
    sigmoid(g) = (1 + tanh(g / 2)) / 2 so that no large |g| overflows an exp; in place,
    one buffer for the whole chain."""
    t = np.multiply(gate, np.float32(0.5))
    np.tanh(t, out=t)
    t += np.float32(1.0)
    t *= gate
    t *= up
    t *= np.float32(0.5)
    return t


class NumpyOps:
    """The operations the forward pass is made of, each a step of the math that a kernel
    backend may run as one fused call: the NumPy reference, composed of the functions
    above. llama_np.model.ops_compiled replaces them for the compiled backend."""

    def attention_batch(
        self, c: Config, qkv: np.ndarray, caches: list, layer: int, rots: list, spans: list
    ) -> np.ndarray:
        """One token of each of B sequences, each with its own cache, rotation and span:
        `attention` of each in turn. (B, q_dim + 2 kv_dim) -> (B, q_dim)"""
        return np.concatenate([self.attention(c, qkv[b : b + 1], cache, layer, rots[b], spans[b])
                               for b, cache in enumerate(caches)])  # fmt: skip

    def linear(self, w: Matrix, x: np.ndarray) -> np.ndarray:
        """x @ W.T: a matvec for one token, a matmul for a batch. (T, cols) -> (T, rows)"""
        if x.shape[0] == 1:
            return w.matvec(x[0])[None, :]
        return w.matmul(x)

    def rotary(self, positions: np.ndarray, inv_freq: np.ndarray) -> Rotary:
        return Rotary(positions, inv_freq)

    def norm_linear(self, x: np.ndarray, norm: np.ndarray, eps: float, w: Matrix) -> np.ndarray:
        """rmsnorm(x) @ W.T: (T, dim) -> (T, rows)"""
        return self.linear(w, rmsnorm(x, norm, eps))

    def linear_add(self, x: np.ndarray, w: Matrix, inp: np.ndarray) -> np.ndarray:
        """The residual stream after a product: x + inp @ W.T (T, dim)"""
        return x + self.linear(w, inp)

    def swiglu_linear_add(self, x: np.ndarray, w: Matrix, gate_up: np.ndarray) -> np.ndarray:
        """x + swiglu(gate, up) @ W.T for gate_up = [gate | up] (T, 2 * hidden) -> (T, dim)"""
        hidden = gate_up.shape[1] // 2
        return x + self.linear(w, swiglu(gate_up[:, :hidden], gate_up[:, hidden:]))

    def attention(
        self, c: Config, qkv: np.ndarray, cache: KVCache, layer: int, rot: Rotary, span: Span
    ) -> np.ndarray:
        """RoPE, append k and v to the cache, attend: qkv (T, q_dim + 2 kv_dim) ->
        (T, q_dim)."""
        t = qkv.shape[0]
        q = qkv[:, : c.q_dim].reshape(t, c.n_heads, c.head_dim)
        k = qkv[:, c.q_dim : c.q_dim + c.kv_dim].reshape(t, c.n_kv_heads, c.head_dim)
        v = qkv[:, c.q_dim + c.kv_dim :].reshape(t, c.n_kv_heads, c.head_dim)
        q, k = rot(q), rot(k)
        view = cache.update(layer, span, k, v)  # attends to view.k, view.v: (n_kv, L, hd)
        mask = None
        if view.positions is not None:
            positions = np.arange(cache.pos, cache.pos + t)
            mask = causal_mask(positions, view.positions, cache.window)  # (T, L)
        return attention(q, view.k, view.v, mask)

    def decode_blocks(
        self, c: Config, blocks: list, x: np.ndarray, cache: KVCache, rot: Rotary, span: Span
    ) -> bool:
        """Every decoder block of a decode step in one call on x (1, dim), in place, where a
        backend has it (ops_compiled); False: the forward pass runs the blocks one operation
        at a time."""
        return False

    def decode_batch(
        self, c: Config, blocks: list, x: np.ndarray, caches: list, rots: list, spans: list
    ) -> bool:
        """Every decoder block of a batch's decode step (one token of each of B sequences)
        in one call on x (B, dim), in place, where a backend has it (ops_compiled); False:
        the blocks one operation at a time."""
        return False
