"""q8_0, q4_0, q4_1, q5_0, q5_1 against the gguf package's NumPy reference (quantization and
values, bit for bit), the K-quants' values on random blocks, and the error bounds."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from quant import FORMATS, QuantError

BLOCK = 32

GGML = {
    "q8_0": GGMLQuantizationType.Q8_0,
    "q4_0": GGMLQuantizationType.Q4_0,
    "q4_1": GGMLQuantizationType.Q4_1,
    "q5_0": GGMLQuantizationType.Q5_0,
    "q5_1": GGMLQuantizationType.Q5_1,
}
F16_REL = 2.0**-11  # float16 rounding, relative
F16_SUB = 2.0**-25  # float16 rounding, absolute, in the subnormal range


def sample(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Gaussian rows with very different scales, a zero block, and a block of outliers."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)) * np.exp(rng.uniform(-6, 3, (rows, 1)))
    w[0, :BLOCK] = 0.0
    if rows > 1:
        w[1, BLOCK - 1] = 40.0
    return w.astype(np.float32)


def check_bit_exact(fmt: str, w: np.ndarray) -> None:
    ours = FORMATS[fmt].from_float(w)
    with np.errstate(all="ignore"):  # the reference warns on subnormal blocks (1 / d overflows)
        ref = quantize(w, GGML[fmt])
    assert np.array_equal(ours.to_blocks(), ref), "codes or scales differ from gguf.quants"
    ref_values = dequantize(ref, GGML[fmt])
    assert np.array_equal(ours.dequantize(), ref_values)
    assert np.array_equal(FORMATS[fmt].from_blocks(w.shape, ref).dequantize(), ref_values)


@pytest.mark.parametrize("fmt", sorted(GGML))
@pytest.mark.parametrize("shape", [(1, 32), (7, 64), (300, 576), (33, 1536)])
def test_bit_exact_with_gguf(fmt, shape):
    check_bit_exact(fmt, sample(*shape))


finite32 = st.floats(-1e4, 1e4, width=32, allow_subnormal=True)
special = st.sampled_from([0.0, -0.0, 1e-30, -1e-30, 1e-8, 3e-5, 1000.0, -65000.0])


@settings(max_examples=150, deadline=None)
@given(
    fmt=st.sampled_from(sorted(GGML)),
    w=st.integers(1, 4).flatmap(
        lambda r: st.integers(1, 3).flatmap(
            lambda b: arrays(np.float32, (r, b * BLOCK), elements=finite32 | special)
        )
    ),
)
def test_bit_exact_and_bounded_on_arbitrary_values(fmt, w):
    check_bit_exact(fmt, w)
    err = np.abs(FORMATS[fmt].from_float(w).dequantize() - w)
    assert (err <= error_bound(fmt, w)).all()


@settings(max_examples=50, deadline=None)
@given(
    fmt=st.sampled_from(sorted(GGML)),
    scale=st.sampled_from([1e-30, 1e-12, 1e-6, 1.0, 1e3]),
    seed=st.integers(0, 1000),
)
def test_round_trip_error_bounds_at_every_magnitude(fmt, scale, seed):
    w = (np.random.default_rng(seed).standard_normal((3, 96)) * scale).astype(np.float32)
    err = np.abs(FORMATS[fmt].from_float(w).dequantize() - w)
    assert (err <= error_bound(fmt, w)).all()


def error_bound(fmt: str, w: np.ndarray) -> np.ndarray:
    """Largest |x - dequantize(quantize(x))| per element, from the format's definition:
    rounding to the code grid, clipping (q4_0), and the float16 rounding of d and m."""
    b = w.astype(np.float64).reshape(w.shape[0], -1, BLOCK)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    if fmt == "q8_0":
        d = amax / 127
        bound = d / 2 + 127 * (d * F16_REL + F16_SUB)
    elif fmt in ("q4_0", "q5_0"):
        levels = 8 if fmt == "q4_0" else 16
        d = amax / levels
        bound = d + levels * (d * F16_REL + F16_SUB)  # the clipped end is off by up to d
    else:
        levels = 15 if fmt == "q4_1" else 31
        lo, hi = b.min(axis=-1, keepdims=True), b.max(axis=-1, keepdims=True)
        d = (hi - lo) / levels
        bound = d / 2 + levels * (d * F16_REL + F16_SUB) + np.abs(lo) * F16_REL + F16_SUB
    return np.broadcast_to(bound * (1 + 1e-5) + 1e-37, b.shape).reshape(w.shape)


@pytest.mark.parametrize("fmt", sorted(GGML))
@pytest.mark.parametrize(
    ("value", "message"),
    [(np.nan, "NaN or infinity"), (np.inf, "NaN or infinity"), (3e38, "too large")],
)
def test_unquantizable_values_are_clear_errors(fmt, value, message):
    w = sample(4, 64)
    w[2, 5] = value
    with pytest.raises(QuantError, match=message):
        FORMATS[fmt].from_float(w)


@pytest.mark.parametrize("fmt", sorted(GGML))
def test_input_dimension_must_be_whole_blocks(fmt):
    with pytest.raises(QuantError, match="multiple of 32"):
        FORMATS[fmt].from_float(np.ones((4, 48), np.float32))


@pytest.mark.parametrize(("fmt", "bits"), [("q8_0", 8.5), ("q4_0", 4.5), ("q4_1", 5.0)])
def test_bits_per_weight_at_rest_and_in_memory(fmt, bits):
    w = FORMATS[fmt].from_float(sample(64, 256))
    at_rest = sum(a.nbytes for a in w.export().values()) * 8 / w.shape[0] / w.shape[1]
    assert at_rest == bits == w.bits_per_weight
    # in memory the float16 scales (and mins) are widened to float32: 16 more bits a block
    extra = 16 * (2 if fmt == "q4_1" else 1) / BLOCK
    assert w.nbytes * 8 / 64 / 256 == bits + extra
