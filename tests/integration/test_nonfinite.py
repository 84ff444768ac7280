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


# Every matrix quantized, the LM head too: on the integer kernels, x is rounded to integers
# before every product from the first norm to the logits, so a NaN that reaches any product
# would become finite garbage there (it once did: "!!!!!!!!" and exit 0).
EVERY_KERNEL = ["numpy", "numba-f32", "numba-int16", "numba-int8"]
QUANTIZED = TYPES | {"attn_k": "Q8_0", "attn_v": "Q5_0", "attn_output": "Q4_1", "output": "Q8_0"}
BROKEN = {
    "nan scale": ("blk.1.ffn_down.weight", 208, np.float16(np.nan)),  # Q6_K's d, last layer
    "inf scale": ("blk.0.ffn_gate.weight", 0, np.float16(np.inf)),  # Q4_0's d
    "nan norm": ("blk.0.attn_norm.weight", 4, np.float32(np.nan)),
}


@pytest.fixture(scope="module")
def broken(tmp_path_factory, sp_dir):
    """case -> a fully quantized file with that damage (BROKEN)."""
    d = tmp_path_factory.mktemp("broken")
    size = dict(vocab_size=400, hidden_size=256, intermediate_size=512, bos_token_id=1)
    model = build_hf_model("llama_gqa", d / "hf", **size)
    write_gguf(d / "good.gguf", model, sp_dir / "tokenizer.model", QUANTIZED)
    out = {}
    for case, (name, offset, value) in BROKEN.items():
        tensor = next(t for t in GGUFReader(d / "good.gguf").tensors if t.name == name)
        out[case] = d / f"{case.replace(' ', '_')}.gguf"
        shutil.copy(d / "good.gguf", out[case])
        with open(out[case], "r+b") as f:
            f.seek(int(tensor.data_offset) + offset)
            f.write(value.tobytes())
    return d / "good.gguf", out


@pytest.mark.parametrize("kernels", EVERY_KERNEL)
def test_non_finite_values_never_become_text_in_the_api(broken, kernels):
    """Decode, prefill, batches, perplexity and the bench decoder on every kernel choice:
    each stops with the one error, never a token sampled from garbage; the logits of a
    step hold NaN, never finite numbers made of it."""
    from llama_np.generation.perplexity import perplexity
    from llama_np.model.decoder import Decoder

    good, files = broken
    with llama_np.load(good, kernels=kernels) as llm:  # the sound file: finite all along
        assert llm.generate("Once upon", n_predict=4, temp=0)
        assert all(llm.generate_batch(["Once", "upon a"], n_predict=4, temp=0))
    for case, path in files.items():
        with llama_np.load(path, kernels=kernels) as llm:
            nan = r"hold NaN or infinity"
            with pytest.raises(LlamaNpError, match=nan):
                llm.generate("Once upon", n_predict=4, temp=0)
            with pytest.raises(LlamaNpError, match=nan):
                llm.generate_batch(["Once", "upon a"], n_predict=4, temp=0)
            with pytest.raises(LlamaNpError, match=nan):
                perplexity(llm, "Once upon a time " * 8, ctx=16, stepwise=True, chunks=1)
            cache = llm.new_cache(8)
            llm.logits([1, 5, 9], cache)
            assert not np.isfinite(llm.step(7, cache)).any(), case  # NaN, not numbers
            caches = [llm.new_cache(8), llm.new_cache(8)]
            assert not np.isfinite(llm.model.step_batch(np.array([3, 4]), caches)).any()
            dec = Decoder(llm.model, "f32", None, capacity=8)
            dec.start(0)
            dec.step(3)
            with pytest.raises(LlamaNpError, match=nan):
                dec.check()


@pytest.mark.parametrize("kernels", EVERY_KERNEL)
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_non_finite_values_stop_the_cli_with_one_line(broken, case, kernels, capfd,
                                                      monkeypatch):  # fmt: skip
    """generate, generate -np 2, perplexity and bench: exit 1, one line on stderr, no text."""
    from tests.bench.test_runner import fake_probe

    monkeypatch.setattr("llama_np.cli.measure.probe_for", lambda *a, **k: fake_probe())
    path = str(broken[1][case])
    text = broken[0].parent / "text.txt"
    text.write_text("Once upon a time there was a llama. " * 8)
    runs = [
        ["generate", "-m", path, "-p", "Once", "-n", "4", "--temp", "0"],
        ["generate", "-m", path, "-p", "Once", "-n", "4", "--temp", "0", "-np", "2"],
        ["perplexity", "-m", path, "-f", str(text), "-c", "16", "--stepwise", "--chunks", "1"],
        ["bench", "-m", path, "-p", "4", "-n", "4", "-r", "1"],
    ]
    for args in runs:
        assert main([*args, "--kernels", kernels]) == 1, args
        out, err = capfd.readouterr()
        last = err.strip().splitlines()[-1]  # after the progress bars, if any
        assert out.strip() == "" and last.startswith("llama-np: error:"), (args, err)
        assert "hold NaN or infinity" in last, args
