#!/usr/bin/env python3
"""Each weight format's kernels in isolation: ns per weight and GB/s of the format's bytes.

Matrices are cycled through a working set several times the last-level cache, as in a
real decode step (every matrix comes from DRAM). Rows: format x shape x kernel x
threads; timings are medians of interleaved rounds. For the matmul (prefill) kernel,
ns/weight is per weight and per row of x.

    .venv/bin/python scripts/bench_kernels.py            # markdown table on stdout
    .venv/bin/python scripts/bench_kernels.py --quick    # fewer shapes and rounds
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

from bench.probe import Caches, machine_id
from quant import FORMATS as CLASSES
from quant import threads

SHAPES = {  # SmolLM2-135M's stacked matrices, and a 7B-class square
    "qkv 960x576": (960, 576),
    "gate+up 3072x576": (3072, 576),
    "down 576x1536": (576, 1536),
    "4096x4096": (4096, 4096),
}
FORMATS = ["f32", "bf16", "f16", "q8_0", "q4_0", "q4_1"]


def copies_for(shape: tuple[int, int], fmt: str, cache_bytes: int) -> list:
    """Enough distinct matrices of this shape to span 4x the last-level cache."""
    rng = np.random.default_rng(0)
    first = CLASSES[fmt].random(shape, rng)
    n = max(2, -(-4 * cache_bytes // first.nbytes))
    return [first] + [CLASSES[fmt].random(shape, rng) for _ in range(n - 1)]


def time_round(ws: list, kernel: str, x: np.ndarray) -> float:
    """Seconds per matrix, over one pass through all copies."""
    t0 = time.perf_counter()
    for w in ws:
        if kernel == "matvec":
            w.matvec(x[0])
        else:
            w.matmul(x)
    return (time.perf_counter() - t0) / len(ws)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="two shapes, three rounds")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prefill", type=int, default=32, help="rows of x for the matmul kernel")
    args = ap.parse_args()
    shapes = dict(list(SHAPES.items())[1:3]) if args.quick else SHAPES
    rounds = 3 if args.quick else args.rounds
    llc = Caches.read().llc
    threadpool_limits(1)
    modes = ["1 thread", "2 threads", "2 BLAS threads"]
    flags = " --quick" if args.quick else ""
    print("# Kernels in isolation\n")
    print(f"Machine: {machine_id(2)}. Command: `scripts/bench_kernels.py{flags}`.\n")
    print(
        "| shape | format | kernel | "
        + " | ".join(f"ns/weight, {m}" for m in modes)
        + " | best GB/s of format bytes |"
    )
    print("|---|---|---|" + "---:|" * (len(modes) + 1))
    for label, shape in shapes.items():
        sets = {fmt: copies_for(shape, fmt, llc) for fmt in FORMATS}
        x = np.random.default_rng(1).standard_normal((args.prefill, shape[1])).astype(np.float32)
        for kernel in ("matvec", "matmul"):
            times: dict[tuple[str, str], list[float]] = {}
            for mode in modes:
                threadpool_limits(2 if mode == "2 BLAS threads" else 1)
                threads.set_threads(2 if mode == "2 threads" else 1)
                for _ in range(rounds):  # interleaved: every format once per round
                    for fmt, ws in sets.items():
                        t = time_round(ws, kernel, x)
                        times.setdefault((fmt, mode), []).append(t)
                threads.set_threads(1)
            n = shape[0] * shape[1] * (1 if kernel == "matvec" else args.prefill)
            for fmt, ws in sets.items():
                med = [statistics.median(times[(fmt, m)]) for m in modes]
                best = ws[0].nbytes / min(med) / 1e9
                cells = [label, fmt, kernel, *(f"{t / n * 1e9:.3f}" for t in med), f"{best:.1f}"]
                print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
