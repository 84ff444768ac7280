"""scripts/results.py, the one command behind every published figure: docs/results.md and
the README's results are renders of docs/results.json (so no figure drifts from its data),
each section stamped; and validate_sol's verdict for each row."""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
results = importlib.import_module("results")
validate_sol = importlib.import_module("validate_sol")
SAVED = json.loads((ROOT / "docs/results.json").read_text())


def test_docs_results_md_is_the_render_of_its_data(tmp_path):
    assert results.render(SAVED, tmp_path) == (ROOT / "docs/results.md").read_text()
    for plot in ("validation", "batching", "published"):
        if (ROOT / f"docs/{plot}.png").exists():
            assert (tmp_path / f"{plot}.png").read_bytes()[:4] == b"\x89PNG"


def test_the_readme_shows_the_data_of_docs_results_json():
    readme = (ROOT / "README.md").read_text()
    assert results.replace_block(readme, "headline", results.headline(SAVED)) == readme
    assert results.replace_block(readme, "results", results.readme_block(SAVED)) == readme


def test_every_section_names_its_cpu_date_commit_and_command():
    assert set(SAVED) <= set(results.SECTIONS)
    for section in SAVED.values():
        stamp = section["stamp"]
        assert stamp["cpu"] and stamp["commit"] and stamp["date"][:2] == "20"
        assert stamp["command"].startswith("scripts/results.sh")


def test_cpu_names_the_model_and_the_simd():
    text = results.cpu()
    assert "cores" in text and ("AVX" in text or "no AVX2" in text)


def row(**change):
    rows = SAVED["validation"]["data"]["rows"]
    return dataclasses.replace(validate_sol.Row(**rows[0]), **change)


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


@pytest.mark.parametrize(
    ("batch", "ridge", "ratio", "verdict"),
    [(2, 9.0, 1.2, "below B* (memory-bound): holds"), (2, 9.0, 1.4, "below B* (memory-bound): off"),
     (16, 9.0, 1.4, "near B*"), (64, 9.0, 1.4, "far above B* (memory-bound): holds"),
     (64, 9.0, 1.6, "far above B* (memory-bound): off")],
)  # fmt: skip
def test_each_batch_row_gets_its_side_of_the_ridge(batch, ridge, ratio, verdict):
    r = row(batch=batch, ridge_batch=ridge, measured_over_sol=ratio, bound="memory")
    assert validate_sol.knee(r).startswith(verdict)
