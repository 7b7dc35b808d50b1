"""OpenAI's Responses API (`POST /v1/responses`): the request, its conversion to chat turns and tools,
and the response object and stream events.

Input items become OpenAI chat messages: `instructions` a leading system message, `developer` messages
system ones, `function_call` items assistant `tool_calls` (consecutive calls one assistant turn),
`function_call_output` items `tool` messages (each must answer an earlier call), `reasoning` items the
next assistant turn's `reasoning_content`. A turn continued by `previous_response_id` comes after the
stored history (the earlier turns' input and output items, `api.responses_stored`), one in a
`conversation` after its items (`api.conversations`): the whole is rendered as a new request would be.
`item_reference` inputs are not served.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from trtllm_truss.api.conversation import (
    EchoedModel,
    ToolTurns,
    check_choice_name,
    unsupported_content,
    validate_at,
)
from trtllm_truss.api.errors import field_error
from trtllm_truss.api.openai import ResponseFormat
from trtllm_truss.api.sampling import INT32_MAX, SamplingFields, Text
from trtllm_truss.api.tools import MAX_TOOLS, check_functions

NOT_STORED = "this deployment keeps no state (runtime.store.enabled is false)"
NOT_SERVED = "not served: send the item itself (or continue by previous_response_id or conversation)"


class TextFormat(EchoedModel):
    type: Literal["text", "json_object", "json_schema"]
    name: Text | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: Text | None = None


class TextConfig(EchoedModel):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = Field(None, description="only the default: no other is served")


class ResponsesRequest(SamplingFields):
    model: Text | None = Field(None, description="accepted and echoed; this deployment serves one model")
    input: Text | list[dict[str, Any]] = Field(description="a user message, or a list of input items")
    instructions: Text | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    text: TextConfig | None = None
    stream: bool = False
    store: bool = Field(True, description="keep the response (GET /v1/responses/{id}, previous_response_id)")
    previous_response_id: Text | None = None
    conversation: Text | dict[str, Any] | None = None
    background: bool | None = None
    include: list[Text] | None = Field(None, description="only empty: no extra output is served")
    metadata: dict[str, Text] | None = None
    truncation: Literal["disabled"] | None = Field(None, description="only disabled: input is never cut")
    user: Text | None = None
    safety_identifier: Text | None = None
    prompt_cache_key: Text | None = Field(None, description="accepted; the engine reuses KV cache by itself")


def parse_responses_request(body: Any, *, stored: bool = True) -> ResponsesRequest:
    """The request; `stored`: whether this deployment keeps responses (else what needs a stored one is
    a 400 and `store` left out means false)."""
    req = validate_at(ResponsesRequest, body)
    if not stored:
        if req.conversation is not None:
            raise field_error("conversation", f"{NOT_STORED}: send the whole conversation as input items instead")
        if req.previous_response_id is not None:
            raise field_error("previous_response_id", f"{NOT_STORED}: send the whole conversation as input items instead")
        if req.background:
            raise field_error("background", f"{NOT_STORED}: background responses cannot be fetched later")
        if req.store and "store" in req.model_fields_set:
            raise field_error("store", f"{NOT_STORED}: send store: false")
        req.store = False
    if req.conversation is not None:
        if req.previous_response_id is not None:
            raise field_error("conversation", "continue either a conversation or a previous response, not both")
        if req.background:
            raise field_error("conversation", "not served with background: true (its items are added as the answer ends)")
    if req.background:
        if not req.store:
            raise field_error("background", "background responses need store: true (they are fetched by id)")
        if req.stream:
            raise field_error("stream", "a background response is not streamed here: poll GET /v1/responses/{id}")
    if req.include:
        raise field_error("include", f"{req.include[0]!r}: no extra output is served (send include: [])")
    return req


# --- request -> chat ------------------------------------------------------------------------------


class _FunctionTool(EchoedModel):
    type: Literal["function"]
    name: Text
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


def chat_tools(req: ResponsesRequest) -> tuple[list[dict[str, Any]], str]:
    """The request's function tools in chat form, and `tool_choice` as the core takes it ("none",
    "auto", "required" or a function's name; an `allowed_tools` choice keeps only the tools it
    allows)."""
    tools: list[dict[str, Any]] = []
    for i, raw in enumerate(req.tools):
        where = f"tools[{i}]"
        kind = raw.get("type") if isinstance(raw, Mapping) else None
        if kind != "function":
            raise field_error(f"{where}.type", f"{kind!r} tools are not served: only function tools (the client runs them)")
        tool = validate_at(_FunctionTool, raw, where)
        function = {"name": tool.name, "parameters": tool.parameters or {"type": "object", "properties": {}}}
        if tool.description is not None:
            function["description"] = tool.description
        tools.append({"type": "function", "function": function})
    check_functions(
        (t["function"]["name"], t["function"]["parameters"], f"tools[{i}].name", f"tools[{i}].parameters")
        for i, t in enumerate(tools)
    )
    names = [t["function"]["name"] for t in tools]
    choice = req.tool_choice
    if isinstance(choice, str):
        if choice == "required" and not tools:
            raise field_error("tool_choice", "'required' needs at least one tool in tools")
        return tools, choice
    kind = choice.get("type")
    if kind == "function":
        name = choice.get("name")
        if not isinstance(name, str):
            raise field_error("tool_choice.name", "the function's name (a string) is required", 422)
        check_choice_name("tool_choice.name", name, names)
        return tools, name
    if kind == "allowed_tools":
        mode, allowed = choice.get("mode"), choice.get("tools")
        if mode not in ("auto", "required"):
            raise field_error("tool_choice.mode", f"must be 'auto' or 'required' (got {mode!r})", 422)
        if not isinstance(allowed, list) or not allowed:
            raise field_error("tool_choice.tools", "a non-empty list of {type: function, name} is required", 422)
        keep = []
        for j, entry in enumerate(allowed):
            name = entry.get("name") if isinstance(entry, Mapping) else None
            if not isinstance(entry, Mapping) or entry.get("type") != "function" or not isinstance(name, str):
                raise field_error(f"tool_choice.tools[{j}]", "only {type: 'function', name} entries are served")
            check_choice_name(f"tool_choice.tools[{j}].name", name, names)
            keep.append(name)
        return [t for t in tools if t["function"]["name"] in keep], mode
    raise field_error("tool_choice.type", f"{kind!r} is not served: use none, auto, required, a function or allowed_tools")


def chat_response_format(req: ResponsesRequest) -> ResponseFormat | None:
    """`text.format` as chat's `response_format` (None for plain text)."""
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat(type="json_object")
    if fmt.schema_ is None or not fmt.name:
        raise field_error("text.format", "json_schema needs name and schema", 422)
    json_schema: dict[str, Any] = {"name": fmt.name, "schema": fmt.schema_}
    if fmt.strict is not None:
        json_schema["strict"] = fmt.strict
    return ResponseFormat(type="json_schema", json_schema=json_schema)


_TEXT_PARTS = {"input_text", "output_text", "text"}
_MEDIA_PARTS = {"input_image": "image", "input_file": "file", "input_audio": "audio"}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise field_error(where, f"expected a string or a list of content parts, got {type(content).__name__}", 422)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _MEDIA_PARTS:
            raise unsupported_content(f"{where}[{j}].type", kind)
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
            continue
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise field_error(f"{where}[{j}]", f"expected a text part ({', '.join(sorted(_TEXT_PARTS))}) with text, got type {kind!r}", 422)
        texts.append(part["text"])
    return "".join(texts)


def input_items(req: ResponsesRequest) -> list[Any]:
    """The request's `input` as a list of items (a string is one user message)."""
    return [{"role": "user", "content": req.input}] if isinstance(req.input, str) else list(req.input)


def chat_messages(req: ResponsesRequest, history: list[dict[str, Any]] | tuple = ()) -> list[dict[str, Any]]:
    """The conversation as OpenAI chat messages (see the module's docstring): `history` (a stored
    turn's earlier items), then the request's input items."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    items = [*history, *input_items(req)]
    turns = ToolTurns()
    reasoning: list[str] = []  # reasoning items waiting for the assistant turn they belong to

    def assistant() -> dict[str, Any]:
        """The assistant turn to add to: the last message if it is one still open, else a new one."""
        last = messages[-1] if messages else None
        if last is None or last["role"] != "assistant" or reasoning:
            last = {"role": "assistant", "content": ""}
            if reasoning:
                last["reasoning_content"] = "".join(reasoning)
                reasoning.clear()
            messages.append(last)
        return last

    for i, item in enumerate(items):
        # An item of the stored history is named by its place in it (it was checked when it was sent).
        where = f"input[{i - len(history)}]" if i >= len(history) else f"previous_response_id: item {i}"
        if not isinstance(item, Mapping):
            raise field_error(where, f"expected an input item (a JSON object), got {type(item).__name__}", 422)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise field_error(f"{where}.role", f"must be one of {', '.join(_ROLES)} (got {role!r})", 422)
            text = _content_text(item.get("content"), f"{where}.content")
            if role == "assistant":
                turn = assistant()
                if turn.get("tool_calls"):  # text after calls: a new turn
                    turn = {"role": "assistant", "content": ""}
                    messages.append(turn)
                turn["content"] += text
            else:
                messages.append({"role": _ROLES[role], "content": text})
        elif kind == "function_call":
            call = validate_at(_FunctionCall, item, where)
            turns.call(f"{where}.call_id", call.call_id)
            assistant().setdefault("tool_calls", []).append(
                {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            )
        elif kind == "function_call_output":
            result = validate_at(_FunctionCallOutput, item, where)
            turns.result(f"{where}.call_id", result.call_id, call_kind="function_call item")
            output = _content_text(result.output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": result.call_id, "content": output})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning.append(_content_text([{"type": "text", "text": p.get("text")} for p in parts if isinstance(p, Mapping)], f"{where}.content"))
        elif kind == "item_reference":
            raise field_error(f"{where}.type", f"item_reference: {NOT_SERVED}")
        else:
            raise field_error(f"{where}.type", f"{kind!r} input items are not served (message, function_call, function_call_output, reasoning are)")
    if not any(m["role"] in ("user", "tool") for m in messages):
        raise field_error("input", "holds no user message or function_call_output to answer")
    return messages


class _FunctionCall(EchoedModel):
    call_id: Text = Field(min_length=1)
    name: Text = Field(min_length=1)
    arguments: Text


class _FunctionCallOutput(EchoedModel):
    call_id: Text = Field(min_length=1)
    output: Text | list[dict[str, Any]]


# --- the response -------------------------------------------------------------------------------


def conversation_ref(value: str | dict[str, Any]) -> str:
    return value if isinstance(value, str) else str(value.get("id"))


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": prompt_tokens + completion_tokens,
    }


def response_object(
    req: ResponsesRequest,
    response_id: str,
    created_at: float,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage_: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `response` object (also the payload of the created/in_progress/completed events)."""
    body: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": req.model or "model",
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": None,
        "store": req.store,
        "background": bool(req.background),
        "conversation": None if req.conversation is None else {"id": conversation_ref(req.conversation)},
        "temperature": req.temperature,
        "text": {"format": {"type": "text"}} if req.text is None or req.text.format is None else req.text.model_dump(by_alias=True, exclude_none=True),
        "tool_choice": req.tool_choice,
        "tools": req.tools,
        "top_p": req.top_p,
        "truncation": "disabled",
        "usage": usage_,
        "user": req.user,
        "metadata": req.metadata or {},
    }
    if status in ("completed", "incomplete"):
        body["completed_at"] = time.time()
    return body
