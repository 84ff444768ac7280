"""The model as bench.runner measures it (bench never imports llama_np): fresh sequences
at a KV depth, prefill, decode steps, and what the speed-of-light model needs to know
about how the model is stored."""

from __future__ import annotations

import numpy as np

from bench.meter import Meter
from bench.runner import Variant
from llama_arch import Config, layer_roles
from llama_np.generation.generate import check_logits
from llama_np.model.kvcache import KVCache, check_batch_fits
from llama_np.model.transformer import Transformer, Weights


def weight_plan(w: Weights, c: Config) -> tuple[str | list[dict[str, str]], str, str]:
    """(layers, LM head, embedding) formats of a model: the layers' one format, or, when
    they mix formats (a GGUF file), per layer the format of each matrix by role
    (llama_arch.layer_roles; a mixture of experts: an expert's, every expert of a layer
    stored alike)."""
    plan = []
    for i, layer in enumerate(w.layers):
        roles = layer_roles(c, i)
        inputs = roles[: roles.index("wo")]  # the mixer's input projections, stacked
        first = layer.matrices()[0]
        parts = first.leaves() if len(first.leaves()) == len(inputs) else [first] * len(inputs)
        gate_up, down = layer.w_gate_up, layer.w_down
        if layer.experts is not None:
            gate_up, down = layer.experts.gate_up[0], layer.experts.down[0]
        pair = gate_up.leaves()
        gate, up = pair if len(pair) == 2 else [gate_up] * 2
        ple = () if layer.ple_gate is None else (layer.ple_gate, layer.ple_proj)  # gemma4
        mats = (*parts, layer.wo, gate, up, down, *ple)
        plan.append({role: m.fmt for role, m in zip(roles, mats, strict=True)})
    uniform = {f for p in plan for f in p.values()}
    layers = uniform.pop() if len(uniform) == 1 else plan
    return layers, w.lm_head.fmt, w.embed.fmt


class Decoder:
    """What bench.runner drives (its `Decoder` protocol)."""

    def __init__(self, model: Transformer, kv: str, window: int | None, capacity: int) -> None:
        self.model, self.kv, self.window, self.capacity = model, kv, window, capacity
        self.rng = np.random.default_rng(1)
        self.cache: KVCache | None = None
        self.logits = np.zeros(1, np.float32)  # the last step's (check)
        weights, head, embed = weight_plan(model.weights, model.config)
        self.variant = Variant(weights, head, embed, kv, model.backend.name, model.kernels,
                               model.backend.dot)  # fmt: skip

    @property
    def config(self) -> Config:
        return self.model.config

    @property
    def meter(self) -> Meter:
        return self.model.meter

    def start(self, depth: int) -> None:
        self.cache = None  # free the previous one first: caches can be large
        self.cache = self.model.new_cache(depth + self.capacity, self.window, self.kv)
        self.cache.fill_random(depth, self.rng)

    def prefill(self, tokens: np.ndarray) -> None:
        self.logits = self.model.forward(tokens % self.model.config.vocab_size, self.cache)

    def step(self, token: int) -> None:
        self.logits = self.model.forward(np.array([token % self.model.config.vocab_size]),
                                         self.cache)  # fmt: skip

    def start_batch(self, depth: int, batch: int) -> None:
        """`batch` sequences at `depth`: one cache filled at random, copied to the others
        (refused, before any allocation, when they cannot all fit in memory)."""
        self.cache, self.caches = None, []
        capacity = depth + self.capacity
        check_batch_fits(self.model, batch, capacity, self.window, self.kv)
        first = self.model.new_cache(capacity, self.window, self.kv)
        first.fill_random(depth, self.rng)
        self.caches = [first] + [first.copy() for _ in range(batch - 1)]

    def step_batch(self, tokens: np.ndarray) -> None:
        self.logits = self.model.step_batch(tokens % self.model.config.vocab_size, self.caches)

    def check(self) -> None:
        """The last step's logits, as generation checks them (one line, exit 1)."""
        check_logits(self.logits, "the benchmark's last step")
