"""The server on a network, on a tiny random checkpoint (NumPy kernels, 127.0.0.1): API keys
on /v1 (OpenAI's client, the header, the environment, a file) with /health and /metrics
open; each limit's 4xx naming its field; a client sending its headers a byte at a time
dropped at the deadline while /health answers; a full queue's 503 and Retry-After."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import openai
import pytest
import uvicorn

import llama_np
from bench.soak import tiny_checkpoint
from llama_np.errors import UsageError
from llama_np.serve.app import create_app
from llama_np.serve.engine import Engine
from llama_np.serve.metrics import Metrics
from llama_np.serve.network import Limits, load_keys, uvicorn_config

KEY, OTHER = "sk-test-0123456789", "second-key"
SLOTS, CTX = 2, 64
LIMITS = Limits(max_tokens=32, max_n=2, max_body=2048, request_timeout=0.5, idle_timeout=1.0)


class Live:
    """A server on a free port of 127.0.0.1; its engine on a thread unless `start` is False
    (then every request waits: a queue that fills)."""

    def __init__(self, llm, keys=(), limits=LIMITS, max_queue=8, start=True) -> None:
        self.engine = Engine(llm, SLOTS, CTX, max_queue=max_queue)
        app = create_app(self.engine, "tiny", Metrics(self.engine, None, None), keys=keys,
                         limits=limits)  # fmt: skip
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn_config(app, limits))
        self.http = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]})
        if start:
            self.engine.start()
        self.http.start()
        while not self.server.started:
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.http.join(20)
        self.engine.stop()


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    with llama_np.load(str(tiny_checkpoint(tmp_path_factory.mktemp("tiny"))),
                       kernels="numpy") as llm:  # fmt: skip
        yield llm


@pytest.fixture(scope="module")
def keyed(llm):
    server = Live(llm, keys=(KEY, OTHER))
    yield server
    server.stop()


def client(live: Live, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0)


def test_the_openai_client_with_the_key_and_without(keyed):
    for key in (KEY, OTHER):
        with client(keyed, key) as c:
            r = c.completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=0)
        assert r.usage.completion_tokens == 3
    with client(keyed, "sk-wrong") as c:
        with pytest.raises(openai.AuthenticationError) as e:
            c.completions.create(model="tiny", prompt="hi")
        assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
        assert KEY not in str(e.value.body) and "sk-wrong" not in str(e.value.body)
        with pytest.raises(openai.AuthenticationError):
            c.models.list()


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer  x", f"Basic {KEY}", f"{KEY}",
                                    f"Bearer {KEY}x", f"Bearer {KEY[:-1]}"])  # fmt: skip
def test_a_missing_or_wrong_key_is_openais_401(keyed, header):
    headers = {"Authorization": header} if header is not None else {}
    for path in ("/v1/models", "/v1/completions", "/v1/nothing"):
        r = httpx.post(keyed.url + path, json={"prompt": "hi"}, headers=headers)
        assert r.status_code == 401, (path, r.text)
        assert r.json() == {"error": {"message": r.json()["error"]["message"], "param": None,
                                      "type": "invalid_request_error",
                                      "code": "invalid_api_key"}}  # fmt: skip
        assert r.headers["www-authenticate"] == "Bearer"


def test_health_and_metrics_stay_open(keyed):
    assert httpx.get(keyed.url + "/health").json()["status"] == "ok"
    assert "llamanp_requests_total" in httpx.get(keyed.url + "/metrics").text
    r = httpx.get(keyed.url + "/v1/models", headers={"authorization": f"bearer {KEY}"})
    assert r.status_code == 200  # the scheme's case does not matter


def test_keys_from_the_flag_the_environment_and_a_file(tmp_path, monkeypatch):
    monkeypatch.delenv("LLAMA_NP_API_KEY", raising=False)
    assert load_keys(None, None) == ()
    monkeypatch.setenv("LLAMA_NP_API_KEY", "from-env")
    assert load_keys(None, None) == ("from-env",)
    assert load_keys("flag", None) == ("flag",)  # the flag, not the environment
    keys = tmp_path / "keys"
    keys.write_text("# the team's keys\nalpha\n\n  beta  \nalpha\n")
    assert load_keys(None, str(keys)) == ("from-env", "alpha", "beta")
    for path, says in [(tmp_path / "none", "No such file"), (tmp_path / "empty", "no key")]:
        if path.name == "empty":
            path.write_text("# nothing\n")
        with pytest.raises(UsageError, match=says):
            load_keys(None, str(path))
    for bad in ("", "two words", "tab\tkey", "ключ"):
        with pytest.raises(UsageError) as e:
            load_keys(bad, None)
        assert bad not in str(e.value) or not bad  # the key is never printed


def test_bench_endpoint_sends_the_key(keyed, capsys, monkeypatch):
    from llama_np.cli import main

    monkeypatch.delenv("LLAMA_NP_API_KEY", raising=False)
    args = ["bench", "--endpoint", keyed.url, "--concurrency", "2", "-n", "2", "-r", "1",
            "-p", "2", "--peak-gbs", "50", "--peak-gflops", "1000", "--json"]  # fmt: skip
    assert main([*args, "--api-key", KEY]) == 0
    assert '"tokens": 2' in capsys.readouterr().out
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "401" in err and "--api-key" in err and err.count("\n") == 1
    monkeypatch.setenv("LLAMA_NP_API_KEY", OTHER)
    assert main(args) == 0


@pytest.fixture(scope="module")
def open_server(llm):
    server = Live(llm)
    yield server
    server.stop()


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"prompt": "hi", "max_tokens": 33}, "max_tokens", "at most 32"),
        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 99},
         "max_completion_tokens", "at most 32"),
        ({"prompt": "hi", "n": 3}, "n", "1..2"),
        ({"prompt": "x" * (CTX + 1)}, "prompt", f"maximum context length is {CTX} tokens. "
         f"However, your prompt resulted in {CTX + 1} tokens"),
    ],
)  # fmt: skip
def test_each_limit_is_a_400_naming_its_field(open_server, body, param, says):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = httpx.post(open_server.url + path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"], error
    if param == "prompt":
        assert error["code"] == "context_length_exceeded"


def test_a_prompt_that_fills_the_context_is_taken_and_max_tokens_at_the_limit(open_server):
    r = httpx.post(open_server.url + "/v1/completions", json={"prompt": "x" * 8,
                   "max_tokens": 32, "ignore_eos": True, "temperature": 0})  # fmt: skip
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 32


def test_a_body_past_the_limit_is_a_413_before_it_is_read(open_server):
    big = {"prompt": "x" * 3000}
    r = httpx.post(open_server.url + "/v1/completions", json=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert r.headers["connection"] == "close"

    def chunks():  # no Content-Length: counted as it streams in
        for _ in range(4):
            yield b" " * 1000

    r = httpx.post(open_server.url + "/v1/completions", content=chunks())
    assert r.status_code == 413
    assert httpx.get(open_server.url + "/health").status_code == 200


def test_a_slow_client_is_dropped_at_the_deadline_while_health_answers(open_server):
    """Headers sent a byte every 50 ms: the connection is closed 0.5 s after it opened
    (LIMITS.request_timeout), not when the headers would have ended; meanwhile /health
    answers at once. A connection that sends nothing is dropped too."""
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 100 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", open_server.port)) as slow, \
         socket.create_connection(("127.0.0.1", open_server.port)) as silent:  # fmt: skip
        t0, dropped = time.monotonic(), None
        for i in range(len(head)):
            try:
                slow.sendall(head[i : i + 1])
            except OSError:
                dropped = time.monotonic() - t0
                break
            if i == 3:
                r = httpx.get(open_server.url + "/health", timeout=2)
                assert r.status_code == 200
            slow.settimeout(0.05)
            try:
                if slow.recv(1) == b"":  # closed by the server
                    dropped = time.monotonic() - t0
                    break
            except TimeoutError:
                pass
        assert dropped is not None and 0.4 < dropped < 2.5, dropped
        silent.settimeout(3)
        assert silent.recv(1) == b""  # closed, having sent nothing


def test_a_kept_alive_connection_serves_many_requests(open_server):
    """The deadline is per request: a connection kept alive longer than it is not cut."""
    with httpx.Client(base_url=open_server.url) as c:
        for _ in range(4):
            assert c.get("/health").status_code == 200
            time.sleep(0.2)
        r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200


def test_a_full_queue_is_a_503_with_retry_after(llm):
    """The engine not running: SLOTS + 1 requests wait (the slots' and a queue of 1), the
    next is refused; once the engine runs, the waiting ones are answered."""
    live = Live(llm, max_queue=1, start=False)
    body = {"prompt": "hi", "max_tokens": 2}
    try:
        with httpx.Client(base_url=live.url, timeout=30) as c:
            codes: list[int] = []

            def post() -> None:
                codes.append(c.post("/v1/completions", json=body).status_code)

            waiting = [threading.Thread(target=post) for _ in range(SLOTS + 1)]
            for t in waiting:
                t.start()
            while live.engine._pending < SLOTS + 1:
                time.sleep(0.01)
            r = httpx.post(live.url + "/v1/completions", json=body)
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "server_error"
            live.engine.start()
            for t in waiting:
                t.join(30)
            assert codes == [200] * (SLOTS + 1)
    finally:
        live.stop()
