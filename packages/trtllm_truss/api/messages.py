"""Anthropic's Messages API (`POST /v1/messages`): the request, its conversion to chat turns and
tools, the message and its stream events, and the API's error shape.

Content blocks become OpenAI chat messages: `system` a leading system message, `text` blocks the
turn's text, assistant `tool_use` blocks `tool_calls` (arguments as JSON text), user
`tool_result` blocks `tool` messages before the user's text (each must answer an earlier
`tool_use`), assistant `thinking` blocks the turn's `reasoning_content`. The model takes text only:
image, document and other blocks are a 400 naming the block.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import Field

from trtllm_truss.api.conversation import (
    EchoedModel,
    ToolTurns,
    check_choice_name,
    unsupported_content,
    validate_at,
)
from trtllm_truss.api.errors import encodable, field_error
from trtllm_truss.api.openai import ResponseFormat
from trtllm_truss.api.sampling import INT32_MAX, MAX_WORDS, SamplingFields, Text, Word
from trtllm_truss.api.tools import MAX_TOOLS, check_functions

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    error_type = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": error_type, "message": encodable(message)}}


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None, **_: Any) -> JSONResponse:
    """Anthropic's error shape; OpenAI's `param`/`code` have no place in it (a 404 is its not_found_error)."""
    return JSONResponse(status_code=status, content=error_body(status, message), headers=dict(headers or {}))


class Metadata(EchoedModel):
    user_id: Text | None = None


class OutputFormat(EchoedModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(EchoedModel):
    format: OutputFormat | None = None
    effort: None = Field(None, description="refused: no effort level is served")


class MessagesRequest(SamplingFields):
    model: Text | None = Field(None, description="accepted and echoed; this deployment serves one model")
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(ge=1, le=INT32_MAX)
    system: Text | list[dict[str, Any]] | None = None
    stop_sequences: list[Word] = Field(default_factory=list, max_length=MAX_WORDS)
    stream: bool = False
    tools: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_TOOLS)
    tool_choice: dict[str, Any] | None = None
    metadata: Metadata | None = None
    output_config: OutputConfig | None = None
    thinking: dict[str, Any] | None = Field(None, description="refused unless disabled: the model and its reasoning parser decide")


class MessagesCountRequest(MessagesRequest):
    """`POST /v1/messages/count_tokens`: Anthropic's body is a Messages request without `max_tokens`."""

    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="not part of a count; accepted")


def parse_messages_request(body: Any, model: type[MessagesRequest] = MessagesRequest) -> MessagesRequest:
    req = validate_at(model, body)
    if req.thinking is not None and req.thinking.get("type") != "disabled":
        raise field_error(
            "thinking",
            "thinking is not configurable here: a reasoning model's thinking comes back as thinking blocks,"
            " with no token budget (leave thinking out)",
        )
    return req


# --- request -> chat ------------------------------------------------------------------------------


class _Tool(EchoedModel):
    name: Text
    description: Text | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None


class _ToolUse(EchoedModel):
    id: Text = Field(min_length=1)
    name: Text = Field(min_length=1)
    input: dict[str, Any]


class _ToolResult(EchoedModel):
    tool_use_id: Text = Field(min_length=1)
    content: Text | list[dict[str, Any]] = ""
    is_error: bool = False


def chat_response_format(req: MessagesRequest) -> ResponseFormat | None:
    """`output_config.format` as chat's `response_format` (None without one)."""
    fmt = req.output_config.format if req.output_config is not None else None
    if fmt is None:
        return None
    return ResponseFormat(type="json_schema", json_schema={"name": "output", "schema": fmt.schema_})


def chat_tools(req: MessagesRequest) -> tuple[list[dict[str, Any]], str, bool]:
    """The tools in chat form, `tool_choice` as the core takes it ("none", "auto", "required" or a
    function's name), and whether parallel calls are allowed."""
    tools = []
    for i, raw in enumerate(req.tools):
        where = f"tools[{i}]"
        if not isinstance(raw, Mapping):
            raise field_error(where, f"expected a tool object, got {type(raw).__name__}", 422)
        if raw.get("type") not in (None, "custom"):
            raise field_error(f"{where}.type", f"{raw.get('type')!r}: server tools are not served, only client tools (name, input_schema)")
        tool = validate_at(_Tool, raw, where)
        function = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        tools.append({"type": "function", "function": function})
    check_functions(
        (t["function"]["name"], t["function"]["parameters"], f"tools[{i}].name", f"tools[{i}].input_schema")
        for i, t in enumerate(tools)
    )
    choice = req.tool_choice
    if choice is None:
        return tools, ("auto" if tools else "none"), True
    kind = choice.get("type")
    parallel = not choice.get("disable_parallel_tool_use", False)
    if kind in ("auto", "none"):
        return tools, kind, parallel
    if kind == "any":
        if not tools:
            raise field_error("tool_choice", "'any' needs at least one tool in tools")
        return tools, "required", parallel
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise field_error("tool_choice.name", "the tool's name (a string) is required", 422)
        check_choice_name("tool_choice.name", name, [t["function"]["name"] for t in tools])
        return tools, name, parallel
    raise field_error("tool_choice.type", f"must be auto, any, tool or none (got {kind!r})", 422)


_MEDIA_BLOCKS = {"image", "document", "search_result", "container_upload"}


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise field_error(where, f"expected a string or a list of content blocks, got {type(content).__name__}", 422)
    texts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind in _MEDIA_BLOCKS:
            raise unsupported_content(f"{where}[{j}].type", kind)
        if kind != "text" or not isinstance(block.get("text"), str):
            raise field_error(f"{where}[{j}]", f"expected a text block with text, got type {kind!r}", 422)
        texts.append(block["text"])
    return "".join(texts)


def chat_messages(req: MessagesRequest) -> list[dict[str, Any]]:
    """The conversation as OpenAI chat messages (see the module's docstring)."""
    messages: list[dict[str, Any]] = []
    if req.system:
        messages.append({"role": "system", "content": _text_of(req.system, "system")})
    turns = ToolTurns()
    for i, message in enumerate(req.messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise field_error(where, f"expected a message object, got {type(message).__name__}", 422)
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise field_error(f"{where}.role", f"must be user or assistant (got {role!r}; the system prompt is `system`)", 422)
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise field_error(f"{where}.content", f"expected a string or a list of content blocks, got {type(content).__name__}", 422)
        text, calls, thinking, results = [], [], [], []
        for j, block in enumerate(blocks):
            at = f"{where}.content[{j}]"
            kind = block.get("type") if isinstance(block, Mapping) else None
            if kind == "text":
                if not isinstance(block.get("text"), str):
                    raise field_error(f"{at}.text", "a text block needs its text (a string)", 422)
                text.append(block["text"])
            elif kind in _MEDIA_BLOCKS:
                raise unsupported_content(f"{at}.type", kind)
            elif kind == "tool_use" and role == "assistant":
                use = validate_at(_ToolUse, block, at)
                turns.call(f"{at}.id", use.id)
                arguments = json.dumps(use.input, ensure_ascii=False)
                calls.append({"id": use.id, "type": "function", "function": {"name": use.name, "arguments": arguments}})
            elif kind == "tool_result" and role == "user":
                result = validate_at(_ToolResult, block, at)
                turns.result(f"{at}.tool_use_id", result.tool_use_id, call_kind="tool_use block")
                output = _text_of(result.content, f"{at}.content")
                if result.is_error:  # templates have no flag for it: the model reads it in the text
                    output = f"Error: {output}"
                results.append({"role": "tool", "tool_call_id": result.tool_use_id, "content": output})
            elif kind == "thinking" and role == "assistant" and isinstance(block.get("thinking"), str):
                thinking.append(block["thinking"])
            elif kind == "redacted_thinking" and role == "assistant":
                continue  # encrypted by another provider: nothing a model here can read
            else:
                raise field_error(f"{at}.type", f"a {kind!r} block is not served in a {role} message", 400 if isinstance(kind, str) else 422)
        messages.extend(results)
        if role == "user":
            if text or not results:
                messages.append({"role": "user", "content": "".join(text)})
            continue
        if i == len(req.messages) - 1:
            # A final assistant message asks the model to continue it (prefill); the chat template
            # here always opens a new assistant turn, so it would be answered, not continued.
            raise field_error(f"{where}.role", "a final assistant message (prefill) is not served: end with a user message")
        turn: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
        if calls:
            turn["tool_calls"] = calls
        if thinking:
            turn["reasoning_content"] = "".join(thinking)
        messages.append(turn)
    return messages


# --- the message ----------------------------------------------------------------------------------


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def stop_reason(finish_reason: str | None, stop_sequence: str | None) -> str:
    if finish_reason == "length":
        return "max_tokens"
    if finish_reason == "tool_calls":
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def message_object(
    message_id: str, model: str, content: list[dict[str, Any]], *, stop_reason_: str | None,
    stop_sequence: str | None, input_tokens: int, output_tokens: int, cache_read_input_tokens: int = 0,
) -> dict[str, Any]:
    """Anthropic's message; `input_tokens` is the prompt minus `cache_read_input_tokens` (Anthropic counts cache
    reads apart from input tokens: the prompt is their sum, with cache_creation_input_tokens, always 0 here)."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason_,
        "stop_sequence": stop_sequence,
        "usage": message_usage(input_tokens, output_tokens, cache_read_input_tokens),
    }


def message_usage(input_tokens: int, output_tokens: int, cache_read_input_tokens: int = 0) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cache_read_input_tokens,
        "output_tokens": output_tokens,
    }
