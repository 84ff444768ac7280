"""Chat templates from the files, on Gemma 4's: google/gemma-4-31B-it's chat template (as
llama.cpp's source keeps it, models/templates/), which llama.cpp's converter writes into the
GGUF and transformers 5 saves beside the checkpoint as chat_template.jinja (both in
tests/fixtures/families/gemma4, scripts/gguf_fixtures.py). A two-turn conversation renders
as Gemma 4's prompt and as transformers renders it, its markers one token each; a reply ends
at the end of its turn."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import llama_np
from llama_np.generation.chat import chat_prompt_ids, render_chat

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "families" / "gemma4"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "And now?"},
]
# Gemma 4's turns; the reply begins after an empty thought channel (thinking off)
EXPECTED = (
    "<bos><|turn>system\nYou are terse.<turn|>\n"
    "<|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n"
    "<|turn>user\nAnd now?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
)
BOS, EOS, TURN, END_TURN, CHANNEL, END_CHANNEL = 2, 1, 105, 106, 5, 6  # the fixture's ids


@pytest.fixture(scope="module", params=["gemma4.gguf", "checkpoint"])
def llm(request):
    """The converter's GGUF, and the checkpoint it was made from."""
    path = FIXTURE / request.param if request.param.endswith(".gguf") else FIXTURE
    with llama_np.load(path, kernels="numpy") as llm:
        yield llm


def test_two_turns_render_as_gemma4s_prompt(llm):
    tok = llm.tokenizer
    assert tok.chat_template == (FIXTURE / "chat_template.jinja").read_text(encoding="utf-8")
    bos, eos = tok.token_text(tok.bos_id), tok.token_text(tok.eos_ids[0])
    assert (bos, eos) == ("<bos>", "<eos>")
    assert render_chat(tok.chat_template, MESSAGES, bos, eos) == EXPECTED
    ids = chat_prompt_ids(llm, MESSAGES)
    assert ids[:2] == [BOS, TURN] and ids[-1] == END_CHANNEL
    counts = [ids.count(t) for t in (BOS, TURN, END_TURN, CHANNEL, END_CHANNEL)]
    assert counts == [1, 5, 4, 1, 1]
    markers = r"<bos>|<\|turn>|<turn\|>|<\|channel>|<channel\|>"
    assert tok.decode(ids) == re.sub(markers, "", EXPECTED)  # special tokens left out


def test_an_earlier_replys_thinking_is_left_out(llm):
    tok = llm.tokenizer
    reply = {"role": "assistant", "content": "<|channel>thought\nhm<channel|>Hello!"}
    thought = [*MESSAGES[:2], reply, MESSAGES[3]]
    assert render_chat(tok.chat_template, thought, "<bos>", "<eos>") == EXPECTED


def test_a_reply_ends_at_the_end_of_its_turn(llm):
    """llama.cpp ends generation at <turn|> by its text (the GGUF names only <eos>); the
    checkpoint's config lists it (eos_token_id [1, 106])."""
    assert {EOS, END_TURN} <= set(llm.tokenizer.eos_ids) | set(llm.config.eos_ids)


def test_transformers_renders_the_same_prompt():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(FIXTURE)
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == EXPECTED
    with llama_np.load(FIXTURE / "gemma4.gguf", kernels="numpy") as llm:
        assert chat_prompt_ids(llm, MESSAGES) == tok(text, add_special_tokens=False)["input_ids"]
