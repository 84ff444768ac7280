"""The description of a llama-family decoder: a frozen dataclass, checked when built."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# Architectures the engine runs; the speed-of-light model reads any llama-family shape
# (mixtral's experts, cohere's tied head, ...).
SUPPORTED = ("llama", "mistral", "qwen2")


class ConfigError(ValueError):
    """A configuration that is malformed, or that the engine cannot run."""

    exit_code = 1


@dataclass(frozen=True)
class RopeScaling:
    """Frequency scaling of RoPE, as transformers' `rope_type` "linear" and "llama3"."""

    kind: str  # "linear" or "llama3"
    factor: float
    low_freq_factor: float = 1.0  # llama3: wavelengths above original_ctx / low are / factor
    high_freq_factor: float = 4.0  # llama3: wavelengths below original_ctx / high are kept
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class Config:
    arch: str  # "llama", "mistral" (adds a sliding window), "qwen2" (adds q, k, v biases)
    dim: int  # width of the residual stream (hidden_size)
    n_layers: int
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads; n_heads / n_kv_heads queries share one (GQA)
    head_dim: int  # may differ from dim / n_heads, so it is stored, not derived
    hidden_dim: int  # width of the SwiGLU MLP (intermediate_size; per expert)
    vocab_size: int
    max_seq_len: int = 4096  # context the model was trained for (max_position_embeddings)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None  # None: full attention
    tie_embeddings: bool = False  # the LM head reuses the token embedding table
    qkv_bias: bool = False  # qwen2: the q, k and v projections add a bias
    n_experts: int = 1  # MLP experts per layer (mixture of experts)
    experts_per_token: int = 1  # how many of them a token uses
    bos_id: int | None = 1
    eos_ids: tuple[int, ...] = (2,)
    # GGUF's rope_freqs tensor: each inverse frequency is divided by its factor (how
    # llama.cpp stores Llama 3's RoPE scaling); None when absent.
    rope_freq_factors: tuple[float, ...] | None = None
    name: str = "model"  # for reports: a preset's name, a checkpoint's directory

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def n_rep(self) -> int:
        """How many query heads read each key/value head."""
        return self.n_heads // self.n_kv_heads

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        """The inverse of dataclasses.asdict (a config sent as JSON: lists for tuples)."""
        d = dict(d)
        if d.get("rope_scaling") is not None:
            d["rope_scaling"] = RopeScaling(**d["rope_scaling"])
        for key in ("eos_ids", "rope_freq_factors"):
            if d.get(key) is not None:
                d[key] = tuple(d[key])
        return cls(**d)

    def with_window(self, window: int | None) -> Config:
        return replace(self, sliding_window=window)

    def check_runnable(self) -> None:
        """Raise ConfigError unless the engine can run this model."""
        if self.arch not in SUPPORTED:
            raise ConfigError(
                f"config: unsupported model_type {self.arch!r} (supported: {', '.join(SUPPORTED)})"
            )
        if self.n_experts > 1:
            raise ConfigError(f"{self.name}: mixture-of-experts models are not supported")

    def __post_init__(self) -> None:
        for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim",
                    "vocab_size", "max_seq_len", "n_experts", "experts_per_token"):  # fmt: skip
            if getattr(self, key) < 1:
                raise ConfigError(f"config: {key} must be positive, got {getattr(self, key)}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"config: num_attention_heads ({self.n_heads}) is not a multiple of "
                f"num_key_value_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"config: head_dim must be even for RoPE, got {self.head_dim}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ConfigError(f"config: sliding_window must be positive, got {self.sliding_window}")
        if not (math.isfinite(self.norm_eps) and self.norm_eps > 0):
            raise ConfigError(
                f"config: rms_norm_eps must be a positive number, got {self.norm_eps}"
            )
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ConfigError(
                f"config: rope_theta must be a positive number, got {self.rope_theta}"
            )
