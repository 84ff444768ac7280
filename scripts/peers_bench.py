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


def compare(path: str, threads: int, rounds: int, prompt: int = 512, gen: int = 64,
            batches: tuple[int, ...] = (16,), pp: int = 128, tg: int = 32) -> dict:  # fmt: skip
    """Interleaved rounds of both engines on one file: {"runs": name -> tok/s per round,
    "medians": name -> median} for "llama.cpp pp" / "llama-np pp", tg and each "B=b"."""
    rng = np.random.default_rng(0)
    runs: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        runs.setdefault(name, []).append(value)

    with llama_np.load(path, threads=threads) as llm:
        llm.model.warm_up("f32", list(batches))
        for r in range(rounds):
            for k, v in llama_bench(path, threads, prompt, gen).items():
                add(f"llama.cpp {k}", v)
            for k, v in ours_one(llm, prompt, gen, rng).items():
                add(f"llama-np {k}", v)
            for b in batches:
                add(f"llama.cpp B={b}", batched_bench(path, threads, pp, tg, b))
                add(f"llama-np B={b}", ours_batch(llm, pp, tg, b, rng))
            print(f"peers_bench.py: round {r + 1} of {rounds} done", file=sys.stderr)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    return {"model": path, "threads": threads, "rounds": rounds, "prompt": prompt, "gen": gen,
            "batches": list(batches), "pp": pp, "tg": tg, "runs": runs, "medians": medians}  # fmt: skip


def table(d: dict) -> str:
    """A compare() result as a markdown table: tok/s medians (min-max) and the ratio."""
    out = ["| work | llama-np tok/s | llama.cpp tok/s | ratio |", "|---|---:|---:|---:|"]
    names = {"pp": f"prefill of {d['prompt']} (llama-bench pp)",
             "tg": f"decode of {d['gen']} (llama-bench tg)"}  # fmt: skip
    for what in ["pp", "tg", *(f"B={b}" for b in d["batches"])]:
        cells = []
        for engine in ("llama-np", "llama.cpp"):
            v = d["runs"][f"{engine} {what}"]
            cells.append(f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})")
        ratio = d["medians"][f"llama-np {what}"] / d["medians"][f"llama.cpp {what}"]
        label = names.get(what, f"{what}: {d['tg']} steps after {d['pp']} tokens each "
                                "(llama-batched-bench S_TG)")  # fmt: skip
        out.append(f"| {label} | {cells[0]} | {cells[1]} | {ratio:.2f} |")
    return "\n".join(out)


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
    batches = tuple(int(b) for b in a.batch.split(",") if b)
    d = compare(a.model, a.threads, a.rounds, a.prompt, a.gen, batches, a.pp, a.tg)
    print(f"{Path(a.model).name}, {a.threads} threads, medians of {a.rounds} rounds:")
    print(table(d))
    if a.json:
        Path(a.json).write_text(json.dumps(d, indent=1))


if __name__ == "__main__":
    main()
