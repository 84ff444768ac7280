"""Model configuration: a frozen dataclass built from HF config.json or GGUF metadata."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .errors import LlamaNpError

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
# Far beyond any llama-family model, small enough that a corrupt config cannot ask for
# terabytes: a config is untrusted input.
_MAX_DIM = 1 << 17
_MAX_LAYERS = 1024
_MAX_VOCAB = 1 << 22
_MAX_CONTEXT = 1 << 24


@dataclass(frozen=True)
class RopeScaling:
    """Frequency scaling of RoPE, as transformers' `rope_type` "linear" and "llama3"."""

    kind: str  # "linear" or "llama3"
    factor: float
    low_freq_factor: float = (
        1.0  # llama3: wavelengths above original_ctx / low are divided by factor
    )
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
    hidden_dim: int  # width of the SwiGLU MLP (intermediate_size)
    vocab_size: int
    max_seq_len: int  # context the model was trained for (max_position_embeddings)
    norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None  # None: full attention
    tie_embeddings: bool = False  # the LM head reuses the token embedding table
    qkv_bias: bool = False  # qwen2: the q, k and v projections add a bias
    bos_id: int | None = 1
    eos_ids: tuple[int, ...] = (2,)
    # GGUF's rope_freqs tensor: each inverse frequency is divided by its factor (how
    # llama.cpp stores Llama 3's RoPE scaling); None when absent.
    rope_freq_factors: tuple[float, ...] | None = None

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

    def with_window(self, window: int | None) -> Config:
        return replace(self, sliding_window=window)

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise LlamaNpError(
                f"config: num_attention_heads ({self.n_heads}) is not a multiple of "
                f"num_key_value_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise LlamaNpError(f"config: head_dim must be even for RoPE, got {self.head_dim}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise LlamaNpError(
                f"config: sliding_window must be positive, got {self.sliding_window}"
            )
        if not (math.isfinite(self.norm_eps) and self.norm_eps > 0):
            raise LlamaNpError(
                f"config: rms_norm_eps must be a positive number, got {self.norm_eps}"
            )
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise LlamaNpError(
                f"config: rope_theta must be a positive number, got {self.rope_theta}"
            )


def _int(d: dict[str, Any], key: str, lo: int, hi: int, default: Any = ...) -> int:
    value = d.get(key, default)
    if value is ...:
        raise LlamaNpError(f"config: missing field '{key}'")
    if isinstance(value, bool) or not isinstance(value, int):
        raise LlamaNpError(f"config: field '{key}' must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise LlamaNpError(f"config: field '{key}' = {value} is out of range [{lo}, {hi}]")
    return value


def _float(d: dict[str, Any], key: str, default: Any = ...) -> float:
    value = d.get(key, default)
    if value is ...:
        raise LlamaNpError(f"config: missing field '{key}'")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LlamaNpError(f"config: field '{key}' must be a number, got {value!r}")
    return float(value)


def _ids(value: Any, key: str) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    if not values or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    ):
        raise LlamaNpError(f"config: field '{key}' must be a token id or a list of them")
    return tuple(values)


def _rope(d: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """rope_theta and scaling, in transformers' v4 (`rope_theta`, `rope_scaling`) or
    v5 (`rope_parameters`) spelling."""
    params = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise LlamaNpError("config: rope_parameters / rope_scaling must be objects")
    merged = {**scaling, **params}
    theta = _float(params, "rope_theta", _float(d, "rope_theta", 10000.0))
    kind = merged.get("rope_type", merged.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind == "linear":
        return theta, RopeScaling("linear", _float(merged, "factor"))
    if kind == "llama3":
        return theta, RopeScaling(
            "llama3",
            factor=_float(merged, "factor"),
            low_freq_factor=_float(merged, "low_freq_factor"),
            high_freq_factor=_float(merged, "high_freq_factor"),
            original_max_position_embeddings=_int(
                merged, "original_max_position_embeddings", 1, _MAX_CONTEXT
            ),
        )
    raise LlamaNpError(
        f"config: unsupported rope type {kind!r} (supported: default, linear, llama3)"
    )


def _check_supported(d: dict[str, Any]) -> str:
    arch = d.get("model_type")
    if arch is None:
        raise LlamaNpError("config: missing field 'model_type'")
    if arch not in SUPPORTED_TYPES:
        raise LlamaNpError(
            f"config: unsupported model_type {arch!r} (supported: {', '.join(SUPPORTED_TYPES)})"
        )
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise LlamaNpError(f"config: unsupported hidden_act {act!r} (only silu)")
    for key in ("attention_bias", "mlp_bias"):
        if d.get(key):
            raise LlamaNpError(f"config: {key}=true is not supported")
    return arch


def config_from_hf(d: dict[str, Any]) -> Config:
    """Build a Config from the contents of a Hugging Face config.json, with transformers'
    defaults for the fields it lets a checkpoint omit."""
    if not isinstance(d, dict):
        raise LlamaNpError("config: config.json must hold a JSON object")
    arch = _check_supported(d)
    dim = _int(d, "hidden_size", 1, _MAX_DIM)
    n_heads = _int(d, "num_attention_heads", 1, _MAX_DIM)
    head_dim = d.get("head_dim") or dim // n_heads  # null or absent: dim / heads
    theta, scaling = _rope(d)
    # transformers' MistralConfig defaults the window to 4096 when the key is absent; Qwen2
    # names a window but uses it only with use_sliding_window (and then not in every layer).
    window = d.get("sliding_window", 4096 if arch == "mistral" else None)
    if arch == "qwen2":
        if d.get("use_sliding_window"):
            raise LlamaNpError("config: Qwen2's use_sliding_window is not supported")
        window = None
    bos, eos = d.get("bos_token_id", 1), d.get("eos_token_id", 2)
    return Config(
        arch=arch,
        dim=dim,
        n_layers=_int(d, "num_hidden_layers", 1, _MAX_LAYERS),
        n_heads=n_heads,
        n_kv_heads=_int(d, "num_key_value_heads", 1, _MAX_DIM, default=n_heads),
        head_dim=_int({"head_dim": head_dim}, "head_dim", 1, _MAX_DIM),
        hidden_dim=_int(d, "intermediate_size", 1, _MAX_DIM * 8),
        vocab_size=_int(d, "vocab_size", 1, _MAX_VOCAB),
        max_seq_len=_int(d, "max_position_embeddings", 1, _MAX_CONTEXT, default=2048),
        norm_eps=_float(d, "rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        sliding_window=None
        if window is None
        else _int({"sliding_window": window}, "sliding_window", 1, _MAX_CONTEXT),
        tie_embeddings=bool(d.get("tie_word_embeddings", False)),
        qkv_bias=arch == "qwen2",
        bos_id=None if bos is None else _ids(bos, "bos_token_id")[0],
        eos_ids=() if eos is None else _ids(eos, "eos_token_id"),
    )


def config_to_hf(c: Config) -> dict[str, Any]:
    """The config.json of a Config (for checkpoints written from a GGUF file)."""
    names = {"mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
    d: dict[str, Any] = {
        "architectures": [names.get(c.arch, "LlamaForCausalLM")],
        "model_type": c.arch,
        "hidden_size": c.dim,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.hidden_dim,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,
        "sliding_window": c.sliding_window,
        "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": c.bos_id,
        "eos_token_id": list(c.eos_ids) if len(c.eos_ids) != 1 else c.eos_ids[0],
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    if c.rope_scaling is not None:
        s = c.rope_scaling
        d["rope_scaling"] = {"rope_type": s.kind, "factor": s.factor}
        if s.kind == "llama3":
            d["rope_scaling"].update(
                low_freq_factor=s.low_freq_factor,
                high_freq_factor=s.high_freq_factor,
                original_max_position_embeddings=s.original_max_position_embeddings,
            )
    return d


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LlamaNpError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LlamaNpError(f"{path}: not a readable JSON file ({e})") from None
    return config_from_hf(d)
