"""The proxy's prompt count: counted only when usage is reported; over-long prompts are refused by
preprocessing and answered with the same 400 as an up-front check would give."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import HTTPException

from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.api.prompt import PromptTokenizer
from trtllm_truss.client import GenerationParams, UpstreamError
from trtllm_truss.preprocess import parse_prompt_too_long, prompt_too_long_message
from trtllm_truss.service import LLMService, PreparedRequest

EMBEDDED_TOKENIZER = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"


@pytest.fixture(scope="module")
def prompt_tokenizer() -> PromptTokenizer:
    return PromptTokenizer.load(EMBEDDED_TOKENIZER)


def test_backend_count_agrees_with_transformers(prompt_tokenizer: PromptTokenizer) -> None:
    assert prompt_tokenizer.backend is not None
    text = "The quick brown fox jumps over the lazy dog. Ünïcödé ☃ 你好"
    expected = len(prompt_tokenizer.tokenizer(text, add_special_tokens=True)["input_ids"])
    assert prompt_tokenizer.count(text) == expected
    assert prompt_tokenizer.count_completion(text) == expected - 1  # no BOS
    assert prompt_tokenizer.count_completion("") == 0


def test_prompt_tokens_are_counted_on_first_use_only(prompt_tokenizer: PromptTokenizer) -> None:
    tokens = prompt_tokenizer.prompt_tokens("hello world")
    assert not tokens.counted
    assert tokens.value == prompt_tokenizer.count("hello world")
    assert tokens.counted


def test_slow_tokenizer_is_counted_by_transformers() -> None:
    class SlowTokenizer:  # a transformers "slow" tokenizer has no backend_tokenizer
        def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
            return {"input_ids": list(range(len(text.split()) + int(add_special_tokens)))}

        def __len__(self) -> int:
            return 10

    prompt_tokenizer = PromptTokenizer.of(SlowTokenizer())
    assert prompt_tokenizer.backend is None
    assert prompt_tokenizer.prompt_tokens("a b c").value == 4


def test_prompt_too_long_message_is_found_inside_tritons_wrapping() -> None:
    wrapped = f"Triton failed request 1f2e: in ensemble 'ensemble', {prompt_too_long_message(600, 512)}"
    assert parse_prompt_too_long(wrapped) == (600, 512)
    assert parse_prompt_too_long("Triton failed request 1f2e: max_tokens: 9 is over max_output_len 8") is None


def _service(prompt_tokenizer: PromptTokenizer) -> LLMService:
    service = LLMService(".")
    service._tokenizer = prompt_tokenizer
    service._limits = RequestLimits(max_input_len=512, max_output_len=256)
    return service


@pytest.mark.parametrize("field", ["prompt", "messages"])
def test_preprocessing_refusal_becomes_the_400_naming_the_field(prompt_tokenizer: PromptTokenizer, field: str) -> None:
    service = _service(prompt_tokenizer)
    prepared = PreparedRequest(
        params=GenerationParams(text_input="x", max_tokens=4),
        prompt_tokens=prompt_tokenizer.prompt_tokens("x"),
        max_tokens=4,
        prompt_field=field,
    )
    refused = UpstreamError(f"Triton failed request 1f2e: in ensemble 'ensemble', {prompt_too_long_message(600, 512)}")
    error = service._upstream_error(refused, prepared)
    assert isinstance(error, HTTPException) and error.status_code == 400
    assert f"{field}:" in error.detail and "600 tokens" in error.detail and "max_input_len (512)" in error.detail

    unavailable = service._upstream_error(UpstreamError("Triton at 127.0.0.1:1 is unavailable"), prepared)
    assert unavailable.status_code == 503


def _prepare(service: LLMService, text: str, field: str = "prompt") -> PreparedRequest:
    from trtllm_truss.api.native import PredictRequest

    return service._prepare(
        PredictRequest(prompt=text),
        text=text,
        prompt_field=field,
        max_tokens_field="max_tokens",
        requested_max_tokens=4,
        default_max_tokens=4,
        stop_words=[],
    )


def test_short_prompts_are_not_counted_long_ones_are_refused_before_triton(prompt_tokenizer: PromptTokenizer) -> None:
    service = _service(prompt_tokenizer)
    short = "word " * 100  # 500 bytes: cannot be more than 512 tokens
    assert not _prepare(service, short).prompt_tokens.counted
    assert _prepare(service, "").prompt_tokens.counted  # an empty prompt is always checked (BOS only here)

    near = "ab " * 200  # 600 bytes but fewer than 512 tokens: counted, accepted
    prepared = _prepare(service, near)
    assert prepared.prompt_tokens.counted and prepared.prompt_tokens.value <= 512

    too_long = "日本語 😀 " * 300  # far more than 512 tokens
    with pytest.raises(HTTPException) as error:
        _prepare(service, too_long, field="messages")
    assert error.value.status_code == 400 and "messages: the prompt is" in error.value.detail
    assert "max_input_len (512)" in error.value.detail
