"""The one reader (and writer) of a Hugging Face config.json. A config is untrusted input:
every field is type- and range-checked, and the limits below keep a corrupt one from
asking for terabytes."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from .config import (
    Config,
    ConfigError,
    DeltaNet,
    RopeScaling,
    UnsupportedModel,
)
from .families import FAMILIES, MOE, SUPPORTED

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


def _rope(d: dict[str, Any], arch: str, rotary: int) -> tuple[float, RopeScaling | None]:
    """rope_theta and scaling, in transformers' v4 (`rope_theta`, `rope_scaling`) or
    v5 (`rope_parameters`) spelling (by layer type: the full layers', _rope_by_layer_type)."""
    params = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise ConfigError("config: rope_parameters / rope_scaling must be objects")
    merged = {**scaling, **params}
    theta = _float(params, "rope_theta", _float(d, "rope_theta", 10000.0))
    kind = merged.get("rope_type", merged.get("type", "default"))
    if arch == "phi3" and kind in ("su", "yarn"):  # Phi3Config's own renaming
        kind = "longrope"
    if kind == "default":
        return theta, None
    if kind == "proportional":  # gemma4's full layers (_gemma4 reads the proportion)
        if _float(merged, "factor", 1.0) != 1.0:
            raise ConfigError("config: proportional RoPE with a factor is not supported")
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
    if kind == "longrope":
        return theta, _longrope(d, merged, rotary)
    if kind == "yarn":
        return theta, _yarn(d, merged)
    raise ConfigError(f"config: unsupported rope type {kind!r} (supported: default, linear, "
                      "llama3, longrope, yarn, proportional)")  # fmt: skip


def _yarn(d: dict[str, Any], merged: dict[str, Any]) -> RopeScaling:
    """transformers' _compute_yarn_parameters: the attention factor 0.1 ln(factor) + 1
    unless given (or mscale and mscale_all_dim's ratio)."""
    top = d.get("max_position_embeddings", 2048)
    orig = _int({"o": merged.get("original_max_position_embeddings", top)}, "o", 1, _MAX_CONTEXT)
    factor = merged.get("factor")
    factor = top / orig if factor is None else _float(merged, "factor")
    if not (math.isfinite(factor) and factor > 0):
        raise ConfigError(f"config: yarn's factor must be positive, got {factor}")

    def mscale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    attention = merged.get("attention_factor")
    if attention is None:
        m, m_all = merged.get("mscale"), merged.get("mscale_all_dim")
        attention = mscale(m) / mscale(m_all) if m and m_all else mscale(1.0)
    return RopeScaling("yarn", factor, original_max_position_embeddings=orig,
                       attention_factor=float(attention),
                       beta_fast=float(merged.get("beta_fast") or 32),
                       beta_slow=float(merged.get("beta_slow") or 1),
                       truncate=bool(merged.get("truncate", True)))  # fmt: skip


def _longrope(d: dict[str, Any], merged: dict[str, Any], rotary: int) -> RopeScaling:
    """transformers' _compute_longrope_parameters: factor = max_position_embeddings over
    the original context, attention_factor sqrt(1 + ln(factor) / ln(original)) unless given."""
    top = d.get("original_max_position_embeddings")
    orig = _int({"o": merged.get("original_max_position_embeddings", top)}, "o", 1, _MAX_CONTEXT)
    factor = _int(d, "max_position_embeddings", 1, _MAX_CONTEXT, default=orig) / orig
    attention = merged.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
    factors = []
    for key in ("short_factor", "long_factor"):
        f = merged.get(key)
        if (
            not isinstance(f, list)
            or len(f) != rotary // 2
            or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in f)
        ):
            raise ConfigError(f"config: rope_scaling.{key} must be {rotary // 2} numbers")
        factors.append(tuple(float(x) for x in f))
    return RopeScaling("longrope", factor, original_max_position_embeddings=orig,
                       short_factor=factors[0], long_factor=factors[1],
                       attention_factor=float(attention))  # fmt: skip


def _rope_by_layer_type(d: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 saves a gemma3's and an olmo3's rope_parameters by layer type
    ({"full_attention": {...}, "sliding_attention": {...}}): the global layers' as the
    model's, the sliding layers' base as v4's rope_local_base_freq (those layers' RoPE is
    never scaled)."""
    params = d.get("rope_parameters")
    if not isinstance(params, dict) or not isinstance(params.get("full_attention"), dict):
        return d
    local = params.get("sliding_attention") or {}
    if not isinstance(local, dict):
        raise ConfigError("config: rope_parameters.sliding_attention must be an object")
    if local.get("rope_type", "default") != "default" or "partial_rotary_factor" in local:
        raise ConfigError(f"config: unsupported rope type {local['rope_type']!r} on the "
                          "sliding layers (only default, every dim)")  # fmt: skip
    out = {**d, "rope_parameters": params["full_attention"]}
    if "rope_theta" in local:
        out["rope_local_base_freq"] = local["rope_theta"]
    return out


def _check_runnable(d: dict[str, Any], arch: str) -> None:
    """What the engine refuses that the shape alone does not show."""
    if arch not in SUPPORTED:
        raise UnsupportedModel(
            f"config: unsupported model_type {arch!r} (supported: {', '.join(SUPPORTED)})"
        )
    if (d.get("num_local_experts") or d.get("num_experts") or 1) > 1 and arch not in MOE:
        raise UnsupportedModel(f"config: {arch} with experts is not supported (mixtures of "
                               f"experts: {', '.join(MOE)})")  # fmt: skip
    if arch == "qwen3_moe" and (d.get("mlp_only_layers") or d.get("decoder_sparse_step", 1) != 1):
        raise ConfigError("config: qwen3_moe's dense layers (mlp_only_layers, "
                          "decoder_sparse_step) are not supported")  # fmt: skip
    if arch == "olmoe" and d.get("clip_qkv") is not None:
        raise ConfigError("config: olmoe's clip_qkv is not supported")
    act = d.get("hidden_act", "silu") if not arch.startswith("gemma") else "silu"
    if act != "silu":
        raise ConfigError(f"config: unsupported hidden_act {act!r} (only silu)")
    if arch.startswith("gemma") and d.get("hidden_activation", GELU) != GELU:
        raise ConfigError(f"config: unsupported hidden_activation {d['hidden_activation']!r} "
                          f"(gemma: only {GELU})")  # fmt: skip
    for key in ("attention_bias", "mlp_bias", "conv_bias"):
        if d.get(key):
            raise ConfigError(f"config: {key}=true is not supported")
    if arch == "gemma4":
        for key in ("enable_moe_block", "attention_k_eq_v"):
            if d.get(key):
                raise UnsupportedModel(f"config: gemma4's {key} (the larger models) is not "
                                       "supported")  # fmt: skip
    if d.get("use_bidirectional_attention"):
        raise ConfigError(
            "config: use_bidirectional_attention (an embedding model) is not supported"
        )


GELU = "gelu_pytorch_tanh"  # gemma's GeGLU: GELU with the tanh approximation


def _window(d: dict[str, Any], arch: str, n_layers: int) -> tuple[int | None, tuple | None]:
    """The sliding window and the layers it applies to (None: every layer), as transformers
    decides them: config.json's `layer_types` when it names them, else the family's rule.
    Mistral and phi3 slide every layer (transformers' MistralConfig defaults the window to
    4096 when the key is absent); qwen2 and qwen3 slide the layers from max_window_layers
    on, with use_sliding_window (qwen3_moe every layer); gemma2 every other layer, gemma3
    five of six (sliding_window_pattern); smollm3 its NoPE layers, with use_sliding_window."""
    window = d.get("sliding_window", 4096 if arch == "mistral" else None)
    types = d.get("layer_types")
    if arch in ("qwen2", "qwen3", "qwen3_moe", "smollm3") and not d.get("use_sliding_window"):
        window = None
    if window is None:
        return None, None
    window = _int({"sliding_window": window}, "sliding_window", 1, _MAX_CONTEXT)
    if isinstance(types, list) and len(types) == n_layers:
        layers = tuple(t == "sliding_attention" for t in types)
    elif arch in ("gemma2", "gemma3", "gemma4"):
        pattern = _int(
            d,
            "sliding_window_pattern",
            1,
            _MAX_LAYERS,
            default=d.get("_sliding_window_pattern", 2 if arch == "gemma2" else 6),
        )
        layers = tuple(bool((i + 1) % pattern) for i in range(n_layers))
    elif arch in ("qwen2", "qwen3"):
        first = _int(d, "max_window_layers", 0, _MAX_LAYERS, default=28)
        layers = tuple(i >= first for i in range(n_layers))
    elif arch == "smollm3":
        layers = tuple(not r for r in _rope_layers(d, n_layers))
    elif arch == "olmo3":  # three sliding layers, then a full one
        layers = tuple(bool((i + 1) % 4) for i in range(n_layers))
    else:
        return window, None
    if arch == "gemma4":  # Gemma4TextConfig makes the last layer a full one
        layers = (*layers[:-1], False)
    return (window, layers) if any(layers) else (None, None)


def _rope_layers(d: dict[str, Any], n_layers: int) -> tuple[bool, ...]:
    """smollm3: which layers use RoPE (`no_rope_layers`: 1 = RoPE, 0 = NoPE), by default
    all but every `no_rope_layer_interval`-th."""
    given = d.get("no_rope_layers")
    if given is None:
        every = _int(d, "no_rope_layer_interval", 1, _MAX_LAYERS, default=4)
        return tuple(bool((i + 1) % every) for i in range(n_layers))
    if not isinstance(given, list) or len(given) != n_layers:
        raise ConfigError(f"config: no_rope_layers must list {n_layers} layers")
    return tuple(bool(x) for x in given)


def _qwen3_5(d: dict[str, Any], n_layers: int, head_dim: int) -> dict[str, Any]:
    """Qwen3.5: three layers in four a gated delta net (`layer_types`' linear_attention,
    else every full_attention_interval-th layer attends), the others attention with a
    sigmoid gate on its output, q and k normed per head, partial rotary (a quarter of the
    head by default)."""
    types = d.get("layer_types")
    if types is None:
        every = _int(d, "full_attention_interval", 1, _MAX_LAYERS, default=4)
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                 for i in range(n_layers)]  # fmt: skip
    names = {"full_attention": "attention", "linear_attention": "delta"}
    if not isinstance(types, list) or len(types) != n_layers or not set(types) <= set(names):
        raise UnsupportedModel(f"config: layer_types must name {n_layers} layers, each "
                               f"full_attention or linear_attention, got {types!r}")  # fmt: skip
    rope = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), dict) else {}
    prf = _float(rope, "partial_rotary_factor", _float(d, "partial_rotary_factor", 0.25))
    if not 0 < prf <= 1:
        raise ConfigError(f"config: partial_rotary_factor must be in (0, 1], got {prf}")
    delta = DeltaNet(_int(d, "linear_num_key_heads", 1, _MAX_DIM, 16),
                     _int(d, "linear_num_value_heads", 1, _MAX_DIM, 32),
                     _int(d, "linear_key_head_dim", 1, _MAX_DIM, 128),
                     _int(d, "linear_value_head_dim", 1, _MAX_DIM, 128),
                     _int(d, "linear_conv_kernel_dim", 1, 64, 4),
                     tiled=bool(d.get("linear_value_heads_tiled", False)))  # fmt: skip
    return {"layer_types": tuple(names[t] for t in types), "delta": delta, "attn_gate": True,
            "qk_norm": "head", "rotary_dim": 2 * int(head_dim * prf / 2)}  # fmt: skip


def _gemma4(d: dict[str, Any], n_layers: int, head_dim: int) -> dict[str, Any]:
    """Gemma 4's text model: gemma3's block with plain (x * w) norms, the scores unscaled, v
    normed without a weight; the full layers' head_dim (per_layer_config, else
    global_head_dim: 512 by default) and proportional RoPE with their own base; the last
    num_kv_shared_layers reading an earlier layer's KV, their MLP double-wide where
    use_double_wide_mlp; per-layer embeddings (hidden_size_per_layer_input)."""
    _, sliding = _window(d, "gemma4", n_layers)
    full = [i for i in range(n_layers) if sliding is None or not sliding[i]]
    per_layer = d.get("per_layer_config")
    if per_layer is None:
        per_layer = {i: {"head_dim": d.get("global_head_dim", 512)} for i in full}
    if not isinstance(per_layer, dict) or not all(isinstance(v, dict) for v in per_layer.values()):
        raise ConfigError("config: per_layer_config must map layers to objects")
    dims = set()
    for i, v in per_layer.items():
        layer = int(i) if str(i).isdigit() else -1  # (transformers pads: "04" of 35 layers)
        if set(v) - {"head_dim"} or layer not in full:
            raise ConfigError(f"config: per_layer_config of layer {i} ({v}) is not supported "
                              "(only the full layers' head_dim)")  # fmt: skip
        dims.add(_int(v, "head_dim", 2, _MAX_DIM))
    if len(dims) > 1:
        raise ConfigError(f"config: the full layers' head_dims differ: {sorted(dims)}")
    if _int(d, "vocab_size_per_layer_input", 1, _MAX_VOCAB, d.get("vocab_size")) != d.get(
            "vocab_size"):  # fmt: skip
        raise ConfigError("config: vocab_size_per_layer_input other than vocab_size is not "
                          "supported")  # fmt: skip
    rope = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), dict) else {}
    prf = None
    if rope.get("rope_type") == "proportional":
        prf = _float(rope, "partial_rotary_factor", 1.0)
    global_dim = dims.pop() if dims else head_dim
    return {"post_norm": True, "mlp_act": "gelu_tanh", "qk_norm": "head", "v_norm": True,
            "layer_scalar": True,
            "embed_scale": _f32(math.sqrt(_int(d, "hidden_size", 1, _MAX_DIM))),
            "attn_scale": 1.0, "final_softcap": d.get("final_logit_softcapping"),
            "rope_local_theta": _float(d, "rope_local_base_freq", 10000.0),
            "global_head_dim": None if global_dim == head_dim else global_dim,
            "rope_proportion": prf,
            "kv_shared": _int(d, "num_kv_shared_layers", 0, n_layers - 1, 0),
            "wide_shared_mlp": bool(d.get("use_double_wide_mlp", False)),
            "ple_dim": _int(d, "hidden_size_per_layer_input", 0, _MAX_DIM, 0) or 0}  # fmt: skip


def _local_theta(d: dict[str, Any]) -> float:
    """olmo3's sliding layers' rope_theta (from rope_parameters by layer type, as
    _rope_by_layer_type reads them), else the one."""
    return _float(d, "rope_local_base_freq", _float(d, "rope_theta", 500000.0))


def _lfm2(d: dict[str, Any], n_layers: int) -> dict[str, Any]:
    """LFM2: short convolutions beside attention (`layer_types`' conv, else the layers not
    in full_attn_idxs; neither: every layer attends), q and k normed per head."""
    types = d.get("layer_types")
    if types is None:
        full = d.get("full_attn_idxs")
        full = range(n_layers) if full is None else full
        types = ["full_attention" if i in full else "conv" for i in range(n_layers)]
    names = {"full_attention": "attention", "conv": "conv"}
    if not isinstance(types, list) or len(types) != n_layers or not set(types) <= set(names):
        raise UnsupportedModel(f"config: layer_types must name {n_layers} layers, each "
                               f"full_attention or conv, got {types!r}")  # fmt: skip
    return {"layer_types": tuple(names[t] for t in types), "qk_norm": "head",
            "conv_kernel": _int(d, "conv_L_cache", 1, 64, 3)}  # fmt: skip


def lfm2_hidden(d: dict[str, Any]) -> int:
    """LFM2's MLP width as Lfm2MLP makes it from intermediate_size (block_ff_dim): two
    thirds of it, times block_ffn_dim_multiplier and rounded up to block_multiple_of when
    there is a multiplier (block_auto_adjust_ff_dim)."""
    ff = _int(d, "block_ff_dim", 1, _MAX_DIM * 8, default=d.get("intermediate_size", 12288))
    if not d.get("block_auto_adjust_ff_dim", True):
        return ff
    ff = int(2 * ff / 3)
    mult = d.get("block_ffn_dim_multiplier", 1.0)
    if mult is not None:
        ff = int(_float({"m": mult}, "m") * ff)
        of = _int(d, "block_multiple_of", 1, _MAX_DIM, default=256)
        ff = of * ((ff + of - 1) // of)
    return ff


def _f32(x: float) -> float:
    """x rounded to float32, as transformers applies a float32 model's constants."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _switches(d: dict[str, Any], arch: str, dim: int, n_layers: int, head_dim: int) -> dict:
    """The family's switches of the one decoder block (llama_arch.Config)."""
    out: dict[str, Any] = {}
    if arch in ("qwen3", "gemma3", "qwen3_moe"):
        out["qk_norm"] = "head"
    if arch == "olmoe":  # q and k normed over the whole projection, as olmo2; pre-norms
        out["qk_norm"] = "all"
    if arch in ("qwen3_moe", "olmoe"):  # mixtral and granitemoe always renormalize
        out["norm_topk"] = bool(d.get("norm_topk_prob", False))
    if arch == "gemma4":
        out |= _gemma4(d, n_layers, head_dim)
    elif arch.startswith("gemma"):
        qpas = _float(d, "query_pre_attn_scalar", 256.0)
        out |= {"post_norm": True, "mlp_act": "gelu_tanh", "embed_scale": _f32(math.sqrt(dim)),
                "attn_scale": qpas**-0.5}  # fmt: skip
        out["final_softcap"] = d.get("final_logit_softcapping")
        if arch == "gemma2":
            out["attn_softcap"] = d.get("attn_logit_softcapping")
        else:  # transformers' Gemma3 never soft-caps the scores
            out["rope_local_theta"] = _float(d, "rope_local_base_freq", 10000.0)
    if arch in ("olmo2", "olmo3"):
        out |= {"qk_norm": "all", "pre_norm": False, "post_norm": True}
    if arch == "olmo3":  # the sliding layers' RoPE: their own base, unscaled
        out["rope_local_theta"] = _local_theta(d)
    if arch == "lfm2":
        out |= _lfm2(d, n_layers)
    if arch == "phi3":
        rope = d.get("rope_parameters")  # transformers 5 keeps the factor there
        prf = _float(rope if isinstance(rope, dict) else {}, "partial_rotary_factor",
                     _float(d, "partial_rotary_factor", 1.0))  # fmt: skip
        if not 0 < prf <= 1:
            raise ConfigError(f"config: partial_rotary_factor must be in (0, 1], got {prf}")
        out["rotary_dim"] = int(head_dim * prf)
    if arch == "smollm3":
        out["rope_layers"] = _rope_layers(d, n_layers)
    if arch == "qwen3_5":
        out |= _qwen3_5(d, n_layers, head_dim)
    if arch in ("granite", "granitemoe"):
        out |= {"embed_scale": _float(d, "embedding_multiplier", 1.0),
                "attn_scale": _float(d, "attention_multiplier", 1.0),
                "residual_scale": _float(d, "residual_multiplier", 1.0),
                "logits_scaling": _float(d, "logits_scaling", 1.0)}  # fmt: skip
    return out


# Where a family's config class defaults differ from llama's: a saved config.json leaves out
# the keys that equal both transformers' base defaults and the class's own.
TIED_BY_DEFAULT = ("cohere", "gemma2", "gemma3", "gemma4", "smollm3")
GEMMA3_TEXT = {  # Gemma3TextConfig's defaults: a multimodal gemma3's text_config lists the rest
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "final_logit_softcapping": None, "attn_logit_softcapping": None,
    "hidden_activation": GELU, "tie_word_embeddings": True,
}  # fmt: skip


GEMMA4_TEXT = {  # Gemma4TextConfig's defaults (transformers 5.24)
    "vocab_size": 262144, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
    "sliding_window": 512, "final_logit_softcapping": None, "hidden_activation": GELU,
    "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1,
    "vocab_size_per_layer_input": 262144, "hidden_size_per_layer_input": 256,
    "num_kv_shared_layers": 0, "use_double_wide_mlp": False,
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                        "full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                                           "partial_rotary_factor": 0.25}},
}  # fmt: skip
QWEN3_5_TEXT = {  # Qwen3_5TextConfig's defaults (transformers 5)
    "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
    "head_dim": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
}  # fmt: skip
LFM2 = {  # Lfm2Config's defaults (its legacy keys block_ff_dim, tie_embedding too)
    "vocab_size": 65536, "hidden_size": 2560, "intermediate_size": 12288,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 128000, "norm_eps": 1e-5, "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True, "conv_L_cache": 3, "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
OLMO3 = {  # Olmo3Config's defaults
    "vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "rope_theta": 500_000.0, "sliding_window": 4096,
    "bos_token_id": None, "eos_token_id": 50279, "tie_word_embeddings": False,
}  # fmt: skip
DEFAULTS = {"lfm2": LFM2, "olmo3": OLMO3}  # a family whose saved config.json leaves them out
# a multimodal checkpoint's text model: (its model_type here, the text config's defaults)
TEXT_PARTS = {"gemma3": ("gemma3", GEMMA3_TEXT), "gemma4": ("gemma4", GEMMA4_TEXT),
              "qwen3_5": ("qwen3_5", QWEN3_5_TEXT)}  # fmt: skip


def _text_config(d: dict[str, Any]) -> dict[str, Any]:
    """A multimodal checkpoint's language model (gemma3, qwen3_5): its text_config over the
    text config class's defaults (with the ids the top level may hold)."""
    arch, defaults = TEXT_PARTS[d["model_type"]]
    text = d.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"config: a {arch} config.json must hold a 'text_config' object")
    top = {k: d[k] for k in ("bos_token_id", "eos_token_id", "tie_word_embeddings") if k in d}
    return {**defaults, **top, **text, "model_type": arch}


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
    if not isinstance(d.get("model_type", ""), str):
        raise ConfigError(f"config: model_type must be a string, got {d['model_type']!r}")
    if d.get("model_type") == "gemma3_text":
        d = {**GEMMA3_TEXT, **d, "model_type": "gemma3"}
    elif d.get("model_type") == "gemma4_text":
        d = {**GEMMA4_TEXT, **d, "model_type": "gemma4"}
    elif d.get("model_type") == "qwen3_5_text":
        d = {**QWEN3_5_TEXT, **d, "model_type": "qwen3_5"}
    elif d.get("model_type") in TEXT_PARTS and "text_config" in d:
        d = _text_config(d)
    elif d.get("model_type") in DEFAULTS:
        d = {**DEFAULTS[d["model_type"]], **d}
        if d["model_type"] == "lfm2":  # its legacy and own names
            d |= {"tie_word_embeddings": d.get("tie_embedding", d["tie_word_embeddings"]),
                  "intermediate_size": lfm2_hidden(d), "rms_norm_eps": d["norm_eps"]}  # fmt: skip
    d = _rope_by_layer_type(d)
    arch = d.get("model_type")
    if runnable:
        if arch is None:
            raise ConfigError("config: missing field 'model_type'")
        _check_runnable(d, arch)
    arch = str(arch or "llama")
    dim = _int(d, "hidden_size", 1, _MAX_DIM)
    n_heads = _int(d, "num_attention_heads", 1, _MAX_DIM)
    n_layers = _int(d, "num_hidden_layers", 1, _MAX_LAYERS)
    head_dim = d.get("head_dim") or (
        128 if arch == "qwen3" else dim // n_heads
    )  # null: dim / heads
    if arch in ("olmoe", "granitemoe"):  # transformers reads no head_dim for these
        head_dim = dim // n_heads
    head_dim = _int({"head_dim": head_dim}, "head_dim", 1, _MAX_DIM)
    switches = _switches(d, arch, dim, n_layers, head_dim)
    theta, scaling = _rope(d, arch, switches.get("rotary_dim") or head_dim)
    n_experts, per_token = _experts(d)
    hidden = d.get("moe_intermediate_size") or d.get("intermediate_size", ...)
    bos, eos = d.get("bos_token_id", 1), d.get("eos_token_id", 2)
    kv_heads = {"num_key_value_heads": d.get("num_key_value_heads") or n_heads}  # null: heads
    max_seq = _int(d, "max_position_embeddings", 1, _MAX_CONTEXT, default=2048)
    window, sliding = _window(d, arch, n_layers)
    if arch == "phi3" and window is not None and window >= max_seq:
        window = None  # phi-4-mini's 262144: never reached, and no ring of that size
    return Config(
        arch=arch,
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=_int(kv_heads, "num_key_value_heads", 1, _MAX_DIM),
        head_dim=head_dim,
        hidden_dim=_int({"intermediate_size": hidden}, "intermediate_size", 1, _MAX_DIM * 8),
        vocab_size=_int(d, "vocab_size", 1, _MAX_VOCAB),
        max_seq_len=max_seq,
        norm_eps=_float(d, "rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        sliding_window=window,
        sliding_layers=sliding,
        tie_embeddings=bool(d.get("tie_word_embeddings", arch in TIED_BY_DEFAULT)),
        qkv_bias=arch == "qwen2" or (not runnable and bool(d.get("attention_bias"))),
        n_experts=n_experts,
        experts_per_token=per_token,
        bos_id=None if bos is None else _ids(bos, "bos_token_id")[0],
        eos_ids=() if eos is None else _ids(eos, "eos_token_id"),
        name=name,
        **switches,
    )


# the model_type a text model's config.json names (a multimodal checkpoint's text part)
TEXT_TYPES = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "qwen3_5": "qwen3_5_text"}


def config_to_hf(c: Config) -> dict[str, Any]:
    """The config.json of a Config (for checkpoints written from a GGUF file): what
    config_from_hf reads back into the same Config."""
    d: dict[str, Any] = {
        "architectures": [FAMILIES[c.arch].hf_class if c.arch in FAMILIES else "LlamaForCausalLM"],
        "model_type": TEXT_TYPES.get(c.arch, c.arch),
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
        d |= _rope_to_hf(c.rope_scaling)
    return d | _switches_to_hf(c)


def _rope_to_hf(s: RopeScaling) -> dict[str, Any]:
    if s.kind == "longrope":  # phi3: the original context a top-level field; Phi3Config
        # takes three keys, the attention factor only where it is not its own formula's
        r = {"type": "longrope", "short_factor": list(s.short_factor or ()),
             "long_factor": list(s.long_factor or ())}  # fmt: skip
        orig = s.original_max_position_embeddings
        own = 1.0 if s.factor <= 1 else math.sqrt(1 + math.log(s.factor) / math.log(orig))
        if not math.isclose(s.attention_factor, own, rel_tol=1e-6):
            r["attention_factor"] = s.attention_factor
        return {"rope_scaling": r, "original_max_position_embeddings": orig}
    out: dict[str, Any] = {"rope_type": s.kind, "factor": s.factor}
    if s.kind == "yarn":
        out |= {"original_max_position_embeddings": s.original_max_position_embeddings,
                "attention_factor": s.attention_factor, "beta_fast": s.beta_fast,
                "beta_slow": s.beta_slow, "truncate": s.truncate}  # fmt: skip
    if s.kind == "llama3":
        out.update(
            low_freq_factor=s.low_freq_factor,
            high_freq_factor=s.high_freq_factor,
            original_max_position_embeddings=s.original_max_position_embeddings,
        )
    return {"rope_scaling": out}


def _switches_to_hf(c: Config) -> dict[str, Any]:
    """A family's switches under transformers' names (config_from_hf's _switches)."""
    d: dict[str, Any] = {}
    if c.sliding_layers is not None:
        d["layer_types"] = ["sliding_attention" if s else "full_attention"
                            for s in c.sliding_layers]  # fmt: skip
        d["use_sliding_window"] = True
    if c.arch in ("gemma2", "gemma3"):
        qpas = round((c.attn_scale or c.head_dim**-0.5) ** -2, 6)
        qpas = int(qpas) if qpas.is_integer() else qpas  # transformers 5's gemma3: an int
        d |= {"hidden_activation": GELU, "final_logit_softcapping": c.final_softcap,
              "query_pre_attn_scalar": qpas}  # fmt: skip
        if c.arch == "gemma2":
            d["attn_logit_softcapping"] = c.attn_softcap
        else:
            d["rope_local_base_freq"] = c.rope_local_theta or c.rope_theta
    if c.arch == "gemma4":
        d |= _gemma4_to_hf(c)
    if c.arch in ("phi3", "qwen3_5") and c.rotary_dim:
        d["partial_rotary_factor"] = c.rotary_dim / c.head_dim
    if c.delta is not None:
        names = {"attention": "full_attention", "delta": "linear_attention"}
        dn = c.delta
        d |= {"layer_types": [names[t] for t in c.layer_types or ()],
              "linear_num_key_heads": dn.k_heads, "linear_num_value_heads": dn.v_heads,
              "linear_key_head_dim": dn.k_dim, "linear_value_head_dim": dn.v_dim,
              "linear_conv_kernel_dim": dn.kernel}  # fmt: skip
        if dn.tiled:  # llama-np's own key: the value heads in a GGUF's order (DeltaNet.tiled)
            d["linear_value_heads_tiled"] = True
    if c.arch == "smollm3" and c.rope_layers is not None:
        d["no_rope_layers"] = [int(r) for r in c.rope_layers]
    if c.arch == "olmo3":
        d["rope_local_base_freq"] = c.rope_local_theta
    if c.arch == "lfm2":
        names = {"attention": "full_attention", "conv": "conv"}
        d |= {"layer_types": [names[t] for t in c.layer_types or ()],
              "conv_L_cache": c.conv_kernel, "block_auto_adjust_ff_dim": False,
              "norm_eps": c.norm_eps}  # fmt: skip
    if c.n_experts > 1:
        experts = "num_local_experts" if c.arch in ("mixtral", "granitemoe") else "num_experts"
        d |= {experts: c.n_experts, "num_experts_per_tok": c.experts_per_token,
              "norm_topk_prob": c.norm_topk}  # fmt: skip
        if c.arch == "qwen3_moe":
            d["moe_intermediate_size"] = c.hidden_dim
    if c.arch in ("granite", "granitemoe"):
        d |= {"embedding_multiplier": c.embed_scale, "attention_multiplier": c.attn_scale,
              "residual_multiplier": c.residual_scale,
              "logits_scaling": c.logits_scaling}  # fmt: skip
    return d


def _gemma4_to_hf(c: Config) -> dict[str, Any]:
    """A gemma4's switches under Gemma4TextConfig's names (config_from_hf's _gemma4)."""
    full = [i for i in range(c.n_layers) if c.is_full(i)]
    full_rope: dict[str, Any] = {"rope_type": "default", "rope_theta": c.rope_theta}
    if c.rope_proportion is not None:
        full_rope = {"rope_type": "proportional", "rope_theta": c.rope_theta,
                     "partial_rotary_factor": c.rope_proportion}  # fmt: skip
    local = {"rope_type": "default", "rope_theta": c.rope_local_theta or c.rope_theta}
    return {"hidden_activation": GELU, "final_logit_softcapping": c.final_softcap,
            "per_layer_config": {str(i): {"head_dim": c.layer_head_dim(i)} for i in full},
            "rope_parameters": {"full_attention": full_rope, "sliding_attention": local},
            "num_kv_shared_layers": c.kv_shared, "use_double_wide_mlp": c.wide_shared_mlp,
            "hidden_size_per_layer_input": c.ple_dim,
            "vocab_size_per_layer_input": c.vocab_size}  # fmt: skip


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
