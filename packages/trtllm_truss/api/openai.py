"""OpenAI-compatible `/v1/chat/completions` and `/v1/completions`: requests, responses, stream chunks.

Streams are server-sent events: one `data: {chunk}` per delta, then `data: [DONE]`. An error in the
middle of a stream is sent as `event: error` + `data: {"error": {...}}` and the stream then stops
without `[DONE]`; the official `openai` client raises `APIError` on it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from trtllm_truss.api.native import ChatMessage, FinishReason, Usage
from trtllm_truss.api.sampling import INT32_MAX, MAX_WORDS, SamplingFields, StrictModel, Text

OPENAI_DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions


class StreamOptions(StrictModel):
    include_usage: bool = False


class _OpenAIRequest(SamplingFields):
    model: Text | None = Field(None, description="accepted and echoed; this deployment serves one model")
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    n: int = Field(1, description="only 1 is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Text | list[Text] | None = Field(None, description="up to 32 stop strings")
    user: Text | None = None

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError("only n=1 is supported")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_words(cls, value: str | list[str] | None) -> str | list[str] | None:
        words = [value] if isinstance(value, str) else (value or [])
        if len(words) > MAX_WORDS:
            raise ValueError(f"at most {MAX_WORDS} stop strings")
        if any(not word for word in words):
            raise ValueError("stop strings must not be empty")
        return value

    def stop_words(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def wants_usage_chunk(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_OpenAIRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="newer name of max_tokens")
    logprobs: Literal[False] | None = Field(None, description="log probabilities are not returned")

    def prompt_for_bound(self) -> tuple[str, str] | None:
        return "messages", "".join(message.text() for message in self.messages)

    def requested_max_tokens(self) -> tuple[str, int | None]:
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens


class CompletionRequest(_OpenAIRequest):
    prompt: Text | list[Text] = Field(description="one prompt (a list must hold exactly one)")
    echo: Literal[False] = False
    logprobs: None = Field(None, description="log probabilities are not returned")
    best_of: int | None = Field(None, ge=1, le=1)
    suffix: None = None
    literal_special_tokens: bool = Field(
        True, description="special-token text in `prompt` is plain text; false: it is the control token"
    )

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("exactly one prompt is supported")
        return value

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def prompt_for_bound(self) -> tuple[str, str] | None:
        return "prompt", self.prompt_text()


# --- responses ------------------------------------------------------------------------------------


def completion_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class _Envelope(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(_Envelope):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(_Envelope):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None
    logprobs: None = None


class Completion(_Envelope):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


# --- server-sent events ---------------------------------------------------------------------------

SSE_DONE = b"data: [DONE]\n\n"


def sse_event(payload: BaseModel) -> bytes:
    return b"data: " + payload.model_dump_json(exclude_none=False).encode() + b"\n\n"


def sse_error(message: str, error_type: str = "upstream_error", code: int = 502) -> bytes:
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
