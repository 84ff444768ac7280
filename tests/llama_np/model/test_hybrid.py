"""Hybrid models' recurrent layers (a gated delta net, a short convolution) on random
weights: the compiled mixers against the NumPy reference on odd shapes, and the state as a
cache: a prompt in two calls equals one, a batch equals its sequences alone, a copy carries
on alike, and nothing rewinds it. (Against transformers: tests/integration/test_reference.py
and test_families_gguf.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from llama_arch import Config, DeltaNet
from llama_np.model.kvcache import State
from llama_np.model.ops import NumpyOps
from llama_np.model.synthetic import random_model
from quant.backends import get_backend
from tests.helpers import INT8_WITHIN, INT16_WITHIN

# odd shapes: key dims not powers of two and unlike the value dims, value heads 2x and 3x
# the key heads (grouped as transformers orders them, tiled as a GGUF does), a window
# shorter than the prompt, every layer type in one model
# (columns in multiples of 32: the block formats' rows)
SHAPES = {
    "delta": Config("qwen3_5", 64, 3, 4, 2, 24, 96, 90, qk_norm="head", attn_gate=True,
                    rotary_dim=6, layer_types=("delta", "attention", "delta"),
                    delta=DeltaNet(2, 4, 12, 24, 4)),
    "delta_tiled": Config("qwen3_5", 64, 2, 4, 2, 24, 96, 90, qk_norm="head", attn_gate=True,
                          rotary_dim=24, layer_types=("attention", "delta"),
                          delta=DeltaNet(2, 6, 20, 16, 3, tiled=True)),
    "conv": Config("lfm2", 64, 3, 4, 2, 16, 96, 90, qk_norm="head", conv_kernel=3,
                   layer_types=("conv", "attention", "conv"), tie_embeddings=True),
    "sliding": Config("olmo3", 64, 2, 4, 2, 16, 96, 90, qk_norm="all", pre_norm=False,
                      post_norm=True, sliding_window=5, sliding_layers=(True, False),
                      rope_local_theta=1e4),
    # gemma4: head_dim 16 on the sliding layers, 32 on the full ones (proportional RoPE),
    # the last two reading layers 0's and 1's KV with a double-wide MLP, per-layer inputs
    "shared": Config("gemma4", 64, 4, 4, 2, 16, 96, 90, qk_norm="head", post_norm=True,
                     mlp_act="gelu_tanh", attn_scale=1.0, sliding_window=5,
                     sliding_layers=(True, False, True, False), rope_local_theta=1e4,
                     rope_theta=1e6, global_head_dim=32, rope_proportion=0.25, v_norm=True,
                     kv_shared=2, wide_shared_mlp=True, ple_dim=32, layer_scalar=True),
}  # fmt: skip
KERNELS = ["numpy", "numba-int16", "numba-int8", "numba-f32"]


def mixer_inputs(c: Config, layer: int, t: int, rng: np.random.Generator):
    """A model's recurrent layer, and random projection rows for t tokens."""
    model = random_model(c, "f32", None, seed=3)
    m = model.weights.layers[layer].mixer
    h = rng.standard_normal((t, m.w_in.shape[0]), np.float32)
    return m, h


@pytest.mark.parametrize("name", ["delta", "delta_tiled", "conv"])
@pytest.mark.parametrize("calls", [(1,), (7,), (5, 1, 3), (2, 2)])
def test_the_compiled_mixers_equal_the_reference(name, calls):
    """T tokens in one call or several (the state carried between them): outputs and the
    state within float32 rounding of the NumPy reference."""
    from llama_np.model.ops_compiled import CompiledOps

    c = SHAPES[name]
    layer = c.layer_types.index("delta" if c.delta else "conv")
    m, h = mixer_inputs(c, layer, sum(calls), np.random.default_rng(0))
    states = [State(c, layer), State(c, layer)]
    ops = [NumpyOps(), CompiledOps("f32")]
    outs: list[list[np.ndarray]] = [[], []]
    t = 0
    for n in calls:
        for k in range(2):
            outs[k].append(ops[k].recurrent(c, h[t : t + n], [states[k]], m))
        t += n
    ref, got = np.concatenate(outs[0]), np.concatenate(outs[1])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    np.testing.assert_allclose(states[1].s, states[0].s, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(states[1].conv, states[0].conv)


@pytest.mark.parametrize("name", ["delta", "conv"])
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_a_batch_of_states_steps_each_as_alone(name, batch):
    from llama_np.model.ops_compiled import CompiledOps

    c = SHAPES[name]
    layer = c.layer_types.index("delta" if c.delta else "conv")
    m, h = mixer_inputs(c, layer, batch, np.random.default_rng(1))
    for ops in (NumpyOps(), CompiledOps("f32")):
        states = [State(c, layer) for _ in range(batch)]
        alone = [State(c, layer) for _ in range(batch)]
        for s, a in zip(states, alone, strict=True):  # distinct pasts
            s.s[...] = a.s[...] = np.random.default_rng(len(s.s)).random(s.s.shape)
        together = ops.recurrent(c, h, states, m)
        for b in range(batch):
            one = ops.recurrent(c, h[b : b + 1], [alone[b]], m)
            np.testing.assert_array_equal(together[b : b + 1], one)
            np.testing.assert_array_equal(states[b].s, alone[b].s)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("name", list(SHAPES))
def test_a_prompt_in_two_calls_equals_one_and_token_by_token(name, kernels):
    c = SHAPES[name]
    model = random_model(c, "q8_0", None, get_backend(kernels))
    tokens = np.random.default_rng(2).integers(0, c.vocab_size, 11)
    whole = model.forward(tokens, model.new_cache(16), all_logits=True)
    two = model.new_cache(16)
    parts = [model.forward(tokens[:6], two, all_logits=True),
             model.forward(tokens[6:], two, all_logits=True)]  # fmt: skip
    one = model.new_cache(16)
    steps = np.stack([model.forward(tokens[i : i + 1], one) for i in range(len(tokens))])
    # x rounded to integers per block of 32 multiplies in other groupings in a prompt's
    # products than in decode's: within the bounds the integer kernels are held to
    within = {"numba-int8": INT8_WITHIN, "numba-int16": INT16_WITHIN}.get(kernels, 2e-5)
    scale = np.abs(whole).max()
    np.testing.assert_allclose(np.concatenate(parts), whole, atol=within * scale, rtol=0)
    np.testing.assert_allclose(steps, whole, atol=10 * within * scale, rtol=0)


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_a_batch_step_gives_each_sequence_what_it_gets_alone(name, kernels):
    """Three sequences at different depths stepped together, each cache its own; copies
    of a cache carry on as the original."""
    c = SHAPES[name]
    model = random_model(c, "q4_0", None, get_backend(kernels))
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, c.vocab_size, n) for n in (3, 7, 5)]
    caches = [model.new_cache(16) for _ in prompts]
    for p, cache in zip(prompts, caches, strict=True):
        model.forward(p, cache)
    copies = [cache.copy() for cache in caches]
    nxt = np.array([1, 2, 3])
    together = model.step_batch(nxt, caches)
    for b, cache in enumerate(copies):
        alone = model.forward(nxt[b : b + 1], cache)
        np.testing.assert_allclose(together[b], alone, atol=1e-5 * np.abs(alone).max(), rtol=0)


def test_a_recurrent_state_is_never_rewound():
    """A cache with recurrent layers cannot truncate to an earlier position (its state
    has taken in what followed): truncate says False and changes nothing; reset empties
    it, states and all."""
    c = SHAPES["delta"]
    model = random_model(c, "f32", None)
    cache = model.new_cache(16)
    model.forward(np.array([1, 2, 3, 4]), cache)
    before = [s.s.copy() for s in cache.states if s is not None]
    assert not cache.truncate(2) and cache.pos == 4
    assert cache.truncate(4)  # to where it is: nothing to undo
    assert all(np.array_equal(a, s.s) for a, s in zip(before, filter(None, cache.states),
                                                       strict=True))  # fmt: skip
    cache.reset()
    assert cache.pos == 0 and not any(s.s.any() or s.conv.any() for s in cache.states if s)
    plain = random_model(SHAPES["sliding"], "f32", None).new_cache(16)
    assert plain.states == [None, None] and plain.truncate(0)


def test_a_gemma4_weight_plan_names_every_matrix():
    """bench's plan of formats by role covers the shared layers' q alone and each layer's
    per-layer input gate and projection."""
    from llama_np.model.decoder import weight_plan

    model = random_model(SHAPES["shared"], "q8_0", None)
    assert weight_plan(model.weights, model.config) == ("q8_0", "q8_0", "q8_0")
