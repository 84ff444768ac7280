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

    expected = (max(memory, compute x (rate / RATE_REF)^a) + r x scores) / eta

`rate` is the products' rate behind `compute` (FLOPS): on GPUs with matrix units the share
of it an engine reaches falls as it grows (held out, NVIDIA's rows were expected too fast
the more so the higher their peak, H100 and L40S furthest off): the rest of a prompt's
step, its norms, softmax, dequantization and launches, does not scale with those units. a
is fitted for the GPUs and for each GPU class with rows of MIN_SOURCES sources (Apple's,
whose simdgroup matrices run on the shader cores, fits 0); the CPUs' stays 0 (fitted, 0.2,
it put the boards' held-out 80th percentile at 240-280%, against 54-56% without: their
peaks span a Raspberry Pi 4's to a Threadripper's, and the share does not follow them).

eta, the share of those rates an engine reaches (at RATE_REF where a > 0), is fitted per
group of rows: (hardware class, engine, weights float or quantized), else (class, engine),
else the class, else GPU or CPU (the kind; all rows where a kind has none): the narrowest
with MIN_ROWS rows. Each group's log eta is the median of its rows' log(slow / measured),
drawn toward its parent group's by its count of sources (SHRINK): one source's forty rows
say less about a new source than five sources' ten. r, how many times the score matrix
crosses memory, is one number shared by every group, fitted with the GPUs' a on the GPU
rows (a CPU's compute dwarfs the traffic: its rows would fit r to whatever else grows with
heads x prompt); each GPU class's a then on its own rows. All in log space and robustly:
for each (a, r) on a grid the etas are medians, and the pair whose total absolute log
error is least wins. So a factor of 2 too fast weighs as much as 2 too slow, and a few odd
rows do not move the fit.

Held out by source: each source's rows are predicted by the fit of the other sources' rows
(leave one source out), what a new source's figure would see.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .calibrate import spread  # noqa: F401  (|error|'s median, p80, p90: decode's too)

MIN_ROWS = 4  # rows a group needs for an eta of its own
R_GRID = (0.0, *(float(x) for x in np.geomspace(0.25, 64, 33)))  # the score matrix's passes
A_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)  # the rate's exponent, a
RATE_REF = 1e14  # FLOPS, about the middle of the published GPUs' rates: compute as it is
SHRINK = 1.0  # how many sources' weight a group's parent has in the group's eta
MIN_SOURCES = 2  # sources a GPU class needs for an exponent of its own


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
    rate: float = 0.0  # the products' rate behind compute_ms, FLOPS (0: compute unscaled)

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

    def slow(self, r: float, a: float = 0.0) -> float:
        """The time at eta = 1: max(memory, compute x (rate / RATE_REF)^a) + r x scores."""
        scale = (self.rate / RATE_REF) ** a if self.rate > 0 else 1.0
        return max(self.memory_ms, self.compute_ms * scale) + r * self.scores_ms


KIND_GROUPS = {"gpu": "GPUs", "cpu": "CPUs"}  # not "cpu": that is a class's name too


def groups(p: PrefillPoint) -> list[str]:
    """The groups a point belongs to, narrowest first: class / engine / weights, class /
    engine, class, kind (KIND_GROUPS), all."""
    return [f"{p.hw_class} / {p.engine} / {p.weights}", f"{p.hw_class} / {p.engine}",
            p.hw_class, KIND_GROUPS[p.kind], "all"]  # fmt: skip


ROOTS = 2  # the last groups of `groups`, kind and all, are drawn toward nothing


@dataclass(frozen=True)
class GroupFit:
    group: str
    eta: float
    rows: int
    sources: int


@dataclass(frozen=True)
class PrefillFit:
    """The fitted r, a (the GPUs' and by GPU class) and, by group, eta; `points` the rows it
    was fitted on."""

    r: float
    a: dict[str, float]
    etas: dict[str, GroupFit]
    points: tuple[PrefillPoint, ...]

    def group_for(self, like: PrefillPoint) -> GroupFit | None:
        """The narrowest group of `like` that has an eta."""
        return next((self.etas[n] for n in groups(like) if n in self.etas), None)

    def expect(self, like: PrefillPoint) -> float:
        """Expected ms per prompt token of a row like `like` (its measured_ms unused)."""
        g = self.group_for(like)
        a = exponent_of(self.a, like.hw_class, like.kind)
        return like.slow(self.r, a) / g.eta if g else float("nan")


class _Rows:
    """Points as arrays, and every group with MIN_ROWS of them: the many fits of the grid."""

    def __init__(self, points: Sequence[PrefillPoint]) -> None:
        def column(name: str) -> np.ndarray:
            return np.array([getattr(p, name) for p in points], float)

        self.memory, self.compute = column("memory_ms"), column("compute_ms")
        self.scores, self.log_measured = column("scores_ms"), np.log(column("measured_ms"))
        rate = column("rate")
        self.log_rate = np.log(np.where(rate > 0, rate, RATE_REF) / RATE_REF)
        self.kind = np.array([p.kind for p in points])
        self.hw_class = np.array([p.hw_class for p in points])
        self.classes, self.class_of = np.unique(self.hw_class, return_inverse=True)
        self.kind_of_class = ["gpu" if c.endswith("-gpu") else "cpu" for c in self.classes]
        members: dict[str, list[int]] = {}
        for i, p in enumerate(points):
            for name in groups(p):
                members.setdefault(name, []).append(i)
        self.members = {n: np.array(m) for n, m in members.items() if len(m) >= MIN_ROWS}
        self.sources = {n: len({points[i].source for i in m}) for n, m in self.members.items()}
        # each group's parent (the next broader with rows; none for the roots), and each
        # point's narrowest group
        self.parent: dict[str, str | None] = {}
        self.group_of: list[str] = []
        for p in points:
            names = [n for n in groups(p) if n in self.members]
            for k, n in enumerate(names):
                root = n in groups(p)[-ROOTS:]
                self.parent[n] = None if root or k + 1 == len(names) else names[k + 1]
            self.group_of.append(names[0] if names else "")
        self.parents_first = self._parents_first()
        # each point's narrowest group as an index into parents_first (past its end: none)
        at = {n: k for k, n in enumerate(self.parents_first)}
        self.group_at = np.array([at.get(n, len(at)) for n in self.group_of])

    def log_slow(self, r: float, a: dict[str, float]) -> np.ndarray:
        pairs = zip(self.classes, self.kind_of_class, strict=True)
        exponent = np.array([exponent_of(a, str(c), k) for c, k in pairs])[self.class_of]
        compute = self.compute * np.exp(exponent * self.log_rate)
        return np.log(np.maximum(self.memory, compute) + r * self.scores)

    def log_etas(self, y: np.ndarray, names: list[str] | None = None) -> dict[str, float]:
        """Each group's log eta, from y = log(slow / measured) of every row: the median over
        its rows, drawn toward its parent's by its count of sources (SHRINK); of `names`
        only (parents first), else of every group."""
        out: dict[str, float] = {}
        for n in self.parents_first if names is None else names:
            own, parent, s = median(y[self.members[n]]), self.parent[n], self.sources[n]
            out[n] = own if parent is None else (s * own + SHRINK * out[parent]) / (s + SHRINK)
        return out

    def lineage(self, rows: np.ndarray) -> list[str]:
        """The groups the rows selected are predicted by, and their parents, parents first."""
        wanted = {self.group_of[i] for i in np.flatnonzero(rows)} - {""}
        todo = list(wanted)
        while todo:
            parent = self.parent[todo.pop()]
            if parent is not None and parent not in wanted:
                wanted.add(parent)
                todo.append(parent)
        return [n for n in self.parents_first if n in wanted]

    def _parents_first(self) -> list[str]:
        done: list[str] = []
        todo = sorted(self.members, key=lambda n: -len(self.members[n]))
        while todo:
            n = next(n for n in todo if self.parent[n] is None or self.parent[n] in done)
            done.append(n)
            todo.remove(n)
        return done

    def loss(self, r: float, a: dict[str, float], rows: np.ndarray, names: list[str]) -> float:
        """Total |log error| of the rows selected, each by its narrowest group (`names`: the
        lineage of those rows)."""
        y = self.log_slow(r, a) - self.log_measured
        etas = self.log_etas(y, names)
        by_group = np.array([etas.get(n, np.nan) for n in self.parents_first] + [np.nan])
        picked = np.flatnonzero(rows)
        err = y[picked] - by_group[self.group_at[picked]]
        return float(np.nansum(np.abs(err)))


def median(v: np.ndarray) -> float:
    """np.median of a few values, the same number, without its overhead (the grid's fits
    take ~80,000 medians: most of `sol --prompt`'s time)."""
    s, h = np.sort(v), len(v) // 2
    return float(s[h] if len(s) % 2 else (s[h - 1] + s[h]) / 2)


def exponent_of(a: dict[str, float], hw_class: str, kind: str) -> float:
    """A row's exponent of the rate: its class's, else its kind's (the GPUs'), else 0."""
    return a.get(hw_class, a.get(kind, 0.0))


def fit(points: Sequence[PrefillPoint]) -> PrefillFit:
    """r and the GPUs' a on their grids, minimizing the GPU rows' total |log error| (r = 0
    without GPU rows); then each GPU class's own a, where its rows come from MIN_SOURCES
    sources, on that class's rows; the CPUs' a stays 0. Each row is predicted by its
    narrowest group."""
    rows = _Rows(points)
    gpu = rows.kind == "gpu"
    r_grid, names = R_GRID if gpu.any() else (0.0,), rows.lineage(gpu)
    _, a_gpu, r = min((rows.loss(r, {"gpu": a}, gpu, names), a, r) for a in A_GRID
                      for r in r_grid)  # fmt: skip
    a = {"gpu": a_gpu}
    for c in sorted({str(c) for c in rows.hw_class[gpu]}):
        mine = rows.hw_class == c
        if len({p.source for p in points if p.hw_class == c}) >= MIN_SOURCES:
            names = rows.lineage(mine)
            a[c] = min((rows.loss(r, a | {c: x}, mine, names), x) for x in A_GRID)[1]
    y = rows.log_slow(r, a) - rows.log_measured
    etas = {n: GroupFit(n, math.exp(v), len(rows.members[n]), rows.sources[n])
            for n, v in rows.log_etas(y).items()}  # fmt: skip
    return PrefillFit(r, a, etas, tuple(points))


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
