"""Prompt token counts (transformers-compatible) and the preprocessing message for over-long prompts.
The stream worker's own prompt checks are in test_stream_worker.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtllm_truss.api.prompt import PromptTokenizer

EMBEDDED_TOKENIZER = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"


@pytest.fixture(scope="module")
def prompt_tokenizer() -> PromptTokenizer:
    return PromptTokenizer.load(EMBEDDED_TOKENIZER)


def test_backend_count_agrees_with_transformers(prompt_tokenizer: PromptTokenizer) -> None:
    assert prompt_tokenizer.backend is not None
    text = "The quick brown fox jumps over the lazy dog. Ünïcödé ☃ 你好"
    expected = len(prompt_tokenizer.tokenizer(text, add_special_tokens=True)["input_ids"])
    assert prompt_tokenizer.count(text) == expected


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
