"""Native and OpenAI request schemas: strict types, unknown fields, ranges, limits -> 4xx naming the field."""

from __future__ import annotations

import pytest
from fastapi import HTTPException

from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.api.native import PredictRequest
from trtllm_truss.api.openai import ChatCompletionRequest, CompletionRequest, sse_error
from trtllm_truss.api.sampling import (
    IGNORE_EOS_END_ID,
    resolve_max_tokens,
    to_generation_params,
)
from trtllm_truss.serving.core import parse_request

LIMITS = RequestLimits(max_input_len=64, max_output_len=32, max_beam_width=2, vocab_size=1000)


def _rejection(model, body) -> HTTPException:
    with pytest.raises(HTTPException) as caught:
        parse_request(model, body)
    return caught.value


@pytest.mark.parametrize(
    "body, field",
    [
        ({"prompt": "hi", "max_tokens": "5"}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": 5.0}, "max_tokens"),
        ({"prompt": "hi", "temperature": -0.1}, "temperature"),
        ({"prompt": "hi", "temperature": "hot"}, "temperature"),
        ({"prompt": "hi", "top_p": 0}, "top_p"),
        ({"prompt": "hi", "top_p": 1.5}, "top_p"),
        ({"prompt": "hi", "top_k": -1}, "top_k"),
        ({"prompt": "hi", "seed": -3}, "seed"),
        ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
        ({"prompt": "hi", "presence_penalty": 3}, "presence_penalty"),
        ({"prompt": "hi", "frequency_penalty": -2.5}, "frequency_penalty"),
        ({"prompt": "hi", "min_tokens": -1}, "min_tokens"),
        ({"prompt": "hi", "beam_width": 0}, "beam_width"),
        ({"prompt": "hi", "beam_width": 2}, "beam_width"),  # beams need stream=false
        ({"prompt": "hi", "stop_words_list": "end"}, "stop_words_list"),
        ({"prompt": "hi", "stop_words_list": [""]}, "stop_words_list[0]"),
        ({"prompt": "hi", "bad_words_list": [3]}, "bad_words_list[0]"),
        ({"prompt": "hi", "end_id": -1}, "end_id"),
        ({"prompt": "hi", "ignore_eos": "yes"}, "ignore_eos"),
        ({"prompt": "hi", "stream": "false"}, "stream"),
        ({"prompt": "hi", "max_new_tokens": 5}, "max_new_tokens"),
        ({"prompt": 42}, "prompt"),
        ({}, "prompt, messages"),
        ({"prompt": "hi", "messages": [{"role": "user", "content": "x"}]}, "prompt, messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": []}, "messages"),
    ],
)
def test_native_malformed_request_names_the_field(body, field):
    error = _rejection(PredictRequest, body)
    assert error.status_code == 422
    assert f"{field}:" in error.detail, error.detail


def test_native_body_must_be_an_object():
    error = _rejection(PredictRequest, ["prompt"])
    assert error.status_code == 422 and "body" in error.detail


def test_native_defaults_stream_and_accepts_legacy_fields():
    req = parse_request(
        PredictRequest,
        {
            "prompt": "hi",
            "max_tokens": 8,
            "beam_width": 1,
            "stop_words_list": ["."],
            "bad_words_list": ["x"],
            "repetition_penalty": 1.1,
        },
    )
    assert req.stream is True and req.stop_words_list == ["."] and req.repetition_penalty == 1.1


@pytest.mark.parametrize(
    "model, body, field",
    [
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "n": 129}, "n"),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "tools": "x"}, "tools"),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "tool_choice": "any"}, "tool_choice"),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "stop": [""]}, "stop"),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, "logprobs"),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 1}, "top_logprobs"),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}, "response_format.type"),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages[0].content[0].type"),
        (ChatCompletionRequest, {"model": "m"}, "messages"),
        (CompletionRequest, {"prompt": []}, "prompt"),
        (CompletionRequest, {"prompt": [[1], []]}, "prompt"),
        (CompletionRequest, {"prompt": [1, "a"]}, "prompt"),
        (CompletionRequest, {"prompt": [-1]}, "prompt[0]"),
        (CompletionRequest, {"prompt": "a", "logprobs": 6}, "logprobs"),
        (CompletionRequest, {"prompt": "a", "logprobs": True}, "logprobs"),
        (CompletionRequest, {"prompt": "a", "echo": True}, "echo"),
        (CompletionRequest, {"prompt": "a", "best_of": 3}, "best_of"),
        (CompletionRequest, {"prompt": "a", "n": 2, "best_of": 3}, "best_of"),
        (CompletionRequest, {"prompt": "a", "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ],
)
def test_openai_malformed_request_names_the_field(model, body, field):
    error = _rejection(model, body)
    assert error.status_code == 422
    assert f"{field}:" in error.detail, error.detail


def test_openai_stop_forms_and_max_completion_tokens():
    chat = ChatCompletionRequest.model_validate(
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "stop": "\n",
            "max_completion_tokens": 7,
        }
    )
    assert chat.stop_words() == ["\n"]
    assert chat.requested_max_tokens() == ("max_completion_tokens", 7)
    assert chat.messages[0].text() == "ab"
    assert CompletionRequest.model_validate({"prompt": ["only"], "stop": ["a", "b"]}).prompt_text() == "only"


@pytest.mark.parametrize(
    "prompt, prompts, batched",
    [
        ("a", ["a"], False),
        (["a"], ["a"], True),
        (["a", "b", "c", "d"], ["a", "b", "c", "d"], True),
        ([1, 2, 3], [[1, 2, 3]], False),  # one prompt of token ids
        ([[1, 2], [3]], [[1, 2], [3]], True),
    ],
)
def test_completion_prompt_forms(prompt, prompts, batched):
    req = CompletionRequest.model_validate({"prompt": prompt, "n": 2, "best_of": 2})
    assert req.prompts() == prompts and req.batched() is batched


def test_each_prompt_of_a_batch_is_named_by_its_index():
    from trtllm_truss.serving.completions import prompt_fields

    req = CompletionRequest.model_validate({"prompt": ["a", "bbb", "cc"]})
    assert prompt_fields(req) == [("prompt[0]", "a"), ("prompt[1]", "bbb"), ("prompt[2]", "cc")]
    assert prompt_fields(CompletionRequest.model_validate({"prompt": [5, 6]})) == [("prompt", [5, 6])]


def test_log_prob_answers_follow_openais_schemas():
    import openai.types.chat.chat_completion as chat_types
    import openai.types.completion_choice as completion_types

    from trtllm_truss.api.openai import chat_logprobs, completion_logprobs

    entries = [(" a", -0.25, b" a", ()), ("", -1.5, b"\xe2\x98", ()), ("\u2603", -0.5, b"\x83", ())]
    chat = chat_types.ChoiceLogprobs.model_validate(chat_logprobs(entries, 0).model_dump())
    assert [(c.token, c.logprob, bytes(c.bytes), c.top_logprobs) for c in chat.content] == [
        (t, lp, raw, []) for t, lp, raw, _ in entries
    ]
    top = chat_logprobs(entries, 1).model_dump()["content"][2]["top_logprobs"]
    assert top == [{"token": "\u2603", "logprob": -0.5, "bytes": [0x83]}]
    completion = completion_types.Logprobs.model_validate(completion_logprobs(entries, text_offset=10).model_dump())
    assert completion.tokens == [" a", "", "\u2603"] and completion.token_logprobs == [-0.25, -1.5, -0.5]
    assert completion.text_offset == [10, 12, 12] and completion.top_logprobs == [{" a": -0.25}, {"": -1.5}, {"\u2603": -0.5}]


def test_the_engines_most_likely_tokens_fill_top_logprobs():
    """Where the engine returned each position's most likely tokens (num_top_log_probs), chat lists the first
    top_logprobs of them and completions the first `logprobs` plus the sampled token, in OpenAI's schemas."""
    import openai.types.chat.chat_completion as chat_types
    import openai.types.completion_choice as completion_types

    from trtllm_truss.api.openai import chat_logprobs, completion_logprobs

    likely = ((" b", -0.1, b" b"), (" a", -0.25, b" a"), (" c", -3.0, b" c"))
    entries = [(" a", -0.25, b" a", likely), (" x", -7.0, b" x", likely)]
    chat = chat_types.ChoiceLogprobs.model_validate(chat_logprobs(entries, 2).model_dump())
    assert [[(t.token, t.logprob) for t in c.top_logprobs] for c in chat.content] == [[(" b", -0.1), (" a", -0.25)]] * 2
    completion = completion_types.Logprobs.model_validate(completion_logprobs(entries, top=2).model_dump())
    assert completion.top_logprobs == [{" b": -0.1, " a": -0.25}, {" b": -0.1, " a": -0.25, " x": -7.0}]


def test_limits_max_tokens():
    # (the prompt's own limit is checked where it is tokenized: tests/unit/test_stream_worker.py)
    with pytest.raises(HTTPException) as caught:
        resolve_max_tokens("max_completion_tokens", 33, 16, LIMITS)
    assert "max_completion_tokens:" in caught.value.detail and "max_output_len (32)" in caught.value.detail
    assert resolve_max_tokens("max_tokens", None, 50, LIMITS) == 32  # default capped by the engine
    assert resolve_max_tokens("max_tokens", 5, 50, LIMITS) == 5


def _params(body: dict, **kwargs):
    req = parse_request(PredictRequest, {"prompt": "hi", **body})
    return to_generation_params(req, text_input="hi", max_tokens=kwargs.pop("max_tokens", 8), limits=LIMITS, **kwargs)


def test_generation_params_translation():
    params = _params(
        {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3, "min_tokens": 2, "ignore_eos": True}, stop_words=["."]
    )
    assert (params.temperature, params.top_p, params.top_k, params.random_seed, params.min_length) == (
        0.7,
        0.9,
        5,
        3,
        2,
    )
    assert params.end_id == IGNORE_EOS_END_ID and params.stop_words == (".",) and params.stream
    greedy = _params({"temperature": 0, "top_p": 0.5})
    assert greedy.top_k == 1 and greedy.temperature is None and greedy.top_p is None


def test_the_openai_default_top_p_applies_only_when_the_request_sets_neither_top_p_nor_top_k():
    # TensorRT-LLM decodes greedily with neither set: an OpenAI client that sent only a temperature
    # would never sample. The OpenAI routes send OpenAI's top_p 1.0 then; the native route does not.
    assert _params({"temperature": 0.8}).top_p is None
    assert _params({"temperature": 0.8}, default_top_p=1.0).top_p == 1.0
    assert _params({}, default_top_p=1.0).top_p == 1.0
    assert _params({"top_p": 0.5}, default_top_p=1.0).top_p == 0.5
    assert _params({"top_k": 40}, default_top_p=1.0).top_p is None
    greedy = _params({"temperature": 0}, default_top_p=1.0)
    assert greedy.top_k == 1 and greedy.top_p is None
    unset = _params({})
    assert unset.temperature is None and unset.top_k is None and unset.end_id is None
    assert not _params({"stream": False}, beam_width=2).stream  # beams come back whole


@pytest.mark.parametrize(
    "body, kwargs, field",
    [
        ({"min_tokens": 9}, {}, "min_tokens"),
        ({"end_id": 1000}, {}, "end_id"),
        ({"end_id": 2, "ignore_eos": True}, {}, "end_id"),
        ({"stream": False}, {"beam_width": 3}, "beam_width"),
    ],
)
def test_generation_params_limit_errors(body, kwargs, field):
    with pytest.raises(HTTPException) as caught:
        _params(body, **kwargs)
    assert caught.value.status_code == 400 and f"{field}:" in caught.value.detail


def test_sse_error_event_is_an_openai_error_object():
    event = sse_error("Triton at x is unavailable")
    assert event.startswith(b'event: error\ndata: {"error": {"message": "Triton at x is unavailable"')
    assert event.endswith(b"\n\n")
