"""`llama-np serve` against OpenAI's own Python client, on 127.0.0.1: every request gets the
text `generate` gives it alone (greedy, or the same seed), however many run beside it;
streams, chat, stop strings, n; a client that goes away frees its slot; bad input gets
OpenAI's error shape; /metrics parses as Prometheus text and its speed-of-light figures
are the model's; 300 requests leave memory and threads as they were; SIGTERM drains."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import openai
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

import llama_np
from bench.probe import Caches, Probe
from bench.runner import rss_mb
from bench.sol import estimate
from llama_np.generation.chat import chat_prompt_ids
from llama_np.serve.app import create_app
from llama_np.serve.engine import Engine
from llama_np.serve.metrics import Metrics

SLOTS, CTX = 16, 256
PROMPTS = [f"{w} is a word that" for w in ("Apple", "River", "Seven", "Paris", "Green", "Music",
           "Winter", "Robot", "Coffee", "Mountain", "Python", "Ocean", "Silver", "Garden",
           "Thunder", "Library")]  # fmt: skip
GREEDY = {"temp": 0.0}


class Live:
    """A server on a free port of 127.0.0.1, its engine on a thread of its own."""

    def __init__(self, llm, probe: Probe | None) -> None:
        self.engine = Engine(llm, SLOTS, CTX, max_queue=4)
        self.metrics = Metrics(self.engine, probe, None)
        app = create_app(self.engine, "smollm2", self.metrics)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.http = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]})
        self.engine.start()
        self.http.start()
        for _ in range(200):
            if self.server.started:
                return
            time.sleep(0.05)
        raise RuntimeError("the server did not start")

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0)

    def stop(self) -> None:
        self.server.should_exit = True
        self.http.join(20)
        self.engine.stop()


@pytest.fixture(scope="module")
def llm(smollm2_path):
    with llama_np.load(smollm2_path, kernels="numba") as llm:
        yield llm


@pytest.fixture(scope="module")
def alone(llm):
    """What `generate` gives each prompt alone, computed before the server owns the model."""
    out = {p: llm.generate(p, 24, **GREEDY) for p in PROMPTS}
    out["chat"] = llm.generate(chat_prompt_ids(llm, [{"role": "user", "content": "Say hi"}]),
                               12, **GREEDY)  # fmt: skip
    out["seeded"] = [llm.generate(PROMPTS[0], 16, temp=0.9, seed=7 + i) for i in range(2)]
    out["stop"] = llm.generate(PROMPTS[1], 24, stop=["."], **GREEDY)
    out["ids"] = llm.tokenize(PROMPTS[0])
    return out


PROBE = Probe("test", 2, Caches(1 << 20, 32 << 20, 2), sizes=[1 << 20, 1 << 30],
              sgemv_gbs=[100.0, 20.0], reduce_gbs=[100.0, 20.0], sgemm_gflops=100.0,
              fma_gflops=200.0, int8_gops=800.0)  # fmt: skip


@pytest.fixture(scope="module")
def live(llm, alone):
    server = Live(llm, PROBE)
    yield server
    server.stop()


def test_completion_equals_generate(live, alone):
    r = live.client().completions.create(model="smollm2", prompt=PROMPTS[0], max_tokens=24,
                                         temperature=0)  # fmt: skip
    assert r.choices[0].text == alone[PROMPTS[0]]
    assert r.usage.prompt_tokens == len(alone["ids"])
    assert r.choices[0].finish_reason in ("length", "stop")
    stream = live.client().completions.create(model="smollm2", prompt=PROMPTS[0], stream=True,
                                              max_tokens=24, temperature=0)  # fmt: skip
    assert "".join(c.choices[0].text for c in stream if c.choices) == alone[PROMPTS[0]]


def test_chat_equals_generate_on_the_template(live, alone):
    messages = [{"role": "user", "content": "Say hi"}]
    r = live.client().chat.completions.create(model="smollm2", messages=messages,
                                              max_tokens=12, temperature=0)  # fmt: skip
    assert r.choices[0].message.content == alone["chat"]
    assert r.choices[0].message.role == "assistant"
    stream = live.client().chat.completions.create(
        model="smollm2", messages=messages, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == alone["chat"]
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_seeds_stops_and_n_as_generate(live, alone):
    c = live.client()
    r = c.completions.create(model="smollm2", prompt=PROMPTS[0], max_tokens=16, n=2, seed=7,
                             temperature=0.9)  # fmt: skip
    assert [ch.text for ch in sorted(r.choices, key=lambda ch: ch.index)] == alone["seeded"]
    r = c.completions.create(model="smollm2", prompt=PROMPTS[1], max_tokens=24, stop=["."],
                             temperature=0)  # fmt: skip
    assert r.choices[0].text == alone["stop"]
    ids = c.completions.create(model="smollm2", prompt=alone["ids"], max_tokens=24,
                               temperature=0)  # fmt: skip
    assert ids.choices[0].text == alone[PROMPTS[0]]


def test_sixteen_concurrent_streams_each_as_alone(live, alone):
    def stream(prompt: str) -> str:
        chunks = live.client().completions.create(
            model="smollm2", prompt=prompt, max_tokens=24, temperature=0, stream=True
        )
        return "".join(c.choices[0].text for c in chunks if c.choices)

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        texts = list(pool.map(stream, PROMPTS))
    assert texts == [alone[p] for p in PROMPTS]
    steps = metrics(live)["llamanp_decode_steps_total"]
    assert max(int(dict(labels)["batch"]) for labels in steps) > 8  # they did run together


def metrics(live) -> dict[str, dict[tuple, float]]:
    """name -> {((label, value), ...): sample value}, parsed by prometheus_client."""
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(httpx.get(live.url + "/metrics").text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_a_client_gone_mid_stream_frees_its_slot(live, alone):
    before = metrics(live).get("llamanp_requests_finished_total", {})  # none finished yet?
    cancelled = before.get((("reason", "cancelled"),), 0)
    body = {"model": "smollm2", "prompt": PROMPTS[2], "max_tokens": 200, "stream": True,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    with httpx.stream("POST", live.url + "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data:")
    deadline = time.time() + 10
    while httpx.get(live.url + "/health").json()["slots_processing"] and time.time() < deadline:
        time.sleep(0.05)
    assert httpx.get(live.url + "/health").json()["slots_processing"] == 0
    after = metrics(live)["llamanp_requests_finished_total"]
    assert after[(("reason", "cancelled"),)] == cancelled + 1
    r = live.client().completions.create(model="smollm2", prompt=PROMPTS[0], max_tokens=24,
                                         temperature=0)  # fmt: skip
    assert r.choices[0].text == alone[PROMPTS[0]]  # a freed (reused) slot, the same text


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "smollm2", "prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
        ({"model": "smollm2", "prompt": "hi", "temperature": -1}, 400, "temperature"),
        ({"model": "smollm2", "prompt": "hi", "top_p": 0}, 400, "top_p"),
        ({"model": "smollm2", "prompt": "hi", "stream": "yes"}, 400, "stream"),
        ({"model": "smollm2", "prompt": ""}, 400, "prompt"),
        ({"model": "smollm2", "prompt": [1, 2, 10**9]}, 400, "prompt"),
        ({"model": "smollm2", "prompt": "hi", "n": SLOTS + 1}, 400, "n"),
        ({"model": "smollm2", "prompt": "hi", "logprobs": 2}, 400, "logprobs"),
        ({"model": "smollm2", "prompt": "hi", "stop": [1]}, 400, "stop"),
        ({"model": "smollm2", "prompt": "hi " * (CTX + 10)}, 400, "prompt"),
        ({"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ],
)
def test_bad_requests_get_openai_errors(live, body, status, param):
    r = httpx.post(live.url + "/v1/completions", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


def test_malformed_json_unknown_paths_and_the_client_sees_them(live):
    r = httpx.post(live.url + "/v1/completions", content=b"{not json",
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert httpx.get(live.url + "/v1/nothing").status_code == 404
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        live.client().completions.create(model="smollm2", prompt="hi " * (CTX + 10))
    with pytest.raises(openai.NotFoundError):
        messages = [{"role": "user", "content": "x"}]
        live.client().chat.completions.create(model="nope", messages=messages)


def test_models_health_and_metrics_hold_the_steps_to_the_speed_of_light(live, llm):
    models = httpx.get(live.url + "/v1/models").json()["data"]
    assert models[0]["id"] == "smollm2" and models[0]["llama_np"]["slots"] == SLOTS
    assert httpx.get(live.url + "/health").json()["status"] == "ok"
    live.client().completions.create(model="smollm2", prompt=PROMPTS[3], max_tokens=8)
    m = metrics(live)
    assert m["llamanp_requests_total"][()] >= 1 and m["llamanp_generation_tokens_total"][()] >= 8
    assert m["llamanp_decode_steps_total"], "no decode step was metered"
    steps, seconds = m["llamanp_decode_steps_total"], m["llamanp_decode_step_seconds"]
    sol, ratio = m["llamanp_sol_step_seconds"], m["llamanp_measured_over_sol"]
    info = live.metrics.model_info()
    for labels in steps:
        b, pos = int(dict(labels)["batch"]), m["llamanp_decode_position"][labels]
        assert ratio[labels] == pytest.approx(seconds[labels] / sol[labels])
        est = estimate(llm.config, info["weights"], "f32", round(pos), head=info["head"],
                       embed=info["embed"], kernels="numba", batch=b)  # fmt: skip
        bw = PROBE.attainable(est.bytes_per_token)[1]
        assert bw == pytest.approx(1e9 * m["llamanp_attainable_gbs"][labels])
        peak = PROBE.peak_flops("numba", info["weights"], info["dot"])
        assert sol[labels] == pytest.approx(est.predict(bw, peak).ms_per_token / 1e3)


def test_the_queue_full_gets_503_with_retry_after(live):
    body = {"model": "smollm2", "prompt": "x", "max_tokens": CTX - 8, "stream": True,
            "ignore_eos": True, "temperature": 0}  # fmt: skip
    held = []
    try:
        for _ in range(SLOTS + 4):  # every slot, and the queue of 4
            held.append(httpx.stream("POST", live.url + "/v1/completions", json=body))
            held[-1].__enter__()
        r = httpx.post(live.url + "/v1/completions", json=body | {"stream": False})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "server_busy"
    finally:
        for h in held:
            h.__exit__(None, None, None)
    deadline = time.time() + 20
    while httpx.get(live.url + "/health").json()["slots_processing"] and time.time() < deadline:
        time.sleep(0.05)
    assert httpx.get(live.url + "/health").json()["slots_processing"] == 0


def test_300_short_requests_leave_memory_and_threads_as_they_were(live):
    """On the compiled backend, in process (test_serve_soak: a server process on NumPy's,
    RSS within 5%)."""

    def short(i: int) -> int:
        r = client.post("/v1/completions", json={"model": "smollm2", "prompt": PROMPTS[i % 16],
                                                  "max_tokens": 1})  # fmt: skip
        return r.status_code

    with httpx.Client(base_url=live.url) as client:
        for i in range(100):  # warm: caches of every slot made, allocator settled
            short(i)
        threads, rss = threading.active_count(), rss_mb()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(short, range(300)))
    assert codes == [200] * 300
    assert threading.active_count() == threads
    grew = rss_mb() - rss  # seen: 4.8 MB
    assert grew < 32, f"RSS grew {grew:.0f} MB over 300 requests"


def test_sigterm_finishes_the_running_request_and_exits_0(smollm2_path, tmp_path):
    cmd = [sys.executable, "-m", "llama_np", "serve", "-m", str(smollm2_path), "--port", "0",
           "-np", "1", "--max-queue", "0", "-c", "64", "--shutdown-timeout", "30"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=os.environ | {
        "PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        line = proc.stderr.readline()
        while "serving" not in line and line:
            line = proc.stderr.readline()
        url = re.search(r"http://\S+/v1", line).group(0)
        body = {"model": "x", "prompt": "Once upon a time", "max_tokens": 40, "stream": True,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        with httpx.stream("POST", url + "/completions", json=body | {"model": ""}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data:")
            busy = httpx.post(url + "/completions", json={"prompt": "hi", "max_tokens": 1})
            assert busy.status_code == 503  # one slot, no queue
            proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data:")]
        assert rest[-1] == "data: [DONE]"  # the running stream finished
        pieces = [line for line in rest if '"text"' in line]
        assert len(pieces) >= 30  # it was not cut short
        assert proc.wait(30) == 0
        assert "server stopped" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


HALF = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b'Content-Length: 500\r\n\r\n{"prompt": "hel'
)  # headers, then a third of the body


def half_sent(url: str, n: int) -> None:
    """n clients that send the headers and part of a body, then go away."""
    host, port = re.match(r"http://([^:/]+):(\d+)", url).groups()
    for _ in range(n):
        with socket.create_connection((host, int(port))) as s:
            s.sendall(HALF)
            time.sleep(0.01)


def test_clients_that_leave_half_way_cost_no_traceback(smollm2_path):
    """50 half-sent requests against `llama-np serve`, its stderr a pipe nobody reads until
    the end (as a supervisor's that falls behind): the server keeps answering, and its log
    holds no traceback (45 lines each filled such a pipe and stalled the server)."""
    cmd = [sys.executable, "-m", "llama_np", "serve", "-m", str(smollm2_path), "--port", "0",
           "-np", "1", "-c", "64"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        line = proc.stderr.readline()
        while "serving" not in line and line:
            line = proc.stderr.readline()
        url = re.search(r"http://\S+/v1", line).group(0)
        half_sent(url, 50)
        assert httpx.get(url.removesuffix("/v1") + "/health", timeout=10).status_code == 200
        r = httpx.post(url + "/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        log = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert "Traceback" not in log and "ClientDisconnect" not in log, log
    assert log.count("\n") <= 3, log  # "server stopped", at most a note or two


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
        ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}],
         "messages[0].content[0]"),
    ],
)  # fmt: skip
def test_bad_chat_messages_get_a_400_naming_them(live, messages, param):
    r = httpx.post(live.url + "/v1/chat/completions", json={"messages": messages})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_chat_content_as_text_parts_is_taken(live, alone):
    parts = [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi"}]
    messages = [{"role": "user", "content": parts}]
    r = live.client().chat.completions.create(model="smollm2", messages=messages,
                                              max_tokens=12, temperature=0)  # fmt: skip
    assert r.choices[0].message.content == alone["chat"]


def test_cli_errors_are_one_line(smollm2_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "llama_np", "serve", "-m", str(smollm2_path), "--port",
               str(port)]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot listen" in r.stderr


def test_bench_endpoint_takes_a_gguf_an_alias_or_a_mixed_type(live, capsys, smollm2_path):
    """--config as the GGUF file (each tensor's type), as a `pull` alias, and a preset with
    one of llama.cpp's mixed file types: the same bytes where they describe the same file."""
    from llama_np.cli import main

    base = ["bench", "--endpoint", live.url, "--concurrency", "2", "-n", "4", "-r", "1",
            "-p", "4", "--peak-gbs", "50", "--peak-gflops", "1000", "--json"]  # fmt: skip
    sol = []
    for config in (str(smollm2_path), "smollm2-135m"):  # the file, the alias (cached)
        assert main([*base, "--config", config]) == 0
        sol.append(json.loads(capsys.readouterr().out)["rows"][0]["sol_tok_s"])
    assert sol[0] == pytest.approx(sol[1])
    assert main([*base, "--config", "tinyllama-1.1b", "--weights", "q4_k_m"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert 0 < row["sol_tok_s"] < sol[0]  # a larger model's bytes


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--config", "no-such-model"], "no-such-model"),
        (["--config", str(__file__)], "not a readable JSON file"),
        (["--weights", "q8_0"], "--config"),
    ],
)
def test_bench_endpoint_checks_its_shape_before_the_first_request(extra, says, capsys):
    """Nothing listens at the URL: the shape's mistake is what is reported, at once."""
    from llama_np.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert main(["bench", "--endpoint", url, "-r", "1", *extra]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "bench: concurrency" not in err


def test_bench_endpoint_drives_the_server_and_holds_it_to_the_speed_of_light(live, capsys):
    from llama_np.cli import main

    args = ["bench", "--endpoint", live.url, "--concurrency", "1,3", "-n", "8", "-r", "1",
            "-p", "12", "--peak-gbs", "50", "--peak-gflops", "1000", "--json"]  # fmt: skip
    assert main(args) == 0

    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["concurrency"] for r in rows] == [1, 3]
    for r in rows:
        assert r["requests"] == r["concurrency"] and r["tokens"] == 8
        assert r["tok_s"] > 0 and r["ttft_ms"] > 0
        assert r["measured_over_sol"] == pytest.approx(r["sol_tok_s"] / r["tok_s"])
    assert rows[1]["sol_tok_s"] > rows[0]["sol_tok_s"]  # three sequences share the weights
    assert np.isfinite(rows[0]["itl_ms"])
