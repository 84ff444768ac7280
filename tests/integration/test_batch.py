"""Batches of sequences, each with its own KV cache at its own position: every sequence of
a batch gives exactly the tokens it gives alone, and logits within float32 rounding of the
one-sequence path, on both backends, with ragged prompts, early stops and windows; the
sequences alone equal transformers."""

from __future__ import annotations

import numpy as np
import pytest

import llama_np
from llama_np.cli import main
from llama_np.errors import UsageError
from llama_np.generation.batch import BatchStats
from tests.helpers import INT16_WITHIN, build_hf_model, hf_greedy, hf_logits

KERNELS = ["numpy", "numba"]
PROMPTS = [[256, 5, 9, 77], [256, 3, 2, 8, 4, 4, 1, 60, 61, 62, 30], [256, 11], [256, 2, 2, 3]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A GQA llama with head_dim 24 (not a multiple of 16), and a Mistral whose window
    (6) is shorter than the sequences, so rings wrap at different steps per sequence."""
    d = tmp_path_factory.mktemp("batch")
    size = dict(hidden_size=96, intermediate_size=160, num_attention_heads=4,
                num_key_value_heads=2, head_dim=24)  # fmt: skip
    llama = build_hf_model("llama_gqa", d / "llama", **size)
    mistral = build_hf_model("mistral_window", d / "mistral", sliding_window=6, **size)
    return {"llama": (d / "llama", llama), "mistral": (d / "mistral", mistral)}


def stepped(llm, prompts, steps, batch: bool) -> list[np.ndarray]:
    """Teacher-forced logits after each prompt and `steps` more tokens per sequence: in one
    batch, or each sequence alone. (steps + 1, vocab) per sequence."""
    feeds = [[(7 * i + 3 * s) % 250 for s in range(steps)] for i in range(len(prompts))]
    caches = [llm.new_cache(64) for _ in prompts]
    out = [[llm.logits(p, c)[-1]] for p, c in zip(prompts, caches, strict=True)]
    for s in range(steps):
        if batch:
            logits = llm.model.step_batch(np.array([f[s] for f in feeds]), caches)
            for i in range(len(prompts)):
                out[i].append(logits[i])
        else:
            for i, c in enumerate(caches):
                out[i].append(llm.step(feeds[i][s], c))
    return [np.stack(o) for o in out]


CASES = [("llama", None), ("mistral", None), ("llama", "q8_0"), ("llama", "q4_1")]


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize(("model", "weights"), CASES)  # q-formats: llama's widths are 32-blocks
def test_a_batch_step_equals_each_sequence_alone(models, model, weights, kernels):
    d, _ = models[model]
    with llama_np.load(d, kernels=kernels, weights=weights) as llm:
        together = stepped(llm, PROMPTS, 9, batch=True)
        alone = stepped(llm, PROMPTS, 9, batch=False)
    # numba's default rounds x to int16 alone and in a batch, a batch of more than FEW
    # sequences summing its integer products in another order (quant.compiled.igemm)
    within = INT16_WITHIN if kernels == "numba" and weights != "f32" else 1e-5
    for a, b in zip(together, alone, strict=True):
        scale = max(1.0, float(np.abs(b).max()))
        assert np.abs(a - b).max() <= within * scale


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize(("model", "weights"), CASES)
def test_a_batch_of_one_is_the_one_sequence_step_bit_for_bit(models, model, weights, kernels,
                                                              monkeypatch):  # fmt: skip
    """step_batch with one sequence takes the path of `step` (on the compiled backend, the
    decoder blocks in one call): the same logits, bit for bit, and the same bytes metered."""
    d, _ = models[model]
    with llama_np.load(d, kernels=kernels, weights=weights) as llm:
        seam, done = llm.model.seam, []
        one_call = seam.decode_layers
        monkeypatch.setattr(seam, "decode_layers", lambda *a: done.append(one_call(*a)) or done[-1])
        together = stepped(llm, PROMPTS[1:2], 9, batch=True)
        assert done == [kernels == "numba"] * 9  # the compiled backend ran each step in one call
        batch_bytes = llm.model.meter.last.bytes_read
        alone = stepped(llm, PROMPTS[1:2], 9, batch=False)
        assert llm.model.meter.last.bytes_read == batch_bytes
    np.testing.assert_array_equal(together[0], alone[0])


def greedy_batch(llm, prompts: list[list[int]], n: int) -> list[list[int]]:
    """n greedy tokens per prompt, the sequences stepped together."""
    caches = [llm.new_cache(64) for _ in prompts]
    last = np.stack([llm.logits(p, c)[-1] for p, c in zip(prompts, caches, strict=True)])
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(n):
        tokens = last.argmax(axis=1)
        for o, t in zip(out, tokens, strict=True):
            o.append(int(t))
        last = llm.model.step_batch(tokens, caches)
    return out


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("model", ["llama", "mistral"])
def test_batched_greedy_tokens_are_transformers(models, model, kernels):
    d, ref = models[model]
    with llama_np.load(d, kernels=kernels) as llm:
        ours = greedy_batch(llm, PROMPTS, 12)
    assert ours == [hf_greedy(ref, p, 12) for p in PROMPTS]


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("model", ["llama", "mistral"])
def test_generate_batch_gives_each_prompt_its_text_alone(models, model, kernels):
    d, _ = models[model]
    prompts = ["ab", "a much longer prompt", "x", "abcd"]  # ragged
    with llama_np.load(d, kernels=kernels) as llm:
        together = llm.generate_batch(prompts, 12, temp=0)
        alone = [llm.generate(p, 12, temp=0) for p in prompts]
    assert together == alone


@pytest.mark.parametrize("kernels", KERNELS)
def test_sampled_sequences_use_seed_plus_index(models, kernels):
    d, _ = models["llama"]
    with llama_np.load(d, kernels=kernels) as llm:
        batch = llm.generate_batch(["ab", "cd", "ab"], 10, temp=0.9, seed=40)
        prompts = ["ab", "cd", "ab"]
        alone = [llm.generate(p, 10, temp=0.9, seed=40 + i) for i, p in enumerate(prompts)]
    assert batch == alone and batch[0] != batch[2]  # same prompt, other seed: other text


@pytest.mark.parametrize("kernels", KERNELS)
def test_a_shared_prompt_is_prefilled_once_and_copied(models, kernels):
    d, _ = models["mistral"]  # a ring: the copy must carry the wrapped slots
    prompt = "a longer prompt than the window"
    with llama_np.load(d, kernels=kernels) as llm:
        forward, prompts_run = llm.model.forward, []

        def counted(tokens, cache, all_logits=False):
            prompts_run.append(len(tokens))
            return forward(tokens, cache, all_logits)

        llm.model.forward = counted
        texts = llm.generate_batch([prompt] * 3, 8, temp=0.8, seed=7)
        assert len(prompts_run) == 1  # one prefill, then batched steps only
        llm.model.forward = forward
        alone = [llm.generate(prompt, 8, temp=0.8, seed=7 + i) for i in range(3)]
        assert texts == alone


def test_stop_strings_end_one_sequence_early(models):
    d, _ = models["llama"]
    with llama_np.load(d, kernels="numba") as llm:
        free = llm.generate_batch(["ab", "cd"], 16, temp=0)
        cut = free[0][3:5]  # a piece of the first text
        stats = BatchStats()
        texts = llm.generate_batch(["ab", "cd"], 16, temp=0, stop=[cut], stats=stats)
        alone = llm.generate("ab", 16, temp=0, stop=[cut])
    assert cut not in texts[0] and texts[0] == alone and texts[1] == free[1]
    assert stats.stop_reasons == ["stop", "length"]


def test_batch_logits_equal_transformers(models):
    d, ref = models["llama"]
    with llama_np.load(d, kernels="numba") as llm:
        caches = [llm.new_cache(32) for _ in PROMPTS]
        for p, c in zip(PROMPTS, caches, strict=True):
            llm.logits(p[:-1], c)
        logits = llm.model.step_batch(np.array([p[-1] for p in PROMPTS]), caches)
    for p, got in zip(PROMPTS, logits, strict=True):
        theirs = hf_logits(ref, p)[-1]
        assert np.abs(got - theirs).max() <= 1e-4 * max(1.0, float(np.abs(theirs).max()))


def test_a_batch_that_cannot_fit_is_refused_before_allocating(models):
    d, _ = models["llama"]
    with llama_np.load(d, kernels="numpy") as llm:
        with pytest.raises(UsageError, match=r"100000 sequences of .* need .* GB"):
            llm.generate_batch(["a"] * 100_000, 4, ctx=100_000)


def test_cli_parallel_and_prompts_file(models, tmp_path, capsys):
    d, _ = models["llama"]
    (tmp_path / "p.txt").write_text("ab\n\ncd\n")
    assert main(["generate", "-m", str(d), "-p", "xy", "-n", "5", "-np", "3", "--seed", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.count("=== sequence") == 3 and "(seed 3)" in out
    assert "3 sequences" in err and "ms/step" in err and "seeds 1..3" in err
    args = ["generate", "-m", str(d), "--prompts", str(tmp_path / "p.txt"), "-n", "4"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert out.count("=== sequence") == 2 and "'cd'" in out
    assert main([*args, "-p", "x"]) == 2
    assert "not both" in capsys.readouterr().err
