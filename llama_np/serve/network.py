"""What the server needs on a network: API keys on the /v1 routes, a bounded request body,
and a deadline for a request to arrive (uvicorn's h11 protocol has none: a client sending
its headers a byte a second held a connection for ever).

    Limits        the bounds a request meets, with their defaults
    KeyCheck      ASGI layer: /v1/* needs `Authorization: Bearer KEY`; /health, /metrics open
    read_body     a request's body, refused past a size (413) before it is all read
    timed_h11     uvicorn's h11 protocol with a deadline for each request to arrive whole
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

import h11
import uvicorn
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from llama_np.errors import UsageError
from llama_np.serve.protocol import ApiError

KEY_ENV = "LLAMA_NP_API_KEY"
MAX_BODY = 4 << 20  # bytes: a 128k-token context as JSON token ids is about 1 MB
REQUEST_TIMEOUT = 30.0  # seconds for a request's headers and body to arrive
IDLE_TIMEOUT = 5.0  # seconds a kept-alive connection may idle (uvicorn's default)


@dataclass(frozen=True)
class Limits:
    """What one request may ask and how long a client may take to ask it. `max_tokens` and
    `max_n` None: the slot's context and the slots."""

    max_tokens: int | None = None
    max_n: int | None = None
    max_body: int = MAX_BODY
    request_timeout: float = REQUEST_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT


def load_keys(key: str | None, key_file: str | None) -> tuple[str, ...]:
    """The keys a client may send: --api-key (else $LLAMA_NP_API_KEY) and a file's, one a
    line (blank lines and # comments skipped). Empty: no key is asked."""
    keys = [key] if key is not None else [os.environ[KEY_ENV]] if os.environ.get(KEY_ENV) else []
    if key_file is not None:
        try:
            lines = Path(key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            why = getattr(e, "strerror", None) or e
            raise UsageError(f"--api-key-file {key_file}: {why}") from None
        file_keys = [k.strip() for k in lines if k.strip() and not k.strip().startswith("#")]
        if not file_keys:
            raise UsageError(f"--api-key-file {key_file} holds no key")
        keys += file_keys
    for k in keys:  # the key itself is never printed
        if not k or not k.isascii() or not k.isprintable() or any(c.isspace() for c in k):
            raise UsageError("an API key must be printable ASCII without spaces, and not empty")
    return tuple(dict.fromkeys(keys))


def _digest(key: bytes) -> bytes:
    """Keys are compared as digests: compare_digest then takes the same time whatever the
    lengths, so a wrong key's timing does not tell the right one's length either."""
    return hashlib.sha256(key).digest()


class KeyCheck:
    """Every /v1 route answers only a client that sends one of `keys` as a Bearer token; a
    missing or wrong key gets OpenAI's 401. /health and /metrics stay open (a load
    balancer's probe and Prometheus carry no key). Nothing here logs the header."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...]) -> None:
        self.app, self.digests = app, [_digest(k.encode()) for k in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == "/v1" or path.startswith("/v1/")):
            error = self.refusal(dict(scope["headers"]).get(b"authorization"))
            if error is not None:
                headers = {"WWW-Authenticate": "Bearer"}
                await JSONResponse(error.body(), 401, headers=headers)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, header: bytes | None) -> ApiError | None:
        """None when `header` carries a key; else the error (which never quotes it)."""
        scheme, _, token = (header or b"").strip().partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return ApiError(401, "You didn't provide an API key: send it in an Authorization "
                            "header, 'Authorization: Bearer KEY'",
                            code="invalid_api_key")  # fmt: skip
        given = _digest(token.strip())
        ok = False
        for d in self.digests:  # every key compared, none skipped: the same time for each
            ok |= hmac.compare_digest(d, given)
        if ok:
            return None
        return ApiError(401, "Incorrect API key provided", code="invalid_api_key")


async def read_body(http: HttpRequest, limit: int) -> bytes:
    """The body, or a 413 as soon as it is known to pass `limit` bytes: from its
    Content-Length before reading any of it, else while it streams in. The 413 closes the
    connection, so the rest of the body is never read."""
    length = http.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large(limit)
    chunks, size = [], 0
    async for chunk in http.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than this server's limit of {limit} "
                    "bytes", code="request_too_large", headers={"Connection": "close"})  # fmt: skip


def timed_h11(request_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, with a deadline: a request must arrive whole (headers and
    body) within `request_timeout` seconds of the connection, or of its own first byte on
    a kept-alive connection; past it the connection is closed. The idle time between two
    requests is uvicorn's keep-alive timeout's."""

    class TimedH11(H11Protocol):
        deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self.deadline is None and self._arriving():
                self._arm()
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            if not self._arriving():
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arriving(self) -> bool:
            """A request is on its way, not yet whole."""
            return self.conn.their_state in (h11.IDLE, h11.SEND_BODY)

        def _arm(self) -> None:
            self.deadline = self.loop.call_later(request_timeout, self._expired)

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def _expired(self) -> None:
            self.deadline = None
            if self._arriving() and not self.transport.is_closing():
                self.transport.close()

    return TimedH11


def uvicorn_config(app: ASGIApp, limits: Limits, verbose: bool = False,
                   shutdown_timeout: float | None = None) -> uvicorn.Config:  # fmt: skip
    """uvicorn's settings for `app`: the h11 protocol with `limits`' request deadline, its
    keep-alive timeout as the idle one; request lines and headers at most h11's 16 KiB."""
    return uvicorn.Config(app, log_level="info" if verbose else "warning",
                          http=timed_h11(limits.request_timeout),
                          timeout_keep_alive=limits.idle_timeout,  # type: ignore[arg-type]
                          timeout_graceful_shutdown=shutdown_timeout)  # fmt: skip
