"""The probe, the bench runner and its reports, driving a stand-in for a model."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import numpy as np
import pytest

import bench.probe as probe_mod
from bench import report
from bench.meter import Meter
from bench.probe import Caches, Probe
from bench.runner import Settings, Variant, rehold, run
from bench.sol import estimate, prefill
from llama_arch import Config
from tests.helpers import cores_share

MIB = 1 << 20
TINY = Config("llama", 64, 2, 4, 2, 32, 128, 100, name="tiny")


def fake_probe() -> Probe:
    sizes = [256 << 10, 4 * MIB, 256 * MIB]
    return Probe(
        "test", 2, Caches(512 << 10, 32 * MIB, 2), sizes, [60.0, 100.0, 25.0], [20.0] * 3, 100.0
    )


def test_probe_tiers_are_labels():
    p = fake_probe()
    assert (p.tier_of(100 << 10), p.tier_of(8 * MIB), p.tier_of(200 * MIB)) == ("L2", "L3", "DRAM")
    assert "| 256 MiB | DRAM | 25.0 |" in probe_mod.probe_report(p)


def big_l3_probe() -> Probe:
    """A VM that reports a 480 MiB L3 (the host's): the curve falls from 114 GB/s at 4 MiB
    to 47.6 at 128 MiB, 35.5 at 256 MiB and 31.7 at 2 GiB, all in its 'L3' but the last."""
    sizes = [4 * MIB, 128 * MIB, 256 * MIB, 2048 * MIB]
    return Probe("xeon", 2, Caches(2 * MIB, 480 * MIB, 2), sizes, [90.0, 40.0, 30.0, 31.7],
                 [20.0] * 4, 352.0, compiled_gbs=[114.2, 47.6, 35.5, 17.0],
                 int_gbs=[60.0, 30.0, 30.0, 20.0])  # fmt: skip


def test_attainable_follows_the_curve_at_the_working_set():
    """A 206 MB model (SmolLM2-360M q4_0) on a machine whose reported L3 holds it is held
    against the curve between 128 and 256 MiB, not the L3 tier's best (114 GB/s at 4 MiB);
    the tier stays a label; sizes beyond the largest take the largest's figure, below the
    smallest the smallest's; the best of sgemv and the compiled matvec at each size."""
    p = big_l3_probe()
    tier, bw = p.attainable(206_000_000)
    frac = math.log(206e6 / (128 * MIB)) / math.log(2)  # log-interpolated between the two
    assert tier == "L3" and bw == pytest.approx((47.6 + (35.5 - 47.6) * frac) * 1e9)
    assert 35.5e9 < bw < 47.6e9
    assert p.attainable(128 * MIB)[1] == pytest.approx(47.6e9)  # a measured size: its figure
    assert p.attainable(8 * 2048 * MIB) == ("DRAM", pytest.approx(31.7e9))  # sgemv's, there
    assert p.attainable(1 * MIB)[1] == pytest.approx(114.2e9)
    assert p.dram_gbs() == 31.7 and p.slow_compiled() == [2048 * MIB]
    report = probe_mod.probe_report(p)
    assert "streams under 0.9 of sgemv at 2.15 GB" in report
    assert "| 128 MiB | L3 | 40.0 | 47.6 | 30.0 | 20.0 | 47.6 |" in report


def test_the_integer_decode_kernel_can_set_the_curve():
    """A size where the q8_0 integer matvec (which asks for its lines ahead) streams faster
    than sgemv and the compiled f32 matvec is held at its figure: the curve is the fastest
    reader's, so a step run by that kernel cannot beat its own bound."""
    p = Probe(**{**big_l3_probe().__dict__, "int_gbs": [60.0, 30.0, 30.0, 36.0]})
    assert p.best_gbs() == [114.2, 47.6, 35.5, 36.0]
    assert p.dram_gbs() == 36.0 and p.attainable(8 * 2048 * MIB)[1] == pytest.approx(36.0e9)


def test_rows_say_where_on_the_curve_they_were_held():
    """bench's rows: the working set, the figure read there, % of it, and SOL from it."""
    s = Settings(prompt=8, n=6, depths=(0,), reps=1, warmup=1)
    probe = big_l3_probe()
    (r,) = run(Stand(), s, probe, None, progress=False)
    tier, bw = probe.attainable(r.working_set)
    assert r.working_set == r.sol_bytes_per_token and r.attainable_gbs == bw / 1e9
    assert r.pct_attainable == pytest.approx(100 * r.gbs / r.attainable_gbs)
    text = report.text_table([r])
    assert f"{bw / 1e9:.1f} at {probe_mod.size_label(r.working_set)} ({tier})" in text


def test_ceiling_not_below():
    def rates(*values):
        it = iter(values)
        return lambda: next(it)

    # two low runs that agreed, then a third at the machine's rate: that rate
    assert probe_mod.not_below(140.0, [140.0, 135.0], rates(236.0), 218.0) == (
        236.0, [140.0, 135.0, 236.0])  # fmt: skip
    # never reaching what the product did: three more runs, then the product's rate
    best, runs = probe_mod.not_below(140.0, [140.0], rates(150.0, 120.0, 160.0, 999.0), 218.0)
    assert (best, runs) == (218.0, [140.0, 150.0, 120.0, 160.0])
    # at or above it: untouched, no run more
    assert probe_mod.not_below(236.0, [236.0], rates(), 218.0) == (236.0, [236.0])


@pytest.mark.slow  # sweeps working sets up to 32 MiB: ~10 s
def test_probe_measures_and_caches(tmp_path, monkeypatch):
    monkeypatch.setattr(probe_mod, "cache_dir", lambda: tmp_path)  # kernels: the usual cache
    monkeypatch.setattr(Caches, "read", classmethod(lambda cls: Caches(512 << 10, 4 * MIB, 2)))
    monkeypatch.setattr(probe_mod, "DRAM_FLOOR", 16 * MIB)  # 8 x the L3 here sets the top
    # this worker's share of the cores (tests/conftest.py): a parallel kernel of more
    # threads than that waited at every call for one the other worker displaced (0.03-0.07
    # GB/s at 256 KiB)
    n = cores_share()
    p = probe_mod.run_probe(n, progress=False)  # sizes up to 32 MiB here: a few seconds
    assert p.sizes[0] == 256 << 10 and p.sizes[-1] == 32 * MIB  # 8 x the L3: above the floor
    assert all(g > 0.1 for g in p.sgemv_gbs + p.reduce_gbs) and p.sgemm_gflops > 1
    assert len(p.compiled_gbs) == len(p.sizes) and min(p.compiled_gbs) > 0.1  # numba is here
    assert len(p.int_gbs) == len(p.sizes) and min(p.int_gbs) > 0.1
    curves = zip(p.sgemv_gbs, p.compiled_gbs, p.int_gbs, strict=True)
    assert p.best_gbs() == [max(t) for t in curves]
    for best, runs in ((p.sgemm_gflops, p.sgemm_runs), (p.compiled_gflops, p.compiled_runs),
                       (p.compiled_q_gflops, p.compiled_q_runs), (p.fma_gflops, p.fma_runs),
                       (p.int8_gops, p.int8_runs)):  # fmt: skip
        assert best >= max(runs) > 1 and 1 <= len(runs) <= 11
    # the ceilings bound what the products reach (another worker shares the cores here: a
    # disturbed peak is timed again or takes the product's rate, test_ceiling_not_below)
    assert p.fma_gflops >= max(p.compiled_gflops, p.sgemm_gflops)
    assert p.int8_gops >= 2 * p.compiled_q_gflops
    assert "no run reached" not in probe_mod.probe_report(replace(p, fma_gflops=max(p.fma_runs)))
    assert "no run reached" in probe_mod.probe_report(replace(p, fma_gflops=2 * max(p.fma_runs)))
    probe_mod.save_probe(p)
    assert probe_mod.load_probe(n).sgemv_gbs == p.sgemv_gbs
    p.fma_gflops = 0.0  # a probe saved before the machine ceilings is made again
    probe_mod.save_probe(p)
    assert probe_mod.load_probe(n) is None
    p.fma_gflops, p.int_gbs = 1.0, []  # ... and one saved before the integer curve
    probe_mod.save_probe(p)
    assert probe_mod.load_probe(n) is None
    p.int_gbs = [1.0] * len(p.sizes)
    probe_mod.save_probe(p)
    assert probe_mod.load_probe(n) is not None
    monkeypatch.setattr(probe_mod, "DRAM_FLOOR", 64 * MIB)  # ... and one that stopped short
    assert probe_mod.load_probe(n) is None


def test_the_peak_kernels_compute_what_they_count():
    """The int8 peak kernel's result is what its bytes give: lane 0 of every chain holds
    the thread's seed t as bytes (t, 0, 0, 0) against (8, 7, 6, 5), 8 t a round, so its
    multiply-adds were really done; the FMA kernel stays finite."""
    from quant.compiled import peak

    n, threads = 10, 2
    assert peak.int8_peak(n, threads) == peak.CHAINS * n * 8 * sum(range(threads))
    assert np.isfinite(peak.fma_peak(n, threads))


class Stand:
    """A decoder that reads, per step, exactly the speed-of-light model's bytes, so the
    runner's arithmetic can be checked without the engine."""

    def __init__(self) -> None:
        self.config, self.meter = TINY, Meter()
        self.variant = Variant("q8_0", "q8_0", "q8_0", "f32")
        self.pos = 0

    def start(self, depth: int) -> None:
        self.pos = depth

    def _forward(self, n: int) -> None:
        kind = "decode" if n == 1 else "prefill"
        self.meter.begin(kind, self.pos, n)
        e = estimate(TINY, "q8_0", pos=self.pos + n - 1)
        for cat, nbytes in e.reads.items():
            t0 = time.perf_counter()
            self.meter.read(cat, nbytes)
            if self.meter.profile:
                self.meter.lap(cat, t0)
        self.meter.write("kv_cache", e.kv_write_bytes * n)
        self.meter.end()
        self.pos += n

    def prefill(self, tokens: np.ndarray) -> None:
        self._forward(len(tokens))

    def step(self, token: int) -> None:
        time.sleep(1e-4)
        self._forward(1)

    def start_batch(self, depth: int, batch: int) -> None:
        self.pos, self.batch = depth, batch

    def step_batch(self, tokens: np.ndarray) -> None:
        time.sleep(1e-4)
        self.meter.begin("decode", self.pos, len(tokens), len(tokens))
        e = estimate(TINY, "q8_0", pos=self.pos, batch=len(tokens))
        for cat, nbytes in e.reads.items():
            self.meter.read(cat, nbytes)
        self.meter.end()
        self.pos += 1

    def check(self) -> None:
        self.checked = getattr(self, "checked", 0) + 1


@pytest.fixture(scope="module")
def rows():
    s = Settings(prompt=8, n=6, depths=(0, 40), reps=2, warmup=1, profile=True)
    return run(Stand(), s, fake_probe(), None, progress=False)


def test_runner_rows_are_consistent(rows):
    assert [r.depth for r in rows] == [0, 40]
    for r in rows:
        assert r.decode_ms_min <= r.decode_ms <= r.decode_ms_max and r.prefill_tok_s > 0
        assert r.gbs == pytest.approx(r.bytes_per_token / r.decode_ms / 1e6)
        assert r.tier == "L2" and r.attainable_gbs == 60.0  # the smallest size's figure
        assert r.pct_attainable == pytest.approx(100 * r.gbs / 60)
        assert r.measured_over_sol == pytest.approx(r.decode_ms / r.sol_ms)
        # the prompt's FLOPs (sol.prefill's, per token) at its speed over the same ceiling
        per_token = prefill(TINY, 8, "q8_0", pos=r.depth, kernels="numpy").flops / 8
        assert r.prefill_flops == pytest.approx(per_token, rel=1e-3)
        assert r.prefill_mfu == pytest.approx(
            100 * per_token * r.prefill_tok_s / (r.peak_gflops * 1e9), rel=1e-3
        )
        assert abs(r.bytes_per_token - r.sol_bytes_per_token) <= 2 * 2 * 2 * 64 * 4  # KV drift
        assert (r.model, r.weights, r.kernels) == ("tiny", "q8_0", "numpy")
        prof = r.profile
        assert sum(v["ms"] for k, v in prof.items() if k != "total") == pytest.approx(
            prof["total"]["ms"]
        )
    assert rows[1].bytes_per_token > rows[0].bytes_per_token  # the deeper cache is read


def test_reports(rows, tmp_path):
    assert "decode ms/tok" in report.text_table(rows)
    assert report.markdown(rows).count("\n") == len(rows) + 1
    assert report.csv_text(rows).splitlines()[0].startswith("model,kernels,weights")
    assert len(json.loads(report.json_text(rows))["rows"]) == 2
    assert "outside kernels" in report.profile_table(rows[0])
    report.plot(rows, tmp_path / "p.png", "test")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_a_batch_profile_is_per_step_and_split_against_its_bound():
    """A profiled batch's table is per step of B sequences, with the gap to its speed of
    light named by the bound that sets it."""
    s = Settings(n=4, depths=(0,), reps=1, warmup=1, batch=(2, 64), profile=True)
    for r in run(Stand(), s, fake_probe(), None, progress=False):
        text = report.profile_table(r)
        assert f"(per decode step of {r.batch} sequences)" in text
        assert "the gap to the speed of light" in text
        line = "its bytes at the probe's rate" if r.bound == "memory" else "its arithmetic"
        assert line in text


def test_batch_rows(tmp_path):
    s = Settings(n=5, depths=(0, 16), reps=2, warmup=1, batch=(1, 4, 16))
    rows = run(Stand(), s, fake_probe(), None, progress=False)
    assert [(r.depth, r.batch) for r in rows] == [(d, b) for d in (0, 16) for b in (1, 4, 16)]
    for r in rows:
        assert r.batched and r.step_ms == r.decode_ms
        assert r.tok_s == pytest.approx(1e3 * r.batch / r.step_ms)
        e = estimate(TINY, "q8_0", pos=r.depth + 3, batch=r.batch)  # mid of 6 steps
        assert r.flops_per_step == e.flops and r.bound in ("memory", "compute")
        assert abs(r.bytes_per_step - e.bytes_per_token) <= r.batch * 2 * 2 * 2 * 64 * 4 * 3
        assert r.ridge_batch == pytest.approx(e.ridge_batch(r.attainable_gbs * 1e9, 100e9))
    b1, b16 = rows[0], rows[2]
    # weights once per step: 16 sequences read far less than 16 times one sequence's bytes
    assert b16.bytes_per_step < 2 * b1.bytes_per_step
    text = report.text_table(rows)
    assert "step ms" in text and "B*" in text and "GFLOP/step" in text
    assert report.markdown(rows).count("\n") == len(rows) + 1
    row = json.loads(report.json_text(rows))["rows"][1]
    assert {"batch", "step_ms", "tok_s", "bytes_per_step", "flops_per_step", "sol_ms",
            "measured_over_sol", "bound"} <= set(row)  # fmt: skip
    assert "step_ms" in report.csv_text(rows).splitlines()[0]
    report.plot_batch(rows, tmp_path / "b.png", "test")
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_best_agreeing_repeats_until_two_runs_agree():
    runs = iter([100.0, 180.0, 120.0, 175.0, 500.0])
    best, seen = probe_mod.best_agreeing(lambda: next(runs))
    assert best == 180.0 and seen == [100.0, 180.0, 120.0, 175.0]  # 175 within 10% of 180
    best, seen = probe_mod.best_agreeing(lambda: 1.0 + len(seen) * 0.5, most=3)
    assert len(seen) <= 3


def test_peak_flops_is_the_ceiling_of_the_instruction_that_runs():
    """Never the product's own rate (a bound the kernels could beat): sgemm for NumPy,
    the machine's FMA peak for float weights or float x, its int8 multiply-add peak for
    int8 x and half of it for int16 x (two products per weight)."""
    p = fake_probe()
    p.compiled_gflops, p.compiled_q_gflops = 80.0, 50.0
    p.fma_gflops, p.int8_gops = 300.0, 900.0
    assert p.peak_flops("numpy", "q8_0", "f32") == 100e9  # sgemm
    assert p.peak_flops("numba", "f32", "int16") == p.peak_flops("numba", "q4_k", "f32") == 300e9
    assert p.peak_flops("numba", "q8_0", "int8") == 900e9
    assert p.peak_flops("numba", "q4_k", "int16") == 450e9
    p.fma_gflops = p.int8_gops = 0.0  # a probe from before the machine ceilings
    assert p.peak_flops("numba", "q8_0", "int16") == 100e9


def test_reprobe_measures_again_only_around_the_working_sets():
    """bench.probe.reprobe: the sizes the curve interpolates between around each working
    set (or its last, beyond it) are measured again and keep the better figure; other sizes
    and the probe given are untouched."""
    sizes = [256 << 10, 512 << 10, 1 * MIB, 2 * MIB]
    low, high = 1e-3, 1e6  # GB/s: far below and far above anything a machine reads
    p = Probe("test", 2, Caches(512 << 10, 32 * MIB, 2), sizes, [high, low, low, high],
              [20.0] * 4, 100.0, compiled_gbs=[high, low, low, high],
              int_gbs=[high, low, low, high])  # fmt: skip
    fresh = probe_mod.reprobe(p, [700 << 10], 2)  # between 512 KiB and 1 MiB
    for got in (fresh.sgemv_gbs, fresh.compiled_gbs, fresh.int_gbs):
        assert got[0] == got[3] == high  # better than now: kept
        assert low < got[1] < high and low < got[2] < high  # measured again, better: taken
    assert p.sgemv_gbs == p.compiled_gbs == p.int_gbs == [high, low, low, high]
    beyond = probe_mod.reprobe(p, [64 * MIB], 2)  # past the largest: only the largest
    assert beyond.sgemv_gbs[:3] == [high, low, low]


def test_rows_held_again_against_a_better_probe():
    """runner.rehold: the same rows against a probe whose bandwidth at their working set is
    doubled: the memory term halves, measured / SOL doubles, nothing else moves."""
    s = Settings(prompt=8, n=6, depths=(0,), reps=1, warmup=1)
    dec, probe = Stand(), Probe(**{**fake_probe().__dict__, "sgemm_gflops": 1e4})  # memory-bound
    (r,) = run(dec, s, probe, None, progress=False)
    before = (r.sol_ms, r.measured_over_sol, r.decode_ms, r.bytes_per_token)
    better = Probe(**{**probe.__dict__, "sgemv_gbs": [2 * g for g in probe.sgemv_gbs]})
    rehold([r], dec, s, better)
    assert r.bound == "memory" and r.attainable_gbs == 2 * 60.0
    assert r.sol_ms == pytest.approx(before[0] / 2)
    assert r.measured_over_sol == pytest.approx(2 * before[1])
    assert (r.decode_ms, r.bytes_per_token) == before[2:]
