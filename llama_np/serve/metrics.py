"""GET /metrics in Prometheus' text format (prometheus_client): what the engine did, and
its decode steps held against the speed of light as `bench --batch` holds them, per batch
size seen: GB/s, the share of the probe's attainable bandwidth at the step's working set,
the speed-of-light step time and measured/SOL."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from bench.probe import Probe
from bench.sol import estimate, weights_label
from llama_np.model.decoder import weight_plan
from llama_np.serve.engine import Engine

PREFIX = "llamanp_"


class Metrics:
    """The collector behind /metrics (`probe`: this machine's, None leaves out the
    bandwidth and speed-of-light figures)."""

    def __init__(self, engine: Engine, probe: Probe | None, window: int | None) -> None:
        self.engine, self.probe, self.window = engine, probe, window
        model = engine.llm.model
        self.weights, self.head, self.embed = weight_plan(model.weights, model.config)
        self.backend, self.dot = model.backend.name, model.backend.dot
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.content_type = CONTENT_TYPE_LATEST

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def model_info(self) -> dict[str, Any]:
        """What `bench --endpoint` needs to hold this server against the speed of light."""
        e = self.engine
        return {"config": asdict(e.llm.config), "weights": self.weights, "head": self.head,
                "embed": self.embed, "kv": e.kv, "window": self.window,
                "kernels": self.backend, "dot": self.dot, "threads_label": e.llm.kernels,
                "slots": e.slots, "ctx": e.ctx}  # fmt: skip

    def collect(self):
        c = self.engine.counters
        yield _counter("requests", "requests admitted to a slot", c.requests)
        done = CounterMetricFamily(PREFIX + "requests_finished", "requests ended, by reason",
                                   labels=["reason"])  # fmt: skip
        for reason, n in sorted(dict(c.finished).items()):  # the engine's thread adds keys
            done.add_metric([reason], n)
        yield done
        yield _counter("prompt_tokens", "prompt tokens prefilled", c.prompt_tokens)
        yield _counter("prompt_tokens_cached", "prompt tokens a slot's cache held already "
                       "(not prefilled)", c.prompt_cached)  # fmt: skip
        yield _counter("generation_tokens", "tokens generated", c.generated)
        yield _counter("prefill_seconds", "seconds spent prefilling", c.prefill_s)
        yield _gauge("requests_running", "sequences holding a slot", c.running)
        yield _gauge("requests_waiting", "requests queued for a slot", c.waiting)
        yield _gauge("slots", "sequences the engine steps together at most", self.engine.slots)
        yield from self._steps()

    def _steps(self):
        seen = {b: list(s) for b, s in dict(self.engine.counters.steps).items()}
        n = sum(s[0] for s in seen.values())
        rows = sum(b * s[0] for b, s in seen.items())
        yield _gauge("batch_occupancy", "mean sequences per decode step", rows / n if n else 0)
        families = {name: GaugeMetricFamily(PREFIX + name, text, labels=["batch"])
                    for name, text in STEP_GAUGES}  # fmt: skip
        steps = CounterMetricFamily(PREFIX + "decode_steps", "decode steps", labels=["batch"])
        for b, (count, seconds, nbytes, pos) in sorted(seen.items()):
            steps.add_metric([str(b)], count)
            for name, value in self._held(b, count, seconds, nbytes, pos / count).items():
                families[name].add_metric([str(b)], value)
        yield steps
        yield from families.values()

    def _held(self, b: int, count: int, seconds: float, nbytes: int,
              pos: float) -> dict[str, float]:  # fmt: skip
        """One batch size's steps, as `bench --batch` reports a row."""
        out = {"decode_step_seconds": seconds / count, "decode_position": pos,
               "decode_gbs": nbytes / seconds / 1e9,
               "decode_tokens_per_second": b * count / seconds}  # fmt: skip
        if self.probe is None:
            return out
        est = estimate(self.engine.llm.config, self.weights, self.engine.kv, pos=round(pos),
                       window=self.window, head=self.head, embed=self.embed,
                       kernels=self.backend, batch=b)  # fmt: skip
        _, bw = self.probe.attainable(est.bytes_per_token)
        peak = self.probe.peak_flops(self.backend, weights_label(self.weights), self.dot)
        sol = est.predict(bw, peak).ms_per_token / 1e3
        return out | {"attainable_gbs": bw / 1e9,
                      "attainable_ratio": nbytes / seconds / bw,
                      "sol_step_seconds": sol,
                      "measured_over_sol": seconds / count / sol,
                      "mfu_ratio": est.flops * count / seconds / peak}  # fmt: skip


STEP_GAUGES = [
    ("decode_step_seconds", "mean seconds per decode step"),
    ("decode_position", "mean position of the tokens the decode steps fed"),
    ("decode_gbs", "GB/s the decode steps read (the byte meter's bytes)"),
    ("decode_tokens_per_second", "tokens per second of the decode steps, all sequences"),
    ("attainable_gbs", "the probe's attainable GB/s at the step's working set"),
    ("attainable_ratio", "decode GB/s as a share of the attainable GB/s"),
    ("sol_step_seconds", "the speed-of-light step time (bench.sol)"),
    ("measured_over_sol", "measured step time over the speed-of-light step time"),
    ("mfu_ratio", "achieved FLOPS over the ceiling of the kernels' arithmetic"),
]


def _counter(name: str, text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, text, value=value)


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, text, value=value)
