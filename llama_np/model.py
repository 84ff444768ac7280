"""The forward pass: embedding, N decoder blocks, final norm, LM head.

One `forward(tokens, cache)` serves both phases: a prompt of T tokens runs as one batched
pass (matrix-matrix products), a single token runs matrix-vector products. Wherever a
kernel is called, the meter records the bytes of the arrays that call reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter

import numpy as np

from bench.meter import Meter
from quant import Weight
from quant.backends import Backend, numpy_backend

from .config import Config
from .kvcache import KVCache
from .ops import NumpyOps, Rotary, rope_inv_freq


def ops_for(backend: Backend) -> NumpyOps:
    """The block's operations for a kernel backend: NumPy's, or compiled ones."""
    if backend.name == "numba":
        from .ops_compiled import CompiledOps

        return CompiledOps()
    return NumpyOps()


@dataclass
class Layer:
    """One decoder block. Matrices that read the same input are stacked by rows, so each
    is one kernel call: wqkv holds q, k, v; w_gate_up holds gate, up."""

    attn_norm: np.ndarray  # (dim,)
    wqkv: Weight  # (n_heads * head_dim + 2 * n_kv_heads * head_dim, dim)
    wo: Weight  # (dim, n_heads * head_dim)
    mlp_norm: np.ndarray  # (dim,)
    w_gate_up: Weight  # (2 * hidden_dim, dim)
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
            m for l in self.layers for m in (l.wqkv, l.wo, l.w_gate_up, l.w_down)
        ]:
            seen.setdefault(id(w), w)
        return list(seen.values())

    @property
    def nbytes(self) -> int:
        norms = self.norm.nbytes + sum(l.attn_norm.nbytes + l.mlp_norm.nbytes for l in self.layers)
        return norms + sum(w.nbytes for w in self.matrices())


class Transformer:
    def __init__(
        self,
        config: Config,
        weights: Weights,
        backend: Backend | None = None,
        meter: Meter | None = None,
    ) -> None:
        """`backend`: the kernels, which laid out `weights` (default: NumPy's)."""
        self.config = config
        self.weights = weights
        self.backend = backend or numpy_backend()
        self.ops = ops_for(self.backend)
        self.meter = meter or Meter()
        self.inv_freq = rope_inv_freq(config)  # (head_dim / 2,)

    def new_cache(
        self, capacity: int | None = None, window: int | None = None, kv: str = "f32"
    ) -> KVCache:
        """A cache for one sequence. `window` overrides the config's sliding window."""
        window = window if window is not None else self.config.sliding_window
        return KVCache(
            self.config, capacity or self.config.max_seq_len, window, kv, self.backend.tiled_keys
        )

    def forward(self, tokens: np.ndarray, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Logits after `tokens`, which continue the sequence held in `cache`.
        tokens (T,) -> (T, vocab) if all_logits else (vocab,) for the last token"""
        w, meter = self.weights, self.meter
        t, p0 = len(tokens), cache.pos
        meter.begin("decode" if t == 1 else "prefill", p0, t)
        t0 = perf_counter() if meter.profile else 0.0
        x = w.embed.rows(tokens)  # (T, dim)
        meter.read("embedding", t * w.embed.row_nbytes)
        if t0:
            meter.lap("embedding", t0)
        rot = self.ops.rotary(np.arange(p0, p0 + t), self.inv_freq)  # shared by every layer
        for i, layer in enumerate(w.layers):
            x = x + self._attention(i, layer, x, cache, rot)
            x = x + self._mlp(layer, x)
        cache.advance(t)
        x = self._norm(x if all_logits else x[-1:], w.norm)
        logits = self._linear(w.lm_head, x, "lm_head")  # (T or 1, vocab)
        meter.end()
        return logits if all_logits else logits[-1]

    def _attention(
        self, i: int, layer: Layer, x: np.ndarray, cache: KVCache, rot: Rotary
    ) -> np.ndarray:
        h = self._norm(x, layer.attn_norm)
        qkv = self._linear(layer.wqkv, h, "attn_weights")  # (T, q_dim + 2 kv_dim)
        meter = self.meter
        t0 = perf_counter() if meter.profile else 0.0
        out, read, written = self.ops.attention(self.config, qkv, cache, i, rot)  # (T, q_dim)
        meter.read("kv_cache", read)
        meter.write("kv_cache", written)
        if t0:  # RoPE, the cache append and attention
            meter.lap("kv_cache", t0)
        return self._linear(layer.wo, out, "attn_weights")

    def _mlp(self, layer: Layer, x: np.ndarray) -> np.ndarray:
        h = self._norm(x, layer.mlp_norm)
        gate_up = self._linear(layer.w_gate_up, h, "mlp_weights")  # (T, 2 * hidden_dim)
        t0 = perf_counter() if self.meter.profile else 0.0
        act = self.ops.swiglu(gate_up)  # (T, hidden_dim)
        if t0:  # timed with the MLP matrices
            self.meter.lap("mlp_weights", t0)
        return self._linear(layer.w_down, act, "mlp_weights")  # (T, dim)

    def _norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        meter = self.meter
        meter.read("norms", weight.nbytes)
        t0 = perf_counter() if meter.profile else 0.0
        y = self.ops.rmsnorm(x, weight, self.config.norm_eps)
        if t0:
            meter.lap("norms", t0)
        return y

    def _linear(self, w: Weight, x: np.ndarray, category: str) -> np.ndarray:
        """x @ W.T: a matvec for one token, a matmul for a batch. (T, cols) -> (T, rows)"""
        meter = self.meter
        meter.read(category, w.nbytes)
        t0 = perf_counter() if meter.profile else 0.0
        y = w.matvec(x[0])[None, :] if x.shape[0] == 1 else w.matmul(x)
        if t0:
            meter.lap(category, t0)
        return y
