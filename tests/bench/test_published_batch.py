"""Published batched decode (phase "batch") against the speed of light of a step."""

from __future__ import annotations

import csv
import dataclasses
import json
from importlib import resources

import pytest

from bench import published
from bench.published_batch import batch_report, held_batch, predict_batch
from llama_np.cli import main


def row(batch: int, tok_s: float, model: str = "llama-2-7b", weights: str = "Q4_0"):
    """A batch row of an M2 Ultra, made from the dataset's first row."""
    first = next(csv.DictReader(resources.files("bench").joinpath(
        "published", "measurements.csv").read_text().splitlines()))  # fmt: skip
    d = first | {"phase": "batch", "device": "apple-m2-ultra", "hw_class": "apple-gpu",
                 "bandwidth_gbs": "800", "model": model, "weights": weights,
                 "prompt_tokens": "128", "gen_tokens": "128", "batch": str(batch),
                 "tok_s": str(tok_s)}  # fmt: skip
    return published._row(d, 2)


def test_a_step_reads_the_weights_once_and_each_sequence_its_cache():
    """B = 1 is one decode token's bound (memory); B sequences add only their KV caches
    (and embedding rows) to the bytes and B times the FLOPs, so a large B turns the step
    compute-bound past its ridge, and the measured step time is B / tok_s."""
    one, many = predict_batch(row(1, 40.0)), predict_batch(row(256, 2000.0))
    decode = published.predict(dataclasses.replace(row(1, 40.0), phase="decode"))
    assert one.bytes == decode.bytes_per_token and one.bound == "memory"
    assert one.predicted_ms == pytest.approx(1e3 * one.bytes / 800e9)
    assert many.bytes == one.bytes + 255 * decode.per_sequence_bytes  # its cache, its row
    assert many.flops == 256 * one.flops and many.bound == "compute"
    assert one.ridge < 256 and many.measured_ms == pytest.approx(1e3 * 256 / 2000.0)


def test_a_batch_row_needs_its_device():
    with pytest.raises(published.PublishedError, match="batch row without its device"):
        published._row({k: str(v) for k, v in dataclasses.asdict(row(4, 100.0)).items()}
                       | {"device": ""}, 9)  # fmt: skip


def test_no_published_batch_row_beats_its_bound_and_the_report_says_so(capsys):
    rows = list(held_batch())
    assert len(rows) >= 20 and {h.m.batch for h in rows} > {1}
    for h in rows:
        assert h.share <= 1.0, (h.m.hardware, h.m.model, h.m.batch, h.share)
        assert h.m.source in published.sources() and h.m.model in published.models()
    assert "Rows faster than their bound: 0." in batch_report(rows)
    assert main(["sol", "--published", "--batched", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out) == len(rows) and {"predicted_step_ms", "reached"} <= set(out[0])


@pytest.mark.parametrize("argv", [["--batched"], ["--published", "--batched", "--prefill"],
                                  ["--published", "--batched", "--plot", "x.png"]])  # fmt: skip
def test_batched_flags_out_of_place_are_one_line_errors(argv, capsys):
    assert main(["sol", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("llama-np: error:") and "\n" not in err
