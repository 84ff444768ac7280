#!/usr/bin/env python3
"""The compiled backend's products of B vectors against one vector's decode, per format.

Each row: a format, B, and the time of `matmat_into` (B vectors: fewdot.py up to FEW,
igemm's panels beyond) over the time of decode's `matvec_into` (one vector), both on
matrices cycled through 128 MiB (weights from DRAM, as in a model's step); with --panels
also the panels forced at every B. Medians of interleaved rounds, 2 numba threads.

    .venv/bin/python scripts/bench_batch_kernels.py
    .venv/bin/python scripts/bench_batch_kernels.py --shape 3072x576 --dot int8 --panels
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from bench.probe import machine_id
from quant import compiled
from quant.compiled import FORMATS, weights
from quant.errors import QuantError

WORKING_SET = 128 << 20


def seconds(ws: list, f, rounds: int) -> float:
    """Median seconds per matrix of f(w) over the copies."""
    for w in ws[:2]:
        f(w)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for w in ws:
            f(w)
        times.append((time.perf_counter() - t0) / len(ws))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--formats", default="q8_0,q4_1,q4_k,q6_k,f32")
    ap.add_argument("--shape", default="2048x2048", help="rows x columns")
    ap.add_argument("--batch", default="2,3,4,8", help="the Bs")
    ap.add_argument("--dot", default="int16", choices=["int16", "int8", "f32"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--panels", action="store_true", help="also the panels at every B")
    args = ap.parse_args()
    try:
        shape = tuple(int(s) for s in args.shape.split("x"))
        bs = [int(s) for s in args.batch.split(",")]
    except ValueError:
        ap.error("--shape is ROWSxCOLUMNS and --batch a list of integers")
    if len(shape) != 2 or min(shape) < 1 or not all(1 <= b <= 64 for b in bs):
        ap.error("--shape is ROWSxCOLUMNS, each at least 1, and every B 1 to 64")
    formats = args.formats.split(",")
    if unknown := [f for f in formats if f not in FORMATS]:
        ap.error(f"unknown format {unknown[0]} (known: {', '.join(sorted(FORMATS))})")
    compiled.set_threads(2)
    rng = np.random.default_rng(0)
    for fmt in formats:
        try:
            FORMATS[fmt].random(shape, rng)
        except QuantError as e:
            ap.error(str(e))
    few, split = weights.FEW, weights.SPLIT
    x = rng.standard_normal((64, shape[1])).astype(np.float32)
    out = np.empty((64, shape[0]), np.float32)
    print(f"Machine: {machine_id(2)}. Shape {shape[0]} x {shape[1]}, x as {args.dot}.\n")
    print("| format | decode us (1 vector) | B | matmat us | / decode |"
          + (" panels / decode |" if args.panels else ""))  # fmt: skip
    print("|---|---:|---:|---:|---:|" + ("---:|" if args.panels else ""))
    for fmt in formats:
        cls = FORMATS[fmt]
        n = max(2, -(-WORKING_SET // cls.random(shape, rng).nbytes))
        ws = [cls.random(shape, rng) for _ in range(n)]
        one = seconds(ws, lambda w: w.matvec_into(x[0], out[0], dot=args.dot), args.rounds)
        for b in bs:
            xb, ob = x[:b], out[:b]
            t = seconds(ws, lambda w, xb=xb, ob=ob: w.matmat_into(xb, ob, False, args.dot),
                        args.rounds)  # fmt: skip
            cells = [fmt, f"{one * 1e6:.0f}", str(b), f"{t * 1e6:.0f}", f"{t / one:.2f}"]
            if args.panels:
                weights.FEW = weights.SPLIT = 0  # every product to the panels
                p = seconds(ws, lambda w, xb=xb, ob=ob: w.matmat_into(xb, ob, False, args.dot),
                            args.rounds)  # fmt: skip
                weights.FEW, weights.SPLIT = few, split
                cells.append(f"{p / one:.2f}")
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
