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
