"""The expected prompt speed beside its bound: a fit of the published prompt rows that
generalizes across sources, checked on sources it was not fitted on.

A prompt token's bound splits in three times (ms, from shapes and the device's peaks):
`memory` (bytes / bandwidth), `products` (the matrix products' FLOPs / the matrix peak) and
`attention` (attention's FLOPs / the same peak). The expectation puts the FLOPs at the rates
engines run them instead, `compute` (Device.engine_peak: a GPU's half-precision rate for
quantized weights too, whose int8 peak stays the bound's; attention at the float peak), and
adds the traffic of attention's score matrix, `scores` (its f32 entries written and read
back / bandwidth: engines without flash attention materialize it, heads x prompt entries a
token, which on a GPU is a visible share of a long prompt's time):

    expected = (max(memory, compute) + r x scores) / eta

eta, the share of those rates an engine reaches, is fitted per group of rows: (hardware
class, engine, weights float or quantized), else (class, engine), else the class, else GPU
or CPU, else all rows: the narrowest with MIN_ROWS rows. r, how many times the score matrix
crosses memory, is one number shared by every group, fitted jointly with the etas on the
GPU rows (a CPU's compute dwarfs the traffic: its rows would fit r to whatever else grows
with heads x prompt). Both are fitted in log space and robustly: for each r on a grid,
each group's log eta is the median of log(predicted_r / measured), and the r whose total
absolute log error is least wins. So a factor of 2 too fast weighs as much as 2 too slow,
and a few odd rows do not move the fit.

Held out by source: each source's rows are predicted by the fit of the other sources' rows
(leave one source out), what a new source's figure would see.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .calibrate import spread  # noqa: F401  (|error|'s median, p80, p90: decode's too)

MIN_ROWS = 4  # rows a group needs for an eta of its own
R_GRID = (0.0, *(float(x) for x in np.geomspace(0.25, 64, 33)))  # the score matrix's passes


@dataclass(frozen=True)
class PrefillPoint:
    """One prompt row: its bound's three times per token (ms), the expectation's two, and
    the measured ms."""

    memory_ms: float  # bytes / bandwidth
    products_ms: float  # the products' FLOPs / the matrix peak
    attention_ms: float  # attention's FLOPs / the matrix peak
    measured_ms: float
    hw_class: str
    engine: str
    quantized: bool  # the weights' format: quantized (else float)
    source: str
    compute_ms: float  # the products' and attention's FLOPs at the rates engines run them
    scores_ms: float  # the score matrix's f32 entries / bandwidth

    @property
    def bound_ms(self) -> float:
        """The speed of light: max(memory, products + attention)."""
        return max(self.memory_ms, self.products_ms + self.attention_ms)

    @property
    def kind(self) -> str:
        """ "gpu" for a GPU's class (apple-gpu, nvidia-gpu, amd-gpu, or one without rows of
        its own yet, intel-gpu: fitted as GPUs), else "cpu"."""
        return "gpu" if self.hw_class.endswith("-gpu") else "cpu"

    @property
    def weights(self) -> str:
        return "quantized" if self.quantized else "float"

    def slow(self, r: float) -> float:
        """The time at eta = 1: max(memory, compute) + r x scores."""
        return max(self.memory_ms, self.compute_ms) + r * self.scores_ms


def groups(p: PrefillPoint) -> list[tuple[str, Callable[[PrefillPoint], bool]]]:
    """The groups a point belongs to, narrowest first."""
    return [
        (f"{p.hw_class} / {p.engine} / {p.weights}",
         lambda q: (q.hw_class, q.engine, q.quantized) == (p.hw_class, p.engine, p.quantized)),
        (f"{p.hw_class} / {p.engine}",
         lambda q: (q.hw_class, q.engine) == (p.hw_class, p.engine)),
        (p.hw_class, lambda q: q.hw_class == p.hw_class),
        (p.kind, lambda q: q.kind == p.kind),
        ("all", lambda q: True),
    ]  # fmt: skip


@dataclass(frozen=True)
class GroupFit:
    group: str
    eta: float
    rows: int
    sources: int


@dataclass(frozen=True)
class PrefillFit:
    """The fitted r and, by group, eta; `points` the rows it was fitted on."""

    r: float
    etas: dict[str, GroupFit]
    points: tuple[PrefillPoint, ...]

    def group_for(self, like: PrefillPoint) -> GroupFit | None:
        """The narrowest group of `like` that has an eta."""
        for name, _ in groups(like):
            if name in self.etas:
                return self.etas[name]
        return None

    def expect(self, like: PrefillPoint) -> float:
        """Expected ms per prompt token of a row like `like` (its measured_ms unused)."""
        g = self.group_for(like)
        return like.slow(self.r) / g.eta if g else float("nan")


def _etas(points: Sequence[PrefillPoint], r: float) -> dict[str, GroupFit]:
    """Every group with MIN_ROWS rows: eta = exp(median log(slow_r / measured))."""
    members: dict[str, list[PrefillPoint]] = {}
    for p in points:
        for name, _ in groups(p):
            members.setdefault(name, []).append(p)
    out = {}
    for name, ps in members.items():
        if len(ps) >= MIN_ROWS:
            eta = math.exp(statistics.median(math.log(q.slow(r) / q.measured_ms) for q in ps))
            out[name] = GroupFit(name, eta, len(ps), len({q.source for q in ps}))
    return out


def fit(points: Sequence[PrefillPoint]) -> PrefillFit:
    """r on the grid and the groups' etas, minimizing the GPU rows' total |log error| (each
    row predicted by its narrowest group; r = 0 without GPU rows)."""
    best: tuple[float, PrefillFit] | None = None
    for r in R_GRID:
        f = PrefillFit(r, _etas(points, r), tuple(points))
        loss = sum(abs(math.log(f.expect(p) / p.measured_ms)) for p in points if p.kind == "gpu")
        if best is None or loss < best[0] - 1e-12:
            best = (loss, f)
    assert best is not None
    return best[1]


@dataclass(frozen=True)
class HeldPoint:
    point: PrefillPoint
    expected_ms: float  # by the fit of the other sources' rows
    group: str

    @property
    def error(self) -> float:
        """(expected tok/s - measured tok/s) / measured tok/s."""
        return self.point.measured_ms / self.expected_ms - 1


def leave_one_source_out(points: Sequence[PrefillPoint]) -> list[HeldPoint]:
    """Every point predicted by the fit of the other sources' points."""
    out = []
    for source in sorted({p.source for p in points}):
        f = fit([p for p in points if p.source != source])
        for p in points:
            if p.source == source and (g := f.group_for(p)) is not None:
                out.append(HeldPoint(p, f.expect(p), g.group))
    return out
