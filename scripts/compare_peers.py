#!/usr/bin/env python3
"""llama-np against its peers, side by side, in one run, on the same model and prompt.

Engines: llama-np in each weight format, on its compiled kernels (numba) and on its NumPy
kernels; transformers on torch (f32, eager) when installed; llama.cpp's llama-bench
(scripts/llama_cpp.sh) on the native file and on GGUF files written with the gguf package
from the same weights. Each engine lives in its own process, loaded once and kept for the
whole run, so no engine's thread pool can disturb another's (an idle OpenMP or ggml pool
that spins steals a core). They run in interleaved rounds
(every engine once per round, the others blocked on a pipe), and each ratio to llama-np
f32 is the median of per-round ratios, because absolute times drift by tens of percent
on a shared machine.

Per engine and round: prefill of a 128-token prompt (tok/s), then 64 greedy decode steps
(ms/token; the first, warm-up step is not counted). bytes/token: llama-np's meter; for
the peers, the speed-of-light model's count of their format at rest.

    .venv/bin/python scripts/compare_peers.py                  # SmolLM2-135M, 2 threads
    .venv/bin/python scripts/compare_peers.py -m qwen2.5-coder-0.5b --rounds 3 --json out.json
    .venv/bin/python scripts/compare_peers.py --batch 4,16,64   # batched decode (peers_batch.py)

scripts/results.sh runs both for docs/results.md; llama.cpp comes from scripts/llama_cpp.sh.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
from peers_files import gguf_bytes_per_token, write_gguf

import llama_np
from bench.probe import machine_id
from bench.sol import estimate, weights_label
from llama_arch import Config
from llama_np.io.hub import resolve_model
from llama_np.model.decoder import weight_plan

PROMPT_TOKENS, DECODE_STEPS = 128, 64


class Engine:
    """prefill(ids) -> last logits; step(token) -> logits, timed by `turn` (run_round); an
    engine that times itself (llama-bench) has a `turn` of its own instead."""

    name: str
    bytes_per_token: float

    def prefill(self, ids: list[int]) -> np.ndarray: ...

    def step(self, token: int) -> np.ndarray: ...

    def turn(self, ids: list[int]) -> tuple[float, float]:
        """(prefill tok/s, decode ms/token) of one round."""
        return run_round(self, ids)


class LlamaNp(Engine):
    def __init__(self, path: Path, kernels: str, weights: str | None, threads: int) -> None:
        self.llm = llama_np.load(path, weights=weights, threads=threads, kernels=kernels)
        w, h, _ = weight_plan(self.llm.model.weights, self.llm.config)
        w = weights_label(w)
        stored = " (as stored)" if weights is None else ""
        self.name = f"llama-np {kernels} {w if w == h else w + '/' + h}{stored}"
        self.bytes_per_token = 0.0

    def prefill(self, ids: list[int]) -> np.ndarray:
        self.cache = self.llm.new_cache(ctx=PROMPT_TOKENS + DECODE_STEPS + 8)
        return self.llm.model.forward(np.asarray(ids), self.cache)

    def step(self, token: int) -> np.ndarray:
        out = self.llm.step(token, self.cache)
        self.bytes_per_token = self.llm.model.meter.last.bytes_read
        return out


class Transformers(Engine):
    def __init__(self, gguf: Path, threads: int, config: Config) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        self.name = "transformers (torch eager) f32"
        self.bytes_per_token = estimate(
            config, "f32", pos=PROMPT_TOKENS + DECODE_STEPS // 2
        ).bytes_per_token

    def prefill(self, ids: list[int]) -> np.ndarray:
        with self.torch.no_grad():
            out = self.model(self.torch.tensor([ids]), use_cache=True)
        self.past = out.past_key_values
        return out.logits[0, -1].numpy()

    def step(self, token: int) -> np.ndarray:
        with self.torch.no_grad():
            out = self.model(
                self.torch.tensor([[token]]), past_key_values=self.past, use_cache=True
            )
        self.past = out.past_key_values
        return out.logits[0, -1].numpy()


class LlamaBench(Engine):
    """llama.cpp's own benchmark, llama-bench (C++, the same source llama-cpp-python
    vendors; its binding adds ~0.6 ms a token), a run per round: pp of the prompt's length
    and tg of DECODE_STEPS tokens (from an empty context, where ours decode after the
    prompt: at 128-192 keys, a little less attention for it)."""

    def __init__(self, gguf: Path, label: str, threads: int, config: Config) -> None:
        from peers_bench import llama_bench

        self.run, self.gguf, self.threads = llama_bench, str(gguf), threads
        self.name = f"llama.cpp {label}"
        self.bytes_per_token = gguf_bytes_per_token(gguf, config, PROMPT_TOKENS + DECODE_STEPS // 2)

    def turn(self, ids: list[int]) -> tuple[float, float]:
        """(prefill tok/s, decode ms/token) of one llama-bench run."""
        r = self.run(self.gguf, self.threads, len(ids), DECODE_STEPS)
        return r["pp"], 1e3 / r["tg"]


def run_round(engine: Engine, ids: list[int]) -> tuple[float, float]:
    """(prefill tok/s, decode ms/token) of one turn."""
    t0 = time.perf_counter()
    logits = engine.prefill(ids)
    prefill = len(ids) / (time.perf_counter() - t0)
    token = int(np.argmax(logits))
    engine.step(token)  # warm-up step, not counted
    t0 = time.perf_counter()
    for _ in range(DECODE_STEPS):
        token = int(np.argmax(engine.step(token)))
    return prefill, 1e3 * (time.perf_counter() - t0) / DECODE_STEPS


def make_engine(spec: tuple, path: Path, work: Path, threads: int) -> Engine:
    """Build one engine (in its own process)."""
    kind, arg = spec
    if kind == "llama-np":
        return LlamaNp(path, *arg, threads)
    with llama_np.load(path, threads=1) as llm:
        config = llm.config
    if kind == "transformers":
        return Transformers(path, threads, config)
    native = arg not in ("F32", "Q8_0")
    gguf = path if native else write_gguf(path, work / f"{arg.lower()}.gguf", arg)
    label = arg if arg == "as stored" else f"{arg} (as stored)" if native else arg
    return LlamaBench(gguf, label, threads, config)


def serve(conn, spec: tuple, path: Path, work: Path, threads: int, ids: list[int]) -> None:
    """An engine's process: build it, report its name, then run a turn per request."""
    engine = make_engine(spec, path, work, threads)
    conn.send((engine.name, engine.bytes_per_token))
    while conn.recv() == "round":
        result = engine.turn(ids)
        conn.send((*result, engine.bytes_per_token))


NATIVE = {"smollm2-135m": "Q4_1", "qwen2.5-coder-0.5b": "Q4_K_M"}  # llama.cpp's labels


FORMATS = ["f32", "q8_0", "q4_0", "stored"]


def specs(native: str, kernels: list[str], formats: list[str] = FORMATS) -> list[tuple]:
    """The engines; the first, llama-np's first kernels in its first format (f32 unless
    `formats` leaves it out), is the base of the ratios. numba-int8 / numba-int16 run only
    the formats they multiply in integers (f32 is numba-f32's). `formats`: llama-np's
    (stored: as the file holds it), and llama.cpp's F32 and Q8_0 files where named (its
    native file always); transformers only with f32."""
    from quant.backends import numba_importable

    if not numba_importable():
        print("compare_peers: numba is not installed, only the NumPy kernels", file=sys.stderr)
        kernels = ["numpy"]
    weights = [None if f == "stored" else f for f in formats]  # None: as stored
    ours = [(k, w) for k in kernels for w in weights
            if not (k in ("numba-int8", "numba-int16") and w == "f32")]  # fmt: skip
    out: list[tuple] = [("llama-np", spec) for spec in ours]
    peers = [("llama-bench", ("llama.cpp", native))]
    if "f32" in formats:
        peers[:0] = [("transformers", ("transformers", None)),
                     ("llama-bench", ("llama.cpp", "F32"))]  # fmt: skip
    if "q8_0" in formats:
        peers.insert(-1, ("llama-bench", ("llama.cpp", "Q8_0")))
    for needs, spec in peers:
        if available(needs):
            out.append(spec)
        else:
            print(f"compare_peers: no {needs} here (scripts/llama_cpp.sh builds llama-bench), "
                  "skipping it", file=sys.stderr)  # fmt: skip
    return out


def available(needs: str) -> bool:
    """llama-bench where peers_bench runs it (beside this interpreter), or an importable
    module."""
    if needs == "llama-bench":
        from peers_bench import BIN

        return (BIN / needs).is_file()
    return importlib.util.find_spec(needs) is not None


def start_engines(args, path: Path, work: Path, ids: list[int]) -> list[tuple]:
    """Each engine in its own process, loaded once: (name, connection, process, bytes)."""
    ctx = mp.get_context("spawn")  # a clean interpreter per engine
    engines = []
    for spec in specs(NATIVE.get(args.model, "as stored"), args.kernels.split(","), args.formats):
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(
            target=serve, args=(theirs, spec, path, work, args.threads, ids), daemon=True
        )
        proc.start()
        name, size = ours.recv()  # built and loaded: it stays so until the end
        engines.append((name, ours, proc, size))
        print(f"compare_peers: loaded {name}", file=sys.stderr)
    return engines


def run_rounds(engines: list[tuple], rounds: int) -> tuple[dict, dict]:
    """Interleaved rounds: (prefill tok/s, decode ms/token) per engine per round, and the
    bytes per token each reported."""
    results: dict[str, list[tuple[float, float]]] = {e[0]: [] for e in engines}
    sizes = {e[0]: e[3] for e in engines}
    for r in range(rounds):
        for name, conn, _, _ in engines:
            time.sleep(0.3)  # let the previous engine's threads go idle
            conn.send("round")
            prefill, decode, size = conn.recv()
            results[name].append((prefill, decode))
            sizes[name] = size or sizes[name]
        print(f"compare_peers: round {r + 1}/{rounds} done", file=sys.stderr)
    for _, conn, proc, _ in engines:
        conn.send("stop")
        proc.join(timeout=30)
    return results, sizes


def table(results: dict, sizes: dict) -> str:
    names = list(results)
    base = results[names[0]]
    lines = [
        f"| engine | decode ms/token (median, min-max) | ratio to {names[0]} | prefill tok/s "
        f"({PROMPT_TOKENS} tokens) | MB/token | GB/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        ms = [d for _, d in results[name]]
        ratio = statistics.median(d / b for (_, d), (_, b) in zip(results[name], base, strict=True))
        med = statistics.median(ms)
        prefill = statistics.median(p for p, _ in results[name])
        lines.append(
            f"| {name} | {med:.1f} ({min(ms):.1f}-{max(ms):.1f}) | {ratio:.2f} | {prefill:.0f} | "
            f"{sizes[name] / 1e6:.1f} | {sizes[name] / med / 1e6:.1f} |"
        )
    return "\n".join(lines)


def run(model: str, threads: int, rounds: int, kernels: str, work: Path | None = None,
        formats: list[str] = FORMATS) -> dict:  # fmt: skip
    """Every engine on the model's file, in interleaved rounds: {"machine", "model", "file",
    "threads", "rounds": {engine: [[prefill tok/s, decode ms], ...]}, "bytes_per_token"}."""
    machine = machine_id(threads)  # before a peer's import loads its own OpenMP
    path = resolve_model(model)
    work = work or path.parent / f"compare-{path.stem}"
    work.mkdir(parents=True, exist_ok=True)
    text = (Path(__file__).resolve().parents[1] / "data" / "gpl-3.0.txt").read_text()
    with llama_np.load(path, threads=1) as llm:
        ids = llm.tokenize(text, bos=False)[:PROMPT_TOKENS]
    args = argparse.Namespace(model=model, threads=threads, kernels=kernels, formats=formats)
    results, sizes = run_rounds(start_engines(args, path, work, ids), rounds)
    return {"machine": machine, "model": model, "file": path.name, "threads": threads,
            "rounds": results, "bytes_per_token": sizes,
            "llama_cpp": "llama-bench, pp and tg"}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-m", "--model", default="smollm2-135m", help="a .gguf file or alias")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default=None, help="where to write the converted GGUF files")
    ap.add_argument("--json", help="also write the rounds to this file")
    ap.add_argument(
        "--kernels",
        default="numba-f32,numba-int16,numba-int8,numpy",
        help="llama-np's kernel backends to run (default: %(default)s)",
    )
    ap.add_argument("--batch", help="B1,B2,...: batched decode throughput against llama.cpp "
                    "instead (scripts/peers_batch.py)")  # fmt: skip
    ap.add_argument("--formats", default=None,
                    help="llama-np formats, each against llama.cpp's (default: f32,q8_0,q4_0,stored; with --batch f32,q8_0,stored)")  # fmt: skip
    ap.add_argument("--steps", type=int, default=16, help="with --batch: timed steps per B")
    args = ap.parse_args()
    work = Path(args.work) if args.work else None
    if args.batch:
        import peers_batch

        batches = [int(b) for b in args.batch.split(",")]
        formats = (args.formats or "f32,q8_0,stored").split(",")
        out = peers_batch.compare(args.model, args.threads, batches, formats, args.rounds,
                                  args.steps, work)  # fmt: skip
        print(peers_batch.table(out))
    else:
        formats = args.formats.split(",") if args.formats else FORMATS
        out = run(args.model, args.threads, args.rounds, args.kernels, work, formats)
        print(table(out["rounds"], out["bytes_per_token"]))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
