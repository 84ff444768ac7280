"""The bench runner: time prefill and decode at several depths, count bytes with the meter,
and hold each row against the speed-of-light model.

It drives any object that offers the `Decoder` interface below; it never imports the
model package. Repetitions are interleaved across depths (round r runs every depth before
round r + 1 starts), so slow drift on a shared machine spreads over all rows alike.
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np
from tqdm import tqdm

from llama_arch import Config

from .devices import Device
from .meter import CATEGORIES, WAITS, Meter
from .probe import Probe
from .sol import Estimate, estimate, experts_read, weights_label
from .sol import prefill as prefill_estimate


class Variant(NamedTuple):
    """How a model is stored and run: what the speed-of-light model needs besides its shape."""

    weights: str | list[dict[str, str]]  # the layers' matrices: one format, or a per-layer plan
    head: str  # the LM head
    embed: str  # the token embedding
    kv: str  # the KV cache
    backend: str = "numpy"  # the kernel backend, whose memory layout the bytes follow
    kernels: str = "numpy"  # what ran them, for reports: "numba omp, 2 threads"
    dot: str = "f32"  # what the quantized products multiply x as: f32, int8, int16


class Decoder(Protocol):
    """What the runner needs from a model."""

    config: Config  # its shape (and name)
    variant: Variant
    meter: Meter

    def start(self, depth: int) -> None:
        """Begin a sequence whose KV cache already holds `depth` positions."""

    def prefill(self, tokens: np.ndarray) -> None: ...

    def step(self, token: int) -> None:
        """One decode step."""

    def start_batch(self, depth: int, batch: int) -> None:
        """Begin `batch` sequences, each with a KV cache holding `depth` positions."""

    def step_batch(self, tokens: np.ndarray) -> None:
        """One decode step of every sequence of the batch: tokens (batch,)."""

    def check(self) -> None:
        """Raise if the last step's outputs hold NaN or infinity (a non-finite weight, scale
        or cache entry makes every later step's so): the speed of garbage is no measurement.
        Called after each timed run, outside its time."""


@dataclass
class Settings:
    prompt: int = 32  # prefill length
    n: int = 128  # decode steps per repetition
    depths: tuple[int, ...] = (0,)
    reps: int = 5
    warmup: int = 2  # decode steps not timed at the start of each repetition
    window: int | None = None
    profile: bool = False
    batch: tuple[int, ...] = ()  # batch sizes: rows of batched decode steps (no prefill)


@dataclass
class Row:
    model: str
    kernels: str  # the backend and its threads, e.g. "numba omp, 2 threads"
    weights: str
    head: str
    kv: str
    window: int | None
    depth: int
    prefill_tok_s: float
    decode_ms: float  # median over repetitions of the mean ms/token of a repetition
    decode_ms_min: float
    decode_ms_max: float
    bytes_per_token: float  # measured by the meter
    sol_bytes_per_token: int  # the speed-of-light model's count at the same position
    gbs: float  # bytes_per_token / decode time
    tier: str  # the cache level the working set fits in (a label): L2, L3 or DRAM
    attainable_gbs: float | None  # the probe's curve at the working set (Probe.attainable)
    pct_attainable: float | None
    device: str | None
    pct_peak: float | None
    sol_ms: float | None  # predicted with the attainable bandwidth (and sgemm peak)
    measured_over_sol: float | None
    bound: str | None
    rss_mb: float = 0.0
    profile: dict[str, dict[str, float]] = field(default_factory=dict)
    batch: int = 1  # sequences per decode step
    batched: bool = False  # a row of `--batch`: decode steps of `batch` sequences, no prefill
    step_ms: float = 0.0  # median ms per decode step (= decode_ms)
    tok_s: float = 0.0  # tokens per second, all sequences together
    bytes_per_step: float = 0.0  # measured by the meter (= bytes_per_token at batch 1)
    flops_per_step: int = 0  # the speed-of-light model's
    peak_gflops: float | None = None  # the ceiling of the arithmetic these kernels run
    prefill_flops: float = 0.0  # the speed-of-light model's FLOPs of the timed prompt, per
    # prompt token
    prefill_mfu: float | None = None  # % of peak_gflops the prompt ran at
    ridge_batch: float | None = None  # B*: the batch beyond which the step is compute-bound
    working_set: int = 0  # bytes a step streams (the speed-of-light model's): where on the
    # probe's curve the attainable bandwidth is read
    experts: float | None = None  # a mixture of experts: distinct experts a layer read per
    # step, the mean measured (the batch's union of its tokens' choices)
    sol_experts: float | None = None  # ... and the uniform-routing expectation
    experts_by_layer: list[float] = field(default_factory=list)  # the mean per layer, which
    # the row's speed of light counts: each row is held against the bytes it read


def rss_mb() -> float:
    """Resident set size now, MB (from /proc; the peak on systems without it)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 1e6
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def _decode_round(
    dec: Decoder, s: Settings, depth: int, rng: np.random.Generator
) -> tuple[float, float, list]:
    dec.start(depth)
    t0 = time.perf_counter()
    dec.prefill(rng.integers(0, 1000, s.prompt))
    prefill = s.prompt / (time.perf_counter() - t0)
    dec.check()
    return (prefill, *_timed_steps(dec, s, lambda: dec.step(int(rng.integers(0, 1000)))))


def _batch_round(
    dec: Decoder, s: Settings, depth: int, batch: int, rng: np.random.Generator
) -> tuple[float, float, list]:
    dec.start_batch(depth, batch)
    return (
        float("nan"),
        *_timed_steps(dec, s, lambda: dec.step_batch(rng.integers(0, 1000, batch))),
    )


def _timed_steps(dec: Decoder, s: Settings, step: Callable[[], None]) -> tuple[float, list]:
    """s.n decode steps: (mean ms of those after the warm-up, their meter steps)."""
    times, steps = [], []
    for i in range(s.n):
        t0 = time.perf_counter()
        step()
        if i >= s.warmup:
            times.append(time.perf_counter() - t0)
            steps.append(dec.meter.last)
    dec.check()
    return 1e3 * sum(times) / len(times), steps


def run(
    dec: Decoder,
    s: Settings,
    probe: Probe | None = None,
    device: Device | None = None,
    progress: bool = True,
) -> list[Row]:
    """Rows, one per depth (and batch size, with `s.batch`)."""
    rng = np.random.default_rng(0)
    keys = [(d, b) for d in s.depths for b in (s.batch or (1,))]
    results: dict[tuple[int, int], list[tuple[float, float, list]]] = {k: [] for k in keys}
    dec.meter.profile = s.profile
    with tqdm(
        total=s.reps * len(keys), desc="bench", unit="run", disable=None if progress else True
    ) as bar:
        for _ in range(s.reps):
            for depth, b in keys:
                if s.batch:
                    results[depth, b].append(_batch_round(dec, s, depth, b, rng))
                else:
                    results[depth, b].append(_decode_round(dec, s, depth, rng))
                bar.update()
    return [_row(dec.config, dec.variant, s, d, b, results[d, b], probe, device) for d, b in keys]


def _row(config: Config, f: Variant, s: Settings, depth: int, batch: int,
         rounds: list, probe: Probe | None, device: Device | None) -> Row:  # fmt: skip
    ms = [r[1] for r in rounds]
    steps = [st for r in rounds for st in r[2]]
    measured = statistics.fmean(st.bytes_read for st in steps)
    used = [statistics.fmean(st.experts[i] for st in steps) for i in range(config.n_layers)
            ] if config.n_experts > 1 else []  # fmt: skip
    est = _estimate(config, f, s, depth, batch, used)
    decode_ms = statistics.median(ms)
    gbs = measured / decode_ms / 1e6
    window = s.window if s.window is not None else config.sliding_window  # shown: the model's
    row = Row(
        config.name, f.kernels, weights_label(f.weights), f.head, f.kv, window, depth,
        prefill_tok_s=statistics.median(r[0] for r in rounds),
        decode_ms=decode_ms, decode_ms_min=min(ms), decode_ms_max=max(ms),
        bytes_per_token=measured, sol_bytes_per_token=est.bytes_per_token, gbs=gbs,
        tier="?", attainable_gbs=None, pct_attainable=None, device=None, pct_peak=None,
        sol_ms=None, measured_over_sol=None, bound=None, rss_mb=rss_mb(),
        batch=batch, batched=bool(s.batch), step_ms=decode_ms, tok_s=1e3 * batch / decode_ms,
        bytes_per_step=measured, flops_per_step=est.flops, working_set=est.bytes_per_token,
    )  # fmt: skip
    if not s.batch:
        p = prefill_estimate(config, s.prompt, f.weights, f.kv, depth, s.window, f.head,
                             embed=f.embed, kernels=f.backend)  # fmt: skip
        row.prefill_flops = p.flops / s.prompt
    if used:
        row.experts, row.experts_by_layer = statistics.fmean(used), used
        row.sol_experts = experts_read(config, batch)
    if probe is not None:
        hold(row, est, probe, f)
    if device is not None:
        row.device, row.pct_peak = device.name, 100 * gbs * 1e9 / device.bandwidth
    if s.profile:
        row.profile = _profile(steps)
    return row


def _estimate(config: Config, f: Variant, s: Settings, depth: int, batch: int,
              experts: list[float] | None = None) -> Estimate:  # fmt: skip
    """The speed-of-light model's step at the middle of a row's timed steps (a mixture of
    experts: the experts per layer the steps read, on average)."""
    mid = depth + (0 if s.batch else s.prompt) + (s.warmup + s.n) // 2
    return estimate(config, f.weights, f.kv, pos=mid, window=s.window, head=f.head, embed=f.embed,
                    kernels=f.backend, batch=batch, experts=experts or None)  # fmt: skip


BEATEN = 0.97  # measured / SOL below this: the row ran faster than its bound beyond noise


def beats_its_bound(row: Row) -> bool:
    return (row.measured_over_sol or 1.0) < BEATEN


def hold(row: Row, est: Estimate, probe: Probe, f: Variant) -> None:
    """Set the row's bound: the probe's attainable bandwidth at its working set and the
    ceiling of the arithmetic its kernels run, the speed of light and measured / SOL."""
    tier, bw = probe.attainable(est.bytes_per_token)
    peak = probe.peak_flops(f.backend, weights_label(f.weights), f.dot)
    pred = est.predict(bw, peak)
    row.tier, row.attainable_gbs = tier, bw / 1e9
    row.pct_attainable = 100 * row.gbs * 1e9 / bw
    row.sol_ms, row.bound = pred.ms_per_token, pred.bound
    row.measured_over_sol = row.decode_ms / pred.ms_per_token
    row.peak_gflops, row.ridge_batch = peak / 1e9, est.ridge_batch(bw, peak)
    if row.prefill_flops:  # the prompt's FLOPs at its speed, against the same ceiling
        row.prefill_mfu = 100 * row.prefill_flops * row.prefill_tok_s / peak


def rehold(rows: list[Row], dec: Decoder, s: Settings, probe: Probe) -> None:
    """Hold rows that run(dec, s) made against another probe (one measured again beside
    them: bench.probe.reprobe)."""
    for row in rows:
        est = _estimate(dec.config, dec.variant, s, row.depth, row.batch, row.experts_by_layer)
        hold(row, est, probe, dec.variant)


def _profile(steps: list) -> dict[str, dict[str, float]]:
    """Per category: ms and bytes per token and GB/s; 'waits' the threads' idle time at a
    one-call step's barriers; 'outside kernels' the rest (Python, the calls' entries)."""
    n = len(steps)
    out: dict[str, dict[str, float]] = {}
    for cat in (*CATEGORIES, WAITS):
        t = sum(st.seconds[cat] for st in steps) / n
        b = sum(st.reads.get(cat, 0) for st in steps) / n
        out[cat] = {"ms": 1e3 * t, "bytes": b, "gbs": b / t / 1e9 if t else 0.0}
    total = sum(st.wall for st in steps) / n
    inside = sum(v["ms"] for v in out.values()) / 1e3
    out["outside kernels"] = {"ms": 1e3 * (total - inside), "bytes": 0.0, "gbs": 0.0}
    out["total"] = {"ms": 1e3 * total, "bytes": sum(st.bytes_read for st in steps) / n, "gbs": 0.0}
    return out


Formatter = Callable[[list[Row]], str]
