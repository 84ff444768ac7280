"""The engine's warm-up, without a real model: which batched steps it runs, on what."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from llama_np.serve.engine import WARM, Engine


class Model:
    def __init__(self) -> None:
        self.warmed: list[tuple[str, list[int]]] = []

    def warm_up(self, kv: str, batches) -> None:
        self.warmed.append((kv, list(batches)))


@pytest.mark.parametrize("slots", [1, 2, 3, WARM + 2])
def test_warm_up_steps_each_batch_size_once(slots: int) -> None:
    """The engine has the model run a step of each batch size it will step (up to WARM),
    on caches in its KV format (Transformer.warm_up: tests/llama_np/model/test_warmup.py)."""
    model = Model()
    llm = SimpleNamespace(model=model, tokenizer=SimpleNamespace(eos_ids=[0]),
                          config=SimpleNamespace(eos_ids=[0]))  # fmt: skip
    Engine(llm, slots, ctx=64, kv="f16", window=16).warm_up()
    assert model.warmed == [("f16", list(range(2, min(slots, WARM) + 1)))]
