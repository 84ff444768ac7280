"""The engine's warm-up, without a real model: which batched steps it runs, on what."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from llama_np.serve.engine import WARM, Engine


class Model:
    def __init__(self) -> None:
        self.steps: list[tuple[int, list]] = []

    def step_batch(self, tokens: np.ndarray, caches: list) -> np.ndarray:
        self.steps.append((len(tokens), caches))
        return np.zeros((len(tokens), 8), np.float32)


@pytest.mark.parametrize("slots", [1, 2, 3, WARM + 2])
def test_warm_up_steps_each_batch_size_once(slots: int) -> None:
    made = []
    model = Model()
    llm = SimpleNamespace(model=model, tokenizer=SimpleNamespace(eos_ids=[0]),
                          config=SimpleNamespace(eos_ids=[0]),
                          new_cache=lambda *a: made.append(a) or object())  # fmt: skip
    Engine(llm, slots, ctx=64, kv="f16", window=16).warm_up()
    assert [b for b, _ in model.steps] == list(range(2, min(slots, WARM) + 1))
    assert all(len(caches) == b and len(set(map(id, caches))) == b for b, caches in model.steps)
    assert all(a == (2, 16, "f16") for a in made)  # scratch caches in the engine's format
