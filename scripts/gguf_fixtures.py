#!/usr/bin/env python3
"""Make the GGUF fixtures of the families (tests/fixtures/families/): for each family a tiny
random checkpoint built and saved by transformers' own classes (bfloat16 safetensors,
config.json, a SentencePiece tokenizer.model trained here), converted to GGUF by
llama.cpp's own converter (convert_hf_to_gguf.py of llama-cpp-python 0.3.36's source, which
scripts/llama_cpp.sh keeps in the cache), --outtype bf16: the GGUF holds the very values
the safetensors do. tests/integration/test_families_gguf.py holds llama-np reading either
file to transformers reading the safetensors.

Each config exercises its family's switches at odd shapes and keeps to what a GGUF can
say (llama.cpp fills in what the file leaves out): query_pre_attn_scalar = head_dim,
Gemma 2's rope_theta 10000, Gemma's default sliding-layer patterns (gemma3: 6 layers, the
sixth global), SmolLM3's NoPE every fourth layer, no window on Qwen3 or Phi-3, OLMo 2 untied
with head_dim = dim / heads, Granite's head_dim = dim / heads.

OLMo 2's, OLMoE's and Qwen3-MoE's converters read only a byte-level BPE tokenizer whose
pre-tokenizer hash they know (a real one: tens of thousands of tokens); for a tiny one the
pre-tokenizer check (get_vocab_base_pre) is replaced by "gpt-2", and nothing else of the
converter.

    .venv/bin/python scripts/gguf_fixtures.py                  # all families, all files
    .venv/bin/python scripts/gguf_fixtures.py gemma3           # one
    .venv/bin/python scripts/gguf_fixtures.py mixtral-q4_k_m   # a K-quant mixture of experts
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "families"
VERSION = "0.3.36"
VOCAB = 320
SEED = 0

# (the hybrids' weights at 0.1, as tests/helpers' models: at 0.2 their recurrence over 40
# tokens amplified float32 rounding until transformers' own float32 logits were 8e-5 from its
# float64 ones, and two float32 summation orders 2e-4 apart)
QWEN3_5 = dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
               initializer_range=0.1,
               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
               linear_value_head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6,
               layer_types=["linear_attention", "full_attention", "linear_attention",
                            "linear_attention"])  # fmt: skip
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4,
              num_key_value_heads=1, max_position_embeddings=256, rms_norm_eps=1e-6,
              initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=None,
              tie_word_embeddings=False)  # fmt: skip
# family: its config's own fields (its transformers classes: llama_arch.families; a name
# with a suffix, -mtp, is its family's)
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3": dict(num_hidden_layers=2, head_dim=24, rope_theta=1e6),
    "gemma2": dict(
        num_hidden_layers=3, head_dim=24, query_pre_attn_scalar=24, sliding_window=8,
        attn_logit_softcapping=2.0, final_logit_softcapping=3.0, rope_theta=10000.0,
        tie_word_embeddings=True),
    "gemma3": dict(
        num_hidden_layers=6, head_dim=24, query_pre_attn_scalar=24, sliding_window=8,
        rope_theta=1e6, rope_local_base_freq=1e4, final_logit_softcapping=3.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, tie_word_embeddings=True),
    "phi3": dict(
        num_hidden_layers=2, hidden_size=96, partial_rotary_factor=0.75,
        original_max_position_embeddings=128, tie_word_embeddings=True,
        rope_scaling={"type": "longrope", "short_factor": [1 + 0.05 * i for i in range(9)],
                      "long_factor": [1 + 0.7 * i for i in range(9)]}),
    "smollm3": dict(num_hidden_layers=4, head_dim=24, rope_theta=5e5),
    "olmo2": dict(num_hidden_layers=2, rope_theta=5e5),
    "granite": dict(
        num_hidden_layers=2, num_key_value_heads=2, embedding_multiplier=6.0,
        attention_multiplier=0.04, residual_multiplier=0.3, logits_scaling=4.0),
    # mixtures of experts, as llama.cpp runs them: mixtral (GGUF architecture llama with
    # experts), qwen3_moe renormalized (llama.cpp always renormalizes it), olmoe not (never)
    # with as many KV heads as heads (its k norm is n_embd wide there) and eps 1e-5 (the
    # converter writes that), granitemoe with one expert a token
    "mixtral": dict(
        num_hidden_layers=2, num_key_value_heads=2, intermediate_size=40, num_local_experts=5,
        num_experts_per_tok=2, rope_theta=1e6, sliding_window=None),
    "qwen3_moe": dict(
        num_hidden_layers=2, head_dim=24, rope_theta=1e6, num_experts=16,
        num_experts_per_tok=4, moe_intermediate_size=20, norm_topk_prob=True),
    "olmoe": dict(
        num_hidden_layers=2, num_key_value_heads=4, rms_norm_eps=1e-5, intermediate_size=24,
        num_experts=7, num_experts_per_tok=3, norm_topk_prob=False, rope_theta=1e4),
    "granitemoe": dict(
        num_hidden_layers=2, num_key_value_heads=2, intermediate_size=40, num_local_experts=4,
        num_experts_per_tok=1, embedding_multiplier=6.0, attention_multiplier=0.04,
        residual_multiplier=0.3, logits_scaling=4.0),
    # the hybrids (transformers 5): Qwen3.5's gated delta net (value heads twice the key
    # heads, as llama.cpp wants k_dim = v_dim and head_dim >= 32) converted --no-mtp, and
    # the same with a multi-token-prediction layer the model must skip; LFM2's short
    # convolutions; OLMo 3's sliding layers with YaRN on the full ones
    "qwen3_5": QWEN3_5,
    "qwen3_5-mtp": QWEN3_5,
    "lfm2": dict(
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, norm_eps=1e-5,
        initializer_range=0.1,
        layer_types=["conv", "full_attention", "conv", "full_attention"], block_ff_dim=72,
        block_multiple_of=16, rope_theta=1e6, tie_word_embeddings=True),
    "olmo3": dict(
        num_hidden_layers=4, num_key_value_heads=2, rms_norm_eps=1e-6, sliding_window=8,
        initializer_range=0.1, rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 5e5,
                                            "factor": 8.0, "original_max_position_embeddings": 32,
                                            "attention_factor": 1 + 0.1 * math.log(8.0)},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 5e5}}),
    # Gemma 4 at tests/helpers' model's shapes: sliding layers of head_dim 16 beside full ones of 32
    # (proportional RoPE, a quarter turned) under a window of 6, the last two layers reading
    # an earlier layer's KV with a double-wide MLP, per-layer embeddings of 8 a layer; the
    # last layers before the shared ones a sliding and a full one (llama.cpp's shared
    # layers read those two, whatever their kind)
    "gemma4": dict(
        hidden_size=48, intermediate_size=40, num_hidden_layers=5, num_attention_heads=2,
        head_dim=16, global_head_dim=32, sliding_window=6, num_kv_shared_layers=2,
        initializer_range=0.1, layer_types=["sliding_attention", "sliding_attention",
                                            "full_attention", "sliding_attention",
                                            "full_attention"],
        use_double_wide_mlp=True, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=VOCAB, final_logit_softcapping=3.0, bos_token_id=2,
        eos_token_id=[1, 106],
        tie_word_embeddings=True, rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                               "partial_rotary_factor": 0.25}}),
}  # fmt: skip
MTP = ("qwen3_5-mtp",)  # converted with its multi-token-prediction layer (the others --no-mtp)
# the converter reads only a byte-level BPE
BYTE_BPE = ("olmo2", "qwen3_moe", "olmoe", "qwen3_5", "qwen3_5-mtp", "lfm2", "olmo3")
# the converter reads only a tokenizer.json: the SentencePiece model's, as Gemma 4's (gemma4_json)
SP_JSON = ("gemma4",)
# files llama.cpp's quantizer makes from the converter's (tests/fixtures/quantized/NAME.gguf):
# name: (family, the config's fields over the family's, llama-quantize's type); rows of 256
QUANTIZED: dict[str, tuple[str, dict[str, Any], str]] = {
    "mixtral-q4_k_m": ("mixtral", dict(hidden_size=256, intermediate_size=256,
                                       num_hidden_layers=1, num_local_experts=4), "Q4_K_M"),
}  # fmt: skip
CORPUS = [
    "Once upon a time there was a little llama who lived in the mountains.",
    "The quick brown fox jumps over the lazy dog 1234567890 times.",
    "Gemma, Qwen, Phi, SmolLM, OLMo and Granite walk into a bar.",
]


def converter() -> Path:
    cache = Path(os.environ.get("LLAMA_NP_CACHE", Path.home() / ".cache" / "llama-np"))
    script = cache / f"llama.cpp-{VERSION}" / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    if not script.is_file():
        sys.exit(f"gguf_fixtures.py: no {script}; run scripts/llama_cpp.sh first")
    return script


def tokenizer(directory: Path) -> Path:
    """A SentencePiece BPE model of VOCAB pieces with byte fallback (what llama.cpp's
    SentencePiece vocabulary reader wants), text kept as it is: no space added in front
    (as Gemma's: its converter writes add_space_prefix false whatever the model says), no
    spaces removed (as llama.cpp's tokenizer keeps them)."""
    import sentencepiece as spm

    (directory / "corpus.txt").write_text("\n".join(CORPUS * 40), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(directory / "corpus.txt"), model_prefix=str(directory / "tokenizer"),
        vocab_size=VOCAB, model_type="bpe", byte_fallback=True, character_coverage=1.0,
        normalization_rule_name="identity", add_dummy_prefix=False,
        remove_extra_whitespaces=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )  # fmt: skip
    return directory / "tokenizer.model"


def byte_bpe(directory: Path) -> None:
    """OLMo 2's, OLMoE's, Qwen3-MoE's: a byte-level BPE tokenizer.json of 256 byte tokens, one merge, <s>, </s>."""
    sys.path.insert(0, str(ROOT))
    from tests.helpers import byte_tokenizer

    byte_tokenizer(directory, eos=True)
    tok = json.loads((directory / "tokenizer.json").read_text())
    tok["model"]["vocab"]["Ġt"] = 258
    tok["model"]["merges"] = [["Ġ", "t"]]
    (directory / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    cfg = json.loads((directory / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    (directory / "tokenizer_config.json").write_text(json.dumps(cfg))


# Gemma 4's special tokens: where the published tokenizer puts them (<pad>, <eos>, <bos>, <unk>,
# the turn markers 105 and 106: eos_token_id [1, 106]), then its other markup at ids of our
# choosing (the converter marks the channel, tool and quote tokens user-defined)
GEMMA4_SPECIAL = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 105: "<|turn>", 106: "<turn|>"}
GEMMA4_MARKUP = ("<|think|>", "<|channel>", "<channel|>", "<|tool>", "<tool|>", "<|tool_call>",
                 "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>', "<|image|>",
                 "<|audio|>", "<|video|>")  # fmt: skip
# Gemma 4's chat template as llama.cpp keeps it (google/gemma-4-31B-it's, in its source)
GEMMA4_TEMPLATE = Path("models") / "templates" / "google-gemma-4-31B-it.jinja"


def gemma4_json(directory: Path, sp_model: Path, size: int, template: Path | None) -> None:
    """Gemma 4's converter reads a tokenizer.json (byte-fallback BPE) and no tokenizer.model:
    `size` tokens laid out as Gemma 4's (its special tokens, GEMMA4_SPECIAL and
    GEMMA4_MARKUP, never split), the SentencePiece model's bytes and pieces in the free ids
    (as many as fit; merges of the pieces kept, in the order SentencePiece learned them),
    then <unusedN> to the end. Spaces made "▁" with no dummy prefix, BOS left to the caller;
    the chat template (a file) as chat_template.jinja."""
    import sentencepiece as spm
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    sp = spm.SentencePieceProcessor(model_file=str(sp_model))
    special = {**GEMMA4_SPECIAL, **dict(enumerate(GEMMA4_MARKUP, start=4))}
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())
              if not (sp.is_control(i) or sp.is_unknown(i))]  # fmt: skip
    free = [i for i in range(size) if i not in special]
    fill = pieces[: len(free)] + [f"<unused{k}>" for k in range(len(free) - len(pieces))]
    vocab = {t: i for i, t in special.items()} | dict(zip(fill, free, strict=True))
    merges = [(p[:k], p[k:]) for p in fill if not p.startswith("<")
              for k in range(1, len(p)) if p[:k] in vocab and p[k:] in vocab]  # fmt: skip
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                               byte_fallback=True))  # fmt: skip
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for _, t in sorted(special.items())])  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    cfg = {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>",
           "extra_special_tokens": ["<|turn>", "<turn|>", *GEMMA4_MARKUP],
           "tokenizer_class": "PreTrainedTokenizerFast"}  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(cfg))
    if template is not None:
        shutil.copy(template, directory / "chat_template.jinja")


def checkpoint(family: str, directory: Path, sp_model: Path, **more: Any) -> None:
    """The family's random model (its fields and `more`), saved by transformers in
    bfloat16; norms and biases moved off their starting values so that a wrong one shows."""
    import torch
    import transformers

    from llama_arch.families import FAMILIES as TABLE

    classes = TABLE[family.removesuffix("-mtp")]
    fields = {**FAMILIES[family], **more}
    if family in BYTE_BPE:  # the byte-level tokenizer's <s> and </s> (tests.helpers)
        fields = {**fields, "bos_token_id": 256, "eos_token_id": 257}
    cfg = getattr(transformers, classes.hf_config)(**{**COMMON, **fields})
    torch.manual_seed(SEED)
    model = getattr(transformers, classes.hf_class)(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or "bias" in n or n.endswith("A_log"):
                p.add_(0.2 * torch.randn_like(p))
        for n, b in model.named_buffers():  # gemma4's layer scalars start at 1
            if n.endswith("layer_scalar"):
                b.mul_(1 + 0.3 * torch.randn_like(b))
    model.to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)
    if family in MTP:
        add_mtp(directory)
    if family in BYTE_BPE:
        byte_bpe(directory)
    elif family in SP_JSON:
        gemma4_json(directory, sp_model, cfg.vocab_size, converter().parent / GEMMA4_TEMPLATE)
    else:
        shutil.copy(sp_model, directory / "tokenizer.model")


def add_mtp(directory: Path) -> None:
    """A Qwen3.5 checkpoint as published, with a multi-token-prediction layer (`mtp.*`,
    which transformers does not load): an attention layer's tensors under mtp.layers.0,
    the projection from embedding and hidden state, its norms; random bfloat16 values."""
    import torch
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    tensors = load_file(path)
    cfg = json.loads((directory / "config.json").read_text())
    full = cfg["layer_types"].index("full_attention")
    g = torch.Generator().manual_seed(SEED)
    for name, t in list(tensors.items()):
        if name.startswith(f"model.layers.{full}."):
            at = name.replace(f"model.layers.{full}.", "mtp.layers.0.")
            tensors[at] = (torch.randn(t.shape, generator=g) * 0.1).to(t.dtype)
    h = cfg["hidden_size"]
    tensors["mtp.fc.weight"] = (torch.randn(h, 2 * h, generator=g) * 0.1).to(torch.bfloat16)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{norm}.weight"] = torch.zeros(h, dtype=torch.bfloat16)
    save_file(tensors, path, metadata={"format": "pt"})
    cfg["mtp_num_hidden_layers"] = 1
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))


# llama.cpp's converter, its pre-tokenizer check replaced (OLMo 2's tiny tokenizer: the module
# docstring says why)
PATCHED = """
import sys
sys.path.insert(0, sys.argv.pop(1))
import convert_hf_to_gguf as conv
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
conv.main()
"""


def convert(family: str, directory: Path, out: Path, script: Path) -> None:
    args = [str(directory), "--outfile", str(out), "--outtype", "bf16"]
    if family.startswith("qwen3_5") and family not in MTP:
        args.append("--no-mtp")
    if family in BYTE_BPE:
        cmd = [sys.executable, "-c", PATCHED, str(script.parent), *args]
    else:
        cmd = [sys.executable, str(script), *args]
    run = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {
        "HF_HUB_OFFLINE": "1"})  # fmt: skip
    if run.returncode:
        sys.exit(f"{family}: the converter failed:\n{run.stderr[-3000:]}")


def quantized(name: str, tmp: Path, sp_model: Path, script: Path) -> None:
    """tests/fixtures/quantized/NAME.gguf: the converter's BF16 file, quantized by
    llama-quantize (scripts/llama_cpp.sh builds it)."""
    family, fields, kind = QUANTIZED[name]
    tool = script.parents[2] / "build-server" / "bin" / "llama-quantize"
    if not tool.is_file():
        sys.exit(f"gguf_fixtures.py: no {tool}; run scripts/llama_cpp.sh first")
    work = tmp / name
    checkpoint(family, work, sp_model, **fields)
    convert(family, work, tmp / f"{name}-bf16.gguf", script)
    dest = OUT.parent / "quantized" / f"{name}.gguf"
    dest.parent.mkdir(exist_ok=True)
    run = subprocess.run([str(tool), str(tmp / f"{name}-bf16.gguf"), str(dest), kind],
                         capture_output=True, text=True)  # fmt: skip
    if run.returncode:
        sys.exit(f"{name}: llama-quantize failed:\n{run.stderr[-3000:]}")
    print(f"{name}: {dest} ({dest.stat().st_size / 1e3:.0f} kB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("families", nargs="*", default=[*FAMILIES, *QUANTIZED])
    a = ap.parse_args()
    script = converter()
    with tempfile.TemporaryDirectory() as tmp:
        sp_model = tokenizer(Path(tmp))
        for family in a.families:
            if family in QUANTIZED:
                quantized(family, Path(tmp), sp_model, script)
                continue
            work = Path(tmp) / family
            checkpoint(family, work, sp_model)
            dest = OUT / family
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            convert(family, work, dest / f"{family}.gguf", script)
            for name in ("config.json", "model.safetensors", "tokenizer.model", "tokenizer.json",
                         "tokenizer_config.json", "chat_template.jinja"):  # fmt: skip
                if (work / name).exists():
                    shutil.copy(work / name, dest / name)
            size = sum(f.stat().st_size for f in dest.iterdir())
            print(f"{family}: {dest} ({size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
