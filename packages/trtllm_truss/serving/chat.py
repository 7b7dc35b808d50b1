"""`/v1/chat/completions`: OpenAI chat requests in, chat completions or chunk streams out.

The request becomes one `GenerationRequest` (messages with tool calls and tool results, tools,
tool_choice, sampling) and `n` engine requests; the core's events become the answer: text as
`content`, the reasoning parser's output as `reasoning_content`, tool calls as `tool_calls` (a
call's first chunk carries its index, id and name, later ones argument fragments), finish reason
`tool_calls` when the model called tools.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from trtllm_truss.api.errors import field_error
from trtllm_truss.api.openai import (
    OPENAI_DEFAULT_TOP_P,
    SSE_DONE,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessage,
    FunctionCall,
    FunctionCallDelta,
    ToolCallDeltaOut,
    ToolCallOut,
    chat_logprobs,
    completion_id,
    sse_error,
    sse_event,
)
from trtllm_truss.api.sse import ChunkTemplate
from trtllm_truss.api.tools import check_tool_choice, check_tools, strict_guided_tools, tool_dicts
from trtllm_truss.serving.core import SERVED_MODEL_NAME, RequestCore, answered, parse_request, with_unenforced_header
from trtllm_truss.serving.generation import Generation, merged_events
from trtllm_truss.serving.openai_shared import (
    openai_error,
    refuse_what_the_engine_cannot_do,
    request_guide,
    usage_of,
)
from trtllm_truss.serving.request import (
    Answer,
    Failure,
    Finish,
    GenerationRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)

# What each content kind OpenAI defines is, for the refusal's message.
_MEDIA = {"image_url": "images", "input_audio": "audio", "file": "files", "input_image": "images"}
# Template variables a request may not set: apply_chat_template's own arguments.
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
     "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
     "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "sanitize_control_tokens"}
)


async def chat_completions(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    return await answered(_chat_completions(core, body, http_request), openai_error)


def generation_request(req: ChatCompletionRequest) -> GenerationRequest:
    """The core's request for a validated chat request (400s naming the field for what the schema
    alone cannot tell: unknown tools, bad schemas, unmatched tool results, media content)."""
    tools = req.tools or []
    check_tools(tools)
    choice = check_tool_choice(tools, req.tool_choice)
    kwargs = req.chat_template_kwargs or {}
    for key in kwargs:
        if key in _RESERVED_TEMPLATE_KWARGS or not key.isidentifier():
            raise field_error(f"chat_template_kwargs.{key}", "is not a template variable a request may set")
    max_tokens_field, requested = req.requested_max_tokens()
    return GenerationRequest(
        sampling=req,
        messages=chat_turns(req.messages),
        prompt_field="messages",
        max_tokens=requested,
        max_tokens_field=max_tokens_field,
        stop=tuple(req.stop_words()),
        default_top_p=OPENAI_DEFAULT_TOP_P,
        tools=tool_dicts(tools),
        tool_choice=choice,
        strict_tools=strict_guided_tools(tools, choice),
        parallel_tool_calls=req.parallel_tool_calls,
        guide=request_guide(req),
        chat_template_kwargs=kwargs,
        model=req.model,
        n=req.n,
        logprobs=req.wants_log_probs(),
        top_logprobs=req.top_logprobs or 0,
    )


def chat_turns(messages: list[ChatMessage], field: str = "messages") -> tuple[Mapping[str, Any], ...]:
    """The messages as chat-template turns; tool results must answer an earlier call."""
    calls: dict[str, str] = {}  # tool call id -> function name
    turns = []
    for i, message in enumerate(messages):
        where = f"{field}[{i}]"
        if isinstance(message.content, list):
            for j, part in enumerate(message.content):
                if part.type != "text":
                    kind = _MEDIA.get(part.type, f"{part.type!r} content")
                    raise field_error(f"{where}.content[{j}].type", f"{kind} are not accepted: this deployment serves a text-only model")
                if part.text is None:
                    raise field_error(f"{where}.content[{j}].text", "a text part needs its text")
        turn: dict[str, Any] = {"role": message.role, "content": message.text()}
        if message.name is not None:
            turn["name"] = message.name
        if message.tool_calls:
            if message.role != "assistant":
                raise field_error(f"{where}.tool_calls", "only assistant messages carry tool calls")
            turn["tool_calls"] = [call.model_dump() for call in message.tool_calls]
            calls.update((call.id, call.function.name) for call in message.tool_calls)
        elif message.content is None and message.role != "assistant":
            raise field_error(f"{where}.content", "is required")
        if message.role == "tool":
            if message.tool_call_id is None:
                raise field_error(f"{where}.tool_call_id", "a tool message needs the id of the call it answers")
            if message.tool_call_id not in calls:
                raise field_error(f"{where}.tool_call_id", f"{message.tool_call_id!r} answers no tool call of an earlier assistant message")
            turn["tool_call_id"] = message.tool_call_id
            turn.setdefault("name", calls[message.tool_call_id])
        elif message.tool_call_id is not None:
            raise field_error(f"{where}.tool_call_id", "only tool messages answer a tool call")
        turns.append(turn)
    return tuple(turns)


async def _chat_completions(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    req = parse_request(ChatCompletionRequest, body)
    refuse_what_the_engine_cannot_do(req, core.limits)
    request = generation_request(req)
    prepared = await core.prepare(request)
    specs = core.choice_specs(request, [prepared])
    generations = await core.open_all(specs, http_request)
    model = req.model or SERVED_MODEL_NAME
    if req.stream:
        return with_unenforced_header(StreamingResponse(_chat_sse(generations, req, model), media_type="text/event-stream"), prepared)
    answers = await core.collect(generations, http_request)
    top = req.top_logprobs or 0
    choices = [
        ChatChoice(
            index=index,
            message=assistant_message(answer, req.parallel_tool_calls),
            finish_reason=answer.finish.reason,
            logprobs=chat_logprobs(answer.logprobs, top) if req.wants_log_probs() else None,
        )
        for index, answer in enumerate(answers)
    ]
    return with_unenforced_header(ChatCompletion(
        id=completion_id("chatcmpl"), model=model, choices=choices, usage=usage_of([a.finish for a in answers], req.n)
    ).model_dump(), prepared)


def assistant_message(answer: Answer, parallel_tool_calls: bool = True) -> AssistantMessage:
    """The answer as chat's message; `parallel_tool_calls: false` keeps the first call only (guided
    `required` asks for one; a model's own format may still write several)."""
    calls = [ToolCallOut(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in answer.tool_calls]
    if not parallel_tool_calls:
        calls = calls[:1]
    return AssistantMessage(
        content=answer.text if answer.text or not calls else None,
        reasoning_content=answer.reasoning,
        tool_calls=calls or None,
    )


async def _chat_sse(generations: list[Generation], req: ChatCompletionRequest, model: str) -> AsyncIterator[bytes]:
    """A role chunk per choice, then each event as its chunk as it arrives, a finish chunk per
    choice, usage (stream_options.include_usage) and `[DONE]`; a failure ends the stream with
    `event: error` and no `[DONE]`."""
    envelope = {"id": completion_id("chatcmpl"), "model": model}
    wants = req.wants_log_probs()
    top = req.top_logprobs or 0
    # Plain text of choice 0 without log probs, the common chunk: its JSON cut once around the text.
    template = ChunkTemplate(ChatCompletionChunk(**envelope, choices=[ChatChunkChoice(delta=ChatDelta(content=ChunkTemplate.mark()))]))

    def chunk(index: int, delta: ChatDelta, finish_reason: str | None = None, logprobs: Any = None) -> bytes:
        choice = ChatChunkChoice(index=index, delta=delta, finish_reason=finish_reason, logprobs=logprobs)
        return sse_event(ChatCompletionChunk(**envelope, choices=[choice]))

    single = len(generations) == 1  # the common case: its events as they are, no merging task
    events: AsyncIterator[Any] = generations[0].events() if single else merged_events(generations)
    one_call = not req.parallel_tool_calls
    try:
        for index in range(len(generations)):
            yield chunk(index, ChatDelta(role="assistant", content=""))
        finishes: dict[int, Finish] = {}
        async with aclosing(events):
            async for item in events:
                index, event = (0, item) if single else item
                cls = event.__class__
                if cls is TextDelta:
                    if not wants and index == 0:
                        yield template.event(event.text)
                    else:
                        logprobs = chat_logprobs(event.logprobs or [], top) if wants else None
                        yield chunk(index, ChatDelta(content=event.text), logprobs=logprobs)
                elif cls is ReasoningDelta:
                    yield chunk(index, ChatDelta(reasoning_content=event.text))
                elif cls is ToolCallDelta:
                    if one_call and event.index > 0:
                        continue  # parallel_tool_calls: false: the first call only
                    call = ToolCallDeltaOut(
                        index=event.index,
                        id=event.id,
                        type="function" if event.id is not None else None,
                        function=FunctionCallDelta(name=event.name, arguments=event.arguments),
                    )
                    yield chunk(index, ChatDelta(tool_calls=[call]))
                elif cls is Failure:
                    yield sse_error(event.message)
                    return
                else:
                    yield chunk(index, ChatDelta(), event.reason)
                    finishes[index] = event
        if req.wants_usage_chunk():
            usage = usage_of([finishes[i] for i in sorted(finishes)], req.n)
            yield sse_event(ChatCompletionChunk(**envelope, choices=[], usage=usage))
        yield SSE_DONE
    finally:  # however the answer ends, before the events started too
        for generation in generations:
            generation.close()
