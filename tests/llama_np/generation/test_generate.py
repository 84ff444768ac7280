"""The generation loop: stop strings, EOS, seeds, streaming pieces."""

from __future__ import annotations

import pytest

import llama_np
from llama_np.generation.generate import Stats, StopStrings


def test_stop_string_split_across_pieces():
    s = StopStrings(["<END>"])
    out = [s.feed(p) for p in ["Hello <", "E", "N", "D> world"]]
    assert "".join(out) == "Hello " and s.hit


def test_partial_match_is_released_when_it_fails():
    s = StopStrings(["STOP"])
    assert s.feed("abc ST") == "abc "
    assert s.feed("ART") == "START"
    assert not s.hit and s.flush() == ""


@pytest.fixture(scope="module")
def llm(gqa_dir):
    return llama_np.load(gqa_dir[0])


def test_eos_stops_generation(llm):
    first = Stats()
    llm.generate("abc", n_predict=20, temp=0, stats=first)
    g = first.generated
    i = next(i for i in range(1, len(g)) if g[i] not in g[:i])  # a token not seen before
    llm.tokenizer.eos_ids = (g[i],)
    try:
        stats = Stats()
        llm.generate("abc", n_predict=20, temp=0, stats=stats)
    finally:
        llm.tokenizer.eos_ids = ()
    assert stats.stop_reason == "eos" and stats.generated == g[:i]


def test_stop_string_ends_the_text(llm):
    full = llm.generate("abc", n_predict=40, temp=0)
    stop = full[10:13]
    cut = llm.generate("abc", n_predict=40, temp=0, stop=[stop])
    assert cut == full[: full.index(stop)]


def test_streamed_pieces_add_up_to_the_decoded_tokens(llm):
    stats = Stats()
    pieces = list(llm.stream("The", n_predict=30, temp=0.9, seed=3, stats=stats))
    assert "".join(pieces) == llm.detokenize(stats.generated)


def test_same_seed_same_text(llm):
    a = llm.generate("x", n_predict=30, temp=1.0, seed=11)
    b = llm.generate("x", n_predict=30, temp=1.0, seed=11)
    c = llm.generate("x", n_predict=30, temp=1.0, seed=12)
    assert a == b != c


def test_empty_prompt_and_bad_n_are_usage_errors(llm):
    with pytest.raises(llama_np.UsageError, match="empty"):
        llm.generate([], n_predict=3)
    with pytest.raises(llama_np.UsageError, match="at least 1"):
        llm.generate("a", n_predict=0)
