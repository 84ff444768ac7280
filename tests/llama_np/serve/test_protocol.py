"""OpenAI request bodies checked field by field (no model, no server): what is accepted,
what becomes the engine's settings, and the 400 that names the field otherwise."""

from __future__ import annotations

import pytest

from llama_np.generation.sampling import SamplerSettings
from llama_np.serve.protocol import ApiError, chunk, parse, response


def test_a_completion_takes_openais_fields_and_llama_cpps_defaults():
    body = {"model": "m", "prompt": "hi", "max_tokens": 5.0, "stop": "\n", "seed": 3,
            "temperature": 0, "top_k": 7, "n": 2, "stream": True,
            "stream_options": {"include_usage": True}, "user": "ignored"}  # fmt: skip
    r = parse(body, False, "m", 4)
    assert (r.prompt, r.max_tokens, r.stop, r.n, r.stream, r.include_usage) == (
        "hi", 5, ("\n",), 2, True, True)  # fmt: skip
    assert r.sampling == SamplerSettings(temp=0, top_k=7, seed=3)
    default = parse({"prompt": [1, 2, 3]}, False, "m", 4)
    assert default.prompt == [1, 2, 3] and default.max_tokens == 16
    assert default.sampling == SamplerSettings()  # llama.cpp's server defaults


def test_chat_reads_text_parts_and_runs_to_the_context_by_default():
    r = parse({"messages": [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": [{"type": "text", "text": "a"},
                                                         {"type": "text", "text": "b"}]}]},
              True, "m", 1)  # fmt: skip
    assert r.prompt == [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "ab"}]  # fmt: skip
    assert r.max_tokens is None
    assert parse({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 9},
                 True, "m", 1).max_tokens == 9  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": True}, "max_tokens"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": "x", "temperature": float("nan")}, "temperature"),
        ({"prompt": "x", "min_p": 2}, "min_p"),
        ({"prompt": "x", "top_k": -1}, "top_k"),
        ({"prompt": "x", "seed": 1.5}, "seed"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, True]}, "prompt"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
        ({"prompt": "x", "stream_options": []}, "stream_options"),
    ],
)
def test_a_bad_field_is_a_400_naming_it(body, param):
    with pytest.raises(ApiError) as e:
        parse(body, False, "m", 4)
    assert e.value.status == 400 and e.value.param == param
    assert e.value.body()["error"]["type"] == "invalid_request_error"


def test_bad_messages_and_models():
    for messages in ([], [{"content": "x"}], [{"role": "user", "content": 3}]):
        with pytest.raises(ApiError) as e:
            parse({"messages": messages}, True, "m", 1)
        assert e.value.status == 400 and e.value.param.startswith("messages")
    with pytest.raises(ApiError) as e:
        parse({"model": "other", "prompt": "x"}, False, "m", 1)
    assert (e.value.status, e.value.code) == (404, "model_not_found")
    with pytest.raises(ApiError):
        parse(["not", "an", "object"], False, "m", 1)


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user"}, "messages[0].content"),
        ({"role": "system", "content": None}, "messages[0].content"),
        ({"role": "wizard", "content": "x"}, "messages[0].role"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
         "messages[0].content[0]"),
        ({"role": "user", "content": [{"text": "no type"}]}, "messages[0].content[0]"),
        ({"role": "user", "content": [{"type": "text", "text": 3}]}, "messages[0].content[0].text"),
        ({"role": "user", "content": {"type": "text", "text": "x"}}, "messages[0].content"),
    ],
)  # fmt: skip
def test_chat_messages_are_checked_as_openai_checks_them(message, param):
    with pytest.raises(ApiError) as e:
        parse({"messages": [message]}, True, "m", 1)
    assert e.value.status == 400 and e.value.param == param, str(e.value)


def test_every_openai_role_is_taken_and_an_assistant_may_have_no_content():
    roles = ["system", "developer", "user", "assistant", "tool"]
    r = parse({"messages": [{"role": r, "content": r} for r in roles]}, True, "m", 1)
    assert [m["role"] for m in r.prompt] == roles
    r = parse({"messages": [{"role": "assistant"}, {"role": "user", "content": "x"}]}, True, "m", 1)
    assert r.prompt[0] == {"role": "assistant", "content": ""}


def test_responses_and_chunks_have_openais_shape():
    req = parse({"prompt": "x", "n": 2}, False, "m", 2)
    body = response(req, "cmpl-1", ["a", "b"], ["eos", "context"], 3, 7)
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}
    chat = parse({"messages": [{"role": "user", "content": "x"}]}, True, "m", 1)
    first = chunk(chat, "c", 0, "", role=True)["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": ""}
    last = chunk(chat, "c", 0, reason="stop")["choices"][0]
    assert last["delta"] == {} and last["finish_reason"] == "stop"
