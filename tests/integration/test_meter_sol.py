"""The meter's count of a real decode step equals the speed-of-light model's bytes,
exactly, per category: two independent paths (arrays touched vs shapes and formats)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bench.sol import estimate
from llama_arch import Config, DeltaNet
from llama_np.model.synthetic import random_model
from quant.backends import get_backend

SHAPES = {
    "gqa_untied": Config("llama", 64, 2, 4, 2, 32, 96, 100),
    "mha_tied": Config("llama", 64, 2, 2, 2, 32, 128, 77, tie_embeddings=True),
    "window": Config("mistral", 96, 3, 3, 1, 32, 64, 50, sliding_window=8),
    "qwen_like": Config("qwen2", 256, 2, 4, 2, 64, 512, 90, qkv_bias=True),  # K-quants fit
    # the families' vectors and windows: q/k norms of a head or of a whole projection, norms
    # after attention and the MLP (or only those), Gemma's window on some layers
    "gemma_like": Config("gemma3", 64, 3, 4, 1, 32, 96, 100, tie_embeddings=True,
                         qk_norm="head", post_norm=True, mlp_act="gelu_tanh", sliding_window=8,
                         sliding_layers=(True, False, True), rope_local_theta=1e4),
    "olmo_like": Config("olmo2", 64, 2, 4, 2, 32, 96, 100, qk_norm="all", pre_norm=False,
                        post_norm=True),
    # mixtures of experts: the router (float32) and the experts the step chose, counted
    "moe_like": Config("mixtral", 64, 2, 4, 2, 32, 96, 100, n_experts=5, experts_per_token=2),
    "qwen3_moe_like": Config("qwen3_moe", 64, 2, 4, 1, 32, 96, 100, qk_norm="head",
                             n_experts=9, experts_per_token=3, norm_topk=False),
    # hybrids: a gated delta net's matrices, vectors and state beside gated attention (KV on
    # that layer only); short convolutions; OLMo 3's sliding layers
    "qwen3_5_like": Config("qwen3_5", 64, 4, 4, 2, 32, 96, 100, qk_norm="head", attn_gate=True,
                           rotary_dim=8, layer_types=("delta", "attention", "delta", "delta"),
                           delta=DeltaNet(2, 4, 16, 16, 4)),
    "lfm2_like": Config("lfm2", 64, 4, 2, 2, 32, 96, 100, tie_embeddings=True, qk_norm="head",
                        layer_types=("conv", "attention", "conv", "attention"), conv_kernel=3),
    "olmo3_like": Config("olmo3", 64, 4, 2, 1, 32, 96, 100, qk_norm="all", pre_norm=False,
                         post_norm=True, sliding_window=8, sliding_layers=(True, True, True, False),
                         rope_local_theta=1e4),
}  # fmt: skip
WEIGHTS = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]
K_QUANTS = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]
KV = ["f32", "f16", "q8_0"]
CASES = list(itertools.product(SHAPES, WEIGHTS, KV))
CASES += [("qwen_like", fmt, kv) for fmt in K_QUANTS for kv in KV]
# gemma4: full layers with twice the sliding ones' head_dim, the last two reading layers 0's
# and 1's KV (read where read, never written) with a double-wide MLP, a row of the per-layer
# table and its projection a token, each layer's gate and projection, norms and scalar
SHAPES["gemma4_like"] = Config(
    "gemma4", 64, 4, 4, 2, 32, 96, 100, tie_embeddings=True, qk_norm="head", post_norm=True,
    mlp_act="gelu_tanh", sliding_window=8, sliding_layers=(True, False, True, False),
    rope_local_theta=1e4, global_head_dim=64, rope_proportion=0.25, v_norm=True, kv_shared=2,
    wide_shared_mlp=True, ple_dim=32, layer_scalar=True)  # fmt: skip
CASES += [("gemma4_like", fmt, kv) for fmt in ("f32", "q8_0", "q4_1") for kv in ("f32", "q8_0")]


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
@pytest.mark.parametrize(("name", "fmt", "kv"), CASES)
def test_meter_equals_speed_of_light_bytes(name, fmt, kv, kernels):
    """Both backends, whose layouts differ (float32 or float16 scales, rows padded to
    groups of 4, keys read in tiles of 16): each meter equals its own model."""
    shape = SHAPES[name]
    head = "q8_0" if fmt == "q4_1" else None  # the LM head in its own format, as in GGUFs
    model = random_model(shape, fmt, head, get_backend(kernels))
    cache = model.new_cache(64, kv=kv)
    model.forward(np.array([1, 2, 3]), cache)  # prefill positions 0-2
    for pos in range(3, 14):  # before and after the window of 8
        model.forward(np.array([pos % shape.vocab_size]), cache)
        step = model.meter.last
        assert step.kind == "decode" and step.pos == pos
        embed = model.weights.embed.fmt
        used = step.experts or None  # a mixture of experts: what its router chose
        assert len(step.experts) == (shape.n_layers if shape.n_experts > 1 else 0)
        est = estimate(shape, fmt, kv, pos=pos, head=head, embed=embed, kernels=kernels,
                       experts=used)  # fmt: skip
        assert step.reads == est.reads, f"position {pos}"
        assert step.writes["kv_cache"] == est.kv_write_bytes
        assert step.writes["state"] == est.state_write_bytes


def test_a_forced_window_counts_the_window():
    shape = SHAPES["gqa_untied"]
    model = random_model(shape, "q8_0", None)
    cache = model.new_cache(64, window=5)
    model.forward(np.array([1, 2, 3, 4, 5, 6, 7]), cache)
    model.forward(np.array([8]), cache)
    assert model.meter.last.reads == estimate(shape, "q8_0", pos=7, window=5).reads
    assert estimate(shape, "q8_0", pos=7, window=5).n_keys == 5
