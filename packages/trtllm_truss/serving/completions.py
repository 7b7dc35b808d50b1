"""`/v1/completions`: OpenAI completion requests (a prompt, a batch of prompts, token ids) in,
text completions or chunk streams out. Raw text: no reasoning or tool-call parsing."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from trtllm_truss.api.errors import field_error
from trtllm_truss.api.openai import (
    OPENAI_DEFAULT_COMPLETION_MAX_TOKENS,
    OPENAI_DEFAULT_TOP_P,
    SSE_DONE,
    Completion,
    CompletionChoice,
    CompletionRequest,
    completion_id,
    completion_logprobs,
    sse_error,
    sse_event,
)
from trtllm_truss.api.sse import ChunkTemplate
from trtllm_truss.serving.core import SERVED_MODEL_NAME, RequestCore, answered, check_prompt_bytes, parse_request, with_unenforced_header
from trtllm_truss.serving.generation import Generation, merged_events
from trtllm_truss.serving.openai_shared import openai_error, refuse_what_the_engine_cannot_do, request_guide, usage_of
from trtllm_truss.serving.request import Failure, Finish, GenerationRequest, TextDelta


async def completions(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    return await answered(_completions(core, body, http_request), openai_error)


def generation_request(req: CompletionRequest) -> GenerationRequest:
    return GenerationRequest(
        sampling=req,
        prompt=req.prompt_text(),
        max_tokens=req.max_tokens,
        default_max_tokens=OPENAI_DEFAULT_COMPLETION_MAX_TOKENS,
        stop=tuple(req.stop_words()),
        default_top_p=OPENAI_DEFAULT_TOP_P,
        literal_special_tokens=req.literal_special_tokens,
        guide=request_guide(req),
        model=req.model,
        n=req.n,
        logprobs=req.wants_log_probs(),
        top_logprobs=req.logprobs or 0,
    )


def prompt_fields(req: CompletionRequest) -> list[tuple[str, str | list[int]]]:
    """(field, prompt) of each prompt of the request: `prompt[i]` when it is a batch."""
    prompts = req.prompts()
    return [(f"prompt[{i}]" if req.batched() else "prompt", prompt) for i, prompt in enumerate(prompts)]


async def _completions(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    req = parse_request(CompletionRequest, body)
    refuse_what_the_engine_cannot_do(req, core.limits)
    request = generation_request(req)
    prompts = prompt_fields(req)
    for field, prompt in prompts:
        if isinstance(prompt, str):
            check_prompt_bytes(field, prompt, core.limits)
    base = await core.prepare(request)
    per_prompt = []
    for field, prompt in prompts:
        if isinstance(prompt, str):
            per_prompt.append(dataclasses.replace(base, prompt=prompt, prompt_field=field))
        else:
            _check_token_ids(core, field, prompt)
            per_prompt.append(dataclasses.replace(base, prompt=None, prompt_ids=tuple(prompt), prompt_field=field))
    generations = await core.open_all(core.choice_specs(request, per_prompt), http_request)
    model = req.model or SERVED_MODEL_NAME
    if req.stream:
        return with_unenforced_header(StreamingResponse(_completion_sse(generations, req, model), media_type="text/event-stream"), base)
    answers = await core.collect(generations, http_request)
    choices = [
        CompletionChoice(
            index=index,
            text=answer.text,
            finish_reason=answer.finish.reason,
            logprobs=completion_logprobs(answer.logprobs, top=req.logprobs or 0) if req.wants_log_probs() else None,
        )
        for index, answer in enumerate(answers)
    ]
    return with_unenforced_header(Completion(
        id=completion_id("cmpl"), model=model, choices=choices, usage=usage_of([a.finish for a in answers], req.n)
    ).model_dump(), base)


def _check_token_ids(core: RequestCore, field: str, ids: list[int]) -> None:
    limits = core.limits
    if len(ids) > limits.max_input_len:
        raise field_error(field, f"the prompt is {len(ids)} tokens, above this deployment's max_input_len ({limits.max_input_len})")
    if limits.vocab_size is not None:
        for j, token in enumerate(ids):
            if token >= limits.vocab_size:
                raise field_error(f"{field}[{j}]", f"{token} is not a token id (vocabulary size {limits.vocab_size})")


async def _completion_sse(generations: list[Generation], req: CompletionRequest, model: str) -> AsyncIterator[bytes]:
    envelope = {"id": completion_id("cmpl"), "model": model}
    wants = req.wants_log_probs()
    template = ChunkTemplate(Completion(**envelope, choices=[CompletionChoice(text=ChunkTemplate.mark(), finish_reason=None)]))
    offsets = [0] * len(generations)  # characters of each choice's text sent so far

    def chunk(index: int, text: str, finish_reason: str | None, entries: Any = None) -> bytes:
        logprobs = None
        if wants and finish_reason is None:
            logprobs = completion_logprobs(entries or [], offsets[index], req.logprobs or 0)
        offsets[index] += len(text)
        choice = CompletionChoice(index=index, text=text, finish_reason=finish_reason, logprobs=logprobs)
        return sse_event(Completion(**envelope, choices=[choice]))

    single = len(generations) == 1  # the common case: its events as they are, no merging task
    events: AsyncIterator[Any] = generations[0].events() if single else merged_events(generations)
    try:
        finishes: dict[int, Finish] = {}
        async with aclosing(events):
            async for item in events:
                index, event = (0, item) if single else item
                cls = event.__class__
                if cls is TextDelta:
                    yield template.event(event.text) if not wants and index == 0 else chunk(index, event.text, None, event.logprobs)
                elif cls is Failure:
                    yield sse_error(event.message)
                    return
                elif cls is Finish:
                    yield chunk(index, "", event.reason)
                    finishes[index] = event
        if req.wants_usage_chunk():
            usage = usage_of([finishes[i] for i in sorted(finishes)], req.n)
            yield sse_event(Completion(**envelope, choices=[], usage=usage))
        yield SSE_DONE
    finally:
        for generation in generations:
            generation.close()
