"""Sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeds."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from llama_np.errors import UsageError
from llama_np.generation.sampling import Sampler, SamplerSettings, candidates

LOGITS = np.log(np.array([0.5, 0.25, 0.15, 0.06, 0.04], dtype=np.float32))


def draws(n: int = 4000, **kw) -> Counter:
    s = Sampler(SamplerSettings(**{"top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 7, **kw}))
    return Counter(s(LOGITS) for _ in range(n))


def test_greedy_is_argmax():
    logits = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert Sampler(SamplerSettings(temp=0))(logits) == int(np.argmax(logits))


def test_temperature_one_follows_the_softmax():
    counts = draws(temp=1.0)
    freq = np.array([counts[i] for i in range(5)]) / 4000
    np.testing.assert_allclose(freq, [0.5, 0.25, 0.15, 0.06, 0.04], atol=0.03)


def test_low_temperature_sharpens():
    assert draws(temp=0.2)[0] > draws(temp=1.0)[0] + 1000


def test_top_k_keeps_k_best():
    assert set(draws(temp=1.0, top_k=2)) == {0, 1}
    ids, _ = candidates(LOGITS, 2, 1.0, 0.0)
    assert ids.tolist() == [0, 1]


def test_top_p_keeps_the_nucleus():
    # 0.5 + 0.25 = 0.75 < 0.8: the third token is needed to reach 0.8
    ids, _ = candidates(LOGITS, 0, 0.8, 0.0)
    assert ids.tolist() == [0, 1, 2]
    assert candidates(LOGITS, 0, 0.5, 0.0)[0].tolist() == [0]
    assert set(draws(temp=1.0, top_p=0.8)) <= {0, 1, 2}


def test_min_p_drops_unlikely_tokens():
    # min_p 0.2 of the top probability 0.5 is 0.1: keeps 0.5, 0.25, 0.15
    assert candidates(LOGITS, 0, 1.0, 0.2)[0].tolist() == [0, 1, 2]
    assert set(draws(temp=1.0, min_p=0.2)) <= {0, 1, 2}


def test_repeat_penalty_as_llama_cpp():
    """Recent tokens: a positive logit is divided by the penalty, a negative multiplied."""
    logits = np.array([2.0, 1.9, -1.0, -1.1], dtype=np.float32)
    s = Sampler(SamplerSettings(temp=0, repeat_penalty=2.0))
    assert s(logits) == 0
    s.accept(0)
    assert s(logits) == 1  # 2.0 / 2 = 1.0 < 1.9
    s2 = Sampler(SamplerSettings(temp=0, repeat_penalty=2.0))
    s2.accept(0)
    assert s2(np.array([-1.0, -1.5], np.float32)) == 1  # -1.0 * 2 = -2.0 < -1.5


def test_same_seed_same_tokens_and_different_seed_differs():
    def run(seed: int) -> list[int]:
        s = Sampler(SamplerSettings(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed))
        logits = np.zeros(1000, np.float32)
        return [s(logits) for _ in range(20)]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_unseeded_sampler_reports_its_seed():
    first = Sampler(SamplerSettings(temp=1.0, top_k=0, top_p=1.0, min_p=0.0))
    again = Sampler(SamplerSettings(seed=first.seed, temp=1.0, top_k=0, top_p=1.0, min_p=0.0))
    logits = np.zeros(100, np.float32)
    assert [first(logits) for _ in range(5)] == [again(logits) for _ in range(5)]


@pytest.mark.parametrize(
    "kw",
    [
        {"temp": -0.1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"min_p": -0.1},
        {"top_k": -1},
        {"repeat_penalty": 0.0},
        {"temp": float("nan")},
        {"temp": float("inf")},
    ],
)
def test_bad_settings_are_usage_errors(kw):
    with pytest.raises(UsageError):
        SamplerSettings(**kw)
