"""Published batched decode (rows of phase "batch"): B sequences stepped together, their
aggregate tokens/s (llama-batched-bench's S_TG), against the speed of light of one step.

A step of B sequences reads every weight once and each sequence's KV cache (at the rows'
mean depth), and does B times one token's FLOPs (sol.estimate with `batch`): its bound is
max(bytes / bandwidth, FLOPs / the device's matrix peak for the format), the same peak the
prompt rows are held to (Device.matrix_peak: the fastest unit an engine may use). Measured:
B / tok_s a step. Small B are memory-bound and take the weights' time whatever B is;
past the ridge (Estimate.ridge_batch) the arithmetic binds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import cache

from .devices import load_devices
from .published import Measurement, PublishedError, batch_measurements, predict, summary_lines


@dataclass(frozen=True)
class HeldBatch:
    """A batched row and its bound, per step of its B sequences."""

    m: Measurement
    bytes: int  # a step's: the weights once, every sequence's KV cache
    flops: int  # a step's: B tokens
    peak: str  # which of the device's peaks ("fp16", "fp32", "int8")
    predicted_ms: float  # the bound of a step
    bound: str  # "memory" or "compute"
    ridge: float  # the batch at which this device's step turns compute-bound

    @property
    def measured_ms(self) -> float:
        return 1e3 * self.m.batch / self.m.tok_s

    @property
    def share(self) -> float:
        """The fraction of the bound reached: predicted / measured (1 = the speed of light)."""
        return self.predicted_ms / self.measured_ms


def predict_batch(m: Measurement) -> HeldBatch:
    """A step of the row's B sequences at its mean depth, as its engine stores the model
    (published.predict, with the row's batch), against the row's bandwidth and its
    device's matrix peak for the format."""
    device = load_devices().get(m.device)
    if device is None:
        raise PublishedError(f"unknown device {m.device!r} (bench/devices.json)")
    e = predict(m)
    kind, peak = device.matrix_peak(m.weights)
    pred = e.predict(m.bandwidth_gbs * 1e9, peak)
    return HeldBatch(m, e.bytes_per_token, e.flops, kind, pred.ms_per_token, pred.bound,
                     e.ridge_batch(m.bandwidth_gbs * 1e9, peak))  # fmt: skip


@cache
def held_batch() -> tuple[HeldBatch, ...]:
    return tuple(predict_batch(m) for m in batch_measurements())


def beaten(rows: list[HeldBatch]) -> list[HeldBatch]:
    """Rows measured faster than their bound (none, unless a peak or a row is wrong)."""
    return [h for h in rows if h.measured_ms < h.predicted_ms]


def batch_report(rows: list[HeldBatch], all_rows: bool = False) -> str:
    """Markdown: the share of the bound reached by hardware, model and format, and by B
    against the ridge; every row if asked."""
    lines = [f"{len(rows)} published batched decode measurements, "
             f"{len({h.m.source for h in rows})} sources (bench/published, phase batch): a "
             "step of B sequences against max(its bytes / the row's bandwidth, its FLOPs / the "
             "device's matrix peak); reached = predicted / measured step time. Rows faster "
             f"than their bound: {len(beaten(rows))}."]  # fmt: skip
    lines += summary_lines(
        "hardware / model / weights",
        rows,
        lambda h: f"{h.m.hardware} / {h.m.model} / {h.m.weights}",
    )
    below = [h.share for h in rows if h.m.batch < h.ridge]
    above = [h.share for h in rows if h.m.batch >= h.ridge]
    for name, shares in (("below the ridge (memory-bound)", below), ("at or past it", above)):
        if shares:
            lines.append(f"\nB {name}: {len(shares)} rows, reached median "
                         f"{statistics.median(shares):.2f}")  # fmt: skip
    if all_rows:
        lines += ["", "| source | hardware | model | weights | B | depth | bound | ridge B | "
                  "predicted step ms | measured step ms | reached |",
                  "|---|---|---|---|---:|---:|---|---:|---:|---:|---:|"]  # fmt: skip
        lines += [f"| {h.m.source} | {h.m.hardware} | {h.m.model} | {h.m.weights} | "
                  f"{h.m.batch} | {h.m.depth} | {h.bound} | {h.ridge:.0f} | "
                  f"{h.predicted_ms:.2f} | {h.measured_ms:.2f} | {h.share:.2f} |"
                  for h in rows]  # fmt: skip
    return "\n".join(lines)
