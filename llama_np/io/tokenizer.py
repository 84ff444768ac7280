"""Tokenizers: sentencepiece `tokenizer.model` and Hugging Face `tokenizer.json`, with the
BOS/EOS rules of the checkpoint's tokenizer_config.json, and a streaming decoder that never
emits half of a multi-byte character."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from llama_np.errors import LlamaNpError


class Tokenizer(ABC):
    bos_id: int | None
    eos_ids: tuple[int, ...]  # any of them ends generation
    add_bos: bool
    chat_template: str | None = None

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def _encode(self, text: str) -> list[int]:
        """Token ids of `text`, no BOS/EOS."""

    @abstractmethod
    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens left out."""

    @abstractmethod
    def token_id(self, piece: str) -> int | None:
        """Id of a token given by its text, e.g. "<|im_end|>"; None if absent."""

    @abstractmethod
    def token_text(self, token: int) -> str:
        """The vocabulary entry of a token id, e.g. "<s>" (as chat templates want it)."""

    def encode(self, text: str, bos: bool | None = None) -> list[int]:
        """Ids of `text`, with BOS first when the checkpoint's tokenizer adds it."""
        ids = self._encode(text)
        add = self.add_bos if bos is None else bos
        if add and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return ids


class SentencePieceTokenizer(Tokenizer):
    def __init__(self, path: Path, cfg: dict[str, Any]) -> None:
        import sentencepiece as spm

        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(path))
        except Exception as e:  # a corrupt file surfaces as RuntimeError, UnicodeDecodeError...
            raise LlamaNpError(f"{path}: not a sentencepiece model ({type(e).__name__})") from None
        bos, eos = self.sp.bos_id(), self.sp.eos_id()
        self.bos_id = bos if bos >= 0 else None
        self.eos_ids = (eos,) if eos >= 0 else ()
        self.add_bos = bool(cfg.get("add_bos_token", True))
        self.chat_template = _template(cfg)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def _encode(self, text: str) -> list[int]:
        return list(self.sp.encode(text))

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode(list(map(int, ids)))

    def token_id(self, piece: str) -> int | None:
        i = self.sp.piece_to_id(piece)
        return None if i == self.sp.unk_id() and piece != self.sp.id_to_piece(i) else i

    def token_text(self, token: int) -> str:
        return self.sp.id_to_piece(token)


class HFTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer`: built from tokenizer.json, or from GGUF vocabularies."""

    def __init__(
        self,
        tok: Any,
        bos_id: int | None,
        eos_ids: tuple[int, ...],
        add_bos: bool | None,
        chat_template: str | None = None,
    ) -> None:
        """add_bos None: the tokenizer's own post-processor decides (tokenizer.json)."""
        self.tok = tok
        self.bos_id, self.eos_ids = bos_id, eos_ids
        self._post = add_bos is None
        self.add_bos = bool(add_bos)
        self.chat_template = chat_template

    @classmethod
    def from_file(cls, path: Path, cfg: dict[str, Any]) -> HFTokenizer:
        from tokenizers import Tokenizer as RustTokenizer

        try:
            tok = RustTokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises plain Exception
            raise LlamaNpError(f"{path}: not a valid tokenizer.json ({e})") from None
        bos, eos = _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
        bos_id = tok.token_to_id(bos) if bos else None
        eos_id = tok.token_to_id(eos) if eos else None
        add_bos = cfg.get("add_bos_token")
        eos_ids = () if eos_id is None else (eos_id,)
        return cls(tok, bos_id, eos_ids, None if add_bos is None else bool(add_bos), _template(cfg))

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def _encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=self._post).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(map(int, ids)), skip_special_tokens=True)

    def token_id(self, piece: str) -> int | None:
        return self.tok.token_to_id(piece)

    def token_text(self, token: int) -> str:
        return self.tok.id_to_token(token)


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as strings or as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _template(cfg: dict[str, Any]) -> str | None:
    t = cfg.get("chat_template")
    if isinstance(t, list):  # a list of named templates: take the default one
        named = [x for x in t if isinstance(x, dict)]
        t = next((x.get("template") for x in named if x.get("name") == "default"), None)
    return t if isinstance(t, str) else None


def _template_file(directory: Path) -> dict[str, Any]:
    """The chat template saved beside tokenizer_config.json (transformers 5 writes it there,
    chat_template.jinja, and reads it before the config's own), as {"chat_template": ...}."""
    jinja, named = directory / "chat_template.jinja", directory / "chat_template.json"
    try:
        if jinja.exists():
            return {"chat_template": jinja.read_text(encoding="utf-8")}
        if named.exists():
            d = json.loads(named.read_text(encoding="utf-8"))
            return {"chat_template": d.get("chat_template")} if isinstance(d, dict) else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LlamaNpError(f"{directory}: a chat template file is not readable ({e})") from None
    return {}


def load_tokenizer(directory: Path) -> Tokenizer | None:
    """The tokenizer of a Hugging Face checkpoint directory; tokenizer.json is preferred."""
    cfg: dict[str, Any] = {}
    cfg_path = directory / "tokenizer_config.json"
    if cfg_path.exists():
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise LlamaNpError(f"{cfg_path}: not a readable JSON file ({e})") from None
        if not isinstance(cfg, dict):
            raise LlamaNpError(f"{cfg_path}: must hold a JSON object")
    cfg = {**cfg, **_template_file(directory)}
    if (directory / "tokenizer.json").exists():
        return HFTokenizer.from_file(directory / "tokenizer.json", cfg)
    if (directory / "tokenizer.model").exists():
        return SentencePieceTokenizer(directory / "tokenizer.model", cfg)
    return None


class StreamDecoder:
    """Turns ids arriving one by one into text pieces that are safe to print.

    Decoding a token alone loses context (sentencepiece drops a word's leading space at the
    start of a text) and may end inside a UTF-8 character. So each new id is decoded with a
    few ids before it, and text is released only once it no longer ends in U+FFFD, the
    mark of an incomplete byte sequence.
    """

    CONTEXT = 5  # ids of left context, as vLLM's incremental detokenizer

    def __init__(self, tokenizer: Tokenizer, context: list[int] | None = None) -> None:
        self.tokenizer = tokenizer
        self.ids = list(context or [])[-self.CONTEXT :]
        self.prefix = 0  # ids[prefix:read] is the context already printed
        self.read = len(self.ids)

    def push(self, token: int) -> str:
        self.ids.append(token)
        return self._release(final=False)

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character is printed as U+FFFD)."""
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        decode = self.tokenizer.decode
        before = decode(self.ids[self.prefix : self.read])
        text = decode(self.ids[self.prefix :])
        if len(text) <= len(before) or (text.endswith("\ufffd") and not final):
            return ""
        # Keep a bounded context so the cost per token stays constant.
        self.prefix, self.read = max(self.prefix, len(self.ids) - self.CONTEXT), len(self.ids)
        self.ids = self.ids[self.prefix :]
        self.read -= self.prefix
        self.prefix = 0
        return text[len(before) :]
