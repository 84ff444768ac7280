"""The compiled backend's decode step with its decoder blocks in one call
(quant.compiled.layers.decode_blocks) against the same blocks called one operation at a
time: the same kernels in the same order, so the same logits bit for bit, and the same
bytes in the meter. Shapes that are not powers of two, rows not a multiple of the 4-row
groups, stacks of several formats, every KV format, a sliding window that wraps, qwen2's
biases, x in float32 and in int8. (The blocks one by one are themselves held to the NumPy
reference and transformers by tests/integration/test_differential.py.)"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from arch.presets import PRESETS
from llama_np.model.synthetic import random_model
from quant.backends import get_backend
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

# name: (config, weights, a format for v's rows of the stacked q, k, v, or None)
CASES = {
    "odd f32": (ODD, "f32", None),
    "odd bf16 + f16 v": (ODD, "bf16", "f16"),
    "q4_1 + q8_0 v, window": (WINDOW, "q4_1", "q8_0"),
    "q5_0 + q5_1 v, qwen2": (QWEN2, "q5_0", "q5_1"),
    "q4_k + q6_k v": (K_QUANTS, "q4_k", "q6_k"),
    "q4_0 gqa": (GQA, "q4_0", None),
}


def model_for(case: str, kernels: str):
    config, fmt, v_fmt = CASES[case]
    backend = get_backend(kernels)
    model = random_model(config, fmt, None, backend, seed=3)
    if v_fmt is not None:  # v in another format: a stack of two parts, two kernels
        rng = np.random.default_rng(4)
        qk = config.q_dim + config.kv_dim
        for layer in model.weights.layers:
            layer.wqkv = StackedWeight([
                backend.weight_class(fmt).random((qk, config.dim), rng),
                backend.weight_class(v_fmt).random((config.kv_dim, config.dim), rng),
            ])  # fmt: skip
    return model


def decode(model, kv: str, one_call: bool):
    """Logits and the meter's reads and writes of 12 decode steps after a 3-token prompt."""
    model.ops.one_call = one_call
    cache = model.new_cache(32, kv=kv)
    model.forward(np.array([1, 2, 3]), cache)
    logits, reads, writes = [], [], []
    for t in np.random.default_rng(5).integers(0, 300, 12):
        logits.append(model.forward(np.array([t]), cache))
        step = model.meter.last
        reads.append(dict(step.reads))
        writes.append(dict(step.writes))
    return np.stack(logits), reads, writes


# a q8_0 KV cache needs head_dim a multiple of 32
RUNS = [(case, kv) for case in CASES for kv in ("f32", "f16", "q8_0")
        if kv != "q8_0" or CASES[case][0].head_dim % 32 == 0]  # fmt: skip


@pytest.mark.parametrize("kernels", ["numba-f32", "numba-int8", "numba-int16"])
@pytest.mark.parametrize(("case", "kv"), RUNS)
def test_blocks_in_one_call_equal_call_by_call(case: str, kv: str, kernels: str) -> None:
    model = model_for(case, kernels)
    assert model.ops.packed(model.weights.layers) is not None  # the one call really runs
    one, reads, writes = decode(model, kv, True)
    each, reads_each, writes_each = decode(model, kv, False)
    assert np.isfinite(one).all()
    assert np.array_equal(one, each)
    assert reads == reads_each and writes == writes_each


@pytest.mark.parametrize("team", [1, 3, 5])
def test_a_team_of_any_size_gives_the_same_logits(team: int) -> None:
    """The one call's parallel loop with more iterations than threads (some run one after
    another on the same thread: quant.compiled.team must neither wait forever for them nor
    count their work twice), or with one: the logits stay those of the calls one by one."""
    model = model_for("q4_1 + q8_0 v, window", "numba-int8")
    each = decode(model, "f32", False)[0]
    model.ops.team = team
    assert np.array_equal(decode(model, "f32", True)[0], each)


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
