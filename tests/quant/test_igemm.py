"""Products of several vectors on the compiled backend (CompiledMatrix.matmat_into): up to
FEW vectors decode's loop with each block decoded once for them all (quant.compiled.fewdot;
the float formats: 4 rows' weights loaded once for them all), more the panels of
quant.compiled.igemm (integer codes times x's integers, or float32 for f16 and bf16) or,
for f32, its tiles of 8 rows x 16 or 32 vectors (groups of 16 full, partial, odd).
Against the NumPy references (quant.intdot for x rounded to integers, the dequantized
matrix for float x), on odd shapes: rows around the panels of 16 and the tiles of 4 and 8
vectors, 1 to 10 blocks, columns that are not multiples of 16 for the float formats."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from quant import intdot
from quant.compiled import FORMATS, igemm, simd
from quant.compiled.weights import FEW, SPLIT, f32_stack_into
from tests.quant.test_intdot import BITS, FMTS, exact_case, random_weight, shape_for

SHAPES = [(1, 1), (5, 3), (17, 1), (33, 10), (70, 3)]  # (rows, blocks)
# each count up to FEW, two passes of decode's loop (FEW + 1, SPLIT), the panels' tiles of 4
# full and partial (SPLIT + 1, 17)
VECTORS = [1, 2, 3, FEW, FEW + 1, SPLIT, SPLIT + 1, 17]
FLOATS = ("f32", "f16", "bf16")


def batch(w, x: np.ndarray, dot: str, add: np.ndarray | None = None) -> np.ndarray:
    """x (B, cols) @ W.T by matmat_into, added to `add` when given."""
    out = np.empty((x.shape[0], w.shape[0]), np.float32) if add is None else add.copy()
    w.matmat_into(np.ascontiguousarray(x, dtype=np.float32), out, add is not None, dot)
    return out


def reference(fmt: str, w, x: np.ndarray, dot: str) -> np.ndarray:
    """Each vector alone by the NumPy reference of the integer products."""
    return np.stack([intdot.matvec(fmt, w.to_blocks(), v, BITS[dot]) for v in x])


@pytest.mark.parametrize("dot", BITS)
@pytest.mark.parametrize("b", VECTORS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_a_batch_equals_the_reference_exactly(fmt, shape, b, dot):
    """Products that no float rounding touches (test_intdot.exact_case's matrices and x):
    every vector of the batch equals the reference bit for bit, by either path."""
    rng = np.random.default_rng(b)
    shape = shape_for(fmt, shape)
    w, x0 = exact_case(fmt, shape, rng)
    x = np.stack([rng.permutation(x0) for _ in range(b)])  # the +-127 / 8 moved: still exact
    x[:, :: 32] = x0[:: 32]  # fmt: skip
    np.testing.assert_array_equal(batch(w, x, dot), reference(fmt, w, x, dot))


@pytest.mark.parametrize("dot", BITS)
@pytest.mark.parametrize("fmt", FMTS)
def test_up_to_split_vectors_each_get_their_bits_alone(fmt, dot):
    """Up to SPLIT vectors (decode's loop, in passes of at most FEW): each vector's products
    on random weights are the ones it gets as a batch of one, bit for bit."""
    rng = np.random.default_rng(11)
    w = random_weight(FORMATS[fmt], shape_for(fmt, (37, 3)), rng)
    x = rng.standard_normal((SPLIT, w.shape[1])).astype(np.float32)
    for b in (FEW + 1, SPLIT):
        got = batch(w, x[:b], dot)
        for v in range(b):
            np.testing.assert_array_equal(got[v], batch(w, x[v : v + 1], dot)[0])


@pytest.mark.parametrize("dot", BITS)
@pytest.mark.parametrize("b", [2, 5, 9])
@pytest.mark.parametrize("fmt", FMTS)
def test_random_batches_within_float_rounding_of_the_reference(fmt, b, dot):
    """Random matrices and x, the result added to what `out` held: within float32 rounding
    of the reference (the panels sum sub-blocks of 16 in another order than decode)."""
    rng = np.random.default_rng(7)
    w = random_weight(FORMATS[fmt], shape_for(fmt, (37, 4)), rng)
    x = rng.standard_normal((b, w.shape[1])).astype(np.float32)
    start = rng.standard_normal((b, w.shape[0])).astype(np.float32)
    want = start + reference(fmt, w, x, dot)
    got = batch(w, x, dot, add=start)
    assert np.abs(got - want).max() <= 2e-6 * np.abs(want).max() * np.sqrt(w.shape[1])


@pytest.mark.parametrize("b", [1, 2, FEW, 5, 8, 9, 17, 33, 48])
@pytest.mark.parametrize("cols", [7, 16, 40, 100, 1037, 2071])
@pytest.mark.parametrize("rows", [1, 15, 17, 50])
@pytest.mark.parametrize("fmt", FLOATS)
def test_float_batches_equal_the_dequantized_product(fmt, rows, cols, b):
    """f32, f16, bf16 at any width (masked ends of rows and panels; rows of fewer and more
    than fewdot.SHORT_ROW bytes, one at a time and in groups of 4): x @ W.T in float64,
    within float32 rounding; added in place too."""
    rng = np.random.default_rng(rows * cols + b)
    w = FORMATS[fmt].from_float(rng.standard_normal((rows, cols)).astype(np.float32))
    x = rng.standard_normal((b, cols)).astype(np.float32)
    want = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    tol = 1e-6 * np.sqrt(cols) * max(1.0, np.abs(want).max())
    assert np.abs(batch(w, x, "f32") - want).max() <= tol
    start = rng.standard_normal((b, rows)).astype(np.float32)
    assert np.abs(batch(w, x, "f32", add=start) - (start + want)).max() <= tol


@pytest.mark.parametrize("b", [1, 5, 8, 9, 16, 17, 33])
@pytest.mark.parametrize("cols", [1, 7, 16, 17, 100])
def test_x_transposed_into_groups_of_lanes(cols, b):
    """igemm.transposed (blocks of 16 columns transposed in registers, masked at the ends):
    vector L g + l's column k at xt[g, k, l], zeros past the last vector; L = 8 lanes up
    to 8 vectors, 16 from 9."""
    x = np.random.default_rng(b * cols).standard_normal((b, cols)).astype(np.float32)
    lanes = 8 if b <= 8 else 16
    groups = -(-b // lanes)
    padded = np.zeros((groups * lanes, cols), np.float32)
    padded[:b] = x
    want = padded.reshape(groups, lanes, cols).transpose(0, 2, 1)
    np.testing.assert_array_equal(igemm.transposed(x), want)
    strided = np.zeros((b, 2 * cols), np.float32)
    strided[:, ::2] = x  # a view that is not C-contiguous gives the same
    np.testing.assert_array_equal(igemm.transposed(strided[:, ::2]), want)


@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("b", [FEW, 5, 9, 33])
def test_a_stack_of_f32_parts_shares_one_transposed_x(b, add):
    """f32_stack_into: parts of 5, 17 and 3 rows of 40 columns into their columns of out,
    x transposed once, against the product with the stacked matrix; at most FEW vectors,
    or a part in another format, it does nothing and says so."""
    rng = np.random.default_rng(b)
    ws = [rng.standard_normal((r, 40)).astype(np.float32) for r in (5, 17, 3)]
    parts = [FORMATS["f32"].from_float(w) for w in ws]
    x = rng.standard_normal((b, 40)).astype(np.float32)
    start = rng.standard_normal((b, 25)).astype(np.float32)
    out = start.copy()
    want = x.astype(np.float64) @ np.concatenate(ws).astype(np.float64).T + (start if add else 0)
    if b <= FEW:
        assert not f32_stack_into(parts, x, out, add)
        np.testing.assert_array_equal(out, start)
        return
    assert f32_stack_into(parts, x, out, add)
    assert np.abs(out - want).max() <= 1e-5 * np.abs(want).max()
    mixed = [*parts[:2], FORMATS["f16"].from_float(ws[2])]
    assert not f32_stack_into(mixed, x, start.copy(), add)


@pytest.mark.parametrize("b", [2, 3, FEW])
@pytest.mark.parametrize("cols", [7, 16, 40, 100, 1037, 2071])
@pytest.mark.parametrize("rows", [1, 3, 4, 15, 17, 50])
@pytest.mark.parametrize("fmt", FLOATS)
def test_a_few_float_vectors_each_get_their_bits_alone(fmt, rows, cols, b):
    """Up to FEW vectors on a float format (fewdot.rows_float: short rows one at a time,
    long ones in groups of 4 in one register loop, the rows past the last group one by
    one): each vector's products are the ones it gets as a batch of one, bit for bit, at
    widths that are not multiples of 16 or 32, whatever the other vectors hold (one of
    them inf)."""
    rng = np.random.default_rng(rows * cols + b)
    w = FORMATS[fmt].from_float(rng.standard_normal((rows, cols)).astype(np.float32))
    x = rng.standard_normal((b, cols)).astype(np.float32)
    x[-1, -1] = np.inf
    alone = np.concatenate([batch(w, x[k : k + 1], "f32") for k in range(b)])
    np.testing.assert_array_equal(batch(w, x, "f32"), alone)


@pytest.mark.parametrize("dot", BITS)
@pytest.mark.parametrize("fmt", FMTS)
def test_a_vector_with_nan_gives_nan_only_in_its_row(fmt, dot):
    """A NaN in one vector of a panel product makes its products NaN (its block's scale is
    NaN, intdot.quantize_x) and leaves the other vectors' alone."""
    rng = np.random.default_rng(3)
    w = random_weight(FORMATS[fmt], shape_for(fmt, (20, 2)), rng)
    x = rng.standard_normal((FEW + 3, w.shape[1])).astype(np.float32)
    x[1, 5] = np.nan
    got = batch(w, x, dot)
    assert np.isnan(got[1]).all()
    assert np.isfinite(np.delete(got, 1, axis=0)).all()


PATH_SCRIPT = textwrap.dedent(
    """
    import sys
    from quant.compiled import simd
    from tests.quant import test_igemm as t

    assert simd.DOT_INSTRUCTION == sys.argv[1], simd.DOT_INSTRUCTION
    for dot in t.BITS:
        for fmt in t.FMTS:
            for shape in ((5, 3), (33, 10)):
                for b in (3, 9):  # fewdot's kernels, igemm's panels
                    t.test_a_batch_equals_the_reference_exactly(fmt, shape, b, dot)
    for fmt in t.FLOATS:  # f32's tiles a group of vectors at a time without AVX-512
        for b in (3, 5, 9, 33):  # 5: f32's 8-lane tiles
            t.test_float_batches_equal_the_dequantized_product(fmt, 17, 40, b)
    """
)


@pytest.mark.slow  # compiles the batch kernels for another CPU: ~40 s each, once a cache
@pytest.mark.parametrize("path", ["vpmaddubsw", "generic"])
def test_batches_on_other_instruction_paths(path):
    """The few-vector and panel products compiled for an AVX2 CPU (q8_0's signed codes,
    vpmaddubsw) and for a generic x86-64 equal the reference exactly, as here; the float
    formats' within float32 rounding. Their machine code is kept in a cache of that CPU's
    own beside the kernel cache (same key: the kernels' sources and numba's version), so
    that only the first run after a change compiles it."""
    from quant.compiled.jit import cache_folder
    from tests.quant.test_intdot import PATHS

    env, runnable = PATHS[path]
    if not runnable:
        pytest.fail(f"this machine cannot run the {path} path")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")} | env
    env["NUMBA_CACHE_DIR"] = str(cache_folder() / "cpus" / path)
    run = subprocess.run([sys.executable, "-c", PATH_SCRIPT, path], env=env,
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]


def test_panels_and_decode_agree_on_which_formats_they_take():
    """Every quantized format has its panel decoder (igemm) beside its decode kernel."""
    for fmt in FMTS:
        w = FORMATS[fmt]
        assert w.panels in (igemm.panels_q8_0, igemm.panels_nibbles, igemm.panels_k), fmt
    assert simd.DOT_INSTRUCTION in ("vpdpbusd", "vpmaddubsw", "generic")
