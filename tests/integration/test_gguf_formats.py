"""The GGUF formats people have: q5_0, q5_1 and the K-quants, in llama and qwen2 files
written by the gguf package's writer, run natively on both kernel backends."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

import llama_np
from quant import FORMATS, QuantError
from tests.helpers import INT16_WITHIN, build_hf_model, write_gguf

# Every row length a multiple of 256 (hidden 256, intermediate 512): K-quants fit.
TYPES = {
    "token_embd": "Q5_0", "output": "Q6_K", "attn_q": "Q4_K", "attn_k": "Q5_K",
    "attn_v": "Q3_K", "attn_output": "Q2_K", "ffn_gate": "Q5_1", "ffn_up": "Q4_K",
    "ffn_down": "Q6_K",
}  # fmt: skip
KERNELS = ["numpy", "numba"]


@pytest.fixture(scope="module")
def files(tmp_path_factory, sp_dir):
    """A llama and a qwen2 model in these formats; the qwen2 one also in F32 (exact)."""
    d = tmp_path_factory.mktemp("ggml")
    size = dict(vocab_size=400, hidden_size=256, intermediate_size=512, bos_token_id=1)
    llama = build_hf_model("llama_gqa", d / "llama", **size)
    qwen = build_hf_model("qwen2", d / "qwen", **size)
    write_gguf(d / "llama.gguf", llama, sp_dir / "tokenizer.model", TYPES)
    write_gguf(d / "qwen.gguf", qwen, sp_dir / "tokenizer.model", TYPES)
    write_gguf(d / "qwen_f32.gguf", qwen, sp_dir / "tokenizer.model", {})
    return d, qwen


IDS = [1, *np.random.default_rng(0).integers(3, 400, 24).tolist()]


@pytest.mark.parametrize("kernels", KERNELS)
def test_qwen2_gguf_gives_transformers_logits(files, kernels):
    """A qwen2 GGUF (biases, no Q/K permutation) in float32: transformers' logits."""
    from tests.helpers import hf_logits

    d, qwen = files
    llm = llama_np.load(d / "qwen_f32.gguf", kernels=kernels)
    assert llm.config.arch == "qwen2" and llm.config.qkv_bias
    theirs = hf_logits(qwen, IDS)
    np.testing.assert_allclose(llm.logits(IDS), theirs, atol=1e-4 * np.abs(theirs).max(), rtol=0)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("model", ["llama", "qwen"])
def test_every_format_runs_natively_as_its_own_values(files, model, kernels):
    """Each tensor stays in its format; the logits, in a batch and token by token, are
    those of the same weights dequantized to f32 at load (token by token, numba's default
    rounds x to int16: within that rounding)."""
    d, _ = files
    native = llama_np.load(d / f"{model}.gguf", kernels=kernels)
    f32 = llama_np.load(d / f"{model}.gguf", weights="f32", kernels=kernels)
    w, l0 = native.model.weights, native.model.weights.layers[0]
    assert (w.embed.fmt, w.lm_head.fmt, l0.wo.fmt, l0.w_down.fmt) == (
        "q5_0",
        "q6_k",
        "q2_k",
        "q6_k",
    )
    assert l0.wqkv.fmt == "q4_k+q5_k+q3_k" and l0.w_gate_up.fmt == "q5_1+q4_k"
    a, b = native.logits(IDS), f32.logits(IDS)
    np.testing.assert_allclose(a, b, atol=2e-4 * np.abs(b).max(), rtol=0)
    ca, cb = native.new_cache(), f32.new_cache()
    within = INT16_WITHIN if kernels == "numba" else 2e-4
    for t in IDS[:8]:
        sa, sb = native.step(t, ca), f32.step(t, cb)
        np.testing.assert_allclose(sa, sb, atol=within * max(1.0, np.abs(sb).max()), rtol=0)


@pytest.mark.parametrize("kernels", KERNELS)
def test_stored_tensors_are_read_bit_for_bit(files, kernels):
    """Our reading of every tensor equals gguf.quants.dequantize of the file's bytes."""
    from quant.backends import get_backend

    d, _ = files
    backend = get_backend(kernels)
    for t in GGUFReader(d / "llama.gguf").tensors:
        if t.name.startswith("blk.1") or len(t.shape) != 2:
            continue
        fmt = t.tensor_type.name.lower()
        shape = (int(t.shape[1]), int(t.shape[0]))
        raw = np.asarray(t.data).reshape(shape[0], -1)
        ours = backend.weight_class(fmt).from_blocks(shape, raw).dequantize()
        assert np.array_equal(ours, dequantize(raw, t.tensor_type)), t.name


def test_k_quant_rows_must_hold_whole_super_blocks():
    with pytest.raises(QuantError, match=r"q4_k: the row length 300 is not a multiple of 256"):
        FORMATS["q4_k"].from_blocks((2, 300), np.zeros((2, 144), np.uint8))


def test_k_quants_cannot_be_quantized_to():
    with pytest.raises(QuantError, match="quantizing to K-quants is not supported"):
        FORMATS["q4_k"].from_float(np.ones((2, 256), np.float32))
