"""What the dialects with semantic stream events (Responses, Messages) share: the core's events fed
to the dialect's output builder (`api.responses_events.ResponseEvents`,
`api.messages_events.MessageEvents`), streamed as server-sent events or collected into one answer.

Both paths feed the same builder the same events, so a streamed and a non-streamed answer to one
greedy request carry the same output.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, Protocol

from fastapi import Request
from trtllm_truss.serving.core import Refused, unless_disconnected
from trtllm_truss.serving.generation import Generation
from trtllm_truss.serving.request import (
    Event,
    Failure,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)

logger = logging.getLogger(__name__)

Events = list[dict[str, Any]]


class OutputBuilder(Protocol):
    def start(self) -> Events: ...
    def reasoning(self, delta: str) -> Events: ...
    def text(self, delta: str) -> Events: ...
    def tool_call(self, index: int, call_id: str, name: str) -> Events: ...
    def tool_arguments(self, index: int, delta: str) -> Events: ...
    def finish(
        self, finish_reason: str | None, prompt_tokens: int, completion_tokens: int, stop_sequence: str | None,
        cached_tokens: int = 0,
    ) -> Events: ...
    def failed(self, message: str, status: int) -> Events: ...


def feed(builder: OutputBuilder, event: Event) -> Events:
    """The builder's stream events for one core event."""
    if isinstance(event, TextDelta):
        return builder.text(event.text)
    if isinstance(event, ReasoningDelta):
        return builder.reasoning(event.text)
    if isinstance(event, ToolCallDelta):
        events = builder.tool_call(event.index, event.id or "", event.name) if event.name is not None else []
        return events + builder.tool_arguments(event.index, event.arguments)
    if isinstance(event, Finish):
        return builder.finish(event.reason, event.prompt_tokens, event.completion_tokens, event.stop_sequence, event.cached_tokens)
    raise TypeError(f"not an output event: {event!r}")


def sse(event: dict[str, Any]) -> bytes:
    """One server-sent event as OpenAI and Anthropic send them: `event:` its type, `data:` itself."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


async def stream(generation: Generation, builder: OutputBuilder) -> AsyncIterator[bytes]:
    """The answer's events as they come; a failure after the start is the dialect's error event,
    and the stream then stops."""
    for event in builder.start():
        yield sse(event)
    async with aclosing(generation.events()) as events:
        async for event in events:
            if isinstance(event, Failure):
                for failed in builder.failed(event.message, event.status):
                    yield sse(failed)
                return
            for out in feed(builder, event):
                yield sse(out)


async def collect(generation: Generation, builder: OutputBuilder, http_request: Request | None) -> None:
    """The whole answer fed to `builder` (its events not built); a failure raises `Refused`."""

    async def read() -> None:
        async with aclosing(generation.events()) as events:
            async for event in events:
                if isinstance(event, Failure):
                    raise Refused(event.status, event.message, counted=True)
                feed(builder, event)

    try:
        await unless_disconnected(read(), http_request, "the answer")
    finally:
        generation.close()
