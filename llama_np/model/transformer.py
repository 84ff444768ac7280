"""The forward pass: embedding, N decoder blocks, final norm, LM head.

One `forward(tokens, cache)` serves both phases: a prompt of T tokens runs as one batched
pass (matrix-matrix products), a single token runs matrix-vector products. Every call goes
through the seam (llama_np.model.seam), which records the bytes it reads in the meter.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bench.meter import Meter
from llama_arch import Config
from llama_np.model.kvcache import KVCache
from llama_np.model.ops import NumpyOps, rope_inv_freq
from llama_np.model.seam import Profiled, Seam
from quant import Matrix
from quant.backends import Backend, Running, numpy_backend

# the meter's categories of the weights a product reads
ATTN, MLP, HEAD = "attn_weights", "mlp_weights", "lm_head"


def ops_for(backend: Backend) -> NumpyOps:
    """The block's operations for a kernel backend: the NumPy reference, or the fused
    decode operations of a backend that has them."""
    if backend.fused:
        from llama_np.model.ops_compiled import CompiledOps

        return CompiledOps(backend.dot)
    return NumpyOps()


@dataclass
class Layer:
    """One decoder block. Matrices that read the same input are stacked by rows, so each
    is one kernel call: wqkv holds q, k, v; w_gate_up holds gate, up."""

    attn_norm: np.ndarray  # (dim,)
    wqkv: Matrix  # (n_heads * head_dim + 2 * n_kv_heads * head_dim, dim)
    wo: Matrix  # (dim, n_heads * head_dim)
    mlp_norm: np.ndarray  # (dim,)
    w_gate_up: Matrix  # (2 * hidden_dim, dim)
    w_down: Matrix  # (dim, hidden_dim)
    qkv_bias: np.ndarray | None = None  # (rows of wqkv,): qwen2's q, k, v biases


@dataclass
class Weights:
    embed: Matrix  # (vocab_size, dim)
    layers: list[Layer]  # (n_layers,)
    norm: np.ndarray  # (dim,)
    lm_head: Matrix  # (vocab_size, dim); the very same object as `embed` when tied

    def matrices(self) -> list[Matrix]:
        """Every distinct matrix once (a tied embedding is one matrix)."""
        seen: dict[int, Matrix] = {}
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
    """The model: weights, the kernels that multiply them, the forward pass. Its kernels
    run on one thread until `start(threads)`; `close()` (or leaving a `with` block) stops
    whatever `start` began."""

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
        self.meter = meter or Meter()
        self.inv_freq = rope_inv_freq(config)  # (head_dim / 2,)
        self.ops = ops_for(self.backend)
        self._seam = Seam(self.config, self.ops, self.meter)
        self._profiled = Profiled(self.config, self.ops, self.meter)
        self.running = Running("one thread")

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def kernels(self) -> str:
        """How the kernels run, for reports: "numba omp, 2 threads", "numpy, 2 threads"."""
        return self.running.label

    def start(self, threads: int) -> Transformer:
        """Run the kernels on `threads` cores (quant.backends.Backend.start)."""
        self.close()
        self.running = self.backend.start(self.weights.matrices(), threads)
        return self

    def close(self) -> None:
        self.running.close()
        self.running = Running("one thread")

    def __enter__(self) -> Transformer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def new_cache(
        self, capacity: int | None = None, window: int | None = None, kv: str = "f32"
    ) -> KVCache:
        """A cache for one sequence. `window` overrides the config's sliding window."""
        window = window if window is not None else self.config.sliding_window
        return KVCache(self.config, capacity or self.config.max_seq_len, window, kv, self.backend)

    @property
    def seam(self) -> Seam:
        """Where the forward pass calls the kernels (timed when the meter profiles)."""
        return self._profiled if self.meter.profile else self._seam

    def forward(self, tokens: np.ndarray, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Logits after `tokens`, which continue the sequence held in `cache`.
        tokens (T,) -> (T, vocab) if all_logits else (vocab,) for the last token.
        A non-finite weight or scale gives non-finite logits without a NumPy warning: the
        generation loop checks the logits and says so in one line."""
        with np.errstate(invalid="ignore", over="ignore"):
            return self._forward(tokens, cache, all_logits)

    def _forward(self, tokens: np.ndarray, cache: KVCache, all_logits: bool) -> np.ndarray:
        w, seam = self.weights, self.seam
        t, p0 = len(tokens), cache.pos
        span = cache.span(t)  # where the new positions go, what they attend to
        self.meter.begin("decode" if t == 1 else "prefill", p0, t)
        x = seam.embed(w.embed, tokens)  # (T, dim)
        rot = self.ops.rotary(np.arange(p0, p0 + t), self.inv_freq)  # shared by every layer
        # a decode step runs every block in one call (x in place) where the backend can
        if not (t == 1 and seam.decode_blocks(w.layers, self.block_reads, x, cache, rot, span)):
            x = self._blocks(x, lambda qkv, i: seam.attention(qkv, cache, i, rot, span))
        cache.advance(t)
        logits = seam.norm_linear(x if all_logits else x[-1:], w.norm, w.lm_head, HEAD)
        self.meter.end()
        return logits if all_logits else logits[-1]  # (T or 1, vocab)

    @functools.cached_property
    def block_reads(self) -> dict[str, int]:
        """Bytes the decoder blocks' weights, norms and biases take, by the meter's category:
        what `_blocks`' seam calls record one by one in a decode step."""
        reads: Counter[str] = Counter()
        for l in self.weights.layers:
            reads["norms"] += l.attn_norm.nbytes + l.mlp_norm.nbytes
            reads[ATTN] += l.wqkv.nbytes + l.wo.nbytes
            reads[ATTN] += 0 if l.qkv_bias is None else l.qkv_bias.nbytes
            reads[MLP] += l.w_gate_up.nbytes + l.w_down.nbytes
        return dict(reads)

    def _blocks(self, x: np.ndarray, attend: Callable[[np.ndarray, int], np.ndarray]) -> np.ndarray:
        """The decoder blocks on x (T, dim); `attend(qkv, layer)` -> (T, q_dim)."""
        seam = self.seam
        for i, layer in enumerate(self.weights.layers):
            # (T, q_dim + 2 kv_dim)
            qkv = seam.norm_linear(x, layer.attn_norm, layer.wqkv, ATTN, layer.qkv_bias)
            att = attend(qkv, i)  # (T, q_dim)
            x = seam.linear_add(x, layer.wo, att, ATTN)
            gate_up = seam.norm_linear(x, layer.mlp_norm, layer.w_gate_up, MLP)  # (T, 2 hidden)
            x = seam.swiglu_linear_add(x, layer.w_down, gate_up, MLP)
        return x

    def step_batch(self, tokens: np.ndarray, caches: Sequence[KVCache]) -> np.ndarray:
        """One decode step of B sequences at once: tokens[b] continues the sequence held in
        caches[b], each at its own position. Every weight matrix is read once for all B
        (one product of B vectors); attention reads each sequence's own cache.
        tokens (B,) -> logits (B, vocab)"""
        if len(tokens) != len(caches) or not len(caches):
            raise ValueError(f"{len(tokens)} tokens for {len(caches)} caches")
        with np.errstate(invalid="ignore", over="ignore"):
            return self._step_batch(np.asarray(tokens), caches)

    def _step_batch(self, tokens: np.ndarray, caches: Sequence[KVCache]) -> np.ndarray:
        w, seam = self.weights, self.seam
        spans = [c.span(1) for c in caches]
        self.meter.begin("decode", min(c.pos for c in caches), len(caches), len(caches))
        x = seam.embed(w.embed, tokens)  # (B, dim)
        rots = [self.ops.rotary(np.array([c.pos]), self.inv_freq) for c in caches]
        # a few sequences' step runs every block in one call (x in place) where the backend
        # can; a batch of one, the one-sequence step's call (forward's decode_blocks)
        one = len(caches) == 1 and seam.decode_blocks(
            w.layers, self.block_reads, x, caches[0], rots[0], spans[0]
        )
        if not (one or seam.decode_batch(w.layers, self.block_reads, x, caches, rots, spans)):
            x = self._blocks(x, lambda qkv, i: seam.attention_batch(qkv, caches, i, rots, spans))
        for c in caches:
            c.advance(1)
        logits = seam.norm_linear(x, w.norm, w.lm_head, HEAD)  # (B, vocab)
        self.meter.end()
        return logits
