"""Where the forward pass meets the kernels. Every computation of a forward step goes
through a Seam, which records in the meter the bytes each call reads (the `nbytes` of the
arrays it touches: docs/architecture.md, "Byte accounting") before handing it to the
backend's operations. A Profiled seam times each call into its category, from the
outside: the forward pass itself neither counts nor times."""

from __future__ import annotations

from time import perf_counter

import numpy as np

from bench.meter import ATTN, EMBEDDING, KV, MLP, NORMS, STATE, Meter
from llama_arch import Config
from llama_np.model.kvcache import KVCache, Span
from llama_np.model.ops import NumpyOps, QKNorms, Residual, Rotary
from quant import Matrix, Weight


def nbytes(*vectors: np.ndarray | None) -> int:
    return sum(v.nbytes for v in vectors if v is not None)


class Seam:
    def __init__(self, config: Config, ops: NumpyOps, meter: Meter) -> None:
        self.config, self.ops, self.meter = config, ops, meter
        self.eps = np.float32(config.norm_eps)  # float32, like every activation

    def embed(self, table: Weight, tokens: np.ndarray) -> np.ndarray:
        """The embedding rows of `tokens`, times the family's scale: (T,) -> (T, dim)"""
        self.meter.read(EMBEDDING, len(tokens) * table.row_nbytes)
        x = table.rows(tokens)
        if self.config.embed_scale != 1.0:
            x *= np.float32(self.config.embed_scale)
        return x

    def per_layer_inputs(self, w, tokens: np.ndarray, x: np.ndarray) -> np.ndarray | None:
        """gemma4's per-layer inputs of `tokens` (w: the model's Weights) from one row of
        the per-layer table each and the projection of their embeddings x (T, dim): (T,
        layers, ple_dim); None for a model without."""
        if w.ple_embed is None:
            return None
        self.meter.read(EMBEDDING, len(tokens) * w.ple_embed.row_nbytes + w.ple_proj.nbytes)
        self.meter.read(NORMS, w.ple_norm.nbytes)
        proj = self.ops.norm_linear(x, None, self.eps, w.ple_proj)  # (T, layers * ple_dim)
        rows = w.ple_embed.rows(tokens)
        return self.ops.per_layer_inputs(self.config, rows, proj, w.ple_norm, self.eps)

    def per_layer_add(self, x: np.ndarray, layer, inputs: np.ndarray) -> np.ndarray:
        """gemma4: x + rmsnorm(proj(gelu_tanh(gate(x)) * inputs)), a layer's per-layer
        input (T, ple_dim) gated by the residual stream: the gate's product, then the
        projection's as an MLP's down product with [gate | inputs] as its gate and up."""
        g = self.norm_linear(x, None, layer.ple_gate, MLP)  # (T, ple_dim)
        post = Residual(layer.ple_norm, self.eps)
        return self.gated_linear_add(x, layer.ple_proj, np.concatenate([g, inputs], axis=1),
                                     MLP, post)  # fmt: skip

    def scaled(self, x: np.ndarray, scalar: np.ndarray) -> np.ndarray:
        """x times a layer's scalar (gemma4's layer_scalar, (1,))."""
        self.meter.read(NORMS, scalar.nbytes)
        return x * scalar[0]

    def norm_linear(
        self, x: np.ndarray, norm: np.ndarray | None, w: Matrix, category: str, bias=None
    ) -> np.ndarray:
        """rmsnorm(x) @ W.T (+ bias), x @ W.T where the family has no norm: (T, dim) ->
        (T, rows)"""
        self.meter.read(NORMS, nbytes(norm))
        self.meter.read(category, w.nbytes)
        y = self.ops.norm_linear(x, norm, self.eps, w)
        if bias is not None:
            self.meter.read(category, bias.nbytes)
            y += bias
        return y

    def attention(
        self, qkv: np.ndarray, cache: KVCache, layer: int, rot: Rotary, span: Span, qk: QKNorms
    ) -> np.ndarray:
        """q and k normed, RoPE, the cache append, attention: (T, q_dim + 2 kv_dim) ->
        (T, q_dim)"""
        self.meter.read(NORMS, nbytes(qk.q, qk.k))
        self.meter.read(KV, span.read_nbytes)
        self.meter.write(KV, span.write_nbytes)
        return self.ops.attention(self.config.at(layer), qkv, cache, layer, rot, span, qk)

    def recurrent(self, h: np.ndarray, states: list, mixer) -> np.ndarray:
        """A recurrent mixer on its input projection's rows (T tokens of one sequence, or
        one token of each of B sequences): records its own weights, its norm, and each
        sequence's state read and written whole. (T, in) -> (T, the columns of its wo)"""
        self.meter.read(ATTN, nbytes(*mixer.weights()))
        self.meter.read(NORMS, nbytes(mixer.norm))
        for s in states:
            self.meter.read(STATE, s.nbytes)
            self.meter.write(STATE, s.nbytes)
        return self.ops.recurrent(self.config, h, states, mixer)

    def attention_batch(
        self, qkv: np.ndarray, caches: list[KVCache], layer: int, rots: list[Rotary],
        spans: list[Span], qk: QKNorms,
    ) -> np.ndarray:  # fmt: skip
        """One token of each of B sequences, each attending to its own cache:
        (B, q_dim + 2 kv_dim) -> (B, q_dim)"""
        self.meter.read(NORMS, nbytes(qk.q, qk.k))
        for span in spans:
            self.meter.read(KV, span.read_nbytes)
            self.meter.write(KV, span.write_nbytes)
        c = self.config.at(layer)
        return self.ops.attention_batch(c, qkv, caches, layer, rots, spans, qk)

    def decode_layers(
        self, layers: list, reads: dict[str, int], x: np.ndarray, cache: KVCache,
        rots: list[Rotary], spans: list[Span], ple: np.ndarray | None = None,
    ) -> bool:  # fmt: skip
        """Every decoder block of a decode step in one call on x (1, dim), in place, if the
        operations have it: then records `reads` (the layers' weights, norms and biases by
        category, as the calls one by one record them) and each layer's KV span, and says
        True; False (nothing done) when they do not. rots, spans: per layer; ple (1,
        layers, ple_dim): gemma4's per-layer inputs (per_layer_inputs)."""
        c = self.config
        chosen = np.zeros((len(layers), c.experts_per_token), np.int64)
        done = self.ops.decode_layers(c, layers, x, cache, rots, spans, chosen, ple)
        if done:
            self._layers_read(reads, [spans], [cache])
            for layer, sel in zip(layers, chosen, strict=True) if c.n_experts > 1 else ():
                if layer.experts is not None:
                    self._experts_read(layer.experts, sel)
        return done

    def decode_batch(
        self, layers: list, reads: dict[str, int], x: np.ndarray, caches: list[KVCache],
        rots: list[list[Rotary]], spans: list[list[Span]],
    ) -> bool:  # fmt: skip
        """A batch's decode step through every decoder block in one call on x (B, dim), in
        place, if the operations have it: then records `reads` (the layers' weights, norms
        and biases, read once for all B) and each sequence's KV span in each layer, as
        the calls one by one record them, and says True; False (nothing done) when not.
        rots, spans: per sequence, per layer."""
        done = self.ops.decode_batch(self.config, layers, x, caches, rots, spans)
        if done:
            self._layers_read(reads, spans, caches)
        return done

    def _layers_read(self, reads: dict[str, int], spans: list[list[Span]],
                     caches: list[KVCache]) -> None:  # fmt: skip
        """What the layers run in one call read and wrote: `reads` once, and each
        sequence's KV bytes in every layer (spans: per sequence, per layer) and its
        recurrent states, read and written whole."""
        for category, n in reads.items():
            self.meter.read(category, n)
        every = [span for per_layer in spans for span in per_layer]
        self.meter.read(KV, sum(span.read_nbytes for span in every))
        self.meter.write(KV, sum(span.write_nbytes for span in every))
        states = sum(s.nbytes for cache in caches for s in cache.states if s is not None)
        if states:
            self.meter.read(STATE, states)
            self.meter.write(STATE, states)

    def moe(self, x: np.ndarray, norm: np.ndarray | None, experts, post: Residual) -> np.ndarray:
        """A mixture of experts' MLP: x + scale * post_norm(sum over each token's k experts
        of weight * expert(rmsnorm(x))), the router's choice; records the router and each
        expert read once however many tokens it serves (the step's union), and how many."""
        self.meter.read(NORMS, nbytes(norm, post.norm))
        x, sel = self.ops.moe(self.config, x, norm, self.eps, experts, post)
        self._experts_read(experts, sel)
        return x

    def _experts_read(self, experts, sel: np.ndarray) -> None:
        """A mixture of experts' router, and each expert of the choices `sel` once."""
        used = np.unique(sel)
        read = sum(experts.gate_up[e].nbytes + experts.down[e].nbytes for e in used)
        self.meter.read(MLP, experts.router.nbytes + int(read))
        self.meter.experts(len(used))

    def linear_add(
        self, x: np.ndarray, w: Matrix, inp: np.ndarray, category: str, post: Residual
    ) -> np.ndarray:
        """x + scale * post_norm(inp @ W.T) (the residual stream after a product)"""
        self.meter.read(NORMS, nbytes(post.norm))
        self.meter.read(category, w.nbytes)
        return self.ops.linear_add(x, w, inp, post)

    def gated_linear_add(
        self, x: np.ndarray, w: Matrix, gate_up: np.ndarray, category: str, post: Residual
    ) -> np.ndarray:
        """x + scale * post_norm(act(gate) * up @ W.T) for gate_up = [gate | up] (act:
        SiLU or GELU-tanh, as the family's MLP)"""
        self.meter.read(NORMS, nbytes(post.norm))
        self.meter.read(category, w.nbytes)
        return self.ops.gated_linear_add(x, w, gate_up, self.config.mlp_act, post)


class Profiled(Seam):
    """The same calls, each timed into the meter's category of the bytes it reads (a
    product's fused norm and activation count as the product's time). A decode step's
    layers in one call, of one sequence or of a few, are timed by its phases' own clocks:
    the profile is of the step that runs unprofiled."""

    def decode_layers(self, *args) -> bool:
        """The one-call step where there is one, its time split by its phases' own timers
        (what it spends beyond them, the call's entry and exit, is outside the kernels)."""
        return self._timed(super().decode_layers(*args))

    def decode_batch(self, *args) -> bool:
        """A few sequences' one-call step where there is one, timed as decode_layers."""
        return self._timed(super().decode_batch(*args))

    def _timed(self, done: bool) -> bool:
        """The last one-call step's phases into the meter, when it ran (`done`)."""
        if done:
            for category, seconds in self.ops.step_seconds().items():
                self.meter.spent(category, seconds)
        return done

    def embed(self, table: Weight, tokens: np.ndarray) -> np.ndarray:
        t0 = perf_counter()
        out = super().embed(table, tokens)
        self.meter.lap(EMBEDDING, t0)
        return out

    def norm_linear(
        self, x: np.ndarray, norm: np.ndarray | None, w: Matrix, category: str, bias=None
    ) -> np.ndarray:
        t0 = perf_counter()
        out = super().norm_linear(x, norm, w, category, bias)
        self.meter.lap(category, t0)
        return out

    def attention(
        self, qkv: np.ndarray, cache: KVCache, layer: int, rot: Rotary, span: Span, qk: QKNorms
    ) -> np.ndarray:
        t0 = perf_counter()
        out = super().attention(qkv, cache, layer, rot, span, qk)
        self.meter.lap(KV, t0)
        return out

    def linear_add(
        self, x: np.ndarray, w: Matrix, inp: np.ndarray, category: str, post: Residual
    ) -> np.ndarray:
        t0 = perf_counter()
        out = super().linear_add(x, w, inp, category, post)
        self.meter.lap(category, t0)
        return out

    def gated_linear_add(
        self, x: np.ndarray, w: Matrix, gate_up: np.ndarray, category: str, post: Residual
    ) -> np.ndarray:
        t0 = perf_counter()
        out = super().gated_linear_add(x, w, gate_up, category, post)
        self.meter.lap(category, t0)
        return out

    def moe(self, x: np.ndarray, norm: np.ndarray | None, experts, post: Residual) -> np.ndarray:
        t0 = perf_counter()
        out = super().moe(x, norm, experts, post)
        self.meter.lap(MLP, t0)
        return out

    def recurrent(self, h: np.ndarray, states: list, mixer) -> np.ndarray:
        t0 = perf_counter()
        out = super().recurrent(h, states, mixer)
        self.meter.lap(STATE, t0)
        return out
