#!/usr/bin/env python3
"""`llama-np serve` against llama.cpp's own server, `llama-server` (C++, continuous batching,
built for this CPU by scripts/llama_cpp.sh from llama-cpp-python's source), on the same
GGUF, threads and slots, both driven by `bench --endpoint` (bench/endpoint.py) at each
concurrency: time to first token, inter-token latency, aggregate tok/s. llama-cpp-python's
Python server (one request at a time) can be a row too (--peers). One server runs at a
time (2 cores); rounds interleave concurrencies within a server. Also what llama-np's
decode steps ran at (its /metrics) beside `bench --batch B` of the same model, the cost of
HTTP and scheduling.

    .venv/bin/python scripts/peers_serve.py smollm2-135m --concurrency 1,4,16
    .venv/bin/python scripts/peers_serve.py qwen2.5-coder-0.5b --peers llama-server,llama-cpp-python
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench import endpoint

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], base: str) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"})  # fmt: skip
    for _ in range(600):
        try:
            if httpx.get(base + "/models", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}")
        time.sleep(0.5)
    raise RuntimeError(f"{' '.join(cmd)} did not start")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def ours(path: Path, threads: int, slots: int, port: int) -> list[str]:
    return [PY, "-m", "llama_np", "serve", "-m", str(path), "-t", str(threads), "-np",
            str(slots), "-c", "1024", "--port", str(port)]  # fmt: skip


def llama_server(path: Path, threads: int, slots: int, port: int) -> list[str]:
    # each slot 1024 positions of the shared (unified) KV pool, as llama-np's -c 1024 each
    binary = Path(sys.executable).parent / "llama-server"
    return [str(binary), "-m", str(path), "-t", str(threads), "-tb", str(threads), "-np",
            str(slots), "-c", str(1024 * slots), "--host", "127.0.0.1", "--port", str(port),
            "--no-webui"]  # fmt: skip


def theirs(path: Path, threads: int, slots: int, port: int) -> list[str]:
    # llama-cpp-python 0.3.36 built for this CPU (scripts/llama_cpp.sh); its server runs
    # one request at a time. By default it cuts a running stream short whenever another
    # request waits (interrupt_requests): every concurrent stream would end early.
    return [PY, "-m", "llama_cpp.server", "--model", str(path), "--n_threads", str(threads),
            "--n_threads_batch", str(threads), "--n_ctx", "1024", "--port", str(port),
            "--interrupt_requests", "False"]  # fmt: skip


def metrics_steps(base: str) -> dict[str, dict[str, float]]:
    """Our server's decode steps per batch size: tok/s and measured/SOL (its /metrics)."""
    text = httpx.get(base.removesuffix("/v1") + "/metrics").text
    out: dict[str, dict[str, float]] = {}
    for m in re.finditer(r'^llamanp_(\w+)\{batch="(\d+)"\} (\S+)$', text, re.M):
        out.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
    return out


SERVERS = {"llama-np serve": ours, "llama-server": llama_server,
           "llama-cpp-python server": theirs}  # fmt: skip
PEERS = ("llama-server",)


def compare(model: str, threads: int, concurrency: list[int], rounds: int, n: int,
            prompt: int, peers: tuple[str, ...] = PEERS) -> dict:  # fmt: skip
    """llama-np serve, then each peer (SERVERS' names): their rows, and llama-np's steps."""
    from llama_np.io.hub import resolve_model

    path = resolve_model(model)
    out = {"model": model, "file": path.name, "threads": threads, "concurrency": concurrency,
           "rounds": rounds, "n": n, "prompt": prompt, "servers": {}}  # fmt: skip
    for name in ("llama-np serve", *peers):
        command = SERVERS[name]
        port = free_port()
        base = f"http://127.0.0.1:{port}/v1"
        proc = start(command(path, threads, max(concurrency), port), base)
        try:
            served, _ = endpoint.served_model(base)
            rows = endpoint.measure(base, served, tuple(concurrency), prompt, n, rounds)
            steps = metrics_steps(base) if name.startswith("llama-np") else {}
        finally:
            stop(proc)
        out["servers"][name] = {"rows": [dataclasses.asdict(r) for r in rows], "steps": steps}
    out["bench_batch"] = bench_batch(path, threads, concurrency)
    return out


def bench_batch(path: Path, threads: int, batches: list[int]) -> dict[str, float]:
    """`llama-np bench --batch` of the same file: tok/s per B, decode steps alone."""
    import json

    cmd = [PY, "-m", "llama_np", "bench", "-m", str(path), "-t", str(threads), "--batch",
           ",".join(map(str, batches)), "-n", "32", "-r", "3", "--json"]  # fmt: skip
    rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return {str(r["batch"]): r["tok_s"] for r in rows["rows"]}


def steps_line(d: dict) -> str:
    """What HTTP and scheduling cost: the server's decode steps (its /metrics) and its
    end-to-end aggregate tok/s, each over `bench --batch B` of the same file."""
    ours = next(s for n, s in d["servers"].items() if n.startswith("llama-np"))
    parts = []
    for r in ours["rows"]:
        c = str(r["concurrency"])
        if c in d["bench_batch"] and c in ours["steps"]:
            bench = d["bench_batch"][c]
            steps = ours["steps"][c]["decode_tokens_per_second"]
            parts.append(f"C = {c}: bench --batch {c} {bench:.1f} tok/s; the server's steps of "
                         f"{c} sequences {steps:.1f} ({steps / bench:.2f}x), end to end "
                         f"{r['tok_s']:.1f} ({r['tok_s'] / bench:.2f}x)")  # fmt: skip
    return "Against `llama-np bench --batch` of the same file: " + "; ".join(parts) + "."


def peer_of(d: dict) -> str:
    """The first server beside llama-np's (llama-server; llama-cpp-python's in older runs)."""
    return next(n for n in d["servers"] if not n.startswith("llama-np"))


def ratio(d: dict, c: int, peer: str | None = None, key: str = "tok_s_rounds") -> float:
    """llama-np over `peer` (default: peer_of) at concurrency c, the median of per-round
    ratios (round r of one server against round r of the other): aggregate tok/s, or (key
    ttft_rounds) time to first token."""
    peer = peer or peer_of(d)
    ours_r, theirs_r = (next(r for r in d["servers"][name]["rows"] if r["concurrency"] == c)[key]
                        for name in ("llama-np serve", peer))  # fmt: skip
    return statistics.median(a / b for a, b in zip(ours_r, theirs_r, strict=True))


def table(d: dict) -> str:
    lines = ["| server | C | gen tok / request | TTFT ms median (p90) | ITL ms median (p90) | "
             "aggregate tok/s | llama-np / this: tok/s, TTFT |",
             "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, s in d["servers"].items():
        for r in s["rows"]:
            c = r["concurrency"]
            x = "" if name.startswith("llama-np") else f"{ratio(d, c, name):.2f}x"
            if not name.startswith("llama-np") and "ttft_rounds" in r:
                x += f", {ratio(d, c, name, 'ttft_rounds'):.2f}x"
            lines.append(f"| {name} | {c} | {r['tokens']:.0f} | {r['ttft_ms']:.0f} "
                         f"({r['ttft_p90_ms']:.0f}) | {r['itl_ms']:.1f} ({r['itl_p90_ms']:.1f}) | "
                         f"{r['tok_s']:.1f} | {x} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-p", "--prompt", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("--peers", default=",".join(PEERS),
                    help=f"servers beside llama-np's, of {', '.join(list(SERVERS)[1:])}")  # fmt: skip
    a = ap.parse_args()
    d = compare(a.model, a.threads, [int(c) for c in a.concurrency.split(",")], a.rounds, a.n,
                a.prompt, tuple(a.peers.split(",")))  # fmt: skip
    print(table(d))


if __name__ == "__main__":
    main()
