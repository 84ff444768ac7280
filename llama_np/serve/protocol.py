"""OpenAI's request and response bodies: a request checked field by field into what the
engine runs (`Request`), and the JSON objects OpenAI's clients read back (completions,
chat completions, their streamed chunks, errors).

Sampling follows llama.cpp's server: a field left out takes llama-np's default (temperature
0.8, top_k 40, top_p 0.95, min_p 0.05), and top_k, min_p, repeat_penalty and ignore_eos are
accepted beside OpenAI's fields. Unknown fields are ignored, as llama.cpp's server does;
a known field of the wrong type or out of range is a 400 naming it.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from llama_np.errors import UsageError
from llama_np.generation.sampling import SamplerSettings

MAX_STOPS = 4  # OpenAI's limit


class ApiError(Exception):
    """An error OpenAI's clients understand: an HTTP status and OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.code}}  # fmt: skip


@dataclass
class Request:
    """What a completion or chat request asks of the engine."""

    model: str
    prompt: str | list[int]  # text, or token ids (completions only)
    sampling: SamplerSettings
    max_tokens: int | None  # None: until the context is full
    stop: tuple[str, ...]
    n: int
    stream: bool
    include_usage: bool
    ignore_eos: bool
    chat: bool


def _get(body: dict, name: str, types: type | tuple[type, ...], default: Any = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    # JSON has one kind of number: 1.0 is an integer where an integer is asked
    if types is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ApiError(400, f"'{name}' must be of type {_name(types)}, not a boolean", name)
    if not isinstance(value, types):
        raise ApiError(400, f"'{name}' must be of type {_name(types)}, got "
                       f"{type(value).__name__}", name)  # fmt: skip
    if isinstance(value, float) and not math.isfinite(value):
        raise ApiError(400, f"'{name}' must be a finite number", name)
    return value


def _name(types: type | tuple[type, ...]) -> str:
    names = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array",
             dict: "object"}  # fmt: skip
    ts = types if isinstance(types, tuple) else (types,)
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in ts))


NUMBER = (int, float)


def parse(body: Any, chat: bool, model: str, max_n: int,
          max_tokens_limit: int | None = None) -> Request:  # fmt: skip
    """Check a request body; ApiError (400, naming the field) when it is wrong or asks more
    than the server's limits: `max_n` choices, `max_tokens_limit` tokens (None: any)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    name = _get(body, "model", str, model)
    if name not in (model, ""):
        raise ApiError(404, f"the model '{name}' does not exist; this server serves '{model}'",
                       "model", "model_not_found")  # fmt: skip
    _refuse_unsupported(body, chat)
    prompt = _messages(body) if chat else _prompt(body)
    max_tokens = _max_tokens(body, chat, max_tokens_limit)
    n = _get(body, "n", int, 1)
    if not 1 <= n <= max_n:
        raise ApiError(400, f"'n' must be 1..{max_n} on this server, got {n}", "n")
    options = _get(body, "stream_options", dict, {})
    return Request(
        name, prompt, _sampling(body), max_tokens, _stops(body), n,
        _get(body, "stream", bool, False), _get(options, "include_usage", bool, False),
        _get(body, "ignore_eos", bool, False), chat,
    )  # fmt: skip


def _max_tokens(body: dict, chat: bool, limit: int | None) -> int | None:
    """max_tokens (chat: or max_completion_tokens), at least 1 and at most `limit`; the
    error names the field the client sent."""
    name = "max_tokens"
    value = _get(body, name, int)
    if value is None and chat:
        name = "max_completion_tokens"
        value = _get(body, name, int)
    if value is None:
        return None if chat else min(16, limit or 16)
    if value < 1:
        raise ApiError(400, f"'{name}' must be at least 1, got {value}", name)
    if limit is not None and value > limit:
        raise ApiError(400, f"'{name}' is too large: {value}. This server allows at most "
                       f"{limit} completion tokens.", name)  # fmt: skip
    return value


def _refuse_unsupported(body: dict, chat: bool) -> None:
    """Fields whose non-default values this server cannot honour: a 400, never ignored."""
    for field, default in [("logprobs", (None, False)), ("echo", (None, False)),
                           ("best_of", (None, 1)), ("suffix", (None, "")),
                           ("logit_bias", (None, {})), ("tools", (None, [])),
                           ("presence_penalty", (None, 0, 0.0)),
                           ("frequency_penalty", (None, 0, 0.0))]:  # fmt: skip
        value = body.get(field)
        if value not in default:
            raise ApiError(400, f"'{field}' is not supported by llama-np's server", field)
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise ApiError(400, "'response_format' other than text is not supported",
                       "response_format")  # fmt: skip


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str) and prompt:
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return prompt
    if prompt in (None, "", []):
        raise ApiError(400, "'prompt' is required and must not be empty", "prompt")
    raise ApiError(400, "'prompt' must be a string or an array of token ids (one prompt "
                   "per request)", "prompt")  # fmt: skip


ROLES = ("system", "developer", "user", "assistant", "tool")  # OpenAI's
NEEDS_CONTENT = ("system", "developer", "user", "tool")  # an assistant's may be null


def _messages(body: dict) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"'{where}' must be an object with a string 'role'", where)
        if m["role"] not in ROLES:
            raise ApiError(400, f"'{where}.role' must be one of {', '.join(ROLES)}, got "
                           f"{m['role']!r}", f"{where}.role")  # fmt: skip
        if m.get("content") is None and m["role"] in NEEDS_CONTENT:
            raise ApiError(400, f"'{where}.content' is required for a {m['role']} message",
                           f"{where}.content")  # fmt: skip
        out.append({"role": m["role"], "content": _content(m.get("content"), where)})
    return out


def _content(content: Any, where: str) -> str:
    """A message's text: a string, or an array of {"type": "text", "text": ...} parts (any
    other kind of part, an image say, is a 400 naming it)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise ApiError(400, f"'{where}.content' must be a string or an array of text parts",
                       f"{where}.content")  # fmt: skip
    for j, p in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(p, dict) or not isinstance(p.get("type"), str):
            raise ApiError(400, f"'{at}' must be an object with a string 'type'", at)
        if p["type"] != "text":
            raise ApiError(400, f"'{at}': content parts of type {p['type']!r} are not "
                           "supported (only text)", at)  # fmt: skip
        if not isinstance(p.get("text"), str):
            raise ApiError(400, f"'{at}.text' must be a string", f"{at}.text")
    return "".join(p["text"] for p in content)


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, "'stop' must be a string or an array of strings", "stop")
    if len(stops) > MAX_STOPS:
        raise ApiError(400, f"'stop' takes at most {MAX_STOPS} strings", "stop")
    return tuple(s for s in stops if s)


def _sampling(body: dict) -> SamplerSettings:
    d = SamplerSettings()
    fields = dict(
        temp=_get(body, "temperature", NUMBER, d.temp),
        top_k=_get(body, "top_k", int, d.top_k),
        top_p=_get(body, "top_p", NUMBER, d.top_p),
        min_p=_get(body, "min_p", NUMBER, d.min_p),
        repeat_penalty=_get(body, "repeat_penalty", NUMBER, d.repeat_penalty),
        seed=_get(body, "seed", int, None),
    )
    try:
        return SamplerSettings(**fields)
    except UsageError as e:  # "--temp must be >= 0": named as the API names the field
        flag = str(e).split()[0]
        param = {"--temp": "temperature"}.get(flag, flag.lstrip("-").replace("-", "_"))
        raise ApiError(400, f"'{param}'{str(e)[len(flag) :]}", param) from None


def new_hex() -> str:
    return uuid.uuid4().hex[:24]


def new_id(chat: bool, hexid: str | None = None) -> str:
    """A completion's id: OpenAI's prefix, then the request's id (new_hex)."""
    return ("chatcmpl-" if chat else "cmpl-") + (hexid or new_hex())


FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length",
          "cancelled": "stop"}  # fmt: skip


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip


def response(req: Request, rid: str, texts: list[str], reasons: list[str],
             prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:  # fmt: skip
    """The whole (non-streamed) response."""
    if req.chat:
        choices = [{"index": i, "message": {"role": "assistant", "content": t},
                    "logprobs": None, "finish_reason": FINISH[r]}
                   for i, (t, r) in enumerate(zip(texts, reasons, strict=True))]  # fmt: skip
    else:
        choices = [{"index": i, "text": t, "logprobs": None, "finish_reason": FINISH[r]}
                   for i, (t, r) in enumerate(zip(texts, reasons, strict=True))]  # fmt: skip
    return {"id": rid, "object": "chat.completion" if req.chat else "text_completion",
            "created": int(time.time()), "model": req.model, "choices": choices,
            "usage": usage(prompt_tokens, completion_tokens)}  # fmt: skip


def chunk(req: Request, rid: str, index: int, text: str | None = None,
          reason: str | None = None, role: bool = False) -> dict[str, Any]:  # fmt: skip
    """One streamed piece of choice `index`: text, its finish reason, or (chat) its role."""
    finish = FINISH[reason] if reason else None
    if req.chat:
        delta: dict[str, str] = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion",
            "created": int(time.time()), "model": req.model, "choices": [choice]}  # fmt: skip


def usage_chunk(req: Request, rid: str, prompt_tokens: int, completion_tokens: int) -> dict:
    """The last chunk when stream_options.include_usage is set: no choices, the usage."""
    return {"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion",
            "created": int(time.time()), "model": req.model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}  # fmt: skip
