"""The app's outermost layer (serve.app.Guard), on toy ASGI apps: a client gone before its
body arrived logs nothing; an exception of ours is one line naming the request (its
traceback only when verbose) and a 500 in OpenAI's shape; every response carries its id."""

from __future__ import annotations

import asyncio

import httpx
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from llama_np.serve.app import Guard


def call(app, verbose: bool = False) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=Guard(app, verbose))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/completions", json={"prompt": "x"})

    return asyncio.run(go())


async def fails(scope, receive, send):
    raise RuntimeError("a bug of ours")


async def fine(scope, receive, send):
    await JSONResponse({"ok": scope["state"]["request_id"]})(scope, receive, send)


def test_an_exception_of_ours_is_one_line_and_a_500(capsys):
    r = call(fails)
    rid = r.headers["x-request-id"]
    assert r.status_code == 500 and rid in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "server_error"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and rid in err and "RuntimeError: a bug of ours" in err
    assert "Traceback" not in err


def test_verbose_adds_the_traceback(capsys):
    call(fails, verbose=True)
    err = capsys.readouterr().err
    assert "Traceback" in err and "a bug of ours" in err


def test_a_client_gone_before_its_body_logs_nothing(capsys):
    async def gone(scope, receive, send):
        raise ClientDisconnect()

    async def go() -> list:
        sent = []

        async def receive():
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
        await Guard(gone)(scope, receive, send)
        return sent

    assert asyncio.run(go()) == []  # nothing to answer: the client is gone
    assert capsys.readouterr().err == ""


def test_each_response_carries_its_request_id():
    r = call(fine)
    assert r.status_code == 200 and r.json()["ok"] == r.headers["x-request-id"]
