"""The HTTP side: OpenAI's endpoints on starlette, each request turned into engine jobs
whose events come back through an asyncio queue (streamed as server-sent events, or
gathered into one response)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llama_np.errors import LlamaNpError
from llama_np.generation.chat import chat_prompt_ids
from llama_np.serve import protocol
from llama_np.serve.engine import Engine, Job, QueueFull
from llama_np.serve.metrics import Metrics
from llama_np.serve.network import KeyCheck, Limits, read_body
from llama_np.serve.protocol import ApiError, Request

RETRY_AFTER_S = 1  # what a client told "queue full" is asked to wait
POLL_S = 0.25  # how often a non-streamed request checks that its client is still there
DEFAULT_LIMITS = Limits()


class Server:
    """What the routes share: the engine, the served model's name and its limits."""

    def __init__(self, engine: Engine, model_id: str, metrics: Metrics,
                 limits: Limits = DEFAULT_LIMITS) -> None:  # fmt: skip
        self.engine, self.model_id, self.metrics = engine, model_id, metrics
        self.llm, self.ctx, self.created = engine.llm, engine.ctx, int(time.time())
        self.limits = limits
        self.max_tokens = min(limits.max_tokens or engine.ctx, engine.ctx)
        self.max_n = min(limits.max_n or engine.slots, engine.slots)
        self.shutting_down = False

    def prompt_ids(self, req: Request) -> list[int]:
        try:
            if req.chat:
                return chat_prompt_ids(self.llm, req.prompt)
            if isinstance(req.prompt, str):
                return self.llm.tokenize(req.prompt)
        except LlamaNpError as e:  # no chat template; a template that fails
            raise ApiError(400, str(e), "messages" if req.chat else "prompt") from None
        vocab = self.llm.config.vocab_size
        if not all(0 <= t < vocab for t in req.prompt):
            raise ApiError(400, f"'prompt' holds token ids outside 0..{vocab - 1}", "prompt")
        return list(req.prompt)

    def jobs(self, req: Request, ids: list[int]) -> list[Job]:
        """One job per choice; choice i samples with seed + i (as `generate -np`)."""
        if len(ids) > self.ctx:
            what = "messages" if req.chat else "prompt"
            raise ApiError(400, f"This model's maximum context length is {self.ctx} tokens. "
                           f"However, your {what} resulted in {len(ids)} tokens. Please "
                           f"reduce the length of the {what}.", what,
                           "context_length_exceeded")  # fmt: skip
        s = req.sampling
        return [Job(ids, s if s.seed is None else replace(s, seed=s.seed + i),
                    req.max_tokens or self.max_tokens, req.stop, req.ignore_eos)
                for i in range(req.n)]  # fmt: skip

    def submit(self, jobs: list[Job], events: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        for i, job in enumerate(jobs):
            job.emit = lambda e, i=i: _put(loop, events, (i, e))
        try:
            if self.shutting_down:
                raise QueueFull("the server is shutting down")
            for job in jobs:
                self.engine.submit(job)
        except QueueFull as e:
            for job in jobs:
                job.cancel()
            raise ApiError(503, f"the server is busy: {e}; retry later", code="server_busy",
                           kind="server_error",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None  # fmt: skip


def _put(loop: asyncio.AbstractEventLoop, q: asyncio.Queue, item: Any) -> None:
    """From the engine's thread; a closed loop (the server stopped) has nobody to tell."""
    try:
        loop.call_soon_threadsafe(q.put_nowait, item)
    except RuntimeError:
        pass


class Guard:
    """The outermost of the app's own layers: every request gets an id (the `x-request-id`
    header, and the completion's id ends with it). A client that goes away before its body
    arrived is ordinary: nothing is logged (uvicorn's access log, when on, has its line). An
    exception of ours is one line on stderr naming the request, its traceback only when
    `verbose`, and a 500 in OpenAI's shape if the response had not started: never uvicorn's
    45-line traceback per request, which a slow reader of the log turns into a stalled
    server."""

    def __init__(self, app: ASGIApp, verbose: bool = False) -> None:
        self.app, self.verbose = app, verbose

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = protocol.new_hex()
        scope.setdefault("state", {})["request_id"] = rid
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []),
                                      (b"x-request-id", rid.encode())]  # fmt: skip
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except ClientDisconnect:
            return
        except Exception as e:
            where = f"{scope.get('method', '')} {scope.get('path', '')}"
            print(f"llama-np: request {rid} ({where}) failed: {type(e).__name__}: {e}",
                  file=sys.stderr, flush=True)  # fmt: skip
            if self.verbose:
                traceback.print_exc(file=sys.stderr)
            if not started:
                body = ApiError(500, f"internal error in request {rid}; the server's log names "
                                "it", kind="server_error").body()  # fmt: skip
                await JSONResponse(body, 500)(scope, receive, sending)


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), e.status, headers=e.headers)


async def generate(server: Server, http: HttpRequest, chat: bool) -> Response:
    try:
        try:
            body = json.loads(await read_body(http, server.limits.max_body))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}") from None
        req = protocol.parse(body, chat, server.model_id, server.max_n, server.max_tokens)
        ids = server.prompt_ids(req)
        jobs = server.jobs(req, ids)
        events: asyncio.Queue = asyncio.Queue()
        server.submit(jobs, events)
    except ApiError as e:
        return error_response(e)
    rid = protocol.new_id(chat, http.state.request_id)
    if req.stream:
        stream = sse(req, rid, jobs, events, len(ids))
        return StreamingResponse(stream, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})  # fmt: skip
    return await gather(http, req, rid, jobs, events, len(ids))


async def gather(http: HttpRequest, req: Request, rid: str, jobs: list[Job],
                 events: asyncio.Queue, n_prompt: int) -> Response:  # fmt: skip
    """Every choice whole; a client gone before they are done cancels them."""
    texts, reasons = [""] * len(jobs), [""] * len(jobs)
    completion, left = 0, len(jobs)
    try:
        while left:
            try:
                i, e = await asyncio.wait_for(events.get(), POLL_S)
            except TimeoutError:
                if await http.is_disconnected():
                    return Response(status_code=499)
                continue
            if e.kind == "error":
                return error_response(ApiError(500, e.text, kind="server_error"))
            texts[i] += e.text
            if e.kind == "done":
                reasons[i], left, completion = e.reason, left - 1, completion + e.completion_tokens
    finally:
        for job in jobs:
            job.cancel()  # nothing for those already done
    return JSONResponse(protocol.response(req, rid, texts, reasons, n_prompt,
                                          completion))  # fmt: skip


async def sse(req: Request, rid: str, jobs: list[Job], events: asyncio.Queue,
              n_prompt: int) -> AsyncIterator[str]:  # fmt: skip
    """Server-sent events as OpenAI's clients read them, ending with `data: [DONE]`. A
    client that goes away cancels the stream here (starlette), and so its jobs."""
    try:
        if req.chat:
            for i in range(len(jobs)):
                yield _data(protocol.chunk(req, rid, i, "", role=True))
        completion, left = 0, len(jobs)
        while left:
            i, e = await events.get()
            if e.kind == "error":
                yield _data(ApiError(500, e.text, kind="server_error").body())
                return
            if e.kind == "text":
                yield _data(protocol.chunk(req, rid, i, e.text))
            else:
                completion, left = completion + e.completion_tokens, left - 1
                yield _data(protocol.chunk(req, rid, i, reason=e.reason))
        if req.include_usage:
            yield _data(protocol.usage_chunk(req, rid, n_prompt, completion))  # the prompt once
        yield "data: [DONE]\n\n"
    finally:
        for job in jobs:
            job.cancel()


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def create_app(engine: Engine, model_id: str, metrics: Metrics, verbose: bool = False,
               keys: tuple[str, ...] = (),
               limits: Limits = DEFAULT_LIMITS) -> Starlette:  # fmt: skip
    """The routes behind a Guard (`verbose`: a failed request's traceback on stderr) and,
    when `keys` are given, a KeyCheck on /v1/*; each request held to `limits`."""
    server = Server(engine, model_id, metrics, limits)

    async def completions(http: HttpRequest) -> Response:
        return await generate(server, http, chat=False)

    async def chat_completions(http: HttpRequest) -> Response:
        return await generate(server, http, chat=True)

    async def models(http: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": model_id, "object": "model", "created": server.created,
             "owned_by": "llama-np", "llama_np": metrics.model_info()}]})  # fmt: skip

    async def health(http: HttpRequest) -> Response:
        c = engine.counters
        body = {"status": "shutting down" if server.shutting_down else "ok",
                "slots_idle": engine.slots - c.running, "slots_processing": c.running,
                "requests_waiting": c.waiting}  # fmt: skip
        return JSONResponse(body, 503 if server.shutting_down else 200)

    async def prometheus(http: HttpRequest) -> Response:
        return PlainTextResponse(metrics.text(), media_type=metrics.content_type)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        """Whoever runs the app runs the engine's loop (`Engine.run` or `start`); once the
        server has stopped (its requests done or cancelled), the loop ends."""
        try:
            yield
        finally:
            server.shutting_down = True
            engine.stop()

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ]
    layers = [Middleware(Guard, verbose=verbose)]
    if keys:
        layers.append(Middleware(KeyCheck, keys=keys))
    app = Starlette(routes=routes, lifespan=lifespan, middleware=layers,
                    exception_handlers={404: _not_found, 405: _not_allowed})  # fmt: skip
    app.state.server = server
    return app


async def _not_found(http: HttpRequest, exc: Exception) -> Response:
    return error_response(ApiError(404, f"no such endpoint: {http.url.path}", code="not_found"))


async def _not_allowed(http: HttpRequest, exc: Exception) -> Response:
    return error_response(ApiError(405, f"{http.method} is not allowed on {http.url.path}"))
