"""`compare_peers.py --batch 4,16,64`: aggregate decode throughput of B sequences stepped
together, llama-np against llama.cpp on the same file and threads.

llama.cpp is its own llama-batched-bench (scripts/llama_cpp.sh): B sequence ids in one
KV cache, every sequence's logits each step; its S_TG (the steps' aggregate tok/s) gives
the step time. llama-np runs `Transformer.step_batch` with a KV cache per sequence. Both
prefill an 8-token prompt per sequence (not timed), then time `steps` decode steps;
llama-np's row is the median step. Each engine lives in its own process (spawned, so
neither thread pool disturbs the other), rounds interleaved.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from pathlib import Path

import numpy as np

PROMPT = 8  # tokens per sequence, as in the figures llama-batched-bench is quoted with


def tokens(b: int, step: int) -> list[int]:
    return [(1000 + 37 * s + 11 * step) % 30000 for s in range(b)]


class OursBatch:
    def __init__(self, path: Path, weights: str | None, threads: int) -> None:
        import llama_np

        self.llm = llama_np.load(path, weights=weights, threads=threads, kernels="numba")
        self.name = f"llama-np numba {weights or 'as stored'}"

    def steps(self, b: int, n: int) -> list[float]:
        llm = self.llm
        caches = [llm.new_cache(PROMPT + n + 2) for _ in range(b)]
        for s, c in enumerate(caches):
            llm.model.forward(np.array(tokens(PROMPT, s)), c)
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            llm.model.step_batch(np.array(tokens(b, i)), caches)
            out.append(time.perf_counter() - t0)
        return out


class TheirsBatch:
    """llama.cpp's own llama-batched-bench (C++), a run per round and B: B sequences of
    PROMPT tokens each, then n steps of all of them; its S_TG (aggregate tok/s) as the
    step's time."""

    def __init__(self, path: Path, label: str, threads: int) -> None:
        self.path, self.threads = str(path), threads
        self.name = f"llama.cpp {label}"

    def steps(self, b: int, n: int) -> list[float]:
        from peers_bench import batched_bench

        return [b / batched_bench(self.path, self.threads, PROMPT, n, b)]


def serve(conn, spec: tuple, path: Path, work: Path, threads: int, batches: list[int],
          n: int) -> None:  # fmt: skip
    from peers_files import write_gguf

    kind, arg = spec
    if kind == "llama-np":
        engine = OursBatch(path, arg, threads)
    else:
        native = arg not in ("F32", "Q8_0")
        gguf = path if native else write_gguf(path, work / f"{arg.lower()}.gguf", arg)
        engine = TheirsBatch(gguf, f"{arg} (as stored)" if native else arg, threads)
    conn.send(engine.name)
    while conn.recv() == "round":
        conn.send({b: 1e3 * statistics.median(engine.steps(b, n)) for b in batches})


def run(path: Path, work: Path, pairs: list[tuple], threads: int, batches: list[int],
        rounds: int, n: int) -> dict:  # fmt: skip
    """{engine name: {B: [median step ms per round]}}"""
    ctx = mp.get_context("spawn")
    engines = []
    for spec in pairs:
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=serve, args=(theirs, spec, path, work, threads, batches, n))
        proc.start()
        engines.append((ours.recv(), ours, proc))
    results: dict = {name: {b: [] for b in batches} for name, _, _ in engines}
    for r in range(rounds):
        for name, conn, _ in engines[r % 2 :] + engines[: r % 2]:  # alternate who goes first
            conn.send("round")
            for b, ms in conn.recv().items():
                results[name][b].append(ms)
    for _, conn, proc in engines:
        conn.send("stop")
        proc.join()
    return results


NATIVE = {"smollm2-135m": "Q4_1", "qwen2.5-coder-0.5b": "Q4_K_M"}  # llama.cpp's labels


def compare(model: str, threads: int, batches: list[int], formats: list[str], rounds: int,
            steps: int, work: Path | None = None) -> dict:  # fmt: skip
    """llama-np against llama.cpp, format by format ("f32", "q8_0", "stored"): {"machine",
    "model", "threads", "batches", "pairs": [[ours, theirs], ...], "rounds": {engine:
    {B: [median step ms per round]}}}."""
    from bench.probe import machine_id
    from llama_np.io.hub import resolve_model

    machine = machine_id(threads)
    path = resolve_model(model)
    work = work or path.parent / f"compare-{path.stem}"
    work.mkdir(parents=True, exist_ok=True)
    theirs = {"f32": "F32", "q8_0": "Q8_0", "stored": NATIVE.get(model, "native")}
    specs = [s for f in formats for s in (("llama-np", None if f == "stored" else f),
                                          ("llama.cpp", theirs[f]))]  # fmt: skip
    results = run(path, work, specs, threads, batches, rounds, steps)
    names = list(results)
    return {"machine": machine, "model": model, "file": path.name, "threads": threads,
            "llama_cpp": "llama-batched-bench, S_TG", "batches": batches, "steps": steps, "pairs": list(zip(names[::2], names[1::2], strict=True)),
            "rounds": {n: {str(b): ms for b, ms in r.items()} for n, r in results.items()}}  # fmt: skip


def ratio(out: dict, ours: str, theirs: str, b: int) -> float:
    """llama-np's tok/s over llama.cpp's at batch b: the median of per-round ratios."""
    mine, other = out["rounds"][ours][str(b)], out["rounds"][theirs][str(b)]
    return statistics.median(t / o for o, t in zip(mine, other, strict=True))


def table(out: dict) -> str:
    lines = ["| engine | B | step ms (median of rounds; all) | tok/s | llama-np / llama.cpp "
             "tok/s (median of per-round ratios) |", "|---|---:|---|---:|---:|"]  # fmt: skip
    for ours, theirs in out["pairs"]:
        for b in out["batches"]:
            for name in (ours, theirs):
                ms = out["rounds"][name][str(b)]
                r = f"{ratio(out, ours, theirs, b):.2f}" if name == ours else ""
                runs = ", ".join(f"{m:.1f}" for m in ms)
                lines.append(f"| {name} | {b} | {statistics.median(ms):.1f} ({runs}) | "
                             f"{1e3 * b / statistics.median(ms):.1f} | {r} |")  # fmt: skip
    return "\n".join(lines)
