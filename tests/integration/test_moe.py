"""Mixtures of experts beyond the logits (tests/integration/test_reference.py holds each
family to transformers, test_families_gguf.py llama.cpp's files): the router's ties, a
router that sends every token to the same experts against the dense model of those experts,
a batch step against each sequence alone, a prompt in two calls against token by token,
and the meter's count of the experts a step read against the speed-of-light model's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import llama_np
from bench.sol import estimate, experts_read
from llama_arch import Config
from llama_np.model.build import Tensor, build_weights, layer_shapes, layer_tensor_names, role_shape
from llama_np.model.ops import top_k
from llama_np.model.synthetic import random_model
from llama_np.model.transformer import Transformer
from quant.backends import get_backend
from tests.helpers import INT8_WITHIN, INT16_WITHIN, build_hf_model

KERNELS = ["numpy", "numba"]
FAMILIES = ["mixtral", "qwen3_moe", "olmoe", "granitemoe"]
# widths in whole blocks of 32, for the quantized formats
BLOCKS = {"*": dict(hidden_size=64, intermediate_size=64),
          "qwen3_moe": dict(hidden_size=64, head_dim=16, moe_intermediate_size=32)}  # fmt: skip


def test_top_k_ties_go_to_the_lower_expert():
    """Equal probabilities: the lower expert number first, as llama.cpp's CPU sort keeps
    them (torch.topk's order among ties is its own)."""
    logits = np.log(np.array([[0.1, 0.3, 0.3, 0.2, 0.3, 0.1], [1, 1, 1, 1, 1, 1]], np.float32))
    sel, w = top_k(logits, 2, renormalize=True)
    assert sel.tolist() == [[1, 2], [0, 1]]
    np.testing.assert_allclose(w, 0.5, rtol=1e-6)
    sel, w = top_k(logits, 3, renormalize=False)
    assert sel.tolist() == [[1, 2, 4], [0, 1, 2]]
    assert w.dtype == np.float32 and w[1] == pytest.approx([1 / 6] * 3)


def tensors(c: Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random float32 arrays of config c by Hugging Face name, norms perturbed."""
    shapes, out = layer_shapes(c), {}
    for i in range(c.n_layers):
        for role, name in layer_tensor_names(i, c).items():
            shape = role_shape(shapes, role)
            scale = 0.2 if len(shape) == 2 else 0.1
            out[name] = (len(shape) == 1) + scale * rng.standard_normal(shape).astype(np.float32)
    out["model.embed_tokens.weight"] = rng.standard_normal((c.vocab_size, c.dim), np.float32)
    out["lm_head.weight"] = 0.2 * rng.standard_normal((c.vocab_size, c.dim), np.float32)
    out["model.norm.weight"] = np.ones(c.dim, np.float32)
    return out


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize(("arch", "k", "renormalize"), [("mixtral", 1, True),
                         ("mixtral", 2, True), ("olmoe", 3, False)])  # fmt: skip
def test_a_router_of_ties_sends_every_token_to_the_first_k_experts(kernels, arch, k, renormalize):
    """A router of zeros ties every expert: each token goes to experts 0..k-1, each
    weighted 1/k (renormalized) or 1/E, which is the dense model whose MLP is their
    weighted sum; a batch step reads those k experts once."""
    moe = Config(arch, 64, 2, 4, 2, 16, 48, 90, n_experts=6, experts_per_token=k,
                 norm_topk=renormalize, qk_norm="all" if arch == "olmoe" else None)  # fmt: skip
    dense = replace(moe, arch="llama", hidden_dim=48 * k, n_experts=1, experts_per_token=1)
    t = tensors(moe, np.random.default_rng(3))
    weight = np.float32(1 / k if renormalize else 1 / moe.n_experts)
    d = {n: v for n, v in t.items() if ".mlp." not in n}
    for i in range(moe.n_layers):
        p = f"model.layers.{i}.mlp."
        t[p + "gate.weight"][:] = 0
        gate = [t[f"{p}experts.{e}.gate_proj.weight"] for e in range(k)]
        up = [t[f"{p}experts.{e}.up_proj.weight"] for e in range(k)]
        down = [weight * t[f"{p}experts.{e}.down_proj.weight"] for e in range(k)]
        d[p + "gate_proj.weight"] = np.concatenate(gate)
        d[p + "up_proj.weight"] = np.concatenate(up)
        d[p + "down_proj.weight"] = np.concatenate(down, axis=1)
    backend = get_backend(kernels)
    f32 = backend.weight_class("f32")

    def model(c: Config, arrays: dict[str, np.ndarray]) -> Transformer:
        ts: dict[str, Tensor] = {n: f32.from_float(a) if a.ndim == 2 else a
                                 for n, a in arrays.items()}  # fmt: skip
        return Transformer(c, build_weights(c, ts, backend=backend), backend)

    ours, theirs = model(moe, t), model(dense, d)
    tokens = np.array([5, 17, 3, 88, 41, 9])
    a, b = ours.forward(tokens, ours.new_cache(16), all_logits=True), theirs.forward(
        tokens, theirs.new_cache(16), all_logits=True)  # fmt: skip
    np.testing.assert_allclose(a, b, atol=2e-5 * max(1.0, float(np.abs(b).max())), rtol=0)
    caches = [ours.new_cache(16) for _ in range(4)]
    ours.step_batch(np.array([1, 2, 3, 4]), caches)
    assert ours.meter.last.experts == [k] * moe.n_layers  # the batch read k experts a layer


@pytest.mark.parametrize(("fmt", "dim", "width"), [("f32", 37, 53), ("q8_0", 96, 64),
                         ("q4_1", 64, 96), ("q4_k+q6_k", 256, 256)])  # fmt: skip
@pytest.mark.parametrize("tokens", [1, 3, 7])
def test_the_experts_step_agrees_on_every_backend(fmt, dim, width, tokens):
    """The chosen experts' step on the same routes: each chosen expert's product of its
    tokens' rows, weighted, added. The compiled one (one call per layer for several
    tokens: quant.compiled.experts, four vectors at a time and the rest together; a
    stack of two formats) equals the NumPy reference within float32 rounding on float
    weights (odd widths), within x's rounding on quantized ones (x rounded to int16 and
    int8; with float x, CompiledOps.moe takes the grouped products of NumpyOps)."""
    from llama_np.model.ops import NumpyOps, Residual, rmsnorm
    from llama_np.model.ops_compiled import CompiledOps
    from llama_np.model.transformer import Experts
    from quant.ggml import random_blocks
    from quant.stack import StackedWeight

    rng = np.random.default_rng(tokens)
    c = Config("mixtral", dim, 1, 1, 1, 2, width, 10, n_experts=5, experts_per_token=2)
    gate_up = [0.3 * rng.standard_normal((2 * width, dim), np.float32) for _ in range(5)]
    down = [0.3 * rng.standard_normal((dim, width), np.float32) for _ in range(5)]

    def experts(kernels: str) -> Experts:
        backend = get_backend(kernels)

        def weight(f: str, w: np.ndarray, seed: int):  # a K-quant: random blocks
            if f.endswith("_k"):
                raw = random_blocks(f, *w.shape, np.random.default_rng(seed))
                return backend.weight_class(f).from_blocks(w.shape, raw)
            return backend.weight_class(f).from_float(w)

        fmts = fmt.split("+")
        stacked = [weight(fmt, w, e) if len(fmts) == 1 else StackedWeight(
            [weight(fmts[0], w[:width], e), weight(fmts[1], w[width:], e)])
            for e, w in enumerate(gate_up)]  # fmt: skip
        router = backend.weight_class("f32").from_float(np.zeros((5, dim), np.float32))
        return Experts(router, stacked, [weight(fmts[-1], w, 9 + e) for e, w in enumerate(down)])

    x = rng.standard_normal((tokens, dim), np.float32)
    norm = rng.uniform(0.5, 1.5, dim).astype(np.float32)
    sel, w = top_k(rng.standard_normal((tokens, 5), np.float32), 2, renormalize=True)
    post, eps = Residual(None, np.float32(1e-6), 0.5), np.float32(1e-5)  # granite's multiplier
    h = rmsnorm(x, norm, eps)
    ref = NumpyOps().experts(c, x.copy(), h, sel, w, experts("numpy"), post)
    scale = max(1.0, float(np.abs(ref).max()))
    for dot, within in (("f32", 1e-5), ("int16", INT16_WITHIN), ("int8", INT8_WITHIN)):
        if (dot == "f32") != (fmt == "f32"):
            continue  # float weights: x stays float; quantized ones: x in integers here
        ops, ex = CompiledOps(dot), experts(f"numba-{dot}")
        got = ops.chosen_experts(c, x.copy(), norm, eps, sel, w, ex, post)
        assert np.abs(got - ref).max() <= within * scale, dot
        assert dot == "f32" or np.abs(got - ref).max() > 0  # x really was rounded


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each family at widths in whole blocks of 32, its own switches on."""
    d = tmp_path_factory.mktemp("moe")
    for family in FAMILIES:
        build_hf_model(family, d / family, **BLOCKS.get(family, BLOCKS["*"]))
    return {family: d / family for family in FAMILIES}


PROMPTS = [[256, 5, 9, 77], [256, 3, 2, 8, 4, 4, 1, 60, 61, 62, 30], [256, 11], [256, 2, 2, 3]]


def stepped(llm, steps: int, batch: bool) -> list[np.ndarray]:
    """Teacher-forced logits after each prompt and `steps` more tokens per sequence, in
    one batch or each alone: (steps + 1, vocab) per sequence."""
    feeds = [[(7 * i + 3 * s) % 250 for s in range(steps)] for i in range(len(PROMPTS))]
    caches = [llm.new_cache(32) for _ in PROMPTS]
    out = [[llm.logits(p, c)[-1]] for p, c in zip(PROMPTS, caches, strict=True)]
    for s in range(steps):
        if batch:
            logits = llm.model.step_batch(np.array([f[s] for f in feeds]), caches)
        else:
            logits = [llm.step(f[s], c) for f, c in zip(feeds, caches, strict=True)]
        for o, row in zip(out, logits, strict=True):
            o.append(row)
    return [np.stack(o) for o in out]


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("weights", [None, "q8_0", "q4_1"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_step_equals_each_sequence_alone(checkpoints, family, weights, kernels):
    """A batch groups its tokens by expert (each chosen expert's rows once, times all its
    tokens); each sequence gets the logits it gets alone, and the meter counts the union
    of the experts its tokens chose, which the speed-of-light model prices exactly."""
    with llama_np.load(checkpoints[family], kernels=kernels, weights=weights) as llm:
        together = stepped(llm, 6, batch=True)
        step = llm.model.meter.last
        alone = stepped(llm, 6, batch=False)
        c, w = llm.config, llm.model.weights
        est = estimate(c, weights or "f32", kv="f32", pos=step.pos, head=w.lm_head.fmt,
                       embed=w.embed.fmt, kernels=kernels, batch=4,
                       experts=step.experts)  # fmt: skip
    within = INT16_WITHIN if kernels == "numba" and weights else 1e-5
    for a, b in zip(together, alone, strict=True):
        assert np.abs(a - b).max() <= within * max(1.0, float(np.abs(b).max()))
    assert step.sequences == 4 and len(step.experts) == c.n_layers
    assert all(c.experts_per_token <= n <= min(4 * c.experts_per_token, c.n_experts)
               for n in step.experts)  # fmt: skip
    assert step.reads["mlp_weights"] == est.reads["mlp_weights"]  # (the sequences' KV
    # spans differ: their prompts do)


QUANTIZED = Path(__file__).resolve().parents[1] / "fixtures" / "quantized"


@pytest.mark.parametrize("kernels", KERNELS)
def test_k_quant_experts_run_as_stored(kernels):
    """llama.cpp's Q4_K_M of a Mixtral (scripts/gguf_fixtures.py mixtral-q4_k_m: its
    quantizer put the experts' gate and up in Q4_K, down in Q6_K): each expert is the
    file's bytes, as gguf.quants.dequantize reads them, and the logits are those of the
    same weights dequantized at load (numba rounds x to int16: within that rounding)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    path = QUANTIZED / "mixtral-q4_k_m.gguf"
    native = llama_np.load(path, kernels=kernels)
    experts = native.model.weights.layers[0].experts
    assert (experts.gate_up[3].fmt, experts.down[3].fmt) == ("q4_k", "q6_k")
    stacked = {t.name: t for t in GGUFReader(path).tensors}
    for e in range(4):
        t = stacked["blk.0.ffn_down_exps.weight"]
        raw = np.asarray(t.data).reshape(4, int(t.shape[1]), -1)[e]
        assert np.array_equal(experts.down[e].dequantize(), dequantize(raw, t.tensor_type))
    f32 = llama_np.load(path, kernels=kernels, weights="f32")
    ids = [1, 77, 12, 300, 5, 41]
    within = INT16_WITHIN if kernels == "numba" else 2e-4
    a, b = native.logits(ids), f32.logits(ids)
    np.testing.assert_allclose(a, b, atol=within * np.abs(b).max(), rtol=0)
    ca, cb = native.new_cache(16), f32.new_cache(16)
    for t in ids:
        sa, sb = native.step(t, ca), f32.step(t, cb)
        np.testing.assert_allclose(sa, sb, atol=within * max(1.0, np.abs(sb).max()), rtol=0)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_prompt_in_two_calls_equals_token_by_token(checkpoints, family, kernels):
    """The prompt's tokens grouped by expert, in two calls, give the logits of one
    token at a time: 66 tokens (on the compiled backend, one batch product per chosen
    expert: more than PAIRED), then 9 (pairs of token and expert)."""
    ids = np.random.default_rng(5).integers(3, 250, 75).tolist()
    with llama_np.load(checkpoints[family], kernels=kernels) as llm:
        cache = llm.new_cache(80)
        two = np.concatenate([llm.logits(ids[:66], cache), llm.logits(ids[66:], cache)])
        cache = llm.new_cache(80)
        one = np.stack([llm.step(t, cache) for t in ids])
    np.testing.assert_allclose(two, one, atol=1e-5 * max(1.0, float(np.abs(one).max())), rtol=0)


def test_the_expected_experts_of_a_batch_are_near_what_random_routers_choose():
    """Random routers route nearly uniformly: the mean distinct experts per layer of
    batch steps is within 10% of E (1 - (1 - k/E)^B) at B = 4 and 16."""
    c = Config("qwen3_moe", 64, 4, 4, 2, 16, 32, 90, qk_norm="head", n_experts=32,
               experts_per_token=4)  # fmt: skip
    model = random_model(c, "f32", None)
    rng = np.random.default_rng(0)
    for b in (4, 16):
        caches = [model.new_cache(16) for _ in range(b)]
        counts = []
        for _ in range(8):
            model.step_batch(rng.integers(0, 90, b), caches)
            counts += model.meter.last.experts
        assert np.mean(counts) == pytest.approx(experts_read(c, b), rel=0.1), b
