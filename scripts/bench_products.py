#!/usr/bin/env python3
"""A decode step's products alone, as the one-call step runs them: each thread takes
chunks of rows from each product phase's counter (quant.compiled.layers.product), every
matrix of a preset (qkv, o, gate_up, down per layer; random weights in one arena, as a
model holds them) one phase after another. Beside them, what bounds them:

- the same bytes as one matrix per row width (what the phases cost, each phase's start,
  barrier and cold stream, is the difference),
- a plain compiled read of the same buffer (uint64 sums, two halves): the DRAM roof for
  a reader that computes nothing,
- a small matrix cycled in L2 (the kernel's arithmetic): cycles per row's block of 32
  weights and thread, from the time per row between two matrix heights (so a phase's
  fixed cost drops out), at the clock `--ghz` (the nominal one by default).

Medians of interleaved calls. Reproduces DEVELOPERS.md's "Prefetch" figures:

    .venv/bin/python scripts/bench_products.py --preset smollm2-360m --formats q8_0,q4_0
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

import numpy as np
from numba import get_num_threads, prange

from bench.probe import machine_id
from llama_arch.presets import PRESETS
from llama_np.model.build import layer_shapes
from quant import arena
from quant.backends import numba_backend
from quant.compiled.jit import kernel
from quant.compiled.layers import PLAIN, product, scratch, table
from quant.compiled.team import LINE, phase_seconds, start

INTS = {"f32": 0, "int8": 8, "int16": 16}


@kernel(parallel=True)
def products(rows, factors, shapes, x, out, threads, ints):
    """Table row p's product of x[:cols] into out[:rows], one phase per row, as
    layers.member runs a step's products (no prologue, no attention)."""
    n = shapes.shape[0]
    sync = np.zeros((n + 1, LINE), np.int64)
    none = np.zeros(0, np.float32)
    for _ in prange(threads):
        start(sync)
        buf = scratch(x.shape[0])
        for p in range(n):
            product(sync, p, threads, rows, factors, p, p + 1, x[: shapes[p, 1]], x[:1],
                    np.float32(1e-5), PLAIN, False, out[: shapes[p, 0]], none, buf,
                    ints)  # fmt: skip
    return sync


@kernel(parallel=True)
def plain_read(words, threads):
    """The sum of uint64 words, each thread a contiguous part: a read that computes nothing."""
    n = words.shape[0] // threads
    sums = np.zeros(threads, np.uint64)
    for t in prange(threads):
        acc = np.zeros(8, np.uint64)
        for i in range(t * n, (t + 1) * n - 7, 8):
            for j in range(8):
                acc[j] += words[i + j]
        sums[t] = acc.sum()
    return sums.sum()


class Run:
    """Matrices packed into one arena, their table and shapes."""

    def __init__(self, matrices: list) -> None:
        self.matrices, self.buffer = arena.pack(list(matrices))
        self.table = table([m.operands() for m in self.matrices])
        self.shapes = np.array([m.shape for m in self.matrices], np.int64)
        self.nbytes = sum(m.nbytes for m in self.matrices)

    def __call__(self, x: np.ndarray, out: np.ndarray, threads: int, ints: int) -> float:
        """Seconds of one call; the phases' waits (seconds) in self.waits."""
        t0 = time.perf_counter()
        sync = products(self.table.rows, self.table.factors, self.shapes, x, out, threads, ints)
        seconds = time.perf_counter() - t0
        self.waits = float(phase_seconds(sync, threads)[1].sum())
        return seconds


def preset_shapes(name: str) -> list[tuple[int, int]]:
    """Each layer's fused products in a step's order: qkv, o, gate_up, down."""
    c = PRESETS[name]
    shapes = layer_shapes(c)
    return [shapes[role] for role in ("wqkv", "wo", "w_gate_up", "w_down")] * c.n_layers


def nominal_ghz() -> float:
    """The clock in the CPU's model name (e.g. "@ 2.60GHz"), else /proc/cpuinfo's MHz."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if m := re.search(r"@ ([\d.]+)GHz", text):
        return float(m.group(1))
    if m := re.search(r"cpu MHz\s*:\s*([\d.]+)", text):
        return float(m.group(1)) / 1000
    return 0.0


def runs_of(fmt: str, shapes: list[tuple[int, int]]) -> dict[str, Run]:
    """The preset's matrices, one matrix per row width of the same bytes, and two small
    matrices (64 and 512 rows) each cycled through 128 phases in L2."""
    rng = np.random.default_rng(0)
    cls = numba_backend().weight_class(fmt)
    widths = sorted({c for _, c in shapes})
    per_width = [(sum(r for r, c in shapes if c == w), w) for w in widths]
    runs = {"the preset's matrices": Run([cls.random(s, rng) for s in shapes]),
            "one matrix per width": Run([cls.random(s, rng) for s in per_width])}  # fmt: skip
    cols = shapes[0][1]
    for height in SMALL:
        run = Run([cls.random((height, cols), rng)])
        run.table = table([run.matrices[0].operands()] * 128)
        run.shapes = np.repeat(run.shapes, 128, axis=0)
        run.nbytes *= 128
        runs[f"{height} x {cols} in L2, 128 times"] = run
    return runs


SMALL = (64, 512)  # the heights of the matrices cycled in L2


def bench_format(fmt: str, shapes: list, args: argparse.Namespace, threads: int) -> list[str]:
    """The table's rows of one format: medians of interleaved calls."""
    runs = runs_of(fmt, shapes)
    x = np.random.default_rng(1).standard_normal(max(c for _, c in shapes)).astype(np.float32)
    # rows for the tallest matrix of every run (one matrix per width has all a width's rows):
    # the float kernels write as many rows as their matrix has
    out = np.empty(max(int(run.shapes[:, 0].max()) for run in runs.values()), np.float32)
    times: dict[str, list[float]] = {k: [] for k in [*runs, "read"]}
    waits: dict[str, list[float]] = {k: [] for k in runs}
    words = runs["the preset's matrices"].buffer.view(np.uint64)
    for i in range(args.rounds + 2):  # the first two warm up
        for k, run in runs.items():
            t = run(x, out, threads, INTS[args.dot])
            if i >= 2:
                times[k].append(t)
                waits[k].append(run.waits)
        t0 = time.perf_counter()
        plain_read(words, threads)
        if i >= 2:
            times["read"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    lines = [row(fmt, "plain read of the preset's arena", words.nbytes, med["read"], None)]
    lines += [row(fmt, k, run.nbytes, med[k], statistics.median(waits[k]))
              for k, run in runs.items()]  # fmt: skip
    cols = shapes[0][1]
    small = [med[f"{h} x {cols} in L2, 128 times"] for h in SMALL]
    per_row = (small[1] - small[0]) / ((SMALL[1] - SMALL[0]) * 128)  # seconds, both threads
    cycles = per_row * threads * args.ghz * 1e9 / (cols / 32)
    return [line + " |" for line in lines[:-1]] + [lines[-1] + f" {cycles:.1f} |"]


def row(fmt: str, what: str, nbytes: int, seconds: float, waits: float | None) -> str:
    """A row of the table, its last cell (cycles) left open."""
    w = "" if waits is None else f"{waits * 1e3:.2f}"
    return (f"| {fmt} | {what} | {nbytes / 1e6:.0f} | {seconds * 1e3:.2f} | {w} | "
            f"{nbytes / seconds / 1e9:.1f} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--preset", default="smollm2-360m", choices=sorted(PRESETS))
    ap.add_argument("--formats", default="q8_0,q4_0")
    ap.add_argument("--dot", default="int16", choices=sorted(INTS))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--ghz", type=float, default=nominal_ghz(), help="the clock for cycles")
    args = ap.parse_args()
    shapes, threads = preset_shapes(args.preset), get_num_threads()
    print(f"Machine: {machine_id(threads)}; {args.preset}'s {len(shapes)} matrices, {args.dot} "
          f"x, {threads} threads, medians of {args.rounds} calls, {args.ghz:.2f} GHz.\n")  # fmt: skip
    print("| format | matrices | MB | ms | waits ms | GB/s | cycles / block of 32, thread |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for fmt in args.formats.split(","):
        print("\n".join(bench_format(fmt, shapes, args, threads)), flush=True)


if __name__ == "__main__":
    main()
