"""A tokenizer from a GGUF vocabulary, built with the tokenizers library.

- `gpt2`: byte-level BPE from tokens and merges, split first by the pre-tokenizer that
  `tokenizer.ggml.pre` names (llama.cpp's regexes, in tokenizers' terms).
- `llama`: sentencepiece-style BPE from tokens and scores, with byte fallback; merges are
  derived from the scores as transformers' SentencePieceExtractor does.
- `gemma4`: sentencepiece-style BPE from tokens and merges (Gemma 4's tokenizer.json), with
  byte fallback: spaces made "▁" (no dummy prefix), the text split only between runs of
  newlines and the rest, as llama.cpp's gemma4 pre-tokenizer does.

Control and user-defined tokens (<|im_start|>, <s>...) are added as special tokens, so the
tokenizer never splits them.

A gemma4 vocabulary's turn and tool-response markers end generation beside its EOS, as llama.cpp
decides by their text (its EOG list): a chat reply ends at <turn|>, which the file names nowhere.
"""

from __future__ import annotations

from typing import Any

from llama_np.errors import LlamaNpError
from llama_np.io.tokenizer import HFTokenizer

# GGUF token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")  # one digit at a time
# what else ends generation in a gemma4 vocabulary (llama.cpp's EOG texts marked gemma4)
GEMMA4_EOG = ("<eos>", "<turn|>", "<|tool_response>")
# llama.cpp pre-tokenizer names -> which of the splits below
PRE_TYPES = {
    "default": "gpt2", "gpt2": "gpt2", "gpt-2": "gpt2", "mpt": "gpt2", "olmo": "gpt2",
    "smollm": "digits", "starcoder": "digits", "refact": "digits", "command-r": "digits",
    "codeshell": "digits", "exaone": "digits",
    "llama-bpe": "llama3", "llama3": "llama3", "llama-v3": "llama3", "qwen2": "qwen2",
}  # fmt: skip


def byte_level_pre_tokenizer(pre: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    kind = PRE_TYPES.get(pre)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if kind == "gpt2":
        return byte_level
    if kind == "digits":  # every digit alone, then GPT-2's regex
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if kind in ("llama3", "qwen2"):
        regex = LLAMA3_REGEX if kind == "llama3" else QWEN2_REGEX
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    raise LlamaNpError(
        f"unsupported GGUF pre-tokenizer {pre!r} (known: {', '.join(sorted(PRE_TYPES))})"
    )


def bpe_merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Merges of a sentencepiece BPE vocabulary: every split of a token into two tokens,
    ordered by the merged token's score (higher merges first)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece, score in zip(tokens, scores, strict=True):
        local = [
            (piece[:k], piece[k:])
            for k in range(1, len(piece))
            if piece[:k] in vocab and piece[k:] in vocab
        ]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend((score, i, m) for i, m in enumerate(local))
    merges.sort(key=lambda x: -x[0])  # stable: ties keep vocabulary order
    return [m for _, _, m in merges]


def gemma4_tokenizer(meta: Any, tokens: list[str]) -> Any:
    """Gemma 4's vocabulary (llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4): BPE by the file's
    merges on raw UTF-8 with byte fallback, spaces escaped as "▁", split into runs of
    newlines and runs of the rest."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", list)]
    unk = meta.get("tokenizer.ggml.unknown_token_id", int, None)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=True,
                               unk_token=None if unk is None else tokens[unk]))  # fmt: skip
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|\n+"), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])  # fmt: skip
    return tok


def tokenizer_from_gguf(meta: Any) -> HFTokenizer | None:
    """The tokenizer of a GGUF file (meta: llama_np.io.gguf.Metadata), or None without one."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    model = meta.get("tokenizer.ggml.model", str, None)
    if model is None:
        return None
    tokens = meta.get("tokenizer.ggml.tokens", list)
    types = meta.get("tokenizer.ggml.token_type", list, [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise LlamaNpError(f"{meta.path}: {len(types)} token types for {len(tokens)} tokens")
    vocab = {t: i for i, t in enumerate(tokens)}
    if model == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", list)]
        ignore = PRE_TYPES.get(meta.get("tokenizer.ggml.pre", str, "default")) == "llama3"
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore))
        tok.pre_tokenizer = byte_level_pre_tokenizer(meta.get("tokenizer.ggml.pre", str, "default"))
        tok.decoder = decoders.ByteLevel()
        add_bos_default = False
    elif model == "llama":
        scores = meta.get("tokenizer.ggml.scores", list)
        unk = meta.get("tokenizer.ggml.unknown_token_id", int, None)
        bpe = models.BPE(
            vocab=vocab,
            merges=bpe_merges_from_scores(tokens, scores),
            unk_token=None if unk is None else tokens[unk],
            fuse_unk=True,
            byte_fallback=True,
        )
        tok = Tokenizer(bpe)
        prefix = meta.get("tokenizer.ggml.add_space_prefix", bool, True)
        # sentencepiece's dummy prefix: always, even before a leading space, and (as in
        # llama.cpp) again after each special token: a normalizer runs per text segment.
        steps_in = [normalizers.Prepend("▁")] if prefix else []
        tok.normalizer = normalizers.Sequence([*steps_in, normalizers.Replace(" ", "▁")])
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
        add_bos_default = True
    elif model == "gemma4":
        tok = gemma4_tokenizer(meta, tokens)
        add_bos_default = True  # llama.cpp adds BOS to a gemma4 vocabulary whatever it says
    else:
        raise LlamaNpError(f"{meta.path}: unsupported GGUF tokenizer model {model!r} (gpt2, "
                           "llama, gemma4)")  # fmt: skip
    special = [tokens[i] for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    bos = meta.get("tokenizer.ggml.bos_token_id", int, None)
    eos = meta.get("tokenizer.ggml.eos_token_id", int, None)
    eos_ids = () if eos is None else (eos,)
    if model == "gemma4":
        eos_ids += tuple(vocab[t] for t in GEMMA4_EOG if t in vocab and vocab[t] != eos)
    return HFTokenizer(
        tok,
        bos_id=bos,
        eos_ids=eos_ids,
        add_bos=meta.get("tokenizer.ggml.add_bos_token", bool, add_bos_default),
        chat_template=meta.get("tokenizer.chat_template", str, None),
    )
