"""Tools on chat requests before anything reaches a worker: what is refused (400 naming the field),
how tool calls and results become template turns, and how the core turns tool_choice into an output
parser and a guided-decoding constraint."""

from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import pytest
from fastapi import HTTPException

from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.api.openai import ChatCompletionRequest
from trtllm_truss.serving.chat import generation_request
from trtllm_truss.serving.core import RequestCore

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Berlin"]}, "celsius": {"type": "boolean"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER_SCHEMA}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
USER = {"role": "user", "content": "Weather in Paris?"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def _request(**body) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [USER], **body})


def _refused(**body) -> str:
    with pytest.raises(HTTPException) as caught:
        generation_request(_request(**body))
    assert caught.value.status_code == 400
    return caught.value.detail


@pytest.mark.parametrize(
    "body, field",
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_stock"}}}, "tool_choice.function.name:"),
        ({"tool_choice": "required"}, "tool_choice:"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]}, "tools[0].function.parameters: not a valid JSON Schema"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": {"minLength": -1}}}}}]}, "tools[0].function.parameters:"),
        ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name:"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name:"),
        ({"messages": [USER, {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}]}, "messages[1].tool_call_id:"),
        ({"messages": [USER, {"role": "tool", "content": "sunny"}]}, "messages[1].tool_call_id:"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": [CALL]}]}, "messages[0].tool_calls:"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, "messages[0].content[0].type: images"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "input_audio", "input_audio": {}}]}]}, "messages[0].content[1].type: audio"),
        ({"messages": [{"role": "user", "content": [{"type": "file", "file": {}}]}]}, "messages[0].content[0].type: files"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize:"),
    ],
)
def test_bad_tools_and_messages_are_400_naming_the_field(body, field):
    assert field in _refused(**body)


def test_calls_and_results_become_template_turns_with_the_functions_name():
    request = generation_request(_request(
        messages=[USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        tools=TOOLS,
    ))
    assert request.messages[1] == {"role": "assistant", "content": "", "tool_calls": [CALL]}
    assert request.messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"}
    assert [t["function"]["name"] for t in request.tools] == ["get_weather", "get_time"]
    assert request.tool_choice == "auto"


class _Pool:
    def __init__(self, tool_call_parser: str | None) -> None:
        self.info = SimpleNamespace(tool_call_parser=tool_call_parser, reasoning_parser=None)


def _core(tool_call_parser: str | None = "hermes") -> RequestCore:
    core = RequestCore()
    core.attach(_Pool(tool_call_parser), RequestLimits(max_input_len=512, max_output_len=64))  # type: ignore[arg-type]
    return core


def test_auto_uses_the_deployments_parser_and_hands_the_template_objects():
    spec = _core().spec(generation_request(_request(
        messages=[USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}], tools=TOOLS)))
    assert spec.tool_parser == "hermes" and spec.params.guided_decoding_guide is None
    assert spec.tools is not None and len(spec.tools) == 2
    assert spec.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}


def test_auto_without_a_parser_is_400_and_none_sends_no_tools():
    core = _core(tool_call_parser=None)
    with pytest.raises(HTTPException) as caught:
        core.spec(generation_request(_request(tools=TOOLS)))
    assert "tools:" in caught.value.detail and "tool_call_parser" in caught.value.detail
    spec = core.spec(generation_request(_request(tools=TOOLS, tool_choice="none")))
    assert spec.tools is None and spec.tool_parser is None


@pytest.mark.parametrize("parallel", [True, False])
def test_required_is_a_json_schema_for_an_array_of_calls(parallel):
    spec = _core().spec(generation_request(_request(tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel)))
    assert spec.tool_parser == "guided_required" and spec.params.guided_decoding_guide_type == "json_schema"
    schema = json.loads(spec.params.guided_decoding_guide)
    jsonschema.Draft202012Validator.check_schema(schema)
    two = [{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]
    assert jsonschema.Draft202012Validator(schema).is_valid(two) is parallel
    assert jsonschema.Draft202012Validator(schema).is_valid(two[:1])
    for bad in ([], [{"name": "get_weather", "parameters": {"city": "Rome"}}], [{"name": "get_stock", "parameters": {}}]):
        assert not jsonschema.Draft202012Validator(schema).is_valid(bad)


def test_a_named_function_is_its_parameters_schema():
    choice = {"type": "function", "function": {"name": "get_weather"}}
    spec = _core().spec(generation_request(_request(tools=TOOLS, tool_choice=choice)))
    assert (spec.tool_parser, spec.tool_parser_arg) == ("guided_named", "get_weather")
    assert json.loads(spec.params.guided_decoding_guide) == WEATHER_SCHEMA


def test_parallel_tool_calls_false_keeps_the_first_call():
    from trtllm_truss.serving.chat import assistant_message
    from trtllm_truss.serving.request import Answer, Finish, ToolCall

    answer = Answer("", None, [ToolCall("call_a", "get_time", "{}"), ToolCall("call_b", "get_weather", "{}")], [], Finish("tool_calls", 1, 1))
    assert [c.id for c in assistant_message(answer).tool_calls] == ["call_a", "call_b"]
    only = assistant_message(answer, parallel_tool_calls=False)
    assert [c.id for c in only.tool_calls] == ["call_a"] and only.content is None


def test_the_guided_parser_names_agree_with_the_parsers_registry():
    """api.tools hands the request core these names; the parsers register them (written twice, so that the
    parsers load without the HTTP layer)."""
    from trtllm_truss.api.tools import GUIDED_NAMED_PARSER, GUIDED_REQUIRED_PARSER
    from trtllm_truss.parsers import TOOL_PARSERS

    assert {GUIDED_REQUIRED_PARSER, GUIDED_NAMED_PARSER} <= set(TOOL_PARSERS)
