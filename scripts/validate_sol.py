#!/usr/bin/env python3
"""Hold the speed-of-light model against measurements, on both kernel backends: a sweep of
weight formats x KV depths (x window, x KV format) on the real SmolLM2-135M and Qwen2.5-
Coder-0.5B and on synthetic models many times larger than the last-level cache; and, with
--batch, decode steps of B = 1..64 sequences (the roofline's knee). scripts/results.sh
runs both into docs/results.md; alone, this prints the markdown of one sweep.

    .venv/bin/python scripts/validate_sol.py [--quick]
    .venv/bin/python scripts/validate_sol.py --batch [--quick]

Each row is held against max(bytes / the probe's bandwidth at the row's working set,
FLOPs / the ceiling of the arithmetic its kernels run).
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import NamedTuple

import llama_np  # noqa: F401  (first: it configures OpenBLAS's threads before NumPy loads)
from bench import report
from bench.probe import Probe, reprobe, run_probe
from bench.runner import Row, Settings, beats_its_bound, rehold, run
from llama_np.api import load
from llama_np.model.decoder import Decoder
from llama_np.model.synthetic import synthetic_model
from quant.arena import give_back_freed
from quant.backends import get_backend
from quant.host import usable_cores


class Sweep(NamedTuple):
    model: str
    kernels: str
    weights: list  # formats; None: as stored
    depths: tuple[int, ...]
    windows: tuple = (None,)
    kv: tuple[str, ...] = ("f32",)


Q = ["q8_0", "q4_0", "q4_1", "q5_0"]  # quantized formats every synthetic model runs
K = ["q4_k", "q6_k"]  # K-quants: rows a multiple of 256 (TinyLlama, not SmolLM2-360M's 960)
SWEEPS = [
    Sweep("smollm2-135m", "numba-f32", ["f32", "q8_0", None], (0, 1024, 4096), (None, 1024)),
    Sweep("smollm2-135m", "numba-f32", [None], (4096,), kv=("f16", "q8_0")),
    Sweep("smollm2-135m", "numba-int16", ["q8_0", None], (0, 4096)),
    Sweep("smollm2-135m", "numpy", ["f32", "q8_0", None], (0, 4096)),
    Sweep("synthetic:smollm2-360m", "numba-f32", ["f32", *Q], (0, 4096)),
    Sweep("synthetic:smollm2-360m", "numba-int16", Q, (0,)),
    Sweep("synthetic:smollm2-360m", "numba-int8", Q, (0,)),
    Sweep("synthetic:smollm2-360m", "numpy", ["f32", "q8_0", "q4_0"], (0,)),
    Sweep("synthetic:tinyllama-1.1b", "numba-f32", ["f32", *Q, *K], (0,)),
    Sweep("synthetic:tinyllama-1.1b", "numba-int16", Q + K, (0,)),
    Sweep("synthetic:tinyllama-1.1b", "numpy", ["f32", "q8_0"], (0,)),
    Sweep("qwen2.5-coder-0.5b", "numba-f32", [None, "q8_0", "f32"], (0, 4096)),
    Sweep("qwen2.5-coder-0.5b", "numba-int16", [None, "q8_0"], (0, 4096)),
    Sweep("qwen2.5-coder-0.5b", "numpy", [None], (0,)),
]


BATCHES = (1, 2, 4, 8, 16, 32, 64)
BATCH_SWEEPS = [
    Sweep("synthetic:tinyllama-1.1b", "numba", ["f32", "q8_0"], (0, 4096)),
    Sweep("qwen2.5-coder-0.5b", "numba", [None], (0, 4096)),
]
# --quick: a few minutes
QUICK = [
    Sweep("smollm2-135m", "numba-int16", ["q8_0", None], (0, 1024)),
    Sweep("smollm2-135m", "numba-f32", ["f32"], (0,)),
    Sweep("synthetic:smollm2-360m", "numba-int16", ["q4_0"], (0,)),
]
QUICK_BATCHES = (1, 4, 16)
QUICK_BATCH_SWEEPS = [Sweep("smollm2-135m", "numba", ["q8_0", None], (0,))]


def sweep(sw: Sweep, weights: str | None, s: Settings, probe: Probe,
          threads: int) -> tuple[list[Row], Probe]:  # fmt: skip
    """The rows of one model and format, and the probe they are held against: the run's,
    measured again beside them at their working sets (each size its better figure)."""
    if sw.model.startswith("synthetic:"):
        m = synthetic_model(sw.model, weights, None, get_backend(sw.kernels)).start(threads)
    else:
        m = load(sw.model, weights=weights, threads=threads, kernels=sw.kernels).model
    runs = []
    with m:
        for window in sw.windows:
            for kv in sw.kv:
                dec = Decoder(m, kv, window, capacity=s.prompt + s.n + 1)
                settings = Settings(s.prompt, s.n, sw.depths, s.reps, s.warmup, window,
                                    batch=s.batch)  # fmt: skip
                runs.append((dec, settings, run(dec, settings, probe)))
        probe = reprobe(probe, [r.working_set for *_, rows in runs for r in rows], threads)
        for dec, settings, rows in runs:
            rehold(rows, dec, settings, probe)
    out = [r for *_, rows in runs for r in rows]
    del m, runs, dec  # the model's GBs gone before the next is built (give_back_freed)
    gc.collect()
    give_back_freed()
    return out, probe


def verdict(r: Row) -> str:
    """Where the model holds (within 1.25x, and not beaten) and, where it does not, the
    likely reason."""
    ratio = r.measured_over_sol or float("nan")
    if beats_its_bound(r):
        return "BEATS its speed of light: the probe's readers stream slower than this row"
    if ratio <= 1.25:
        return "holds"
    if r.kernels.startswith("numpy") and r.weights.startswith("q"):
        return "NumPy-bound: converting codes to float32 costs more than reading them"
    codes = {f for f in r.weights.replace("+", "/").split("/")[0:-1] or [r.weights]}
    if " dot (" in r.kernels:  # integer x: no longer the multiplies, as far off as f32
        return "integer kernel: below the DRAM roof, about as far as f32 (not compute-bound)"
    if r.kernels.startswith("numba") and codes - {"f32", "f16", "bf16", "q8_0"}:
        return "compute-bound: unpacking 4-6 bit codes takes more vector work than streaming them"
    keys = min(r.depth, r.window) if r.window else r.depth  # positions attended
    if keys >= 1024:
        return "attention below the bandwidth the weights get"
    return "memory-bound, below the probe's bandwidth (many matrices, a hand-over each)"


def measure(probe: Probe, threads: int, batch: bool, quick: bool, n: int = 32,
            reps: int = 3) -> tuple[list[Row], Probe]:  # fmt: skip
    """Every row of the sweep (the batch sweep with `batch`; a short one with `quick`), and
    the probe they are held against: the run's, each size at its best of the start and the
    measurements beside each model's rows (bench.probe.reprobe)."""
    sweeps = (QUICK_BATCH_SWEEPS if quick else BATCH_SWEEPS) if batch else (
        QUICK if quick else SWEEPS)  # fmt: skip
    batches = (QUICK_BATCHES if quick else BATCHES) if batch else ()
    s = Settings(prompt=16, n=n, reps=reps, batch=batches)
    rows: list[Row] = []
    for sw in sweeps:
        for weights in sw.weights:
            print(f"validate_sol: {sw.model} {sw.kernels} {weights or 'as stored'}",
                  file=sys.stderr)  # fmt: skip
            got, probe = sweep(sw, weights, s, probe, threads)
            rows += got
    return rows, probe


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--batch", action="store_true", help="the batch sweep (the roofline's knee)")
    ap.add_argument("--quick", action="store_true", help="a short sweep")
    args = ap.parse_args()
    threads = args.threads or usable_cores()
    rows, _ = measure(run_probe(threads), threads, args.batch, args.quick)
    print((batch_markdown if args.batch else markdown)(rows))


def knee(r: Row) -> str:
    """What the batch row shows against the roofline."""
    ratio = r.measured_over_sol or float("nan")
    side = "below" if r.batch <= (r.ridge_batch or 0) / 2 else "near" if r.batch < 4 * (
        r.ridge_batch or 0) else "far above"  # fmt: skip
    held = "holds" if ratio <= (1.25 if side == "below" else 1.5) else "off"
    if beats_its_bound(r):  # a bound the row beats is no bound: the ceiling is wrong
        held = "BEATS its speed of light"
    return f"{side} B* ({r.bound}-bound): {held}"


def batch_markdown(rows: list[Row]) -> str:
    """The batch table and a verdict per row."""
    lines = [
        report.markdown(rows),
        "",
        "| model | weights | depth | B | step ms | SOL ms | measured / SOL | MFU % of GFLOPS "
        "| B* | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [f"| {r.model} | {r.weights} | {r.depth} | {r.batch} | {r.step_ms:.1f} | "
              f"{(r.sol_ms or 0):.1f} | {(r.measured_over_sol or 0):.2f} | {report.mfu(r)} | "
              f"{(r.ridge_batch or 0):.1f} | {knee(r)} |" for r in rows]  # fmt: skip
    return "\n".join(lines)


def markdown(rows: list[Row]) -> str:
    """The table and a verdict per row."""
    lines = [
        report.markdown(rows),
        "",
        "| model | kernels | weights | kv | depth | window | measured / predicted | verdict |",
        "|---|---|---|---|---:|---|---:|---|",
    ]
    lines += [f"| {r.model} | {r.kernels} | {r.weights} | {r.kv} | {r.depth} | {r.window or '-'} | "
              f"{(r.measured_over_sol or 0):.2f} | {verdict(r)} |" for r in rows]  # fmt: skip
    return "\n".join(lines)


def plot(rows: list[Row], path: Path, machine: str) -> None:
    """Left: measured against predicted ms/token, compiled kernels filled, NumPy hollow.
    Right: ms/token against depth on SmolLM2-135M, with the predictions dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5.5))
    colors = {"f32": "tab:blue", "q8_0": "tab:orange", "q4_0": "tab:green", "q4_1": "tab:red"}
    markers: dict[str, str] = {}
    for r in rows:
        m = markers.setdefault(r.model, "o^sDv"[len(markers) % 5])
        color = colors.get(r.weights.split("/")[0], "tab:gray")
        compiled = r.kernels.startswith("numba")
        a.scatter(r.sol_ms, r.decode_ms, marker=m, s=25 + r.depth / 60, edgecolors=color,
                  facecolors=color if compiled else "none", linewidths=1.2)  # fmt: skip
    lim = [min(r.sol_ms for r in rows) * 0.8, max(r.decode_ms for r in rows) * 1.3]
    a.plot(lim, lim, "k--", lw=1)
    a.plot(lim, [1.25 * v for v in lim], "k:", lw=0.8)
    a.text(
        lim[0] * 1.1, lim[0] * 1.5, "measured = predicted (dotted: 1.25x)", fontsize=7, rotation=35
    )
    handles = [a.scatter([], [], color=c, label=f) for f, c in colors.items()]
    handles += [a.scatter([], [], marker=m, color="k", label=n) for n, m in markers.items()]
    handles += [a.scatter([], [], marker="o", color="k", label="compiled kernels (numba)"),
                a.scatter([], [], marker="o", facecolors="none", edgecolors="k",
                          label="NumPy kernels")]  # fmt: skip
    a.legend(handles=handles, fontsize=7, title="size grows with depth", title_fontsize=7)
    a.set(xscale="log", yscale="log", xlabel="speed-of-light ms/token", ylabel="measured ms/token",
          title="measured vs predicted (probed bandwidth)")  # fmt: skip
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.model == rows[0].model and r.window is None and r.kv == "f32":
            # "numba omp, 2 threads, int16 dot (vpdpbusd)" -> "numba omp, int16 dot (...)":
            # float-x and integer-x rows are two lines, not one
            kernels = ", ".join(p for p in r.kernels.split(", ") if not p.endswith("threads"))
            groups.setdefault((kernels, r.weights), []).append(r)
    for (kernels, weights), rs in groups.items():
        rs.sort(key=lambda r: r.depth)
        color = colors.get(weights.split("/")[0], "tab:gray")
        style = ("-." if " dot" in kernels else "-") if kernels.startswith("numba") else ":"
        b.plot([r.depth for r in rs], [r.decode_ms for r in rs], style, marker="o", color=color,
               label=f"{kernels} {weights}")  # fmt: skip
        b.plot([r.depth for r in rs], [r.sol_ms for r in rs], "--", color=color, alpha=0.35, lw=1)
    b.set(xlabel="depth (keys in the cache)", ylabel="ms/token", yscale="log",
          title=f"{rows[0].model}: ms/token vs depth (dashed: speed of light)")  # fmt: skip
    b.legend(fontsize=6)
    fig.suptitle(machine, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
