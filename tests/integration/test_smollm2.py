"""The real checkpoint: SmolLM2-135M-Instruct as a Q4_1 GGUF, against transformers reading
the same file, and against our own f32 run of the same weights."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize, quantize

import llama_np
from llama_np.generation.chat import ChatSession, render_chat
from llama_np.generation.generate import Stats
from quant import FORMATS
from tests.helpers import backends_and_prompts, hf_greedy_logits

PROMPTS = [
    "Once upon a time, in a quiet village,",
    "The three primary colors are",
    "def fibonacci(n):",
]
N_GREEDY = 48


def pytest_generate_tests(metafunc):
    backends_and_prompts(metafunc, PROMPTS)


@pytest.fixture(scope="module")
def native(smollm2_path, kernels):
    return llama_np.load(smollm2_path, kernels=kernels)


@pytest.fixture(scope="module")
def f32(smollm2_path, kernels):
    return llama_np.load(smollm2_path, weights="f32", kernels=kernels)


def test_config_and_formats_from_gguf(native):
    c = native.config
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert (c.hidden_dim, c.vocab_size, c.rope_theta, c.tie_embeddings) == (
        1536,
        49152,
        100000.0,
        True,
    )
    w = native.model.weights
    assert w.embed.fmt == "q8_0" and w.lm_head is w.embed  # tied, kept as stored
    assert {l.wqkv.fmt for l in w.layers} == {l.w_gate_up.fmt for l in w.layers} == {"q4_1"}


def test_real_tensors_bit_exact_with_gguf(smollm2_path):
    """Our reading of real Q4_1/Q8_0 tensors equals gguf.quants; quantizing their f32
    values again reproduces gguf.quants' codes and scales byte for byte. Our reader's
    metadata (a 49,152-token vocabulary and its merges) is GGUFReader's, part for part."""
    from llama_np.io.gguf import _reader
    from tests.llama_np.io.test_gguf_reader import assert_same_fields

    reader = GGUFReader(smollm2_path)
    assert_same_fields(_reader(smollm2_path), reader)
    picked = {
        t.name: t
        for t in reader.tensors
        if t.name in ("blk.3.ffn_down.weight", "blk.0.attn_v.weight", "token_embd.weight")
    }
    for t in picked.values():
        fmt = t.tensor_type.name.lower()
        shape = (int(t.shape[1]), int(t.shape[0]))
        rows = slice(0, 512)  # the embedding is large: a slab of it
        raw = np.asarray(t.data)[rows]
        ours = FORMATS[fmt].from_blocks((raw.shape[0], shape[1]), raw)
        values = dequantize(raw, t.tensor_type)
        assert np.array_equal(ours.dequantize(), values), t.name
        assert np.array_equal(
            FORMATS[fmt].from_float(values).to_blocks(), quantize(values, t.tensor_type)
        ), t.name


def test_f32_run_matches_transformers(f32, hf_smollm2, prompt):
    """With weights dequantized to f32, 48 greedy tokens are those transformers generates
    from the same GGUF, and logits agree within 1e-3 along the whole sequence (transformers'
    run once a prompt)."""
    ids = f32.tokenize(prompt)
    stats = Stats()
    f32.generate(ids, n_predict=N_GREEDY, temp=0, stats=stats)
    theirs, ref_logits = hf_greedy_logits(hf_smollm2[0], tuple(ids), N_GREEDY)
    seq = ids + theirs
    assert stats.generated == theirs
    ours = f32.logits(seq)
    assert np.abs(ours - ref_logits).max() < 1e-3


# max |logits| difference of decode steps from the f32 run's: numba's default rounds x to
# int16 in the quantized products (seen: 0.012-0.017 on these prompts, as stored and in
# q8_0, `scripts/int8_agreement.py --kernels numba-int16`); numpy runs x in float32.
STEP_WITHIN = {"numpy": 2e-3, "numba": 0.06}


def test_native_q4_1_computes_the_same_model_as_f32(native, f32, prompt, kernels):
    """The Q4_1 model holds the very weights the f32 run holds: same greedy tokens, and
    logits on the prompt and the generated sequence (one product of all its tokens) and
    token by token within x's rounding (STEP_WITHIN: a prompt's products round x as decode
    does)."""
    ids = native.tokenize(prompt)
    a, b = Stats(), Stats()
    native.generate(ids, n_predict=N_GREEDY, temp=0, stats=a)
    f32.generate(ids, n_predict=N_GREEDY, temp=0, stats=b)
    assert a.generated == b.generated
    seq = ids + a.generated
    assert np.abs(native.logits(seq) - f32.logits(seq)).max() < STEP_WITHIN[kernels]
    cache_a, cache_b = native.new_cache(), f32.new_cache()
    for t in seq[:16]:
        diff = np.abs(native.step(t, cache_a) - f32.step(t, cache_b)).max()
        assert diff < STEP_WITHIN[kernels]


TEXTS = [
    "Hello world",
    "  Leading spaces, tabs\tand new\nlines\n\n",
    "Ünïcödé, 日本語, emoji 🦙 and punctuation!?",
    "def f(x):\n    return x ** 2  # comment",
    "<|im_start|>user\nHi<|im_end|>",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_matches_transformers_on_the_same_gguf(native, hf_smollm2, text):
    _, tok = hf_smollm2
    ids = native.tokenizer.encode(text)
    assert ids == tok.encode(text, add_special_tokens=False)  # the GGUF says: no BOS
    assert native.detokenize(ids) == tok.decode(ids, skip_special_tokens=True)


def test_digits_are_split_one_by_one_as_llama_cpp_smollm(native):
    """llama.cpp's `smollm` pre-tokenizer splits every digit (transformers' GGUF reader
    does not apply it, so this is checked on its own)."""
    ids = native.tokenizer.encode("year 2024")
    pieces = [native.tokenizer.token_text(i) for i in ids]
    assert pieces[-4:] == ["2", "0", "2", "4"]


def test_special_tokens_are_not_split(native):
    tok = native.tokenizer
    assert tok.encode("<|im_start|>") == [tok.token_id("<|im_start|>")] == [1]
    assert tok.eos_ids == (2,) and tok.token_text(2) == "<|im_end|>"


def test_chat_template_renders_as_transformers(native, hf_smollm2):
    _, tok = hf_smollm2
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Name a color."},
    ]
    ours = render_chat(native.tokenizer.chat_template, messages, "<|im_start|>", "<|im_end|>")
    theirs = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours == theirs
    assert ours.endswith("<|im_start|>assistant\n")


def test_chat_keeps_the_cache_between_turns(native, kernels):
    session = ChatSession(native, temp=0)
    first = Stats()
    "".join(session.send("Say hello.", n_predict=12, stats=first))
    second = Stats()
    reply = "".join(session.send("And goodbye?", n_predict=12, stats=second))
    full = session.prompt_ids()
    assert second.prompt_tokens < len(full) // 2  # only the new turn was prefilled
    assert reply
    # what the cache holds equals a fresh run over the whole conversation (one prefill,
    # where the replies' keys came from decode steps: numba's products round x to int16,
    # the prefill's in another order of float sums)
    cache = native.new_cache()
    native.logits(session.held, cache)
    np.testing.assert_allclose(
        native.step(full[len(session.held)], cache),
        native.step(full[len(session.held)], session.cache),
        atol=1e-4 if kernels == "numpy" else STEP_WITHIN[kernels],
    )
