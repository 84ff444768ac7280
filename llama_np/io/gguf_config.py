"""What a GGUF file's metadata and tensor names say, as llama.cpp reads them: the Config of
each architecture llama.cpp's converter writes (convert_hf_to_gguf.py) and the Hugging
Face name of each of its tensors.

Where the file leaves something out, llama.cpp's defaults stand, not transformers': a
GGUF keeps no query_pre_attn_scalar (llama.cpp scales Gemma's scores by 1/sqrt(head_dim),
1/sqrt(dim / heads) for the 27B models), no Gemma 2 rope_theta (10000), no sliding-layer
pattern (every other layer for Gemma 2, five of six for Gemma 3), no SmolLM3 NoPE pattern
(every fourth layer), no Qwen3 or Phi-3 window (full attention). Phi-3's longrope takes its
long factors when the context asked for passes the original one (llama.cpp decides by the
context size; transformers by the positions seen).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from llama_arch import Config, config_from_hf
from llama_arch.families import FAMILIES, GGUF_ARCHITECTURES, MOE, family_of_gguf
from llama_np.errors import LlamaNpError, UsageError

EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}

LAYER_TENSORS = {  # GGUF tensor -> Hugging Face, the same in every family
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",  # the norm before the MLP
    "ffn_gate_inp": "mlp.gate",  # a mixture of experts' router
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
AFTER = {  # the norms on attention's and the MLP's output (gemma, olmo2)
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
FAMILY_TENSORS = {  # ... and where a family's names differ
    "gemma2": {"ffn_norm": "pre_feedforward_layernorm", **AFTER},
    "gemma3": {"ffn_norm": "pre_feedforward_layernorm", **AFTER},
    "olmo2": AFTER,
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},  # fused
    "qwen35": {  # the norm before the MLP, and the gated delta net's tensors
        "post_attention_norm": "post_attention_layernorm", "attn_qkv": "linear_attn.in_proj_qkv",
        "attn_gate": "linear_attn.in_proj_z", "ssm_beta": "linear_attn.in_proj_b",
        "ssm_alpha": "linear_attn.in_proj_a", "ssm_conv1d": "linear_attn.conv1d",
        "ssm_norm": "linear_attn.norm", "ssm_out": "linear_attn.out_proj"},
    "gemma4": {"ffn_norm": "pre_feedforward_layernorm", **AFTER,  # and the per-layer input's
               "inp_gate": "per_layer_input_gate", "proj": "per_layer_projection",
               "post_norm": "post_per_layer_input_norm"},
    "lfm2": {
        "attn_norm": "operator_norm", "ffn_norm": "ffn_norm", "ffn_gate": "feed_forward.w1",
        "ffn_up": "feed_forward.w3", "ffn_down": "feed_forward.w2",
        "attn_output": "self_attn.out_proj", "attn_q_norm": "self_attn.q_layernorm",
        "attn_k_norm": "self_attn.k_layernorm", "shortconv.in_proj": "conv.in_proj",
        "shortconv.conv": "conv.conv", "shortconv.out_proj": "conv.out_proj"},
}  # fmt: skip
# tensors named outside the pattern blk.N.NAME.weight: (GGUF's, Hugging Face's) after blk.N.
ODD_TENSORS = {"qwen35": {"ssm_a": "linear_attn.A", "ssm_dt.bias": "linear_attn.dt_bias"},
               "gemma4": {"layer_output_scale.weight": "layer_scalar"}}  # fmt: skip
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LFM2_GLOBAL = {"token_embd_norm.weight": "model.embedding_norm.weight"}  # its final norm
GEMMA4_GLOBAL = {  # the per-layer embeddings' table, the embedding's projection, its norm
    "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
    "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
    "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight",
}


def layer_names(arch: str) -> dict[str, str]:
    """A family's GGUF layer tensor -> Hugging Face name (one each way), by its GGUF
    architecture."""
    names = LAYER_TENSORS | FAMILY_TENSORS.get(arch, {})
    if arch in ("olmo2", "qwen35"):  # HF's post_attention_layernorm: after, or before the MLP
        del names["ffn_norm"]
    return names


def global_tensors(arch: str) -> dict[str, str]:
    """A family's tensors outside the layers: GGUF name -> Hugging Face name."""
    return {"lfm2": LFM2_GLOBAL, "gemma4": GEMMA4_GLOBAL}.get(arch, {}) | GLOBAL_TENSORS


def hf_name(name: str, c: Config) -> tuple[str | None, int | None]:
    """HF name of a GGUF tensor, and the head count to un-permute its rows by (Q and K of
    the NORM-rope families); (None, None) for a tensor the model does not use (a Qwen3.5
    file's multi-token-prediction layer, past n_layers, among them)."""
    arch = FAMILIES[c.arch].gguf
    if name in global_tensors(arch):
        return global_tensors(arch)[name], None
    parts = name.split(".")
    if len(parts) < 3 or parts[0] != "blk" or not parts[1].isdigit() or int(parts[1]) >= c.n_layers:
        return None, None
    odd = ODD_TENSORS.get(arch, {}).get(".".join(parts[2:]))
    if odd is not None:
        return f"model.layers.{parts[1]}.{odd}", None
    names = layer_names(arch)
    if len(parts) == 5 and parts[2] == "shortconv":  # lfm2's blk.N.shortconv.NAME.weight
        parts = [*parts[:2], f"shortconv.{parts[3]}", parts[4]]
    layer = len(parts) == 4 and parts[3] in ("weight", "bias")
    if layer and parts[2] in names:
        heads = None
        if FAMILIES[c.arch].permuted:
            heads = {"attn_q": c.n_heads, "attn_k": c.n_kv_heads}.get(parts[2])
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}", heads
    return None, None


def expert_tensor(name: str) -> tuple[str, str] | None:
    """(layer, projection) of a mixture of experts' stacked tensor (blk.N.ffn_gate_exps:
    every expert's gate rows, a 3-D tensor), else None."""
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in EXPERTS and parts[3] == "weight":
        return parts[1], EXPERTS[parts[2]]
    return None


def gguf_name(hf: str, c: Config) -> str:
    """The GGUF name of a tensor the model needs, by its HF name (for messages)."""
    arch = FAMILIES[c.arch].gguf
    reverse = {v: k for k, v in global_tensors(arch).items()}
    if hf in reverse:
        return reverse[hf]
    _, _, i, *rest = hf.split(".")
    if rest[:2] == ["mlp", "experts"]:  # an expert: the layer's stacked tensor
        stacked = {v: k for k, v in EXPERTS.items()}[rest[3]]
        return f"blk.{i}.{stacked}.weight"
    odd = {v: k for k, v in ODD_TENSORS.get(arch, {}).items()}.get(".".join(rest))
    if odd is not None:
        return f"blk.{i}.{odd}"
    stem, kind = ".".join(rest[:-1]), rest[-1]
    ours = {v: k for k, v in layer_names(arch).items()}
    return f"blk.{i}.{ours.get(stem, stem)}.{kind}"


class Metadata:
    """Typed access to GGUF key/values, with errors that name the key."""

    def __init__(self, reader: Any, path: Any) -> None:
        self.fields, self.path = reader.fields, path

    def get(self, key: str, kind: type, default: Any = ...) -> Any:
        field = self.fields.get(key)
        if field is None:
            if default is ...:
                raise LlamaNpError(f"{self.path}: GGUF metadata has no '{key}'")
            return default
        try:
            value = field.contents()
        except Exception as e:  # a malformed field: the reader raises various errors
            raise LlamaNpError(f"{self.path}: GGUF metadata '{key}' is unreadable ({e})") from None
        if not _has_kind(value, kind):
            raise LlamaNpError(
                f"{self.path}: GGUF metadata '{key}' should be {kind.__name__}, "
                f"got {type(value).__name__}"
            )
        return float(value) if kind is float else value


def _has_kind(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, int | float)
    return isinstance(value, kind)


def config_from_gguf(meta: Metadata, tensors: dict[str, Any], name: str = "model") -> Config:
    """The Config of a GGUF file from its metadata and tensors (by name: rope_freqs and
    Phi-3's rope factors are tensors), as llama.cpp reads it; UsageError for an
    architecture or a mixture of experts the engine does not run, before any weight."""
    arch = meta.get("general.architecture", str)
    a = arch + "."
    if arch not in GGUF_ARCHITECTURES:
        raise UsageError(f"{meta.path}: unsupported GGUF architecture {arch!r} (supported: "
                         f"{', '.join(GGUF_ARCHITECTURES)})")  # fmt: skip
    experts = meta.get(a + "expert_count", int, 0)
    if experts > 1 and arch not in {FAMILIES[m].gguf for m in MOE}:
        raise UsageError(
            f"{meta.path}: a mixture of experts ({a}expert_count = {experts}) "
            f"is not supported for {arch} (supported: {', '.join(GGUF_ARCHITECTURES)})"
        )
    dim = meta.get(a + "embedding_length", int)
    n_heads = meta.get(a + "attention.head_count", int)
    head_dim = meta.get(a + "attention.key_length", int, dim // max(n_heads, 1))
    tokens = meta.fields.get("tokenizer.ggml.tokens")
    embed = tensors.get("token_embd.weight")
    n_vocab = int(embed.shape[-1]) if embed is not None else (
        len(tokens.data) if tokens is not None else ...)  # fmt: skip
    model_type = "mixtral" if arch == "llama" and experts > 1 else family_of_gguf(arch)
    hf: dict[str, Any] = {
        "model_type": model_type,
        "hidden_size": dim,
        "num_hidden_layers": meta.get(a + "block_count", int),
        "num_attention_heads": n_heads,
        "num_key_value_heads": _scalar(meta, a + "attention.head_count_kv", n_heads),
        "head_dim": head_dim,
        "intermediate_size": _scalar(meta, a + "feed_forward_length", ...),  # gemma4: a list
        "vocab_size": meta.get(a + "vocab_size", int, n_vocab),
        "max_position_embeddings": meta.get(a + "context_length", int),
        "rms_norm_eps": meta.get(a + "attention.layer_norm_rms_epsilon", float),
        "rope_theta": meta.get(a + "rope.freq_base", float, 10000.0),
        "sliding_window": meta.get(a + "attention.sliding_window", int, None),
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id", int, None),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id", int, None),
    }
    hf |= _rope(meta, a, head_dim)
    hf |= READERS.get(arch, lambda *_: {})(meta, a, hf, tensors)
    if experts > 1:
        hf |= _experts(meta, a, experts, tensors)
    c = config_from_hf(hf, name)
    factors = tensors.get("rope_freqs.weight")
    if factors is not None and arch != "gemma4":  # (gemma4's: _gemma4 reads them)
        factors = np.asarray(factors.data, np.float32).ravel()
        if factors.shape != (c.rotary // 2,):
            raise LlamaNpError(f"{meta.path}: rope_freqs has {factors.shape[0]} factors, "
                               f"expected {c.rotary // 2}")  # fmt: skip
        c = replace(c, rope_freq_factors=tuple(float(f) for f in factors))
    return c


def _scalar(meta: Metadata, key: str, default: Any) -> int:
    """An int key that a family may write per layer (lfm2's head_count_kv, gemma4's
    feed_forward_length): its largest (the family's reader reads the list)."""
    field = meta.fields.get(key)
    if field is not None and len(field.types) > 1:  # an array
        return max(meta.get(key, list)) or default
    return meta.get(key, int, default)


def _rope(meta: Metadata, a: str, head_dim: int) -> dict[str, Any]:
    """Partial rotary, linear scaling and YaRN as llama.cpp applies it (cos and sin times
    1 + 0.1 ln(factor), times rope.scaling.attn_factor; the rest is a family's)."""
    out: dict[str, Any] = {}
    rot = meta.get(a + "rope.dimension_count", int, head_dim)
    if rot != head_dim:
        out["partial_rotary_factor"] = rot / head_dim
    scaling = meta.get(a + "rope.scaling.type", str, "none")
    if scaling == "linear":
        out["rope_scaling"] = {"rope_type": "linear",
                               "factor": meta.get(a + "rope.scaling.factor", float)}  # fmt: skip
    elif scaling == "yarn":
        factor = meta.get(a + "rope.scaling.factor", float)
        attention = (1 + 0.1 * math.log(factor)) if factor > 1 else 1.0
        out["rope_scaling"] = {
            "rope_type": "yarn", "factor": factor,
            "original_max_position_embeddings": meta.get(
                a + "rope.scaling.original_context_length", int),
            "attention_factor": attention * meta.get(a + "rope.scaling.attn_factor", float, 1.0),
            "beta_fast": meta.get(a + "rope.scaling.yarn_beta_fast", float, 32.0),
            "beta_slow": meta.get(a + "rope.scaling.yarn_beta_slow", float, 1.0)}  # fmt: skip
    elif scaling != "none":
        raise LlamaNpError(f"{meta.path}: unsupported RoPE scaling {scaling!r}")
    return out


def _gemma(meta: Metadata, a: str, hf: dict, tensors: dict) -> dict[str, Any]:
    """Gemma 2 and 3 as llama.cpp runs them (src/models/gemma2.cpp, gemma3.cpp)."""
    n_layers, gemma2 = hf["num_hidden_layers"], a == "gemma2."
    big = n_layers == (46 if gemma2 else 62)  # the 27B models scale by dim / heads
    out = {"query_pre_attn_scalar": hf["hidden_size"] / hf["num_attention_heads"] if big
           else hf["head_dim"], "final_logit_softcapping": meta.get(
               a + "final_logit_softcapping", float, 30.0 if gemma2 else None)}  # fmt: skip
    pattern = meta.get(a + "attention.sliding_window_pattern", int, 2 if gemma2 else 6)
    window = hf["sliding_window"] or (4096 if gemma2 else None)
    out |= {"sliding_window": window, "sliding_window_pattern": pattern}
    if gemma2:
        out |= {"attn_logit_softcapping": meta.get(a + "attn_logit_softcapping", float, 50.0),
                "tie_word_embeddings": True}  # llama.cpp's gemma2 reads token_embd # fmt: skip
    else:
        out["rope_local_base_freq"] = meta.get(a + "rope.freq_base_swa", float, 10000.0)
    return out


def _phi3(meta: Metadata, a: str, hf: dict, tensors: dict) -> dict[str, Any]:
    """Phi-3's longrope from its two factor tensors; no window (llama.cpp runs full
    attention whatever attention.sliding_window says)."""
    out: dict[str, Any] = {"sliding_window": None}
    long, short = tensors.get("rope_factors_long.weight"), tensors.get("rope_factors_short.weight")
    if long is None or short is None:
        return out
    orig = meta.get(a + "rope.scaling.original_context_length", int,
                    hf["max_position_embeddings"])  # fmt: skip
    out["rope_scaling"] = {
        "type": "longrope",
        "short_factor": np.asarray(short.data, np.float32).ravel().tolist(),
        "long_factor": np.asarray(long.data, np.float32).ravel().tolist(),
        "attention_factor": meta.get(a + "rope.scaling.attn_factor", float, 1.0),
    }
    out["original_max_position_embeddings"] = orig
    return out


def _granite(meta: Metadata, a: str, hf: dict, tensors: dict) -> dict[str, Any]:
    """Granite's multipliers; a key absent (or 0) is llama.cpp's "off"."""

    def key(name: str, off: float | None) -> float | None:
        v = meta.get(a + name, float, 0.0)
        return v if v else off

    return {"embedding_multiplier": key("embedding_scale", 1.0),
            "attention_multiplier": key("attention.scale", hf["head_dim"] ** -0.5),
            "residual_multiplier": key("residual_scale", 1.0),
            "logits_scaling": key("logit_scale", 1.0)}  # fmt: skip


def _smollm3(meta: Metadata, a: str, hf: dict, tensors: dict) -> dict[str, Any]:
    return {"no_rope_layer_interval": 4}  # llama.cpp's n_no_rope_layer_step


def _experts(meta: Metadata, a: str, experts: int, tensors: dict) -> dict[str, Any]:
    """A mixture of experts as llama.cpp runs it: softmax over the experts, the top k, their
    weights renormalized but for OLMoE's (whatever a config said); each expert's width from
    its tensors (ne1 of blk.0.ffn_gate_exps)."""
    gate = tensors.get("blk.0.ffn_gate_exps.weight")
    width = int(gate.shape[1]) if gate is not None else meta.get(a + "feed_forward_length", int)
    return {"num_experts": experts, "num_experts_per_tok": meta.get(a + "expert_used_count", int),
            "moe_intermediate_size": width, "norm_topk_prob": a != "olmoe."}  # fmt: skip


def _qwen3(meta: Metadata, a: str, hf: dict, tensors: dict) -> dict[str, Any]:
    return {"sliding_window": None}  # the converter keeps no window; llama.cpp reads none


def _olmo2(meta: Metadata, a: str, hf: dict, tensors: dict) -> dict[str, Any]:
    """OLMo 2; or OLMo 3, which the converter writes as olmo2 with a window and a bool per
    layer (attention.sliding_window_pattern, else three sliding layers in four). llama.cpp
    turns the sliding layers by the one rope_theta, unscaled (rope.freq_base_swa is read,
    not used), the full ones with YaRN where the file says."""
    if not hf["sliding_window"]:
        return {}
    n = hf["num_hidden_layers"]
    pattern = meta.get(a + "attention.sliding_window_pattern", list, None)
    if pattern is None:
        pattern = [bool((i + 1) % 4) for i in range(n)]
    if len(pattern) != n:
        raise LlamaNpError(f"{meta.path}: {a}attention.sliding_window_pattern names "
                           f"{len(pattern)} layers of {n}")  # fmt: skip
    types = ["sliding_attention" if p else "full_attention" for p in pattern]
    return {"model_type": "olmo3", "layer_types": types,
            "rope_local_base_freq": hf["rope_theta"]}  # fmt: skip


def _qwen35(meta: Metadata, a: str, hf: dict, tensors: dict) -> dict[str, Any]:
    """Qwen3.5 as llama.cpp reads it (src/models/qwen35.cpp): block_count counts the
    multi-token-prediction layer (nextn_predict_layers), which the model skips; the delta
    net's shape from ssm.*; its layers from attention.recurrent_layers, else every fourth
    attends; its value heads in the converter's tiled order."""
    n = hf["num_hidden_layers"] - meta.get(a + "nextn_predict_layers", int, 0)
    recurrent = meta.get(a + "attention.recurrent_layers", list, None)
    if recurrent is None:
        every = meta.get(a + "full_attention_interval", int, 4)
        recurrent = [(i + 1) % every != 0 for i in range(n)]
    if len(recurrent) < n:
        raise LlamaNpError(f"{meta.path}: {a}attention.recurrent_layers names "
                           f"{len(recurrent)} layers of {n}")  # fmt: skip
    v_heads = meta.get(a + "ssm.time_step_rank", int)
    return {"num_hidden_layers": n, "layer_types": [
                "linear_attention" if r else "full_attention" for r in recurrent[:n]],
            "linear_conv_kernel_dim": meta.get(a + "ssm.conv_kernel", int),
            "linear_key_head_dim": meta.get(a + "ssm.state_size", int),
            "linear_num_key_heads": meta.get(a + "ssm.group_count", int),
            "linear_num_value_heads": v_heads,
            "linear_value_head_dim": meta.get(a + "ssm.inner_size", int) // max(v_heads, 1),
            "linear_value_heads_tiled": True}  # fmt: skip


def _lfm2(meta: Metadata, a: str, hf: dict, tensors: dict) -> dict[str, Any]:
    """LFM2 as llama.cpp reads it (src/models/lfm2.cpp): a short convolution where the
    per-layer head_count_kv is 0; the MLP's width as the converter adjusted it."""
    kv = meta.get(a + "attention.head_count_kv", list)
    if len(kv) != hf["num_hidden_layers"] or not any(kv):
        raise LlamaNpError(f"{meta.path}: {a}attention.head_count_kv must give each of the "
                           f"{hf['num_hidden_layers']} layers, some attending")  # fmt: skip
    return {"num_key_value_heads": max(kv), "conv_L_cache": meta.get(a + "shortconv.l_cache", int),
            "layer_types": ["full_attention" if k else "conv" for k in kv],
            "block_auto_adjust_ff_dim": False, "norm_eps": hf["rms_norm_eps"]}  # fmt: skip


def _gemma4(meta: Metadata, a: str, hf: dict, tensors: dict) -> dict[str, Any]:
    """Gemma 4 as llama.cpp reads it (src/models/gemma4.cpp; the converter's Gemma4Model):
    key_length the full layers' head_dim, key_length_swa the sliding layers'; a bool per
    layer for the sliding ones; the last shared_kv_layers reading an earlier layer's KV, their
    MLP double-wide where feed_forward_length (per layer) says so; per-layer embeddings of
    embedding_length_per_layer_input; the full layers' proportional RoPE from rope_freqs."""
    n = hf["num_hidden_layers"]
    pattern = meta.get(a + "attention.sliding_window_pattern", list)
    if len(pattern) != n:
        raise LlamaNpError(f"{meta.path}: {a}attention.sliding_window_pattern names "
                           f"{len(pattern)} layers of {n}")  # fmt: skip
    shared = meta.get(a + "attention.shared_kv_layers", int, 0)
    _shared_as_transformers(meta, a, pattern, shared)
    swa_dim = meta.get(a + "attention.key_length_swa", int)
    _whole_heads_turn(meta, a, hf["head_dim"], swa_dim)
    _same(meta, a + "attention.head_count_kv")
    ple = tensors.get("per_layer_token_embd.weight")
    return {"head_dim": swa_dim, "global_head_dim": hf["head_dim"],
            "layer_types": ["sliding_attention" if p else "full_attention" for p in pattern],
            "num_kv_shared_layers": shared,
            "hidden_size_per_layer_input": meta.get(a + "embedding_length_per_layer_input", int),
            "vocab_size_per_layer_input": hf["vocab_size"] if ple is None else int(ple.shape[-1]),
            "final_logit_softcapping": meta.get(a + "final_logit_softcapping", float, None),
            "rope_parameters": _gemma4_rope(meta, a, hf, tensors)} | _gemma4_mlp(
                meta, a, n - shared)  # fmt: skip


def _shared_as_transformers(meta: Metadata, a: str, pattern: list, shared: int) -> None:
    """llama.cpp's shared KV layers read the KV of layer first - 1 (the full ones) or first -
    2 (the sliding ones), first the first shared layer: transformers' pick (the last earlier
    layer of a layer's kind) where those are a full and a sliding layer, as in the Gemma 4
    models; the last layer is full (transformers makes it so). Other files are refused."""
    if not 0 <= shared < len(pattern):
        raise LlamaNpError(f"{meta.path}: {a}attention.shared_kv_layers {shared} of "
                           f"{len(pattern)} layers")  # fmt: skip
    first = len(pattern) - shared
    for i in range(first, len(pattern)):
        src = first - (2 if pattern[i] else 1)
        if src < 0 or pattern[src] != pattern[i]:
            raise LlamaNpError(f"{meta.path}: {a}attention.shared_kv_layers: layer {i} would read "
                               f"layer {src}'s KV, not one of its kind")  # fmt: skip
    if pattern and pattern[-1]:
        raise LlamaNpError(
            f"{meta.path}: {a}attention.sliding_window_pattern: the last layer "
            "sliding (transformers' Gemma 4 attends fully there) is not supported"
        )


def _whole_heads_turn(meta: Metadata, a: str, full_dim: int, swa_dim: int) -> None:
    """RoPE's dimension counts are the head sizes, as the converter writes them (the full
    layers' proportion is in rope_freqs); another partial RoPE is refused."""
    for key, dim in (("rope.dimension_count", full_dim), ("rope.dimension_count_swa", swa_dim)):
        if (rot := meta.get(a + key, int, dim)) != dim:
            raise LlamaNpError(f"{meta.path}: {a}{key} {rot} is not the head size {dim} "
                               "(partial RoPE there is not supported)")  # fmt: skip


def _same(meta: Metadata, key: str) -> None:
    """A key written per layer says the same of each (the engine's one value for all)."""
    field = meta.fields.get(key)
    if field is not None and len(field.types) > 1 and len(set(meta.get(key, list))) > 1:
        raise LlamaNpError(f"{meta.path}: {key} differs between layers "
                           f"({meta.get(key, list)}), which is not supported")  # fmt: skip


def _gemma4_mlp(meta: Metadata, a: str, first_shared: int) -> dict[str, Any]:
    """The MLP's width, and whether the shared KV layers' is twice it (the converter
    writes feed_forward_length per layer where use_double_wide_mlp)."""
    key = a + "feed_forward_length"
    field = meta.fields.get(key)
    if field is None or len(field.types) == 1:
        return {"intermediate_size": meta.get(key, int), "use_double_wide_mlp": False}
    widths = meta.get(key, list)
    own, rest = set(widths[:first_shared]), set(widths[first_shared:])
    if len(own) != 1 or len(rest) > 1 or not rest <= {min(own), 2 * min(own)}:
        raise LlamaNpError(f"{meta.path}: {key} {widths} is not one width, or twice it in the "
                           "shared KV layers")  # fmt: skip
    width = own.pop()
    return {"intermediate_size": width, "use_double_wide_mlp": rest == {2 * width}}


def _gemma4_rope(meta: Metadata, a: str, hf: dict, tensors: dict) -> dict[str, Any]:
    """rope_parameters by layer type: the sliding layers' base (rope.freq_base_swa); the
    full layers' base and, from rope_freqs (a factor per frequency of the full head_dim: 1
    where it turns, 1e30 where llama.cpp's RoPE is to stand still), the proportion
    turned."""
    local = {"rope_type": "default", "rope_theta": meta.get(a + "rope.freq_base_swa", float,
                                                            10000.0)}  # fmt: skip
    full: dict[str, Any] = {"rope_type": "default", "rope_theta": hf["rope_theta"]}
    factors = tensors.get("rope_freqs.weight")
    if factors is not None:
        f = np.asarray(factors.data, np.float32).ravel()
        turned = int(np.argmax(f != 1.0)) if (f != 1.0).any() else len(f)
        half = hf["head_dim"] // 2
        if len(f) != half or not (f[turned:] >= 1e20).all():
            raise LlamaNpError(f"{meta.path}: gemma4's rope_freqs is not proportional RoPE "
                               f"over {half} frequencies (1, then 1e30)")  # fmt: skip
        full = {"rope_type": "proportional", "rope_theta": hf["rope_theta"],
                "partial_rotary_factor": 2 * turned / hf["head_dim"]}  # fmt: skip
    return {"full_attention": full, "sliding_attention": local}


READERS = {"gemma2": _gemma, "gemma3": _gemma, "phi3": _phi3, "granite": _granite,
            "granitemoe": _granite, "smollm3": _smollm3, "qwen3": _qwen3, "qwen3moe": _qwen3,
            "olmo2": _olmo2, "qwen35": _qwen35, "lfm2": _lfm2, "gemma4": _gemma4}  # fmt: skip
