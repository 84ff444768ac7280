#!/usr/bin/env python3
"""llama-np against llama.cpp's own benchmark tools on one GGUF file, in interleaved
rounds, the same threads: llama-bench's pp (a prompt of -p tokens in one pass, tok/s) and
tg (decode of -n tokens from an empty context, tok/s), and llama-batched-bench's S_TG at
each B (B sequences of --pp prompt tokens each, then --tg steps of all of them, aggregate
tok/s). llama-np runs the same work through its Python API on the file as stored: the
prompt in one forward pass, -n decode steps after a one-token prompt, B caches prefilled
with --pp tokens each, then --tg batched steps. Each figure is the median of the rounds.

    .venv/bin/python scripts/peers_bench.py FILE.gguf --rounds 3 --batch 16
    .venv/bin/python scripts/peers_bench.py FILE.gguf --json out.json

Needs scripts/llama_cpp.sh (llama-bench and llama-batched-bench in .venv/bin).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import llama_np

BIN = Path(sys.executable).parent


def llama_bench(path: str, threads: int, prompt: int, gen: int) -> dict[str, float]:
    """One run of llama-bench: {"pp": tok/s, "tg": tok/s}."""
    out = subprocess.run([str(BIN / "llama-bench"), "-m", path, "-t", str(threads), "-p",
                          str(prompt), "-n", str(gen), "-r", "1", "-o", "json"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    rows = json.loads(out)
    return {"pp" if r["n_prompt"] else "tg": r["avg_ts"] for r in rows}


def batched_bench(path: str, threads: int, pp: int, tg: int, batch: int) -> float:
    """One run of llama-batched-bench at B = batch: S_TG, the aggregate tok/s of the steps."""
    ctx = batch * (pp + tg) + 16
    out = subprocess.run([str(BIN / "llama-batched-bench"), "-m", path, "-t", str(threads),
                          "-tb", str(threads), "-c", str(ctx), "-b", "2048", "-ub", "512",
                          "-npp", str(pp), "-ntg", str(tg), "-npl", str(batch),
                          "--output-format", "jsonl"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return next(r["speed_tg"] for r in rows if r["pl"] == batch)


def ours_one(llm, prompt: int, gen: int, rng: np.random.Generator) -> dict[str, float]:
    """llama-np as llama-bench measures: pp and tg tok/s."""
    model, vocab = llm.model, llm.config.vocab_size
    ids = rng.integers(0, vocab, prompt)
    cache = llm.new_cache(prompt + 1)
    t0 = time.perf_counter()
    model.forward(ids, cache)
    pp = prompt / (time.perf_counter() - t0)
    cache = llm.new_cache(gen + 2)
    model.forward(ids[:1], cache)
    t0 = time.perf_counter()
    for t in rng.integers(0, vocab, gen):
        model.forward(np.array([t]), cache)
    return {"pp": pp, "tg": gen / (time.perf_counter() - t0)}


def ours_batch(llm, pp: int, tg: int, batch: int, rng: np.random.Generator) -> float:
    """llama-np as llama-batched-bench measures S_TG: the aggregate tok/s of tg steps of
    B sequences, each after a prompt of pp tokens of its own."""
    model, vocab = llm.model, llm.config.vocab_size
    caches = [llm.new_cache(pp + tg + 1) for _ in range(batch)]
    for cache in caches:
        model.forward(rng.integers(0, vocab, pp), cache)
    t0 = time.perf_counter()
    for _ in range(tg):
        model.step_batch(rng.integers(0, vocab, batch), caches)
    return batch * tg / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a GGUF file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-p", "--prompt", type=int, default=512)
    ap.add_argument("-n", "--gen", type=int, default=64)
    ap.add_argument("--batch", default="16", help="comma-separated B for batched decode")
    ap.add_argument("--pp", type=int, default=128, help="each batched sequence's prompt")
    ap.add_argument("--tg", type=int, default=32, help="batched steps timed")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    batches = [int(b) for b in a.batch.split(",") if b]
    rng = np.random.default_rng(0)
    runs: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        runs.setdefault(name, []).append(value)

    with llama_np.load(a.model, threads=a.threads) as llm:
        llm.model.warm_up("f32", batches)
        for r in range(a.rounds):
            for k, v in llama_bench(a.model, a.threads, a.prompt, a.gen).items():
                add(f"llama.cpp {k}", v)
            for k, v in ours_one(llm, a.prompt, a.gen, rng).items():
                add(f"llama-np {k}", v)
            for b in batches:
                add(f"llama.cpp B={b}", batched_bench(a.model, a.threads, a.pp, a.tg, b))
                add(f"llama-np B={b}", ours_batch(llm, a.pp, a.tg, b, rng))
            print(f"peers_bench.py: round {r + 1} of {a.rounds} done", file=sys.stderr)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    print(f"{Path(a.model).name}, {a.threads} threads, medians of {a.rounds} rounds (tok/s):")
    for what in ["pp", "tg", *(f"B={b}" for b in batches)]:
        ours, theirs = medians[f"llama-np {what}"], medians[f"llama.cpp {what}"]
        print(
            f"  {what:6s} llama-np {ours:9.1f}  llama.cpp {theirs:9.1f}  ratio {ours / theirs:.2f}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "threads": a.threads,
                                            "prompt": a.prompt, "gen": a.gen, "runs": runs,
                                            "medians": medians}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
