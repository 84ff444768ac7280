"""What a llama-family model is, from its shape alone: one description shared by the engine
(llama_np) and the speed-of-light model (bench). This package imports nothing else of the
project.

    Config        the model's dimensions, RoPE, window, biases, experts, special tokens
    hf            Config <-> a Hugging Face config.json (the one parser of it)
    presets       published configurations, by name ("llama-2-7b", "smollm2-135m", ...)
    tensors       the matrices and vectors of a layer, by role, with their shapes
"""

from __future__ import annotations

from .config import MIXERS, SUPPORTED, Config, ConfigError, DeltaNet, RopeScaling, UnsupportedModel
from .hf import config_from_hf, config_to_hf, read_config_json
from .presets import PRESETS, load_config
from .tensors import (
    ATTN_ROLES,
    MIXER_ROLES,
    MIXER_VECTORS,
    MLP_ROLES,
    PLE_ROLES,
    ROLES,
    layer_matrices,
    layer_roles,
    layer_vectors,
    mixer_roles,
    state_floats,
)

__all__ = [
    "ATTN_ROLES",
    "MIXERS",
    "MIXER_ROLES",
    "MIXER_VECTORS",
    "MLP_ROLES",
    "PLE_ROLES",
    "PRESETS",
    "ROLES",
    "SUPPORTED",
    "Config",
    "ConfigError",
    "DeltaNet",
    "RopeScaling",
    "UnsupportedModel",
    "config_from_hf",
    "config_to_hf",
    "layer_matrices",
    "layer_roles",
    "layer_vectors",
    "load_config",
    "mixer_roles",
    "read_config_json",
    "state_floats",
]
