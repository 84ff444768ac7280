"""The forward pass keeps every activation in float32 and reads like the math."""

from __future__ import annotations

import numpy as np
import pytest

import llama_np
import llama_np.model as model_module
from llama_np import ops
from quant import Weight


def _check(name: str, value, seen: list[str]) -> None:
    values = value if isinstance(value, tuple | list) else (value,)
    for v in values:
        if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating):
            seen.append(name)
            assert v.dtype == np.float32, f"{name} produced or took {v.dtype}"


def _guard(name: str, fn, seen: list[str]):
    def wrapped(*args, **kwargs):
        for a in args:
            _check(f"{name} (argument)", a, seen)
        out = fn(*args, **kwargs)
        _check(name, out, seen)
        return out

    return wrapped


def test_every_intermediate_is_float32(gqa_dir, monkeypatch):
    """Each math function the forward pass calls, each kernel and each cache read is
    checked on the way in and out: one float64 array fails the test."""
    llm = llama_np.load(gqa_dir[0])
    seen: list[str] = []
    for name in ("rmsnorm", "rope", "rope_cos_sin", "attention", "causal_mask", "swiglu"):
        monkeypatch.setattr(model_module, name, _guard(name, getattr(model_module, name), seen))
    for w in llm.model.weights.matrices():
        for method in ("matvec", "matmul", "rows"):
            monkeypatch.setattr(
                w, method, _guard(f"{type(w).__name__}.{method}", getattr(w, method), seen)
            )
    cache = llm.new_cache()
    logits = llm.logits(list(range(1, 12)), cache)
    step = llm.step(5, cache)
    assert logits.dtype == step.dtype == np.float32
    for name in (
        "rmsnorm",
        "rope",
        "attention",
        "causal_mask",
        "swiglu",
        "F32Weight.matvec",
        "F32Weight.matmul",
    ):
        assert name in seen, f"{name} was never checked"


def test_float64_is_caught(gqa_dir, monkeypatch):
    """The guard above can fail: a float64 scalar in rmsnorm is reported."""
    llm = llama_np.load(gqa_dir[0])
    bad = lambda x, w, eps: ops.rmsnorm(x, w, eps) * np.float64(1.0)  # noqa: E731
    seen: list[str] = []
    monkeypatch.setattr(model_module, "rmsnorm", _guard("rmsnorm", bad, seen))
    with pytest.raises(AssertionError, match="float64"):
        llm.logits([1, 2, 3])


def test_rmsnorm_formula():
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    w = np.linspace(0.5, 1.5, 8, dtype=np.float32)
    expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(ops.rmsnorm(x, w, 1e-5), expected, rtol=1e-5)


def test_rope_is_a_rotation_that_depends_on_relative_position():
    """q.k after RoPE depends only on the distance between positions."""
    from llama_np.config import Config

    c = Config("llama", 32, 1, 2, 2, 16, 64, 10, 128, 1e-5, 10000.0)
    inv = ops.rope_inv_freq(c)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 1, 16)).astype(np.float32)

    def dot(pq: int, pk: int) -> float:
        cq, sq = ops.rope_cos_sin(np.array([pq]), inv)
        ck, sk = ops.rope_cos_sin(np.array([pk]), inv)
        return float((ops.rope(q, cq, sq) * ops.rope(k, ck, sk)).sum())

    assert dot(7, 3) == pytest.approx(dot(14, 10), rel=1e-5)
    cq, sq = ops.rope_cos_sin(np.array([5]), inv)
    assert np.linalg.norm(ops.rope(q, cq, sq)) == pytest.approx(np.linalg.norm(q), rel=1e-6)


def test_weights_are_never_float64(gqa_dir):
    llm = llama_np.load(gqa_dir[0])
    for w in llm.model.weights.matrices():
        assert isinstance(w, Weight)
        assert all(a.dtype != np.float64 for a in w.arrays().values())
