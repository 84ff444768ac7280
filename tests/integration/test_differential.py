"""Both kernel backends on the shapes the loader accepts, drawn by hypothesis: random
checkpoints built and saved by transformers, run through a prompt (one batched prefill)
and several decode steps, teacher-forced so every step's logits can be compared.

The compiled backend must equal the NumPy reference within float32 rounding (plus the
rounding of the KV store, where a last-bit difference may round a stored key to the
neighbouring float16 or q8_0 code), and with float32 weights both must equal transformers.
This test was written after the compiled attention gave wrong tokens whenever head_dim was
not a multiple of 16: every model in the suite then had head dims of 16, 32 or 64.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llama_np
from llama_arch.config import MOE
from tests.helpers import INT8_WITHIN, INT16_WITHIN, VOCAB, build_hf_model, hf_logits

# max |compiled - numpy| / max(1, max |logit|), by KV format: float32 rounding alone (f32),
# or a last-bit difference rounded to a neighbouring float16 or q8_0 code and carried on.
# About 10x the worst seen in 150 random draws (Xeon, AVX-512): 9.5e-7, 5.8e-5, 2.7e-4.
SAME_WITHIN = {"f32": 1e-5, "f16": 6e-4, "q8_0": 3e-3}
QUANTIZED = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


@dataclass(frozen=True)
class Case:
    arch: str
    n_heads: int
    n_kv: int
    head_dim: int
    hidden: int
    ffn: int
    tied: bool
    window: int | None
    weights: str | None  # None: float32 as saved
    kv: str
    prompt: int  # tokens prefilled in one pass
    steps: int  # tokens decoded one at a time after it


@st.composite
def cases(draw) -> Case:
    arch = draw(st.sampled_from(["llama", "mistral", "qwen2", *FAMILY_MODELS]))
    n_kv = draw(st.integers(1, 3))
    n_heads = n_kv * draw(st.sampled_from([1, 2, 3, 4]))  # MHA, GQA and (n_kv = 1) MQA
    weights = draw(st.sampled_from([None, None, "f16", "bf16", *QUANTIZED]))
    kv = draw(st.sampled_from(["f32", "f16", "q8_0"]))
    if kv == "q8_0":  # a q8_0 cache stores head_dim in whole blocks of 32
        head_dim = 32 * draw(st.integers(1, 8))
        hidden, ffn = 32 * draw(st.integers(1, 5)), 32 * draw(st.integers(1, 6))
        n_heads += n_heads % 2
        n_kv = n_kv if n_heads % n_kv == 0 else 1
    elif weights in QUANTIZED:  # every input width a multiple of the 32-weight block
        head_dim = 16 * draw(st.integers(1, 16 if arch != "phi3" else 4))
        n_heads += n_heads % 2
        n_kv = n_kv if n_heads % n_kv == 0 else 1
        hidden, ffn = 32 * draw(st.integers(1, 5)), 32 * draw(st.integers(1, 6))
    else:  # any even head_dim, widths that are not multiples of 32 (or of 16, 8, 4)
        head_dim = 2 * draw(st.integers(1, 128))
        hidden, ffn = draw(st.integers(4, 150)), draw(st.integers(4, 200))
    if arch == "phi3":  # half of head_dim turns: an even number of dims
        head_dim = 4 * max(1, head_dim // 4)
    prompt, steps = draw(st.integers(1, 9)), draw(st.integers(2, 6))
    # windows shorter than the prompt, between prompt and end, and longer than both
    window = draw(st.sampled_from([None, 2, 5, 9, 64])) if arch == "mistral" else None
    return Case(arch, n_heads, n_kv, head_dim, hidden, ffn, draw(st.booleans()), window,
                weights, kv, prompt, steps)  # fmt: skip


# the families, each with its switches on (tests/helpers.py FAMILIES, at the drawn shape)
FAMILY_MODELS = {"qwen3": "qwen3", "gemma2": "gemma2", "gemma3": "gemma3", "phi3": "phi3",
                 "smollm3": "smollm3_window", "olmo2": "olmo2", "granite": "granite",
                 "mixtral": "mixtral", "qwen3_moe": "qwen3_moe", "olmoe": "olmoe",
                 "granitemoe": "granitemoe"}  # fmt: skip


def build(case: Case, directory: Path):
    """Save the case's random checkpoint; return transformers' float32 model of it."""
    spec = dict(
        hidden_size=case.hidden, intermediate_size=case.ffn, num_attention_heads=case.n_heads,
        num_key_value_heads=case.n_kv, head_dim=case.head_dim, tie_word_embeddings=case.tied,
    )  # fmt: skip
    name = {"llama": "llama_gqa", "mistral": "mistral_window", "qwen2": "qwen2"}.get(case.arch)
    if case.arch == "mistral":
        spec["sliding_window"] = case.window
    if case.arch in ("olmoe", "granitemoe"):  # head_dim is hidden / heads
        spec["hidden_size"] = case.n_heads * case.head_dim
    if case.arch == "qwen3_moe":  # each expert's width
        spec["moe_intermediate_size"] = case.ffn
    if case.arch == "phi3":  # head_dim is hidden / heads; RoPE on about half of it, longrope
        r = max(2, case.head_dim // 2 - case.head_dim // 2 % 2)
        short, long = [1.0 + 0.1 * i for i in range(r // 2)], [2.0 + i for i in range(r // 2)]
        spec |= dict(
            hidden_size=case.n_heads * case.head_dim,
            partial_rotary_factor=r / case.head_dim,
            rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long},
        )
    return build_hf_model(name or FAMILY_MODELS[case.arch], directory, **spec)


def run(directory: Path, case: Case, kernels: str, ids: list[int]) -> np.ndarray:
    """Logits at every position: the prompt in one pass, then one step per token."""
    with llama_np.load(directory, weights=case.weights, kernels=kernels, threads=2) as llm:
        cache = llm.new_cache(len(ids), kv=case.kv)
        first = llm.logits(ids[: case.prompt], cache)  # (prompt, vocab)
        rest = [llm.step(t, cache) for t in ids[case.prompt :]]
    return np.concatenate([first, np.stack(rest)])


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # fixed seeds: the same 60 configs on every run
    suppress_health_check=[HealthCheck.too_slow],
)
@given(cases())
def test_compiled_equals_numpy_and_transformers(case: Case) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ref = build(case, Path(tmp))
        ids = np.random.default_rng(case.head_dim).integers(0, VOCAB - 2, case.prompt + case.steps)
        ids = ids.tolist()
        numpy_logits = run(Path(tmp), case, "numpy", ids)
        compiled = run(Path(tmp), case, "numba-f32", ids)  # float x: NumPy's arithmetic
    scale = max(1.0, float(np.abs(numpy_logits).max()))
    diff = float(np.abs(compiled - numpy_logits).max())
    assert diff <= SAME_WITHIN[case.kv] * scale, f"{case}: compiled - numpy {diff:.3g}"
    if case.weights is None and case.kv == "f32":
        hf = hf_logits(ref, ids)
        for name, ours in (("numpy", numpy_logits), ("compiled", compiled)):
            err = float(np.abs(ours - hf).max())
            assert err <= 1e-4 * scale, f"{case}: {name} - transformers {err:.3g}"


def quantized_cases():
    """Quantized dense models: a router's choice is discontinuous (x's rounding moves the
    hidden state, and a token near a tie between experts takes the other one), so the
    mixtures of experts' integer products are held to the float ones in test_moe.py, on
    the same routes."""
    return cases().filter(lambda c: c.weights in QUANTIZED and c.arch not in MOE)


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(quantized_cases())
def test_integer_activations_stay_near_float_ones(case: Case) -> None:
    """The integer kernels on whole models, prefill (one product of the prompt's tokens)
    and decode: their logits within x's rounding of the float-activation kernels'."""
    with tempfile.TemporaryDirectory() as tmp:
        build(case, Path(tmp))
        ids = np.random.default_rng(case.head_dim).integers(0, VOCAB - 2, case.prompt + case.steps)
        ids = ids.tolist()
        floats = run(Path(tmp), case, "numba-f32", ids)
        ints = {dot: run(Path(tmp), case, f"numba-{dot}", ids) for dot in ("int8", "int16")}
    scale = max(1.0, float(np.abs(floats).max()))
    fine = INT8_WITHIN if case.kv == "q8_0" else INT16_WITHIN
    for (dot, logits), within in zip(ints.items(), (INT8_WITHIN, fine), strict=True):
        diff = float(np.abs(logits - floats).max())
        assert diff <= within * scale, f"{case}: {dot} - f32 {diff:.3g}"
        assert diff > 0  # x really was rounded
