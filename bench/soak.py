"""A soak of `llama-np serve` (scripts/soak_serve.py; a shorter one in the tests): thousands of
requests, C at a time, against a server in a process of its own on 127.0.0.1, and what the
server process holds (RSS, open descriptors, threads) before, after the first tenth and at
the end, each read with every client connection closed and every slot free.

The requests, decided by their index: a tenth invalid (each kind of refusal in turn: a
limit passed, a wrong or missing key, bad JSON, a body past the limit), a tenth streams
cancelled after their first piece, one in twenty a temperature-0 request on a fixed prompt
(its text compared with `generate`'s by the caller), the rest sampled, half streamed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REFERENCE = ["The river", "Once upon a time", "A list of colours:", "In the morning"]
REFERENCE_TOKENS = 12
WORDS = "time year way day thing world life hand part place case week point home water".split()
# The sampled requests' prompts come from this many: the tokenizers library caches the ids
# of up to 10,000 distinct words (strings of under 256 characters; a whole prompt is one
# word to a tokenizer without a pre-tokenizer's regex, as the tiny checkpoint's), and a
# stream of prompts all different fills that cache over 10,000 requests: +15 MB measured,
# then flat, bounded by the library. A soak measures what grows without bound.
PROMPTS = 256
INVALID = ["max_tokens", "n", "context", "json", "body", "key", "no key", "temperature"]


@dataclass
class ProcStats:
    """What a process holds, from /proc (Linux)."""

    rss_mb: float
    fds: int
    threads: int


def proc_stats(pid: int) -> ProcStats:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kb = int(fields["VmRSS"].split()[0])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return ProcStats(rss_kb / 1024, fds, int(fields["Threads"]))


@dataclass
class Soak:
    """What a soak saw."""

    requests: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # "200", "400", "closed", ...
    unexpected: list[str] = field(default_factory=list)  # a status its kind should not get
    texts: dict[str, list[str]] = field(default_factory=dict)  # reference prompt -> texts
    stats: dict[str, ProcStats] = field(default_factory=dict)  # "start", "10%", "end"
    slots_free: bool = False
    seconds: float = 0.0

    def count(self, status: str) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1

    @property
    def server_errors(self) -> int:
        """5xx other than the queue's 503 (which a client is told to retry)."""
        return sum(n for s, n in self.statuses.items() if s.startswith("5") and s != "503")


def kind(i: int) -> str:
    if i % 10 == 3:
        return "invalid"
    if i % 10 == 7:
        return "cancel"
    return "reference" if i % 20 == 0 else "sampled"


class Driver:
    """Sends request `i` of a soak and checks its answer."""

    def __init__(self, base: str, key: str | None, ctx: int, max_tokens: int, max_n: int,
                 max_body: int, soak: Soak) -> None:  # fmt: skip
        self.base, self.key, self.ctx, self.soak = base, key, ctx, soak
        self.max_tokens, self.max_n, self.max_body = max_tokens, max_n, max_body

    def headers(self, key: str | None = "") -> dict[str, str]:
        key = self.key if key == "" else key
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def one(self, client, i: int) -> None:
        self.soak.requests += 1
        k = kind(i)
        if k == "invalid":
            await self.invalid(client, i)
        elif k == "cancel":
            await self.cancelled(client, i)
        else:
            await self.complete(client, i, k == "reference")

    async def complete(self, client, i: int, reference: bool) -> None:
        rng = np.random.default_rng(i)
        if reference:
            prompt = REFERENCE[(i // 20) % len(REFERENCE)]
            body = {"prompt": prompt, "max_tokens": REFERENCE_TOKENS, "temperature": 0}
        else:
            pick = np.random.default_rng(int(rng.integers(PROMPTS)))  # one of PROMPTS prompts
            prompt = " ".join(pick.choice(WORDS, int(pick.integers(1, 12))))
            body = {"prompt": prompt, "max_tokens": int(rng.integers(1, 24)), "seed": i}
        stream = i % 2 == 1
        text, status = await self.post(client, body | {"stream": stream})
        self.soak.count(status)
        if status != "200":
            self.soak.unexpected.append(f"request {i}: {status}")
        elif reference:
            self.soak.texts.setdefault(prompt, []).append(text)

    async def post(self, client, body: dict) -> tuple[str, str]:
        """The text of a completion, streamed or whole, and the status."""
        url = self.base + "/v1/completions"
        async with client.stream("POST", url, json=body, headers=self.headers()) as r:
            if r.status_code != 200:
                await r.aread()
                return "", str(r.status_code)
            if not body.get("stream"):
                return json.loads(await r.aread())["choices"][0]["text"], "200"
            text = ""
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return text, "500 in stream"
                    text += "".join(c.get("text", "") for c in chunk["choices"])
            return text, "200"

    async def cancelled(self, client, i: int) -> None:
        """A stream the client leaves after its first piece of text."""
        body = {"prompt": "Once", "max_tokens": 64, "stream": True, "ignore_eos": True,
                "seed": i}  # fmt: skip
        url = self.base + "/v1/completions"
        async with client.stream("POST", url, json=body, headers=self.headers()) as r:
            self.soak.count(str(r.status_code))
            if r.status_code != 200:
                self.soak.unexpected.append(f"request {i} (to cancel): {r.status_code}")
                return
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    break  # leaving the block closes the connection mid-stream

    async def invalid(self, client, i: int) -> None:
        """One of INVALID's refusals in turn; each must get its 4xx."""
        import httpx

        what = INVALID[(i // 10) % len(INVALID)]
        url, headers = self.base + "/v1/completions", self.headers()
        body: dict = {"prompt": "hi", "max_tokens": 4}
        content, want = None, "400"
        if what == "max_tokens":
            body["max_tokens"] = self.max_tokens + 1
        elif what == "n":
            body["n"] = self.max_n + 1
        elif what == "context":
            body["prompt"] = "hi " * (self.ctx + 8)
        elif what == "temperature":
            body["temperature"] = "hot"
        elif what == "json":
            content = b'{"prompt": "hi", '
        elif what == "body":
            content, want = b" " * (self.max_body + 1), "413"
        else:
            headers, want = self.headers("wrong" if what == "key" else None), "401"
        try:
            if content is None:
                r = await client.post(url, json=body, headers=headers)
            else:
                headers = headers | {"Content-Type": "application/json"}
                r = await client.post(url, content=content, headers=headers)
            status = str(r.status_code)
        except httpx.TransportError:  # a 413 closes the connection, maybe before it is read
            status = "closed" if what == "body" else "transport error"
        self.soak.count(status)
        if status != want and not (what == "body" and status == "closed"):
            self.soak.unexpected.append(f"request {i} ({what}): {status}, not {want}")


async def _phase(driver: Driver, indices: range, concurrency: int, deadline: float) -> None:
    """Requests `indices`, `concurrency` in flight, on connections closed at the end."""
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    it = iter(indices)
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0), limits=limits) as client:

        async def worker() -> None:
            for i in it:
                if time.monotonic() > deadline:
                    return
                await driver.one(client, i)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def settle(base: str, pid: int, seconds: float = 10.0) -> tuple[bool, ProcStats]:
    """Wait until every slot is free and nothing waits (/health), and the server's
    descriptors stop changing (closed connections leave); then its stats."""
    import httpx

    end = time.monotonic() + seconds
    free = False
    while time.monotonic() < end:
        h = httpx.get(base + "/health", timeout=5).json()
        free = h["slots_processing"] == 0 and h["requests_waiting"] == 0
        if free:
            break
        time.sleep(0.05)
    before = proc_stats(pid)
    while time.monotonic() < end:
        time.sleep(0.2)
        now = proc_stats(pid)
        if (now.fds, now.threads) == (before.fds, before.threads):
            break
        before = now
    return free, proc_stats(pid)


def soak(base: str, pid: int, n: int, concurrency: int, key: str | None, limits: dict,
         seconds: float = 600.0) -> Soak:  # fmt: skip
    """`n` requests (at most `seconds` of them) at `concurrency` against the server at `base`
    (process `pid`); `limits`: the server's ctx, max_tokens, max_n and max_body."""
    result = Soak()
    driver = Driver(base, key, limits["ctx"], limits["max_tokens"], limits["max_n"],
                    limits["max_body"], result)  # fmt: skip
    t0 = time.monotonic()
    _, result.stats["start"] = settle(base, pid)
    tenth = max(1, n // 10)
    asyncio.run(_phase(driver, range(tenth), concurrency, t0 + seconds))
    _, result.stats["10%"] = settle(base, pid)
    asyncio.run(_phase(driver, range(tenth, n), concurrency, t0 + seconds))
    result.slots_free, result.stats["end"] = settle(base, pid)
    result.seconds = time.monotonic() - t0
    return result


def start_server(cmd: list[str], log: Path, env: dict[str, str] | None = None,
                 timeout: float = 120.0) -> tuple[subprocess.Popen, str]:  # fmt: skip
    """Run `llama-np serve ...` (with `env` added to the environment: a key is passed
    there, not in its arguments) with its stderr in `log`; its process and base URL once it
    says it is serving."""
    env = os.environ | {"PYTHONUNBUFFERED": "1"} | (env or {})
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for line in log.read_text().splitlines():
            if "serving" in line and "http://" in line:
                url = line.split("http://", 1)[1].split()[0].removesuffix("/v1")
                return proc, "http://" + url
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited {proc.returncode}: {log.read_text()[-500:]}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the server did not start within {timeout:.0f} s")


def tiny_checkpoint(directory: Path, dim: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """A random LLaMA checkpoint with a byte-level tokenizer (one token per byte, 258 in
    all): a server to soak in seconds, with no download."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    rng, hidden, kv = np.random.default_rng(seed), 2 * dim, dim // 2
    t = {"model.embed_tokens.weight": rng.standard_normal((258, dim)),
         "model.norm.weight": np.ones(dim)}  # fmt: skip
    shapes = {"self_attn.q_proj": (dim, dim), "self_attn.k_proj": (kv, dim),
              "self_attn.v_proj": (kv, dim), "self_attn.o_proj": (dim, dim),
              "mlp.gate_proj": (hidden, dim), "mlp.up_proj": (hidden, dim),
              "mlp.down_proj": (dim, hidden), "input_layernorm": (dim,),
              "post_attention_layernorm": (dim,)}  # fmt: skip
    for i in range(layers):
        t |= {f"model.layers.{i}.{k}.weight": rng.standard_normal(s) for k, s in shapes.items()}
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.astype(np.float32) for k, v in t.items()}, directory / "model.safetensors")
    config = {"model_type": "llama", "hidden_size": dim, "intermediate_size": hidden,
              "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 258, "tie_word_embeddings": True,
              "max_position_embeddings": 4096}  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config))
    chars = sorted(ByteLevel.alphabet(), key=_byte_of)
    vocab = {ch: i for i, ch in enumerate(chars)} | {"<s>": 256, "</s>": 257}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    return directory


def _byte_of(ch: str) -> int:
    """The byte GPT-2's byte-level alphabet maps to `ch`."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if ord(ch) in printable:
        return ord(ch)
    return [b for b in range(256) if b not in printable][ord(ch) - 256]
