"""Hostile field values: every number within what its tensor holds (INT32, UINT64, FP32 without
underflow), every string encodable as UTF-8, and the error message itself always encodable."""

from __future__ import annotations

import json

import pytest
from fastapi import HTTPException

from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.api.native import PredictRequest
from trtllm_truss.api.openai import ChatCompletionRequest, CompletionRequest
from trtllm_truss.api.sampling import FP32_MIN_NORMAL, INT32_MAX, UINT64_MAX, to_generation_params
from trtllm_truss.serving import chat, completions, native
from trtllm_truss.serving.core import RequestCore, check_prompt_bytes, parse_request

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
LONE = "\ud800"


def _rejection(model, body) -> HTTPException:
    with pytest.raises(HTTPException) as caught:
        parse_request(model, body)
    error = caught.value
    assert 400 <= error.status_code < 500
    # The answer is JSON sent as UTF-8: the message must encode even when the input did not.
    json.dumps({"error": error.detail}, ensure_ascii=False).encode("utf-8")
    return error


INT32_FIELDS = ["top_k", "min_tokens", "end_id", "max_tokens", "beam_width"]
FLOAT_FIELDS = [
    "temperature",
    "top_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "length_penalty",
]


@pytest.mark.parametrize("field", INT32_FIELDS)
def test_native_integers_beyond_int32_name_the_field(field):
    error = _rejection(PredictRequest, {"prompt": "hi", "stream": False, field: INT32_MAX + 1})
    assert f"{field}:" in error.detail and str(INT32_MAX) in error.detail, error.detail


@pytest.mark.parametrize("field", ["top_k", "min_tokens", "end_id", "max_tokens"])
@pytest.mark.parametrize("model, base", [(ChatCompletionRequest, CHAT), (CompletionRequest, {"prompt": "hi"})])
def test_openai_integers_beyond_int32_name_the_field(model, base, field):
    error = _rejection(model, {**base, field: 2**31})
    assert f"{field}:" in error.detail, error.detail


def test_max_completion_tokens_beyond_int32():
    assert "max_completion_tokens:" in _rejection(ChatCompletionRequest, {**CHAT, "max_completion_tokens": 2**31}).detail


def test_int32_max_itself_passes_the_schema():
    req = parse_request(PredictRequest, {"prompt": "hi", "top_k": INT32_MAX, "end_id": INT32_MAX})
    assert req.top_k == INT32_MAX


def test_seed_holds_uint64_and_no_more():
    assert parse_request(PredictRequest, {"prompt": "hi", "seed": UINT64_MAX}).seed == UINT64_MAX
    assert "seed:" in _rejection(PredictRequest, {"prompt": "hi", "seed": UINT64_MAX + 1}).detail


@pytest.mark.parametrize("value", [1e-320, 1e-50, 1e-39])
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_floats_that_fp32_would_flush_towards_zero_are_refused(field, value):
    error = _rejection(PredictRequest, {"prompt": "hi", "stream": False, field: value})
    assert f"{field}:" in error.detail, error.detail


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty", "length_penalty"])
def test_negative_floats_that_fp32_would_flush_are_refused(field):
    assert f"{field}:" in _rejection(PredictRequest, {"prompt": "hi", field: -1e-45}).detail


def test_the_issues_float_examples_name_fp32():
    error = _rejection(PredictRequest, {"prompt": "hi", "repetition_penalty": 1e-320})
    assert "repetition_penalty:" in error.detail and "32-bit float" in error.detail, error.detail
    error = _rejection(CompletionRequest, {"prompt": "hi", "top_p": 1e-50})
    assert "top_p:" in error.detail and "32-bit float" in error.detail, error.detail


def test_zero_and_normal_small_floats_pass():
    req = parse_request(PredictRequest, {"prompt": "hi", "temperature": 0.0, "top_p": FP32_MIN_NORMAL * 2})
    assert req.temperature == 0.0 and req.top_p == FP32_MIN_NORMAL * 2
    assert parse_request(PredictRequest, {"prompt": "hi", "presence_penalty": -0.0}).presence_penalty == 0.0


SURROGATE_BODIES = [
    (PredictRequest, {"prompt": LONE + "x"}, "prompt"),
    (PredictRequest, {"messages": [{"role": "user", "content": "a" + LONE}]}, "messages[0].content"),
    (PredictRequest, {"messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]}, "messages[0].content[0].text"),
    (PredictRequest, {"messages": [{"role": "user", "content": "a", "name": LONE}]}, "messages[0].name"),
    (PredictRequest, {"prompt": "hi", "stop_words_list": ["ok", LONE]}, "stop_words_list[1]"),
    (PredictRequest, {"prompt": "hi", "bad_words_list": [LONE]}, "bad_words_list[0]"),
    (ChatCompletionRequest, {**CHAT, "model": LONE, "stream": True}, "model"),
    (ChatCompletionRequest, {**CHAT, "stop": LONE}, "stop"),
    (ChatCompletionRequest, {**CHAT, "stop": ["a", LONE]}, "stop[1]"),
    (ChatCompletionRequest, {**CHAT, "user": LONE}, "user"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": LONE}]}, "messages[0].content"),
    (CompletionRequest, {"prompt": LONE + "x"}, "prompt"),
    (CompletionRequest, {"prompt": [LONE]}, "prompt[0]"),
    (CompletionRequest, {"prompt": "hi", "model": "\udfff", "stream": True}, "model"),
]


@pytest.mark.parametrize("model, body, field", SURROGATE_BODIES, ids=[f"{m.__name__}-{f}" for m, _, f in SURROGATE_BODIES])
def test_lone_surrogates_are_refused_naming_the_field(model, body, field):
    error = _rejection(model, body)
    # pydantic itself refuses a surrogate where a string has length constraints ("unicode string").
    assert f"{field}:" in error.detail and "unicode" in error.detail.lower(), error.detail


def test_an_unknown_key_with_a_surrogate_gives_an_encodable_error():
    _rejection(PredictRequest, {"prompt": "hi", "x" + LONE: 1})


def test_surrogate_pairs_written_as_one_character_are_text():
    assert parse_request(PredictRequest, {"prompt": "smile \U0001f600"}).prompt == "smile \U0001f600"


def test_prompt_byte_bound_is_cheap_and_names_the_field():
    limits = RequestLimits(max_input_len=4, max_output_len=4, max_token_bytes=8)
    check_prompt_bytes("prompt", "é" * 16, limits)  # 32 bytes: at the bound
    with pytest.raises(HTTPException) as caught:
        check_prompt_bytes("messages", "é" * 16 + "x", limits)
    assert caught.value.status_code == 400
    assert "messages:" in caught.value.detail and "33 bytes" in caught.value.detail


def test_body_bound_covers_a_prompt_at_the_bound_fully_escaped():
    limits = RequestLimits(max_input_len=512, max_output_len=16)
    worst_case = json.dumps({"prompt": "\x01" * limits.max_prompt_bytes}).encode()
    assert len(worst_case) <= limits.max_body_bytes


def _bounded(req, dialect, limits):
    """What the request core checks of a dialect's request before anything is queued."""
    if dialect is completions:  # each prompt of a batch, under its own field
        for field, prompt in completions.prompt_fields(req):
            if isinstance(prompt, str):
                check_prompt_bytes(field, prompt, limits)
    core = RequestCore()
    core.attach(None, limits)  # type: ignore[arg-type]
    core.spec(dialect.generation_request(req))


@pytest.mark.parametrize(
    "model, dialect, body, field",
    [
        (PredictRequest, native, {"prompt": "ab" * 17}, "prompt"),
        (PredictRequest, native, {"messages": [{"role": "user", "content": "a" * 20}, {"role": "user", "content": "b" * 20}]}, "messages"),
        (ChatCompletionRequest, chat, {"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 33}]}]}, "messages"),
        (CompletionRequest, completions, {"prompt": ["y" * 33]}, "prompt[0]"),
        (CompletionRequest, completions, {"prompt": ["y", "y" * 33]}, "prompt[1]"),
    ],
)
def test_the_core_refuses_a_prompt_over_the_byte_bound(model, dialect, body, field):
    limits = RequestLimits(max_input_len=4, max_output_len=4, max_token_bytes=8)  # 32 bytes
    req = parse_request(model, body)
    with pytest.raises(HTTPException) as caught:
        _bounded(req, dialect, limits)
    assert caught.value.status_code == 400 and f"{field}: the prompt is" in caught.value.detail


def test_the_core_accepts_a_prompt_at_the_byte_bound():
    limits = RequestLimits(max_input_len=4, max_output_len=4, max_token_bytes=8)
    req = parse_request(CompletionRequest, {"prompt": "é" * 16})
    _bounded(req, completions, limits)
    assert to_generation_params(req, text_input="", max_tokens=2, limits=limits).max_tokens == 2
