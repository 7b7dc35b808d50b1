"""One generation's output as the core's events, and several generations' merged.

`Generation.events()` turns a `ResponseStream`'s updates into `TextDelta` / `ReasoningDelta` /
`ToolCallDelta` and, once, `Finish` or `Failure`: an unparsed request's update (one string) is one
`TextDelta`, a parsed one's parts (`streaming.protocol`) become one event per run of a kind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

from trtllm_truss.api.openai import LogProbEntry
from trtllm_truss.serving.request import (
    Answer,
    Event,
    Failure,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
)
from trtllm_truss.streaming.pool import ResponseStream
from trtllm_truss.parsers.base import PART_REASONING, PART_TEXT

logger = logging.getLogger(__name__)


class GenerationFailed(Exception):
    """A generation ended with an error after its first output (its stream's end says why)."""


class Generation:
    """One engine request handed to a worker, its first output already read."""

    __slots__ = ("stream", "_first", "_first_log_probs", "_parsed", "_logprobs")

    def __init__(
        self, stream: ResponseStream, first: list | None, parsed: bool, logprobs: bool,
        first_log_probs: list | None = None,
    ) -> None:
        self.stream = stream
        self._first = first
        self._first_log_probs = first_log_probs  # taken with `first` (None: whatever is waiting then)
        self._parsed = parsed
        self._logprobs = logprobs

    def close(self) -> None:
        """Done with it: a generation still running is cancelled in its worker (and the engine)."""
        self.stream.close()

    async def events(self) -> AsyncIterator[Event]:
        """Its output as events, then `Finish` or `Failure` once; closes the stream whatever happens."""
        stream = self.stream
        try:
            parts, self._first = self._first, None
            first_entries, self._first_log_probs = self._first_log_probs, None
            while True:
                if parts is None:
                    parts = await stream.next_parts()
                    if parts is None:
                        break
                    entries = stream.take_log_probs() if self._logprobs else None
                elif self._logprobs:  # the first parts, read by the core
                    entries = first_entries if first_entries is not None else stream.take_log_probs()
                else:
                    entries = None
                if not self._parsed:
                    yield TextDelta(parts[0] if len(parts) == 1 else "".join(parts), entries)
                else:
                    for event in _parsed_events(parts, entries):
                        yield event
                parts = None
            end = stream.end
            assert end is not None
            if self._logprobs and (rest := stream.take_log_probs()):
                yield TextDelta("", rest)
            if end.error is not None:
                logger.warning("stream ended by an error: %s", end.error)
                yield Failure(end.error, end.status or 503)
            else:
                yield Finish(
                    end.finish_reason or "stop", end.prompt_tokens, end.completion_tokens, end.stop_sequence, end.cached_tokens
                )
        finally:
            stream.close()

    async def collect(self) -> Answer:
        """The whole generation; a failure (after output) raises `Refused` with its status."""
        texts: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        entries: list[LogProbEntry] = []
        finish: Finish | None = None
        async with aclosing(self.events()) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    texts.append(event.text)
                    if event.logprobs:
                        entries += event.logprobs
                elif isinstance(event, ReasoningDelta):
                    reasoning.append(event.text)
                elif isinstance(event, ToolCallDelta):
                    if event.name is not None:
                        calls.append(ToolCall(event.id or "", event.name, ""))
                    calls[event.index].arguments += event.arguments
                elif isinstance(event, Failure):
                    raise GenerationFailed(event.message)
                else:
                    finish = event
        assert finish is not None
        return Answer("".join(texts), "".join(reasoning) if reasoning else None, calls, entries, finish)


def _parsed_events(parts: list, entries: list[LogProbEntry] | None) -> list[Event]:
    """A parsed update's parts as events, adjacent pieces of one kind joined (the log-prob entries
    ride with the first text event, or alone)."""
    events: list[Event] = []
    for part in parts:
        kind = part[0]
        if kind == PART_TEXT or kind == PART_REASONING:
            cls = TextDelta if kind == PART_TEXT else ReasoningDelta
            last = events[-1] if events else None
            if last is not None and last.__class__ is cls:
                last.text += part[1]
            else:
                events.append(cls(part[1]))
        else:
            _, index, call_id, name, arguments = part
            last = events[-1] if events else None
            # A call's first delta (id, name) stays its own, as OpenAI streams it; argument
            # fragments of one update are joined.
            if name is None and isinstance(last, ToolCallDelta) and last.index == index and last.name is None:
                last.arguments += arguments
            else:
                events.append(ToolCallDelta(index, call_id, name, arguments))
    if entries:
        text = next((e for e in events if isinstance(e, TextDelta)), None)
        if text is None:
            events.append(TextDelta("", entries))
        else:
            text.logprobs = entries
    return events



async def merged_events(generations: list[Generation]) -> AsyncIterator[tuple[int, Event]]:
    """(index, event) of several generations as their output arrives, in arrival order, each
    ending with its `Finish` or `Failure`; closes every generation whatever happens."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, generation: Generation) -> None:
        async with aclosing(generation.events()) as events:
            async for event in events:
                queue.put_nowait((index, event))

    tasks = [asyncio.ensure_future(pump(index, generation)) for index, generation in enumerate(generations)]
    try:
        remaining = len(tasks)
        while remaining:
            update = await queue.get()
            if isinstance(update[1], (Finish, Failure)):
                remaining -= 1
            yield update
    finally:
        # Nothing awaited here: under Starlette's cancelled scope (client gone) every await raises
        # again, and the streams must be closed (their engine requests cancelled) all the same.
        for generation in generations:
            generation.close()
        for task in tasks:
            task.cancel()
