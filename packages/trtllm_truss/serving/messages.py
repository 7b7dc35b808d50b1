"""`/v1/messages`: Anthropic Messages requests in, a message or its event stream out.

The request's system prompt, content blocks and tools become one chat `GenerationRequest`
(`api.messages`); the core's events feed `api.messages_events.MessageEvents`, which makes the
thinking, text and tool_use blocks, streamed (`message_start` ... `message_stop`) or whole. Errors
are Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from trtllm_truss.api.messages import (
    MessagesCountRequest,
    MessagesRequest,
    chat_messages,
    chat_response_format,
    chat_tools,
    error_response,
    parse_messages_request,
)
from trtllm_truss.api.messages_events import MessageEvents
from trtllm_truss.serving import semantic_events, token_count
from trtllm_truss.serving.core import SERVED_MODEL_NAME, RequestCore, answered
from trtllm_truss.api.structured import response_format_guide
from trtllm_truss.serving.openai_shared import SSE_HEADERS
from trtllm_truss.serving.request import GenerationRequest

# Anthropic samples the whole distribution at `temperature` unless top_p/top_k narrow it (with
# neither, TensorRT-LLM would decode greedily).
DEFAULT_TOP_P = 1.0


async def messages(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    return await answered(_messages(core, body, http_request), error_response)


def generation_request(req: MessagesRequest) -> GenerationRequest:
    tools, choice, parallel = chat_tools(req)
    return GenerationRequest(
        sampling=req,
        messages=tuple(chat_messages(req)),
        prompt_field="messages",
        max_tokens=req.max_tokens,
        stop=tuple(req.stop_sequences),
        default_top_p=DEFAULT_TOP_P,
        tools=tuple(tools),
        tool_choice=choice,
        parallel_tool_calls=parallel,
        guide=response_format_guide(
            chat_response_format(req), "output_config.format", schema_field="output_config.format.schema", strict=True
        ),
        model=req.model,
    )


async def _messages(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    req = parse_messages_request(body)
    generation = await core.open(await core.prepare(generation_request(req)), http_request)
    builder = MessageEvents(req.model or SERVED_MODEL_NAME, emit=req.stream)
    if req.stream:
        return StreamingResponse(semantic_events.stream(generation, builder), **SSE_HEADERS)
    await semantic_events.collect(generation, builder, http_request)
    return builder.message()


async def count_tokens(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    """`POST /v1/messages/count_tokens`: `{"input_tokens": N}`, the `usage.input_tokens` the same
    request would report (serving.token_count)."""
    return await answered(_count_tokens(core, body, http_request), error_response)


async def _count_tokens(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    req = parse_messages_request(body, MessagesCountRequest)
    return {"input_tokens": await token_count.input_tokens(core, generation_request(req), http_request)}
