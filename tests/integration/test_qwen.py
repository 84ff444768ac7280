"""The real 0.5B model: Qwen2.5-Coder-0.5B-Instruct as a Q4_K_M GGUF (Q5_0, Q8_0, Q6_K, Q4_K
and F32 tensors), against transformers reading the same file, and against our own f32 run
of the same weights, on both kernel backends."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

import llama_np
from llama_np.generation.chat import render_chat
from llama_np.generation.generate import Stats
from quant import FORMATS
from tests.helpers import backends_and_prompts, hf_greedy_logits

PROMPTS = ["def quicksort(arr):", "# Read a CSV file with pandas and print its columns\n"]
N_GREEDY = 24


def pytest_generate_tests(metafunc):
    backends_and_prompts(metafunc, PROMPTS)


@pytest.fixture(scope="module")
def native(qwen_path, kernels):
    return llama_np.load(qwen_path, kernels=kernels)


@pytest.fixture(scope="module")
def f32(qwen_path, kernels):
    return llama_np.load(qwen_path, weights="f32", kernels=kernels)


def test_config_and_formats_from_gguf(native):
    c = native.config
    assert (c.arch, c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim) == (
        "qwen2", 24, 896, 14, 2, 64,
    )  # fmt: skip
    assert (c.hidden_dim, c.vocab_size, c.rope_theta, c.tie_embeddings, c.qkv_bias) == (
        4864, 151936, 1e6, False, True,
    )  # fmt: skip
    w = native.model.weights
    assert (w.embed.fmt, w.lm_head.fmt) == ("q5_0", "q8_0")
    assert {l.w_down.fmt for l in w.layers} == {"q4_k", "q6_k"}  # kept as stored
    assert {l.wqkv.fmt for l in w.layers} == {"q5_0", "q5_0+q5_0+q8_0"}


@functools.cache  # the same for both backends
def gguf_tensors(path: str) -> dict[str, tuple]:
    """A few real Q5_0, Q8_0, Q6_K and Q4_K tensors: name -> (format, shape, stored blocks,
    gguf.quants' dequantization)."""
    names = ("blk.0.ffn_down.weight", "blk.2.ffn_down.weight", "blk.0.attn_v.weight",
             "blk.1.attn_v.weight", "blk.5.ffn_gate.weight")  # fmt: skip
    out = {}
    for t in GGUFReader(path).tensors:
        if t.name in names:
            shape = (int(t.shape[1]), int(t.shape[0]))
            raw = np.asarray(t.data).reshape(shape[0], -1)
            out[t.name] = (t.tensor_type.name.lower(), shape, raw, dequantize(raw, t.tensor_type))
    return out


def test_real_tensors_bit_exact_with_gguf(qwen_path, kernels):
    """Our reading of real Q5_0, Q8_0, Q6_K and Q4_K tensors equals gguf.quants'."""
    from quant.backends import get_backend

    seen = set()
    for name, (fmt, shape, raw, want) in gguf_tensors(str(qwen_path)).items():
        ours = get_backend(kernels).weight_class(fmt).from_blocks(shape, raw)
        assert np.array_equal(ours.dequantize(), want), name
        seen.add(fmt)
    assert seen == {"q5_0", "q8_0", "q6_k", "q4_k"}
    assert FORMATS["q6_k"].bits_per_weight == 6.5625 and FORMATS["q4_k"].bits_per_weight == 4.5


def test_f32_run_matches_transformers(f32, hf_qwen, prompt):
    """Weights dequantized to f32: the greedy tokens transformers generates from the same
    GGUF, logits within 1e-3 along the whole sequence (transformers' run once a prompt)."""
    ids = f32.tokenize(prompt)
    stats = Stats()
    f32.generate(ids, n_predict=N_GREEDY, temp=0, stats=stats)
    theirs, ref_logits = hf_greedy_logits(hf_qwen[0], tuple(ids), N_GREEDY)
    seq = ids + theirs
    assert stats.generated == theirs
    assert np.abs(f32.logits(seq) - ref_logits).max() < 1e-3


# max |logits| difference of decode steps from the f32 run's: numba's default rounds x to
# int16 in the quantized products (seen: 0.003-0.005 on these prompts, as stored and in
# q8_0, `scripts/int8_agreement.py --kernels numba-int16`); numpy runs x in float32.
STEP_WITHIN = {"numpy": 2e-3, "numba": 0.02}
# the NumPy reference's K-quant products take 1-2 s a token of this model: its run of the
# stored formats generates fewer tokens (its products are checked bit for bit against
# gguf.quants above; its f32 run against transformers on all N_GREEDY)
N_NUMPY = 8


def test_native_computes_the_same_model_as_f32(native, f32, prompt, kernels):
    """K-quants and Q5_0 kept as stored: the same greedy tokens as the f32 run (N_NUMPY on
    the NumPy reference), logits of the whole sequence (one product of its tokens) and
    token by token within x's rounding (STEP_WITHIN: a prompt's products round x as
    decode does)."""
    ids = native.tokenize(prompt)
    a, b = Stats(), Stats()
    n = N_GREEDY if kernels == "numba" else N_NUMPY
    native.generate(ids, n_predict=n, temp=0, stats=a)
    f32.generate(ids, n_predict=n, temp=0, stats=b)
    assert a.generated == b.generated
    seq = ids + a.generated
    assert np.abs(native.logits(seq) - f32.logits(seq)).max() < STEP_WITHIN[kernels]
    cache_a, cache_b = native.new_cache(), f32.new_cache()
    for t in seq[:8]:
        diff = np.abs(native.step(t, cache_a) - f32.step(t, cache_b)).max()
        assert diff < STEP_WITHIN[kernels]


TEXTS = [
    "def f(x):\n    return x ** 2  # 12345",
    "  Leading spaces, tabs\tand new\nlines\n\n",
    "Ünïcödé, 日本語, emoji 🦙!",
    "<|im_start|>user\nHi<|im_end|>",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_matches_transformers(native, hf_qwen, text):
    _, tok = hf_qwen
    ids = native.tokenizer.encode(text)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert native.detokenize(ids) == tok.decode(ids, skip_special_tokens=True)


def test_chat_template_has_its_default_system_prompt(native, hf_qwen):
    _, tok = hf_qwen
    messages = [{"role": "user", "content": "Write hello world in C."}]
    ours = render_chat(native.tokenizer.chat_template, messages, "", "<|im_end|>")
    assert ours == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "You are Qwen, created by Alibaba Cloud" in ours


def test_the_meter_counts_what_the_mixed_model_predicts(native, kernels):
    """A file that mixes formats per layer: the speed-of-light model, given each matrix's
    format, counts the bytes the meter counts, category by category."""
    from bench.sol import estimate
    from llama_np.model.decoder import weight_plan

    layers, head, embed = weight_plan(native.model.weights, native.config)
    assert not isinstance(layers, str)  # q5_0 and q8_0 for v, q4_k and q6_k for down
    cache = native.new_cache(64)
    native.logits(native.tokenize("x = 1"), cache)
    native.step(5, cache)
    step = native.model.meter.last
    est = estimate(native.config, layers, pos=step.pos, head=head, embed=embed, kernels=kernels)
    assert step.reads == est.reads
