"""The forward pass: embedding, N decoder blocks, final norm, LM head.

One `forward(tokens, cache)` serves both phases: a prompt of T tokens runs as one batched
pass (matrix-matrix products), a single token runs matrix-vector products. Wherever a
kernel is called, the meter records the bytes of the arrays that call reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.meter import Meter
from quant import Weight

from .config import Config
from .kvcache import KVCache
from .ops import attention, causal_mask, rmsnorm, rope, rope_cos_sin, rope_inv_freq, swiglu


@dataclass
class Layer:
    attn_norm: np.ndarray  # (dim,)
    wq: Weight  # (n_heads * head_dim, dim)
    wk: Weight  # (n_kv_heads * head_dim, dim)
    wv: Weight  # (n_kv_heads * head_dim, dim)
    wo: Weight  # (dim, n_heads * head_dim)
    mlp_norm: np.ndarray  # (dim,)
    w_gate: Weight  # (hidden_dim, dim)
    w_up: Weight  # (hidden_dim, dim)
    w_down: Weight  # (dim, hidden_dim)


@dataclass
class Weights:
    embed: Weight  # (vocab_size, dim)
    layers: list[Layer]  # (n_layers,)
    norm: np.ndarray  # (dim,)
    lm_head: Weight  # (vocab_size, dim); the very same object as `embed` when tied

    def matrices(self) -> list[Weight]:
        """Every distinct matrix once (a tied embedding is one matrix)."""
        seen: dict[int, Weight] = {}
        for w in [self.embed, self.lm_head] + [
            m for l in self.layers for m in (l.wq, l.wk, l.wv, l.wo, l.w_gate, l.w_up, l.w_down)
        ]:
            seen.setdefault(id(w), w)
        return list(seen.values())

    @property
    def nbytes(self) -> int:
        norms = self.norm.nbytes + sum(l.attn_norm.nbytes + l.mlp_norm.nbytes for l in self.layers)
        return norms + sum(w.nbytes for w in self.matrices())


class Transformer:
    def __init__(self, config: Config, weights: Weights, meter: Meter | None = None) -> None:
        self.config = config
        self.weights = weights
        self.meter = meter or Meter()
        self.inv_freq = rope_inv_freq(config)  # (head_dim / 2,)

    def new_cache(
        self, capacity: int | None = None, window: int | None = None, kv: str = "f32"
    ) -> KVCache:
        """A cache for one sequence. `window` overrides the config's sliding window."""
        window = window if window is not None else self.config.sliding_window
        return KVCache(self.config, capacity or self.config.max_seq_len, window, kv)

    def forward(self, tokens: np.ndarray, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Logits after `tokens`, which continue the sequence held in `cache`.
        tokens (T,) -> (T, vocab) if all_logits else (vocab,) for the last token"""
        w, meter = self.weights, self.meter
        t, p0 = len(tokens), cache.pos
        meter.begin("decode" if t == 1 else "prefill", p0, t)
        x = w.embed.rows(tokens)  # (T, dim)
        meter.read("embedding", t * w.embed.row_nbytes)
        positions = np.arange(p0, p0 + t)
        cos, sin = rope_cos_sin(positions, self.inv_freq)  # (T, head_dim / 2) each
        for i, layer in enumerate(w.layers):
            x = x + self._attention(i, layer, x, cache, positions, cos, sin)
            x = x + self._mlp(layer, x)
        cache.advance(t)
        x = self._norm(x if all_logits else x[-1:], w.norm)
        logits = self._linear(w.lm_head, x, "lm_head")  # (T or 1, vocab)
        meter.end()
        return logits if all_logits else logits[-1]

    def _attention(
        self,
        i: int,
        layer: Layer,
        x: np.ndarray,
        cache: KVCache,
        positions: np.ndarray,
        cos: np.ndarray,
        sin: np.ndarray,
    ) -> np.ndarray:
        c, t = self.config, x.shape[0]
        h = self._norm(x, layer.attn_norm)
        q = self._linear(layer.wq, h, "attn_weights").reshape(t, c.n_heads, c.head_dim)
        k = self._linear(layer.wk, h, "attn_weights").reshape(t, c.n_kv_heads, c.head_dim)
        v = self._linear(layer.wv, h, "attn_weights").reshape(t, c.n_kv_heads, c.head_dim)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        view = cache.update(i, k, v)  # attends to view.k, view.v: (n_kv, L, hd)
        self.meter.read("kv_cache", view.read_nbytes)
        self.meter.write("kv_cache", view.write_nbytes)
        mask = None
        if view.positions is not None:
            mask = causal_mask(positions, view.positions, cache.window)  # (T, L)
        out = attention(q, view.k, view.v, mask)  # (T, n_heads * head_dim)
        return self._linear(layer.wo, out, "attn_weights")

    def _mlp(self, layer: Layer, x: np.ndarray) -> np.ndarray:
        h = self._norm(x, layer.mlp_norm)
        gate = self._linear(layer.w_gate, h, "mlp_weights")  # (T, hidden_dim)
        up = self._linear(layer.w_up, h, "mlp_weights")
        return self._linear(layer.w_down, swiglu(gate, up), "mlp_weights")  # (T, dim)

    def _norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        self.meter.read("norms", weight.nbytes)
        return rmsnorm(x, weight, self.config.norm_eps)

    def _linear(self, w: Weight, x: np.ndarray, category: str) -> np.ndarray:
        """x @ W.T: a matvec for one token, a matmul for a batch. (T, cols) -> (T, rows)"""
        self.meter.read(category, w.nbytes)
        if x.shape[0] == 1:
            return w.matvec(x[0])[None, :]
        return w.matmul(x)
