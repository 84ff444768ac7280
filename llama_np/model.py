"""The forward pass: embedding, N decoder blocks, final norm, LM head.

One `forward(tokens, cache)` serves both phases: a prompt of T tokens runs as one batched
pass (matrix-matrix products), a single token runs matrix-vector products. Every call goes
through the seam (llama_np.seam), which records the bytes it reads in the meter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.meter import Meter
from quant import Weight
from quant.backends import Backend, numpy_backend

from .config import Config
from .kvcache import KVCache
from .ops import NumpyOps, rope_inv_freq
from .seam import Profiled, Seam

# the meter's categories of the weights a product reads
ATTN, MLP, HEAD = "attn_weights", "mlp_weights", "lm_head"


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
    qkv_bias: np.ndarray | None = None  # (rows of wqkv,): qwen2's q, k, v biases


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
        vectors = [self.norm] + [
            v for l in self.layers for v in (l.attn_norm, l.mlp_norm, l.qkv_bias)
        ]
        return sum(v.nbytes for v in vectors if v is not None) + sum(
            w.nbytes for w in self.matrices()
        )


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
        self._seam = Seam(config, self.ops, self.meter)
        self._profiled = Profiled(config, self.ops, self.meter)
        self.inv_freq = rope_inv_freq(config)  # (head_dim / 2,)

    def new_cache(
        self, capacity: int | None = None, window: int | None = None, kv: str = "f32"
    ) -> KVCache:
        """A cache for one sequence. `window` overrides the config's sliding window."""
        window = window if window is not None else self.config.sliding_window
        return KVCache(
            self.config, capacity or self.config.max_seq_len, window, kv, self.backend.tiled_keys
        )

    @property
    def seam(self) -> Seam:
        """Where the forward pass calls the kernels (timed when the meter profiles)."""
        return self._profiled if self.meter.profile else self._seam

    def forward(self, tokens: np.ndarray, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Logits after `tokens`, which continue the sequence held in `cache`.
        tokens (T,) -> (T, vocab) if all_logits else (vocab,) for the last token"""
        w, k = self.weights, self.seam
        t, p0 = len(tokens), cache.pos
        self.meter.begin("decode" if t == 1 else "prefill", p0, t)
        x = k.embed(w.embed, tokens)  # (T, dim)
        rot = self.ops.rotary(np.arange(p0, p0 + t), self.inv_freq)  # shared by every layer
        for i, layer in enumerate(w.layers):
            qkv = k.norm_linear(x, layer.attn_norm, layer.wqkv, ATTN, layer.qkv_bias)  # (T, q+2kv)
            att = k.attention(qkv, cache, i, rot)  # (T, q_dim)
            x = k.linear_add(x, layer.wo, att, ATTN)
            gate_up = k.norm_linear(x, layer.mlp_norm, layer.w_gate_up, MLP)  # (T, 2 hidden)
            x = k.swiglu_linear_add(x, layer.w_down, gate_up, MLP)
        cache.advance(t)
        logits = k.norm_linear(x if all_logits else x[-1:], w.norm, w.lm_head, HEAD)
        self.meter.end()
        return logits if all_logits else logits[-1]  # (T or 1, vocab)
