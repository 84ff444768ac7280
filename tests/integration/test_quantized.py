"""Models in quantized formats: exact to their own weights, close to f32, and written by
`llama-np quantize` so that they load back to the very same logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import llama_np
from llama_np.cli import main
from llama_np.generation.perplexity import perplexity
from llama_np.io.quantize import quantize_checkpoint
from tests.helpers import VOCAB, build_hf_model

QUANT = ["bf16", "f16", "q8_0", "q4_0", "q4_1"]
# Largest |logit - f32 logit| / max |f32 logit| measured on this random model (std 0.1,
# where two layers amplify weight error about six-fold): bf16 0.012, f16 0.0016, q8_0 0.035,
# q4_0 0.53, q4_1 0.48. The bounds leave room; the real model's are in the GGUF tests.
REL_BOUND = {"bf16": 0.03, "f16": 0.005, "q8_0": 0.08, "q4_0": 0.8, "q4_1": 0.8}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """head_dim 32 (so a q8_0 KV cache applies), hidden 128, 40 tokens."""
    d = tmp_path_factory.mktemp("quant_model")
    build_hf_model("llama_head_dim", d, hidden_size=128, intermediate_size=256)
    return d


IDS = np.random.default_rng(1).integers(0, VOCAB, 40).tolist()


@pytest.mark.parametrize("fmt", QUANT)
def test_quantized_model_computes_exactly_its_own_weights(model_dir, fmt):
    """Run natively, a quantized model gives the logits of an f32 model that holds its
    dequantized weights: drift between the two would be a kernel bug, not quantization.
    x in float32 (numba-f32): numba's default rounds x to int16 in decode, which
    test_differential and test_intdot bound."""
    q = llama_np.load(model_dir, weights=fmt, kernels="numba-f32")
    w = q.model.weights
    f = llama_np.load(model_dir, kernels="numba-f32")
    fw = f.model.weights
    convert = f.model.backend.convert  # the f32 model's own layout
    fw.embed = convert(w.embed, "f32")
    fw.lm_head = fw.embed if w.lm_head is w.embed else convert(w.lm_head, "f32")
    for lq, lf in zip(w.layers, fw.layers, strict=True):
        for name in ("wqkv", "wo", "w_gate_up", "w_down"):
            setattr(lf, name, convert(getattr(lq, name), "f32"))
    f.model.weights_changed()  # (load's warm-up packed the decode step's table of the old)
    a, b = q.logits(IDS), f.logits(IDS)
    np.testing.assert_allclose(a, b, atol=1e-4 * np.abs(b).max(), rtol=0)
    cache_q, cache_f = q.new_cache(), f.new_cache()
    for t in IDS[:10]:
        np.testing.assert_allclose(
            q.step(t, cache_q), f.step(t, cache_f), atol=1e-4 * np.abs(b).max(), rtol=0
        )


@pytest.mark.parametrize("fmt", QUANT)
def test_quantized_logits_are_close_to_f32(model_dir, fmt):
    ref = llama_np.load(model_dir).logits(IDS)
    got = llama_np.load(model_dir, weights=fmt).logits(IDS)
    assert np.abs(got - ref).max() <= REL_BOUND[fmt] * np.abs(ref).max()


@pytest.mark.parametrize(("kv", "bound"), [("f16", 0.005), ("q8_0", 0.05)])
def test_kv_cache_formats_are_close_to_f32(model_dir, kv, bound):
    llm = llama_np.load(model_dir)
    ref = llm.logits(IDS)
    cache = llm.new_cache(kv=kv)
    got = np.stack([llm.step(t, cache) for t in IDS])
    assert np.abs(got - ref).max() <= bound * np.abs(ref).max()
    assert cache.nbytes < llm.new_cache().nbytes


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1", "bf16"])
def test_quantize_writes_a_checkpoint_with_the_same_logits(model_dir, tmp_path, fmt):
    out = quantize_checkpoint(model_dir, tmp_path / fmt, fmt)
    loaded = llama_np.load(out)
    leaves = [p for w in loaded.model.weights.matrices() for p in w.leaves()]
    assert {w.fmt for w in leaves} == {fmt}
    a, b = loaded.logits(IDS), llama_np.load(model_dir, weights=fmt).logits(IDS)
    if fmt.startswith("q"):  # rebuilt from the same codes and scales: the very same numbers
        np.testing.assert_array_equal(a, b)
    else:  # bf16 loads memory-mapped: q, k, v stay apart instead of copied together
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())  # rounding
    assert loaded.generate("abc", n_predict=8, temp=0) == llama_np.load(
        model_dir, weights=fmt
    ).generate("abc", n_predict=8, temp=0)


def test_quantize_head_format(model_dir, tmp_path):
    out = quantize_checkpoint(model_dir, tmp_path / "mixed", "q4_0", head="q8_0")
    w = llama_np.load(out).model.weights
    assert w.lm_head.fmt == "q8_0" and w.layers[0].wqkv.fmt == "q4_0"


def test_quantize_refuses_to_overwrite_and_leaves_nothing_when_interrupted(
    model_dir, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "out"
    assert main(["quantize", "-m", str(model_dir), "--to", "q8_0", "-o", str(out)]) == 0
    assert main(["quantize", "-m", str(model_dir), "--to", "q4_0", "-o", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert llama_np.load(out).model.weights.layers[0].wqkv.fmt == "q8_0"

    import llama_np.io.quantize as qmod

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(qmod, "save_file", interrupted)
    assert (
        main(["quantize", "-m", str(model_dir), "--to", "q4_0", "-o", str(tmp_path / "new")]) == 130
    )
    assert (
        main(["quantize", "-m", str(model_dir), "--to", "q4_0", "-o", str(out), "--force"]) == 130
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no partial or temp dirs
    assert llama_np.load(out).model.weights.layers[0].wqkv.fmt == "q8_0"  # the old one is intact
    monkeypatch.undo()
    assert main(["quantize", "-m", str(model_dir), "--to", "q4_0", "-o", str(out), "--force"]) == 0
    assert llama_np.load(out).model.weights.layers[0].wqkv.fmt == "q4_0"


def test_quantize_rejects_unknown_format(model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["quantize", "-m", str(model_dir), "--to", "q3_k", "-o", str(tmp_path / "x")])
    assert e.value.code == 2
    assert "invalid choice: 'q3_k'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_perplexity_matches_transformers(tmp_path):
    """The same windows scored by transformers give the same perplexity."""
    import torch

    ref = build_hf_model("llama_gqa", tmp_path)
    llm = llama_np.load(tmp_path)
    text = (Path(__file__).parents[2] / "data" / "gpl-3.0.txt").read_text(encoding="utf-8")[:3000]
    ours = perplexity(llm, text, ctx=64)
    ids = llm.tokenize(text, bos=False)
    nll, n = 0.0, 0
    for w in range(len(ids) // 63):
        tokens = torch.tensor([[llm.tokenizer.bos_id, *ids[w * 63 : (w + 1) * 63]]])
        with torch.no_grad():
            logp = torch.log_softmax(ref(tokens).logits[0].double(), -1)
        nll -= logp[31:63].gather(1, tokens[0, 32:, None]).sum().item()
        n += 32
    assert ours.scored == n
    assert ours.ppl == pytest.approx(np.exp(nll / n), rel=1e-4)
    assert 1 < ours.ppl < VOCAB * 10
