"""Files with a NaN or an infinity in a tensor: `--check-tensors` names the tensor at load;
without it, the first non-finite logits stop generation with one line (exit 1), never
text sampled from NaN."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from gguf import GGUFReader
from safetensors.numpy import load_file, save_file

import llama_np
from llama_np.cli import main
from llama_np.errors import LlamaNpError
from tests.helpers import build_hf_model, write_gguf

KERNELS = ["numpy", "numba"]
TYPES = {"attn_q": "Q4_K", "ffn_down": "Q6_K", "ffn_up": "Q8_0", "ffn_gate": "Q4_0"}
# (tensor, byte offset of a float16 field in its first block, the value written there)
DAMAGE = {
    "q4_k_nan_d": ("blk.1.attn_q.weight", 0, np.float16(np.nan)),
    "q4_k_inf_dmin": ("blk.1.attn_q.weight", 2, np.float16(np.inf)),
    "q6_k_inf_d": ("blk.0.ffn_down.weight", 208, np.float16(np.inf)),
    "q8_0_nan_d": ("blk.1.ffn_up.weight", 0, np.float16(np.nan)),
    "f32_norm_nan": ("blk.0.attn_norm.weight", 4, np.float32(np.nan)),
}


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory, sp_dir):
    d = tmp_path_factory.mktemp("nonfinite")
    size = dict(vocab_size=400, hidden_size=256, intermediate_size=512, bos_token_id=1)
    model = build_hf_model("llama_gqa", d / "hf", **size)
    write_gguf(d / "good.gguf", model, sp_dir / "tokenizer.model", TYPES)
    return d / "good.gguf"


def damaged(good, tmp_path, case: str):
    """A copy of the file with one field of one tensor overwritten."""
    name, offset, value = DAMAGE[case]
    tensor = next(t for t in GGUFReader(good).tensors if t.name == name)
    path = tmp_path / f"{case}.gguf"
    shutil.copy(good, path)
    with open(path, "r+b") as f:
        f.seek(int(tensor.data_offset) + offset)
        f.write(value.tobytes())
    return path, name


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_check_tensors_names_the_bad_tensor(good_gguf, tmp_path, case, kernels):
    path, name = damaged(good_gguf, tmp_path, case)
    with pytest.raises(LlamaNpError, match=rf"tensor {name} \(\w+\) holds NaN or infinity"):
        llama_np.load(path, kernels=kernels, check_tensors=True)


@pytest.mark.parametrize("kernels", KERNELS)
def test_a_sound_file_passes_the_check(good_gguf, kernels):
    with llama_np.load(good_gguf, kernels=kernels, check_tensors=True) as llm:
        assert llm.generate("Once", n_predict=3, temp=0)


@pytest.mark.parametrize("kernels", KERNELS)
def test_without_the_check_nan_logits_stop_generation(good_gguf, tmp_path, kernels):
    path, _ = damaged(good_gguf, tmp_path, "q4_k_nan_d")
    with llama_np.load(path, kernels=kernels) as llm:  # loads: nothing reads the values
        with pytest.raises(LlamaNpError, match=r"logits of the prompt \(\d+ tokens\) hold NaN"):
            llm.generate("Once upon", n_predict=4, temp=0)


def test_cli_one_line_exit_1_and_no_text(good_gguf, tmp_path, capfd):
    path, name = damaged(good_gguf, tmp_path, "q6_k_inf_d")
    args = ["generate", "-m", str(path), "-p", "Once", "-n", "4", "--temp", "0"]
    assert main([*args, "--check-tensors"]) == 1
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1 and name in err
    assert main(args) == 1  # without the flag: stopped at the first NaN logits
    out, err = capfd.readouterr()
    assert out.strip() == "" and "hold NaN or infinity" in err and err.strip().count("\n") == 0


@pytest.mark.parametrize("kernels", KERNELS)
def test_check_tensors_on_a_safetensors_checkpoint(gqa_dir, tmp_path, kernels):
    src, _ = gqa_dir
    shutil.copytree(src, tmp_path / "m")
    tensors = load_file(tmp_path / "m" / "model.safetensors")
    tensors["model.layers.1.mlp.down_proj.weight"][5, 7] = np.inf
    save_file(tensors, tmp_path / "m" / "model.safetensors")
    with pytest.raises(LlamaNpError, match=r"down_proj.weight holds NaN or infinity at \[5, 7\]"):
        llama_np.load(tmp_path / "m", kernels=kernels, check_tensors=True)


def test_a_nan_at_a_decode_step_names_the_step(gqa_dir, monkeypatch):
    """Non-finite logits after the prompt (here made so at the third step) stop there."""
    with llama_np.load(gqa_dir[0], kernels="numpy") as llm:
        forward, calls = llm.model.forward, []

        def poisoned(tokens, cache, all_logits=False):
            calls.append(len(tokens))
            out = forward(tokens, cache, all_logits)
            return out * np.float32(np.nan) if len(calls) == 4 else out

        monkeypatch.setattr(llm.model, "forward", poisoned)
        pieces = []
        with pytest.raises(LlamaNpError, match=r"logits of decode step 3 \(position \d+\)"):
            for piece in llm.stream("Once", n_predict=10, temp=0):
                pieces.append(piece)
        assert len(calls) == 4  # the prompt, then three steps: nothing sampled from NaN
