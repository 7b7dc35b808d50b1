"""`/v1/responses`: OpenAI Responses requests in, a response or its semantic event stream out; stored,
continued and run in the background by `serving.stored_responses`.

The request's input items, instructions and function tools become one chat `GenerationRequest`
(`api.responses`); the core's events feed `api.responses_events.ResponseEvents`, which makes the
reasoning item, the message and the function calls, streamed (`response.*` events) or whole.
Errors are OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from trtllm_truss.api.conversations import conversation_id
from trtllm_truss.api.errors import field_error
from trtllm_truss.api.openai import OPENAI_DEFAULT_TOP_P
from trtllm_truss.api.responses import (
    ResponsesRequest,
    chat_messages,
    chat_response_format,
    chat_tools,
    input_items,
    parse_responses_request,
)
from trtllm_truss.api.responses_stored import stored_input_items
from trtllm_truss.api.responses_events import ResponseEvents
from trtllm_truss.serving import conversations, semantic_events, stored_responses
from trtllm_truss.serving.core import RequestCore, answered, with_unenforced_header
from trtllm_truss.api.structured import response_format_guide
from trtllm_truss.serving.openai_shared import SSE_HEADERS, openai_error
from trtllm_truss.serving.request import GenerationRequest


async def responses(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    return await answered(_responses(core, body, http_request), openai_error)


def generation_request(req: ResponsesRequest, history: list[dict[str, Any]] | tuple = ()) -> GenerationRequest:
    """The chat request of `req`, after `history` (the stored items of the turns it continues)."""
    tools, choice = chat_tools(req)
    return GenerationRequest(
        sampling=req,
        messages=tuple(chat_messages(req, history)),
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
    store = core.store
    req = parse_responses_request(body, stored=store is not None)
    keeper = None
    history: list[dict[str, Any]] = []
    if store is not None:
        owner = stored_responses.request_owner(http_request)
        conversation = None if req.conversation is None else conversation_id(req.conversation)
        if req.previous_response_id is not None:
            history = await stored_responses.previous_history(store, req, owner)
        elif conversation is not None:
            history = await conversations.history(store, conversation, owner)
        if req.store or conversation is not None:
            keeper = stored_responses.Keeper(store, owner, stored_input_items(input_items(req)), history,
                                             keep_response=req.store, conversation=conversation)
    if req.background and core.background_off:
        raise field_error("background", core.background_off)
    prepared = await core.prepare(generation_request(req, history))
    if req.background:
        return with_unenforced_header(await stored_responses.start_background(core, req, prepared, keeper), prepared)
    generation = await core.open(prepared, http_request)
    builder = ResponseEvents(req, emit=req.stream)
    if req.stream:
        events = semantic_events.stream(generation, builder)
        if keeper is not None:
            events = keeper.stream(events, builder)
        return with_unenforced_header(StreamingResponse(events, **SSE_HEADERS), prepared)
    await semantic_events.collect(generation, builder, http_request)
    response = builder.response()
    if keeper is not None:
        await keeper.keep(response)
    return with_unenforced_header(response, prepared)
