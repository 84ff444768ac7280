"""`bench --compare`: two runs of `bench --json` matched row by row."""

from __future__ import annotations

import json

import pytest

from bench.compare import CompareError, Run, load_run, table, verdict
from llama_np.cli import main


def row(depth: int, ms: float, lo: float, hi: float, sol: float | None, **kw) -> dict:
    r = dict(model="m", weights="q8_0", head="q8_0", kv="f32", window=None, depth=depth,
             batch=1, decode_ms=ms, decode_ms_min=lo, decode_ms_max=hi,
             measured_over_sol=sol)  # fmt: skip
    return r | kw


def run(path: str, rows: list[dict], cpu: str = "cpu A", sha: str = "ab" * 32) -> Run:
    meta = {"threads": 2, "cpu": cpu, "commit": "abc1234", "date": "2026-11-27T10:00:00+00:00",
            "model": {"sha256": sha}}  # fmt: skip
    return Run(path, meta, rows)


def test_rows_are_matched_and_the_difference_held_against_the_spread():
    old = run("old.json", [row(0, 10.0, 9.5, 10.5, 1.5), row(64, 12.0, 11.0, 13.0, 1.6),
                           row(512, 20.0, 19.0, 21.0, 2.0)])  # fmt: skip
    new = run("new.json", [row(0, 8.0, 7.5, 8.4, 1.2), row(64, 12.5, 11.5, 13.5, 1.7),
                           row(0, 9.0, 8.9, 9.1, 1.3, batch=4)])  # fmt: skip
    text = table(old, new)
    lines = [line for line in text.splitlines() if line.startswith("| m ")]
    assert len(lines) == 2
    first = "| 0 | 1 | 10.00 (9.50-10.50) | 8.00 (7.50-8.40) | 0.800 | faster | 1.50 | 1.20 | new |"
    assert first in lines[0]
    assert "| 1.042 | within spread | 1.60 | 1.70 | old |" in lines[1]
    assert "only in old.json: m q8_0 kv f32 depth 512 B 1" in text
    assert "only in new.json: m q8_0 kv f32 depth 0 B 4" in text
    assert "note" not in text  # the same CPU and file


def test_verdict_slower_and_the_runs_differences_are_said():
    assert verdict(row(0, 10, 9, 11, None), row(0, 13, 12, 14, None)) == "slower"
    old = run("a", [row(0, 10, 9, 11, None)])
    new = run("b", [row(0, 10, 9, 11, None)], cpu="cpu B", sha="cd" * 32)
    text = table(old, new)
    assert "| - | - | - |" in text  # no speed of light on either side
    assert "note: the runs differ in CPU: cpu A / cpu B" in text
    assert "note: the runs differ in model file" in text


def test_a_file_that_is_not_a_run_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    for content, message in (("{", "not JSON"), ('{"rows": 3}', "no rows"),
                             ('{"rows": [{"model": "m"}]}', "a row lacks")):  # fmt: skip
        bad.write_text(content)
        with pytest.raises(CompareError, match=message):
            load_run(bad)
    with pytest.raises(CompareError, match="cannot read"):
        load_run(tmp_path / "missing.json")


def test_the_command_compares_two_files(tmp_path, capsys):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps({"threads": 2, "rows": [row(0, 10.0, 9.0, 11.0, 1.4)]}))
    new.write_text(json.dumps({"threads": 2, "rows": [row(0, 5.0, 4.0, 6.0, 1.1)]}))
    assert main(["bench", "--compare", str(old), str(new)]) == 0
    assert "| 0.500 | faster |" in capsys.readouterr().out
    new.write_text("[]")
    assert main(["bench", "--compare", str(old), str(new)]) == 2
    err = capsys.readouterr().err
    assert "not the output of `llama-np bench --json`" in err and len(err.splitlines()) == 1
