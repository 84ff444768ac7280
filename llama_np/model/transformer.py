"""The forward pass: embedding, N decoder layers, final norm, LM head.

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

from bench.meter import ATTN, HEAD, MLP, NORMS, Meter
from llama_arch import Config
from llama_np.model.kvcache import KVCache
from llama_np.model.ops import NumpyOps, QKNorms, Residual, Rotary, rope_inv_freq, rope_scale
from llama_np.model.seam import Profiled, Seam
from quant import Matrix
from quant.backends import Backend, Running, numpy_backend


def ops_for(backend: Backend) -> NumpyOps:
    """The block's operations for a kernel backend: the NumPy reference, or the fused
    decode operations of a backend that has them."""
    if backend.fused:
        from llama_np.model.ops_compiled import CompiledOps

        return CompiledOps(backend.dot)
    return NumpyOps()


@dataclass
class Experts:
    """A mixture of experts' MLP: a router and n_experts SwiGLU MLPs."""

    router: Matrix  # (n_experts, dim): float32, as llama.cpp keeps it
    gate_up: list[Matrix]  # (n_experts,) of (2 * hidden_dim, dim): each expert's gate, up
    down: list[Matrix]  # (n_experts,) of (dim, hidden_dim)

    def matrices(self) -> list[Matrix]:
        return [self.router, *self.gate_up, *self.down]


@dataclass
class DeltaMixer:
    """A gated delta net (Qwen3.5's linear attention) in place of attention: its input
    projections stacked into one matrix, the convolution over q, k and v, and the
    recurrence's own vectors (llama_np.model.recurrent)."""

    kind = "delta"  # (Config.mixer)
    w_in: Matrix  # (conv_dim + value_dim + 2 v_heads, dim): q, k, v | z | b | a
    conv: np.ndarray  # (kernel, conv_dim): tap kernel - 1 multiplies the newest input
    dt_bias: np.ndarray  # (v_heads,)
    a: np.ndarray  # (v_heads,): -exp(A_log), the decay rates
    norm: np.ndarray  # (v_dim,): the output's RMSNorm, gated by silu(z)

    def weights(self) -> list[np.ndarray]:
        """The vectors read as the mixer's weights (not norms)."""
        return [self.conv, self.dt_bias, self.a]


@dataclass
class ConvMixer:
    """A short convolution (LFM2's conv layers) in place of attention: out_proj(C *
    conv(B * x)) with B, C, x the rows of one input projection."""

    kind = "conv"  # (Config.mixer)
    norm = None  # no norm of its own
    w_in: Matrix  # (3 dim, dim): B, C, x
    conv: np.ndarray  # (kernel, dim)

    def weights(self) -> list[np.ndarray]:
        return [self.conv]


@dataclass
class Layer:
    """One decoder block: a token mixer, then an MLP. Matrices that read the same input
    are stacked by rows, so each is one kernel call: wqkv holds q, k, v (and qwen3_5's
    gates, last); w_gate_up holds gate, up. A recurrent mixer (`mixer`) replaces wqkv
    with its own input projection; every mixer ends in `wo`. The vectors a family does
    not have are None."""

    wqkv: Matrix | None  # (n_heads * head_dim + 2 * n_kv_heads * head_dim [+ q_dim], dim)
    wo: Matrix  # (dim, n_heads * head_dim): the mixer's output product
    w_gate_up: Matrix | None  # (2 * hidden_dim, dim); None: experts instead
    w_down: Matrix | None  # (dim, hidden_dim)
    attn_norm: np.ndarray | None = None  # (dim,): before attention (all but olmo2)
    mlp_norm: np.ndarray | None = None  # (dim,): before the MLP
    attn_post_norm: np.ndarray | None = None  # (dim,): on attention's output (gemma, olmo2)
    mlp_post_norm: np.ndarray | None = None  # (dim,): on the MLP's output
    q_norm: np.ndarray | None = None  # (head_dim,) or (q_dim,): q before RoPE
    k_norm: np.ndarray | None = None  # (head_dim,) or (kv_dim,): k before RoPE
    qkv_bias: np.ndarray | None = None  # (rows of wqkv,): qwen2's q, k, v biases
    experts: Experts | None = None  # a mixture of experts' MLP, instead of w_gate_up, w_down
    mixer: DeltaMixer | ConvMixer | None = None  # a recurrent mixer; None: attention
    ple_gate: Matrix | None = None  # (ple_dim, dim): gemma4's per-layer input gate
    ple_proj: Matrix | None = None  # (dim, ple_dim): ... projected back to the stream
    ple_norm: np.ndarray | None = None  # (dim,): ... normed before it is added
    layer_scalar: np.ndarray | None = None  # (1,): gemma4: the block's output times this

    def matrices(self) -> list[Matrix]:
        """Every matrix of the block."""
        first = self.wqkv if self.mixer is None else self.mixer.w_in
        ple = [] if self.ple_gate is None else [self.ple_gate, self.ple_proj]
        if self.experts is not None:
            return [first, self.wo, *self.experts.matrices(), *ple]
        return [first, self.wo, self.w_gate_up, self.w_down, *ple]

    def vectors(self) -> list[np.ndarray]:
        """The norm weights it has (and gemma4's layer scalar)."""
        own = None if self.mixer is None else self.mixer.norm  # a delta net's output norm
        norms = (self.attn_norm, self.mlp_norm, self.attn_post_norm, self.mlp_post_norm,
                 self.q_norm, self.k_norm, own, self.ple_norm, self.layer_scalar)  # fmt: skip
        return [v for v in norms if v is not None]

    def mixer_weights(self) -> list[np.ndarray]:
        """A recurrent mixer's own float32 weights (its convolution, decay), read each step."""
        return [] if self.mixer is None else self.mixer.weights()


@dataclass
class Weights:
    embed: Matrix  # (vocab_size, dim)
    layers: list[Layer]  # (n_layers,)
    norm: np.ndarray  # (dim,)
    lm_head: Matrix  # (vocab_size, dim); the very same object as `embed` when tied
    # gemma4's per-layer embeddings: the table, read by rows as `embed` is, the projection
    # of the embedding beside it and its norm (per_layer_inputs); None without
    ple_embed: Matrix | None = None  # (vocab_size, n_layers * ple_dim)
    ple_proj: Matrix | None = None  # (n_layers * ple_dim, dim)
    ple_norm: np.ndarray | None = None  # (ple_dim,)

    def matrices(self) -> list[Matrix]:
        """Every distinct matrix once (a tied embedding is one matrix)."""
        seen: dict[int, Matrix] = {}
        ple = [] if self.ple_embed is None else [self.ple_embed, self.ple_proj]
        for w in [self.embed, self.lm_head, *ple] + [m for l in self.layers for m in l.matrices()]:
            seen.setdefault(id(w), w)
        return list(seen.values())

    @property
    def nbytes(self) -> int:
        vectors = [self.norm, self.ple_norm] + [
            v for l in self.layers for v in [*l.vectors(), *l.mixer_weights(), l.qkv_bias]
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
        self._freqs: dict[tuple[str, bool], np.ndarray] = {}  # RoPE's, by kind (_inv_freq)
        self.ops = ops_for(self.backend)
        self._seam = Seam(self.config, self.ops, self.meter)
        self._profiled = Profiled(self.config, self.ops, self.meter)
        self.running = Running("one thread")
        self._warm: set = set()  # what warm_up has run: KV formats, (KV format, batch)

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
        """A cache for one sequence. `window`: a sliding window on every layer (None: the
        model's own)."""
        return KVCache(self.config, capacity or self.config.max_seq_len, window, kv, self.backend)

    def warm_up(self, kv: str = "f32", batches: Sequence[int] = (),
                progress: Callable | None = None) -> None:  # fmt: skip
        """Run what a generation runs once on scratch caches, so that the compiled backend
        compiles (or loads from its disk cache) every kernel it calls before anything is
        timed: a prompt past the few-vector products, a short one and a decode step on a
        cache of format `kv`, and a step of each of `batches` sequences. The meter's counts
        stay as they were; what was warmed once is not run again. `progress(stage)` is
        told each stage as it begins."""
        if not self.backend.fused:
            return
        from quant.compiled.weights import SPLIT

        progress = progress or (lambda stage: None)
        m = self.meter
        saved = m.last, m.decode_steps, m.decode_bytes_read
        if kv not in self._warm:
            n = SPLIT + 2
            progress("a prompt")
            self.forward(np.zeros(n, np.int64), cache := self.new_cache(n + 3, kv=kv))
            self.forward(np.zeros(2, np.int64), cache)
            progress("a decode step")
            self.forward(np.zeros(1, np.int64), cache)
            self._warm.add(kv)
        for b in sorted(set(batches) - {1}):
            if (kv, b) not in self._warm:
                progress(f"a step of {b}")
                self.step_batch(np.zeros(b, np.int64), [self.new_cache(2, kv=kv) for _ in range(b)])
                self._warm.add((kv, b))
        m.last, m.decode_steps, m.decode_bytes_read = saved

    WARM_UP_STAGES = 2  # stages warm_up reports for one sequence

    def weights_changed(self) -> None:
        """Say that matrices of `weights` were replaced in place: what was made from them
        once (the one-call step's tables of operands, the layers' bytes) is made again."""
        self.ops.forget()
        self.__dict__.pop("layer_reads", None)

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
        spans = cache.spans(t)  # per layer: where the new positions go, what they attend to
        self.meter.begin("decode" if t == 1 else "prefill", p0, t)
        x = seam.embed(w.embed, tokens)  # (T, dim)
        ple = seam.per_layer_inputs(w, tokens, x)  # (T, layers, ple_dim) or None
        rots = self.rotaries(np.arange(p0, p0 + t), cache)  # per layer
        # a decode step runs every block in one call (x in place) where the backend can
        if not (t == 1 and seam.decode_layers(w.layers, self.layer_reads, x, cache, rots, spans,
                                              ple)):  # fmt: skip
            x = self._layers(x, lambda qkv, i, qk: seam.attention(qkv, cache, i, rots[i], spans[i],
                                                                  qk),
                             lambda i: [cache.states[i]], ple)  # fmt: skip
        cache.advance(t)
        logits = self._head(x if all_logits else x[-1:])
        self.meter.end()
        return logits if all_logits else logits[-1]  # (T or 1, vocab)

    def _head(self, x: np.ndarray) -> np.ndarray:
        """The final norm, the LM head and the family's ending: (T, dim) -> (T, vocab)"""
        logits = self.seam.norm_linear(x, self.weights.norm, self.weights.lm_head, HEAD)
        return self.ops.head_epilogue(logits, self.config)

    def rotaries(self, positions: np.ndarray, cache: KVCache) -> list[Rotary]:
        """RoPE at `positions` for every layer (one Rotary per kind of layer: global,
        gemma3's local, NoPE; longrope's long factors when the cache's context passes the
        original one, as llama.cpp decides)."""
        c = self.config
        r = c.rope_scaling
        long = r is not None and r.kind == "longrope" and (
            cache.capacity > r.original_max_position_embeddings)  # fmt: skip
        kinds: dict[str, Rotary] = {}
        out = []
        for i in range(c.n_layers):
            kind = c.layer_rope(i)
            if kind not in kinds:  # (a kind's layers share a head_dim: gemma4's full ones)
                freq = self._inv_freq(kind, long, i)
                kinds[kind] = self.ops.rotary(positions, freq, c.at(i).head_dim,
                                              rope_scale(c, kind))  # fmt: skip
            out.append(kinds[kind])
        return out

    def _inv_freq(self, kind: str, long: bool, layer: int) -> np.ndarray:
        """rope_inv_freq of `layer`'s kind, once per kind for this model (a per-model dict:
        functools.cache on a method would keep every model alive)."""
        key = (kind, long)
        if key not in self._freqs:
            self._freqs[key] = rope_inv_freq(self.config.at(layer), kind, long)
        return self._freqs[key]

    @functools.cached_property
    def layer_reads(self) -> dict[str, int]:
        """Bytes the decoder layers' weights, norms and biases take, by the meter's category:
        what `_layers`' seam calls record one by one in a decode step."""
        reads: Counter[str] = Counter()
        for l in self.weights.layers:
            reads[NORMS] += sum(v.nbytes for v in l.vectors())
            reads[ATTN] += l.matrices()[0].nbytes + l.wo.nbytes
            reads[ATTN] += sum(v.nbytes for v in l.mixer_weights())
            reads[ATTN] += 0 if l.qkv_bias is None else l.qkv_bias.nbytes
            if l.experts is None:  # (experts: recorded per step, by its choices: _experts_read)
                reads[MLP] += l.w_gate_up.nbytes + l.w_down.nbytes
            if l.ple_gate is not None:  # gemma4's per-layer input (per_layer_add)
                reads[MLP] += l.ple_gate.nbytes + l.ple_proj.nbytes
        return dict(reads)

    def _layers(self, x: np.ndarray, attend: Callable, states: Callable,
                ple: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        """The decoder layers on x (T, dim); `attend(qkv, layer, qk_norms)` -> (T, q_dim);
        `states(layer)`: the recurrent states a recurrent layer carries on (one for a
        prompt, one per row for a batch's step); `ple` (T, layers, ple_dim): gemma4's
        per-layer inputs."""
        c, seam = self.config, self.seam
        eps, scale = c.norm_eps, c.residual_scale
        for i, layer in enumerate(self.weights.layers):
            if layer.mixer is not None:  # a gated delta net or a short convolution
                h = seam.norm_linear(x, layer.attn_norm, layer.mixer.w_in, ATTN)  # (T, in)
                mixed = seam.recurrent(h, states(i), layer.mixer)  # (T, wo's columns)
            else:  # (T, q_dim + 2 kv_dim)
                qkv = seam.norm_linear(x, layer.attn_norm, layer.wqkv, ATTN, layer.qkv_bias)
                gate = None
                if c.attn_gate:  # qwen3_5: each head's q followed by its gate
                    qkv, gate = self.ops.split_gate(c, qkv)
                if c.v_norm and c.kv_source(i) == i:  # gemma4 (a shared layer: no v)
                    qkv = self.ops.norm_values(c.at(i), qkv, eps)
                mixed = attend(qkv, i, QKNorms(layer.q_norm, layer.k_norm, eps))  # (T, q_dim)
                if gate is not None:
                    mixed = self.ops.sigmoid_gate(mixed, gate)
            post = Residual(layer.attn_post_norm, eps, scale)
            x = seam.linear_add(x, layer.wo, mixed, ATTN, post)
            post = Residual(layer.mlp_post_norm, eps, scale)
            if layer.experts is not None:  # each token through the k experts it is routed to
                x = seam.moe(x, layer.mlp_norm, layer.experts, post)
                continue
            gate_up = seam.norm_linear(x, layer.mlp_norm, layer.w_gate_up, MLP)  # (T, 2 hidden)
            x = seam.gated_linear_add(x, layer.w_down, gate_up, MLP, post)
            if ple is not None:  # gemma4: the layer's per-layer input
                x = seam.per_layer_add(x, layer, ple[:, i])
            if layer.layer_scalar is not None:  # gemma4: the layer's output scaled
                x = seam.scaled(x, layer.layer_scalar)
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
        spans = [c.spans(1) for c in caches]  # per sequence, per layer
        self.meter.begin("decode", min(c.pos for c in caches), len(caches), len(caches))
        x = seam.embed(w.embed, tokens)  # (B, dim)
        ple = seam.per_layer_inputs(w, tokens, x)  # (B, layers, ple_dim) or None
        rots = [self.rotaries(np.array([c.pos]), c) for c in caches]  # per sequence, per layer
        # a few sequences' step runs every block in one call (x in place) where the backend
        # can; a batch of one, the one-sequence step's call (forward's decode_layers)
        one = len(caches) == 1 and seam.decode_layers(
            w.layers, self.layer_reads, x, caches[0], rots[0], spans[0], ple
        )
        if not (one or seam.decode_batch(w.layers, self.layer_reads, x, caches, rots, spans)):
            x = self._layers(x, lambda qkv, i, qk: seam.attention_batch(
                qkv, caches, i, [r[i] for r in rots], [s[i] for s in spans], qk),
                lambda i: [c.states[i] for c in caches], ple)  # fmt: skip
        for c in caches:
            c.advance(1)
        logits = self._head(x)  # (B, vocab)
        self.meter.end()
        return logits
