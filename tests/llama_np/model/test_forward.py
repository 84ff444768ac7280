"""The forward pass keeps every activation in float32 and reads like the math."""

from __future__ import annotations

import numpy as np
import pytest

import llama_np
from llama_np.model import ops
from quant import Matrix


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


def guard_model(model, seen: list[str], monkeypatch) -> None:
    """Wrap the forward pass's operations and every matrix's kernels so that each checks
    the arrays going in and coming out."""
    ops_object = model.ops
    for name in ("norm_linear", "attention", "linear_add", "gated_linear_add", "rotary"):
        fn = getattr(ops_object, name)
        if name == "rotary":
            fn = (lambda f: lambda *a: _check_rotary(f(*a), seen))(fn)
        monkeypatch.setattr(ops_object, name, _guard(name, fn, seen))
    for w in model.weights.matrices():
        for kind in ("rows", "matvec", "matmul", "matvec_into", "matmat_into"):
            if hasattr(w, kind):
                monkeypatch.setattr(w, kind, _guard(kind, getattr(w, kind), seen))


def _check_rotary(rot, seen):
    """RoPE's tables (applied inside `attention`, whose output is checked)."""
    _check("rope tables", (rot.cos, rot.sin, rot.matrix), seen)
    return rot


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
def test_every_intermediate_is_float32(gqa_dir, monkeypatch, kernels):
    """Each operation the forward pass calls, each kernel and each cache read is checked
    on the way in and out: one float64 array fails the test. (Inside compiled kernels the
    same holds by construction: tests/quant/test_compiled.py reads their types.)"""
    llm = llama_np.load(gqa_dir[0], kernels=kernels)
    seen: list[str] = []
    guard_model(llm.model, seen, monkeypatch)
    cache = llm.new_cache()
    logits = llm.logits(list(range(1, 12)), cache)
    step = llm.step(5, cache)
    assert logits.dtype == step.dtype == np.float32
    kernels = ["matvec_into", "matmat_into"] if kernels == "numba" else ["matvec", "matmul"]
    names = ["norm_linear", "rope tables", "attention", "linear_add", "gated_linear_add"]
    for name in [*names, "rows", *kernels]:
        assert {name, f"{name} (argument)"} & set(seen), f"{name} was never checked"


def test_float64_is_caught(gqa_dir, monkeypatch):
    """The guard above can fail: a float64 scalar after a normed product is reported."""
    llm = llama_np.load(gqa_dir[0], kernels="numpy")
    seen: list[str] = []
    guard_model(llm.model, seen, monkeypatch)
    inner = llm.model.ops.norm_linear
    bad = lambda x, n, eps, w: inner(x, n, eps, w) * np.float64(1)  # noqa: E731
    monkeypatch.setattr(llm.model.ops, "norm_linear", bad)
    with pytest.raises(AssertionError, match="float64"):
        llm.logits([1, 2, 3])


def test_rmsnorm_formula():
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    w = np.linspace(0.5, 1.5, 8, dtype=np.float32)
    expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(ops.rmsnorm(x, w, 1e-5), expected, rtol=1e-5)


def test_rope_is_a_rotation_that_depends_on_relative_position():
    """q.k after RoPE depends only on the distance between positions."""
    from llama_arch import Config

    c = Config("llama", 32, 1, 2, 2, 16, 64, 10, 128, 1e-5, 10000.0)
    inv = ops.rope_inv_freq(c)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 1, 16)).astype(np.float32)

    def dot(pq: int, pk: int) -> float:
        rq, rk = ops.Rotary(np.array([pq]), inv, 16), ops.Rotary(np.array([pk]), inv, 16)
        return float((rq(q) * rk(k)).sum())

    assert dot(7, 3) == pytest.approx(dot(14, 10), rel=1e-5)
    rotated = ops.Rotary(np.array([5]), inv, 16)(q)
    assert np.linalg.norm(rotated) == pytest.approx(np.linalg.norm(q), rel=1e-6)


def test_rope_matrix_equals_elementwise_rope():
    """Decode applies RoPE as one matrix; a batch applies it elementwise: same numbers."""
    from llama_arch import Config

    for rotary in (None, 48):  # every dim, and partial rotary (phi3): 48 of 64 turn
        c = Config("llama", 64, 1, 4, 2, 64, 64, 10, 128, 1e-5, 10000.0, rotary_dim=rotary)
        inv = ops.rope_inv_freq(c)
        x = np.random.default_rng(1).standard_normal((1, 6, 64)).astype(np.float32)
        one = ops.Rotary(np.array([1234]), inv, 64, scale=1.2)
        batch = ops.Rotary(np.array([1234, 7]), inv, 64, scale=1.2)
        assert one.matrix is not None and batch.matrix is None
        ours = one(x)
        np.testing.assert_allclose(ours, batch(np.concatenate([x, x]))[:1], rtol=0, atol=2e-6)
        if rotary:  # the dims past the rotary ones pass unchanged, unscaled
            assert np.array_equal(ours[..., rotary:], x[..., rotary:])


def test_nope_layers_and_local_layers_take_their_own_rope():
    """smollm3's layers without RoPE turn by angle 0 (exactly the identity); gemma3's
    sliding layers take their own base, unscaled, its global ones rope_theta scaled."""
    from llama_arch import Config, RopeScaling

    c = Config("gemma3", 64, 3, 4, 1, 16, 64, 10, rope_theta=1e6, rope_local_theta=1e4,
               rope_scaling=RopeScaling("linear", 8.0), sliding_window=4,
               sliding_layers=(True, False, True), rope_layers=(True, True, False))  # fmt: skip
    assert [c.layer_rope(i) for i in range(3)] == ["local", "global", "none"]
    x = np.random.default_rng(2).standard_normal((1, 2, 16)).astype(np.float32)
    none = ops.Rotary(np.array([77]), ops.rope_inv_freq(c, "none"), 16)
    assert np.array_equal(none(x), x)
    local = ops.rope_inv_freq(c, "local")
    np.testing.assert_allclose(local, 1 / 1e4 ** (np.arange(0, 16, 2) / 16), rtol=1e-6)
    np.testing.assert_allclose(ops.rope_inv_freq(c), 1 / 1e6 ** (np.arange(0, 16, 2) / 16) / 8,
                               rtol=1e-6)  # fmt: skip


def test_weights_are_never_float64(gqa_dir):
    llm = llama_np.load(gqa_dir[0])
    for w in llm.model.weights.matrices():
        assert isinstance(w, Matrix)
        assert all(a.dtype != np.float64 for a in w.arrays().values())
