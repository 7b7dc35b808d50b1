"""What the OpenAI dialects (chat, completions) share: their error shape, their output constraint,
the refusals of what the engine cannot answer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi.responses import JSONResponse

from trtllm_truss.api.errors import error_response, field_error
from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.api.native import Usage
from trtllm_truss.api.openai import ChatCompletionRequest, CompletionRequest
from trtllm_truss.api.structured import one_guide, response_format_guide, vllm_guides
from trtllm_truss.serving.request import Finish, Guide

SSE_HEADERS = {"media_type": "text/event-stream"}


def openai_error(
    status: int, message: str, headers: Mapping[str, str] | None = None, *, param: str | None = None, code: str | None = None
) -> JSONResponse:
    return error_response(status, message, openai=True, headers=headers, param=param, code=code)


def usage_of(finishes: list[Finish], n: int = 1) -> Usage:
    """`finishes` in choice order (prompt-major): each prompt counted once (its first choice's
    count, cached tokens too), the completion tokens of every choice."""
    firsts = finishes[::n]
    return Usage.of(
        sum(f.prompt_tokens for f in firsts), sum(f.completion_tokens for f in finishes), sum(f.cached_tokens for f in firsts)
    )


def request_guide(req: ChatCompletionRequest | CompletionRequest) -> Guide | None:
    """The request's output constraint: `response_format`, or vLLM's `structured_outputs` /
    `guided_*` (api.structured); 400 naming the fields when several are given."""
    return one_guide([response_format_guide(req.response_format), *vllm_guides(req)])


def refuse_what_the_engine_cannot_do(req: ChatCompletionRequest | CompletionRequest, limits: RequestLimits) -> None:
    """400 naming the field for what is valid OpenAI but that this engine path cannot answer."""
    if isinstance(req, ChatCompletionRequest):
        field, alternatives = "top_logprobs", req.top_logprobs or 0
    else:
        field, alternatives = "logprobs", req.logprobs or 0
    why = limits.top_logprobs_off
    if why is None:
        return  # our python engines return up to MAX_TOP_LOG_PROBS (repository/interface.py)
    # Only the sampled token's log prob (NVIDIA's output_log_probs): the most likely token is known only
    # when decoding is greedy, and never more than one.
    if alternatives > 1 or (alternatives == 1 and not req.greedy()):
        raise field_error(
            field,
            f"{alternatives} most likely tokens are not available: {why}; use {field}: 0, or 1 with temperature: 0",
        )


def model_name(req: Any, default: str) -> str:
    return getattr(req, "model", None) or default
