"""The compiled backend's decode step with its decoder blocks in one call
(quant.compiled.layers.decode_layers; a batch's step: quant.compiled.fewlayers) against the
same blocks called one operation at a time: the same kernels in the same order, so the
same logits (see `same_logits`), and the same bytes in the meter. Shapes that are not
powers of two, rows not a multiple of the 4-row groups, stacks of several formats, every
KV format, a sliding window that wraps, qwen2's biases, the hybrids' mixers, gemma4's
layers of two shapes (shared KV, per-layer inputs), x in float32 and in int8. (The
blocks one by one are themselves held to the NumPy reference and transformers by
tests/integration/test_differential.py.)"""

from __future__ import annotations

import dataclasses

import numba
import numpy as np
import pytest

from llama_arch import Config, DeltaNet, RopeScaling
from llama_arch.presets import PRESETS
from llama_np.model.ops import Rotary
from llama_np.model.ops_compiled import layer_angles
from llama_np.model.synthetic import random_model
from quant.backends import get_backend
from quant.compiled import fewlayers
from quant.compiled.team import X86
from quant.stack import StackedWeight

BASE = PRESETS["smollm2-135m"]


def shape(**kw):
    return dataclasses.replace(BASE, n_layers=3, vocab_size=300, name="test", **kw)


ODD = shape(dim=70, n_heads=3, n_kv_heads=1, head_dim=22, hidden_dim=45)
WINDOW = shape(arch="mistral", dim=96, n_heads=3, n_kv_heads=1, head_dim=32, hidden_dim=160,
               sliding_window=5)  # fmt: skip
QWEN2 = shape(arch="qwen2", qkv_bias=True, dim=160, n_heads=5, n_kv_heads=1, head_dim=32,
              hidden_dim=96)  # fmt: skip
K_QUANTS = shape(dim=256, n_heads=4, n_kv_heads=2, head_dim=64, hidden_dim=512)
GQA = shape(dim=128, n_heads=4, n_kv_heads=2, head_dim=32, hidden_dim=96)

# The families' switches (llama_arch.Config), several in each case
GEMMA2 = shape(arch="gemma2", dim=96, n_heads=3, n_kv_heads=1, head_dim=32, hidden_dim=160,
               post_norm=True, mlp_act="gelu_tanh", embed_scale=9.8, attn_scale=0.2,
               attn_softcap=3.0, final_softcap=5.0, sliding_window=5,
               sliding_layers=(True, False, True))  # fmt: skip
GEMMA3 = dataclasses.replace(K_QUANTS, arch="gemma3", qk_norm="head", post_norm=True,
                             mlp_act="gelu_tanh", rope_theta=1e6, rope_local_theta=1e4,
                             rope_scaling=RopeScaling("linear", 8.0), sliding_window=5,
                             sliding_layers=(True, True, False))  # fmt: skip
OLMO2 = shape(arch="olmo2", dim=70, n_heads=3, n_kv_heads=1, head_dim=32, hidden_dim=45,
              qk_norm="all", pre_norm=False, post_norm=True)  # fmt: skip
LONGROPE = RopeScaling(
    "longrope",
    2.0,
    original_max_position_embeddings=16,
    short_factor=tuple(1 + 0.1 * i for i in range(12)),
    long_factor=tuple(1 + 0.5 * i for i in range(12)),
    attention_factor=1.1,
)
PHI3 = shape(arch="phi3", dim=96, n_heads=3, n_kv_heads=1, head_dim=32, hidden_dim=160,
             rotary_dim=24, rope_scaling=LONGROPE)  # fmt: skip
QWEN3 = shape(arch="qwen3", dim=64, n_heads=3, n_kv_heads=1, head_dim=32, hidden_dim=96,
              qk_norm="head")  # fmt: skip
SMOLLM3 = dataclasses.replace(GQA, arch="smollm3", rope_layers=(True, False, True))
GRANITE = shape(arch="granite", dim=70, n_heads=3, n_kv_heads=1, head_dim=22, hidden_dim=45,
                embed_scale=3.0, attn_scale=0.1, residual_scale=0.4,
                logits_scaling=2.0)  # fmt: skip

# mixtures of experts: the router's choice inside the one call
MIXTRAL = shape(arch="mixtral", dim=96, n_heads=3, n_kv_heads=1, head_dim=32, hidden_dim=64,
                n_experts=5, experts_per_token=2)  # fmt: skip
GRANITEMOE = dataclasses.replace(GRANITE, arch="granitemoe", n_experts=6, experts_per_token=3)
QWEN3_MOE = dataclasses.replace(K_QUANTS, arch="qwen3_moe", qk_norm="head", n_experts=4,
                                experts_per_token=2, norm_topk=False)  # fmt: skip
OLMOE = shape(arch="olmoe", dim=64, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96,
              qk_norm="all", n_experts=7, experts_per_token=3, norm_topk=False)  # fmt: skip

# hybrids: gated delta nets (value heads twice and three times the key heads, grouped and
# tiled, head sizes not powers of two) and short convolutions beside attention, qwen3_5's
# gated attention with partial rotary, every layer type in one model
QWEN3_5 = Config("qwen3_5", 64, 3, 4, 2, 24, 96, 300, qk_norm="head", attn_gate=True,
                 rotary_dim=6, layer_types=("delta", "attention", "delta"),
                 delta=DeltaNet(2, 4, 12, 24, 4))  # fmt: skip
QWEN3_5_TILED = Config("qwen3_5", 64, 2, 4, 2, 24, 96, 300, qk_norm="head", attn_gate=True,
                       rotary_dim=24, layer_types=("attention", "delta"),
                       delta=DeltaNet(2, 6, 20, 16, 3, tiled=True))  # fmt: skip
LFM2 = Config("lfm2", 70, 3, 4, 2, 16, 96, 300, qk_norm="head", conv_kernel=3,
              layer_types=("conv", "attention", "conv"), tie_embeddings=True)  # fmt: skip

# gemma4: layers of two head sizes (24 sliding, 40 full: not powers of two; 32 and 64 where
# a q8_0 cache stores them), the full ones' proportional RoPE turning a quarter of their
# dims, the last two layers reading layers 2's and 1's KV (q only, no append) with a
# double-wide MLP, v normed, per-layer inputs gated in after each MLP, layer scalars, a
# window shorter than the prompt
GEMMA4 = Config("gemma4", 70, 5, 3, 1, 24, 45, 300, qk_norm="head", post_norm=True,
                mlp_act="gelu_tanh", embed_scale=8.4, attn_scale=1.0, final_softcap=30.0,
                sliding_window=4, sliding_layers=(True, False, True, True, False),
                rope_local_theta=1e4, rope_theta=1e6, global_head_dim=40, rope_proportion=0.25,
                v_norm=True, kv_shared=2, wide_shared_mlp=True, ple_dim=12,
                layer_scalar=True)  # fmt: skip
GEMMA4_32 = dataclasses.replace(GEMMA4, dim=96, n_layers=4, n_heads=2, head_dim=32,
                                hidden_dim=64, global_head_dim=64, ple_dim=32, sliding_window=3,
                                sliding_layers=(True, False, True, False))  # fmt: skip

# name: (config, weights, a format for v's rows of the stacked q, k, v, or None)
CASES = {
    "odd f32": (ODD, "f32", None),
    "odd bf16 + f16 v": (ODD, "bf16", "f16"),
    "q4_1 + q8_0 v, window": (WINDOW, "q4_1", "q8_0"),
    "q5_0 + q5_1 v, qwen2": (QWEN2, "q5_0", "q5_1"),
    "q4_k + q6_k v": (K_QUANTS, "q4_k", "q6_k"),
    "q4_0 gqa": (GQA, "q4_0", None),
    "q8_0 gemma2": (GEMMA2, "q8_0", None),
    "q4_k + q6_k v gemma3": (GEMMA3, "q4_k", "q6_k"),
    "f16 olmo2": (OLMO2, "f16", None),
    "q5_1 phi3": (PHI3, "q5_1", None),
    "q8_0 qwen3": (QWEN3, "q8_0", None),
    "q4_0 smollm3": (SMOLLM3, "q4_0", None),
    "bf16 granite": (GRANITE, "bf16", None),
    "q4_0 mixtral": (MIXTRAL, "q4_0", None),
    "bf16 granitemoe": (GRANITEMOE, "bf16", None),
    "q4_k + q6_k v qwen3_moe": (QWEN3_MOE, "q4_k", "q6_k"),
    "f16 olmoe": (OLMOE, "f16", None),
    "q8_0 qwen3_5": (QWEN3_5, "q8_0", None),
    "f16 qwen3_5 tiled": (QWEN3_5_TILED, "f16", None),
    "bf16 lfm2": (LFM2, "bf16", None),
    "f32 gemma4": (GEMMA4, "f32", None),
    "q4_0 gemma4": (GEMMA4_32, "q4_0", None),
}
PROMPTS_OF = {"f32 gemma4": [1, 2, 3, 4, 5, 6], "q4_0 gemma4": [1, 2, 3, 4, 5]}  # (else 1, 2, 3)


def model_for(case: str, kernels: str):
    config, fmt, v_fmt = CASES[case]
    backend = get_backend(kernels)
    model = random_model(config, fmt, None, backend, seed=3)
    rng = np.random.default_rng(5)
    for layer in model.weights.layers:  # norms of ones would hide a norm's weights misread
        for v in layer.vectors():
            v *= rng.uniform(0.5, 1.5, v.shape).astype(np.float32)
    if v_fmt is not None:  # v in another format: a stack of two parts, two kernels
        rng = np.random.default_rng(4)
        qk = config.q_dim + config.kv_dim
        for layer in model.weights.layers:
            layer.wqkv = StackedWeight([
                backend.weight_class(fmt).random((qk, config.dim), rng),
                backend.weight_class(v_fmt).random((config.kv_dim, config.dim), rng),
            ])  # fmt: skip
    return model


def decode(model, kv: str, one_call: bool, prompt: list[int] | None = None):
    """Logits and the meter's reads and writes of 12 decode steps after a prompt (default:
    3 tokens)."""
    model.ops.one_call = one_call
    cache = model.new_cache(32, kv=kv)
    model.forward(np.array(prompt or [1, 2, 3]), cache)
    logits, reads, writes = [], [], []
    for t in np.random.default_rng(5).integers(0, 300, 12):
        logits.append(model.forward(np.array([t]), cache))
        step = model.meter.last
        reads.append(dict(step.reads))
        writes.append(dict(step.writes))
    return np.stack(logits), reads, writes


# within what a last-bit difference becomes once a cache stores it: float32 rounding (f32),
# or a key rounded to the neighbouring float16 or q8_0 code (test_differential's bounds)
SAME_WITHIN = {"f32": 1e-5, "f16": 6e-4, "q8_0": 3e-3}
# x rounded to integers: a sum 1 ulp apart can move a value of x to the next integer, and
# over a few steps that grew to 0.4% of the largest logit (q4_k + q6_k, int8 and int16,
# the one call compiled here, the calls one by one loaded from the disk cache)
ROUNDED_X_WITHIN = {"numba-f32": 0.0, "numba-int8": 1e-2, "numba-int16": 1e-2}


def same_logits(one: np.ndarray, each: np.ndarray, kv: str = "f32",
                kernels: str = "numba-f32") -> None:  # fmt: skip
    """The one call's logits equal the calls one by one's, bit for bit when both paths were
    compiled in one process (test_the_same_bits_with_the_one_call_compiled_first), else
    within a few float32 roundings (SAME_WITHIN, by KV format): numba links a kernel's optimized
    IR into each caller and runs LLVM's optimizer over it again there, and with fast math
    a kernel compiled in another process (loaded from the disk cache) and linked again can
    round a sum differently (seen: 1 ulp, 1.2e-7 on logits of ~1), and a float16 cache then
    stores a key one float16 step apart, an integer x a value one integer apart
    (ROUNDED_X_WITHIN). A wrong row, sequence or bias is off by far more."""
    assert np.isfinite(one).all()
    within = max(SAME_WITHIN[kv], ROUNDED_X_WITHIN[kernels])
    np.testing.assert_allclose(one, each, rtol=0, atol=within * np.abs(each).max())


# a q8_0 KV cache needs head_dim a multiple of 32
RUNS = [(case, kv) for case in CASES for kv in ("f32", "f16", "q8_0")
        if kv != "q8_0" or CASES[case][0].head_dim % 32 == 0]  # fmt: skip


@pytest.mark.parametrize("kernels", ["numba-f32", "numba-int8", "numba-int16"])
@pytest.mark.parametrize(("case", "kv"), RUNS)
def test_blocks_in_one_call_equal_call_by_call(case: str, kv: str, kernels: str) -> None:
    model = model_for(case, kernels)
    assert model.ops.packed(model.config, model.weights.layers) is not None  # the one call runs
    one, reads, writes = decode(model, kv, True, PROMPTS_OF.get(case))
    each, reads_each, writes_each = decode(model, kv, False, PROMPTS_OF.get(case))
    same_logits(one, each, kv, kernels)
    assert reads == reads_each and writes == writes_each


# (iterations of the one call's parallel loop, numba threads): more iterations than threads
# run one after another on a thread (quant.compiled.team must neither wait forever for
# them nor count their work twice), and each size takes chunks of another grain, so rows
# land on other threads in other runs of chunks; the calls one by one split their rows
# into the same pieces whatever the threads, and the threads take the pieces in any order.
SCHEDULES = [(1, 1), (1, 2), (2, 1), (2, 2), (3, 2), (5, 2), (8, 2)]


@pytest.mark.parametrize("kernels", ["numba-f32", "numba-int16"])
def test_the_same_logits_whatever_runs_which_rows(kernels: str) -> None:
    """A row's sum never depends on the thread that runs it or on the chunks it came in:
    every schedule of the one call gives the same logits bit for bit, and so do the calls
    one by one on 1 or 2 threads (and the two paths `same_logits`)."""
    model = model_for("q4_1 + q8_0 v, window", kernels)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        alone = decode(model, "f32", False)[0]
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        assert np.array_equal(decode(model, "f32", False)[0], alone)
        first = None
        for team, n in SCHEDULES:
            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
            model.ops.team = team
            one = decode(model, "f32", True)[0]
            first = one if first is None else first
            assert np.array_equal(one, first), (team, n)
        same_logits(first, alone, "f32", kernels)
    finally:
        numba.set_num_threads(threads)
        model.ops.team = None


def test_one_call_is_what_decode_runs(monkeypatch) -> None:
    """Decode goes through the one call (not the blocks one by one), and a prompt does not."""
    model = model_for("q4_0 gqa", "numba-f32")
    calls = []
    monkeypatch.setattr(model.ops, "attention", lambda *a: calls.append(a[0]) or 1 / 0)
    cache = model.new_cache(8)
    with pytest.raises(ZeroDivisionError):
        model.forward(np.array([1, 2]), cache)  # a prompt: the blocks one by one
    cache = model.new_cache(8)
    model.forward(np.array([1]), cache)
    assert len(calls) == 1  # the prompt's first attention only


def test_layer_angles_are_each_layers_own() -> None:
    """The one call's (L, rotary / 2) angles: layer i's Rotary's, whether the layers share
    one (the fast path) or take two kinds in any order; float32, C-contiguous."""
    pos = np.array([7])
    near, far = (Rotary(pos, f, 22) for f in (np.float32([1.0, 0.5, 0.25]),
                                               np.float32([0.1, 0.01, 1e-3])))  # fmt: skip
    for rots in ([near] * 4, [near, far, far, near, far]):
        cos, sin = layer_angles(rots)
        assert cos.dtype == np.float32 and cos.flags.c_contiguous and sin.flags.c_contiguous
        np.testing.assert_array_equal(cos, np.stack([r.cos[0] for r in rots]))
        np.testing.assert_array_equal(sin, np.stack([r.sin[0] for r in rots]))
    wide = Rotary(pos, np.float32([0.3, 0.2, 0.1, 0.0, 0.0]), 40)  # gemma4's full layers'
    cos, sin = layer_angles([near, wide, near])  # each row its own, zeros past a narrow one
    assert cos.shape == sin.shape == (3, 5) and not cos[[0, 2], 3:].any()
    np.testing.assert_array_equal(cos[[0, 1, 2], [2, 4, 2]], [near.cos[0, 2], 1, near.cos[0, 2]])
    np.testing.assert_array_equal(sin[1], wide.sin[0])


def decode_batch(model, kv: str, one_call: bool, prompts: list[list[int]]):
    """Logits and the meter's reads and writes of 6 batched decode steps of the sequences
    after `prompts` (each its own length: ragged depths, a window that wraps)."""
    model.ops.one_call = one_call
    caches = [model.new_cache(32, kv=kv) for _ in prompts]
    for prompt, cache in zip(prompts, caches, strict=True):
        model.forward(np.array(prompt), cache)
    logits, reads, writes = [], [], []
    rng = np.random.default_rng(6)
    for _ in range(6):
        logits.append(model.step_batch(rng.integers(0, 300, len(caches)), caches))
        step = model.meter.last
        reads.append(dict(step.reads))
        writes.append(dict(step.writes))
    return np.stack(logits), reads, writes


PROMPTS = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10, 11], [12, 13]]


@pytest.mark.parametrize("b", [2, 3, 4])
@pytest.mark.parametrize("kernels", ["numba-f32", "numba-int8", "numba-int16"])
@pytest.mark.parametrize(("case", "kv"), RUNS)
def test_a_batch_in_one_call_equals_call_by_call(case: str, kv: str, kernels: str, b: int):
    """A batch's decode step in one call (quant.compiled.fewlayers) gives each sequence
    the bits of the batched step run call by call, and the meter the same bytes. With x
    in float32 (numba-f32) only a model of float formats runs the one call; a mixture of
    experts never does (its batch groups tokens by expert)."""
    model = model_for(case, kernels)
    one_call = kernels != "numba-f32" or CASES[case][1] in ("f32", "f16", "bf16")
    one_call &= CASES[case][0].n_experts == 1 and not CASES[case][0].layered  # (gemma4's: not
    # yet in fewlayers)
    calls = []
    decode_few = fewlayers.decode_few
    with pytest.MonkeyPatch.context() as m:  # the one call really runs (or not), once a step
        m.setattr(fewlayers, "decode_few", lambda *a: calls.append(a) or decode_few(*a))
        one, reads, writes = decode_batch(model, kv, True, PROMPTS[:b])
    assert len(calls) == (6 if one_call else 0)
    each, reads_each, writes_each = decode_batch(model, kv, False, PROMPTS[:b])
    same_logits(one, each, kv, kernels)
    assert reads == reads_each and writes == writes_each


@pytest.mark.skipif(not X86, reason="the cycle counter is read on x86 only")
@pytest.mark.parametrize("b", [2, 4])
@pytest.mark.parametrize("case", ["q4_0 gqa", "bf16 granite"])
def test_a_profiled_batch_step_is_the_one_call_timed_by_its_phases(case: str, b: int):
    """`bench --batch B --profile` with B <= FEW times the batch's one-call step itself
    (fewlayers.decode_few, once a step), not the calls one by one, which take twice its
    time: the same logits as unprofiled, its phases' work by the meter's categories,
    inside the step's wall time."""
    model = model_for(case, "numba-int16")
    plain, _, _ = decode_batch(model, "f32", True, PROMPTS[:b])
    calls = []
    decode_few = fewlayers.decode_few
    model.meter.profile = True
    try:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(fewlayers, "decode_few", lambda *a: calls.append(a) or decode_few(*a))
            timed, _, _ = decode_batch(model, "f32", True, PROMPTS[:b])
    finally:
        model.meter.profile = False
    assert len(calls) == 6
    np.testing.assert_array_equal(timed, plain)
    assert_timed_by_phases(model.meter.last, case)


@pytest.mark.skipif(not X86, reason="the cycle counter is read on x86 only")
@pytest.mark.parametrize("team", [None, 5])
@pytest.mark.parametrize("case", ["q4_0 gqa", "bf16 granite", "q4_0 mixtral", "q4_0 gemma4"])
def test_a_profiled_step_is_the_one_call_timed_by_its_phases(case: str, team: int | None):
    """`bench --profile` times the one-call step itself (the same logits as unprofiled):
    its phases' work by the meter's categories and their waits, inside the step's wall
    time; phases a family does not run take nothing. team 5: five members on the threads
    there are, some starting after the others have run phases without them (what a busy
    machine does to a thread)."""
    model = model_for(case, "numba-int16")
    plain, _, _ = decode(model, "f32", True)
    model.meter.profile, model.ops.team = True, team
    try:
        timed, _, _ = decode(model, "f32", True)
    finally:
        model.meter.profile, model.ops.team = False, None
    np.testing.assert_array_equal(timed, plain)
    assert_timed_by_phases(model.meter.last, case)


def assert_timed_by_phases(step, case: str) -> None:
    """A profiled one-call step's seconds: every category it reads has time, its waits
    none below zero, all inside its wall time. Phases of their own: granite's scaled
    residual adds, a mixture's weighted sum of its experts; llama's adds run inside the
    products."""
    s = step.seconds
    assert min(s["attn_weights"], s["mlp_weights"], s["kv_cache"], s["lm_head"]) > 0
    assert s["waits"] >= 0 and sum(s.values()) < step.wall
    assert (s["norms"] > 0) == (case != "q4_0 gqa")
