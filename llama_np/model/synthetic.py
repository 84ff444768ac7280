"""Synthetic models: random weights of any shape (a preset or a config.json), built in
memory directly in the asked format, for measuring models nobody has to download."""

from __future__ import annotations

import numpy as np

from llama_arch import Config, load_config
from llama_np.model.build import (
    PLE_NAMES,
    Tensor,
    build_weights,
    final_norm_name,
    layer_shapes,
    layer_tensor_names,
    ple_shapes,
    role_shape,
)
from llama_np.model.transformer import Transformer
from quant.backends import Backend, numpy_backend

SYNTHETIC = "synthetic:"
SEED = 0  # the random weights' seed unless asked otherwise (reports name it)


def synthetic_model(
    spec: str, fmt: str | None, head: str | None, backend: Backend | None = None,
    seed: int = SEED,
) -> Transformer:  # fmt: skip
    """`synthetic:CONFIG_OR_PRESET`: random weights of that shape, built in memory."""
    return random_model(load_config(spec[len(SYNTHETIC) :]), fmt, head, backend, seed)


def random_model(
    config: Config, fmt: str | None, head: str | None, backend: Backend | None = None,
    seed: int = 0,
) -> Transformer:  # fmt: skip
    """A model of this shape whose matrices hold random values in `fmt` (default f32),
    laid out for `backend` (default: NumPy's); norms are ones, biases small."""
    c = config
    backend = backend or numpy_backend()
    cls, rng = backend.weight_class(fmt or "f32"), np.random.default_rng(seed)
    tensors: dict[str, Tensor] = {}
    for i in range(c.n_layers):
        shapes = layer_shapes(c, i)
        for role, name in layer_tensor_names(i, c).items():
            shape = role_shape(shapes, role)
            if role == "router":  # float32, as llama.cpp keeps it
                tensors[name] = backend.weight_class("f32").random(shape, rng)
            elif len(shape) == 2:
                tensors[name] = cls.random(shape, rng)
            elif role.startswith("b") or role in ("conv", "dt_bias"):
                tensors[name] = rng.standard_normal(shape, np.float32) * np.float32(0.1)
            elif role == "a":  # a delta net's decay rates, -exp(A_log): negative
                tensors[name] = -rng.uniform(0.05, 2.0, shape).astype(np.float32)
            else:
                tensors[name] = np.ones(shape, np.float32)
    table = backend.weight_class(head or fmt or "f32")
    tensors["model.embed_tokens.weight"] = table.random((c.vocab_size, c.dim), rng)
    if not c.tie_embeddings:
        tensors["lm_head.weight"] = table.random((c.vocab_size, c.dim), rng)
    tensors[final_norm_name(c)] = np.ones(c.dim, np.float32)
    if c.ple_dim:  # gemma4's per-layer table (read by rows, as the embedding), projection
        shapes = ple_shapes(c)
        tensors[PLE_NAMES["ple_embed"]] = table.random(shapes["ple_embed"], rng)
        tensors[PLE_NAMES["ple_proj"]] = cls.random(shapes["ple_proj"], rng)
        tensors[PLE_NAMES["ple_norm"]] = np.ones(c.ple_dim, np.float32)
    return Transformer(c, build_weights(c, tensors, backend=backend), backend)
