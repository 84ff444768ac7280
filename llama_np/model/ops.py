"""The math of the decoder block as small pure functions, float32 in and float32 out.

Scalars are Python floats or np.float32 on purpose: a NumPy float64 scalar is not "weak"
under NumPy 2 promotion and would turn the next matrix product into a float64 copy.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from llama_arch import Config
from llama_np.model.kvcache import KVCache, Span
from quant import Matrix


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis. (..., n) -> (..., n)"""
    if x.ndim == 2 and x.shape[0] == 1:  # decode: one BLAS dot, scalar math, one product
        inv = 1.0 / math.sqrt(float(x[0] @ x[0]) / x.shape[1] + eps)
        return x * (weight * np.float32(inv))
    ms = np.mean(np.square(x), axis=-1, keepdims=True)
    return x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps))) * weight


def rope_inv_freq(config: Config, kind: str = "global", long: bool = False) -> np.ndarray:
    """Inverse frequencies of RoPE over the rotary dims, in float32 as transformers computes
    them, for a layer's kind (Config.layer_rope): "global" with the config's scaling,
    "local" (gemma3's sliding layers: their own base, unscaled), "none" (NoPE: every
    angle 0, so the rotation is the identity, exactly). `long`: longrope past the original
    context. (rotary / 2,)"""
    d = config.rotary
    exponents = np.arange(0, d, 2, dtype=np.float32) / np.float32(d)
    if kind == "none":
        return np.zeros(d // 2, np.float32)
    if kind == "global" and config.rope_proportion is not None:
        return proportional_inv_freq(config)
    theta = config.rope_local_theta if kind == "local" else config.rope_theta
    inv_freq = np.float32(1.0) / np.power(np.float32(theta), exponents)
    if kind == "local":
        return inv_freq
    if config.rope_freq_factors is not None:
        inv_freq = inv_freq / np.asarray(config.rope_freq_factors, dtype=np.float32)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    factor = np.float32(scaling.factor)
    if scaling.kind == "linear":
        return inv_freq / factor
    if scaling.kind == "longrope":  # transformers: 1 / (factor_i * base^(2i/d))
        ext = np.asarray(scaling.long_factor if long else scaling.short_factor, np.float32)
        return np.float32(1.0) / (ext * np.power(np.float32(theta), exponents))
    if scaling.kind == "yarn":
        return yarn_inv_freq(inv_freq, scaling, d, theta)
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


def proportional_inv_freq(c: Config) -> np.ndarray:
    """gemma4's full layers (transformers' "proportional" RoPE): the first
    int(p * head_dim / 2) frequencies theta^(-2j / head_dim), the rest 0 (those pairs never
    turn). (head_dim / 2,)"""
    half = c.head_dim // 2
    turned = int(c.rope_proportion * c.head_dim // 2)
    exponents = np.arange(0, 2 * turned, 2, dtype=np.float32) / np.float32(c.head_dim)
    out = np.zeros(half, np.float32)
    out[:turned] = np.float32(1.0) / np.power(np.float32(c.rope_theta), exponents)
    return out


def yarn_inv_freq(inv_freq: np.ndarray, s, dim: int, theta: float) -> np.ndarray:
    """YaRN (transformers' _compute_yarn_parameters; llama.cpp's ramp is the same): the
    frequencies that turn fewer than beta_slow times in the original context divided by
    the factor, those that turn more than beta_fast times kept, a linear ramp between."""

    def dim_of(rotations: float) -> float:  # the dim whose frequency turns this often
        ctx = s.original_max_position_embeddings
        return dim * math.log(ctx / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(s.beta_fast), dim_of(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = (np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(
        high - low if high != low else 0.001)  # fmt: skip
    keep = np.float32(1) - np.clip(ramp, 0, 1)  # 1: the frequency as it is
    return (inv_freq / np.float32(s.factor) * (np.float32(1) - keep) + inv_freq * keep).astype(
        np.float32
    )


def rope_scale(config: Config, kind: str) -> float:
    """What cos and sin are multiplied by: longrope's and YaRN's attention factor on their
    layers."""
    r = config.rope_scaling
    scaled = r is not None and r.kind in ("longrope", "yarn") and kind == "global"
    return r.attention_factor if scaled else 1.0


class Rotary:
    """RoPE at the given positions, in transformers' rotate-half convention: the pair
    (i, i + rotary/2) turns by position * inv_freq[i]; a head's dims past the rotary ones
    (partial rotary: phi3) pass unchanged. cos and sin carry `scale` (longrope).

    For one position (decode) the rotation is a (head_dim, head_dim) matrix built once per
    token and shared by every layer: applying it is one small matmul instead of six
    elementwise passes (`matrix=False` when a compiled kernel applies cos and sin)."""

    def __init__(self, positions: np.ndarray, inv_freq: np.ndarray, head_dim: int,
                 scale: float = 1.0, matrix: bool = True) -> None:  # fmt: skip
        angles = positions.astype(np.float32)[:, None] * inv_freq[None, :]  # (T, rotary/2)
        self.cos, self.sin = np.cos(angles), np.sin(angles)
        if scale != 1.0:  # transformers: cos and sin times longrope's attention factor
            self.cos *= np.float32(scale)
            self.sin *= np.float32(scale)
        self.matrix = None
        if len(positions) == 1 and matrix:
            h = inv_freq.size
            i = np.arange(h)
            r = np.eye(head_dim, dtype=np.float32)
            r[i, i] = r[i + h, i + h] = self.cos[0]
            r[i, i + h], r[i + h, i] = self.sin[0], -self.sin[0]
            self.matrix = r  # out[j] = x[j] cos - x[j+h] sin;  out[j+h] = x[j+h] cos + x[j] sin

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x (T, heads, head_dim) -> (T, heads, head_dim)"""
        if self.matrix is not None:
            return np.matmul(x, self.matrix)
        half = self.cos.shape[-1]
        x1, x2 = x[..., :half], x[..., half : 2 * half]
        c, s = self.cos[:, None, :], self.sin[:, None, :]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * half :]], axis=-1)


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; rows that are all -inf would be NaN, and never occur
    because every query sees at least itself."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
    scale: float | None = None, softcap: float | None = None,
) -> np.ndarray:  # fmt: skip
    """Grouped-query attention: each of the n_kv key/value heads serves n_rep query heads.
    The scores times `scale` (default 1/sqrt(hd)), soft-capped when `softcap` (gemma2:
    cap * tanh(s / cap)), before the mask.

    q (T, n_heads, hd); k, v (n_kv, L, hd); mask (T, L) of 0 / -inf or None
    -> (T, n_heads * hd)
    """
    t, n_heads, hd = q.shape
    n_kv = k.shape[0]
    n_rep = n_heads // n_kv
    scale = np.float32(1.0 / math.sqrt(hd) if scale is None else scale)
    if t == 1 and mask is None:  # decode: the fewest NumPy calls
        # Q @ K^T per KV head. Measured at 4096 keys against K @ Q^T, an all-heads GEMM
        # with a block-diagonal Q, and per-query gemv: this stays the fastest (~0.9 ms a
        # layer for SmolLM2); OpenBLAS is slow on products this skinny (n_rep = 3 rows).
        s = np.matmul(q.reshape(n_kv, n_rep, hd), k.transpose(0, 2, 1))  # (n_kv, n_rep, L)
        s *= scale
        if softcap is not None:
            s = capped(s, softcap)
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        out = np.matmul(s, v)  # (n_kv, n_rep, hd), normalized after: fewer elements
        out /= s.sum(axis=-1, keepdims=True)
        return out.reshape(1, n_heads * hd)
    # (T, n_kv, n_rep, hd) -> (n_kv, n_rep * T, hd): one batched matmul per KV head
    qg = q.reshape(t, n_kv, n_rep, hd).transpose(1, 2, 0, 3).reshape(n_kv, n_rep * t, hd)
    scores = np.matmul(qg, k.transpose(0, 2, 1)) * scale
    if softcap is not None:
        scores = capped(scores, softcap)
    if mask is not None:
        scores = scores.reshape(n_kv, n_rep, t, -1) + mask
    probs = softmax(scores).reshape(n_kv, n_rep * t, -1)
    out = np.matmul(probs, v)  # (n_kv, n_rep * T, hd)
    return out.reshape(n_kv, n_rep, t, hd).transpose(2, 0, 1, 3).reshape(t, n_heads * hd)


def capped(x: np.ndarray, cap: float) -> np.ndarray:
    """Soft-capping as Gemma's: cap * tanh(x / cap), in float32."""
    c = np.float32(cap)
    return np.tanh(x / c) * c


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


GELU_C = np.float32(math.sqrt(2 / math.pi))


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Gemma's gated activation gelu_tanh(gate) * up, with GELU's tanh approximation
    0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), as PyTorch's; one buffer."""
    t = gate * gate
    t *= np.float32(0.044715) * gate
    t += gate
    t *= GELU_C
    np.tanh(t, out=t)
    t += np.float32(1.0)
    t *= gate
    t *= np.float32(0.5)
    t *= up
    return t


GATES = {"silu": swiglu, "gelu_tanh": geglu}


def top_k(logits: np.ndarray, k: int, renormalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """A router's choice: the softmax of each row of logits (T, E) in float32, its k largest
    (ties to the lower expert number, as llama.cpp's CPU sort for E <= 16), their weights
    renormalized to sum 1 where the family does. -> experts (T, k), weights (T, k)"""
    p = softmax(logits.astype(np.float32))
    sel = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, sel, axis=-1)
    if renormalize:
        w = w / w.sum(axis=-1, keepdims=True)
    return sel, w


class QKNorms(NamedTuple):
    """A layer's RMSNorms of q and k before RoPE (Config.qk_norm): over each head
    ("head": weights (head_dim,)), over each whole projection ("all": (q_dim,), (kv_dim,)),
    or none."""

    q: np.ndarray | None = None
    k: np.ndarray | None = None
    eps: float = 1e-6

    def apply(self, q: np.ndarray, k: np.ndarray, c: Config) -> tuple[np.ndarray, np.ndarray]:
        """q (T, q_dim), k (T, kv_dim) -> (T, n_heads, hd), (T, n_kv_heads, hd)"""
        t = q.shape[0]
        if self.q is not None and c.qk_norm == "all":
            q, k = rmsnorm(q, self.q, self.eps), rmsnorm(k, self.k, self.eps)
        q = q.reshape(t, c.n_heads, c.head_dim)
        k = k.reshape(t, c.n_kv_heads, c.head_dim)
        if self.q is not None and c.qk_norm == "head":
            q, k = rmsnorm(q, self.q, self.eps), rmsnorm(k, self.k, self.eps)
        return q, k


def norm_heads(x: np.ndarray, head_dim: int, eps: float) -> np.ndarray:
    """RMSNorm of each head of x (T, heads * head_dim) without a weight (gemma4's v)."""
    h = x.reshape(x.shape[0], -1, head_dim)
    ms = np.mean(np.square(h), axis=-1, keepdims=True)
    return (h * (np.float32(1.0) / np.sqrt(ms + np.float32(eps)))).reshape(x.shape)


class Residual(NamedTuple):
    """What a sub-block's output goes through before the residual add: an RMSNorm (the
    post-norms of gemma and olmo2) and a scale (granite's residual_multiplier)."""

    norm: np.ndarray | None = None
    eps: float = 1e-6
    scale: float = 1.0

    def apply(self, y: np.ndarray) -> np.ndarray:
        if self.norm is not None:
            y = rmsnorm(y, self.norm, self.eps)
        if self.scale != 1.0:
            y = y * np.float32(self.scale)
        return y


PLAIN_RESIDUAL = Residual()  # the product as it is


class NumpyOps:
    """The operations the forward pass is made of, each a step of the math that a kernel
    backend may run as one fused call: the NumPy reference, composed of the functions
    above. llama_np.model.ops_compiled replaces them for the compiled backend."""

    def attention_batch(
        self, c: Config, qkv: np.ndarray, caches: list, layer: int, rots: list, spans: list,
        qk: QKNorms,
    ) -> np.ndarray:  # fmt: skip
        """One token of each of B sequences, each with its own cache, rotation and span:
        `attention` of each in turn. (B, q_dim + 2 kv_dim) -> (B, q_dim)"""
        return np.concatenate([self.attention(c, qkv[b : b + 1], cache, layer, rots[b], spans[b],
                                              qk) for b, cache in enumerate(caches)])  # fmt: skip

    def linear(self, w: Matrix, x: np.ndarray) -> np.ndarray:
        """x @ W.T: a matvec for one token, a matmul for a batch. (T, cols) -> (T, rows)"""
        if x.shape[0] == 1:
            return w.matvec(x[0])[None, :]
        return w.matmul(x)

    def rotary(self, positions: np.ndarray, inv_freq: np.ndarray, head_dim: int,
               scale: float = 1.0) -> Rotary:  # fmt: skip
        return Rotary(positions, inv_freq, head_dim, scale)

    def norm_linear(self, x: np.ndarray, norm: np.ndarray | None, eps: float,
                    w: Matrix) -> np.ndarray:  # fmt: skip
        """rmsnorm(x) @ W.T (x @ W.T without a norm): (T, dim) -> (T, rows)"""
        return self.linear(w, x if norm is None else rmsnorm(x, norm, eps))

    def head_epilogue(self, logits: np.ndarray, c: Config) -> np.ndarray:
        """The logits as the family ends them: divided by granite's logits_scaling,
        soft-capped as Gemma's."""
        if c.logits_scaling != 1.0:
            logits = logits / np.float32(c.logits_scaling)
        if c.final_softcap is not None:
            logits = capped(logits, c.final_softcap)
        return logits

    def linear_add(self, x: np.ndarray, w: Matrix, inp: np.ndarray,
                   post: Residual) -> np.ndarray:  # fmt: skip
        """The residual stream after a product: x + scale * post_norm(inp @ W.T) (T, dim),
        with the norm where the family has one (gemma, olmo2), the scale granite's."""
        return x + post.apply(self.linear(w, inp))

    def gated_linear_add(self, x: np.ndarray, w: Matrix, gate_up: np.ndarray, act: str,
                         post: Residual) -> np.ndarray:  # fmt: skip
        """x + scale * post_norm(act(gate) * up @ W.T) for gate_up = [gate | up]:
        (T, 2 * hidden) -> (T, dim)"""
        hidden = gate_up.shape[1] // 2
        h = GATES[act](gate_up[:, :hidden], gate_up[:, hidden:])
        return x + post.apply(self.linear(w, h))

    def moe(self, c: Config, x: np.ndarray, norm: np.ndarray | None, eps: float, experts,
            post: Residual) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """A mixture of experts' MLP on x (T, dim): the router's choice of each token's k
        experts from rmsnorm(x) (top_k of its softmax), then their weighted sum (`experts`).
        -> (x + post(the sum), the experts chosen (T, k))"""
        h = x if norm is None else rmsnorm(x, norm, eps)
        logits = self.norm_linear(h, None, eps, experts.router)  # (T, n_experts)
        sel, w = top_k(logits, c.experts_per_token, c.norm_topk)
        return self.experts(c, x, h, sel, w, experts, post), sel

    def experts(self, c: Config, x: np.ndarray, h: np.ndarray, sel: np.ndarray, w: np.ndarray,
                experts, post: Residual) -> np.ndarray:  # fmt: skip
        """x + post(sum over each token's experts sel of w * expert(h)): each chosen expert's
        product once, of all the tokens routed to it (its rows of h), its SwiGLU; the
        sums of a token in the order of its experts' numbers, as transformers adds them."""
        y = np.zeros_like(x)
        for e in np.unique(sel):
            t, j = np.nonzero(sel == e)  # the tokens routed to e, and where in their k
            rows = np.ascontiguousarray(h[t])
            gate_up = self.norm_linear(rows, None, np.float32(0), experts.gate_up[e])
            out = np.zeros((len(t), x.shape[1]), np.float32)
            out = self.gated_linear_add(out, experts.down[e], gate_up, c.mlp_act, PLAIN_RESIDUAL)
            y[t] += w[t, j][:, None] * out
        return x + post.apply(y)

    def attention(
        self, c: Config, qkv: np.ndarray, cache: KVCache, layer: int, rot: Rotary, span: Span,
        qk: QKNorms,
    ) -> np.ndarray:  # fmt: skip
        """q and k normed (as the family norms them), RoPE, append k and v to the cache,
        attend: qkv (T, q_dim + 2 kv_dim) -> (T, q_dim). A shared KV layer: its q alone
        (shared_attention)."""
        if cache.shares(layer):
            return self.shared_attention(c, qkv, cache, layer, rot, span, qk)
        t = qkv.shape[0]
        q, k = qk.apply(qkv[:, : c.q_dim], qkv[:, c.q_dim : c.q_dim + c.kv_dim], c)
        v = qkv[:, c.q_dim + c.kv_dim :].reshape(t, c.n_kv_heads, c.head_dim)
        q, k = rot(q), rot(k)
        view = cache.update(layer, span, k, v)  # attends to view.k, view.v: (n_kv, L, hd)
        mask = None
        if view.positions is not None:
            positions = np.arange(cache.pos, cache.pos + t)
            mask = causal_mask(positions, view.positions, cache.windows[layer])  # (T, L)
        return attention(q, view.k, view.v, mask, c.attn_scale, c.attn_softcap)

    def shared_attention(
        self, c: Config, q: np.ndarray, cache: KVCache, layer: int, rot: Rotary, span: Span,
        qk: QKNorms,
    ) -> np.ndarray:  # fmt: skip
        """A shared KV layer (gemma4): q normed and turned, attending to what its source
        layer attended to in this step, appending nothing. q (T, q_dim) -> (T, q_dim)"""
        t = q.shape[0]
        q = q.reshape(t, c.n_heads, c.head_dim)
        if qk.q is not None:
            q = rmsnorm(q, qk.q, qk.eps)
        view = cache.shared_view(layer)
        mask = None
        if view.positions is not None:
            positions = np.arange(cache.pos, cache.pos + t)
            mask = causal_mask(positions, view.positions, cache.windows[layer])
        return attention(rot(q), view.k, view.v, mask, c.attn_scale, c.attn_softcap)

    def norm_values(self, c: Config, qkv: np.ndarray, eps: float) -> np.ndarray:
        """gemma4: v (qkv's last kv_dim columns) RMS-normed per head without a weight,
        before it is stored. (T, q_dim + 2 kv_dim)"""
        qkv = np.array(qkv, np.float32)  # ours to change
        qkv[:, -c.kv_dim :] = norm_heads(qkv[:, -c.kv_dim :], c.head_dim, eps)
        return qkv

    def per_layer_inputs(self, c: Config, rows: np.ndarray, proj: np.ndarray, norm: np.ndarray,
                         eps: float) -> np.ndarray:  # fmt: skip
        """gemma4's per-layer inputs from the table's rows of the tokens (T, layers *
        ple_dim) and the embedding's projection (the same shape): the projection times
        1 / sqrt(dim) and normed per layer, the rows times sqrt(ple_dim), their sum times
        1 / sqrt(2). -> (T, layers, ple_dim)"""
        t, p = rows.shape[0], c.ple_dim
        proj = rmsnorm((proj * np.float32(c.dim**-0.5)).reshape(t, -1, p), norm, eps)
        return (proj + rows.reshape(t, -1, p) * np.float32(math.sqrt(p))) * np.float32(0.5**0.5)

    def forget(self) -> None:
        """Drop what was made once from a model's weights (Transformer.weights_changed)."""

    def recurrent(self, c: Config, h: np.ndarray, states: list, mixer) -> np.ndarray:
        """A recurrent mixer (a gated delta net, a short convolution) on the rows of its
        input projection h: T tokens of one sequence (one state), or one token of each of
        B sequences (a state each). -> (T, the columns of its wo)"""
        from llama_np.model import recurrent

        mix = recurrent.delta_net if mixer.kind == "delta" else recurrent.short_conv
        if len(states) == 1:
            return mix(c, h, states[0], mixer)
        return np.concatenate([mix(c, h[b : b + 1], s, mixer) for b, s in enumerate(states)])

    def split_gate(self, c: Config, qkv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """qwen3_5's q_proj rows hold each head's q then its gate: (T, 2 q_dim + 2 kv_dim)
        -> the q, k, v attention takes (T, q_dim + 2 kv_dim), and the gates (T, q_dim)."""
        t = qkv.shape[0]
        qg = qkv[:, : 2 * c.q_dim].reshape(t, c.n_heads, 2, c.head_dim)
        q = qg[:, :, 0].reshape(t, c.q_dim)
        return np.concatenate([q, qkv[:, 2 * c.q_dim :]], axis=1), qg[:, :, 1].reshape(t, c.q_dim)

    def sigmoid_gate(self, y: np.ndarray, gate: np.ndarray) -> np.ndarray:
        """qwen3_5's gated attention: y * sigmoid(gate), (T, q_dim)."""
        half = np.float32(0.5)
        return y * (half + half * np.tanh(gate * half))

    def decode_layers(
        self, c: Config, layers: list, x: np.ndarray, cache: KVCache, rot: Rotary, span: Span,
        chosen: np.ndarray, ple: np.ndarray | None = None,
    ) -> bool:  # fmt: skip
        """Every decoder block of a decode step in one call on x (1, dim), in place, where a
        backend has it (ops_compiled), a mixture of experts' choices written into chosen
        (layers, k), gemma4's per-layer inputs ple (1, layers, ple_dim) taken in; False:
        the forward pass runs the layers one operation at a time."""
        return False

    def step_seconds(self) -> dict[str, float]:
        """The last one-call decode step's time by the meter's categories, and "waits" (see
        ops_compiled); only after a decode_layers or decode_batch that said True."""
        raise NotImplementedError

    def decode_batch(
        self, c: Config, layers: list, x: np.ndarray, caches: list, rots: list, spans: list
    ) -> bool:
        """Every decoder block of a batch's decode step (one token of each of B sequences)
        in one call on x (B, dim), in place, where a backend has it (ops_compiled); False:
        the layers one operation at a time."""
        return False
