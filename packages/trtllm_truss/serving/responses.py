"""`/v1/responses`: OpenAI Responses requests in (stateless), a response or its semantic event
stream out.

The request's input items, instructions and function tools become one chat `GenerationRequest`
(`api.responses`); the core's events feed `api.responses_events.ResponseEvents`, which makes the
reasoning item, the message and the function calls, streamed (`response.*` events) or whole.
Errors are OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from trtllm_truss.api.openai import OPENAI_DEFAULT_TOP_P
from trtllm_truss.api.responses import (
    ResponsesRequest,
    chat_messages,
    chat_response_format,
    chat_tools,
    parse_responses_request,
)
from trtllm_truss.api.responses_events import ResponseEvents
from trtllm_truss.serving import semantic_events, token_count
from trtllm_truss.serving.core import RequestCore, answered, with_unenforced_header
from trtllm_truss.api.structured import response_format_guide
from trtllm_truss.serving.openai_shared import SSE_HEADERS, openai_error
from trtllm_truss.serving.request import GenerationRequest


async def responses(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    return await answered(_responses(core, body, http_request), openai_error)


def generation_request(req: ResponsesRequest) -> GenerationRequest:
    tools, choice = chat_tools(req)
    return GenerationRequest(
        sampling=req,
        messages=tuple(chat_messages(req)),
        prompt_field="input",
        max_tokens=req.max_output_tokens,
        max_tokens_field="max_output_tokens",
        default_top_p=OPENAI_DEFAULT_TOP_P,
        tools=tuple(tools),
        tool_choice=choice,
        parallel_tool_calls=req.parallel_tool_calls,
        guide=response_format_guide(chat_response_format(req), "text.format", schema_field="text.format.schema"),
        model=req.model,
    )


async def _responses(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    req = parse_responses_request(body)
    prepared = await core.prepare(generation_request(req))
    generation = await core.open(prepared, http_request)
    builder = ResponseEvents(req, emit=req.stream)
    if req.stream:
        return with_unenforced_header(StreamingResponse(semantic_events.stream(generation, builder), **SSE_HEADERS), prepared)
    await semantic_events.collect(generation, builder, http_request)
    return with_unenforced_header(builder.response(), prepared)


async def input_tokens(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    """`POST /v1/responses/input_tokens`: `{"object": "response.input_tokens", "input_tokens": N}`, the
    `usage.input_tokens` the same request would report (serving.token_count)."""
    return await answered(_input_tokens(core, body, http_request), openai_error)


async def _input_tokens(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    req = parse_responses_request(body)
    count = await token_count.input_tokens(core, generation_request(req), http_request)
    return {"object": "response.input_tokens", "input_tokens": count}
