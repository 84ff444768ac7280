"""GGUF files written by the gguf package's own writer: every supported tensor type,
llama.cpp's Q/K permutation, and a sentencepiece-style (`llama`) vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

import llama_np
from llama_np.errors import LlamaNpError
from tests.helpers import INT16_WITHIN, build_hf_model, write_gguf

TYPES = {
    "token_embd": "F16", "output": "Q8_0", "attn_q": "Q4_0", "attn_k": "BF16", "attn_v": "Q4_1",
    "attn_output": "Q8_0", "ffn_gate": "Q4_1", "ffn_up": "F16", "ffn_down": "Q4_0",
}  # fmt: skip


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory, sp_dir):
    """(GGUF path, transformers reading that GGUF) for a GQA model with the trained vocab."""
    import torch
    from transformers import AutoModelForCausalLM

    d = tmp_path_factory.mktemp("gguf")
    hf = build_hf_model("llama_head_dim", d / "hf", vocab_size=400, hidden_size=128,
                        intermediate_size=256, bos_token_id=1)  # fmt: skip
    write_gguf(d / "model.gguf", hf, sp_dir / "tokenizer.model", TYPES)
    ref = AutoModelForCausalLM.from_pretrained(d, gguf_file="model.gguf", dtype=torch.float32)
    return d / "model.gguf", ref.eval()


def test_every_tensor_type_loads_in_its_format(gguf_pair):
    llm = llama_np.load(gguf_pair[0])
    w = llm.model.weights
    l0 = w.layers[0]
    got = {
        "token_embd": w.embed.fmt, "output": w.lm_head.fmt, "attn_output": l0.wo.fmt,
        "ffn_down": l0.w_down.fmt,
        # q, k, v (and gate, up) of different formats stay as they are, stacked
        "attn_q+attn_k+attn_v": l0.wqkv.fmt, "ffn_gate+ffn_up": l0.w_gate_up.fmt,
    }  # fmt: skip
    t = {k: v.lower() for k, v in TYPES.items()}
    t["attn_q+attn_k+attn_v"] = "+".join(t.pop(k) for k in ("attn_q", "attn_k", "attn_v"))
    t["ffn_gate+ffn_up"] = "+".join(t.pop(k) for k in ("ffn_gate", "ffn_up"))
    assert got == t


@pytest.mark.parametrize("kernels", ["numpy", "numba-f32", "numba"])
def test_logits_match_transformers_reading_the_same_gguf(gguf_pair, kernels):
    """Within float32 rounding where x stays float32; the native run on numba's default
    kernels within x's rounding to int16 (its products multiply x's integers)."""
    import torch

    path, ref = gguf_pair
    ids = [1, *np.random.default_rng(0).integers(3, 400, 30).tolist()]
    with torch.no_grad():
        theirs = ref(torch.tensor([ids])).logits[0].numpy()
    for weights in ("f32", None):  # dequantized at load, and run natively
        with llama_np.load(path, weights=weights, kernels=kernels) as llm:
            ours = llm.logits(ids)
        within = INT16_WITHIN if kernels == "numba" and weights is None else 1e-4
        np.testing.assert_allclose(ours, theirs, atol=within * np.abs(theirs).max(), rtol=0)


def test_sentencepiece_vocabulary_matches_sentencepiece(gguf_pair, sp_dir):
    import sentencepiece as spm

    from tests.llama_np.io.test_tokenizer import TEXTS

    tok = llama_np.load(gguf_pair[0]).tokenizer
    sp = spm.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))
    for text in TEXTS:
        assert tok.encode(text) == [1, *sp.encode(text)], text
        assert tok.decode(tok.encode(text)) == text


def test_unsupported_tensor_type_is_named(tmp_path, sp_dir):
    hf = build_hf_model("llama_gqa", tmp_path / "hf", vocab_size=400, hidden_size=64)
    write_gguf(tmp_path / "m.gguf", hf, sp_dir / "tokenizer.model", {"ffn_up": "IQ4_NL"})
    with pytest.raises(LlamaNpError, match=r"blk\.0\.ffn_up\.weight.*IQ4_NL.*not supported"):
        llama_np.load(tmp_path / "m.gguf")


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"GGUF" + b"\x00" * 40)
    with pytest.raises(LlamaNpError, match="not a valid GGUF file"):
        llama_np.load(tmp_path / "x.gguf")
