"""The native route (`/v1/models/model:predict`), Baseten's trt_llm truss API: a prompt or chat
messages in; the text as a chunked `text/plain` stream, or JSON `{text, finish_reason, usage}`.
A failure mid-stream aborts the chunked body (clients see a truncated transfer)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from trtllm_truss.api.errors import error_response
from trtllm_truss.api.native import DEFAULT_MAX_TOKENS, PredictRequest, PredictResponse, Usage
from trtllm_truss.api.structured import native_guide
from trtllm_truss.serving.core import RequestCore, answered, parse_request, with_unenforced_header
from trtllm_truss.serving.generation import Generation
from trtllm_truss.serving.request import Failure, GenerationRequest, TextDelta

logger = logging.getLogger(__name__)


class StreamFailed(RuntimeError):
    """Raised inside a native text stream to abort its chunked body (never shown as text)."""


class AbortedStreamLog(logging.Filter):
    """For uvicorn's logger (`uvicorn.error`): an aborted native stream is logged as one line, not as the
    ~100-line "Exception in ASGI application" traceback uvicorn writes for the exception that aborts it (a
    tritonserver restart under load wrote one per open native stream, burying the lines saying why)."""

    def filter(self, record: logging.LogRecord) -> bool:
        failed = _stream_failed(record.exc_info[1] if record.exc_info else None)
        if failed is not None:
            record.msg, record.args = "native stream aborted mid-body: %s", (failed,)
            record.exc_info = record.exc_text = None
        return True


def quiet_aborted_streams() -> None:
    """Install `AbortedStreamLog` on uvicorn's logger once (truss's server and the direct front's processes)."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, AbortedStreamLog) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(AbortedStreamLog())


def _stream_failed(exc: BaseException | None, depth: int = 0) -> StreamFailed | None:
    """The StreamFailed in `exc`, its exception group (anyio's task group around the body) or its causes."""
    if exc is None or depth > 8:
        return None
    if isinstance(exc, StreamFailed):
        return exc
    for inner in (*getattr(exc, "exceptions", ()), exc.__cause__, exc.__context__):
        found = _stream_failed(inner, depth + 1)
        if found is not None:
            return found
    return None


def native_error(status: int, message: str, headers: Any = None, **_: Any) -> Any:
    """`{"error": message}`; a `param`/`code` of OpenAI's shape (model_not_found) is in the message already."""
    return error_response(status, message, openai=False, headers=headers)


async def predict(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    return await answered(_predict(core, body, http_request), native_error)


def generation_request(req: PredictRequest) -> GenerationRequest:
    messages = None
    if req.messages is not None:
        messages = tuple({"role": m.role, "content": m.text()} for m in req.messages)
    return GenerationRequest(
        sampling=req,
        prompt=req.prompt,
        messages=messages,
        prompt_field="prompt" if req.prompt is not None else "messages",
        max_tokens=req.max_tokens,
        default_max_tokens=DEFAULT_MAX_TOKENS,
        stop=tuple(req.stop_words_list),
        keep_stop_text=True,
        bad_words=tuple(req.bad_words_list),
        beam_width=req.beam_width,
        literal_special_tokens=req.literal_special_tokens,
        guide=native_guide(req.guided_decoding_guide_type, req.guided_decoding_guide),
        parse_reasoning=False,  # the native API returns the model's text as it is
        model=req.model,
    )


async def _predict(core: RequestCore, body: Any, http_request: Request | None) -> Any:
    req = parse_request(PredictRequest, body)
    prepared = await core.prepare(generation_request(req))
    generation = await core.open(prepared, http_request)
    if req.stream:
        return with_unenforced_header(StreamingResponse(_native_body(generation), media_type="text/plain; charset=utf-8"), prepared)
    (answer,) = await core.collect([generation], http_request)
    finish = answer.finish
    return with_unenforced_header(PredictResponse(
        text=answer.text, finish_reason=finish.reason, usage=Usage.of(finish.prompt_tokens, finish.completion_tokens, finish.cached_tokens)
    ).model_dump(), prepared)


async def _native_body(generation: Generation) -> AsyncIterator[bytes]:
    try:
        async with aclosing(generation.events()) as events:
            async for event in events:
                if event.__class__ is TextDelta:
                    if event.text:
                        yield event.text.encode()
                elif event.__class__ is Failure:
                    raise StreamFailed(event.message)  # aborts the chunked body: a visible, broken transfer
    finally:
        generation.close()
