"""Glue between the model and `bench`: synthetic models of any shape, and the adapter the
bench runner drives (it never imports this package)."""

from __future__ import annotations

import numpy as np

from bench.meter import Meter
from bench.sol import ROLES, Shape, load_shape
from quant import BlockWeight, Weight
from quant.backends import Backend, numpy_backend
from quant.ggml import LAYOUTS, random_blocks

from .config import Config
from .errors import UsageError
from .kvcache import KVCache
from .loader import build_weights, layer_tensor_names
from .model import Transformer, Weights

SYNTHETIC = "synthetic:"


def config_from_shape(s: Shape) -> Config:
    if s.n_experts > 1:
        raise UsageError(f"{s.name}: synthetic models have no experts")
    arch = "qwen2" if s.qkv_bias else "mistral" if s.window else "llama"
    return Config(
        arch, s.dim, s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.hidden_dim, s.vocab,
        s.max_seq_len, norm_eps=1e-5, rope_theta=10000.0, sliding_window=s.window,
        tie_embeddings=s.tied, qkv_bias=s.qkv_bias,
    )  # fmt: skip


def random_weight(
    shape: tuple[int, int], fmt: str, rng: np.random.Generator, backend: Backend
) -> Weight:
    """A matrix of random values stored directly in `fmt` (no float copy, no quantizing),
    so a model far larger than the caches builds in seconds."""
    rows, cols = shape
    cls = backend.weight_class(fmt)
    if fmt in LAYOUTS:  # GGUF's q5 and K-quant blocks: random codes, sane float16 scales
        return cls.from_blocks(shape, random_blocks(fmt, rows, cols, rng))
    if fmt == "f32":
        return cls((rng.random(shape, dtype=np.float32) - np.float32(0.5)) * np.float32(0.05))
    if issubclass(cls, BlockWeight):
        nb = cols // 32
        codes = rng.integers(0, 256, (rows, nb * cls.code_bytes), dtype=np.uint8)
        scales = (rng.random((rows, nb), dtype=np.float32) * np.float32(1e-3)).astype(np.float16)
        mins = (-8 * scales).astype(np.float16) if cls.has_min else None
        return cls(shape, codes, scales, mins)
    # f16 / bf16: finite patterns of magnitude ~1e-2 with random signs
    high = 0x2000 if fmt == "f16" else 0x3C00
    bits = rng.integers(high, high + 0x0800, shape, dtype=np.uint16)
    bits |= rng.integers(0, 2, shape, dtype=np.uint16) << 15  # random signs
    return cls(bits)


def synthetic_model(
    spec: str, fmt: str | None, head: str | None, backend: Backend | None = None, seed: int = 0
) -> Transformer:
    """`synthetic:CONFIG_OR_PRESET`: random weights of that shape, built in memory."""
    return random_model(load_shape(spec[len(SYNTHETIC) :]), fmt, head, backend, seed)


def random_model(
    shape: Shape, fmt: str | None, head: str | None, backend: Backend | None = None, seed: int = 0
) -> Transformer:
    """A model of `shape` whose matrices hold random values in `fmt` (default f32), laid
    out for `backend` (default: NumPy's)."""
    c = config_from_shape(shape)
    backend = backend or numpy_backend()
    fmt, rng = fmt or "f32", np.random.default_rng(seed)
    tensors: dict[str, Weight | np.ndarray] = {}
    shapes = {
        "wq": (c.q_dim, c.dim), "wk": (c.kv_dim, c.dim), "wv": (c.kv_dim, c.dim),
        "wo": (c.dim, c.q_dim), "w_gate": (c.hidden_dim, c.dim), "w_up": (c.hidden_dim, c.dim),
        "w_down": (c.dim, c.hidden_dim),
    }  # fmt: skip
    vectors = {"bq": c.q_dim, "bk": c.kv_dim, "bv": c.kv_dim}  # biases; else a norm: ones
    for i in range(c.n_layers):
        for attr, name in layer_tensor_names(i, c).items():
            if attr in shapes:
                tensors[name] = random_weight(shapes[attr], fmt, rng, backend)
            elif attr in vectors:
                tensors[name] = rng.standard_normal(vectors[attr], np.float32) * np.float32(0.1)
            else:
                tensors[name] = np.ones(c.dim, np.float32)
    embedding = (c.vocab_size, c.dim)
    tensors["model.embed_tokens.weight"] = random_weight(embedding, head or fmt, rng, backend)
    if not c.tie_embeddings:
        tensors["lm_head.weight"] = random_weight(embedding, head or fmt, rng, backend)
    tensors["model.norm.weight"] = np.ones(c.dim, np.float32)
    model = Transformer(c, build_weights(c, tensors, backend=backend), backend)
    model.name = shape.name
    return model


def formats(w: Weights) -> tuple[str | list[dict[str, str]], str, str]:
    """(layers, LM head, embedding) formats of a model, what the speed-of-light model
    needs: the layers' one format, or, when they mix formats (a GGUF file), per layer the
    format of each matrix (bench.sol.ROLES)."""
    plan = []
    for layer in w.layers:
        q, k, v = layer.wqkv.leaves() if len(layer.wqkv.leaves()) == 3 else [layer.wqkv] * 3
        gate, up = layer.w_gate_up.leaves() if len(layer.w_gate_up.leaves()) == 2 else [
            layer.w_gate_up
        ] * 2  # fmt: skip
        mats = (q, k, v, layer.wo, gate, up, layer.w_down)
        plan.append({role: m.fmt for role, m in zip(ROLES, mats, strict=True)})
    uniform = {f for p in plan for f in p.values()}
    layers = uniform.pop() if len(uniform) == 1 else plan
    return layers, w.lm_head.fmt, w.embed.fmt


def shape_of(c: Config, name: str) -> Shape:
    """The speed-of-light model's view of a loaded config."""
    return Shape(
        name, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.hidden_dim,
        c.vocab_size, c.tie_embeddings, qkv_bias=c.qkv_bias, window=c.sliding_window,
        max_seq_len=c.max_seq_len,
    )  # fmt: skip


class BenchDecoder:
    """What bench.runner drives: fresh sequences at a depth, prefill, decode steps."""

    def __init__(self, model: Transformer, kv: str, window: int | None, capacity: int) -> None:
        self.model, self.kv, self.window, self.capacity = model, kv, window, capacity
        self.rng = np.random.default_rng(1)
        self.cache: KVCache | None = None

    @property
    def meter(self) -> Meter:
        return self.model.meter

    def start(self, depth: int) -> None:
        self.cache = None  # free the previous one first: caches can be large
        self.cache = self.model.new_cache(depth + self.capacity, self.window, self.kv)
        self.cache.fill_random(depth, self.rng)

    def prefill(self, tokens: np.ndarray) -> None:
        self.model.forward(tokens % self.model.config.vocab_size, self.cache)

    def step(self, token: int) -> None:
        self.model.forward(np.array([token % self.model.config.vocab_size]), self.cache)
