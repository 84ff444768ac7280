"""/v1/chat/completions on a model whose chat template comes from its file: Gemma 4's GGUF
made by llama.cpp's converter (tests/fixtures/families/gemma4), NumPy kernels, through the
app in-process (httpx's ASGI transport): the reply is what `generate` gives the rendered
conversation alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

import llama_np
from llama_np.generation.chat import chat_prompt_ids
from llama_np.serve.app import create_app
from llama_np.serve.engine import Engine
from llama_np.serve.metrics import Metrics

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "families" / "gemma4" / "gemma4.gguf"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "And now?"},
]
N = 6


def post(app, body: dict) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/chat/completions", json=body, timeout=60)

    return asyncio.run(go())


def test_chat_completions_answer_on_gemma4s_own_template():
    with llama_np.load(FIXTURE, kernels="numpy") as llm:
        ids = chat_prompt_ids(llm, MESSAGES)
        alone = llm.generate(ids, N, temp=0)
        engine = Engine(llm, 1, 128)
        app = create_app(engine, "gemma4", Metrics(engine, None, None))
        engine.start()
        try:
            r = post(app, {"model": "gemma4", "messages": MESSAGES, "max_tokens": N,
                           "temperature": 0})  # fmt: skip
        finally:
            engine.stop()
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": alone}
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert body["usage"]["completion_tokens"] <= N
