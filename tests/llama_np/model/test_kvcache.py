"""The KV cache: a rolling window with bounded memory that matches transformers' Mistral,
and a full-attention cache that stops cleanly when the context is full."""

from __future__ import annotations

import numpy as np
import pytest

import llama_np
from llama_np.generation.generate import Stats
from llama_np.model.kvcache import ContextFull
from llama_np.model.ops import attention, causal_mask
from tests.helpers import VOCAB, build_hf_model, hf_logits


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("mistral")
    return d, build_hf_model("mistral_window", d)  # window 8


@pytest.fixture(scope="module", params=["numpy", "numba"])
def mistral(request, mistral_dir):
    """The ring wraps many times in 40 tokens, on both kernel backends."""
    d, ref = mistral_dir
    return llama_np.load(d, kernels=request.param), ref


def test_chunked_prefill_across_the_window_matches_transformers(mistral):
    """Batches that start mid-ring and wrap it: 5 tokens, then 20, then 3, then decode."""
    llm, ref = mistral
    ids = np.random.default_rng(5).integers(0, VOCAB, 40).tolist()
    cache = llm.new_cache()
    parts = [
        llm.logits(ids[:5], cache),
        llm.logits(ids[5:25], cache),
        llm.logits(ids[25:28], cache),
    ]
    parts.append(np.stack([llm.step(t, cache) for t in ids[28:]]))
    np.testing.assert_allclose(np.concatenate(parts), hf_logits(ref, ids), atol=1e-4, rtol=0)


def test_window_memory_is_bounded(mistral):
    llm, _ = mistral
    cache = llm.new_cache()
    size = cache.nbytes
    assert cache.slots == 8
    for t in range(50):
        llm.step(t % VOCAB, cache)
    assert cache.nbytes == size
    assert cache.pos == 50 and cache.room() is None


def test_each_step_attends_to_exactly_the_last_window(mistral):
    """The ring's content is the last W keys: attending to it equals attending to the
    full history under the window mask."""
    llm, _ = mistral
    window = llm.new_cache()
    full = llm.new_cache(window=10_000)  # the same model, everything kept
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, 30).tolist()
    for t in ids:
        llm.step(t, window)
        llm.step(t, full)
    n_kv, hd = llm.config.n_kv_heads, llm.config.head_dim
    q = rng.standard_normal((1, llm.config.n_heads, hd)).astype(np.float32)
    k_full, v_full = full.k[0].load(0, 30), full.v[0].load(0, 30)
    mask = causal_mask(np.array([29]), np.arange(30), 8)
    expected = attention(q, k_full, v_full, mask)
    got = attention(q, window.k[0].load(0, 8), window.v[0].load(0, 8))
    assert window.k[0].load(0, 8).shape == (n_kv, 8, hd)
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_forced_window_on_llama_continues_past_the_window(gqa_dir):
    llm = llama_np.load(gqa_dir[0])
    stats = Stats()
    text = llm.generate([1, 2, 3], n_predict=60, temp=0, window=16, stats=stats)
    assert len(stats.generated) == 60 and stats.stop_reason == "length"
    assert isinstance(text, str)


def test_full_attention_stops_at_the_context_size(gqa_dir):
    llm = llama_np.load(gqa_dir[0])
    stats = Stats()
    llm.generate([1, 2, 3], n_predict=100, temp=0, ctx=20, stats=stats)
    assert stats.stop_reason == "context"
    assert stats.prompt_tokens + stats.decode_steps == 20
    cache = llm.new_cache(ctx=4)
    llm.logits([1, 2, 3, 4], cache)
    with pytest.raises(ContextFull, match="context full"):
        llm.step(5, cache)


def test_a_prompt_longer_than_the_context_is_refused(gqa_dir):
    llm = llama_np.load(gqa_dir[0])
    with pytest.raises(llama_np.UsageError, match="context size 8"):
        llm.generate(list(range(10)), n_predict=4, ctx=8)
