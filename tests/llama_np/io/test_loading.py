"""Loading: memory-mapped safetensors, shards, bf16, pickle refused, shapes checked."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import llama_np
from llama_np.errors import ERRORS, LlamaNpError
from quant.floats import F32Weight
from tests.helpers import VOCAB, build_hf_model, hf_logits


def _is_memmap(a: np.ndarray) -> bool:
    while a is not None:
        if isinstance(a, np.memmap):
            return True
        a = a.base
    return False


def test_f32_weights_are_memory_mapped(gqa_dir):
    """Nothing is copied, not even to stack q, k, v: loading never holds them twice."""
    llm = llama_np.load(gqa_dir[0])
    for w in llm.model.weights.matrices():
        assert all(_is_memmap(a) for a in w.arrays().values()), w
    assert isinstance(llm.model.weights.layers[0].wo, F32Weight)


def test_sharded_checkpoint(tmp_path):
    ref = build_hf_model("llama_gqa", tmp_path / "one")
    ref.save_pretrained(tmp_path / "sharded", max_shard_size="40KB", safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tmp_path / "one" / f, tmp_path / "sharded" / f)
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    ids = list(range(20))
    got = llama_np.load(tmp_path / "sharded").logits(ids)
    np.testing.assert_allclose(got, hf_logits(ref, ids), atol=1e-4, rtol=0)


def test_pickle_checkpoints_are_refused(tmp_path):
    import torch

    ref = build_hf_model("llama_gqa", tmp_path / "src")
    # transformers 5 saves safetensors only: the pickle as 4.x's safe_serialization=False
    # wrote it, torch.save of the state dict
    ref.save_pretrained(tmp_path / "pickle")
    (tmp_path / "pickle" / "model.safetensors").unlink()
    torch.save(ref.state_dict(), tmp_path / "pickle" / "pytorch_model.bin")
    with pytest.raises(LlamaNpError, match="safetensors"):
        llama_np.load(tmp_path / "pickle")
    with pytest.raises(LlamaNpError, match="can execute code"):
        llama_np.load(next((tmp_path / "pickle").glob("*.bin")))


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_tensor_shapes_are_checked_against_the_config(gqa_dir, tmp_path):
    d = _copy(gqa_dir[0], tmp_path / "bad")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        LlamaNpError, match=r"model.layers.0.mlp.gate_proj.weight' has shape \(128, 64\)"
    ):
        llama_np.load(d)


def test_missing_tensor_is_named(gqa_dir, tmp_path):
    d = _copy(gqa_dir[0], tmp_path / "bad")
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LlamaNpError, match=r"no tensor 'model\.layers\.2"):
        llama_np.load(d)


def test_directory_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ERRORS):
        llama_np.load(tmp_path)
    with pytest.raises(LlamaNpError, match="no such file"):
        llama_np.load(tmp_path / "nope")


def test_convert_at_load_to_bf16_is_close(gqa_dir):
    ids = list(range(1, 30))
    f32 = llama_np.load(gqa_dir[0]).logits(ids)
    bf16 = llama_np.load(gqa_dir[0], weights="bf16")
    assert {w.fmt for w in bf16.model.weights.matrices()} == {"bf16"}
    got = bf16.logits(ids)
    assert np.abs(got - f32).max() < 0.05 * np.abs(f32).max()
    assert VOCAB == got.shape[1]
