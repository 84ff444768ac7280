"""The server's prompt cache (Engine's cache_prompt, llama-server's): a request keeps what
its slot's cache holds of its prompt's beginning and prefills the rest, in the free slot
holding the most of it; the text is what `generate` gives the prompt alone. A tiny random
checkpoint (bench.soak), NumPy kernels, the app in-process (httpx's ASGI transport)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import llama_np
from bench.soak import tiny_checkpoint
from llama_np.generation.generate import Stats
from llama_np.serve.app import create_app
from llama_np.serve.engine import Engine
from llama_np.serve.metrics import Metrics

N = 8
FIRST = "The quiet river ran past the mill and"
OTHER = "A different prompt altogether"


def complete(app, prompts: list) -> list[str]:
    """Each prompt's greedy text, one request after another."""

    async def go() -> list[str]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            out = []
            for p in prompts:
                r = await client.post("/v1/completions", timeout=60, json={
                    "model": "tiny", "prompt": p, "max_tokens": N, "temperature": 0})  # fmt: skip
                assert r.status_code == 200, r.text
                out.append(r.json()["choices"][0]["text"])
            return out

    return asyncio.run(go())


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    with llama_np.load(tiny_checkpoint(tmp_path_factory.mktemp("tiny")), kernels="numpy") as llm:
        yield llm


def serve(llm, slots: int, prompts: list, cache_prompt: bool = True) -> tuple[list, Engine]:
    engine = Engine(llm, slots, 128, cache_prompt=cache_prompt)
    app = create_app(engine, "tiny", Metrics(engine, None, None))
    engine.start()
    try:
        return complete(app, prompts), engine
    finally:
        engine.stop()


def test_a_repeated_prompt_prefills_only_its_last_token(llm):
    ids = llm.tokenize(FIRST)
    alone = llm.generate(ids, N, temp=0)
    texts, engine = serve(llm, 1, [FIRST, FIRST])
    assert texts == [alone, alone]
    assert engine.counters.prompt_cached == len(ids) - 1  # the last one is run for its logits
    assert engine.counters.prompt_tokens == len(ids) + 1


def test_a_longer_prompt_keeps_the_shared_beginning_and_its_reply(llm):
    """The first sequence's prompt and the tokens it fed back are in the cache: a prompt
    that continues them (token ids) prefills only what is new."""
    stats, ids = Stats(), llm.tokenize(FIRST)
    first = llm.generate(ids, N, temp=0, stats=stats)
    assert len(stats.generated) == N  # (ended by length: its last token never fed)
    longer = ids + stats.generated + llm.tokenize(" then")
    texts, engine = serve(llm, 1, [ids, longer])
    assert texts == [first, llm.generate(longer, N, temp=0)]
    assert engine.counters.prompt_cached == len(ids) + N - 1


def test_a_request_goes_to_the_slot_holding_its_prompt(llm):
    """Two slots: the second request (another prompt) takes the free one, the third (the
    first's prompt again) the first's slot, whose cache holds it."""
    texts, engine = serve(llm, 2, [FIRST, OTHER, FIRST])
    assert texts[0] == texts[2]
    assert engine.counters.prompt_cached == len(llm.tokenize(FIRST)) - 1


def test_without_the_cache_every_prompt_is_prefilled_whole(llm):
    texts, engine = serve(llm, 1, [FIRST, FIRST], cache_prompt=False)
    assert texts[0] == texts[1]
    assert engine.counters.prompt_cached == 0
    assert engine.counters.prompt_tokens == 2 * len(llm.tokenize(FIRST))


def test_the_endpoint_benchmarks_prompts_share_no_more_than_a_word():
    """bench --endpoint's prompts (its warm-up's, and rounds of up to 64 requests) begin
    differently from their first or second word, so a prompt cache, ours or
    llama-server's, serves none of them from another (they once repeated every 66)."""
    from bench.endpoint import prompt_text

    prompts = [prompt_text(32, i) for i in [10_000, *range(1000)]]
    assert len({tuple(p.split()[:2]) for p in prompts}) == len(prompts)
