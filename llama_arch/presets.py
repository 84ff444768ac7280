"""Published configurations (from the models' config.json files), by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .config import Config, ConfigError
from .hf import config_from_hf, read_config_json


def _p(name: str, dim: int, layers: int, heads: int, kv: int, hidden: int, vocab: int,
       **kw: Any) -> Config:  # fmt: skip
    arch = kw.pop("arch", "mistral" if kw.get("sliding_window") else "llama")
    return Config(arch, dim, layers, heads, kv, dim // heads, hidden, vocab, name=name, **kw)


def _hf(name: str, model_type: str, dim: int, layers: int, heads: int, kv: int, hidden: int,
        vocab: int, **fields: Any) -> Config:  # fmt: skip
    """A preset from the fields of its config.json, read as config_from_hf reads one (the
    family's switches follow from model_type)."""
    d = {"model_type": model_type, "hidden_size": dim, "num_hidden_layers": layers,
         "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": hidden,
         "vocab_size": vocab, **fields}  # fmt: skip
    return config_from_hf(d, name)


LFM2_ATTENTION = [2, 5, 8, 10, 12, 14]  # LFM2-350M's and 1.2B's attention layers of 16

# The small models of 2026, from their published config.json (shapes, windows, RoPE, the
# families' constants). Longrope's per-frequency factors are left out: they change no byte
# and no FLOP, only the angles.
FAMILIES = [
    _hf("qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 3072, 151936, head_dim=128,
        max_position_embeddings=40960, rope_theta=1e6, tie_word_embeddings=True),
    _hf("qwen3-1.7b", "qwen3", 2048, 28, 16, 8, 6144, 151936, head_dim=128,
        max_position_embeddings=40960, rope_theta=1e6, tie_word_embeddings=True),
    _hf("qwen3-4b", "qwen3", 2560, 36, 32, 8, 9728, 151936, head_dim=128,
        max_position_embeddings=40960, rope_theta=1e6, tie_word_embeddings=True),
    _hf("gemma-3-270m", "gemma3_text", 640, 18, 4, 1, 2048, 262144, head_dim=256,
        max_position_embeddings=32768, sliding_window=512, query_pre_attn_scalar=256),
    _hf("gemma-3-1b", "gemma3_text", 1152, 26, 4, 1, 6912, 262144, head_dim=256,
        max_position_embeddings=32768, sliding_window=512, query_pre_attn_scalar=256),
    _hf("phi-4-mini", "phi3", 3072, 32, 24, 8, 8192, 200064, partial_rotary_factor=0.75,
        max_position_embeddings=131072, original_max_position_embeddings=4096,
        sliding_window=262144, tie_word_embeddings=True),
    _hf("smollm3-3b", "smollm3", 2048, 36, 16, 4, 11008, 128256, rope_theta=5e6,
        max_position_embeddings=65536, no_rope_layer_interval=4),
    _hf("olmo-2-1b", "olmo2", 2048, 16, 16, 16, 8192, 100352, rope_theta=5e5,
        max_position_embeddings=4096),
    _hf("granite-3.3-2b", "granite", 2048, 40, 32, 8, 8192, 49159, rope_theta=1e7,
        max_position_embeddings=131072, embedding_multiplier=12.0,
        attention_multiplier=0.015625, residual_multiplier=0.22, logits_scaling=8.0,
        tie_word_embeddings=True),
    # mixtures of experts: the hidden width is each expert's
    _hf("olmoe-1b-7b", "olmoe", 2048, 16, 16, 16, 1024, 50304, num_experts=64,
        num_experts_per_tok=8, max_position_embeddings=4096, rms_norm_eps=1e-5),
    _hf("qwen3-30b-a3b", "qwen3_moe", 2048, 48, 32, 4, 768, 151936, head_dim=128,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
        max_position_embeddings=40960, rope_theta=1e6),
    _hf("granite-3.1-3b-a800m", "granitemoe", 1536, 32, 24, 8, 512, 49155,
        num_local_experts=40, num_experts_per_tok=8, max_position_embeddings=131072,
        rope_theta=1e7, embedding_multiplier=12.0, attention_multiplier=0.015625,
        residual_multiplier=0.22, logits_scaling=6.0, tie_word_embeddings=True),
    _hf("llama-3.2-1b", "llama", 2048, 16, 32, 8, 8192, 128256, rope_theta=5e5,
        max_position_embeddings=131072, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # the models llama.cpp's scoreboards and benches run; their config.json (the text model
    # of the multimodal Gemma 3 4B / 27B and Mistral Small 3.1), as quoted in public code:
    # Llama-3.2-3B github.com/citsjtu2020/LLM-Prof sglang/Model_Config.md; Qwen2.5-7B-Instruct
    # (Qwen2-7B's shapes, its 152064-row table); Qwen3-32B, gemma-3-4b-it, gemma-3-27b-it
    # and Mistral-Small-3.1-24B-Instruct-2503 text_config from tests of several engines
    # that copy google/, Qwen/ and mistralai/ config.json files
    _hf("llama-3.2-3b", "llama", 3072, 28, 24, 8, 8192, 128256, head_dim=128, rope_theta=5e5,
        max_position_embeddings=131072, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    _hf("qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 18944, 152064, rope_theta=1e6,
        max_position_embeddings=32768, rms_norm_eps=1e-6),
    _hf("qwen3-32b", "qwen3", 5120, 64, 64, 8, 25600, 151936, head_dim=128, rope_theta=1e6,
        max_position_embeddings=40960),
    _hf("gemma-3-4b", "gemma3_text", 2560, 34, 8, 4, 10240, 262208, head_dim=256,
        query_pre_attn_scalar=256, sliding_window=1024, sliding_window_pattern=6,
        rope_theta=1e6, rope_local_base_freq=1e4, max_position_embeddings=131072,
        rope_scaling={"rope_type": "linear", "factor": 8.0}),
    _hf("gemma-3-27b", "gemma3_text", 5376, 62, 32, 16, 21504, 262208, head_dim=128,
        query_pre_attn_scalar=168, sliding_window=1024, sliding_window_pattern=6,
        rope_theta=1e6, rope_local_base_freq=1e4, max_position_embeddings=131072,
        rope_scaling={"rope_type": "linear", "factor": 8.0}),
    _hf("mistral-small-3.1-24b", "mistral", 5120, 40, 32, 8, 32768, 131072, head_dim=128,
        rope_theta=1e9, max_position_embeddings=131072, sliding_window=None),
    # hybrids: Qwen3.5's text model (three gated delta-net layers in four, head_dim 256,
    # delta heads of 128; the 0.8B, 2B and 4B tied, the 9B not; the MTP layer is not run),
    # LFM2 (short convolutions; the MLP width as Lfm2MLP adjusts block_ff_dim), OLMo 3 (three
    # sliding layers in four, YaRN on the full ones)
    *[_hf(f"qwen3.5-{size}", "qwen3_5_text", dim, layers, heads, kv, hidden, 248320,
          head_dim=256, linear_num_key_heads=16, linear_num_value_heads=v_heads,
          linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
          max_position_embeddings=262144, tie_word_embeddings=size != "9b",
          rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                           "partial_rotary_factor": 0.25}, eos_token_id=248044)
      for size, dim, layers, heads, kv, hidden, v_heads in (
          ("0.8b", 1024, 24, 8, 2, 3584, 16), ("2b", 2048, 24, 8, 2, 6144, 16),
          ("4b", 2560, 32, 16, 4, 9216, 32), ("9b", 4096, 32, 16, 4, 12288, 32))],
    _hf("lfm2-350m", "lfm2", 1024, 16, 16, 8, 6656, 65536, full_attn_idxs=LFM2_ATTENTION,
        eos_token_id=7),
    _hf("lfm2-1.2b", "lfm2", 2048, 16, 32, 8, 12288, 65536, full_attn_idxs=LFM2_ATTENTION,
        eos_token_id=7),
    _hf("lfm2-2.6b", "lfm2", 2048, 30, 32, 8, 10752, 65536, block_auto_adjust_ff_dim=False,
        full_attn_idxs=[2, 5, 9, 13, 17, 21, 24, 27], eos_token_id=7),
    _hf("olmo-3-7b", "olmo3", 4096, 32, 32, 32, 11008, 100278, rope_theta=5e5,
        max_position_embeddings=65536, sliding_window=4096, rms_norm_eps=1e-6,
        eos_token_id=100257, rope_scaling={
            "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
            "attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1}),
    # Gemma 4's text models (Gemma4TextConfig's defaults for what is not listed: RoPE 1e4 on
    # the sliding layers, proportional with a quarter turned and 1e6 on the full ones, per-layer
    # inputs of 256 from a 262144-row table): E2B four sliding layers then a full one, the
    # last 20 of 35 sharing KV with a double-wide MLP; E4B five then one, 18 of 42 sharing
    _hf("gemma-4-e2b", "gemma4_text", 1536, 35, 8, 1, 6144, 262144, head_dim=256,
        global_head_dim=512, sliding_window=512, sliding_window_pattern=5,
        num_kv_shared_layers=20, use_double_wide_mlp=True, final_logit_softcapping=30.0,
        eos_token_id=[1, 106]),
    _hf("gemma-4-e4b", "gemma4_text", 2560, 42, 8, 2, 10240, 262144, head_dim=256,
        global_head_dim=512, sliding_window=512, sliding_window_pattern=6,
        num_kv_shared_layers=18, final_logit_softcapping=30.0, eos_token_id=[1, 106]),
]  # fmt: skip

PRESETS: dict[str, Config] = {
    c.name: c
    for c in [
        _p("llama-7b", 4096, 32, 32, 32, 11008, 32000, max_seq_len=2048),
        _p("llama-13b", 5120, 40, 40, 40, 13824, 32000, max_seq_len=2048),
        _p("llama-33b", 6656, 60, 52, 52, 17920, 32000, max_seq_len=2048),
        _p("llama-65b", 8192, 80, 64, 64, 22016, 32000, max_seq_len=2048),
        _p("llama-2-7b", 4096, 32, 32, 32, 11008, 32000),
        _p("llama-2-13b", 5120, 40, 40, 40, 13824, 32000),
        _p("llama-2-70b", 8192, 80, 64, 8, 28672, 32000),
        _p("llama-3-8b", 4096, 32, 32, 8, 14336, 128256, max_seq_len=8192),
        _p("llama-3-70b", 8192, 80, 64, 8, 28672, 128256, max_seq_len=8192),
        _p("mistral-7b", 4096, 32, 32, 8, 14336, 32000, sliding_window=4096, max_seq_len=32768),
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
            arch="mixtral",
        ),
        _p("tinyllama-1.1b", 2048, 22, 32, 4, 5632, 32000, max_seq_len=2048),
        _p("smollm2-135m", 576, 30, 9, 3, 1536, 49152, tie_embeddings=True, max_seq_len=8192),
        _p("smollm2-360m", 960, 32, 15, 5, 2560, 49152, tie_embeddings=True, max_seq_len=8192),
        _p("smollm2-1.7b", 2048, 24, 32, 32, 8192, 49152, tie_embeddings=True, max_seq_len=8192),
        *FAMILIES,
    ]
}


def load_config(arg: str, runnable: bool = False) -> Config:
    """A preset name, a config.json, or a checkpoint directory holding one."""
    key = arg.lower()
    if key in PRESETS:
        return PRESETS[key]
    path = Path(arg)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"{arg!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json")
    return read_config_json(path, runnable)
