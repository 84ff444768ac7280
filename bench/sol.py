"""The speed-of-light model: what one decode token must read and compute, from shapes alone.

    latency_per_token >= max(bytes_read / memory_bandwidth, flops / peak_flops)

Bytes follow DESIGN.md section 2: every matrix a matvec uses in its stored format (scales
included), one row of the embedding, the norm weights, and the KV cache positions the
token attends to. They are computed here from the config and the formats' storage rules
(`quant`), never from a model's arrays: the byte meter counts the arrays, and the tests
hold the two equal. FLOPs are 2 per multiply-add of the active matrices plus attention's
4 * n_heads * head_dim * n_keys per layer. For mixture-of-experts configs only the active
experts' MLP weights are read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quant.backends import get_backend
from quant.kv import kv_store_class

from .meter import CATEGORIES


class ShapeError(ValueError):
    """A config the speed-of-light model cannot read."""


@dataclass(frozen=True)
class Shape:
    """The shapes of a llama-family decoder (llama, mistral, mixtral, qwen2, cohere...)."""

    name: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int  # per expert for mixture-of-experts
    vocab: int
    tied: bool = False
    n_experts: int = 1  # MLP experts per layer
    experts_per_token: int = 1  # how many of them a token uses
    qkv_bias: bool = False  # qwen2-style biases on q, k, v (float32 vectors)
    window: int | None = None
    max_seq_len: int = 4096

    @classmethod
    def from_hf(cls, d: dict[str, Any], name: str = "config") -> Shape:
        def get(key: str, default: Any = ...) -> Any:
            value = d.get(key, default)
            if value is ...:
                raise ShapeError(f"{name}: config has no '{key}'")
            return value

        try:
            dim, heads = int(get("hidden_size")), int(get("num_attention_heads"))
            experts = int(d.get("num_local_experts") or d.get("num_experts") or 1)
            return cls(
                name=name,
                dim=dim,
                n_layers=int(get("num_hidden_layers")),
                n_heads=heads,
                n_kv_heads=int(get("num_key_value_heads", heads) or heads),
                head_dim=int(d.get("head_dim") or dim // heads),
                hidden_dim=int(d.get("moe_intermediate_size") or get("intermediate_size")),
                vocab=int(get("vocab_size")),
                tied=bool(d.get("tie_word_embeddings", d.get("model_type") == "cohere")),
                n_experts=experts,
                experts_per_token=int(d.get("num_experts_per_tok") or 1) if experts > 1 else 1,
                qkv_bias=bool(d.get("attention_bias", d.get("model_type") == "qwen2")),
                window=d.get("sliding_window") if d.get("use_sliding_window", True) else None,
                max_seq_len=int(d.get("max_position_embeddings") or 4096),
            )
        except (TypeError, ValueError) as e:
            raise ShapeError(f"{name}: unreadable config ({e})") from None


def _p(
    name: str, dim: int, layers: int, heads: int, kv: int, hidden: int, vocab: int, **kw: Any
) -> Shape:
    return Shape(name, dim, layers, heads, kv, dim // heads, hidden, vocab, **kw)


# Published configurations (the models' config.json files).
PRESETS: dict[str, Shape] = {
    s.name: s
    for s in [
        _p("llama-7b", 4096, 32, 32, 32, 11008, 32000, max_seq_len=2048),
        _p("llama-13b", 5120, 40, 40, 40, 13824, 32000, max_seq_len=2048),
        _p("llama-33b", 6656, 60, 52, 52, 17920, 32000, max_seq_len=2048),
        _p("llama-65b", 8192, 80, 64, 64, 22016, 32000, max_seq_len=2048),
        _p("llama-2-7b", 4096, 32, 32, 32, 11008, 32000),
        _p("llama-2-13b", 5120, 40, 40, 40, 13824, 32000),
        _p("llama-2-70b", 8192, 80, 64, 8, 28672, 32000),
        _p("llama-3-8b", 4096, 32, 32, 8, 14336, 128256, max_seq_len=8192),
        _p("llama-3-70b", 8192, 80, 64, 8, 28672, 128256, max_seq_len=8192),
        _p("mistral-7b", 4096, 32, 32, 8, 14336, 32000, window=4096, max_seq_len=32768),
        _p(
            "mixtral-8x7b",
            4096,
            32,
            32,
            8,
            14336,
            32000,
            n_experts=8,
            experts_per_token=2,
            max_seq_len=32768,
        ),
        _p("tinyllama-1.1b", 2048, 22, 32, 4, 5632, 32000, max_seq_len=2048),
        _p("smollm2-135m", 576, 30, 9, 3, 1536, 49152, tied=True, max_seq_len=8192),
        _p("smollm2-360m", 960, 32, 15, 5, 2560, 49152, tied=True, max_seq_len=8192),
        _p("smollm2-1.7b", 2048, 24, 32, 32, 8192, 49152, tied=True, max_seq_len=8192),
    ]
}


def load_shape(arg: str) -> Shape:
    """A preset name, a config.json, or a checkpoint directory holding one."""
    key = arg.lower()
    if key in PRESETS:
        return PRESETS[key]
    path = Path(arg)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ShapeError(f"{arg!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ShapeError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(d, dict):
        raise ShapeError(f"{path}: must hold a JSON object")
    return Shape.from_hf(d, name=path.parent.name or str(path))


@dataclass
class Estimate:
    """One decode token at position `pos`: what it reads, writes and computes."""

    shape: Shape
    weights: str
    head: str
    kv: str
    pos: int
    n_keys: int
    params_total: int
    params_active: int
    reads: dict[str, int] = field(default_factory=dict)  # bytes per meter category
    kv_write_bytes: int = 0
    flops: int = 0
    engine: bool = True  # matrices counted as llama-np stores them (else: at rest)
    kernels: str = "numpy"  # the backend whose in-memory layout `engine` counts

    @property
    def weight_bytes(self) -> int:
        return self.bytes_per_token - self.kv_bytes

    @property
    def kv_bytes(self) -> int:
        return self.reads["kv_cache"]

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


def matrix_bytes(
    fmt: str, engine: bool, kernels: str = "numpy"
) -> Callable[[tuple[int, int]], int]:
    """Bytes of a matrix in a format: as llama-np's `kernels` backend holds it in memory
    (`engine`, what its meter counts), or at rest, by the format's definition (bits per
    weight)."""
    cls = get_backend(kernels).weight_class(fmt)
    if engine:
        return cls.nbytes_for
    return lambda shape: int(shape[0] * shape[1] * cls.bits_per_weight) // 8


ROLES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")  # a layer's matrices


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
    shape: Shape,
    weights: str | list[dict[str, str]] = "f32",
    kv: str = "f32",
    pos: int = 0,
    window: int | None = None,
    head: str | None = None,
    engine: bool = True,
    embed: str | None = None,
    kernels: str = "numpy",
) -> Estimate:
    """Bytes and FLOPs of the decode step of the token at `pos` (0-based). `weights`: the
    layers' format, or per layer a format per matrix (ROLES), as a GGUF file mixes them;
    `window` overrides the config's; `head` is the LM head's format (default: `weights`);
    `embed` the embedding's (default: the head's when tied, else `weights`). `engine`:
    count matrices and the KV cache as the `kernels` backend ("numpy" or "numba") lays
    them out in memory; False counts the formats' own sizes."""
    s = shape
    plan = [dict.fromkeys(ROLES, weights)] * s.n_layers if isinstance(weights, str) else weights
    if len(plan) != s.n_layers or (not isinstance(weights, str) and head is None):
        raise ShapeError(f"{s.name}: a per-layer plan needs {s.n_layers} layers and a head")
    head = head or weights
    embed = head if s.tied else (embed or weights)
    h = matrix_bytes(head, engine, kernels)
    store = kv_store_class(kv)
    window = window if window is not None else s.window
    n_keys = pos + 1 if window is None else min(pos + 1, window)
    q_dim, kv_dim = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    dims = {"wq": (q_dim, s.dim), "wk": (kv_dim, s.dim), "wv": (kv_dim, s.dim),
            "wo": (s.dim, q_dim), "w_gate": (s.hidden_dim, s.dim), "w_up": (s.hidden_dim, s.dim),
            "w_down": (s.dim, s.hidden_dim)}  # fmt: skip
    attn = [dims[r] for r in ROLES[:4]]
    expert = [dims[r] for r in ROLES[4:]]
    router = [(s.n_experts, s.dim)] if s.n_experts > 1 else []
    active = s.experts_per_token
    bias = 4 * (q_dim + 2 * kv_dim) if s.qkv_bias else 0

    def layer_bytes(fmts: dict[str, str], roles: tuple[str, ...]) -> int:
        return sum(matrix_bytes(fmts[r], engine, kernels)(dims[r]) for r in roles)

    reads = dict.fromkeys(CATEGORIES, 0)
    reads["attn_weights"] = sum(layer_bytes(f, ROLES[:4]) + bias for f in plan)
    router_bytes = sum(matrix_bytes(f["w_gate"], engine, kernels)(m) for m in router for f in plan)
    reads["mlp_weights"] = sum(active * layer_bytes(f, ROLES[4:]) for f in plan) + router_bytes
    reads["lm_head"] = h((s.vocab, s.dim))
    reads["embedding"] = matrix_bytes(embed, engine, kernels)((1, s.dim))
    reads["norms"] = 4 * s.dim * (2 * s.n_layers + 1)
    slot = store.slot_nbytes(s.n_kv_heads, s.head_dim)
    tiled = engine and get_backend(kernels).tiled_keys  # keys read in whole tiles
    keys = store.read_nbytes(n_keys, s.n_kv_heads, s.head_dim, tiled)
    reads["kv_cache"] = s.n_layers * (keys + n_keys * slot)

    def count(ms: list[tuple[int, int]]) -> int:
        return sum(r * c for r, c in ms)

    layer_matmul = count(attn) + count(router) + active * count(expert)
    norms = s.dim * (2 * s.n_layers + 1)
    biases = s.n_layers * (q_dim + 2 * kv_dim) if s.qkv_bias else 0
    embed = s.vocab * s.dim
    total = (
        s.n_layers * (count(attn) + count(router) + s.n_experts * count(expert)) + norms + biases
    )
    total += embed if s.tied else 2 * embed
    read = s.n_layers * layer_matmul + embed + s.dim + norms + biases
    flops = (
        2 * (s.n_layers * layer_matmul + embed) + s.n_layers * 4 * s.n_heads * s.head_dim * n_keys
    )
    writes = s.n_layers * 2 * slot
    label = weights_label(weights)
    return Estimate(
        s, label, head, kv, pos, n_keys, total, read, reads, writes, flops, engine, kernels
    )


def to_json(e: Estimate, p: Prediction | None) -> dict[str, Any]:
    out = {
        "model": e.shape.name,
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
        "bytes_by_category": dict(e.reads),
        "flops_per_token": e.flops,
    }
    if p is not None:
        out |= {
            "bandwidth_bytes_per_s": p.bandwidth_bytes_per_s,
            "peak_flops": p.peak_flops,
            "predicted_ms_per_token": p.ms_per_token,
            "predicted_tokens_per_s": p.tokens_per_s,
            "bound": p.bound,
        }
    return out
