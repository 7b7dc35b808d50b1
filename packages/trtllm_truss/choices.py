"""Several choices of one OpenAI request (n > 1, a list of prompts, log probs): one engine request
per (prompt, choice), their specs and seeds, their text merged into one event stream as it arrives,
and their usage. The service opens and collects them; this module only shapes them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from trtllm_truss.api.native import Usage
from trtllm_truss.api.openai import SSE_DONE, ChatCompletionRequest, CompletionRequest, LogProbEntry, sse_error
from trtllm_truss.api.sampling import UINT64_MAX
from trtllm_truss.streaming.pool import ResponseStream
from trtllm_truss.streaming.protocol import GenerationSpec, StreamEnd

logger = logging.getLogger(__name__)

# (stream, its first text, the log-prob entries read with it) per choice, in choice order.
OpenedChoice = tuple[ResponseStream, "str | None", "list[LogProbEntry]"]


def choice_specs(req: ChatCompletionRequest | CompletionRequest, prompts: list[GenerationSpec]) -> list[GenerationSpec]:
    """n specs per prompt, prompt-major, each choice with its own seed: drawn at random when the
    request has none (so unseeded choices differ whatever the engine's default seed), else the
    request's seed + j for choice j (choice 0 is what n=1 gives)."""
    specs = []
    for base in prompts:
        params = base.params
        if req.wants_log_probs():
            params = dataclasses.replace(params, return_log_probs=True)
        for j in range(req.n):
            seed = params.random_seed
            if req.n > 1:
                seed = secrets.randbits(64) if req.seed is None else (req.seed + j) % (UINT64_MAX + 1)
            specs.append(dataclasses.replace(base, params=dataclasses.replace(params, random_seed=seed)))
    return specs


def choices_usage(ends: list[StreamEnd], n: int) -> Usage:
    """`ends` in choice order: each prompt counted once (its first choice's count), the completion
    tokens of every choice."""
    return Usage.of(sum(end.prompt_tokens for end in ends[::n]), sum(end.completion_tokens for end in ends))


async def choices_sse(
    opened: list[OpenedChoice],
    chunk: Callable[[int, str, list[LogProbEntry], str | None], bytes],
    preamble: list[bytes],
    usage: Callable[[list[StreamEnd]], bytes] | None,
) -> AsyncIterator[bytes]:
    """The events of several choices as their text arrives: `chunk(index, text, entries, None)` per
    piece, `chunk(index, "", [], finish_reason)` when a choice ends, then the usage event and
    `[DONE]`; the first failure ends the answer with `event: error` (and no `[DONE]`)."""
    try:
        for event in preamble:
            yield event
        ends: dict[int, StreamEnd] = {}
        async with aclosing(choice_updates(opened)) as updates:
            async for index, text, entries, end in updates:
                if end is None:
                    yield chunk(index, text, entries, None)
                elif end.error is not None:
                    logger.warning("stream ended by an error: %s", end.error)
                    yield sse_error(end.error)
                    return
                else:
                    if text or entries:
                        yield chunk(index, text, entries, None)
                    yield chunk(index, "", [], end.finish_reason or "stop")
                    ends[index] = end
        if usage is not None:
            yield usage([ends[i] for i in sorted(ends)])
        yield SSE_DONE
    finally:  # however the answer ends, before the updates started too
        close_all(opened)


async def choice_updates(opened: list[OpenedChoice]) -> AsyncIterator[tuple[int, str, list[LogProbEntry], StreamEnd | None]]:
    """(choice index, text, log-prob entries, None) as each choice's text arrives, in arrival order,
    then (index, "", entries, end) once per choice; closes every stream whatever happens."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: ResponseStream, first: str | None, entries: list[LogProbEntry]) -> None:
        if first:
            queue.put_nowait((index, first, entries, None))
            entries = []
        while (text := await stream.next_text()) is not None:
            queue.put_nowait((index, text, stream.take_log_probs(), None))
        queue.put_nowait((index, "", entries + stream.take_log_probs(), stream.end))

    tasks = [asyncio.ensure_future(pump(index, *choice)) for index, choice in enumerate(opened)]
    try:
        remaining = len(tasks)
        while remaining:
            update = await queue.get()
            if update[3] is not None:
                remaining -= 1
            yield update
    finally:
        # Nothing awaited here: under Starlette's cancelled scope (client gone) every await raises
        # again, and the streams must be closed (their engine requests cancelled) all the same.
        close_all(opened)
        for task in tasks:
            task.cancel()


def close_all(opened: list[OpenedChoice]) -> None:
    for stream, _, _ in opened:
        stream.close()
