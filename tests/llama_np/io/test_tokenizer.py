"""Tokenizers against sentencepiece and the tokenizers library, and streaming."""

from __future__ import annotations

import json

import pytest

from llama_np.io.tokenizer import HFTokenizer, SentencePieceTokenizer, StreamDecoder, load_tokenizer

TEXTS = [
    "Once upon a time",
    "The llama ate 42 apples on 2024-01-15.",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "line one\nline two\n\nline four",
    "digits 0123456789 and 3.14159",
    "multi-byte: héllo, 日本語, emoji 🦙🚀, Ω≈ç√",
    "unseen characters: ₿ ∮ 𝔘",
]


@pytest.fixture(scope="module")
def sp(sp_dir):
    """sentencepiece itself: the reference for ids, text, leading spaces, BOS and bytes."""
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))


@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_ids_and_text_match_sentencepiece(sp_dir, sp, text):
    ours = SentencePieceTokenizer(sp_dir / "tokenizer.model", {})
    ids = ours.encode(text)
    assert ids == [sp.bos_id(), *sp.encode(text)]
    assert ours.decode(ids) == text
    assert ours.decode(ids) == sp.decode(ids)


def test_leading_spaces_keep_the_dummy_prefix(sp_dir, sp):
    """sentencepiece prepends "▁" even before a leading space: " x" is not "x", and both
    decode back exactly (transformers 5's LlamaTokenizer loses this; DEVELOPERS.md)."""
    ours = SentencePieceTokenizer(sp_dir / "tokenizer.model", {})
    for text in ("leading space", " leading space", "  two leading spaces"):
        ids = ours.encode(text, bos=False)
        assert sp.id_to_piece(ids[0]).startswith("▁")
        assert ids == sp.encode(text) and ours.decode(ids) == text
    assert ours.encode(" leading space") != ours.encode("leading space")


def test_bos_follows_tokenizer_config(sp_dir):
    ours = SentencePieceTokenizer(sp_dir / "tokenizer.model", {"add_bos_token": False})
    assert ours.encode("hi")[0] != 1
    assert ours.encode("hi", bos=True)[0] == 1
    assert ours.eos_ids == (2,)


@pytest.fixture(scope="module")
def json_dir(sp_dir, tmp_path_factory):
    """The same vocabulary as a tokenizer.json, built with the tokenizers library."""
    from tests.helpers import sp_tokenizer_json

    d = tmp_path_factory.mktemp("tokjson")
    sp_tokenizer_json(sp_dir / "tokenizer.model", d)
    return d


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_json_matches_sentencepiece_and_tokenizers(json_dir, sp, text):
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(str(json_dir / "tokenizer.json"))
    ours = load_tokenizer(json_dir)
    assert isinstance(ours, HFTokenizer)
    ids = ours.encode(text)
    assert ids == [sp.bos_id(), *sp.encode(text)]
    assert ids == ref.encode(text).ids  # BOS from the post-processor
    assert ours.decode(ids) == text
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True) == sp.decode(ids)
    assert ours.bos_id == sp.bos_id() and ours.eos_ids == (sp.eos_id(),)


def test_add_bos_token_in_config_wins(json_dir, tmp_path):
    for f in json_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["add_bos_token"] = False
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert load_tokenizer(tmp_path).encode("hello")[0] != 1


@pytest.mark.parametrize("text", TEXTS)
def test_stream_decoder_never_splits_a_character(sp_dir, text):
    """Pieces released one token at a time never hold U+FFFD and add up to the text."""
    tok = SentencePieceTokenizer(sp_dir / "tokenizer.model", {})
    prompt = tok.encode("Story:")
    ids = tok.encode(text, bos=False)
    dec = StreamDecoder(tok, prompt)
    pieces = [dec.push(t) for t in ids] + [dec.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(prompt + ids)[len(tok.decode(prompt)) :]


def test_stream_decoder_holds_bytes_of_an_emoji(sp_dir):
    """🦙 is not in the vocabulary: it arrives as four byte tokens and prints once, whole."""
    tok = SentencePieceTokenizer(sp_dir / "tokenizer.model", {})
    ids = tok.encode("🦙", bos=False)
    byte_ids = [i for i in ids if tok.sp.id_to_piece(i).startswith("<0x")]
    assert len(byte_ids) == 4
    dec = StreamDecoder(tok, tok.encode("a"))
    pieces = [dec.push(t) for t in ids]
    assert pieces[-4:] == ["", "", "", "🦙"]  # held until its fourth byte arrives
    assert "".join(pieces) == " 🦙"  # sentencepiece's dummy prefix, then the emoji
