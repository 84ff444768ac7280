"""Before/after benchmark of a refactor: decode and prefill, both kernel backends, three
weight formats, batch 1 and 16, on a synthetic SmolLM2-135M. Two checkouts are run cell by
cell, alternately (never two at once), for several rounds; each figure is the median of
the rounds, so drift of a noisy machine falls on both sides alike.

    python scripts/bench_refactor.py --before ../main --rounds 3 --out docs/refactor-bench.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

MODEL = "synthetic:smollm2-135m"
FORMATS = ("f32", "q8_0", "q4_0")
KERNELS = ("numpy", "numba")
BATCHES = (1, 16)


def bench(checkout: Path, kernels: str, fmt: str, batch: int) -> dict:
    """One `llama-np bench` of the checkout in `checkout`: prefill tok/s, step ms."""
    cmd = [sys.executable, "-m", "llama_np", "bench", "-m", MODEL, "--weights", fmt,
           "--kernels", kernels, "-p", "32", "-n", "16", "-r", "3", "--json"]  # fmt: skip
    if batch > 1:
        cmd += ["--batch", str(batch)]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True,
                                    cwd=checkout).stdout)  # fmt: skip
    row = out["rows"][0]
    return {"prefill_tok_s": row["prefill_tok_s"], "step_ms": row["step_ms"],
            "tok_s": row["tok_s"], "label": row["kernels"], "machine": out["machine"]}  # fmt: skip


def median_of(runs: list[dict], key: str) -> float:
    values = [r[key] for r in runs if r[key] is not None and not math.isnan(r[key])]
    return statistics.median(values) if values else math.nan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="the checkout before")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    after = Path.cwd()
    rows = []
    print(
        "| kernels | weights | batch | prefill tok/s before / after | decode tok/s before / after | after/before |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for k in KERNELS:
        for f in FORMATS:
            for b in BATCHES:
                runs: dict[str, list[dict]] = {"before": [], "after": []}
                for _ in range(a.rounds):
                    runs["before"].append(bench(a.before, k, f, b))
                    runs["after"].append(bench(after, k, f, b))
                row = {"kernels": k, "weights": f, "batch": b, "runs": runs}
                for side in runs:
                    row[f"{side}_prefill"] = median_of(runs[side], "prefill_tok_s")
                    row[f"{side}_tok_s"] = median_of(runs[side], "tok_s")
                rows.append(row)
                pre = "-" if b > 1 else f"{row['before_prefill']:.0f} / {row['after_prefill']:.0f}"
                ratio = row["after_tok_s"] / row["before_tok_s"]
                print(f"| {runs['after'][0]['label']} | {f} | {b} | {pre} | "
                      f"{row['before_tok_s']:.1f} / {row['after_tok_s']:.1f} | {ratio:.2f} |", flush=True)  # fmt: skip
    a.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
