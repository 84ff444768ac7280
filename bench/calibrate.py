"""The expected speed beside the bound: ms/token = bytes / (eta x bandwidth) + t0, fitted to
measurements, checked on measurements it was not fitted on.

A fit is made per group of rows (a hardware class and an engine; or the class alone; or
all rows) by least squares on relative error, measured = predicted / eta + t0, so that
a 2 ms row weighs as much as a 200 ms one; t0 >= 0 (a per-token cost: launches, sampling,
synchronisation), 0 < eta. Held out by source: each source's rows are predicted by the
fit of the other sources' rows in the narrowest group that has at least MIN_ROWS of them
(leave one source out), so the spread reported is what a new source's figure would see.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

MIN_ROWS = 4  # rows a group needs for a fit of its own


@dataclass(frozen=True)
class Point:
    """One measurement against its bound: predicted (bytes / bandwidth) and measured ms."""

    predicted_ms: float
    measured_ms: float
    hw_class: str
    engine: str
    source: str


@dataclass(frozen=True)
class Fit:
    """measured = predicted / eta + t0, fitted on `rows` rows of `sources` sources."""

    group: str  # "nvidia-gpu / llama.cpp", "nvidia-gpu", "all"
    eta: float
    t0_ms: float
    rows: int
    sources: int

    def expect(self, predicted_ms: float) -> float:
        return predicted_ms / self.eta + self.t0_ms


def fit(points: Sequence[Point], group: str) -> Fit:
    """Weighted least squares on relative error; refitted through the origin when the
    intercept comes out negative."""
    x = np.array([p.predicted_ms for p in points])
    y = np.array([p.measured_ms for p in points])
    w = 1.0 / y  # relative errors: (y - a x - b) / y
    a, b = np.linalg.lstsq(np.stack([x * w, w], 1), y * w, rcond=None)[0]
    if b < 0:
        a, b = float((x * w) @ (y * w) / ((x * w) @ (x * w))), 0.0
    return Fit(group, 1.0 / float(a), float(b), len(points), len({p.source for p in points}))


def groups(p: Point) -> list[tuple[str, Callable[[Point], bool]]]:
    """The groups a point belongs to, narrowest first."""
    return [
        (f"{p.hw_class} / {p.engine}", lambda q: (q.hw_class, q.engine) == (p.hw_class, p.engine)),
        (p.hw_class, lambda q: q.hw_class == p.hw_class),
        ("all", lambda q: True),
    ]


def best_fit(points: Sequence[Point], like: Point, exclude: str | None = None) -> Fit | None:
    """The fit for a point like `like`: the narrowest group with MIN_ROWS rows (not from
    source `exclude`); None if no group has that many."""
    for name, member in groups(like):
        rows = [q for q in points if member(q) and q.source != exclude]
        if len(rows) >= MIN_ROWS:
            return fit(rows, name)
    return None


@dataclass(frozen=True)
class Held:
    point: Point
    fit: Fit  # fitted without the point's source

    @property
    def error(self) -> float:
        """(expected - measured) / measured."""
        return self.fit.expect(self.point.predicted_ms) / self.point.measured_ms - 1


def leave_one_source_out(points: Sequence[Point]) -> list[Held]:
    """Every point predicted by the fit of the other sources' points (those the others
    cannot fit are left out)."""
    fits = [(p, best_fit(points, p, exclude=p.source)) for p in points]
    return [Held(p, f) for p, f in fits if f is not None]


def spread(held: Sequence[Held]) -> dict[str, float]:
    """Median, 80th and 90th percentile of |error|, and the rows (NaN without rows)."""
    errors = sorted(abs(h.error) for h in held)
    if not errors:
        return {"rows": 0, "median": float("nan"), "p80": float("nan"), "p90": float("nan")}
    return {"rows": len(errors), "median": statistics.median(errors),
            "p80": float(np.percentile(errors, 80)),
            "p90": float(np.percentile(errors, 90))}  # fmt: skip


def local_path(machine: str):
    """Where this machine's own rows are kept (the results command writes them)."""
    import hashlib

    from quant.host import cache_dir

    return cache_dir() / f"calibration-{hashlib.sha256(machine.encode()).hexdigest()[:16]}.json"


def save_local(machine: str, rows: Sequence[dict]) -> None:
    """Keep this machine's validation rows (bench rows as dicts) for `local_fit`."""
    import json

    keep = [{"predicted_ms": r["sol_ms"], "measured_ms": r["decode_ms"], "model": r["model"],
             "kernels": r["kernels"]} for r in rows if r.get("sol_ms")]  # fmt: skip
    path = local_path(machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine, "rows": keep}, indent=1))


def local_points(machine: str) -> list[Point]:
    """This machine's rows as points (each model a 'source': held out one model at a time);
    [] if the results command never ran here."""
    import json

    try:
        saved = json.loads(local_path(machine).read_text())
    except (OSError, ValueError):
        return []
    return [Point(r["predicted_ms"], r["measured_ms"], "this machine", "llama-np", r["model"])
            for r in saved["rows"]]  # fmt: skip
