"""`llama-np bench --endpoint URL`: drive any OpenAI-compatible server (llama-np's, llama.cpp's,
vLLM) with streaming completions, C at a time, and hold each concurrency against the speed
of light of C sequences decoded together (`sol --batch C`).

A round sends C requests at once (distinct prompts of about P words, max_tokens N,
temperature 0, `ignore_eos` for the servers that honour it) and waits for all of them.
Per request: time to first token (TTFT, from sending to the first text), the gaps between
streamed pieces (inter-token latency, ITL) and its tokens (the server's `usage`, else the
pieces counted). Per round: aggregate tok/s = every request's tokens / the round's wall
time, prefill and HTTP included. Rounds are repeated; a row gives medians.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

from .probe import Probe
from .report import _opt
from .sol import Estimate

WORDS = (
    "time people year way day man thing woman life child world school state family "
    "student group country problem hand part place case week company system program "
    "question work government number night point home water room mother area money "
    "story fact month lot right study book eye job word business issue side kind head "
    "house service friend father power hour game line end member law car city"
).split()


class EndpointError(Exception):
    """The server cannot be reached or answers with an error."""


@dataclass
class Timing:
    """One streamed request."""

    ttft: float  # seconds to the first text
    gaps: list[float]  # seconds between streamed pieces with text
    tokens: int
    prompt_tokens: int | None
    end: float  # perf_counter at the last byte


@dataclass
class Row:
    endpoint: str
    model: str
    concurrency: int
    requests: int
    prompt_tokens: float  # per request, as the server counted them (else the words sent)
    tokens: float  # per request, median
    ttft_ms: float
    ttft_p90_ms: float
    itl_ms: float
    itl_p90_ms: float
    stream_tok_s: float  # one stream's decode rate, median
    tok_s: float  # aggregate, median over rounds
    tok_s_rounds: list[float] = field(default_factory=list)
    ttft_rounds: list[float] = field(default_factory=list)  # ms, each round's median
    sol_tok_s: float | None = None  # C / the speed-of-light step
    measured_over_sol: float | None = None
    gbs: float | None = None  # the model's bytes per step x steps per second
    attainable_gbs: float | None = None
    pct_attainable: float | None = None


def prompt_text(words: int, i: int) -> str:
    """About `words` tokens of plain words, different for each request `i` from the first
    words on (i's digits in base len(WORDS), the fastest first): no prefix cache (a slot's,
    llama-server's in RAM) serves one request's prompt from another's beyond a word."""
    n = len(WORDS)
    head = [WORDS[i % n], WORDS[i // n % n], WORDS[i // n // n % n]]
    return " ".join(head + [WORDS[(i * 7 + 3 * k + k * k) % n] for k in range(words - 3)])


async def one(client, url: str, body: dict) -> Timing:
    t0 = time.perf_counter()
    first, last, gaps, pieces, usage = None, None, [], 0, {}
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")[:300]
            raise EndpointError(f"{url}: HTTP {r.status_code}: {text}")
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("error"):
                raise EndpointError(f"{url}: {chunk['error']}")
            usage = chunk.get("usage") or usage
            if any(c.get("text") for c in chunk.get("choices", [])):
                now = time.perf_counter()
                first = first or now
                if last is not None:
                    gaps.append(now - last)
                last, pieces = now, pieces + 1
    end = time.perf_counter()
    if first is None:
        raise EndpointError(f"{url}: a stream brought no text")
    tokens = usage.get("completion_tokens") or pieces
    return Timing(first - t0, gaps, tokens, usage.get("prompt_tokens"), end)


def auth(api_key: str | None) -> dict[str, str]:
    """The header a server that asks a key needs (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def round_of(base: str, model: str, c: int, words: int, n: int, offset: int,
                   api_key: str | None = None) -> tuple:  # fmt: skip
    """C requests at once: their timings and the round's wall time."""
    import httpx

    limits = httpx.Limits(max_connections=c + 1, max_keepalive_connections=c + 1)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits,
                                 headers=auth(api_key)) as client:  # fmt: skip
        t0 = time.perf_counter()
        bodies = [{"model": model, "prompt": prompt_text(words, offset + i), "max_tokens": n,
                   "temperature": 0, "stream": True, "ignore_eos": True,
                   "stream_options": {"include_usage": True}} for i in range(c)]  # fmt: skip
        timings = await asyncio.gather(*(one(client, base + "/completions", b) for b in bodies))
    return timings, max(t.end for t in timings) - t0


def served_model(base: str, api_key: str | None = None) -> tuple[str, dict | None]:
    """The first model GET /v1/models lists, and llama-np's description of it if any."""
    import httpx

    try:
        r = httpx.get(base + "/models", timeout=10, headers=auth(api_key))
        if r.status_code == 401:
            raise EndpointError(f"{base}/models: HTTP 401: the server asks an API key that "
                                f"was {'not accepted' if api_key else 'not given'} (--api-key "
                                "or $LLAMA_NP_API_KEY)")  # fmt: skip
        r.raise_for_status()
        first = r.json()["data"][0]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise EndpointError(f"{base}/models: {e}") from None
    return first["id"], first.get("llama_np")


def measure(base: str, model: str, concurrency: tuple[int, ...], words: int, n: int,
            reps: int, progress: bool = True, api_key: str | None = None) -> list[Row]:  # fmt: skip
    """Rounds interleaved across concurrencies (round r of each before round r + 1), one
    warm-up round first; `api_key` for a server that asks one."""
    import httpx

    results: dict[int, list] = {c: [] for c in concurrency}
    try:
        asyncio.run(round_of(base, model, 1, words, min(n, 8), 10_000, api_key))  # warm-up
        for r in range(reps):
            for c in concurrency:
                results[c].append(asyncio.run(round_of(base, model, c, words, n, 100 * r,
                                                       api_key)))  # fmt: skip
                if progress:
                    print(f"bench: concurrency {c}, round {r + 1}/{reps}", flush=True,
                          file=__import__("sys").stderr)  # fmt: skip
    except httpx.HTTPError as e:
        raise EndpointError(f"{base}: {type(e).__name__}: {e}") from None
    return [row(base, model, c, words, results[c]) for c in concurrency]


def row(base: str, model: str, c: int, words: int, rounds: list) -> Row:
    timings = [t for ts, _ in rounds for t in ts]
    rates = [sum(t.tokens for t in ts) / wall for ts, wall in rounds]
    gaps = sorted(g for t in timings for g in t.gaps)
    ttft = sorted(t.ttft for t in timings)
    streams = [len(t.gaps) / sum(t.gaps) for t in timings if t.gaps and sum(t.gaps) > 0]
    prompts = [t.prompt_tokens for t in timings if t.prompt_tokens]
    return Row(base, model, c, len(timings),
               statistics.median(prompts) if prompts else float(words),
               statistics.median(t.tokens for t in timings),
               1e3 * statistics.median(ttft), 1e3 * p90(ttft),
               1e3 * statistics.median(gaps) if gaps else float("nan"),
               1e3 * p90(gaps) if gaps else float("nan"),
               statistics.median(streams) if streams else float("nan"),
               statistics.median(rates), rates,
               [1e3 * statistics.median(t.ttft for t in ts) for ts, _ in rounds])  # fmt: skip


def p90(sorted_values: list[float]) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(0.9 * len(sorted_values)))]


def hold(rows: list[Row], est_for, probe: Probe | None, bandwidth: float | None,
         peak: float | None) -> None:  # fmt: skip
    """Each row against C sequences' speed of light: `est_for(c, pos)` gives the Estimate
    of a step; the bandwidth is the device's, or the probe's curve at the working set."""
    for r in rows:
        est: Estimate = est_for(r.concurrency, round(r.prompt_tokens + r.tokens / 2))
        bw = bandwidth or (probe.attainable(est.bytes_per_token)[1] if probe else None)
        if bw is None:
            continue
        pred = est.predict(bw, peak)
        r.sol_tok_s = r.concurrency * pred.tokens_per_s
        r.measured_over_sol = r.sol_tok_s / r.tok_s
        r.gbs = est.bytes_per_token * r.tok_s / r.concurrency / 1e9
        r.attainable_gbs, r.pct_attainable = bw / 1e9, 100 * r.gbs * 1e9 / bw


COLUMNS = [
    ("model", lambda r: r.model),
    ("C", lambda r: str(r.concurrency)),
    ("requests", lambda r: str(r.requests)),
    ("prompt tok", lambda r: f"{r.prompt_tokens:.0f}"),
    ("gen tok", lambda r: f"{r.tokens:.0f}"),
    ("TTFT ms (p90)", lambda r: f"{r.ttft_ms:.0f} ({r.ttft_p90_ms:.0f})"),
    ("ITL ms (p90)", lambda r: f"{r.itl_ms:.1f} ({r.itl_p90_ms:.1f})"),
    ("stream tok/s", lambda r: f"{r.stream_tok_s:.1f}"),
    ("tok/s", lambda r: f"{r.tok_s:.1f}"),
    ("SOL tok/s", lambda r: _opt(r.sol_tok_s, ".1f")),
    ("measured/SOL", lambda r: _opt(r.measured_over_sol, ".2f")),
    ("GB/s", lambda r: _opt(r.gbs, ".1f")),
    ("% attainable", lambda r: _opt(r.pct_attainable, ".0f")),
]
