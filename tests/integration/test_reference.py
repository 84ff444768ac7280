"""llama-np against transformers (torch, CPU) on small random checkpoints built and saved
by transformers itself: prefill logits, token-by-token decode logits, greedy tokens."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import llama_np
from llama_np.generation.generate import Stats
from tests.helpers import MODELS, VOCAB, build_hf_model, hf_greedy, hf_logits

SEQ = 40
TOL = 1e-4


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (directory, transformers model), each built once: pytest orders the tests
    by backend and model in turn, and a parametrized fixture is made again each time its
    parameter comes back (most models were built twice)."""

    @functools.cache
    def build(name: str):
        directory = tmp_path_factory.mktemp(name)
        return directory, build_hf_model(name, directory)

    return build


@pytest.fixture(scope="module", params=sorted(MODELS))
def checkpoint(request, checkpoints):
    return checkpoints(request.param)


@pytest.fixture(scope="module", params=["numpy", "numba"])
def pair(request, checkpoint):
    """(llama-np model on one kernel backend, transformers model) on the same checkpoint."""
    directory, ref = checkpoint
    return llama_np.load(directory, kernels=request.param), ref


def sequence(seed: int = 1) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, SEQ).tolist()


@functools.cache  # transformers' outputs, once for both backends
def reference_logits(ref, seed: int) -> np.ndarray:
    return hf_logits(ref, sequence(seed))


@functools.cache
def reference_greedy(ref, prompt: tuple[int, ...], n: int) -> list[int]:
    return hf_greedy(ref, list(prompt), n)


def test_prefill_logits_match(pair):
    llm, ref = pair
    ids = sequence()
    ours = llm.logits(ids)
    theirs = reference_logits(ref, 1)
    assert ours.shape == theirs.shape == (SEQ, VOCAB)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, atol=TOL, rtol=0)


def test_decode_logits_match(pair):
    """One token at a time through the KV cache gives transformers' logits at every
    position (its full-sequence pass, with the window mask for Mistral)."""
    llm, ref = pair
    ids = sequence(2)
    theirs = reference_logits(ref, 2)
    cache = llm.new_cache(64)
    ours = np.stack([llm.step(t, cache) for t in ids])
    np.testing.assert_allclose(ours, theirs, atol=TOL, rtol=0)


def test_prefill_then_decode_match(pair):
    """A batched prefill followed by decode steps lands on the same logits."""
    llm, ref = pair
    ids = sequence(3)
    theirs = reference_logits(ref, 3)
    cache = llm.new_cache(64)
    first = llm.logits(ids[:13], cache)
    rest = np.stack([llm.step(t, cache) for t in ids[13:]])
    np.testing.assert_allclose(np.concatenate([first, rest]), theirs, atol=TOL, rtol=0)


def test_greedy_tokens_identical(pair):
    llm, ref = pair
    prompt = sequence(4)[:8]
    stats = Stats()
    llm.generate(prompt, n_predict=32, temp=0, stats=stats)
    assert stats.generated == reference_greedy(ref, tuple(prompt), 32)
    assert stats.stop_reason == "length"
