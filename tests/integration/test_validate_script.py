"""scripts/validate_sol.py: the verdict each row gets, and --render, which redraws the
published table and plot from the saved rows without measuring."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("validate_sol", ROOT / "scripts/validate_sol.py")
validate_sol = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(validate_sol)
SAVED = json.loads((ROOT / "docs/validation.json").read_text())


def row(**change):
    base = validate_sol.Row(**SAVED["rows"][0])
    return dataclasses.replace(base, **change)


NUMBA, NUMPY = "numba omp, 2 threads", "numpy, 2 threads"
CASES = [  # kernels, weights, depth, window, measured / predicted, verdict
    (NUMBA, "f32", 0, None, 1.1, "holds"),
    (NUMPY, "q8_0", 0, None, 6.0, "NumPy-bound"),
    (NUMBA, "q4_1/q8_0", 0, None, 2.3, "compute-bound"),
    (NUMBA, "q5_0+q8_0+q6_k+q4_k/q8_0", 0, None, 2.5, "compute-bound"),
    (NUMBA, "f32", 4096, None, 1.5, "attention"),
    (NUMBA, "f32", 4096, 1024, 1.9, "attention"),
    (NUMBA, "f32", 4096, 256, 1.9, "memory-bound"),
    (NUMBA, "q8_0", 0, None, 1.6, "memory-bound"),
]


@pytest.mark.parametrize(("kernels", "weights", "depth", "window", "ratio", "verdict"), CASES)
def test_each_row_gets_the_reason_that_fits_it(kernels, weights, depth, window, ratio, verdict):
    r = row(kernels=kernels, weights=weights, depth=depth, window=window, measured_over_sol=ratio)
    assert validate_sol.verdict(r).startswith(verdict)


def test_render_redraws_table_and_plot_from_the_saved_rows(tmp_path):
    shutil.copy(ROOT / "docs/validation.json", tmp_path / "v.json")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts/validate_sol.py"), "--out", str(tmp_path / "v"),
         "--render"],
        check=True, capture_output=True, cwd=ROOT,
    )  # fmt: skip
    md = (tmp_path / "v.md").read_text()
    n = len(SAVED["rows"])
    verdict_lines = [line for line in md.splitlines() if line.count("|") == 9]
    assert len(verdict_lines) == n + 2  # header, rule, one per row
    assert (tmp_path / "v.png").stat().st_size > 10_000
    assert md == (ROOT / "docs/validation.md").read_text()  # the published file is this render


def test_batch_render_redraws_the_published_batching_table(tmp_path):
    shutil.copy(ROOT / "docs/batching.json", tmp_path / "b.json")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts/validate_sol.py"), "--out", str(tmp_path / "b"),
         "--render"],
        check=True, capture_output=True, cwd=ROOT,
    )  # fmt: skip
    md = (tmp_path / "b.md").read_text()
    assert md == (ROOT / "docs/batching.md").read_text()
    assert (tmp_path / "b.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("batch", "ridge", "ratio", "verdict"),
    [(2, 9.0, 1.2, "below B* (memory-bound): holds"), (2, 9.0, 1.4, "below B* (memory-bound): off"),
     (16, 9.0, 1.4, "near B*"), (64, 9.0, 1.4, "far above B* (memory-bound): holds"),
     (64, 9.0, 1.6, "far above B* (memory-bound): off")],
)  # fmt: skip
def test_each_batch_row_gets_its_side_of_the_ridge(batch, ridge, ratio, verdict):
    r = row(batch=batch, batched=True, ridge_batch=ridge, measured_over_sol=ratio, bound="memory")
    assert validate_sol.knee(r).startswith(verdict)
