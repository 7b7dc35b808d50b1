"""A tool call the token limit cut (issue 40): each dialect returns it as a call with the arguments
generated so far, streamed and not alike, as the official SDKs read them: Messages' `tool_use`
input (the `anthropic` SDK's partial-JSON reading of `input_json_delta`), Responses' incomplete
`function_call` item, chat's `tool_calls` with finish_reason `length`."""

from __future__ import annotations

import pytest
from trtllm_truss.api.messages_events import MessageEvents
from trtllm_truss.api.responses import parse_responses_request
from trtllm_truss.api.responses_events import ResponseEvents

CUT = ['{"city": ', '"Paris", "da', 'ys": 3, "unit": "cel']


def _feed(builder, cut: list[str]):
    events = builder.start()
    events += builder.tool_call(0, "call_1", "get_weather")
    events += builder.tool_arguments(0, '{"city": "Oslo"}')
    events += builder.tool_call(1, "call_2", "get_weather")
    for fragment in cut:
        events += builder.tool_arguments(1, fragment)
    return events + builder.finish("length", 10, 20)


@pytest.mark.parametrize("cut", [CUT, [], ['{"ci'], ['{"city": "Par']])
def test_messages_cut_tool_use_is_read_alike_streamed_by_the_sdk_and_whole(cut):
    pytest.importorskip("anthropic")  # the SDK is in the main environment, not in every Python's
    from anthropic.lib.streaming._messages import accumulate_event
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    streamed = MessageEvents("m", emit=True)
    events = _feed(streamed, cut)
    snapshot, buffers = None, {}
    adapter = TypeAdapter(RawMessageStreamEvent)
    for event in events:
        snapshot = accumulate_event(event=adapter.validate_python(event), current_snapshot=snapshot, json_bufs=buffers)
    whole = MessageEvents("m", emit=False)
    _feed(whole, cut)
    message = whole.message()
    assert message["stop_reason"] == snapshot.stop_reason == "max_tokens"
    assert [(b["name"], b["input"]) for b in message["content"]] == [(b.name, b.input) for b in snapshot.content]
    assert message["content"][0]["input"] == {"city": "Oslo"}
    deltas = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta" and e["index"] == 1]
    assert deltas == [f for f in cut if f]  # the fragments as they were generated


def test_responses_cut_call_is_an_incomplete_item_of_an_incomplete_response():
    request = parse_responses_request({"model": "m", "input": "hi"})
    streamed = ResponseEvents(request, emit=True)
    events = _feed(streamed, CUT)
    whole = ResponseEvents(request, emit=False)
    _feed(whole, CUT)
    response = whole.response()
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [(o["status"], o["arguments"]) for o in response["output"]] == [
        ("completed", '{"city": "Oslo"}'), ("incomplete", "".join(CUT)),
    ]
    done = [(e["item"]["status"], e["item"]["arguments"]) for e in events if e["type"] == "response.output_item.done"]
    assert done == [(o["status"], o["arguments"]) for o in response["output"]]
    assert [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta" and e["output_index"] == 1] == CUT
    assert events[-1]["type"] == "response.incomplete" and events[-1]["response"]["output"][1]["status"] == "incomplete"


def test_responses_call_complete_at_the_limit_stays_completed():
    request = parse_responses_request({"model": "m", "input": "hi"})
    builder = ResponseEvents(request, emit=False)
    _feed(builder, ['{"city": "Rome"}'])
    assert [o["status"] for o in builder.response()["output"]] == ["completed", "completed"]
