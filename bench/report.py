"""Bench rows as a text table, markdown, CSV, JSON, a profile table, and a plot."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from .probe import size_label
from .runner import Row


def _opt(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def attainable(r: Row) -> str:
    """The probe's figure a row is held against, and where on its curve it was read."""
    if r.attainable_gbs is None:
        return "-"
    return f"{r.attainable_gbs:.1f} at {size_label(r.working_set)} ({r.tier})"


COLUMNS = [
    ("model", lambda r: r.model),
    ("kernels", lambda r: r.kernels),
    ("weights", lambda r: r.weights if r.head == r.weights else f"{r.weights}/{r.head}"),
    ("kv", lambda r: r.kv),
    ("window", lambda r: str(r.window or "-")),
    ("depth", lambda r: str(r.depth)),
    ("prefill tok/s", lambda r: f"{r.prefill_tok_s:.1f}"),
    ("prefill MFU %", lambda r: _opt(r.prefill_mfu, ".1f")),
    ("decode ms/tok", lambda r: f"{r.decode_ms:.2f} ({r.decode_ms_min:.2f}-{r.decode_ms_max:.2f})"),
    ("MB/tok", lambda r: f"{r.bytes_per_token / 1e6:.1f}"),
    ("GB/s", lambda r: f"{r.gbs:.1f}"),
    ("attainable GB/s", attainable),
    ("% attainable", lambda r: _opt(r.pct_attainable, ".0f")),
    ("% peak", lambda r: "-" if r.pct_peak is None else f"{r.pct_peak:.1f}% of {r.device}"),
    ("SOL ms/tok", lambda r: "-" if r.sol_ms is None else f"{r.sol_ms:.2f}"),
    (
        "measured/SOL",
        lambda r: "-" if r.measured_over_sol is None else f"{r.measured_over_sol:.2f}",
    ),
]


def gflops(r: Row) -> float:
    """The arithmetic a step did (the model's FLOPs) per second."""
    return r.flops_per_step / r.step_ms / 1e6


def mfu(r: Row) -> str:
    """Achieved GFLOPS as a share of the ceiling of the instruction the kernels multiply
    with (bench/probe.py: Probe.peak_flops), and that ceiling."""
    if not r.peak_gflops:
        return "-"
    return f"{100 * gflops(r) / r.peak_gflops:.0f} of {r.peak_gflops:.0f}"


# `bench --batch`: decode steps of B sequences; bytes and FLOPs per step, B* the ridge
BATCH_COLUMNS = [
    *COLUMNS[:6],
    ("B", lambda r: str(r.batch)),
    ("step ms", lambda r: f"{r.step_ms:.2f} ({r.decode_ms_min:.2f}-{r.decode_ms_max:.2f})"),
    ("tok/s", lambda r: f"{r.tok_s:.1f}"),
    ("MB/step", lambda r: f"{r.bytes_per_step / 1e6:.1f}"),
    ("GFLOP/step", lambda r: f"{r.flops_per_step / 1e9:.2f}"),
    ("GB/s", lambda r: f"{r.gbs:.1f}"),
    ("attainable GB/s", attainable),
    ("% attainable", lambda r: _opt(r.pct_attainable, ".0f")),
    ("GFLOPS", lambda r: f"{gflops(r):.1f}"),
    ("MFU %", mfu),
    ("SOL ms/step", lambda r: _opt(r.sol_ms, ".2f")),
    ("bound", lambda r: r.bound or "-"),
    ("measured/SOL", lambda r: _opt(r.measured_over_sol, ".2f")),
    ("B*", lambda r: _opt(r.ridge_batch, ".1f")),
]


# a mixture of experts: the distinct experts a layer read per step, measured (mean) and
# the speed-of-light model's expectation, n (1 - (1 - k / n)^B)
EXPERTS = (
    "experts/layer (SOL)",
    lambda r: "-" if r.experts is None else f"{r.experts:.2f} ({r.sol_experts:.2f})",
)


def columns(rows: list[Row]) -> list:
    cols = BATCH_COLUMNS if any(r.batched for r in rows) else COLUMNS
    return [*cols, EXPERTS] if any(r.experts is not None for r in rows) else cols


def cells(rows: list, cols: list | None = None) -> list[list[str]]:
    """A header and a line per row; `cols` default to bench's (one sequence or --batch)."""
    cols = cols or columns(rows)
    return [[name for name, _ in cols]] + [[f(r) for _, f in cols] for r in rows]


def text_table(rows: list, cols: list | None = None) -> str:
    table = cells(rows, cols)
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in table
    )


def markdown(rows: list, cols: list | None = None) -> str:
    table = cells(rows, cols)
    lines = ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in table[1:]])


def csv_text(rows: list) -> str:
    out = io.StringIO()
    fields = [k for k in asdict(rows[0]) if k != "profile"] if rows else []
    w = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(asdict(r))
    return out.getvalue()


def json_text(rows: list, extra: dict | None = None) -> str:
    return json.dumps({**(extra or {}), "rows": [asdict(r) for r in rows]}, indent=1)


def profile_table(row: Row) -> str:
    per = "per decode token" if row.batch == 1 else f"per decode step of {row.batch} sequences"
    lines = [f"profile: {row.model} {row.weights} kv {row.kv} depth {row.depth} ({per})",
             f"{'category':18s} {'ms':>8s} {'share':>6s} {'MB':>8s} {'GB/s':>7s}"]  # fmt: skip
    total = row.profile["total"]["ms"]
    for cat, v in row.profile.items():
        if cat == "total":
            continue
        share, mb = 100 * v["ms"] / total, v["bytes"] / 1e6
        lines.append(f"{cat:18s} {v['ms']:8.3f} {share:5.1f}% {mb:8.2f} {v['gbs']:7.1f}")
    lines.append(
        f"{'total':18s} {total:8.3f} {100.0:5.1f}% {row.profile['total']['bytes'] / 1e6:8.2f}"
    )
    return "\n".join(lines + gap_lines(row))


def gap_lines(row: Row) -> list[str]:
    """The profile's total split into the bytes at the probe's rate (the speed of light),
    the kernels' time beyond that, and the time between kernels (waits and outside): a
    profiled step runs as it does unprofiled (llama_np.model.seam.Profiled), a batch's
    too."""
    if row.sol_ms is None:
        return []
    p = row.profile
    between = p["waits"]["ms"] + p["outside kernels"]["ms"]
    kernels = p["total"]["ms"] - between
    if row.bound == "memory":
        bound = (
            f"  its bytes at the probe's rate {row.sol_ms:8.3f} ms "
            f"({row.sol_bytes_per_token / 1e6:.2f} MB at {row.attainable_gbs:.1f} GB/s)"
        )
    else:  # a large batch: its arithmetic at the peak is the larger term
        bound = f"  its arithmetic at the peak    {row.sol_ms:8.3f} ms"
    return [
        "the gap to the speed of light:",
        bound,
        f"  the kernels beyond that       {kernels - row.sol_ms:8.3f} ms",
        f"  between kernels               {between:8.3f} ms (waits at the barriers "
        f"{p['waits']['ms']:.3f}, outside {p['outside kernels']['ms']:.3f})",
    ]


def pyplot():
    """matplotlib.pyplot without a display, or a one-line error naming the extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'llama-np[plot]'") from None
    return plt


def check_plot_path(path: str | Path) -> None:
    """Refuse, before any work, a plot that could not be written: matplotlib missing, a
    file type it cannot draw, a folder that does not exist or cannot be written to
    (ValueError, ImportError: one line)."""
    from matplotlib.backend_bases import FigureCanvasBase

    pyplot()
    path = Path(path)
    kinds = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in kinds:
        raise ValueError(f"--plot {path}: not a file type matplotlib draws ({', '.join(kinds)})")
    if path.is_dir():
        raise ValueError(f"--plot {path}: is a folder")
    try:  # root passes every os.access check: make a file there to know
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}."):
            pass
    except OSError as e:
        raise ValueError(f"--plot {path}: cannot write in {path.parent} ({e.strerror})") from None


def save_figure(fig, path: str | Path) -> None:
    """The figure written whole or not at all: to a temporary file beside `path`, then
    renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".").lower())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def plot(rows: list[Row], path: str | Path, title: str = "") -> None:
    """ms/token against depth with the speed-of-light line, and achieved vs attainable
    bandwidth per format. Needs matplotlib (pip install 'llama-np[plot]')."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault((r.model, r.weights, r.kv, r.window), []).append(r)
    for (model, weights, kv, window), rs in groups.items():
        rs.sort(key=lambda r: r.depth)
        label = f"{model} {weights} kv {kv}" + (f" w{window}" if window else "")
        x = [r.depth for r in rs]
        err = [
            [r.decode_ms - r.decode_ms_min for r in rs],
            [r.decode_ms_max - r.decode_ms for r in rs],
        ]
        line = a.errorbar(
            x, [r.decode_ms for r in rs], yerr=err, marker="o", capsize=3, label=label
        )
        if all(r.sol_ms for r in rs):
            a.plot(x, [r.sol_ms for r in rs], "--", color=line[0].get_color(), alpha=0.7)
    a.set(xlabel="depth (tokens in the KV cache)", ylabel="decode ms/token",
          title="measured (solid) vs speed of light (dashed)")  # fmt: skip
    a.legend(fontsize=7)
    names = [f"{r.weights} kv {r.kv}\nd{r.depth}" for r in rows]
    xs = range(len(rows))
    b.bar([x - 0.2 for x in xs], [r.gbs for r in rows], width=0.4, label="achieved")
    b.bar(
        [x + 0.2 for x in xs],
        [r.attainable_gbs or 0 for r in rows],
        width=0.4,
        label="attainable (probe)",
    )
    b.set_xticks(list(xs), names, fontsize=6)
    b.set(ylabel="GB/s", title="achieved vs attainable bandwidth")
    b.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_batch(rows: list[Row], path: str | Path, title: str = "") -> None:
    """Step time and tokens/s against the batch, measured (solid) and the speed-of-light
    roofline (dashed), with the predicted ridge B* marked. Needs matplotlib."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault((r.model, r.weights, r.kv, r.depth), []).append(r)
    for (model, weights, kv, depth), rs in groups.items():
        rs.sort(key=lambda r: r.batch)
        label = f"{model} {weights} kv {kv} depth {depth}"
        x = [r.batch for r in rs]
        line = a.plot(x, [r.step_ms for r in rs], "o-", label=label)[0]
        b.plot(x, [r.tok_s for r in rs], "o-", color=line.get_color(), label=label)
        if all(r.sol_ms for r in rs):
            a.plot(x, [r.sol_ms for r in rs], "--", color=line.get_color(), alpha=0.7)
            b.plot(x, [1e3 * r.batch / r.sol_ms for r in rs], "--", color=line.get_color(),
                   alpha=0.7)  # fmt: skip
        ridge = rs[-1].ridge_batch  # the batched rows' (batch 1 runs other kernels)
        if ridge and ridge < float("inf"):
            for ax in (a, b):
                ax.axvline(ridge, color=line.get_color(), linestyle=":", alpha=0.8)
    for ax, ylabel in ((a, "ms per decode step"), (b, "tokens/s, all sequences")):
        ax.set(xscale="log", yscale="log", xlabel="batch B (sequences per step)", ylabel=ylabel)
        ax.set_xticks([r.batch for r in rows], [str(r.batch) for r in rows])
        ax.legend(fontsize=7)
    a.set_title("measured (solid), speed of light (dashed), ridge B* (dotted)")
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
