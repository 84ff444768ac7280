"""Small checkpoints built with transformers' own classes, for the reference tests."""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 258  # 256 byte tokens + <s> + </s>
SP_CORPUS = [
    "Once upon a time there was a little llama who lived in the mountains.",
    "The quick brown fox jumps over the lazy dog 1234567890 times.",
    "Héllo wörld, ça va? Ünïcödé is fün. 日本語のテキストです。",
    "  leading spaces and trailing   ",
    "new\nlines\n\nand\ttabs here",
]
BOS, EOS = 256, 257

# max |logits(integer x) - logits(float x)| / max(1, max |logit|) over a few decode steps
# of the small test models. int8 x (numba-int8): x rounded to int8 per block of 32 moves
# each product by up to 1/254 of the block's largest |x| per value, compounded through
# the layers; about 2x the worst seen in 60 random draws (0.025; the least 0.0057).
INT8_WITHIN = 0.05
# int16 x (numba-int16, numba's default): each value moves by up to 1/32512 of its block's
# largest |x|, 128 times less; 1/32 of INT8_WITHIN (4x slack over 128x; seen: at most
# 2.1e-4 with an f32 KV cache, 2.9e-4 with f16). A q8_0 cache can turn the smallest change
# of a key into a step of its own rounding (a code flips: 0.0059 seen): there the int8
# bound holds for int16 too.
INT16_WITHIN = INT8_WITHIN / 32


def byte_tokenizer(directory: Path, eos: bool = False) -> None:
    """A byte-level BPE tokenizer.json without merges: one token per byte, ids 0-255, so a
    model of VOCAB tokens can be driven with any text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    vocab.update({"<s>": BOS, "</s>": EOS})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(directory / "tokenizer.json"))
    cfg: dict[str, Any] = {"bos_token": "<s>", "add_bos_token": True}
    if eos:
        cfg["eos_token"] = "</s>"
    (directory / "tokenizer_config.json").write_text(json.dumps(cfg))


def sp_tokenizer_json(model_file: Path, directory: Path) -> None:
    """A tokenizer.json (and a tokenizer_config.json naming BOS and EOS) for a sentencepiece
    BPE model, built with the tokenizers library as Llama 2's tokenizer.json is laid out:
    the vocabulary with byte fallback, merges in the order of the merged piece's id (the
    order sentencepiece learned them in), the dummy prefix "▁" prepended and spaces made
    "▁" by the normalizer, BOS added by the post-processor. Its encodings are held against
    sentencepiece's own by the tests that use it."""
    import sentencepiece as spm
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [
        (p[:k], p[k:])
        for i, p in enumerate(pieces)
        if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))
        for k in range(1, len(p))
        if p[:k] in vocab and p[k:] in vocab
    ]  # grouped by the merged piece, in id order
    unk, bos, eos = (pieces[sp.unk_id()], pieces[sp.bos_id()], pieces[sp.eos_id()])
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
         decoders.Strip(" ", 1, 0)]
    )  # fmt: skip
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (unk, bos, eos)])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, sp.bos_id())]
    )
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    cfg = {"bos_token": bos, "eos_token": eos, "unk_token": unk}
    (directory / "tokenizer_config.json").write_text(json.dumps(cfg))


def _byte_of(ch: str) -> int:
    """Inverse of GPT-2's bytes_to_unicode for one character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs[cs.index(ord(ch))]


MODELS: dict[str, dict[str, Any]] = {
    # GQA: 4 query heads share 2 key/value heads
    "llama_gqa": dict(arch="llama", num_attention_heads=4, num_key_value_heads=2),
    # head_dim 32 while hidden/heads = 16
    "llama_head_dim": dict(arch="llama", num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    # tied embeddings, llama3 rope scaling, no GQA
    "llama_tied": dict(
        arch="llama",
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
    # Mistral with a window of 8, much shorter than the 40-token sequences
    "mistral_window": dict(
        arch="mistral", num_attention_heads=4, num_key_value_heads=2, sliding_window=8
    ),
    # saved in bfloat16
    "llama_bf16": dict(
        arch="llama", num_attention_heads=4, num_key_value_heads=2, dtype="bfloat16"
    ),
    # q, k, v biases, rope theta 1e6
    "qwen2": dict(arch="qwen2", num_attention_heads=4, num_key_value_heads=2, rope_theta=1e6),
}
# The families beyond llama's: each switch of the one decoder block at odd shapes (head_dim
# 24 and 256, one KV head, windows shorter than the 40-token sequences).
FAMILIES: dict[str, dict[str, Any]] = {
    # q and k normed per head before RoPE, head_dim 24 (not dim / heads), one KV head
    "qwen3": dict(arch="qwen3", num_attention_heads=4, num_key_value_heads=1, head_dim=24,
                  rope_theta=1e6),
    # the window on the layers from max_window_layers on only
    "qwen3_window": dict(arch="qwen3", num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, use_sliding_window=True, sliding_window=8,
                         max_window_layers=1),
    # (1 + w) norms before and after attention and the MLP, GeGLU, sqrt(dim) embeddings,
    # query_pre_attn_scalar, both soft-caps biting, every other layer under a window of 8
    "gemma2": dict(arch="gemma2", num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=1, head_dim=24, query_pre_attn_scalar=32,
                   sliding_window=8, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                   tie_word_embeddings=True),
    # q and k norms, head_dim 256, local layers (their own rope base) and global ones
    # (rope_theta, linear scaling) in a pattern of 3
    "gemma3": dict(arch="gemma3", num_hidden_layers=6, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                   sliding_window=8, sliding_window_pattern=3, rope_theta=1e6,
                   rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0},
                   final_logit_softcapping=3.0, tie_word_embeddings=True),
    # partial rotary (18 of 24 dims), longrope (short factors within 128 positions),
    # fused qkv and gate_up, tied embeddings
    "phi3": dict(arch="phi3", hidden_size=96, num_attention_heads=4, num_key_value_heads=1,
                 partial_rotary_factor=0.75, original_max_position_embeddings=128,
                 rope_scaling={"type": "longrope", "short_factor": [1 + 0.05 * i for i in range(9)],
                               "long_factor": [1 + 0.7 * i for i in range(9)]},
                 tie_word_embeddings=True),
    # every other layer without RoPE (NoPE), head_dim 24
    "smollm3": dict(arch="smollm3", num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=1, head_dim=24, no_rope_layer_interval=2,
                    rope_theta=5e5),
    # the window on the NoPE layers only
    "smollm3_window": dict(arch="smollm3", num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=2, no_rope_layer_interval=2,
                           use_sliding_window=True, sliding_window=8),
    # no norms before, norms after attention and the MLP, q and k normed over the whole
    # projection, head_dim 24
    "olmo2": dict(arch="olmo2", num_attention_heads=4, num_key_value_heads=1, head_dim=24),
    # the embedding, attention, residual and logits multipliers
    "granite": dict(arch="granite", num_attention_heads=4, num_key_value_heads=2,
                    embedding_multiplier=6.0, attention_multiplier=0.04,
                    residual_multiplier=0.3, logits_scaling=4.0),
    # mixtures of experts (E experts, k per token): mixtral's w1/w3/w2 names, weights
    # renormalized; qwen3_moe's per-head q/k norms and moe_intermediate_size, not
    # renormalized (its norm_topk_prob default); olmoe's whole-projection q/k norms,
    # renormalized; granitemoe's 3-D expert tensors, top-k of the logits, the multipliers
    "mixtral": dict(arch="mixtral", num_attention_heads=4, num_key_value_heads=2,
                    intermediate_size=40, num_local_experts=5, num_experts_per_tok=2,
                    sliding_window=None),
    "qwen3_moe": dict(arch="qwen3_moe", num_attention_heads=4, num_key_value_heads=1,
                      head_dim=24, num_experts=16, num_experts_per_tok=4,
                      moe_intermediate_size=20, norm_topk_prob=False),
    "olmoe": dict(arch="olmoe", num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=24, num_experts=7, num_experts_per_tok=3,
                  norm_topk_prob=True),
    "granitemoe": dict(arch="granitemoe", num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=40, num_local_experts=9, num_experts_per_tok=3,
                       embedding_multiplier=6.0, attention_multiplier=0.04,
                       residual_multiplier=0.3, logits_scaling=4.0),
    # hybrids: Qwen3.5's gated delta net beside its gated attention (every layer type in one
    # model; head_dim 24, a quarter of it turned; delta key heads of 12 and value heads of
    # 20, twice as many), decay rates and the state carried over 40 tokens
    "qwen3_5": dict(arch="qwen3_5", num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=24, linear_num_key_heads=2,
                    linear_num_value_heads=4, linear_key_head_dim=12, linear_value_head_dim=20,
                    layer_types=["linear_attention", "full_attention", "linear_attention",
                                 "linear_attention"], rms_norm_eps=1e-6),
    # LFM2's short convolutions beside attention with per-head q and k norms; its MLP width
    # from block_ff_dim (2/3 of 96, to a multiple of 16: 64)
    "lfm2": dict(arch="lfm2", num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 layer_types=["conv", "full_attention", "conv", "full_attention"],
                 norm_eps=1e-5, block_ff_dim=96, block_multiple_of=16),
    # OLMo 3: three layers under a window of 8, then a full one with YaRN (16 of the 40
    # positions past its original context)
    "olmo3": dict(arch="olmo3", num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, sliding_window=8, rope_parameters={
                      "full_attention": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0,
                                         "original_max_position_embeddings": 24,
                                         "beta_fast": 16, "beta_slow": 1},
                      "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
    # Gemma 4: sliding layers of head_dim 16 beside full ones of 32 (proportional RoPE, a
    # quarter turned, their own base) under a window of 6, the last two layers reading the
    # KV of the last earlier one of their kind with a double-wide MLP, per-layer
    # embeddings of 8 a layer, v normed, the logits soft-capped
    "gemma4": dict(arch="gemma4", hidden_size=48, intermediate_size=40, num_hidden_layers=5,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                   global_head_dim=32, sliding_window=6, num_kv_shared_layers=2,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                "sliding_attention", "full_attention"],
                   use_double_wide_mlp=True, hidden_size_per_layer_input=8,
                   vocab_size_per_layer_input=VOCAB, final_logit_softcapping=3.0,
                   rope_parameters={
                       "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                       "full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                                          "partial_rotary_factor": 0.25}}),
}  # fmt: skip
MODELS |= FAMILIES


def hf_classes(arch: str) -> tuple[Any, Any]:
    """transformers' (model class, config class) of an architecture (llama_arch's table)."""
    import transformers

    from llama_arch.families import FAMILIES as TABLE

    f = TABLE[arch]
    return getattr(transformers, f.hf_class), getattr(transformers, f.hf_config)


def build_hf_model(name: str, directory: Path, seed: int = 0, **overrides: Any):
    """Save a random transformers model `name` (see MODELS) to `directory`; return it in
    float32 (eval mode) as the reference."""
    import torch

    spec = {**MODELS[name], **overrides}
    arch, dtype = spec.pop("arch"), spec.pop("dtype", "float32")
    # the plain implementations: eager attention, and each expert's own product (transformers
    # 5's default grouped_mm refuses the odd widths here on CPU: "strides should be multiple
    # of 16 bytes")
    eager = dict(attn_implementation="eager", experts_implementation="eager")
    base = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
        initializer_range=0.1, bos_token_id=BOS, eos_token_id=None, pad_token_id=None,
        tie_word_embeddings=False, **eager,
    )  # fmt: skip
    base.update(spec)
    cls, cfg_cls = hf_classes(arch)
    with _any_width(cfg_cls, base["hidden_size"] % base["num_attention_heads"] != 0):
        torch.manual_seed(seed)
        model = cls(cfg_cls(**base)).eval()
        with torch.no_grad():  # norms start at 1 (Gemma's at 0), biases at 0: perturb them
            for n, p in model.named_parameters():  # so that a wrong one shows
                if "norm" in n or "bias" in n:
                    p.add_(0.2 * torch.randn_like(p))
            for n, b in model.named_buffers():  # gemma4's layer scalars start at 1
                if n.endswith("layer_scalar"):
                    b.mul_(1 + 0.3 * torch.randn_like(b))
        directory.mkdir(parents=True, exist_ok=True)
        model.to(getattr(torch, dtype)).save_pretrained(directory, safe_serialization=True)
        byte_tokenizer(directory)
        ref = cls.from_pretrained(directory, dtype=torch.float32, **eager)
    return ref.eval()


def _any_width(cfg_cls: Any, odd: bool) -> Any:
    """transformers 5's llama, gemma2 and gemma3 configs refuse a hidden size that is not a
    multiple of the head count even when head_dim is given (validate_architecture, run when
    a config is made, saved or read), though their models run that shape (q_proj: hidden ->
    heads x head_dim, o_proj back) as 4.x's did, and llama-np loads it. For such a shape
    (odd), the config's class validators are off while the model is built, saved and read
    back; each field is still checked as it is set."""
    from unittest import mock

    if not odd:
        return contextlib.nullcontext()
    return mock.patch.object(cfg_cls, "validate", lambda self: None)


def hf_logits(model: Any, ids: list[int]):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def hf_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()


@functools.cache
def hf_greedy_logits(model: Any, ids: tuple[int, ...], n: int) -> tuple[list[int], Any]:
    """transformers' n greedy tokens after ids and its logits of the whole sequence, once
    per model and prompt (a real model's tests compare both kernel backends with them)."""
    theirs = hf_greedy(model, list(ids), n)
    return theirs, hf_logits(model, [*ids, *theirs])


def sp_vocab(model_file: Path) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and GGUF token types of a sentencepiece model."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        kind = 2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1
        types.append(kind)
    return tokens, scores, types


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Q/K rows (for its RoPE layout)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


GGUF_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
GGUF_LAYER = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}  # fmt: skip


def gguf_names(n_layers: int) -> dict[str, str]:
    """HF tensor name -> GGUF tensor name, as llama.cpp's converter writes them."""
    names = dict(GGUF_GLOBAL)
    for i in range(n_layers):
        for kind in ("weight", "bias"):
            names |= {
                f"model.layers.{i}.{k}.{kind}": f"blk.{i}.{v}.{kind}" for k, v in GGUF_LAYER.items()
            }
    return names


def write_gguf(path: Path, model: Any, sp_model: Path, types: dict[str, str]) -> None:
    """Write a transformers Llama or Qwen2 model and a sentencepiece vocabulary as a GGUF
    file with the gguf package's writer, as llama.cpp's converter lays it out. `types` maps
    a GGUF tensor-name suffix (e.g. "attn_q") to a GGML type: one gguf.quants can quantize
    to (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), or a K-quant, whose blocks are then
    random (gguf.quants cannot quantize to them) with float16 scales of ~1e-3."""
    import gguf
    from gguf.quants import quantize

    from quant.ggml import random_blocks

    c = model.config
    arch = c.model_type
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])  # transformers 5: no c.rope_theta
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    tokens, scores, token_types = sp_vocab(sp_model)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(token_types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
    names = gguf_names(c.num_hidden_layers)
    rng = np.random.default_rng(0)
    for hf_name, gguf_name in names.items():
        if hf_name not in sd:
            continue
        t = sd[hf_name]
        kind = gguf_name.split(".")[-2]
        if arch == "llama" and kind == "attn_q":
            t = llama_cpp_permute(t, c.num_attention_heads)
        elif arch == "llama" and kind == "attn_k":
            t = llama_cpp_permute(t, c.num_key_value_heads)
        name = types.get(kind, "F32") if t.ndim == 2 else "F32"
        qtype = gguf.GGMLQuantizationType[name]
        if name.endswith("_K"):
            data = random_blocks(name.lower(), t.shape[0], t.shape[1], rng)
        elif name.startswith("IQ"):  # a type llama-np does not read: zero blocks
            block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
            data = np.zeros((t.shape[0], t.shape[1] // block * nbytes), np.uint8)
        else:
            data = quantize(t, qtype)
        w.add_tensor(gguf_name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_weight(cls: Any, shape: tuple[int, int], rng: np.random.Generator) -> Any:
    """A matrix of this Weight class: quantized from Gaussian values, or, for the
    K-quants (which nothing here quantizes to), random stored blocks."""
    from quant.ggml import LAYOUTS, random_blocks

    if cls.fmt in LAYOUTS and cls.fmt.endswith("_k"):
        return cls.from_blocks(shape, random_blocks(cls.fmt, *shape, rng))
    return cls.from_float(rng.standard_normal(shape).astype(np.float32))


def fits(fmt: str, shape: tuple[int, int]) -> bool:
    """Whether a (rows, cols) matrix can be stored in fmt (K-quants: cols % 256 == 0)."""
    return not fmt.endswith("_k") or shape[1] % 256 == 0


def backends_and_prompts(metafunc, prompts: list[str]) -> None:
    """Parametrization of a real model's tests: every test on both kernel backends; those
    driven by a prompt run every prompt on the compiled backend and the first one on the
    NumPy reference, whose quantized products are ~5x slower (CI time: 28 minutes with
    every prompt on both)."""
    if "kernels" not in metafunc.fixturenames:
        return
    if "prompt" not in metafunc.fixturenames:
        metafunc.parametrize("kernels", ["numpy", "numba"], scope="module")
        return
    cases = [("numpy", prompts[0])] + [("numba", p) for p in prompts]
    metafunc.parametrize(("kernels", "prompt"), cases, scope="module",
                         ids=[f"{k}-{p}" for k, p in cases])  # fmt: skip


class CompilerCheck:
    """A check of what the compiler makes of the kernels (their types, the bits of two
    compile orders), which takes minutes of compiling anew and whose outcome is fixed by
    the kernels' sources, numba's version (the kernel cache's key), this CPU and the test
    files it names. It runs on every run and records its pass; a contributor's repeated
    local runs may set LLAMA_NP_SKIP_PASSED=1 to skip it, saying so, where it passed for all
    of those. CI and the default run never skip it."""

    def __init__(self, name: str, *files: str) -> None:
        import hashlib
        import platform
        import sys

        from quant.compiled.jit import cache_folder

        h = hashlib.sha256(f"{sys.version}{platform.machine()}".encode())
        flags = Path("/proc/cpuinfo")
        if flags.is_file():
            h.update(next((l for l in flags.read_text().splitlines() if l.startswith("flags")),
                          "").encode())  # fmt: skip
        for f in files:
            h.update((Path(__file__).parent / f).read_bytes())
        self.mark = cache_folder() / "checked" / f"{name}-{h.hexdigest()[:16]}"

    def skip_if_passed(self, *parts: str) -> None:
        """With LLAMA_NP_SKIP_PASSED=1, skip the test where the check (each of its parts)
        has passed before."""
        import os

        import pytest

        if os.environ.get("LLAMA_NP_SKIP_PASSED") and all(self.passed(p) for p in parts or [""]):
            pytest.skip(f"passed for these kernel sources, numba, CPU and tests ({self.mark}); "
                        "LLAMA_NP_SKIP_PASSED is set")  # fmt: skip

    def passed(self, part: str = "") -> bool:
        return Path(f"{self.mark}{part}").is_file()

    def record(self, part: str = "") -> None:
        """Called once the check has passed."""
        self.mark.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{self.mark}{part}").write_text("passed\n")


def all_cores() -> int:
    """The cores a process may use (quant.host.usable_cores as it was before share_cores
    gave this worker its share): a process a test starts gets them all."""
    from quant import host

    return (_ALL_CORES or host.usable_cores)()


_ALL_CORES = None  # quant.host.usable_cores itself, once share_cores has replaced it


def cores_share() -> int:
    """The usable cores over the test workers (pytest-xdist's PYTEST_XDIST_WORKER_COUNT;
    all of them in one process)."""
    import os

    return max(1, all_cores() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))


def share_cores() -> None:
    """This process's threads limited to its share of the usable cores (cores_share;
    tests/conftest.py's pytest_configure): BLAS's, torch's once imported (and a started
    process's BLAS), numba's; and the threads a model, a probe or a command takes by
    default (quant.host.usable_cores: the share, where a model's load set numba's team to
    all the cores again, two teams spinning at their barriers for each other's threads).
    numba's own NUMBA_NUM_THREADS is left as it is: the tests that ask for more threads
    than the share get them, and numba refuses a changed one once its threads run."""
    import os
    import sys

    from threadpoolctl import threadpool_limits

    import quant.host

    global _ALL_CORES
    n, _ALL_CORES = cores_share(), quant.host.usable_cores
    for module in [quant.host, *sys.modules.values()]:
        if getattr(module, "usable_cores", None) is _ALL_CORES:
            module.usable_cores = lambda: n
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(n)
    threadpool_limits(n)  # this process's BLAS (already loaded with NumPy)
    try:
        import numba
    except ImportError:
        return
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
