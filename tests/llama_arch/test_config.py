"""Config from Hugging Face config.json: both rope spellings, defaults, clear errors."""

from __future__ import annotations

import json

import pytest

from llama_arch import PRESETS, ConfigError, config_from_hf, load_config, read_config_json

BASE = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 100,
}  # fmt: skip


def test_defaults_follow_transformers():
    c = config_from_hf(BASE)
    assert (c.n_kv_heads, c.head_dim, c.rope_theta, c.norm_eps) == (4, 16, 10000.0, 1e-6)
    assert c.sliding_window is None and not c.tie_embeddings
    assert c.bos_id == 1 and c.eos_ids == (2,)
    assert config_from_hf({**BASE, "model_type": "mistral"}).sliding_window == 4096
    assert (
        config_from_hf({**BASE, "model_type": "mistral", "sliding_window": None}).sliding_window
        is None
    )


def test_rope_theta_in_either_spelling():
    a = config_from_hf({**BASE, "rope_theta": 500000.0})
    b = config_from_hf(
        {**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    )
    assert a == b and a.rope_theta == 500000.0


def test_llama3_scaling_in_either_spelling():
    scaling = {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    a = config_from_hf({**BASE, "rope_scaling": {"rope_type": "llama3", **scaling}})
    b = config_from_hf(
        {**BASE, "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, **scaling}}
    )
    assert a == b and a.rope_scaling.kind == "llama3" and a.rope_scaling.factor == 8.0


def test_gemma3_rope_by_layer_type_in_either_spelling():
    """transformers 5 nests a gemma3's rope by layer type: the global layers' theta and
    scaling, the sliding layers' own base (v4's rope_local_base_freq)."""
    g3 = {**BASE, "model_type": "gemma3_text", "num_hidden_layers": 6, "head_dim": 32}
    a = config_from_hf(
        {
            **g3,
            "rope_theta": 1e6,
            "rope_local_base_freq": 2e4,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        }
    )
    b = config_from_hf({**g3, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}}})  # fmt: skip
    assert a == b
    assert (b.rope_theta, b.rope_local_theta, b.rope_scaling.factor) == (1e6, 2e4, 8.0)
    with pytest.raises(ConfigError, match="sliding layers"):
        config_from_hf({**g3, "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "linear", "factor": 2.0}}})  # fmt: skip


def test_phi3_partial_rotary_factor_in_either_place():
    """transformers 5 keeps phi3's partial_rotary_factor in rope_parameters."""
    phi3 = {**BASE, "model_type": "phi3", "num_attention_heads": 2}  # head_dim 32
    a = config_from_hf({**phi3, "partial_rotary_factor": 0.75})
    b = config_from_hf(
        {**phi3, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.75}}
    )
    assert a == b and a.rotary_dim == 24


def test_head_dim_from_config_or_derived():
    assert config_from_hf({**BASE, "head_dim": 32}).head_dim == 32
    assert config_from_hf({**BASE, "head_dim": None}).head_dim == 16


def test_eos_list_and_tied_embeddings():
    c = config_from_hf({**BASE, "eos_token_id": [2, 7], "tie_word_embeddings": True})
    assert c.eos_ids == (2, 7) and c.tie_embeddings


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2"}, "unsupported model_type 'gpt2'"),
        ({"model_type": None}, "missing field 'model_type'"),
        ({"hidden_size": None}, "missing field 'hidden_size'"),
        ({"num_hidden_layers": "2"}, "'num_hidden_layers' must be an integer"),
        ({"vocab_size": 10**12}, "'vocab_size' = 1000000000000 is out of range"),
        ({"num_key_value_heads": 3}, "not a multiple"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope type 'dynamic'"),
        ({"hidden_act": "gelu"}, "unsupported hidden_act"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"rms_norm_eps": -1}, "rms_norm_eps"),
    ],
)
def test_bad_configs_name_the_problem(change, message):
    d = {**BASE, **change}
    d = {k: v for k, v in d.items() if v is not None or k not in ("model_type", "hidden_size")}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        config_from_hf(d)


def test_unreadable_config_file(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable JSON"):
        read_config_json(tmp_path / "config.json")
    (tmp_path / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ConfigError, match="JSON object"):
        read_config_json(tmp_path / "config.json")


def test_any_llama_family_shape_reads_for_the_speed_of_light_model(tmp_path):
    cfg = {
        "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
        "vocab_size": 151936, "tie_word_embeddings": True,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    s = load_config(str(tmp_path))
    assert s.qkv_bias and s.tie_embeddings and s.head_dim == 64 and s.name == tmp_path.name
    cfg = {**cfg, "model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 2}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    s = load_config(str(tmp_path))
    assert (s.arch, s.n_experts, s.experts_per_token, s.qkv_bias) == ("qwen2_moe", 8, 2, False)
    with pytest.raises(ConfigError, match="unsupported model_type 'qwen2_moe'"):
        read_config_json(tmp_path / "config.json")  # the engine's reading refuses it
    assert load_config("SmolLM2-135M") is PRESETS["smollm2-135m"]
    with pytest.raises(ConfigError, match="neither a preset"):
        load_config("no-such-model")


def test_the_families_presets_carry_their_switches():
    """What each 2026 preset's family switches on, from its config.json's fields alone, and
    its parameters as its model card gives them (to the card's precision)."""
    from bench.sol import estimate

    p = PRESETS
    assert (p["qwen3-0.6b"].qk_norm, p["qwen3-0.6b"].head_dim, p["qwen3-0.6b"].q_dim) == (
        "head", 128, 2048)  # fmt: skip
    g = p["gemma-3-1b"]
    assert g.sliding_layers == tuple((i + 1) % 6 != 0 for i in range(26))
    assert (g.sliding_window, g.rope_local_theta, g.rope_theta) == (512, 1e4, 1e6)
    assert g.embed_scale == pytest.approx(1152**0.5) and g.attn_scale == 256**-0.5
    assert (g.post_norm, g.mlp_act, g.tie_embeddings) == (True, "gelu_tanh", True)
    assert (p["phi-4-mini"].rotary_dim, p["phi-4-mini"].sliding_window) == (96, None)
    assert sum(not r for r in p["smollm3-3b"].rope_layers) == 9  # every fourth of 36
    assert (p["olmo-2-1b"].pre_norm, p["olmo-2-1b"].qk_norm) == (False, "all")
    assert p["granite-3.3-2b"].residual_scale == 0.22
    billions = {"qwen3-0.6b": 0.6, "qwen3-1.7b": 1.7, "qwen3-4b": 4.0, "gemma-3-270m": 0.27,
                "gemma-3-1b": 1.0, "phi-4-mini": 3.8, "smollm3-3b": 3.1, "olmo-2-1b": 1.5,
                "granite-3.3-2b": 2.5, "llama-3.2-1b": 1.2}  # fmt: skip
    for name, b in billions.items():
        assert estimate(p[name]).params_total / 1e9 == pytest.approx(b, abs=0.05), name


def test_the_readme_lists_every_preset():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    listed = readme.split("Presets (`sol --config`")[1].split(":\n", 1)[1].split("\n\n")[0]
    assert sorted(n.strip(" .\n") for n in listed.split(",")) == sorted(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_written_config_reads_back_through_transformers(name, tmp_path):
    """config_to_hf's config.json (as quantize writes it) is one transformers reads, and its
    re-save in transformers' own spelling (5.x: rope_parameters, a gemma3's nested by layer
    type, layer_types, dtype) reads back to the same Config."""
    from dataclasses import replace

    from transformers import AutoConfig

    from llama_arch import config_to_hf

    c = PRESETS[name]
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(c)))
    AutoConfig.from_pretrained(tmp_path).save_pretrained(tmp_path / "saved")
    back = read_config_json(tmp_path / "saved" / "config.json")
    assert replace(back, name=c.name) == c


def test_gemma4_switches_and_refusals():
    """Gemma 4's presets: the full layers' head_dim, who shares whose KV, the double-wide
    MLP; a token reads one row of the per-layer table (2.35B of E2B's 4.6B text parameters),
    so it reads about half the parameters. The MoE block and attention_k_eq_v are refused
    in one line naming them."""
    from bench.sol import estimate
    from llama_arch.tensors import layer_matrices

    e2b = PRESETS["gemma-4-e2b"]
    assert [i for i in range(35) if e2b.is_full(i)] == [4, 9, 14, 19, 24, 29, 34]
    assert (e2b.layer_head_dim(4), e2b.layer_head_dim(3), e2b.kv_source(15)) == (512, 256, 13)
    assert (e2b.kv_source(34), e2b.kv_source(14), e2b.rope_proportion) == (14, 14, 0.25)
    assert layer_matrices(e2b, 15)["w_up"] == (12288, 1536) and "wk" not in layer_matrices(e2b, 15)
    est = estimate(e2b)
    assert est.params_total / 1e9 == pytest.approx(4.63, abs=0.01)
    assert est.params_active / 1e9 == pytest.approx(2.28, abs=0.01)
    assert PRESETS["gemma-4-e4b"].kv_source(41) == 23
    base = {"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 96, "vocab_size": 50}  # fmt: skip
    for key in ("enable_moe_block", "attention_k_eq_v"):
        with pytest.raises(ConfigError, match=f"gemma4's {key}"):
            config_from_hf({**base, key: True})
