"""The agents' APIs against this repository served by truss's own model server (truss 0.18.35, no
docker) on the embedded default: `/v1/responses` through the official `openai` SDK, `/v1/messages`
through the official `anthropic` SDK, each streamed and not (greedy answers agree), with tools;
forced tool calls cut by the token limit kept as calls in each dialect (and through LangChain);
bad input answered in each API's error shape; and an agent loop of OpenAI's Agents SDK that calls
one of our tools under `tool_choice: required` and then answers.

Tool calls forced by `tool_choice` (required, a named tool) are guided decoding on the stand-in
engine: the embedded model returns a call whose arguments validate against the tool's schema.
One server for the module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated

import anthropic
import httpx
import jsonschema
import openai
import pytest
from pydantic import Field
from trtllm_truss.fronts.truss_server import TrussServer
from truss_serving import FRONTS, serve_front, serve_truss

pytestmark = [pytest.mark.truss_server, pytest.mark.triton, pytest.mark.slow, pytest.mark.torch]

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
GREEDY = {"temperature": 0}
# The anthropic SDK (2.x) has no sampling arguments of its own: they travel in the body as extras.
GREEDY_ANTHROPIC = {"extra_body": GREEDY}


@pytest.fixture(scope="module")
def truss_server(tmp_path_factory) -> Iterator[TrussServer]:
    yield from serve_front("truss", tmp_path_factory.mktemp("truss_server_agent_apis"), {})


@pytest.fixture(scope="module")
def direct_server(tmp_path_factory) -> Iterator[TrussServer]:
    yield from serve_front("direct", tmp_path_factory.mktemp("truss_server_agent_apis_direct"), {})


@pytest.fixture(scope="module")
def llmapi_server(tmp_path_factory) -> Iterator[TrussServer]:
    """Backend llmapi (our LLM-API model, on the LLM-API double here) under truss's server: started only
    for the tests marked on_both_backends, those exercising what differs there (guides, stops, sampling)."""
    yield from serve_truss(tmp_path_factory.mktemp("truss_server_agent_apis_llmapi"), {"TRTLLM_RUNTIME__BACKEND": "llmapi"})


# A client's parameter names the server it talks to: a front (both on the tensor stand-in), or a backend
# (both under truss's server). Each server starts on first use and serves the whole module.
SERVER_FIXTURE = {"truss": "truss_server", "direct": "direct_server", "pytorch": "truss_server", "llmapi": "llmapi_server"}


@pytest.fixture(scope="module", params=FRONTS)
def server(request) -> TrussServer:
    return request.getfixturevalue(SERVER_FIXTURE[request.param])


@pytest.fixture(scope="module", params=FRONTS)
def oai(request) -> openai.OpenAI:
    url = request.getfixturevalue(SERVER_FIXTURE[request.param]).url
    return openai.OpenAI(base_url=url + "/v1", api_key="not-checked", max_retries=0, timeout=120.0)


@pytest.fixture(scope="module", params=FRONTS)
def claude(request) -> anthropic.Anthropic:
    url = request.getfixturevalue(SERVER_FIXTURE[request.param]).url
    return anthropic.Anthropic(base_url=url, api_key="not-checked", max_retries=0, timeout=120.0)


def on_both_backends(client: str):
    return pytest.mark.parametrize(client, ["pytorch", "llmapi"], indirect=True)


# --------------------------------------------------------------------------------- /v1/responses


@on_both_backends("oai")
def test_responses_streamed_and_not_agree(oai: openai.OpenAI):
    body = dict(model="embedded", input="Tell me about the sea", instructions="Answer briefly.", max_output_tokens=12, **GREEDY)
    whole = oai.responses.create(**body)
    assert whole.object == "response" and whole.output_text
    assert whole.usage.output_tokens <= 12 and whole.usage.input_tokens > 0
    assert whole.status == ("incomplete" if whole.usage.output_tokens == 12 else "completed")

    events = list(oai.responses.create(**body, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] == f"response.{whole.status}"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text == whole.output_text  # greedy: the same answer either way
    assert final.usage.output_tokens == whole.usage.output_tokens

    # The SDK's own stream accumulator (responses.stream) takes the events in their order and
    # rebuilds the same response (its get_final_response() wants `completed`, not `incomplete`).
    with oai.responses.stream(**body) as stream:
        rebuilt = list(stream)[-1]
    assert rebuilt.type == f"response.{whole.status}" and rebuilt.response.output_text == whole.output_text


def test_responses_conversation_items_and_incomplete_at_the_limit(oai: openai.OpenAI):
    response = oai.responses.create(
        model="embedded",
        input=[
            {"role": "developer", "content": "You are terse."},
            {"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Blue.", "annotations": []}]},
            {"role": "user", "content": "Another one?"},
        ],
        max_output_tokens=4,
        extra_body={"ignore_eos": True},
        **GREEDY,
    )
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 4


def _weather_tool_responses() -> dict:
    return {"type": "function", "name": "weather", "description": "The weather forecast", "parameters": WEATHER, "strict": True}


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "weather"}])
@on_both_backends("oai")
def test_responses_forced_tool_call_streamed_and_not(oai: openai.OpenAI, tool_choice):
    body = dict(
        model="embedded", input="What will the weather be in Paris?", tools=[_weather_tool_responses()],
        tool_choice=tool_choice, parallel_tool_calls=False, max_output_tokens=128, **GREEDY,
    )
    whole = oai.responses.create(**body)
    calls = [item for item in whole.output if item.type == "function_call"]
    assert len(calls) >= 1 and calls[0].name == "weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)

    events = list(oai.responses.create(**body, stream=True))
    added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    fragments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert added[0].name == "weather"
    assert fragments == "".join(d.arguments for d in done)  # the fragments concatenate to the arguments
    assert [d.arguments for d in done] == [c.arguments for c in calls]  # greedy: the same calls either way
    assert events[-1].type == "response.completed"


CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"], "additionalProperties": False}


def test_responses_json_schema_text_format_streamed_and_not(oai: openai.OpenAI):
    body = dict(
        model="embedded", input="Name a city.", max_output_tokens=40, **GREEDY,
        text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}},
    )
    whole = oai.responses.create(**body)
    jsonschema.validate(json.loads(whole.output_text), CITY)
    events = list(oai.responses.create(**body, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text


# ---------------------------------------------------------------------------------- /v1/messages


@on_both_backends("claude")
def test_messages_create_and_stream_agree(claude: anthropic.Anthropic):
    body = dict(
        model="embedded", max_tokens=12, system="Answer briefly.",
        messages=[{"role": "user", "content": "Tell me about the sea"}], **GREEDY_ANTHROPIC,
    )
    whole = claude.messages.create(**body)
    assert whole.type == "message" and whole.role == "assistant"
    assert [block.type for block in whole.content] == ["text"]
    assert whole.stop_reason in ("end_turn", "max_tokens")
    assert whole.usage.input_tokens > 0 and 0 < whole.usage.output_tokens <= 12

    with claude.messages.stream(**body) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == final.content[0].text == whole.content[0].text
    assert (final.stop_reason, final.usage.input_tokens, final.usage.output_tokens) == (
        whole.stop_reason, whole.usage.input_tokens, whole.usage.output_tokens
    )


@on_both_backends("claude")
def test_messages_stop_sequence_is_reported(claude: anthropic.Anthropic):
    body = dict(model="embedded", max_tokens=24, messages=[{"role": "user", "content": "Tell me about the sea"}], **GREEDY_ANTHROPIC)
    text = claude.messages.create(**body).content[0].text
    word = next(w for w in text.split()[1:] if w.isalpha())
    stopped = claude.messages.create(**body, stop_sequences=[word])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert stopped.content[0].text == text[: text.index(word)]


@pytest.mark.parametrize("tool_choice", [{"type": "any"}, {"type": "tool", "name": "weather"}])
@on_both_backends("claude")
def test_messages_forced_tool_use_create_and_stream(claude: anthropic.Anthropic, tool_choice):
    body = dict(
        model="embedded", max_tokens=128, messages=[{"role": "user", "content": "What will the weather be in Paris?"}],
        tools=[{"name": "weather", "description": "The weather forecast", "input_schema": WEATHER}],
        tool_choice={**tool_choice, "disable_parallel_tool_use": True}, **GREEDY_ANTHROPIC,
    )
    whole = claude.messages.create(**body)
    uses = [block for block in whole.content if block.type == "tool_use"]
    assert whole.stop_reason == "tool_use" and uses and uses[0].name == "weather"
    jsonschema.validate(uses[0].input, WEATHER)

    with claude.messages.stream(**body) as stream:
        final = stream.get_final_message()
    streamed = [block for block in final.content if block.type == "tool_use"]
    assert [(u.name, u.input) for u in streamed] == [(u.name, u.input) for u in uses]

    # The tool's result goes back as a tool_result block; the model answers in text.
    follow = claude.messages.create(
        model="embedded", max_tokens=8, tools=body["tools"], **GREEDY_ANTHROPIC,
        messages=[
            *body["messages"],
            {"role": "assistant", "content": [u.model_dump(include={"type", "id", "name", "input"}) for u in uses]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 24 C"}]},
        ],
        tool_choice={"type": "none"},
    )
    assert follow.content and follow.content[0].type == "text"


def test_messages_json_schema_output_format(claude: anthropic.Anthropic):
    created = claude.messages.create(
        model="embedded", max_tokens=40, messages=[{"role": "user", "content": "Name a city."}],
        output_config={"format": {"type": "json_schema", "schema": CITY}}, **GREEDY_ANTHROPIC,
    )
    jsonschema.validate(json.loads(created.content[0].text), CITY)


# ------------------------------------------------------------------------- tool calls at the limit
# Forced calls (tool_choice required / any) cut by the token limit (issue 40): the call the limit cut,
# with the arguments generated so far, is returned as a tool call with each dialect's length finish;
# nothing becomes text. One call (parallel calls off): guided in the model's own syntax (Hermes
# `<tool_call>` blocks, guides.tool_syntax), the answer ends after its call; the cuts of several calls
# are unit tests (tests/unit/test_cut_calls.py), forced answers with parallel calls allowed
# test_forced_calls_only.py.

CUT_CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"], "additionalProperties": False}
CUT_TOOLS = [("get_weather", "The weather in a city"), ("get_time", "The time in a city")]
CUT_ASK = "Weather and time in Paris, Rome and Oslo?"
WHOLE = 160  # a limit above the whole answer (one call)


CUT_CHAT_TOOLS = [{"type": "function", "function": {"name": n, "description": d, "parameters": CUT_CITY}} for n, d in CUT_TOOLS]


def _cut_chat_body(max_tokens: int) -> dict:
    return dict(
        model="embedded", messages=[{"role": "user", "content": CUT_ASK}], tools=CUT_CHAT_TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=max_tokens, **GREEDY,
    )


def _inside_the_arguments(oai: openai.OpenAI) -> tuple[int, tuple[str, str]]:
    """(a limit that cuts the whole answer inside its call's arguments, after the city's first letters;
    the whole call): from the whole answer's tokens (greedy, so every dialect's answer to this prompt is
    the same, the tools and the question rendered alike)."""
    whole = oai.chat.completions.create(**_cut_chat_body(WHOLE), logprobs=True)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
    text = ""
    for count, token in enumerate(choice.logprobs.content, 1):
        text += token.token
        if '"city"' in text and text.rstrip().endswith(('"', "a", "e", "i", "o", "u")) and not text.rstrip().endswith('"city"'):
            break
    assert count < len(choice.logprobs.content) - 3, text
    call = choice.message.tool_calls[0]
    return count + 1, (call.function.name, call.function.arguments)


def _is_cut_from(cut: tuple[str, str], whole: tuple[str, str]) -> bool:
    """A call the limit cut: the whole call's name, the start of its arguments."""
    return cut[0] == whole[0] and whole[1].startswith(cut[1]) and cut[1] != whole[1]


def test_chat_forced_calls_cut_by_max_tokens_keep_the_call_they_cut(oai: openai.OpenAI):
    cut_at, call = _inside_the_arguments(oai)
    cut = oai.chat.completions.create(**_cut_chat_body(cut_at))
    choice = cut.choices[0]
    assert choice.finish_reason == "length" and not choice.message.content
    kept = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert len(kept) == 1 and _is_cut_from(kept[0], call), (kept, call)

    chunks = list(oai.chat.completions.create(**_cut_chat_body(cut_at), stream=True))
    deltas = [d for chunk in chunks for c in chunk.choices for d in (c.delta.tool_calls or [])]
    streamed: dict[int, list[str]] = {}
    for d in deltas:
        entry = streamed.setdefault(d.index, ["", ""])
        entry[0] += d.function.name or ""
        entry[1] += d.function.arguments or ""
    assert [tuple(streamed[i]) for i in sorted(streamed)] == kept
    assert not "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices)
    assert [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason] == ["length"]

    # LangChain's bind_tools(tool_choice="any") is `required` (the same tools, so the same answer):
    # the call cut is its invalid_tool_calls, nothing text (issue 32).
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="embedded", base_url=str(oai.base_url), api_key="not-checked", temperature=0, max_tokens=cut_at, max_retries=0)
    message = llm.bind_tools(CUT_CHAT_TOOLS, tool_choice="any", parallel_tool_calls=False).invoke(CUT_ASK)
    assert message.content == "" and message.response_metadata["finish_reason"] == "length"
    assert message.tool_calls == [] and [c["name"] for c in message.invalid_tool_calls] == [call[0]]


def _sampled_forced_call(oai: openai.OpenAI, i: int) -> tuple[str | None, int]:
    """(finish_reason, tool calls) of one sampled `required` chat (seed i) at a limit of 24 + i tokens,
    past the first call's name; even i streamed (the calls counted from their deltas' indexes)."""
    body = dict(model="embedded", messages=[{"role": "user", "content": CUT_ASK}], tools=CUT_CHAT_TOOLS,
                tool_choice="required", max_tokens=24 + i, temperature=1.0, seed=i)
    if i % 2:
        choice = oai.chat.completions.create(**body).choices[0]
        return choice.finish_reason, len(choice.message.tool_calls or [])
    chunks = list(oai.chat.completions.create(**body, stream=True))
    indexes = {d.index for chunk in chunks for c in chunk.choices for d in (c.delta.tool_calls or [])}
    finish = [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]
    return (finish[0] if finish else None), len(indexes)


def test_sixty_sampled_forced_calls_at_the_limit_all_come_back_as_calls(oai: openai.OpenAI):
    """Issue 40's count: 60 `required` chats, sampled, cut or not by limits from 24 to 83 tokens: each
    answer has its calls (a cut one with the arguments generated so far), none comes back empty."""
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: _sampled_forced_call(oai, i), range(60)))
    assert [i for i, (_, calls) in enumerate(answers) if calls == 0] == []
    finishes = [finish for finish, _ in answers]
    assert set(finishes) <= {"length", "tool_calls"} and "length" in finishes, finishes


def _cut_responses_body(max_output_tokens: int) -> dict:
    tools = [{"type": "function", "name": n, "description": d, "parameters": CUT_CITY, "strict": True} for n, d in CUT_TOOLS]
    return dict(model="embedded", input=CUT_ASK, tools=tools, tool_choice="required", parallel_tool_calls=False,
                max_output_tokens=max_output_tokens, **GREEDY)


def _responses_cut(oai: openai.OpenAI) -> tuple[int, tuple[str, str]]:
    """(the largest limit that cuts the call of the whole answer to `_cut_responses_body`, that call):
    a binary search over the limits below the whole answer's tokens (its arguments are cut below some
    limit and complete above it). Responses and Messages render this prompt alike (chat's tools differ
    in their keys' order), so Messages' greedy answer is the same."""
    whole = oai.responses.create(**_cut_responses_body(WHOLE))
    assert whole.status == "completed" and [(o.type, o.status) for o in whole.output] == [("function_call", "completed")]
    call = (whole.output[0].name, whole.output[0].arguments)
    low, high = 1, whole.usage.output_tokens - 1  # the call is cut at `low` (its name is early), not at N
    while low < high:
        middle = (low + high + 1) // 2
        items = oai.responses.create(**_cut_responses_body(middle)).output
        if items and items[-1].type == "function_call" and items[-1].status == "incomplete":
            low = middle
        else:
            high = middle - 1
    return low, call


def test_responses_forced_calls_cut_by_max_output_tokens_keep_the_call_they_cut(oai: openai.OpenAI):
    # The whole answer's call is `completed`; cut inside its arguments it is an `incomplete` item with
    # the start of its arguments, and the response `incomplete` at max_output_tokens.
    cut_at, call = _responses_cut(oai)
    cut = oai.responses.create(**_cut_responses_body(cut_at))
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert [(o.type, o.status) for o in cut.output] == [("function_call", "incomplete")]
    kept = [(o.name, o.arguments) for o in cut.output]
    assert _is_cut_from(kept[0], call) and not _complete(kept[0][1])

    events = list(oai.responses.create(**_cut_responses_body(cut_at), stream=True))
    assert events[-1].type == "response.incomplete"
    done = [(e.name, e.arguments) for e in events if e.type == "response.function_call_arguments.done"]
    assert done == kept and not any(e.type == "response.output_text.delta" for e in events)
    assert [e.item.status for e in events if e.type == "response.output_item.done"] == [o.status for o in cut.output]


def _complete(arguments: str) -> bool:
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def _cut_messages_body(max_tokens: int) -> dict:
    tools = [{"name": n, "description": d, "input_schema": CUT_CITY} for n, d in CUT_TOOLS]
    return dict(model="embedded", max_tokens=max_tokens, messages=[{"role": "user", "content": CUT_ASK}], tools=tools,
                tool_choice={"type": "any", "disable_parallel_tool_use": True}, **GREEDY_ANTHROPIC)


def test_messages_forced_tool_use_cut_by_max_tokens_keeps_the_block_it_cut(claude: anthropic.Anthropic):
    same_server = openai.OpenAI(base_url=str(claude.base_url).rstrip("/") + "/v1", api_key="not-checked", max_retries=0, timeout=120.0)
    cut_at, call = _responses_cut(same_server)
    whole = claude.messages.create(**_cut_messages_body(WHOLE))
    assert whole.stop_reason == "tool_use" and [(b.name, b.input) for b in whole.content] == [(call[0], json.loads(call[1]))]
    cut = claude.messages.create(**_cut_messages_body(cut_at))
    assert cut.stop_reason == "max_tokens" and {b.type for b in cut.content} == {"tool_use"}
    # the block the limit cut holds the members complete before the cut, as the SDK reads a stream
    kept = [(b.name, b.input) for b in cut.content]
    assert [name for name, _ in kept] == [call[0]] and kept[0][1].items() <= json.loads(call[1]).items(), kept
    with claude.messages.stream(**_cut_messages_body(cut_at)) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and [(b.name, b.input) for b in final.content] == kept


# ------------------------------------------------------------------------------------ reasoning


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory) -> Iterator[TrussServer]:
    """The embedded model read as DeepSeek-R1 reads (`runtime.reasoning_parser: deepseek_r1`): its
    answer opens inside the thinking, and since this model never writes `</think>`, all of it is
    thinking (a second server, as the parser is a deployment setting)."""
    yield from serve_truss(tmp_path_factory.mktemp("truss_server_thinking"), {"TRTLLM_RUNTIME__REASONING_PARSER": "deepseek_r1"})


def test_reasoning_items_and_thinking_blocks_streamed_and_not(thinking_server: TrussServer):
    oai = openai.OpenAI(base_url=thinking_server.url + "/v1", api_key="x", max_retries=0, timeout=120.0)
    body = dict(model="embedded", input="Tell me about the sea", max_output_tokens=10, **GREEDY)
    whole = oai.responses.create(**body)
    assert [item.type for item in whole.output] == ["reasoning"]
    thought = whole.output[0].content[0].text
    assert thought and whole.output_text == ""
    events = list(oai.responses.create(**body, stream=True))
    assert [e.type for e in events if "reasoning" in e.type] == (
        ["response.reasoning_text.delta"] * sum(e.type == "response.reasoning_text.delta" for e in events) + ["response.reasoning_text.done"]
    )
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thought
    assert events[-1].response.output[0].content[0].text == thought

    claude = anthropic.Anthropic(base_url=thinking_server.url, api_key="x", max_retries=0, timeout=120.0)
    message = dict(model="embedded", max_tokens=10, messages=[{"role": "user", "content": "Tell me about the sea"}], **GREEDY_ANTHROPIC)
    created = claude.messages.create(**message)
    assert [(b.type, b.thinking) for b in created.content] == [("thinking", thought)]
    with claude.messages.stream(**message) as stream:
        deltas = [e.thinking for e in stream if e.type == "thinking"]
        final = stream.get_final_message()
    assert "".join(deltas) == final.content[0].thinking == thought


# ------------------------------------------------------------------------------------ bad input

TOOL_R = _weather_tool_responses()
TOOL_M = {"name": "weather", "input_schema": WEATHER}
BAD_SCHEMA = {"type": "object", "properties": {"city": {"type": "no-such-type"}}}


@pytest.mark.parametrize(
    "route, body, field",
    [
        ("responses", {"input": "hi", "tools": [TOOL_R], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ("responses", {"input": "hi", "tools": [{**TOOL_R, "parameters": BAD_SCHEMA}]}, "tools[0].parameters"),
        ("responses", {"input": [{"type": "function_call_output", "call_id": "c9", "output": "1"}]}, "input[0].call_id"),
        ("responses", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}, "input[0].content[0].type"),
        ("responses", {"input": "hi", "background": True, "store": False}, "background"),  # needs store
        ("responses", {"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),  # 404: none stored
        ("messages", {"tools": [TOOL_M], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
        ("messages", {"tools": [{**TOOL_M, "input_schema": BAD_SCHEMA}]}, "tools[0].input_schema"),
        ("messages", {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "1"}]}]}, "messages[0].content[0].tool_use_id"),
        ("messages", {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}]}, "messages[0].content[0].type"),
        ("messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field_in_the_api_s_shape(server: TrussServer, route, body, field):
    if route == "messages":
        body = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **body}
    answer = httpx.post(f"{server.url}/v1/{route}", json={"model": "embedded", **body}, timeout=30)
    assert 400 <= answer.status_code < 500, answer.text
    error = answer.json()
    if route == "messages":
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        message = error["error"]["message"]
    else:
        assert error["error"]["type"] == "invalid_request_error"
        message = error["error"]["message"]
    assert f"{field}:" in message, message


def test_a_turn_continues_a_stored_one_on_both_fronts(server: TrussServer):
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="not-checked", max_retries=0, timeout=120.0)
    greedy = {"model": "embedded", "temperature": 0.0, "max_output_tokens": 8}
    first = oai.responses.create(input="My name is Ada.", **greedy)
    second = oai.responses.create(input="What is my name?", previous_response_id=first.id, **greedy)
    whole = oai.responses.create(
        input=[{"role": "user", "content": "My name is Ada."}, *[i.model_dump(exclude_none=True) for i in first.output],
               {"role": "user", "content": "What is my name?"}], store=False, **greedy)
    assert second.previous_response_id == first.id and second.usage.input_tokens == whole.usage.input_tokens
    if server.front == "truss":  # its server routes only POST /v1/responses: nothing could poll a background one
        with pytest.raises(openai.BadRequestError, match="background"):
            oai.responses.create(input="hi", background=True, **greedy)


def test_sdks_raise_their_own_errors(oai: openai.OpenAI, claude: anthropic.Anthropic):
    with pytest.raises(openai.NotFoundError, match="previous_response_id"):
        oai.responses.create(model="embedded", input="hi", previous_response_id="resp_never_stored")
    with pytest.raises(anthropic.BadRequestError, match="tool_choice.name"):
        claude.messages.create(
            model="embedded", max_tokens=4, messages=[{"role": "user", "content": "hi"}],
            tools=[TOOL_M], tool_choice={"type": "tool", "name": "nope"},
        )


# ---------------------------------------------------------------------------------- agent loop


def test_openai_agents_loop_calls_our_tool_then_answers(server: TrussServer):
    """OpenAI's Agents SDK over /v1/responses: under tool_choice required the model must call the
    tool (guided decoding), the SDK runs it and sends its output back (resetting tool_choice to
    auto, its default), and the model's next answer is the final output: two model calls."""
    import asyncio

    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        RunConfig,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    calls: list[str] = []

    # One short string argument: the embedded model, forced to write its call, fills an unbounded string
    # (or integer) until max_tokens (guided decoding keeps it valid, not short).
    @function_tool
    def weather(city: Annotated[str, Field(max_length=12)]) -> str:
        """The weather forecast for a city."""
        calls.append(city)
        return f"Sunny in {city}."

    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="not-checked", max_retries=0, timeout=120.0)
    agent = Agent(
        name="forecaster",
        instructions="Answer questions about the weather using the weather tool.",
        tools=[weather],
        model=OpenAIResponsesModel(model="embedded", openai_client=client),
        model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=128, store=False),
    )

    async def run():
        try:
            return await Runner.run(agent, "What will the weather be in Paris?", max_turns=3, run_config=RunConfig(tracing_disabled=True))
        finally:
            await client.close()

    result = asyncio.run(run())
    assert len(calls) == 1 and isinstance(calls[0], str)
    assert len(result.raw_responses) == 2  # the call, then (its output sent back) the answer
    assert [item.type for item in result.raw_responses[0].output] == ["function_call"]
    assert [item.type for item in result.raw_responses[1].output] == ["message"]
    assert isinstance(result.final_output, str) and result.final_output
