"""The families from GGUF files that llama.cpp's own converter made (tests/fixtures/families,
scripts/gguf_fixtures.py), held to transformers reading the checkpoint they were made from:
the metadata read as llama.cpp reads it, logits within float32 rounding on every kernel
backend (prefill, decode token by token, both files), the same greedy tokens, and the
tokenizer the file holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import llama_np
from tests.helpers import hf_greedy, hf_logits

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
FAMILIES = sorted(p.name for p in FIXTURES.iterdir())
SEQ, TOL = 40, 1e-4


def test_every_family_has_a_fixture():
    assert FAMILIES == ["gemma2", "gemma3", "gemma4", "granite", "granitemoe", "lfm2", "mixtral",
                        "olmo2", "olmo3", "olmoe", "phi3", "qwen3", "qwen3_5", "qwen3_5-mtp",
                        "qwen3_moe", "smollm3"]  # fmt: skip


MOE = ["granitemoe", "mixtral", "olmoe", "qwen3_moe"]


def test_our_reader_parses_the_converters_files_as_the_gguf_package_does():
    """Every fixture's metadata and tensor index, as io.gguf's reader parses them (its
    arrays a slice a part), is GGUFReader's, part for part."""
    from gguf import GGUFReader

    from llama_np.io.gguf import _reader
    from tests.llama_np.io.test_gguf_reader import assert_same_fields

    for family in FAMILIES:
        for path in sorted((FIXTURES / family).glob("*.gguf")):
            assert_same_fields(_reader(path), GGUFReader(path))


@pytest.mark.parametrize("name", MOE)
def test_no_token_is_near_a_routing_tie(name):
    """Each token's k-th and (k+1)-th router probabilities (transformers') differ by more
    than float32 rounding can move them (~1e-7 at these probabilities of ~0.1: logits
    summed in another order), so the tests above compare the same routes."""
    import torch
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(FIXTURES / name, dtype=torch.float32)
    k = ref.config.num_experts_per_tok
    prompt = ids(2)[:8]  # test_greedy_tokens_identical's, and the tokens it generates
    for seq in (ids(1), prompt + hf_greedy(ref, prompt, 24)):
        with torch.no_grad():
            out = ref(torch.tensor([seq]), output_router_logits=True)
        for logits in out.router_logits:
            p = torch.softmax(logits.float(), -1).sort(-1, descending=True).values
            assert (p[:, k - 1] - p[:, k]).min() > 1e-5


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    """(family, its directory, transformers' float32 model of its safetensors)."""
    import torch
    from transformers import AutoModelForCausalLM

    d = FIXTURES / request.param
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                               attn_implementation="eager")  # fmt: skip
    return request.param, d, ref.eval()


def ids(seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 320, SEQ).tolist()


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
def test_the_gguf_gives_transformers_logits(family, kernels):
    name, d, ref = family
    seq = ids(1)
    theirs = hf_logits(ref, seq)
    for path in (d / f"{name}.gguf", d):  # llama.cpp's file, and the checkpoint itself
        with llama_np.load(path, kernels=kernels) as llm:
            assert llm.config.arch == name.removesuffix("-mtp")
            np.testing.assert_allclose(llm.logits(seq), theirs, atol=TOL, rtol=0, err_msg=str(path))
            cache = llm.new_cache(SEQ)
            steps = np.stack([llm.step(t, cache) for t in seq])
            np.testing.assert_allclose(steps, theirs, atol=TOL, rtol=0, err_msg=str(path))


def test_greedy_tokens_identical(family):
    name, d, ref = family
    prompt = ids(2)[:8]
    with llama_np.load(d / f"{name}.gguf", kernels="numba") as llm:
        ours = llm.tokenize(llm.generate(prompt, n_predict=24, temp=0), bos=False)
        stats = llama_np.generation.generate.Stats()
        llm.generate(prompt, n_predict=24, temp=0, stats=stats)
        eos = set(llm.tokenizer.eos_ids) | set(llm.config.eos_ids)
    theirs = hf_greedy(ref, prompt, 24)  # which does not stop at the end of text; ours does
    ends = [i for i, t in enumerate(theirs) if t in eos]
    assert stats.generated == theirs[: ends[0] if ends else 24], ours
    assert stats.stop_reason == ("eos" if ends else "length")


def test_the_metadata_reads_as_llama_cpp_reads_it():
    """What each file says, or leaves to llama.cpp's defaults, in the Config."""
    from dataclasses import replace

    c = {f: llama_np.load(FIXTURES / f / f"{f}.gguf", kernels="numpy").config for f in FAMILIES}
    assert (c["qwen3"].qk_norm, c["qwen3"].head_dim) == ("head", 24)
    assert c["gemma2"].sliding_layers == (True, False, True)  # llama.cpp's pattern of 2
    assert (c["gemma2"].attn_softcap, c["gemma2"].final_softcap) == (2.0, 3.0)
    assert c["gemma2"].attn_scale == pytest.approx(24**-0.5)  # query_pre_attn_scalar: hd
    g3 = c["gemma3"]
    assert g3.sliding_layers == (True,) * 5 + (False,)  # 5 of 6
    assert (g3.rope_local_theta, g3.rope_theta, g3.rope_scaling.factor) == (1e4, 1e6, 8.0)
    assert (c["phi3"].rotary_dim, c["phi3"].rope_scaling.kind) == (18, "longrope")
    assert c["smollm3"].rope_layers == (True, True, True, False)
    assert (c["olmo2"].qk_norm, c["olmo2"].pre_norm, c["olmo2"].post_norm) == ("all", False, True)
    gr = c["granite"]
    assert (gr.embed_scale, gr.residual_scale, gr.logits_scaling) == (6.0, pytest.approx(0.3), 4.0)
    assert gr.attn_scale == pytest.approx(0.04)
    moe = {f: (c[f].n_experts, c[f].experts_per_token, c[f].norm_topk, c[f].hidden_dim)
           for f in MOE}  # fmt: skip
    # llama.cpp renormalizes the k weights of all but OLMoE's, whatever the config said
    assert moe == {"mixtral": (5, 2, True, 40), "qwen3_moe": (16, 4, True, 20),
                   "olmoe": (7, 3, False, 24), "granitemoe": (4, 1, True, 40)}  # fmt: skip
    assert (c["olmoe"].qk_norm, c["qwen3_moe"].qk_norm) == ("all", "head")
    assert c["granitemoe"].logits_scaling == 4.0
    q = c["qwen3_5"]  # the converter's value heads tiled; every fourth layer... as listed
    assert q.layer_types == ("delta", "attention", "delta", "delta")
    assert (q.delta.k_heads, q.delta.v_heads, q.delta.k_dim, q.delta.tiled) == (2, 4, 16, True)
    assert (q.rotary_dim, q.attn_gate, q.n_layers) == (8, True, 4)
    assert c["qwen3_5-mtp"] == replace(q, name="qwen3_5-mtp.gguf")  # its MTP layer skipped
    lf = c["lfm2"]  # the MLP's width as adjusted (2/3 of 72, to a multiple of 16: 48)
    assert (lf.layer_types, lf.conv_kernel, lf.hidden_dim) == (
        ("conv", "attention", "conv", "attention"),
        3,
        48,
    )
    o3 = c["olmo3"]  # llama.cpp: the sliding layers by rope_theta, the full ones by YaRN
    assert o3.arch == "olmo3" and o3.sliding_layers == (True, True, True, False)
    assert (o3.rope_scaling.kind, o3.rope_scaling.factor, o3.rope_local_theta) == (
        "yarn",
        8.0,
        o3.rope_theta,
    )
    g4 = c["gemma4"]  # two head sizes, rope_freqs' 1s as the proportion turned, per layer
    # the MLP's width (twice in the shared KV layers)
    assert (g4.head_dim, g4.global_head_dim, g4.rope_proportion) == (16, 32, 0.25)
    assert g4.sliding_layers == (True, True, False, True, False) and g4.sliding_window == 6
    assert [g4.kv_source(i) for i in range(5)] == [0, 1, 2, 1, 2]  # llama.cpp's, too
    assert (g4.kv_shared, g4.wide_shared_mlp, g4.hidden_dim, g4.ple_dim) == (2, True, 40, 8)
    assert (g4.rope_theta, g4.rope_local_theta, g4.attn_scale) == (1e6, 1e4, 1.0)
    assert g4.rope_freq_factors is None and g4.final_softcap == 3.0


def test_gemma4s_vocabulary_is_its_tokenizer_jsons():
    """The converter's gemma4 vocabulary (tokens and merges of tokenizer.json) encodes as
    the tokenizer.json it came from: spaces as "▁", no dummy prefix, newlines."""
    from tokenizers import Tokenizer

    d = FIXTURES / "gemma4"
    theirs = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok = llama_np.load(d / "gemma4.gguf", kernels="numpy").tokenizer
    for text in ("Once upon a time, the lazy dog 1234 walked ünïcödé.", " two  spaces\n\nx\n"):
        assert tok.encode(text, bos=False) == theirs.encode(text).ids
        assert tok.decode(tok.encode(text, bos=False)) == text
    assert tok.encode("hi")[0] == 2  # BOS, <bos> as in Gemma 4's vocabulary


def test_the_files_sentencepiece_vocabulary_is_sentencepieces():
    """As llama.cpp reads the file: Gemma's converter writes add_space_prefix false; the
    others' write none, and llama.cpp's default for a SentencePiece vocabulary adds the
    space (the tokenizer.model here adds none, so SentencePiece is given it)."""
    import sentencepiece as spm

    text = "Once upon a time, the lazy dog 1234 walked ünïcödé."
    for f, prefix in (("gemma2", ""), ("qwen3", " "), ("phi3", " ")):
        sp = spm.SentencePieceProcessor(model_file=str(FIXTURES / f / "tokenizer.model"))
        tok = llama_np.load(FIXTURES / f / f"{f}.gguf", kernels="numpy").tokenizer
        assert tok.encode(text, bos=False) == sp.encode(prefix + text), f
        assert tok.decode(tok.encode(text, bos=False)) == text


def header_only_gguf(path: Path, arch: str, **keys: int) -> Path:
    """A GGUF file with an architecture's name and a few keys, no tensors to speak of."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    for key, value in keys.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    ("arch", "keys", "says"),
    [
        ("gemma3n", {}, "unsupported GGUF architecture 'gemma3n'"),
        ("nemotron_h", {}, "unsupported GGUF architecture 'nemotron_h'"),
        ("qwen2", {"expert_count": 8}, "a mixture of experts (qwen2.expert_count = 8)"),
        ("qwen2moe", {}, "unsupported GGUF architecture 'qwen2moe'"),
    ],
)
def test_an_architecture_not_run_is_one_line_and_exit_2(tmp_path, capsys, arch, keys, says):
    from llama_np.cli import main

    path = header_only_gguf(tmp_path / "m.gguf", arch, **keys)
    assert main(["generate", "-m", str(path), "-p", "hi", "-n", "1"]) == 2
    err = capsys.readouterr().err
    assert says in err and "qwen3" in err and err.count("\n") == 1  # the supported ones


def test_a_config_json_not_run_is_one_line_and_exit_2(tmp_path, capsys):
    from llama_np.cli import main

    (tmp_path / "config.json").write_text('{"model_type": "gpt_oss", "hidden_size": 64}')
    assert main(["generate", "-m", str(tmp_path), "-p", "hi", "-n", "1"]) == 2
    err = capsys.readouterr().err
    assert "unsupported model_type 'gpt_oss'" in err and "gemma3" in err and err.count("\n") == 1


def test_a_missing_tensor_is_named_as_the_gguf_names_it(tmp_path):
    """A file without one of its family's tensors: the message names the GGUF's tensor
    (blk.0.post_ffw_norm.weight), not a Hugging Face name."""
    import gguf

    src = gguf.GGUFReader(FIXTURES / "gemma2" / "gemma2.gguf")
    w = gguf.GGUFWriter(str(tmp_path / "cut.gguf"), "gemma2")
    for key, field in src.fields.items():
        if key.startswith("gemma2.") or key.startswith("tokenizer.ggml.model"):
            value = field.contents()
            if isinstance(value, float):
                w.add_float32(key, value)
            elif isinstance(value, int):
                w.add_uint32(key, value)
            elif isinstance(value, str):
                w.add_string(key, value)
    for t in src.tensors:
        if t.name != "blk.0.post_ffw_norm.weight":
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(llama_np.errors.LlamaNpError, match=r"'blk\.0\.post_ffw_norm\.weight'"):
        llama_np.load(tmp_path / "cut.gguf", kernels="numpy")


class Field:
    """A GGUF metadata field as the gguf package's reader gives it: an array or a value."""

    def __init__(self, value):
        self.value, self.types = value, [0, 0] if isinstance(value, list) else [0]

    def contents(self):
        return self.value


@pytest.mark.parametrize(
    ("keys", "freqs", "says"),
    [
        ({}, [1.0] * 4 + [2.0] * 12, "rope_freqs is not proportional RoPE over 16"),
        ({}, [1.0] * 8, "rope_freqs is not proportional RoPE over 16"),
        ({"feed_forward_length": [40, 48, 40, 80, 80]}, None, "is not one width"),
        ({"feed_forward_length": [40, 40, 40, 80, 96]}, None, "is not one width"),
        ({"attention.head_count_kv": [1, 2, 1, 1, 2]}, None, "differs between layers"),
        ({"rope.dimension_count_swa": 8}, None, "dimension_count_swa 8 is not the head size 16"),
        ({"rope.dimension_count": 16}, None, "dimension_count 16 is not the head size 32"),
        ({"attention.sliding_window_pattern": [True, False]}, None, "names 2 layers of 5"),
        (
            {"attention.sliding_window_pattern": [True, False, True, True, False]},
            None,
            "layer 3 would read layer 1's KV, not one of its kind",
        ),
        (
            {"attention.sliding_window_pattern": [False, True, True, False, False]},
            None,
            "layer 3 would read layer 2's KV",
        ),
        (
            {"attention.shared_kv_layers": 0, "attention.sliding_window_pattern": [True] * 5},
            None,
            "the last layer sliding",
        ),
        ({"attention.shared_kv_layers": 5}, None, "shared_kv_layers 5 of 5 layers"),
    ],
)
def test_a_gemma4_file_outside_what_runs_is_one_line(keys, freqs, says):
    """What the converter never writes for the models that run (another RoPE, an MLP width
    other than one, or twice it on the shared KV layers, KV heads by layer, shared layers
    that llama.cpp points at a layer of the other kind) is refused in one line naming the
    key."""
    from types import SimpleNamespace

    from llama_np.io.gguf import _reader
    from llama_np.io.gguf_config import Metadata, config_from_gguf

    path = FIXTURES / "gemma4" / "gemma4.gguf"
    reader = _reader(path)
    meta = Metadata(reader, path)
    meta.fields = {**meta.fields, **{f"gemma4.{k}": Field(v) for k, v in keys.items()}}
    tensors = {t.name: t for t in reader.tensors}
    if freqs is not None:
        tensors["rope_freqs.weight"] = SimpleNamespace(data=np.array(freqs, np.float32))
    with pytest.raises(llama_np.errors.LlamaNpError, match=says):
        config_from_gguf(meta, tensors)


def test_gemma4_without_rope_freqs_turns_every_dim():
    """A file without rope_freqs (llama.cpp then turns every dim of the full layers)."""
    from llama_np.io.gguf import _reader
    from llama_np.io.gguf_config import Metadata, config_from_gguf

    path = FIXTURES / "gemma4" / "gemma4.gguf"
    reader = _reader(path)
    tensors = {t.name: t for t in reader.tensors if t.name != "rope_freqs.weight"}
    c = config_from_gguf(Metadata(reader, path), tensors)
    assert (c.rope_proportion, c.global_head_dim, c.rope_freq_factors) == (None, 32, None)
