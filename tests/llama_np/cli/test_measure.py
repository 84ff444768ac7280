"""The measuring commands: `sol`, `bench` (its runner and reports: tests/bench)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llama_np.cli import main
from tests.bench.test_runner import fake_probe


def test_sol_command_json(capsys):
    assert (
        main(
            ["sol", "--config", "llama-2-7b", "--device", "rtx-4090", "--weights", "q4_0", "--json"]
        )
        == 0
    )
    d = json.loads(capsys.readouterr().out)
    for key in ("params_total", "params_active", "weight_bytes_per_token", "kv_bytes_per_token",
                "bytes_per_token", "flops_per_token", "bandwidth_bytes_per_s",
                "predicted_ms_per_token", "predicted_tokens_per_s", "bound"):  # fmt: skip
        assert key in d
    assert d["bound"] == "memory"
    assert d["predicted_ms_per_token"] == pytest.approx(1e3 * d["bytes_per_token"] / 1008e9)


def test_sol_against_a_device_compiles_nothing(monkeypatch, capsys):
    """An estimate for a device needs the compiled backend's layouts (the bytes its meter
    counts), not its kernels: on a machine that never compiled them it answers at once."""

    def refuse(*args, **kwargs):
        raise AssertionError("sol warmed the compiled kernels up")

    monkeypatch.setattr("quant.compiled.warm_up", refuse)
    args = ["sol", "--config", "llama-3-8b", "--weights", "q4_0", "--device", "rtx-4090"]
    for extra, key in (([], "bytes_per_token"), (["--kernels", "numba-int8"], "bytes_per_token"),
                       (["--prompt", "512"], "expected_prefill_tok_s")):  # fmt: skip
        assert main([*args, *extra, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[key] > 0


def test_sol_command_errors(capsys):
    assert main(["sol", "--config", "llama-2-7b", "--device", "gpu-9000"]) == 2
    assert "unknown device" in capsys.readouterr().err
    assert main(["sol", "--config", "nope"]) == 2
    assert main(["sol", "--list-devices"]) == 0
    assert "h100-sxm" in capsys.readouterr().out


def test_bench_command_on_a_synthetic_preset(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        "llama_np.cli.measure.probe_for", lambda threads, refresh=False: fake_probe()
    )
    args = "bench -m synthetic:smollm2-135m --weights q4_0 -p 4 -n 4 -r 1 --depth 0,16 --json"
    args = [*args.split(), "--peak-gbs", "50"]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["depth"] for r in d["rows"]] == [0, 16]
    r = d["rows"][0]
    assert r["weights"] == "q4_0" and r["pct_peak"] == pytest.approx(100 * r["gbs"] / 50)
    assert r["rss_mb"] > 0
    assert np.isfinite(r["sol_ms"])


def slow_probe(gbs: float):
    """fake_probe with every bandwidth figure `gbs` and a compute ceiling no row reaches."""
    p = fake_probe()
    return type(p)(**{**p.__dict__, "sgemv_gbs": [gbs] * 3, "sgemm_gflops": 1e6})


@pytest.mark.parametrize("fresh", [1e4, 1e-3])  # GB/s measured again: enough, still too low
def test_bench_measures_the_probe_again_where_a_row_beats_it(fresh, monkeypatch, capsys):
    """A row faster than its speed of light (a probe taken at a slow moment) makes bench
    measure the curve again at its working set (bench.probe.reprobe), keep that probe in
    the cache and hold every row against it; a row that still beats it is said on stderr."""
    asked, saved = [], []

    def reprobe(probe, working_sets, threads):
        asked.append(working_sets)
        return slow_probe(fresh)

    monkeypatch.setattr("llama_np.cli.measure.probe_for", lambda t, refresh=False: slow_probe(1e-3))
    monkeypatch.setattr("bench.probe.reprobe", reprobe)
    monkeypatch.setattr("llama_np.cli.measure.save_probe", saved.append)
    args = "bench -m synthetic:smollm2-135m --weights q8_0 -p 4 -n 4 -r 1 --depth 0,8 --json"
    assert main(args.split()) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)["rows"]
    assert len(asked) == 1 and sorted(asked[0]) == sorted(r["working_set"] for r in rows)
    assert [p.sgemv_gbs for p in saved] == [[fresh] * 3]
    assert all(r["attainable_gbs"] == pytest.approx(fresh) for r in rows)
    assert "probing again" in out.err
    if fresh > 1:
        assert all(r["measured_over_sol"] > 1 for r in rows) and "no bound" not in out.err
    else:
        assert out.err.count("its bound is no bound") == len(rows)
