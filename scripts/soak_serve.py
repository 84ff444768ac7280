#!/usr/bin/env python3
"""Soak `llama-np serve`: a few thousand requests at concurrency 32 on 4 slots against a
server of its own on 127.0.0.1 (an API key and every limit on), streamed and whole, a tenth
cancelled mid-stream, a tenth invalid (bench/soak.py). Reports the server's RSS, open
descriptors and threads at the start, after the first tenth and at the end, whether every
slot is free, every status seen, and whether the temperature-0 answers equal `generate`'s.

Exits 1 when a target is missed: RSS at the end more than 5% above RSS after the first
tenth, a descriptor or thread more than then, a slot busy, a 5xx other than the queue's 503,
a refusal other than the expected 4xx, a text unlike `generate`'s, or the key in the log.

    .venv/bin/python scripts/soak_serve.py                     # SmolLM2-135M if cached
    .venv/bin/python scripts/soak_serve.py -m tiny -n 300      # a tiny random checkpoint
"""

from __future__ import annotations

import argparse
import json
import platform
import secrets
import signal
import sys
import tempfile
from pathlib import Path

from bench.soak import REFERENCE, REFERENCE_TOKENS, Soak, soak, start_server, tiny_checkpoint

RSS_WITHIN = 0.05  # the end's RSS over the first tenth's, at most


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default=None,
                   help="a model as `serve -m` takes it, or 'tiny' (default: smollm2-135m if "
                        "cached, else tiny)")  # fmt: skip
    p.add_argument("-n", "--requests", type=int, default=3000)
    p.add_argument("-C", "--concurrency", type=int, default=32)
    p.add_argument("-np", "--parallel", type=int, default=4)
    p.add_argument("-c", "--ctx-size", type=int, default=256)
    p.add_argument("--kernels", default=None, help="default: numpy for tiny, else auto")
    p.add_argument("--seconds", type=float, default=600.0, help="stop sending after this")
    p.add_argument("--json", action="store_true", help="the figures as JSON")
    return p.parse_args()


def pick_model(spec: str | None, tmp: Path) -> tuple[str, str]:
    """The model to serve and its name in the report."""
    from llama_np.io.hub import MODELS, cached_path

    if spec is None:
        path = cached_path(MODELS["smollm2-135m"])
        spec = str(path) if path.exists() else "tiny"
    if spec == "tiny":
        return str(tiny_checkpoint(tmp / "tiny")), "tiny (random, d=64, 2 layers)"
    return spec, Path(spec).name


def references(model: str, kernels: str) -> dict[str, str]:
    """`generate`'s temperature-0 text of each reference prompt (after the server stopped:
    two processes must not share 2 cores while one is measured)."""
    import llama_np

    with llama_np.load(model, kernels=kernels) as llm:
        return {p: llm.generate(p, REFERENCE_TOKENS, temp=0) for p in REFERENCE}


def cpu() -> str:
    """The CPU as lscpu names it, with its family and model (a VM may say only "AMD EPYC")."""
    info: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    name = info.get("model name") or platform.processor()
    return f"{name} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"


def verdict(result: Soak, refs: dict[str, str], log: str, key: str) -> list[str]:
    """The targets missed (none: passed)."""
    s0, s1 = result.stats["10%"], result.stats["end"]
    missed = []
    if s1.rss_mb > s0.rss_mb * (1 + RSS_WITHIN):
        missed.append(f"RSS grew {100 * (s1.rss_mb / s0.rss_mb - 1):.1f}% after the first tenth")
    if s1.fds > s0.fds or s1.threads > s0.threads:
        missed.append(f"descriptors {s0.fds} -> {s1.fds}, threads {s0.threads} -> {s1.threads}")
    if not result.slots_free:
        missed.append("a slot is still busy")
    if result.server_errors:
        missed.append(f"{result.server_errors} responses 5xx other than 503")
    missed += result.unexpected[:10]
    unlike = [p for p, texts in result.texts.items() for t in texts if t != refs[p]]
    if unlike or not result.texts:
        missed.append(f"{len(unlike)} temperature-0 texts unlike generate's "
                      f"(of {sum(map(len, result.texts.values()))})")  # fmt: skip
    if key in log:
        missed.append("the API key is in the server's log")
    return missed


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model, name = pick_model(args.model, Path(tmp))
        kernels = args.kernels or ("numpy" if name.startswith("tiny") else "auto")
        key, log = "sk-soak-" + secrets.token_hex(16), Path(tmp) / "server.log"
        limits = {"ctx": args.ctx_size, "max_tokens": 64, "max_n": 2, "max_body": 65536}
        cmd = [sys.executable, "-m", "llama_np", "serve", "-m", model, "--kernels", kernels,
               "--host", "127.0.0.1", "--port", "0", "-np", str(args.parallel),
               "-c", str(args.ctx_size), "--max-tokens-limit", "64", "--max-n", "2",
               "--max-body-bytes", "65536", "--request-timeout", "10"]  # fmt: skip
        proc, base = start_server(cmd, log, env={"LLAMA_NP_API_KEY": key})
        try:
            result = soak(base, proc.pid, args.requests, args.concurrency, key, limits,
                          args.seconds)  # fmt: skip
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        refs = references(model, kernels)
        missed = verdict(result, refs, log.read_text(), key)
    report(args, name, kernels, result, missed)
    return 1 if missed else 0


def report(args, name: str, kernels: str, result: Soak, missed: list[str]) -> None:
    stats = {k: vars(v) for k, v in result.stats.items()}
    if args.json:
        print(json.dumps({"model": name, "kernels": kernels, "cpu": cpu(),
                          "requests": result.requests, "concurrency": args.concurrency,
                          "slots": args.parallel, "seconds": result.seconds, "stats": stats,
                          "statuses": result.statuses, "slots_free": result.slots_free,
                          "missed": missed}, indent=1))  # fmt: skip
        return
    print(f"soak: {name}, {kernels} kernels, {cpu()}")
    print(
        f"{result.requests} requests at concurrency {args.concurrency} on {args.parallel} "
        f"slots in {result.seconds:.0f} s; statuses {dict(sorted(result.statuses.items()))}"
    )
    print(f"{'':>6} {'RSS MB':>8} {'fds':>5} {'threads':>7}")
    for k, v in result.stats.items():
        print(f"{k:>6} {v.rss_mb:8.1f} {v.fds:5d} {v.threads:7d}")
    s0, s1 = result.stats["10%"], result.stats["end"]
    print(
        f"RSS end / 10%: {s1.rss_mb / s0.rss_mb:.4f}; slots free: {result.slots_free}; "
        f"temperature-0 texts compared: {sum(map(len, result.texts.values()))}"
    )
    print("targets: " + ("met" if not missed else "MISSED: " + "; ".join(missed)))


if __name__ == "__main__":
    sys.exit(main())
