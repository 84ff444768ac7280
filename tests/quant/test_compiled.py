"""The compiled backend against the NumPy reference: the same formats bit for bit, the same
products within float32 rounding, the same KV caches, and no float64 inside a kernel."""

from __future__ import annotations

import time
from typing import NamedTuple

import numba
import numpy as np
import pytest
from numba.core import compiler, ir, typed_passes
from numba.core.compiler_machinery import FunctionPass, PassManager, register_pass
from numba.core.registry import cpu_target

from quant import FORMATS as NUMPY
from quant.backends import numba_backend
from quant.compiled import FORMATS as COMPILED
from quant.compiled import (
    attention,
    dequant,
    experts,
    fewdot,
    fewlayers,
    igemm,
    intdot,
    layers,
    matmat,
    matvec,
    ops,
    recurrent,
    team,
    weights,
)
from quant.compiled.jit import OUT_OF_LINE, duplicate_specializations
from quant.kv import KV_FORMATS
from tests.helpers import CompilerCheck, fits, make_weight
from tests.llama_np.model.test_decode_layers import SAME_WITHIN

# Row counts around every edge of the layout: groups of 4 interleaved rows, chunks of 16
# rows per unit of parallel work; columns of one block, of several, and wide.
SHAPES = [(1, 32), (3, 64), (4, 64), (5, 96), (15, 64), (16, 128), (17, 64), (33, 576), (70, 4096),
          (1, 256), (6, 512), (17, 768)]  # fmt: skip
CASES = [(f, s) for f in sorted(COMPILED) for s in SHAPES if fits(f, s)]
IDS = [f"{f}-{r}x{c}" for f, (r, c) in CASES]


def pair(fmt: str, shape: tuple[int, int], seed: int = 0):
    """The same matrix in both backends' layouts."""
    a = make_weight(NUMPY[fmt], shape, np.random.default_rng(seed))
    return a, numba_backend().convert(a)


@pytest.mark.parametrize(("fmt", "shape"), CASES, ids=IDS)
def test_same_format_bit_for_bit(fmt, shape):
    """Both layouts hold the same codes: the same values, the same blocks at rest."""
    a, b = pair(fmt, shape)
    assert np.array_equal(a.dequantize(), b.dequantize())
    for k, v in a.export().items():
        assert np.array_equal(v, b.export()[k]), k
    if hasattr(a, "to_blocks"):
        assert np.array_equal(a.to_blocks(), b.to_blocks())
    ids = np.array([0, shape[0] - 1, shape[0] // 2])
    assert np.array_equal(a.rows(ids), b.rows(ids))
    assert b.nbytes == type(b).nbytes_for(shape)


@pytest.mark.parametrize("fmt", ["q4_k", "q5_k"])
def test_repacked_codes_hold_the_elements_in_order(fmt, monkeypatch):
    """q4_k's and q5_k's code bytes repacked at load (weights.repack_codes): byte j of half
    t holds element 128 t + j in its low nibble and 128 t + 64 + j in its high one (the
    elements' 4-bit codes as quant.ggml reads the stored runs), and the inverse gives the
    stored bytes back, across chunks of a few super-blocks."""
    monkeypatch.setattr(weights, "REPACK_CHUNK", 3)
    nbytes, start = NUMPY[fmt].layout.nbytes, weights.K_CODES[fmt]
    stored = np.random.default_rng(5).integers(0, 256, (7, nbytes), dtype=np.uint8)
    runs = stored[:, start : start + 128].reshape(7, 4, 32)
    elements = np.stack([runs & 15, runs >> 4], axis=2).reshape(7, 256)  # 64 v + 32 h + j
    repacked = stored.copy()
    weights.repack_codes(repacked, fmt, nbytes)
    halves = repacked[:, start : start + 128].reshape(7, 2, 64)
    assert np.array_equal(halves & 15, elements.reshape(7, 2, 2, 64)[:, :, 0])
    assert np.array_equal(halves >> 4, elements.reshape(7, 2, 2, 64)[:, :, 1])
    rest = np.ones(nbytes, bool)
    rest[start : start + 128] = False
    assert np.array_equal(repacked[:, rest], stored[:, rest])
    weights.repack_codes(repacked, fmt, nbytes, inverse=True)
    assert np.array_equal(repacked, stored)


def test_repacked_q6_k_top_bits_hold_the_elements_in_order(monkeypatch):
    """q6_k's 64 bytes of top 2 bits repacked at load: field v of byte k is element 64 v +
    k's (stored: field f of byte 32 h + j is element 128 h + 32 f + j's); the inverse
    gives the stored bytes back; nothing else moves."""
    monkeypatch.setattr(weights, "REPACK_CHUNK", 3)
    nbytes, start = NUMPY["q6_k"].layout.nbytes, weights.K_CODES["q6_k"]
    stored = np.random.default_rng(6).integers(0, 256, (7, nbytes), dtype=np.uint8)
    qh = stored[:, start : start + 64].reshape(7, 2, 32)
    fields = np.stack([(qh >> (2 * f)) & 3 for f in range(4)], axis=2)  # (7, h, f, j)
    elements = fields.reshape(7, 256)  # 128 h + 32 f + j
    repacked = stored.copy()
    weights.repack_codes(repacked, "q6_k", nbytes)
    moved = repacked[:, start : start + 64]
    for v in range(4):
        assert np.array_equal((moved >> (2 * v)) & 3, elements[:, 64 * v : 64 * v + 64])
    rest = np.ones(nbytes, bool)
    rest[start : start + 64] = False
    assert np.array_equal(repacked[:, rest], stored[:, rest])
    weights.repack_codes(repacked, "q6_k", nbytes, inverse=True)
    assert np.array_equal(repacked, stored)


@pytest.mark.parametrize(("fmt", "shape"), CASES, ids=IDS)
def test_products_equal_the_numpy_kernels_within_float32_rounding(fmt, shape):
    a, b = pair(fmt, shape, seed=1)
    x = np.random.default_rng(2).standard_normal((6, shape[1])).astype(np.float32)
    dq = np.abs(a.dequantize()).astype(np.float64)
    tol = 1e-5 * (np.abs(x) @ dq.T) + 1e-30  # a few ulps of the sum of |w| |x|
    ya, yb = a.matvec(x[0]), b.matvec(x[0])
    assert yb.dtype == np.float32 and yb.shape == (shape[0],)
    assert (np.abs(ya - yb) <= tol[0]).all()
    ya, yb = a.matmul(x), b.matmul(x)
    assert yb.dtype == np.float32 and yb.shape == (6, shape[0])
    assert (np.abs(ya - yb) <= tol).all()


BATCH_CASES = [(f, s) for f, s in CASES if s[0] in (5, 17, 33)]
BATCH_IDS = [f"{f}-{r}x{c}" for f, (r, c) in BATCH_CASES]


@pytest.mark.parametrize("batch", [2, 3, 5, 17, 64, 65])
@pytest.mark.parametrize(
    ("fmt", "shape"), BATCH_CASES, ids=[f"{f}-{r}x{c}" for f, (r, c) in BATCH_CASES]
)
def test_batch_products_equal_the_numpy_kernels(fmt, shape, batch):
    """The batch kernels (matmat.py: 4 rows x 4 vectors at a time, up to 64 vectors; 65
    runs panels through sgemm) on rows and vectors that are not multiples of 4."""
    a, b = pair(fmt, shape, seed=3)
    x = np.random.default_rng(batch).standard_normal((batch, shape[1])).astype(np.float32)
    dq = np.abs(a.dequantize()).astype(np.float64)
    tol = 1e-5 * (np.abs(x) @ dq.T) + 1e-30
    yb = b.matmul(x)
    assert yb.dtype == np.float32 and yb.shape == (batch, shape[0])
    assert (np.abs(a.matmul(x) - yb) <= tol).all()


def test_block_formats_cost_their_own_bits_in_memory():
    """q8_0, q4_0, q4_1 (float16 scales kept), q5_0, q5_1 and the K-quants (stored blocks)
    cost the format's own bits per weight: 8.5, 4.5, 5.0, 5.5, 6.0, 2.625 ... 6.5625."""
    for fmt, cls in COMPILED.items():
        if fmt in ("f32", "f16", "bf16"):
            continue
        assert cls.nbytes_for((4096, 4096)) * 8 == cls.bits_per_weight * 4096 * 4096, fmt
        assert cls.nbytes_for((5, 256)) == cls.nbytes_for((8, 256))  # padded to groups of 4


def test_a_format_changes_backend_without_requantizing():
    """A stored tensor moves between layouts with its codes; convert() re-lays it out."""
    a, _ = pair("q4_1", (10, 64))
    b = numba_backend().convert(a)
    assert type(b) is COMPILED["q4_1"] and np.array_equal(a.to_blocks(), b.to_blocks())
    assert numba_backend().convert(b) is b


def stores(fmt: str, n_kv: int, slots: int, hd: int, tiled: bool):
    return KV_FORMATS[fmt](n_kv, slots, hd, tiled=tiled), KV_FORMATS[fmt](n_kv, slots, hd)


NONE = np.zeros(0, np.float32)


def llama_spec(hd: int) -> tuple:
    """attention.spec_of for llama's attention: no q/k norms, 1/sqrt(hd), no soft-cap."""
    return attention.spec_of(NONE, NONE, 1e-5, np.float32(1) / np.sqrt(np.float32(hd)), 0.0)


def family_spec(kind: str, n_heads: int, n_kv: int, hd: int, rng) -> tuple:
    """A spec with one family's switch on: q/k norms of each head ("head", qwen3) or of
    each whole projection ("all", olmo2), a scale of its own and a soft-cap ("cap",
    gemma2), or none of them ("llama")."""

    def w(n):
        return rng.uniform(0.5, 1.5, n).astype(np.float32)

    if kind == "head":
        return attention.spec_of(w(hd), w(hd), 1e-6, 0.3, 0.0)
    if kind == "all":
        return attention.spec_of(w(n_heads * hd), w(n_kv * hd), 1e-6, 0.3, 0.0)
    if kind == "cap":
        return attention.spec_of(NONE, NONE, 1e-6, 0.7, 2.0)
    return llama_spec(hd)


def reference_attention(qkv, cos, sin, keys, values, n_heads, n_kv, hd, slot, n, spec=None):
    """NumPy: q and k normed (spec), rotated (cos, sin: the first 2 len(cos) dims), k and v
    stored through the stores' own write, q attends to slots 0..n-1, the scores scaled
    and soft-capped as spec says."""
    from llama_np.model.ops import attention as np_attention
    from llama_np.model.ops import rmsnorm

    spec = spec or llama_spec(hd)
    q = qkv[: n_heads * hd].reshape(1, n_heads * hd)
    k = qkv[n_heads * hd : (n_heads + n_kv) * hd].reshape(1, n_kv * hd)
    v = qkv[(n_heads + n_kv) * hd :].reshape(1, n_kv, hd)
    qn, kn, eps, scale, cap = spec
    if len(qn) and len(qn) != hd:  # over the whole projections
        q, k = rmsnorm(q, qn, eps), rmsnorm(k, kn, eps)
    q, k = q.reshape(1, n_heads, hd), k.reshape(1, n_kv, hd)
    if len(qn) == hd:
        q, k = rmsnorm(q, qn, eps), rmsnorm(k, kn, eps)

    def rope(x):
        r = len(cos)
        a, b = x[..., :r], x[..., r : 2 * r]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin, x[..., 2 * r :]], axis=-1)

    keys.write(slot, rope(k))
    values.write(slot, v)
    return np_attention(rope(q), keys.load(0, n), values.load(0, n), None, scale,
                        cap if cap else None)[0]  # fmt: skip


def check_attention(kv: str, n_heads: int, n_kv: int, n: int, hd: int, kind: str = "llama",
                    rotary: int | None = None) -> None:  # fmt: skip
    """The compiled decode attention against NumPy's on one shape: n keys, the last new;
    `kind`: a family's switch (family_spec); `rotary`: RoPE on that many dims only."""
    slots = -(-n // 16) * 16 + 16
    rng = np.random.default_rng(n + hd)
    ck, cv = stores(kv, n_kv, slots, hd, tiled=True)
    rk, rv = stores(kv, n_kv, slots, hd, tiled=False)
    history = rng.standard_normal((2, n - 1, n_kv, hd)).astype(np.float32)
    for (k, v), (hk, hv) in (((ck, cv), history), ((rk, rv), history)):
        k.write(0, hk)
        v.write(0, hv)
    qkv = rng.standard_normal((n_heads + 2 * n_kv) * hd).astype(np.float32)
    angle = rng.uniform(0, 6, (rotary or hd) // 2).astype(np.float32)
    cos, sin = np.cos(angle), np.sin(angle)
    spec = family_spec(kind, n_heads, n_kv, hd, rng)
    out = np.empty(n_heads * hd, np.float32)
    attention.attend(qkv, cos, sin, spec, tuple(ck.arrays()), tuple(cv.arrays()), n - 1, n, out)
    ref = reference_attention(qkv, cos, sin, rk, rv, n_heads, n_kv, hd, n - 1, n, spec)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6 * np.abs(ref).max() + 1e-7)
    # the rotated keys differ in float32's last bit, which a float16 store may round to
    # the neighbouring half: one ulp of float16
    ulp = 2.0**-10 if kv == "f16" else 0.0
    np.testing.assert_allclose(ck.load(0, n), rk.load(0, n), rtol=ulp, atol=1e-6)
    assert np.array_equal(cv.load(0, n), rv.load(0, n))


def test_the_progress_bar_counts_every_stage_of_the_warm_up(monkeypatch):
    """A first run's progress bar (api.compile_notice) is sized by warm_up_stages: as many
    stages as compiled.warm_up hands take_turns (here taken, not run)."""
    import quant.compiled
    from quant.backends import warm_up_stages

    handed = []
    monkeypatch.setattr(quant.compiled, "take_turns", lambda stages, *a: handed.extend(stages))
    quant.compiled.warm_up(COMPILED, list(KV_FORMATS), "int16")
    assert len(handed) == warm_up_stages() and handed[0][0] == "one-call step"


@pytest.mark.parametrize("kv", sorted(KV_FORMATS))
@pytest.mark.parametrize(("n_heads", "n_kv"), [(4, 2), (3, 3), (14, 2)])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 300, 4100, 4620])
def test_decode_attention_equals_numpy(kv, n_heads, n_kv, n):
    """GQA shapes, key counts at and across tile edges, several pieces of parallel work
    (4620 keys: 289 tiles, where rounding once left pieces without a tile)."""
    check_attention(kv, n_heads, n_kv, n, 64)


# (n_heads, n_kv, head_dim, rotary dims): MQA, GQA, MHA, partial rotary; a q8_0 cache
# holds head dims of whole blocks of 32
SHAPES = [(4, 1, 24, None), (6, 2, 24, 18), (3, 3, 34, None), (5, 1, 64, 48)]
FAMILY_CASES = [(kv, *shape) for kv in sorted(KV_FORMATS) for shape in SHAPES
                if kv != "q8_0" or shape[2] % 32 == 0]  # fmt: skip


@pytest.mark.parametrize(("kv", "n_heads", "n_kv", "hd", "rotary"), FAMILY_CASES)
@pytest.mark.parametrize("kind", ["head", "all", "cap"])
@pytest.mark.parametrize("n", [1, 17, 300])
def test_decode_attention_with_a_familys_switches_equals_numpy(kv, n_heads, n_kv, hd, rotary,
                                                               kind, n):  # fmt: skip
    """q and k normed per head (qwen3, gemma3) or over each whole projection (olmo2), a
    scale of the family's own, gemma2's soft-cap, partial rotary (phi3: 18 of 24 dims,
    48 of 64), on odd shapes (MQA, head dims not a multiple of 16)."""
    check_attention(kv, n_heads, n_kv, n, hd, kind, rotary)


@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 31, 33, 256, 300])
def test_the_scores_maximum_is_numpys_nan_included(n):
    """attention.maximum (16 lanes at a time) against np.max: any length, the maximum in
    any lane or in the rest, and a NaN anywhere gives NaN."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    for i in {0, n // 2, n - 1}:
        y = x.copy()
        y[i] = 100
        assert attention.maximum(y) == np.max(y) == 100
        y[i] = np.nan
        assert np.isnan(attention.maximum(y))
    assert attention.maximum(-np.abs(x)) == np.max(-np.abs(x))


def test_attention_pieces_cover_the_tiles_and_none_is_empty():
    for tiles in range(1, 5000):
        pieces, run = attention.split(tiles)
        assert 1 <= pieces <= 64 and run >= min(tiles, attention.TILES_PER_TASK)
        assert (pieces - 1) * run < tiles <= pieces * run, tiles


@pytest.mark.parametrize("kv", ["f32", "f16"])
@pytest.mark.parametrize("hd", [2, 4, 6, 8, 10, 12, 14, 18, 20, 24, 28, 34, 36, 40, 72, 136, 250])
@pytest.mark.parametrize("n", [1, 17, 300])
def test_decode_attention_on_any_even_head_dim(kv, hd, n):
    """head_dim that is not a multiple of the 64 elements a weighing pass holds or of the
    16 vector lanes: the kernel once wrote 16 lanes past such a head into its neighbour's
    sums (and read past it), so every head_dim of 8 to 40 but 16 and 32 gave wrong tokens."""
    check_attention(kv, 6, 2, n, hd)
    check_attention(kv, 4, 1, n, hd)  # MQA


@pytest.mark.parametrize("hd", [32, 96, 160, 256])
def test_decode_attention_q8_0_kv_on_head_dims_of_whole_blocks(hd):
    check_attention("q8_0", 6, 2, 33, hd)


@pytest.mark.parametrize("kv", sorted(KV_FORMATS))
def test_a_kernel_stores_what_numpy_stores(kv):
    """Without rotation (cos 1, sin 0) the kernel's f16 and q8_0 encodings of the new key
    and value are NumPy's, bit for bit: both backends hold the same cache."""
    n_kv, hd = 2, 64
    rng = np.random.default_rng(3)
    ck, cv = stores(kv, n_kv, 32, hd, tiled=True)
    rk, rv = stores(kv, n_kv, 32, hd, tiled=False)
    qkv = (rng.standard_normal((2 + 2 * n_kv) * hd) * 50).astype(np.float32)
    qkv[-5:] = [0, 1e6, -1e6, 1e-8, 0.5]  # zero, beyond float16, tiny
    cos, sin = np.ones(hd // 2, np.float32), np.zeros(hd // 2, np.float32)
    out = np.empty(2 * hd, np.float32)
    attention.attend(qkv, cos, sin, llama_spec(hd), tuple(ck.arrays()), tuple(cv.arrays()), 7, 8,
                     out)  # fmt: skip
    rk.write(7, qkv[2 * hd : (2 + n_kv) * hd].reshape(1, n_kv, hd))
    rv.write(7, qkv[(2 + n_kv) * hd :].reshape(1, n_kv, hd))
    assert np.array_equal(ck.load(7, 8), rk.load(7, 8))
    assert np.array_equal(cv.load(7, 8), rv.load(7, 8))
    for a, b in zip(cv.arrays(), rv.arrays(), strict=True):
        assert np.array_equal(a, b)


def test_small_ops_equal_numpy():
    from llama_np.model.ops import rmsnorm, swiglu

    rng = np.random.default_rng(4)
    x = rng.standard_normal(576).astype(np.float32) * 3
    w = rng.standard_normal(576).astype(np.float32)
    out = np.empty_like(x)
    ops.rmsnorm(x, w, 1e-5, out)
    np.testing.assert_allclose(out, rmsnorm(x[None], w, 1e-5)[0], rtol=2e-6, atol=1e-6)
    gate_up = rng.standard_normal(2 * 300).astype(np.float32) * 8
    gate_up[:4] = [100.0, -100.0, 0.0, -1e-3]  # far in both tails: no overflow
    act = np.empty(300, np.float32)
    ops.swiglu(gate_up, act)
    g, u = gate_up[:300].astype(np.float64), gate_up[300:].astype(np.float64)
    exact = g / (1 + np.exp(-g)) * u
    np.testing.assert_allclose(act, exact, rtol=1e-6, atol=1e-30)
    # NumPy's (1 + tanh(g/2)) / 2 cancels for negative gates: right to an ulp of g u
    numpy_ref = swiglu(gate_up[None, :300], gate_up[None, 300:])[0]
    assert (np.abs(numpy_ref - exact) <= 1.2e-7 * np.abs(g * u) + 1e-6 * np.abs(exact)).all()


def test_exp_is_within_two_ulp():
    from numba import njit

    x = -np.concatenate([np.linspace(0, 87, 200001), np.geomspace(1e-30, 1, 1000)])
    x = x.astype(np.float32)
    got = njit(lambda v: np.array([ops.exp_neg(e) for e in v], np.float32))(x)
    ref = np.exp(x.astype(np.float64))
    ulp = np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert (np.abs(got - ref) <= 2 * ulp).all()


MODULES = (matvec, matmat, igemm, dequant, attention, ops, intdot, fewdot, layers, fewlayers,
           experts, recurrent)  # fmt: skip
KERNELS = [  # helpers inlined into these (inline="always") are checked as part of them
    getattr(module, name)
    for module in MODULES
    for name in dir(module)
    if isinstance(getattr(module, name), numba.core.registry.CPUDispatcher)
    and getattr(module, name).__module__ == module.__name__
    and getattr(module, name).targetoptions.get("inline") != "always"
]
DOUBLE = (numba.types.float64, numba.types.complex128)
COMPUTED = ("binop", "inplace_binop", "unary", "call", "getitem", "static_getitem")


@register_pass(mutates_CFG=False, analysis_only=True)
class StopAfterTyping(FunctionPass):
    _name = "stop_after_typing"

    def __init__(self) -> None:
        FunctionPass.__init__(self)

    def run_pass(self, state) -> bool:
        raise compiler._EarlyPipelineCompletion((state.func_ir, state.typemap))


class TypesOnly(compiler.CompilerBase):
    """numba's own front end and type inference, then stop: no lowering, no LLVM. Helpers
    inlined into a kernel (inline="always") are in its IR by then; a kernel it calls is
    compiled (or loaded from the disk cache) to type the call, and gains that signature."""

    def define_pipelines(self) -> list:
        pm = PassManager("types_only")
        pm.passes.extend(compiler.DefaultPassBuilder.define_untyped_pipeline(self.state).passes)
        pm.add_pass(typed_passes.NopythonTypeInference, "nopython frontend")
        pm.add_pass(StopAfterTyping, "stop after typing")
        pm.finalize()
        return [pm]


def doubles(func, args: tuple) -> list[str]:
    """The values a function computes in double precision, as numba types it for `args`:
    each arithmetic result, call result or array element typed float64 (or an array of
    them). A Python float argument arrives as float64, and converting it is allowed."""
    flags = compiler.Flags()
    flags.nrt = True
    func_ir, typemap = compiler.compile_extra(cpu_target.typing_context, cpu_target.target_context,
                                              func, args, None, flags, {},
                                              pipeline_class=TypesOnly)  # fmt: skip
    bad = []
    for block in func_ir.blocks.values():
        for st in block.find_insts(ir.Assign):
            if isinstance(st.value, ir.Expr) and st.value.op in COMPUTED:
                t = typemap.get(st.target.name)
                if t in DOUBLE or getattr(t, "dtype", None) in DOUBLE:
                    bad.append(f"{st.loc.short()}: {t} = {st.value}")
    return bad


FLOAT64_CHECK = CompilerCheck("float64", "quant/test_compiled.py")
STEPS = ["q4_0 gqa", "q4_0 mixtral", "q8_0 qwen3_5", "bf16 lfm2", "f32 gemma4"]


@pytest.fixture(scope="session")  # once, however the tests are ordered
def kernel_signatures() -> Typed:
    """Every kernel typed for every signature the backends use (Typed: what each computes
    in double precision; the specializations this gave the out-of-line kernels that they
    had not had in this process): a kernel called from Python gets its signatures from
    the backends' warm-up and from one decode step of a few small models (every mixer
    kind, experts, per-layer inputs; one sequence and two); one called only
    from other kernels gets them while those are typed anew (numba types a callee as it
    types its caller). So kernels are typed until no new signature appears, whatever ran
    before. With LLAMA_NP_SKIP_PASSED=1, skipped where every kernel's check has passed
    (tests.helpers.CompilerCheck)."""
    from tests.llama_np.model.test_decode_layers import decode_batch, model_for

    FLOAT64_CHECK.skip_if_passed(*(k.__name__ for k in KERNELS))
    before = {d: set(d.overloads) for d in OUT_OF_LINE.values()}
    for dot in ("f32", "int8", "int16"):
        numba_backend(dot)
    for case in STEPS:
        model = model_for(case, "numba-int8")
        model.ops.one_call = True
        model.forward(np.array([1, 2, 3]), model.new_cache(8))
        model.forward(np.array([4]), model.new_cache(8))
    decode_batch(model_for("q4_0 gqa", "numba-int8"), "f32", True, [[1, 2], [3]])
    out = {}
    while todo := [(k, sig) for k in KERNELS for sig in k.signatures if (k, sig) not in out]:
        for k, sig in todo:
            out[k, sig] = doubles(k.py_func, sig)
    added = {d: [s for s in d.overloads if s not in before[d]] for d in OUT_OF_LINE.values()}
    return Typed(out, added)


class Typed(NamedTuple):
    doubles: dict  # (kernel, signature) -> what it computes in double precision
    added: dict  # out-of-line kernel -> the specializations the fixture gave it


def test_no_kernel_specialized_twice_for_one_type(kernel_signatures):
    """The specializations the backends, the steps and the typing above give the out-of-line
    kernels (the one call's callees typed as it calls them, the calls one by one as Python
    calls them): none twice for types that differ only in a literal, an integer's sign or
    width or an array's write flag (jit.duplicate_specializations), which LLVM would
    optimize apart, so that a path gave other bits than the other. test_compile_order.py
    holds the bits themselves for one order into an empty cache."""
    added = kernel_signatures.added
    assert added[layers.product] and added[fewlayers.product], "the walkers' callees untyped"
    assert not duplicate_specializations(added)


def test_the_specialization_check_finds_a_second_one():
    """The check above can fail: one kernel called with a read-only and a writable array,
    an int32 and an int64, as two specializations."""

    def twice(a, n):
        return a[0] * n

    k = numba.njit(twice)
    a = np.ones(3, np.float32)
    ro = a.copy()
    ro.flags.writeable = False
    k(a, 1)
    k(ro, np.int32(1))
    found = duplicate_specializations({k: list(k.overloads)})
    assert len(found) == 1 and "twice" in found[0]
    assert duplicate_specializations({k: list(k.overloads)[:1]}) == []


@pytest.mark.slow  # types every kernel anew: ~80 s
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_no_float64_arithmetic_in_a_kernel(kernel, kernel_signatures):
    """Nothing in a kernel (its inlined helpers and parallel loops included) computes in
    double precision, as numba types it for each signature the backend uses: the promotion
    trap (DESIGN.md) is made in typing (a float32 times a Python int or float, an array
    made without a dtype)."""
    found = {sig: bad for (k, sig), bad in kernel_signatures.doubles.items() if k is kernel}
    assert found, "never typed: no warm-up or step above calls it"
    for sig, bad in found.items():
        assert not bad, f"{kernel.__name__}{sig}: {bad[:3]}"
    FLOAT64_CHECK.record(kernel.__name__)


def test_the_float64_check_finds_a_promotion():
    """The check above can fail: a float32 times a Python int, a float32 times a float64
    literal, an array made without a dtype, inside a parallel loop and an inlined helper;
    and it passes float32 arithmetic with a float argument converted once."""

    @numba.njit(inline="always")
    def half(v):
        return v * 0.5

    def by_int(x):
        return x[0] * 2

    def in_loop(x, eps):
        for i in numba.prange(x.size):
            x[i] = half(x[i])
        return np.zeros(3)

    def clean(x, eps):
        e = np.float32(eps)
        for i in numba.prange(x.size):
            x[i] = x[i] * np.float32(2) + e
        return x

    f32 = numba.types.float32[::1]
    assert doubles(by_int, (f32,))
    found = doubles(in_loop, (f32, numba.types.float64))
    assert any(b.split(" = ")[1].startswith(f"{test_the_float64_check_finds_a_promotion.__name__}"
                                            "__locals__half") for b in found)  # fmt: skip
    assert any("array(float64" in b for b in found)
    assert doubles(clean, (f32, numba.types.float64)) == []


def test_the_attention_kernel_knows_each_kv_format_by_its_first_array():
    for fmt, cls in KV_FORMATS.items():
        assert attention.STORE_FORMATS[np.dtype(cls.parts(64)[0][1]).name] == fmt


def test_kernel_cache_key_covers_every_kernel_source():
    """The disk cache's key hashes every file the kernels are compiled from, the SIMD
    helpers in quant/compiled/simd/ included: a helper changed in one file must not load
    stale machine code of a kernel in another."""
    from pathlib import Path

    from quant.compiled import jit

    package = Path(jit.__file__).parent
    names = {str(p.relative_to(package)) for p in jit.sources()}
    assert {"jit.py", "matvec.py", "layers.py", "simd/lanes.py", "simd/int8.py"} <= names
    assert names == {str(p.relative_to(package)) for p in package.rglob("*.py")}


CACHED_SCRIPT = """
import numpy as np
from quant.compiled import FORMATS, fewdot, igemm

for fmt in ("f32", "q8_0", "q4_k"):
    w = FORMATS[fmt].random((20, 256), np.random.default_rng(0))
    for b in (2, 7):  # both kinds of batched product: their row or panel function an argument
        w.matmul(np.ones((b, 256), np.float32), dot="int16")
kernels = (fewdot.matmat_few, igemm.matmat_int, igemm.matmat_float)
print(sum(k.stats.cache_misses.get(s, 0) for k in kernels for s in k.signatures))
"""


@pytest.mark.slow  # two processes: the first compiles the batched products where not cached
def test_kernels_taking_a_kernel_are_loaded_from_the_disk_cache():
    """A driver that takes its row or panel function as an argument compiles once: the next
    process finds it in the disk cache (the function is known by its name, jit.kernel),
    it neither compiles it again nor fails to save its cache's index. The kernel cache
    itself: the first process compiles into it what it lacks (all of it once the kernels
    change), the second must load everything (an empty folder of its own cost a minute of
    compiling on every run)."""
    import subprocess
    import sys

    misses = []
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", CACHED_SCRIPT], capture_output=True,
                             text=True, timeout=600)  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        misses.append(int(run.stdout.split()[-1]))
    assert misses[1] == 0, misses


def test_processes_warming_up_at_once_share_the_stages(tmp_path, monkeypatch):
    """jit.take_turns: a stage another process is running (here a thread, with a lock file
    of its own) is left for last and run once that one has finished; the others run at once.
    Both run every stage: the second one's kernels then load from the disk cache."""
    import threading

    from quant.compiled.jit import take_turns

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    started, finish, order = threading.Event(), threading.Event(), []

    def other_a():
        started.set()
        assert finish.wait(10)
        order.append("other a")

    def mine(name):
        def run():
            order.append(f"mine {name}")
            finish.set()

        return run

    other = threading.Thread(target=take_turns, args=([("a", other_a)], "t", print))
    other.start()
    assert started.wait(10)
    told = []
    take_turns([("a", mine("a")), ("b", mine("b"))], "t", told.append)
    other.join(10)
    assert order == ["mine b", "other a", "mine a"] and told == ["b", "a"]


@pytest.mark.parametrize("kv", sorted(KV_FORMATS))
@pytest.mark.parametrize("kind", ["llama", "head", "all", "cap"])
def test_batched_attention_gives_each_sequence_its_bits_alone(kv, kind):
    """layers.attend_batch, one call for every sequence: ragged depths (one key, a few
    tiles, several pieces of parallel work), a ring's slot inside its keys, GQA, a head
    dim not a multiple of 16 (q8_0: of 32): each sequence's output and stores equal what
    attention.attend gives it alone: bit for bit when both kernels were compiled in this
    process, else within a few float32 roundings (a kernel another test worker compiled,
    loaded from the disk cache, once differed in the last bit here in a cold run:
    test_decode_layers.same_logits)."""
    from quant.compiled import layers

    n_heads, n_kv, hd = 6, 2, 64 if kv == "q8_0" else 24
    depths, slots = [1, 40, 700, 300], [0, 39, 250, 299]  # sequence 2 a ring: slot < n
    rng = np.random.default_rng(5)
    qkv = rng.standard_normal((len(depths), (n_heads + 2 * n_kv) * hd)).astype(np.float32)
    angle = rng.uniform(0, 6, (len(depths), hd // 2)).astype(np.float32)
    cos, sin = np.cos(angle), np.sin(angle)
    spec = family_spec(kind, n_heads, n_kv, hd, rng)
    pairs = []
    for n in depths:  # each sequence's stores, twice: alone and in the batch
        history = rng.standard_normal((2, 704, n_kv, hd)).astype(np.float32)
        two = [stores(kv, n_kv, 704, hd, tiled=True) for _ in range(2)]
        for k, v in two:
            k.write(0, history[0, :n])
            v.write(0, history[1, :n])
        pairs.append(two)
    alone = np.empty((len(depths), n_heads * hd), np.float32)
    for b, ((k, v), _) in enumerate(pairs):
        attention.attend(qkv[b], cos[b], sin[b], spec, tuple(k.arrays()), tuple(v.arrays()),
                         slots[b], depths[b], alone[b])  # fmt: skip
    batch = [(tuple(k.arrays()), tuple(v.arrays())) for _, (k, v) in pairs]
    kv_at = np.array([[layers.address(a) for a in k + v] for k, v in batch], np.int64)
    together = np.empty_like(alone)
    layers.attend_batch(qkv, cos, sin, spec, layers.layout_of(*batch[0]), hd, kv_at,
                        np.array(slots, np.int64), np.array(depths, np.int64),
                        together)  # fmt: skip
    within = SAME_WITHIN[kv]
    np.testing.assert_allclose(together, alone, rtol=0, atol=within * np.abs(alone).max())
    for (a, b), n in zip(pairs, depths, strict=True):
        for x, y in zip(a, b, strict=True):  # the stores, as their values
            got, want = x.load(0, max(n, 1)), y.load(0, max(n, 1))
            np.testing.assert_allclose(got, want, rtol=0, atol=within * np.abs(want).max())


@pytest.mark.parametrize("kv", sorted(KV_FORMATS))
@pytest.mark.parametrize(("n_heads", "n_kv", "hd"), [(6, 2, 24), (3, 1, 10), (4, 4, 34)])
@pytest.mark.parametrize(("p0", "t"), [(0, 2), (0, 19), (37, 5), (250, 40)])
def test_a_prompt_in_two_calls_is_decode_token_by_token(kv, n_heads, n_kv, hd, p0, t):
    """A prompt's attention (layers.append_tokens, then attend_batch with every token a
    sequence of one cache, appending nothing) gives each token the bits attention.attend
    gives it decoded alone, and leaves the same stores; and it is NumPy's causal attention
    within float32 rounding. GQA, MQA and MHA; head dims not a multiple of 16 (q8_0: of
    32); prompts from the first position and after a prefix, across tiles and pieces."""
    from llama_np.model.ops import attention as np_attention
    from llama_np.model.ops import causal_mask
    from quant.compiled import layers

    hd = 32 * -(-hd // 32) if kv == "q8_0" else hd
    slots, rng = 320, np.random.default_rng(p0 + t + hd)
    qkv = rng.standard_normal((t, (n_heads + 2 * n_kv) * hd)).astype(np.float32)
    angle = rng.uniform(0, 6, (t, hd // 2)).astype(np.float32)
    cos, sin = np.cos(angle), np.sin(angle)
    spec = llama_spec(hd)
    history = rng.standard_normal((2, p0, n_kv, hd)).astype(np.float32)
    (pk, pv), (dk, dv) = (stores(kv, n_kv, slots, hd, tiled=True) for _ in range(2))
    for k, v in ((pk, pv), (dk, dv)):
        k.write(0, history[0])
        v.write(0, history[1])
    alone = np.empty((t, n_heads * hd), np.float32)
    for i in range(t):
        attention.attend(qkv[i], cos[i], sin[i], spec, tuple(dk.arrays()), tuple(dv.arrays()),
                         p0 + i, p0 + i + 1, alone[i])  # fmt: skip
    keys, values = tuple(pk.arrays()), tuple(pv.arrays())
    layers.append_tokens(qkv, cos, sin, spec, keys, values, p0)
    kv_at = np.repeat(np.array([[layers.address(a) for a in keys + values]], np.int64), t, 0)
    prompt = np.empty_like(alone)
    layers.attend_batch(qkv, cos, sin, spec, layers.layout_of(keys, values), hd, kv_at,
                        np.full(t, -1, np.int64), np.arange(p0 + 1, p0 + t + 1),
                        prompt)  # fmt: skip
    assert np.array_equal(prompt, alone)
    for a, b in ((pk, dk), (pv, dv)):
        assert all(np.array_equal(x, y) for x, y in zip(a.arrays(), b.arrays(), strict=True))
    # NumPy: the queries rotated, against the keys and values as stored, under the mask
    q = qkv[:, : n_heads * hd].reshape(t, n_heads, hd)
    a, b = q[..., : hd // 2], q[..., hd // 2 :]
    c, s = cos[:, None, :], sin[:, None, :]
    q = np.concatenate([a * c - b * s, b * c + a * s], axis=-1)
    n = p0 + t
    mask = causal_mask(np.arange(p0, n), np.arange(n), None)
    ref = np_attention(q, pk.load(0, n), pv.load(0, n), mask)
    np.testing.assert_allclose(prompt, ref, rtol=0, atol=2e-6 * np.abs(ref).max() + 1e-7)


def test_phase_seconds_split_a_step_into_work_and_waits(monkeypatch) -> None:
    """Two threads start at 100 and 110 ticks; phase 0 is released at 300, its threads
    having spun 100 ticks in all; phase 1 did not run (a fused residual add); phase 2 is
    released at 400 after 60 ticks spun (a late thread spun none: it moves nothing)."""
    sync = np.zeros((4, team.LINE), np.int64)
    sync[3, team.RELEASE] = team.EPOCH - 100
    sync[0, team.RELEASE], sync[0, team.WAITED] = 300, 100
    sync[2, team.RELEASE], sync[2, team.WAITED] = 400, 60
    monkeypatch.setattr(team, "ticks_per_second", lambda: 10.0)
    work, waits = team.phase_seconds(sync, 2)
    np.testing.assert_allclose(work, [15.0, 0, 7.0])
    np.testing.assert_allclose(waits, [5.0, 0, 3.0])
    assert work.sum() + waits.sum() == pytest.approx((400 - 100) / 10)


@pytest.mark.skipif(not team.X86, reason="the cycle counter is read on x86 only")
def test_the_clock_runs_at_its_measured_rate() -> None:
    rate = team.ticks_per_second()
    assert 1e8 < rate < 1e11
    c0, t0 = team.now(), time.perf_counter()
    time.sleep(0.05)
    c1, t1 = team.now(), time.perf_counter()
    assert (c1 - c0) / rate == pytest.approx(t1 - t0, rel=0.1)
