"""The Responses and Messages protocols on their own: conversion of their conversations and tools
to chat turns, refusals naming the dialect's fields, and the stream events each builds (their order,
and that a streamed and a non-streamed answer carry the same output)."""

from __future__ import annotations

import json

import pytest
from fastapi import HTTPException
from trtllm_truss.api import messages as msg
from trtllm_truss.api import responses as rsp
from trtllm_truss.api.messages_events import MessageEvents
from trtllm_truss.api.responses_events import ResponseEvents

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def refusal(call, *args) -> HTTPException:
    with pytest.raises(HTTPException) as info:
        call(*args)
    assert 400 <= info.value.status_code < 500
    return info.value


# --- Responses: request -> chat -------------------------------------------------------------------


def responses(**body) -> rsp.ResponsesRequest:
    return rsp.parse_responses_request({"model": "m", **body})


def test_responses_items_become_chat_turns():
    req = responses(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "need a tool"}]},
            {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "weather", "arguments": '{"city": "Paris"}', "status": "completed"},
            {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": '{"city": "Lyon"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Sunny and rain.", "annotations": [], "logprobs": []}]},
            {"role": "user", "content": "Thanks"},
        ],
    )
    assert rsp.chat_messages(req) == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "need a tool", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Lyon"}'}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "assistant", "content": "Sunny and rain."},
        {"role": "user", "content": "Thanks"},
    ]


def test_responses_tools_and_choices_in_chat_form():
    tools = [{"type": "function", "name": "weather", "parameters": WEATHER, "strict": True}, {"type": "function", "name": "time"}]
    chat, choice = rsp.chat_tools(responses(input="hi", tools=tools, tool_choice={"type": "function", "name": "time"}))
    assert chat[0] == {"type": "function", "function": {"name": "weather", "parameters": WEATHER}}
    assert chat[1]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert choice == "time"
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "weather"}]}
    chat, choice = rsp.chat_tools(responses(input="hi", tools=tools, tool_choice=allowed))
    assert [t["function"]["name"] for t in chat] == ["weather"] and choice == "required"
    fmt = {"format": {"type": "json_schema", "name": "w", "schema": WEATHER, "strict": True}}
    assert rsp.chat_response_format(responses(input="hi", text=fmt)).model_dump(by_alias=True, exclude_none=True) == {
        "type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER, "strict": True}
    }


@pytest.mark.parametrize(
    "body, field",
    [
        ({"conversation": "conv_1", "previous_response_id": "resp_1"}, "conversation"),
        ({"conversation": {"id": "conv_1"}, "background": True}, "conversation"),
        ({"background": True, "store": False}, "background"),
        ({"background": True, "stream": True}, "stream"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_responses_refusals_of_the_request_name_the_field(body, field):
    error = refusal(rsp.parse_responses_request, {"input": "hi", **body})
    assert f"{field}:" in error.detail or f"{field}" in error.detail.split(":")[1]


@pytest.mark.parametrize(
    "body, field",
    [({"store": True}, "store"), ({"previous_response_id": "resp_1"}, "previous_response_id"), ({"background": True}, "background"),
     ({"conversation": "conv_1"}, "conversation")],
)
def test_responses_without_a_store_refuse_what_needs_one(body, field):
    error = refusal(lambda b: rsp.parse_responses_request(b, stored=False), {"input": "hi", **body})
    assert error.status_code == 400 and f"{field}: " in error.detail and "keeps no state" in error.detail


def test_responses_store_by_default_as_openai():
    assert rsp.parse_responses_request({"input": "hi"}).store is True
    assert rsp.parse_responses_request({"input": "hi"}, stored=False).store is False  # left out: nothing to keep it in


@pytest.mark.parametrize(
    "body, field",
    [
        ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}}, "tool_choice.name"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": 3}}]}, "tools[0].parameters"),
        ({"tools": [{"type": "function", "name": "f b"}]}, "tools[0].name"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "f"}, {"type": "function", "name": "f"}]}, "tools[1].name"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_responses_bad_tools_name_the_field(body, field):
    error = refusal(rsp.chat_tools, responses(input="hi", **body))
    assert error.detail.startswith(f"invalid request: {field}:"), error.detail


@pytest.mark.parametrize(
    "items, field",
    [
        ([{"type": "function_call_output", "call_id": "nope", "output": "1"}], "input[0].call_id"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}], "input[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}], "input[0].content[0].type"),
        ([{"role": "user", "content": "hi"}, {"type": "item_reference", "id": "msg_1"}], "input[1].type"),
        ([{"type": "function_call", "call_id": "c", "name": "f"}], "input[0].arguments"),
        ([{"role": "tool", "content": "x"}], "input[0].role"),
    ],
)
def test_responses_bad_items_name_the_field(items, field):
    error = refusal(rsp.chat_messages, responses(input=items))
    assert error.detail.startswith(f"invalid request: {field}"), error.detail


# --- Messages: request -> chat --------------------------------------------------------------------


def messages(**body) -> msg.MessagesRequest:
    return msg.parse_messages_request({"model": "m", "max_tokens": 16, **body})


def test_messages_blocks_become_chat_turns():
    req = messages(
        system=[{"type": "text", "text": "Be brief."}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "need a tool", "signature": ""},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}], "is_error": False},
                {"type": "text", "text": "And tomorrow?"},
            ]},
        ],
    )
    assert msg.chat_messages(req) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "need a tool", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
        ]},
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"},
    ]


def test_messages_tool_choices_in_chat_form():
    tools = [{"name": "weather", "description": "d", "input_schema": WEATHER}]
    assert msg.chat_tools(messages(messages=[{"role": "user", "content": "x"}], tools=tools)) == (
        [{"type": "function", "function": {"name": "weather", "parameters": WEATHER, "description": "d"}}], "auto", True
    )
    base = {"messages": [{"role": "user", "content": "x"}], "tools": tools}
    assert msg.chat_tools(messages(**base, tool_choice={"type": "any", "disable_parallel_tool_use": True}))[1:] == ("required", False)
    assert msg.chat_tools(messages(**base, tool_choice={"type": "tool", "name": "weather"}))[1] == "weather"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
        ({"tools": [{"name": "f", "input_schema": {"type": "object", "required": "city"}}]}, "tools[0].input_schema"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ],
)
def test_messages_bad_tools_name_the_field(body, field):
    base = {"tools": [{"name": "weather", "input_schema": WEATHER}], "messages": [{"role": "user", "content": "x"}]}
    error = refusal(msg.chat_tools, messages(**{**base, **body}))
    assert error.detail.startswith(f"invalid request: {field}"), error.detail


@pytest.mark.parametrize(
    "conversation, field",
    [
        ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "1"}]}], "messages[0].content[0].tool_use_id"),
        ([{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}], "messages[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "document", "source": {}}]}], "messages[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}]}], "messages[0].content[0].tool_use_id"),
        ([{"role": "system", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}], "messages[1].role"),
    ],
)
def test_messages_bad_blocks_name_the_field(conversation, field):
    error = refusal(msg.chat_messages, messages(messages=conversation))
    assert error.detail.startswith(f"invalid request: {field}"), error.detail


def test_messages_error_shape_and_thinking_refusal():
    assert msg.error_body(400, "invalid request: x: bad") == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "invalid request: x: bad"}
    }
    assert msg.error_body(429, "busy")["error"]["type"] == "rate_limit_error"
    assert msg.error_body(503, "down")["error"]["type"] == "overloaded_error"
    assert "thinking" in refusal(msg.parse_messages_request, {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled", "budget_tokens": 1024}}).detail
    assert "max_tokens" in refusal(msg.parse_messages_request, {"messages": [{"role": "user", "content": "x"}]}).detail


# --- the output builders --------------------------------------------------------------------------


def feed(builder, finish_args):
    events = builder.start()
    events += builder.reasoning("Let me think.")
    events += builder.text("It is ")
    events += builder.text("sunny.")
    events += builder.tool_call(0, "call_1", "weather")
    events += builder.tool_arguments(0, '{"city": ')
    events += builder.tool_arguments(0, '"Paris"}')
    events += builder.finish(*finish_args)
    return events


def test_responses_stream_events_in_order_and_same_output_as_unstreamed():
    req = responses(input="hi")
    streamed = ResponseEvents(req, emit=True)
    events = feed(streamed, ("tool_calls", 7, 12))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e.get("output_index") for e in events if e["type"] == "response.output_item.added"] == [0, 1, 2]
    json.dumps(events)  # every event is JSON
    whole = ResponseEvents(req, emit=False)
    assert feed(whole, ("tool_calls", 7, 12)) == []
    final = whole.response()
    strip = lambda items: [{k: v for k, v in item.items() if k != "id"} for item in items]
    assert strip(final["output"]) == strip(events[-1]["response"]["output"])
    assert final["status"] == "completed" and final["usage"]["total_tokens"] == 19
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][2]["arguments"] == '{"city": "Paris"}' and final["output"][1]["content"][0]["text"] == "It is sunny."


def test_responses_length_is_incomplete():
    builder = ResponseEvents(responses(input="hi"), emit=True)
    events = builder.start() + builder.text("abc") + builder.finish("length", 3, 5)
    assert events[-1]["type"] == "response.incomplete"
    assert builder.response()["incomplete_details"] == {"reason": "max_output_tokens"}


def test_messages_stream_events_in_order_and_same_content_as_unstreamed():
    streamed = MessageEvents("m", emit=True)
    events = feed(streamed, ("tool_calls", 7, 12))
    assert [(e["type"], e.get("index"), (e.get("delta") or e.get("content_block") or {}).get("type")) for e in events] == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"), ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"), ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"), ("content_block_stop", 2, None),
        ("message_delta", None, None), ("message_stop", None, None),
    ]
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2]["usage"] == {"input_tokens": 7, "output_tokens": 12}
    whole = MessageEvents("m", emit=False)
    assert feed(whole, ("tool_calls", 7, 12)) == []
    assert whole.message()["content"] == streamed.message()["content"] == [
        {"type": "thinking", "thinking": "Let me think.", "signature": ""},
        {"type": "text", "text": "It is sunny."},
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
    ]
    stopped = MessageEvents("m", emit=False)
    stopped.text("x")
    stopped.finish("stop", 1, 1, "END")
    assert (stopped.message()["stop_reason"], stopped.message()["stop_sequence"]) == ("stop_sequence", "END")
