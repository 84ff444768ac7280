"""Every format's matvec and matmul equal dequantize-then-multiply within float rounding,
at odd row counts and across panel and chunk boundaries, on one thread and on two."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from quant import FORMATS, threads
from quant.backends import get_backend, numpy_backend
from quant.blocks import PANEL_WEIGHTS, plan_panels
from quant.floats import bf16_to_f32, f16_to_f32, f32_to_bf16
from tests.helpers import fits, make_weight

SHAPES = [
    (1, 32),
    (31, 64),
    (3, 256),
    (35, 768),
    (575, 576),  # two panels, the second a row shorter
    (577, 576),
    (1541, 1536),  # several panels and a ragged one
    (33, 4 * PANEL_WEIGHTS // 32),  # wide: panels of 16 rows, the last of 1
]


def reference(w, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """dequantize-then-multiply in float64, and a bound on float32 rounding: a few ulps of
    the sum of |w| |x|."""
    dq = w.dequantize().astype(np.float64)
    return x.astype(np.float64) @ dq.T, 1e-5 * (np.abs(x) @ np.abs(dq).T) + 1e-30


CASES = [(f, s) for f in sorted(FORMATS) for s in SHAPES if fits(f, s)]


@pytest.fixture
def n_threads(request):
    """The NumPy backend's products on this many threads (quant.threads), then one again."""
    threads.set_threads(request.param)
    yield request.param
    threads.set_threads(1)


# NumPy on one thread and with its panels split over two; the compiled kernels
@pytest.mark.parametrize(("kernels", "n_threads"), [("numpy", 1), ("numpy", 2), ("numba", 1)],
                         ids=["numpy-1", "numpy-2", "numba"], indirect=["n_threads"])  # fmt: skip
@pytest.mark.parametrize(("fmt", "shape"), CASES, ids=[f"{f}-{r}x{c}" for f, (r, c) in CASES])
def test_matvec_and_matmul_equal_dequantize_then_multiply(kernels, n_threads, fmt, shape):
    rng = np.random.default_rng(sum(shape))
    w = make_weight(get_backend(kernels).weight_class(fmt), shape, rng)
    x = rng.standard_normal((5, shape[1])).astype(np.float32)
    ref, tol = reference(w, x)
    y = w.matvec(x[0])
    assert y.dtype == np.float32 and y.shape == (shape[0],)
    assert (np.abs(y - ref[0]) <= tol[0]).all()
    y = w.matmul(x)
    assert y.dtype == np.float32 and y.shape == (5, shape[0])
    assert (np.abs(y - ref) <= tol).all()


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_rows_are_an_embedding_lookup(fmt):
    rows = 700
    w = make_weight(FORMATS[fmt], (rows, 256), np.random.default_rng(0))
    second = plan_panels(rows, 256)[1][0]
    ids = np.array([0, rows - 1, 3, 3, second])  # the first row of the second panel
    np.testing.assert_array_equal(w.rows(ids), w.dequantize()[ids])


def test_panels_split_evenly_for_two_threads():
    for rows, cols in [(576, 576), (192, 576), (1536, 576), (49152, 576), (258, 128)]:
        panels = plan_panels(rows, cols)
        assert panels[0][0] == 0 and panels[-1][1] == rows
        assert all(a[1] == b[0] for a, b in pairwise(panels))
        assert len(panels) >= 2
        assert max(t1 - t0 for t0, t1 in panels) * cols <= max(PANEL_WEIGHTS, 16 * cols) * 1.1


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_export_round_trip(kernels, fmt):
    cls = get_backend(kernels).weight_class(fmt)
    w = make_weight(cls, (41, 256), np.random.default_rng(1))
    back = cls.from_arrays(w.shape, w.export())
    np.testing.assert_array_equal(back.dequantize(), w.dequantize())
    assert back.nbytes == w.nbytes


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1"])
def test_checkpoints_saved_as_codes_and_scales_still_load(kernels, fmt):
    """Before the sweep that made GGUF blocks the one form at rest, llama-np saved these
    three formats as codes (GGML's byte order), float16 scales and mins."""
    cls = get_backend(kernels).weight_class(fmt)
    w = make_weight(cls, (6, 96), np.random.default_rng(2))
    b = w.to_blocks().reshape(6, 3, -1)
    halves = [b[:, :, o : o + 2].copy().view(np.float16)[..., 0] for o in w.layout.halves]
    old = {"codes": b[:, :, 2 * len(halves) :].reshape(6, -1), "scales": halves[0]}
    old |= {"mins": halves[1]} if len(halves) > 1 else {}
    np.testing.assert_array_equal(cls.from_arrays(w.shape, old).to_blocks(), w.to_blocks())


def test_convert_keeps_a_matrix_already_in_the_format():
    w = FORMATS["q4_1"].from_float(np.ones((4, 32), np.float32))
    assert numpy_backend().convert(w, "q4_1") is w
    assert numpy_backend().convert(w, "f32").fmt == "f32"


def test_f16_conversion_is_exact_for_every_finite_value():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ref = bits.view(np.float16).astype(np.float32)
    got = f16_to_f32(bits)
    finite = np.isfinite(ref)
    assert np.array_equal(got[finite].view(np.uint32), ref[finite].view(np.uint32))


def test_bf16_rounding_matches_torch():
    import torch

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(10000) * np.exp(rng.uniform(-20, 20, 10000))).astype(np.float32)
    x[:6] = [0.0, -0.0, 1.00390625, 1.01171875, 3.4e38, -1e-40]  # ties to even, huge, subnormal
    ours = f32_to_bf16(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, theirs)
    assert np.array_equal(bf16_to_f32(ours), torch.from_numpy(x).to(torch.bfloat16).float().numpy())
