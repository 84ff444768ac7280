"""Tokenizers against sentencepiece and transformers' LlamaTokenizer, and streaming."""

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
def hf_ref(sp_dir):
    from transformers import LlamaTokenizer

    # legacy=False is the behaviour that reproduces sentencepiece on leading spaces
    return LlamaTokenizer(vocab_file=str(sp_dir / "tokenizer.model"), legacy=False)


@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_ids_and_text_match_references(sp_dir, hf_ref, text):
    import sentencepiece as spm

    ours = SentencePieceTokenizer(sp_dir / "tokenizer.model", {})
    sp = spm.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))
    ids = ours.encode(text)
    assert ids == [1, *sp.encode(text)]
    assert ids == hf_ref.encode(text)
    assert ours.decode(ids) == text
    assert ours.decode(ids) == hf_ref.decode(ids, skip_special_tokens=True)


def test_bos_follows_tokenizer_config(sp_dir):
    ours = SentencePieceTokenizer(sp_dir / "tokenizer.model", {"add_bos_token": False})
    assert ours.encode("hi")[0] != 1
    assert ours.encode("hi", bos=True)[0] == 1
    assert ours.eos_ids == (2,)


@pytest.fixture(scope="module")
def json_dir(sp_dir, hf_ref, tmp_path_factory):
    """The same vocabulary as a tokenizer.json, written by transformers' fast tokenizer."""
    from transformers import LlamaTokenizerFast

    d = tmp_path_factory.mktemp("tokjson")
    LlamaTokenizerFast(vocab_file=str(sp_dir / "tokenizer.model"), legacy=True).save_pretrained(d)
    return d


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_json_matches_transformers_fast(json_dir, text):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(json_dir)
    ours = load_tokenizer(json_dir)
    assert isinstance(ours, HFTokenizer)
    assert ours.encode(text) == ref.encode(text)
    assert ours.decode(ours.encode(text)) == ref.decode(ref.encode(text), skip_special_tokens=True)
    assert ours.bos_id == ref.bos_token_id and ours.eos_ids == (ref.eos_token_id,)


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
