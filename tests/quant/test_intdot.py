"""The integer-activation kernels (quant.compiled.intdot), x rounded to int8 or to int16,
against the NumPy reference of the same integer arithmetic (quant.intdot): the rounding of
x bit for bit, the products exactly where no float rounding intervenes, and the
float-activation kernels within the bound x's rounding allows. On both instruction paths
(VNNI and AVX2), odd shapes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from quant import intdot
from quant.backends import numba_backend
from quant.compiled import FORMATS, simd
from quant.compiled import intdot as kernels
from quant.compiled.ops import NORM, SWIGLU, prepare
from quant.ggml import LAYOUTS, assemble, random_blocks

FMTS = intdot.INT8_FORMATS
BITS = {"int8": 8, "int16": 16}  # the integer dots and the bits of x's integers
# rows around the groups of 4 and the chunks of 16; 1 to 10 blocks (of 32 or of 256): 8, a
# group's scales a whole number of 16 lanes, the others not
SHAPES = [(1, 1), (3, 3), (4, 1), (5, 10), (6, 8), (17, 3), (33, 10), (70, 5)]


def shape_for(fmt: str, shape: tuple[int, int]) -> tuple[int, int]:
    """SHAPES' (rows, blocks) as (rows, columns) for the format's block size."""
    return shape[0], shape[1] * LAYOUTS[fmt].weights


def random_weight(cls, shape: tuple[int, int], rng: np.random.Generator):
    """A random matrix of the format: GGUF blocks with random codes, or a quantized one."""
    if not LAYOUTS[cls.fmt].quantizable:
        return cls.from_blocks(shape, random_blocks(cls.fmt, *shape, rng))
    return cls.from_float(rng.standard_normal(shape).astype(np.float32))


def exact_ggml(fmt: str, shape: tuple[int, int], rng: np.random.Generator):
    """exact_case's matrix for a GGUF format: random blocks with a power-of-two d (and
    dmin) per row, and q5_1's mins small multiples of d."""
    rows, cols = shape
    lay = LAYOUTS[fmt]
    raw = random_blocks(fmt, rows, cols, rng).reshape(rows, -1, lay.nbytes)
    d = 2.0 ** -rng.integers(8, 14, (rows, 1))
    values = {o: np.repeat(d, raw.shape[1], axis=1) for o in lay.halves}
    if fmt == "q5_1":
        values[2] = d * rng.integers(-9, 3, (rows, raw.shape[1]))
    for o, v in values.items():
        raw[:, :, o : o + 2] = v.astype(np.float16).view(np.uint8).reshape(rows, -1, 2)
    return FORMATS[fmt].from_blocks(shape, raw.reshape(rows, -1))


def exact_case(fmt: str, shape: tuple[int, int], rng: np.random.Generator):
    """A matrix and an x whose product no float rounding touches: power-of-two scales
    (one per row), small-integer mins, x = integers / 8 with +-127 / 8 in every block
    (so x's scale is 1/8 and x rounds to itself). Every partial sum is an integer
    multiple of one power of two below 2^24: exact in float32 in any order."""
    rows, cols = shape
    nb = cols // 32
    cls = FORMATS[fmt]
    if fmt not in ("q8_0", "q4_0", "q4_1"):  # small x: K sub-scales reach 127, codes 63
        x = rng.integers(-15, 16, cols).astype(np.float32)
        x[::32] = rng.choice([-127.0, 127.0], nb)
        return exact_ggml(fmt, shape, rng), x / np.float32(8)
    code_bytes = 32 if fmt == "q8_0" else 16
    codes = rng.integers(0, 256, (rows, nb * code_bytes), dtype=np.uint8)
    scales = np.repeat(2.0 ** -rng.integers(8, 14, (rows, 1)), nb, axis=1).astype(np.float16)
    mins = None
    if fmt == "q4_1":
        mins = (scales.astype(np.float32) * rng.integers(-9, 3, (rows, nb))).astype(np.float16)
    w = cls((rows, cols), assemble([scales] + ([] if mins is None else [mins]), codes))
    x = rng.integers(-127, 128, cols).astype(np.float32)
    x[::32] = rng.choice([-127.0, 127.0], nb)
    return w, x / np.float32(8)


@pytest.mark.parametrize("dot", BITS)
def test_x_rounds_as_the_reference(dot):
    """quantize_x bit for bit: ties, zero blocks, tiny and huge blocks, odd lengths; int16
    as its two int8 halves, the high one within -127..127, the low one -64..63."""
    rng = np.random.default_rng(0)
    for nb in (1, 3, 17, 80):
        x = (rng.standard_normal(32 * nb) * 10.0 ** rng.integers(-20, 20, 32 * nb)).astype(
            np.float32
        )
        x[:32] = np.arange(32) - 15.5  # ties at .5 once scaled? 127 / 15.5 is not exact
        if nb > 1:
            x[32:64] = 0
        if nb > 2:
            x[64:96] = np.float32(127) * (np.arange(32) % 5 - 2) / 2  # exact ties: 63.5 ...
        n, wide = 32 * nb, dot == "int16"
        xq, xd, xs = np.empty(2 * n, np.int8), np.empty(nb, np.float32), np.empty(nb, np.int32)
        kernels.quantize_x(x, xq, xd, xs, n if wide else 0)
        rq, rd, rs = intdot.quantize_x(x, BITS[dot])
        high, low = xq[:n].astype(np.int32), xq[n:].astype(np.int32)
        got = 128 * high + low if wide else high
        assert np.array_equal(got, rq.ravel()) and np.array_equal(xd, rd)
        assert np.array_equal(xs, rs)
        if wide:
            assert np.abs(high).max() <= 127 and low.min() >= -64 and low.max() <= 63
            assert np.abs(rq).max() == 16256  # the largest |x| of a block, exactly


@pytest.mark.parametrize("dot", BITS)
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_integer_kernel_equals_the_reference_exactly(fmt, shape, dot):
    """x's scale is 1/8 (int8) or 1/1024 (int16): x rounds to itself either way."""
    shape = shape_for(fmt, shape)
    rng = np.random.default_rng(shape[0] * shape[1])
    for _ in range(3):
        w, x = exact_case(fmt, shape, rng)
        ref = intdot.matvec(fmt, w.to_blocks(), x, BITS[dot])
        got = w.matvec(x, dot=dot)
        assert np.array_equal(got, ref), np.abs(got - ref).max()
        base = rng.integers(-5, 5, shape[0]).astype(np.float32)
        out = base.copy()
        w.matvec_into(x, out, add=True, dot=dot)  # the residual epilogue
        assert np.array_equal(out, base + ref)


@pytest.mark.parametrize("fmt", FMTS)
def test_int16_kernel_equals_the_reference_on_rounded_x(fmt):
    """Random x that int16 really rounds (every code of the low byte taken): the kernel's
    integer sums are the reference's, so within float32 reordering of the block sums."""
    shape = shape_for(fmt, (37, 7))
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape[1]) * np.exp(rng.standard_normal(shape[1]))).astype(np.float32)
    w = random_weight(FORMATS[fmt], shape, rng)
    ref, got = intdot.matvec(fmt, w.to_blocks(), x, 16), w.matvec(x, dot="int16")
    scale = np.abs(w.dequantize()) @ np.abs(x)
    assert (np.abs(got - ref) <= 1e-5 * scale).all()
    assert not np.array_equal(got, w.matvec(x, dot="int8"))


@pytest.mark.parametrize("dot", BITS)
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_integer_kernel_within_x_rounding_of_the_float_kernel(fmt, shape, dot):
    """|y_int - y_f32| <= sum over blocks of max|x_b| / (2 top) * sum |w| over the block: x
    rounded moves each value by at most half its block's step (max|x_b| / top, top 127 for
    int8, 16256 for int16), plus float32 rounding of both sums."""
    shape = shape_for(fmt, shape)
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape[1]) * np.exp(rng.standard_normal(shape[1]))).astype(np.float32)
    f = random_weight(FORMATS[fmt], shape, rng)
    y_f, y_i = f.matvec(x), f.matvec(x, dot=dot)
    W = np.abs(f.dequantize().astype(np.float64)).reshape(shape[0], -1, 32)
    top = float(intdot.TOPS[BITS[dot]])
    step = np.abs(x.astype(np.float64)).reshape(-1, 32).max(axis=1) / (2 * top)
    bound = (W.sum(axis=2) * step).sum(axis=1)
    slop = 1e-5 * (W.reshape(shape[0], -1) @ np.abs(x.astype(np.float64)))
    assert (np.abs(y_i - y_f) <= bound + slop).all()
    assert not np.array_equal(y_i, y_f)  # x really was rounded


@pytest.mark.parametrize("dot", BITS)
@pytest.mark.parametrize("fmt", FMTS)
def test_prologues_are_the_float_kernels(fmt, dot):
    """RMSNorm and SwiGLU before the product run the same code as the float kernels'."""
    rng = np.random.default_rng(3)
    cols = shape_for(fmt, (9, 3))[1]
    w = random_weight(FORMATS[fmt], (9, cols), rng)
    norm, eps = rng.standard_normal(cols).astype(np.float32), np.float32(1e-5)
    for mode, x in ((NORM, rng.standard_normal(cols)), (SWIGLU, rng.standard_normal(2 * cols))):
        x = x.astype(np.float32)
        fused, plain = np.empty(9, np.float32), np.empty(9, np.float32)
        w.matvec_into(x, fused, norm, eps, mode, dot=dot)
        w.matvec_into(prepare(x, norm, eps, mode), plain, dot=dot)
        assert np.array_equal(fused, plain)


def test_every_quantized_format_has_an_integer_kernel():
    """The integer backends are the compiled one with another `dot`; every format the
    compiled backend quantizes with has an integer kernel (the others are floats)."""
    for dot in BITS:
        b = numba_backend(dot)
        assert b.dot == dot and b.formats is numba_backend("f32").formats is FORMATS
    assert set(FMTS) == {f for f in FORMATS if f not in ("f32", "f16", "bf16")}


PATH_SCRIPT = textwrap.dedent(
    """
    import sys
    import numba
    import numpy as np
    from quant.compiled import matvec, simd
    from quant.compiled.weights import FORMATS
    from tests.quant import test_intdot as t

    path, run = sys.argv[1], sys.argv[2] == "run"
    assert simd.DOT_INSTRUCTION == path, simd.DOT_INSTRUCTION
    if run:
        for dot in t.BITS:
            t.test_x_rounds_as_the_reference(dot)
            for fmt in t.FMTS:
                for shape in t.SHAPES:
                    t.test_integer_kernel_equals_the_reference_exactly(fmt, shape, dot)
    x, out = np.ones(256, np.float32), np.empty(4, np.float32)
    for fmt in ("q4_1", "q4_k"):
        w = t.random_weight(FORMATS[fmt], (4, 256), np.random.default_rng(0))
        prepare, rows = w.ivec
        args = (prepare, rows, w.vec_operands(True), x, x, np.float32(0), 0, False, out, True)
        sig = tuple(numba.typeof(a) for a in args)
        matvec.matvec.compile(sig)
        print(matvec.matvec.inspect_asm(sig))
    """
)
PATHS = {  # instruction: environment, whether this test machine can run it
    "vpdpbusd": ({"NUMBA_CPU_NAME": "icelake-server",
                  "NUMBA_CPU_FEATURES": "+avx512f,+avx512bw,+avx512vnni"}, simd.VNNI),
    "vpmaddubsw": ({"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx2,+fma,+f16c"},
                   simd.AVX2),
    "generic": ({"NUMBA_CPU_NAME": "x86-64"}, True),
}  # fmt: skip


@pytest.mark.slow  # compiles the integer kernels anew for each CPU: ~15 s each
@pytest.mark.parametrize("path", PATHS)
def test_each_instruction_path(path, tmp_path):
    """Each path compiled for a CPU that selects it: its machine code multiplies bytes with
    that instruction (no gathers), and where this machine can run the code, it equals the
    reference exactly. (A VNNI path cannot run on a CPU without VNNI, but it compiles.)"""
    env, runnable = PATHS[path]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")} | env
    env["NUMBA_CACHE_DIR"] = str(tmp_path)
    run = subprocess.run([sys.executable, "-c", PATH_SCRIPT, path, "run" if runnable else "asm"],
                         env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    asm = run.stdout
    used = {i for i in ("vpdpbusd", "vpmaddubsw") if i in asm}
    assert used == ({path} - {"generic"}), used
    assert "gather" not in asm


@pytest.mark.parametrize("dot", BITS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_block_of_x_with_nan_or_infinity_gives_nan(dot, bad):
    """A block of x holding NaN or infinity rounds to integers 0 with scale NaN, in the
    kernel as in the reference: its products are NaN, as in float, never the finite
    garbage that a NaN rounded to integers gives. The other blocks round as ever."""
    rng = np.random.default_rng(1)
    nb, n, wide = 16, 512, dot == "int16"  # two K-quant super-blocks
    x = rng.standard_normal(n).astype(np.float32)
    x[32 * 2 + 7] = bad
    xq, xd, xs = np.empty(2 * n, np.int8), np.empty(nb, np.float32), np.empty(nb, np.int32)
    kernels.quantize_x(x, xq, xd, xs, n if wide else 0)
    rq, rd, rs = intdot.quantize_x(x, BITS[dot])
    assert np.isnan(xd[2]) and np.isnan(rd[2]) and np.isfinite(np.delete(xd, 2)).all()
    assert not xq[64:96].any() and not rq[2].any() and xs[2] == rs[2] == 0
    assert np.array_equal(np.delete(xd, 2), np.delete(rd, 2)) and np.array_equal(xs, rs)
    for fmt in FMTS:
        w = numba_backend(dot).weight_class(fmt).random((9, n), rng)
        assert np.isnan(w.matvec(x, dot=dot)).all()
        assert np.isnan(intdot.matvec(fmt, w.to_blocks(), x, BITS[dot])).all()
