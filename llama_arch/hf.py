"""The one reader (and writer) of a Hugging Face config.json. A config is untrusted input:
every field is type- and range-checked, and the limits below keep a corrupt one from
asking for terabytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .config import SUPPORTED, Config, ConfigError, RopeScaling

_MAX_DIM = 1 << 17
_MAX_LAYERS = 1024
_MAX_VOCAB = 1 << 22
_MAX_CONTEXT = 1 << 24
_MAX_EXPERTS = 1024


def _int(d: dict[str, Any], key: str, lo: int, hi: int, default: Any = ...) -> int:
    value = d.get(key, default)
    if value is ...:
        raise ConfigError(f"config: missing field '{key}'")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"config: field '{key}' must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"config: field '{key}' = {value} is out of range [{lo}, {hi}]")
    return value


def _float(d: dict[str, Any], key: str, default: Any = ...) -> float:
    value = d.get(key, default)
    if value is ...:
        raise ConfigError(f"config: missing field '{key}'")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"config: field '{key}' must be a number, got {value!r}")
    return float(value)


def _ids(value: Any, key: str) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    if not values or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    ):
        raise ConfigError(f"config: field '{key}' must be a token id or a list of them")
    return tuple(values)


def _rope(d: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """rope_theta and scaling, in transformers' v4 (`rope_theta`, `rope_scaling`) or
    v5 (`rope_parameters`) spelling."""
    params = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise ConfigError("config: rope_parameters / rope_scaling must be objects")
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
    raise ConfigError(
        f"config: unsupported rope type {kind!r} (supported: default, linear, llama3)"
    )


def _check_runnable(d: dict[str, Any], arch: str) -> None:
    """What the engine refuses that the shape alone does not show."""
    if arch not in SUPPORTED:
        raise ConfigError(
            f"config: unsupported model_type {arch!r} (supported: {', '.join(SUPPORTED)})"
        )
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"config: unsupported hidden_act {act!r} (only silu)")
    for key in ("attention_bias", "mlp_bias"):
        if d.get(key):
            raise ConfigError(f"config: {key}=true is not supported")
    if arch == "qwen2" and d.get("use_sliding_window"):
        raise ConfigError("config: Qwen2's use_sliding_window is not supported")


def _window(d: dict[str, Any], arch: str) -> int | None:
    """transformers' MistralConfig defaults the window to 4096 when the key is absent;
    Qwen2 names a window but uses it only with use_sliding_window."""
    window = d.get("sliding_window", 4096 if arch == "mistral" else None)
    if not d.get("use_sliding_window", arch != "qwen2") or window is None:
        return None
    return _int({"sliding_window": window}, "sliding_window", 1, _MAX_CONTEXT)


def _experts(d: dict[str, Any]) -> tuple[int, int]:
    n = d.get("num_local_experts") or d.get("num_experts") or 1
    n = _int({"experts": n}, "experts", 1, _MAX_EXPERTS)
    per_token = _int(d, "num_experts_per_tok", 1, n, default=1) if n > 1 else 1
    return n, per_token


def config_from_hf(d: Any, name: str = "model", runnable: bool = True) -> Config:
    """A Config from the contents of a config.json, with transformers' defaults for the
    fields it lets a checkpoint omit. `runnable`: refuse what the engine cannot run;
    False reads any llama-family shape (for the speed-of-light model)."""
    if not isinstance(d, dict):
        raise ConfigError("config: config.json must hold a JSON object")
    arch = d.get("model_type")
    if runnable:
        if arch is None:
            raise ConfigError("config: missing field 'model_type'")
        _check_runnable(d, arch)
    arch = str(arch or "llama")
    dim = _int(d, "hidden_size", 1, _MAX_DIM)
    n_heads = _int(d, "num_attention_heads", 1, _MAX_DIM)
    head_dim = d.get("head_dim") or dim // n_heads  # null or absent: dim / heads
    theta, scaling = _rope(d)
    n_experts, per_token = _experts(d)
    hidden = d.get("moe_intermediate_size") or d.get("intermediate_size", ...)
    bos, eos = d.get("bos_token_id", 1), d.get("eos_token_id", 2)
    kv_heads = {"num_key_value_heads": d.get("num_key_value_heads") or n_heads}  # null: heads
    return Config(
        arch=arch,
        dim=dim,
        n_layers=_int(d, "num_hidden_layers", 1, _MAX_LAYERS),
        n_heads=n_heads,
        n_kv_heads=_int(kv_heads, "num_key_value_heads", 1, _MAX_DIM),
        head_dim=_int({"head_dim": head_dim}, "head_dim", 1, _MAX_DIM),
        hidden_dim=_int({"intermediate_size": hidden}, "intermediate_size", 1, _MAX_DIM * 8),
        vocab_size=_int(d, "vocab_size", 1, _MAX_VOCAB),
        max_seq_len=_int(d, "max_position_embeddings", 1, _MAX_CONTEXT, default=2048),
        norm_eps=_float(d, "rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        sliding_window=_window(d, arch),
        tie_embeddings=bool(d.get("tie_word_embeddings", arch == "cohere")),
        qkv_bias=arch == "qwen2" or (not runnable and bool(d.get("attention_bias"))),
        n_experts=n_experts,
        experts_per_token=per_token,
        bos_id=None if bos is None else _ids(bos, "bos_token_id")[0],
        eos_ids=() if eos is None else _ids(eos, "eos_token_id"),
        name=name,
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


def read_config_json(path: str | Path, runnable: bool = True) -> Config:
    """A config.json file (named after its directory)."""
    path = Path(path)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not a readable JSON file ({e})") from None
    return config_from_hf(d, path.parent.name or str(path), runnable)
