"""The chat dialect over the core's events: a parsed generation (reasoning, text, tool calls) as
OpenAI's chunks and as a whole message, checked with the `openai` SDK's own types. The stream
worker is replaced by deliveries into a real `ResponseStream` (what the worker's frames do)."""

from __future__ import annotations

import asyncio
import json

from openai.types.chat import ChatCompletion as SdkCompletion
from openai.types.chat import ChatCompletionChunk as SdkChunk

from trtllm_truss.api.openai import ChatCompletionRequest
from trtllm_truss.serving.chat import _chat_sse, assistant_message
from trtllm_truss.serving.generation import Generation
from trtllm_truss.streaming.pool import BoundedPool, ResponseStream
from trtllm_truss.streaming.protocol import StreamEnd

UPDATES = [
    [("reasoning", "The user wants "), ("reasoning", "the weather.")],
    [("text", "Checking. ")],
    [("tool", 0, "call_abc", "get_weather", ""), ("tool", 0, None, None, '{"city": "Paris"}')],
    [("tool", 1, "call_def", "get_time", ""), ("tool", 1, None, None, "{}")],
]
END = StreamEnd("tool_calls", prompt_tokens=7, completion_tokens=30)


class _Pool(BoundedPool):
    """The pool side a ResponseStream reports to (its own bound, no replica-wide one, no pacing), with
    the one stream open and no worker behind it."""

    def __init__(self) -> None:
        super().__init__(max_in_flight=1, chunk_rate=float("inf"), admission=None)
        self.claim()
        self.pool = self

    def forget(self, stream: ResponseStream) -> None:
        pass


def _generation() -> Generation:
    stream = ResponseStream(1, _Pool())
    for update in UPDATES[1:]:
        stream._deliver(update, None, None)
    stream._deliver([], None, END)
    return Generation(stream, UPDATES[0], parsed=True, logprobs=False)


def _request(**body) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "stream": True, **body})


async def _chunks(req: ChatCompletionRequest) -> list[bytes]:
    return [chunk async for chunk in _chat_sse([_generation()], req, "m")]


def test_streamed_parts_are_openai_chunks_in_order():
    events = asyncio.run(_chunks(_request(stream_options={"include_usage": True})))
    assert events[-1] == b"data: [DONE]\n\n"
    chunks = [SdkChunk.model_validate(json.loads(e[len(b"data: "):])) for e in events[:-1]]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    assert reasoning == "The user wants the weather."
    assert "".join(d.content or "" for d in deltas) == "Checking. "
    calls = [call for d in deltas for call in d.tool_calls or []]
    # as OpenAI streams them: the first delta with index, id, type and name, then the arguments
    assert [(c.index, c.id, c.type, c.function.name, c.function.arguments) for c in calls] == [
        (0, "call_abc", "function", "get_weather", ""),
        (0, None, None, None, '{"city": "Paris"}'),
        (1, "call_def", "function", "get_time", ""),
        (1, None, None, None, "{}"),
    ]
    # reasoning first, then the answer's text, then the calls
    kinds = ["r" if getattr(d, "reasoning_content", None) else "t" if d.content else "c" if d.tool_calls else "-" for d in deltas]
    first = {k: kinds.index(k) for k in "rtc"}
    assert first["r"] < first["t"] < first["c"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 37


def test_parallel_tool_calls_false_streams_the_first_call_only():
    events = asyncio.run(_chunks(_request(parallel_tool_calls=False)))
    chunks = [SdkChunk.model_validate(json.loads(e[len(b"data: "):])) for e in events[:-1]]
    calls = [call for c in chunks for call in c.choices[0].delta.tool_calls or []]
    assert {c.index for c in calls} == {0} and [c.id for c in calls if c.id] == ["call_abc"]


def test_a_collected_answer_is_the_same_message():
    answer = asyncio.run(_generation().collect())
    assert (answer.text, answer.reasoning, answer.finish.reason) == ("Checking. ", "The user wants the weather.", "tool_calls")
    message = assistant_message(answer)
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": message.model_dump(), "finish_reason": "tool_calls"}]}
    sdk = SdkCompletion.model_validate(body).choices[0].message
    assert [(c.id, c.function.name, c.function.arguments) for c in sdk.tool_calls] == [
        ("call_abc", "get_weather", '{"city": "Paris"}'), ("call_def", "get_time", "{}")
    ]
