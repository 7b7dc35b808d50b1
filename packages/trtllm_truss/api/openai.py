"""OpenAI-compatible `/v1/chat/completions` and `/v1/completions`: requests, responses, stream chunks.

Streams are server-sent events: one `data: {chunk}` per delta, then `data: [DONE]`. An error in the
middle of a stream is sent as `event: error` + `data: {"error": {...}}` and the stream then stops
without `[DONE]`; the official `openai` client raises `APIError` on it.

Log probs are the engine's own for each sampled token (TensorRT-LLM's `output_log_probs`); the
engine returns no alternatives, so a request for the most likely tokens is answered only where the
sampled token is the most likely one (greedy decoding, one alternative) and refused otherwise.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from trtllm_truss.api.native import Usage
from trtllm_truss.api.sampling import INT32_MAX, MAX_WORDS, SamplingFields, StrictModel, Text
from trtllm_truss.api.structured import ResponseFormat, VllmGuidedFields
from trtllm_truss.api.tools import FunctionTool, ToolChoiceField, ToolsField

OPENAI_DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
# OpenAI's default top_p: a request without top_p/top_k samples from the whole distribution, as on
# OpenAI (and trtllm-serve); TensorRT-LLM's own default (neither set) is greedy decoding.
OPENAI_DEFAULT_TOP_P = 1.0
MAX_CHOICES = 128  # OpenAI's bound on `n`
MAX_CHAT_TOP_LOGPROBS = 20  # OpenAI's bounds on chat `top_logprobs` and completions `logprobs`
MAX_COMPLETION_LOGPROBS = 5

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
# One entry per generated token, as the stream workers send them: (text the token added, its log
# prob, the token's own bytes, the position's most likely tokens as (text, log prob, bytes), largest
# first: empty unless the engine returned them). The texts of a choice's entries concatenate to its text.
Alternative = tuple[str, float, bytes]
LogProbEntry = tuple[str, float, bytes, tuple[Alternative, ...]]


class StreamOptions(StrictModel):
    include_usage: bool = False


class _OpenAIRequest(SamplingFields, VllmGuidedFields):
    model: Text | None = Field(None, description="accepted and echoed; this deployment serves one model")
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="choices per prompt: one engine request each")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Text | list[Text] | None = Field(None, description="up to 32 stop strings")
    user: Text | None = None

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

    def greedy(self) -> bool:
        """The sampled token is always the most likely one (temperature 0 or top_k 1)."""
        return self.temperature == 0.0 or self.top_k == 1


FinishReason = Literal["stop", "length", "tool_calls"]


class ContentPart(StrictModel):
    """A part of a message's content. Only text is served; the other OpenAI kinds (image_url,
    input_audio, file, ...) are taken here so the chat route can refuse them naming the field."""

    model_config = ConfigDict(extra="allow")
    type: Text
    text: Text | None = None


class ToolCallFunction(StrictModel):
    name: Text
    arguments: Text  # JSON text, as OpenAI sends it


class ToolCallItem(StrictModel):
    id: Text
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(StrictModel):
    """An OpenAI chat message: text content (a string or text parts), an assistant's `tool_calls`,
    a tool result's `tool_call_id`."""

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCallItem] | None = None
    tool_call_id: Text | None = None
    reasoning_content: Text | None = Field(None, description="an earlier answer's reasoning: not sent to the model")
    refusal: Text | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content or ())


class ChatCompletionRequest(_OpenAIRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="newer name of max_tokens")
    logprobs: bool | None = Field(None, description="the log prob of each sampled token")
    top_logprobs: int | None = Field(
        None, ge=0, le=MAX_CHAT_TOP_LOGPROBS,
        description="most likely tokens per position (NVIDIA's C++ backend: 0, or 1 with greedy decoding)",
    )
    response_format: ResponseFormat | None = Field(None, description="text, json_object, json_schema (+ trtllm-serve's json, regex, ebnf)")
    tools: list[FunctionTool] | None = ToolsField
    tool_choice: ToolChoiceField | None = Field(None, description="none, auto (default with tools), required, or a function")
    parallel_tool_calls: bool = Field(True, description="false: at most one tool call per answer")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="extra variables for the chat template (e.g. enable_thinking: false)"
    )

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs: true")
        return self

    def wants_log_probs(self) -> bool:
        return bool(self.logprobs)

    def requested_max_tokens(self) -> tuple[str, int | None]:
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens


class CompletionRequest(_OpenAIRequest):
    prompt: Text | list[Text] | list[TokenId] | list[list[TokenId]] = Field(
        description="a prompt, a list of prompts, token ids, or a list of token-id prompts"
    )
    response_format: ResponseFormat | None = Field(None, description="as on chat (vLLM and trtllm-serve accept it here)")
    echo: Literal[False] = False
    logprobs: int | None = Field(
        None, ge=0, le=MAX_COMPLETION_LOGPROBS,
        description="most likely tokens per position (NVIDIA's C++ backend: 0, or 1 with greedy decoding)",
    )
    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES, description="only equal to n: no choice is ranked")
    suffix: None = None
    literal_special_tokens: bool = Field(
        True, description="special-token text in `prompt` is plain text; false: it is the control token"
    )

    @field_validator("prompt")
    @classmethod
    def _prompts_not_empty(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError("give at least one prompt")
            for i, item in enumerate(value):
                if isinstance(item, list) and not item:
                    raise ValueError(f"prompt {i} holds no token id")
        return value

    @model_validator(mode="after")
    def _best_of_is_n(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(
                f"best_of: only best_of equal to n ({self.n}) is served: choices are not ranked by their log probs"
            )
        return self

    def prompts(self) -> list[str | list[int]]:
        """Each prompt: text, or token ids."""
        value = self.prompt
        if isinstance(value, str):
            return [value]
        if value and all(isinstance(item, int) for item in value):
            return [list(value)]  # one prompt of token ids
        return list(value)

    def batched(self) -> bool:
        """`prompt` is a list of prompts (choices are then indexed prompt-major)."""
        value = self.prompt
        return isinstance(value, list) and not all(isinstance(item, int) for item in value)

    def prompt_text(self) -> str:
        prompt = self.prompts()[0]
        return prompt if isinstance(prompt, str) else ""

    def wants_log_probs(self) -> bool:
        return self.logprobs is not None


# --- responses ------------------------------------------------------------------------------------


def completion_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class _Envelope(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChatLogprobs | None = None


class ChatCompletion(_Envelope):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class _WithoutNones(BaseModel):
    """Dumped without its unset (None) fields: a tool call's later deltas carry only `index` and
    `function.arguments`, as OpenAI sends them."""

    @model_serializer(mode="wrap")
    def _drop_nones(self, handler: Any) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class FunctionCallDelta(_WithoutNones):
    name: str | None = None
    arguments: str | None = None


class ToolCallDeltaOut(_WithoutNones):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class ChatDelta(_WithoutNones):
    """Only what the chunk carries, as OpenAI sends deltas (`{}` on the finish chunk)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDeltaOut] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: FinishReason | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(_Envelope):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None
    logprobs: CompletionLogprobs | None = None


class Completion(_Envelope):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


def _most_likely(entry: LogProbEntry, count: int) -> tuple[Alternative, ...]:
    """The `count` most likely tokens of the entry's position: the engine's (num_top_log_probs), or where it
    returned none (NVIDIA's C++ backend, which serving allows only with count 1 and greedy decoding) the
    sampled token, then the most likely one."""
    token, logprob, raw, alternatives = entry
    return alternatives[:count] if alternatives else ((token, logprob, raw),)[:count]


def chat_logprobs(entries: Sequence[LogProbEntry], top_logprobs: int) -> ChatLogprobs:
    """`choices[].logprobs` of a chat answer (or chunk) for these tokens, each with its position's
    `top_logprobs` most likely tokens."""
    content = []
    for entry in entries:
        token, logprob, raw, _ = entry
        top = [TopLogprob(token=t, logprob=v, bytes=list(b)) for t, v, b in _most_likely(entry, top_logprobs)] if top_logprobs else []
        content.append(TokenLogprob(token=token, logprob=logprob, bytes=list(raw), top_logprobs=top))
    return ChatLogprobs(content=content)


def completion_logprobs(entries: Sequence[LogProbEntry], text_offset: int = 0, top: int = 1) -> CompletionLogprobs:
    """`choices[].logprobs` of a completion (or chunk): `text_offset` counts characters of the
    choice's text before these tokens. Each `top_logprobs` entry holds the position's `top` (the
    request's `logprobs`) most likely tokens and the sampled one, which OpenAI always includes."""
    tokens, values, tops, offsets = [], [], [], []
    for entry in entries:
        token, logprob, _, _ = entry
        tokens.append(token)
        values.append(logprob)
        likely = {t: v for t, v, _ in _most_likely(entry, top)}
        likely.setdefault(token, logprob)
        tops.append(likely)
        offsets.append(text_offset)
        text_offset += len(token)
    return CompletionLogprobs(tokens=tokens, token_logprobs=values, top_logprobs=tops, text_offset=offsets)


# --- server-sent events ---------------------------------------------------------------------------

SSE_DONE = b"data: [DONE]\n\n"


def sse_event(payload: BaseModel) -> bytes:
    return b"data: " + payload.model_dump_json(exclude_none=False).encode() + b"\n\n"


def sse_error(message: str, error_type: str = "upstream_error", code: int = 502) -> bytes:
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
