"""The speed-of-light model: what one decode token must read and compute, from shapes alone.

    latency_per_token >= max(bytes_read / memory_bandwidth, flops / peak_flops)

Bytes follow docs/architecture.md ("Byte accounting"): every matrix a matvec uses in its
stored format (scales included), one row of the embedding, the norm weights, and the KV
cache positions the token attends to. They are computed here from the config and the
formats' storage rules (`quant`), never from a model's arrays: the byte meter counts the
arrays, and the tests hold the two equal. FLOPs are 2 per multiply-add of the active
matrices plus attention's 4 * n_heads * head_dim * n_keys per layer. For mixture-of-experts
configs only the active experts' MLP weights are read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llama_arch import (
    MIXER_VECTORS,
    MLP_ROLES,
    PLE_ROLES,
    Config,
    ConfigError,
    layer_matrices,
    layer_roles,
    layer_vectors,
    mixer_roles,
    state_floats,
)
from quant.backends import layout_of
from quant.kv import kv_store_class

from .meter import ATTN, CATEGORIES, EMBEDDING, HEAD, KV, MLP, NORMS, STATE


@dataclass
class Estimate:
    """One decode token at position `pos`: what it reads, writes and computes."""

    config: Config
    weights: str
    head: str
    kv: str
    pos: int
    n_keys: int  # keys the token attends to (the most of any layer)
    params_total: int
    params_active: int
    reads: dict[str, int] = field(default_factory=dict)  # bytes per meter category
    kv_write_bytes: int = 0  # the KV appends (attention layers)
    flops: int = 0
    engine: bool = True  # matrices counted as llama-np stores them (else: at rest)
    kernels: str = "numpy"  # the backend whose in-memory layout `engine` counts
    batch: int = 1  # sequences stepped together: one token each, every weight read once
    expert_bytes: int = 0  # a mixture of experts: one expert's MLP in every layer, bytes
    expert_reads: int = 0  # ... and the bytes of the experts counted in `reads`
    state_write_bytes: int = 0  # recurrent layers' states written back (as much as read)

    @property
    def per_sequence_bytes(self) -> int:
        """What each sequence of a batch adds: its KV cache, its recurrent states and its
        embedding row."""
        return self.reads[KV] + self.reads[STATE] + self.reads[EMBEDDING]

    def ridge_batch(self, bandwidth: float, peak_flops: float) -> float:
        """B*, the batch at which the step turns compute-bound: the weights' time
        (read once per step) equals the arithmetic's time, less what every sequence adds
        in bytes. B* = (W / bw) / (F1 / peak - V1 / bw), F1 and V1 per sequence; infinite
        when one sequence's bytes take longer than its arithmetic. A mixture of experts'
        W grows with B (the experts the batch reads, experts_read): B* where the two
        times meet, found by bisection."""
        if self.expert_bytes:
            return self._moe_ridge(bandwidth, peak_flops)
        fixed = (self.bytes_per_token - self.per_sequence_bytes) / bandwidth
        per_seq = self.flops / self.batch / peak_flops
        per_seq -= self.per_sequence_bytes / self.batch / bandwidth
        return fixed / per_seq if per_seq > 0 else float("inf")

    def _moe_ridge(self, bandwidth: float, peak_flops: float) -> float:
        other = self.bytes_per_token - self.per_sequence_bytes - self.expert_reads
        v1, f1 = self.per_sequence_bytes / self.batch, self.flops / self.batch

        def memory_ahead(b: float) -> bool:  # the step at batch b is still memory-bound
            w = other + experts_read(self.config, b) * self.expert_bytes
            return (w + b * v1) / bandwidth > b * f1 / peak_flops

        lo, hi = 0.0, 1.0
        while memory_ahead(hi):
            lo, hi = hi, 2 * hi
            if hi > 1e9:
                return float("inf")
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if memory_ahead(mid) else (lo, mid)
        return hi

    @property
    def weight_bytes(self) -> int:
        return self.bytes_per_token - self.kv_bytes - self.reads[STATE]

    @property
    def kv_bytes(self) -> int:
        return self.reads[KV]

    @property
    def bytes_per_token(self) -> int:
        return sum(self.reads.values())

    def predict(self, bandwidth: float, peak_flops: float | None = None) -> Prediction:
        memory_s = self.bytes_per_token / bandwidth
        compute_s = self.flops / peak_flops if peak_flops else 0.0
        seconds = max(memory_s, compute_s)
        bound = "memory" if memory_s >= compute_s else "compute"
        return Prediction(
            bandwidth,
            peak_flops,
            1e3 * seconds,
            1.0 / seconds,
            bound,
            1e3 * memory_s,
            1e3 * compute_s,
        )


@dataclass
class Prediction:
    bandwidth_bytes_per_s: float
    peak_flops: float | None
    ms_per_token: float
    tokens_per_s: float
    bound: str  # "memory" or "compute": the larger term
    memory_ms: float
    compute_ms: float


# Formats of other engines, which llama-np does not run, at rest, scales included: bits
# per weight (bench/published.py predicts their published measurements).
OTHER_BITS = {
    "fp16": 16.0,  # calm's and others' float16
    "fp8": 8.0,  # calm: e5m2, no scales
    "gf4": 4.0,  # calm: 8 values in 32 bits (3-bit scaled values and an fp8 group scale)
    "int4-g32": 5.0,  # gpt-fast: 4 bits, a bf16 scale and a bf16 zero per group of 32
    "q4f16_1": 4.5,  # MLC: 4 bits, an fp16 scale per group of 32
    "gptq-4bit-g128": 4.15625,  # 4 bits, an fp16 scale and a 4-bit zero per group of 128
}


def other_bytes(fmt: str) -> Callable[[tuple[int, int]], int] | None:
    """Bytes of a (rows, cols) matrix in another engine's format; None if not one: also
    "int8-rowwise" (gpt-fast's int8, a bf16 scale per row) and "exl2-B" (ExLlamaV2, B
    bits per weight on average, as its files are named)."""
    if fmt == "int8-rowwise":
        return lambda shape: shape[0] * shape[1] + 2 * shape[0]
    bits = OTHER_BITS.get(fmt)
    if fmt.startswith("exl2-"):
        bits = float(fmt.removeprefix("exl2-"))
    if bits is None:
        return None
    return lambda shape: round(shape[0] * shape[1] * bits / 8)


def matrix_bytes(
    fmt: str, engine: bool, kernels: str = "numpy"
) -> Callable[[tuple[int, int]], int]:
    """Bytes of a matrix in a format: as llama-np's `kernels` backend holds it in memory
    (`engine`, what its meter counts), or at rest, by the format's definition (bits per
    weight; another engine's format too, OTHER_BITS)."""
    if not engine and (other := other_bytes(fmt)) is not None:
        return other
    cls = layout_of(kernels).weight_class(fmt)
    if engine:
        return cls.nbytes_for
    return lambda shape: int(shape[0] * shape[1] * cls.bits_per_weight) // 8


def weights_label(weights: str | list[dict[str, str]]) -> str:
    """A format, or the formats a per-layer plan mixes, most used first: "q5_0+q8_0+q6_k"."""
    if isinstance(weights, str):
        return weights
    counts: dict[str, int] = {}
    for layer in weights:
        for f in layer.values():
            counts[f] = counts.get(f, 0) + 1
    return "+".join(sorted(counts, key=lambda f: -counts[f]))


def estimate(
    config: Config,
    weights: str | list[dict[str, str]] = "f32",
    kv: str = "f32",
    pos: int = 0,
    window: int | None = None,
    head: str | None = None,
    engine: bool = True,
    embed: str | None = None,
    kernels: str = "numpy",
    batch: int = 1,
    experts: list[float] | None = None,
) -> Estimate:
    """Bytes and FLOPs of the decode step of the token at `pos` (0-based). `weights`: the
    layers' format, or per layer a format per matrix (ROLES), as a GGUF file mixes them;
    `window` overrides the config's; `head` is the LM head's format (default: `weights`);
    `embed` the embedding's (default: the head's when tied, else `weights`). `engine`:
    count matrices and the KV cache as the `kernels` backend ("numpy" or "numba") lays
    them out in memory; False counts the formats' own sizes. `batch`: one decode step of
    that many sequences, all at `pos`: weights and norms read once, an embedding row and
    the KV cache per sequence, B times the FLOPs. `experts`: a mixture of experts' distinct
    experts per layer as a step read them (the meter's count), for the expected number."""
    s = config
    if isinstance(weights, str):
        plan = [dict.fromkeys(layer_roles(s, i), weights) for i in range(s.n_layers)]
    else:
        plan = weights
    if len(plan) != s.n_layers or (not isinstance(weights, str) and head is None):
        raise ConfigError(f"{s.name}: a per-layer plan needs {s.n_layers} layers and a head")
    head = head or weights  # type: ignore[assignment]
    embed = head if s.tie_embeddings else (embed or weights)  # type: ignore[assignment]
    # keys each attention layer attends: pos + 1, or its window's (a model's own windows
    # are per layer: gemma's sliding and global layers; `window` puts one on every layer)
    layer_keys = {i: pos + 1 if (w := s.layer_window(i, window)) is None else min(pos + 1, w)
                  for i in s.attention_layers}  # fmt: skip
    nbytes = lambda f: matrix_bytes(f, engine, kernels)  # noqa: E731
    reads, expert_bytes, expert_reads = _weight_reads(s, plan, head, embed, nbytes, batch, experts)
    if s.ple_dim:  # gemma4: a row of the per-layer table a sequence, its projection
        width = s.n_layers * s.ple_dim
        proj = nbytes(weights if isinstance(weights, str) else embed)((width, s.dim))
        reads[EMBEDDING] += batch * nbytes(embed)((1, width)) + proj
    store = kv_store_class(kv)
    slot = {i: store.slot_nbytes(s.n_kv_heads, s.layer_head_dim(i)) for i in layer_keys}
    tiled = engine and layout_of(kernels).tiled_keys  # keys read in whole tiles
    # every attention layer reads its keys (a shared one its source's); those with their own
    # write the new ones
    reads[KV] = batch * sum(store.read_nbytes(n, s.n_kv_heads, s.layer_head_dim(i), tiled)
                            + n * slot[i] for i, n in layer_keys.items())  # fmt: skip
    state = batch * sum(4 * state_floats(s, i) for i in range(s.n_layers))
    reads[STATE] = state
    total, read, matmul = _parameters(s)
    flops = 2 * matmul + sum(4 * s.n_heads * s.layer_head_dim(i) * n
                             for i, n in layer_keys.items())  # fmt: skip
    flops = batch * (flops + recurrent_flops(s))
    writes = batch * sum(2 * slot[i] for i in layer_keys if s.kv_source(i) == i)
    label = weights_label(weights)
    return Estimate(s, label, head, kv, pos, max(layer_keys.values(), default=0), total, read,
                    reads,
                    writes, flops, engine, kernels, batch, expert_bytes, expert_reads,
                    state)  # fmt: skip


def recurrent_flops(s: Config) -> int:
    """A token's arithmetic in the recurrent layers beyond their products: a delta net's
    convolution and, per value head, the decay, the state's product with k, its rank-1
    update and its product with q (about 7 k_dim v_dim); a short convolution's."""
    out = 0
    for i in range(s.n_layers):
        if s.mixer(i) == "delta":
            d = s.delta
            out += 2 * d.kernel * d.conv_dim + 7 * d.state_floats
        elif s.mixer(i) == "conv":
            out += 2 * s.conv_kernel * s.dim + 2 * s.dim
    return out


def norm_floats(s: Config) -> int:
    """Float32 norm weights a token reads: each layer's (before and after the mixer and
    the MLP, of q and k, a delta net's output norm, as the family has them) and the final
    norm."""
    return s.dim + s.ple_dim + sum(
        n for i in range(s.n_layers) for role, n in layer_vectors(s, i).items()
        if not role.startswith("b") and role not in MIXER_VECTORS)  # fmt: skip


def mixer_floats(s: Config) -> int:
    """Float32 weights of the recurrent mixers a token reads beside their matrices: the
    convolutions' and a delta net's dt_bias and decay rates."""
    return sum(n for i in range(s.n_layers) for role, n in layer_vectors(s, i).items()
               if role in MIXER_VECTORS)  # fmt: skip


def _weight_reads(
    s: Config, plan: list[dict[str, str]], head: str, embed: str,
    nbytes: Callable[[str], Callable[[tuple[int, int]], int]], batch: int = 1,
    experts: list[float] | None = None,
) -> tuple[dict[str, int], int, int]:  # fmt: skip
    """Bytes per meter category of everything but the KV cache, for a step of `batch`
    sequences: every matrix of every layer (of a mixture of experts: the router, float32
    as llama.cpp keeps it, and the experts the batch's tokens use, expected or `experts`
    counted per layer), the LM head, an embedding row per sequence, norms; and of a
    mixture of experts, one expert's bytes in all layers and those of the experts counted."""
    bias = 4 * (s.q_dim + 2 * s.kv_dim) if s.qkv_bias else 0

    def layer_bytes(i: int, roles: tuple[str, ...]) -> int:
        dims, fmts = layer_matrices(s, i), plan[i]
        return sum(nbytes(fmts[r])(dims[r]) for r in roles if r in dims)

    router = s.n_layers * nbytes("f32")((s.n_experts, s.dim)) if s.n_experts > 1 else 0
    reads = dict.fromkeys(CATEGORIES, 0)
    mixers = [mixer_roles(s, i) for i in range(s.n_layers)]
    reads[ATTN] = sum(layer_bytes(i, r) for i, r in enumerate(mixers))
    reads[ATTN] += bias * len(s.attention_layers) + 4 * mixer_floats(s)
    used = experts or [experts_read(s, batch)] * s.n_layers
    if len(used) != s.n_layers:
        raise ConfigError(f"{s.name}: experts counted for {len(used)} of {s.n_layers} layers")
    mlp = round(sum(n * layer_bytes(i, MLP_ROLES) for i, n in enumerate(used)))
    reads[MLP] = mlp + router + sum(layer_bytes(i, PLE_ROLES) for i in range(s.n_layers))
    reads[HEAD] = nbytes(head)((s.vocab_size, s.dim))
    reads[EMBEDDING] = batch * nbytes(embed)((1, s.dim))
    reads[NORMS] = 4 * norm_floats(s)
    if s.n_experts <= 1:
        return reads, 0, 0
    return reads, sum(layer_bytes(i, MLP_ROLES) for i in range(s.n_layers)), mlp


def experts_read(s: Config, batch: int) -> float:
    """Expected distinct experts a layer reads when `batch` tokens each route to
    experts_per_token of n_experts (uniformly: a property of the router, assumed):
    n (1 - (1 - k / n)^B). Batching a mixture of experts first adds bytes, not reuse."""
    if s.n_experts <= 1:
        return float(s.experts_per_token)
    n, k = s.n_experts, s.experts_per_token
    return n * (1 - (1 - k / n) ** batch)


def _parameters(s: Config) -> tuple[int, int, int]:
    """(parameters in all, parameters a token reads, weights its products multiply)."""

    def count(i: int, roles: tuple[str, ...]) -> int:
        dims = layer_matrices(s, i)
        return sum(dims[r][0] * dims[r][1] for r in roles)

    router = s.n_experts * s.dim if s.n_experts > 1 else 0
    mixer = sum(count(i, mixer_roles(s, i)) for i in range(s.n_layers))
    mlp = sum(count(i, MLP_ROLES) for i in range(s.n_layers))
    qkv_bias = len(s.attention_layers) * (s.q_dim + 2 * s.kv_dim) if s.qkv_bias else 0
    vectors = norm_floats(s) + mixer_floats(s) + qkv_bias
    table = s.vocab_size * s.dim
    # gemma4's per-layer inputs: each layer's gate and projection and the embedding's
    # projection, multiplied; the per-layer table, of which a token reads one row
    width = s.n_layers * s.ple_dim
    ple = sum(count(i, PLE_ROLES) for i in range(s.n_layers) if s.ple_dim) + width * s.dim
    layers = mixer + s.n_layers * router + ple
    total = layers + s.n_experts * mlp + vectors + (table if s.tie_embeddings else 2 * table)
    total += s.vocab_size * width
    matmul = layers + s.experts_per_token * mlp
    return total, matmul + table + s.dim + width + vectors, matmul + table


def to_json(e: Estimate, p: Prediction | None) -> dict[str, Any]:
    out = {
        "model": e.config.name,
        "weights": e.weights,
        "head": e.head,
        "kv": e.kv,
        "layout": f"llama-np in memory ({e.kernels} kernels)" if e.engine else "format at rest",
        "pos": e.pos,
        "n_keys": e.n_keys,
        "params_total": e.params_total,
        "params_active": e.params_active,
        "weight_bytes_per_token": e.weight_bytes,
        "kv_bytes_per_token": e.kv_bytes,
        "bytes_per_token": e.bytes_per_token,
        "kv_write_bytes_per_token": e.kv_write_bytes,
        "state_bytes_per_token": e.reads[STATE],
        "state_write_bytes_per_token": e.state_write_bytes,
        "bytes_by_category": dict(e.reads),
        "flops_per_token": e.flops,
        "batch": e.batch,
        "bytes_per_step": e.bytes_per_token,
        "flops_per_step": e.flops,
    }
    if p is not None:
        out |= {
            "bandwidth_bytes_per_s": p.bandwidth_bytes_per_s,
            "peak_flops": p.peak_flops,
            "predicted_ms_per_token": p.ms_per_token,
            "predicted_tokens_per_s": p.tokens_per_s,
            "bound": p.bound,
        }
        if p.peak_flops:
            out["ridge_batch"] = e.ridge_batch(p.bandwidth_bytes_per_s, p.peak_flops)
    return out


# --- a prompt: N tokens processed together --------------------------------------------


def keys_attended(pos: int, n: int, window: int | None) -> int:
    """Keys the queries of tokens pos..pos+n-1 attend to, summed: each token at t the
    min(t + 1, window) causal keys before and at it (the arithmetic the math needs, not
    the masked rectangle some kernels compute)."""
    lo, hi = pos + 1, pos + n  # the first and the last query's keys
    if window is None or hi <= window:
        return (lo + hi) * n // 2
    growing = max(0, window - lo + 1)  # queries whose window is not yet full
    return (2 * lo + growing - 1) * growing // 2 + window * (n - growing)


@dataclass
class Prefill:
    """A prompt of `n` tokens with `pos` already in the cache: what its forward pass reads
    once, writes and computes."""

    config: Config
    weights: str
    head: str
    kv: str
    pos: int
    n: int
    reads: dict[str, int]  # bytes per meter category: weights once, the KV touched
    kv_write_bytes: int  # the n tokens' keys and values (attention layers that own a cache)
    state_write_bytes: int  # recurrent layers' states written back once
    flops: int
    engine: bool = True
    kernels: str = "numpy"
    attention_flops: int = 0  # of `flops`: attention's scores and weighted sums
    scores: int = 0  # attention's score-matrix entries: query heads x keys attended, summed

    @property
    def bytes(self) -> int:
        return sum(self.reads.values())

    def predict(self, bandwidth: float, peak_flops: float | None) -> PrefillPrediction:
        """The bound: max(bytes / bandwidth, FLOPs / the matrix peak), for all n tokens."""
        memory_s = self.bytes / bandwidth
        compute_s = self.flops / peak_flops if peak_flops else 0.0
        seconds = max(memory_s, compute_s)
        bound = "memory" if memory_s >= compute_s else "compute"
        return PrefillPrediction(bandwidth, peak_flops, 1e3 * seconds, self.n / seconds, bound,
                                 1e3 * memory_s, 1e3 * compute_s)  # fmt: skip


@dataclass
class PrefillPrediction:
    bandwidth_bytes_per_s: float
    peak_flops: float | None
    ms: float  # the whole prompt
    tokens_per_s: float
    bound: str  # "memory" or "compute": the larger term
    memory_ms: float
    compute_ms: float


def prefill(
    config: Config,
    n: int,
    weights: str | list[dict[str, str]] = "f32",
    kv: str = "f32",
    pos: int = 0,
    window: int | None = None,
    head: str | None = None,
    engine: bool = True,
    embed: str | None = None,
    kernels: str = "numpy",
) -> Prefill:
    """Bytes and FLOPs of the forward pass of `n` prompt tokens at positions pos..pos+n-1,
    arguments as `estimate`'s. Read once: every matrix (a mixture of experts: the experts
    the n tokens use, expected under uniform routing), n embedding rows, the norms, each
    attention layer's keys and values touched (those in the cache that a window still
    reaches, and the n new ones), each recurrent state. FLOPs: 2 per weight a token
    multiplies, times n; attention's 4 n_heads head_dim per key attended (keys_attended);
    the LM head for the last token alone, as llama-bench and servers ask logits. `scores`:
    the score matrix's entries, n_heads per key attended (what an engine without flash
    attention writes out and reads back)."""
    if n < 1:
        raise ConfigError(f"a prompt has at least one token (got {n})")
    s = config
    e = estimate(s, weights, kv, pos, window, head, engine, embed, kernels, batch=n)
    store = kv_store_class(kv)
    tiled = engine and layout_of(kernels).tiled_keys
    reads, kv_read, kv_write, attention, scores = dict(e.reads), 0, 0, 0, 0
    for i in s.attention_layers:
        w, hd = s.layer_window(i, window), s.layer_head_dim(i)
        slot = store.slot_nbytes(s.n_kv_heads, hd)
        touched = pos + n if w is None else min(pos + n, n + w - 1)
        kv_read += store.read_nbytes(touched, s.n_kv_heads, hd, tiled) + touched * slot
        kv_write += 2 * n * slot if s.kv_source(i) == i else 0
        keys = keys_attended(pos, n, w)
        attention += 4 * s.n_heads * hd * keys
        scores += s.n_heads * keys
    reads[KV] = kv_read
    reads[STATE] = sum(4 * state_floats(s, i) for i in range(s.n_layers))
    _, _, matmul = _parameters(s)  # the layers' products and the LM head's
    head_weights = s.vocab_size * s.dim
    flops = 2 * n * (matmul - head_weights) + 2 * head_weights + attention
    flops += n * recurrent_flops(s)
    return Prefill(s, e.weights, e.head, kv, pos, n, reads, kv_write, reads[STATE], flops,
                   engine, kernels, attention, scores)  # fmt: skip


def prefill_json(p: Prefill, pred: PrefillPrediction | None) -> dict[str, Any]:
    out = {
        "model": p.config.name,
        "weights": p.weights,
        "head": p.head,
        "kv": p.kv,
        "layout": f"llama-np in memory ({p.kernels} kernels)" if p.engine else "format at rest",
        "pos": p.pos,
        "prompt_tokens": p.n,
        "bytes": p.bytes,
        "weight_bytes": p.bytes - p.reads[KV] - p.reads[STATE],
        "kv_read_bytes": p.reads[KV],
        "kv_write_bytes": p.kv_write_bytes,
        "state_bytes": p.reads[STATE],
        "bytes_by_category": dict(p.reads),
        "flops": p.flops,
        "attention_flops": p.attention_flops,
        "flops_per_byte": p.flops / p.bytes,
    }
    if pred is not None:
        out |= {
            "bandwidth_bytes_per_s": pred.bandwidth_bytes_per_s,
            "peak_flops": pred.peak_flops,
            "memory_ms": pred.memory_ms,
            "compute_ms": pred.compute_ms,
            "predicted_prefill_ms": pred.ms,
            "predicted_prefill_tok_s": pred.tokens_per_s,
            "bound": pred.bound,
        }
    return out
