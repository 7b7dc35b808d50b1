"""What `model/model.py` delegates to: start the stack, validate requests, relay the stream workers.

The truss process (one asyncio thread) only validates a request, hands it to a stream worker
(`streaming.pool`) and writes each stream's text as it arrives; tokenization, the engine stream,
detokenization, stop strings and usage all happen in the workers.

Streams are returned as `StreamingResponse` objects rather than async generators: truss runs a
returned generator to completion in a background task whatever the client does (and turns its
exceptions into a normal end of stream), whereas a `StreamingResponse` is cancelled by Starlette when
the client disconnects, which cancels the request in its worker and so in the engine.

Errors before any text are answered with their status (400 for what the request asked, 429 when
too many requests are in flight, 503 when the engine cannot be reached). Errors in the middle of a
stream are visible: the native text stream is aborted (the chunked body never completes, so clients
see a truncated transfer), and an OpenAI SSE stream gets an `event: error` message and stops
without `[DONE]`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError

from trtllm_truss.api.errors import error_response, field_error, from_validation_error
from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.api.native import DEFAULT_MAX_TOKENS, PredictRequest, PredictResponse, Usage
from trtllm_truss.api.openai import (
    OPENAI_DEFAULT_COMPLETION_MAX_TOKENS,
    OPENAI_DEFAULT_TOP_P,
    SSE_DONE,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    Completion,
    CompletionChoice,
    CompletionRequest,
    LogProbEntry,
    chat_logprobs,
    completion_id,
    completion_logprobs,
    sse_error,
    sse_event,
)
from trtllm_truss.api.sampling import resolve_max_tokens, to_generation_params
from trtllm_truss.api.sse import ChunkTemplate
from trtllm_truss.choices import OpenedChoice, choice_specs, choices_sse, choices_usage, close_all
from trtllm_truss.metrics import ServingMetrics
from trtllm_truss.streaming.pool import PoolBusy, PoolUnavailable, ResponseStream, StreamPool, default_worker_count
from trtllm_truss.streaming.protocol import GenerationSpec, StreamEnd

if TYPE_CHECKING:
    from trtllm_truss.plan import ServingPlan

logger = logging.getLogger(__name__)

RequestModel = TypeVar("RequestModel", bound=BaseModel)
T = TypeVar("T")
DISCONNECT_POLL_S = 0.25
SERVED_MODEL_NAME = "model"
RETRY_AFTER_S = 1


class StreamFailed(RuntimeError):
    """Raised inside a native text stream to abort its chunked body (never shown as text)."""


def parse_request(model: type[RequestModel], body: Any) -> RequestModel:
    if not isinstance(body, Mapping):
        raise HTTPException(
            status_code=422, detail=f"invalid request: body: expected a JSON object, got {type(body).__name__}"
        )
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


class _ChoiceFailed(Exception):
    """One choice of several ended with an error: its siblings are cancelled."""


class _Refused(Exception):
    """A request answered with an error before any text (carries the response to send).
    `counted`: its stream already reported the outcome to the metrics."""

    def __init__(
        self, status: int, message: str, headers: Mapping[str, str] | None = None, *, counted: bool = False
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.counted = counted


_METRICS: ServingMetrics | None = None


def serving_metrics() -> ServingMetrics:
    """The process's one set of request metrics on truss's `/metrics` (registered once)."""
    global _METRICS
    if _METRICS is None:
        _METRICS = ServingMetrics(model_name=SERVED_MODEL_NAME)
    return _METRICS


class _MetricsListener:
    """Reports each stream's start (first text) and outcome; the truss thread does this once per
    request, never per token (inter-token gaps come bucketed from the worker)."""

    def __init__(self, metrics: ServingMetrics) -> None:
        self.metrics = metrics

    def stream_started(self, stream: ResponseStream) -> None:
        self.metrics.request_started()

    def stream_closed(self, stream: ResponseStream) -> None:
        end = stream.end
        if end is None:
            status = "abort"  # the client left (or the request was cancelled) before the end
        elif end.error is not None:
            status = str(end.status or 503)
        else:
            status = end.finish_reason or "stop"
        first = stream.first_text_at
        self.metrics.request_finished(
            status,
            end.prompt_tokens if end else 0,
            end.completion_tokens if end else 0,
            None if first is None else first - stream.opened_at,
            end.itl if end is not None and end.itl is not None else (),
            e2e_s=time.monotonic() - stream.opened_at,
            was="running" if first is not None else "waiting",
        )


async def _answered(handling: Awaitable[Any], *, openai: bool) -> Any:
    """The handler's response, or the error response of a request refused before any text."""
    try:
        return await handling
    except _Refused as exc:
        if not exc.counted:
            serving_metrics().request_finished(str(exc.status), was="none")
        return error_response(exc.status, exc.message, openai=openai, headers=exc.headers)
    except HTTPException as exc:
        serving_metrics().request_finished(str(exc.status_code), was="none")
        return error_response(exc.status_code, str(exc.detail), openai=openai)


def _usage(end: StreamEnd) -> Usage:
    return Usage.of(end.prompt_tokens, end.completion_tokens)


class LLMService:
    """Owns the Triton stack and the stream workers of one deployment."""

    def __init__(
        self,
        truss_dir: Path | str,
        secrets: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.truss_dir = Path(truss_dir)
        self._secrets = secrets
        self._environ = environ
        self._stack: Any = None
        self._pool: StreamPool | None = None
        self._limits: RequestLimits | None = None
        self._engine_probe: Any = None
        self._listener = _MetricsListener(serving_metrics())

    # --- lifecycle -------------------------------------------------------------------------------

    def load(self, progress: Callable[[str], None] | None = None) -> None:
        """Blocking: configuration -> plan -> artifacts -> repository -> tritonserver ready -> workers ready.

        `progress` receives a short description of each stage as it starts.
        """
        from trtllm_truss.config.errors import install_log_redaction
        from trtllm_truss.stack import start_stack  # imported here: the heavy part of startup

        install_log_redaction()  # truss has configured logging by now: no secret value in its records
        progress = progress or (lambda _: None)
        started = time.monotonic()
        self._stack = start_stack(self.truss_dir, secrets=self._secrets, environ=self._environ, progress=progress)
        plan = self._stack.plan
        if self._stack.is_worker_node:  # its ranks are node 0's to start; this truss serves no requests
            return
        try:
            from trtllm_truss.tokenizer import ensure_tokenizer_json

            # A sentencepiece-only tokenizer is converted once here, not by every worker.
            ensure_tokenizer_json(plan.tokenizer_dir, trust_remote_code=plan.runtime.trust_remote_code)
            progress("starting the stream workers")
            self._pool = stream_pool(plan, self._stack.server.grpc_url)
            self._pool.start()
        except BaseException:
            self._stack.stop()
            raise
        info = self._pool.info
        self._limits = RequestLimits.from_plan(
            plan, vocab_size=info and info.vocab_size, max_token_bytes=info and info.max_token_bytes
        )
        health = plan.runtime.health
        if health.enabled:
            from trtllm_truss.health import EngineProbe

            self._engine_probe = EngineProbe(
                self._stack.server.grpc_url,
                health.interval_s,
                health.timeout_s,
                interface="text" if plan.backend == "llmapi" else "tokens",
            )
            self._engine_probe.start()
        # Everything loaded so far lives as long as the process; left to the collector, each full
        # collection walks all of it with the event loop stopped. Frozen, it is never walked again.
        gc.freeze()
        logger.info(
            "stack ready in %.1f s (backend %s, %d stream workers)",
            time.monotonic() - started,
            plan.backend,
            len(self._pool.pids),
        )

    def shutdown(self) -> None:
        # Every gRPC client first: tritonserver waits for open streams before it can stop.
        if self._engine_probe is not None:
            self._engine_probe.stop()
        if self._pool is not None:
            self._pool.stop()
        if self._stack is not None:
            self._stack.stop()

    async def is_healthy(self) -> bool:
        """tritonserver alive with its models ready, a stream worker running, and the engine answering
        its probe (a hung engine reads unhealthy within runtime.health's interval + timeout)."""
        if self._stack is not None and self._stack.is_worker_node:
            return True  # prepared; the world's health is node 0's to report
        if self._stack is None or self._pool is None or not self._stack.server.alive or not self._pool.alive():
            return False
        # Triton's own readiness of the models (a restarted tritonserver is alive before it is ready);
        # a blocking loopback HTTP call, so off the event loop.
        if not await asyncio.to_thread(self._stack.server.ready):
            return False
        probe = self._engine_probe
        if probe is not None and not probe.healthy:
            if probe.last_error:
                logger.warning("engine probe: %s", probe.last_error)
            return False
        return True

    @property
    def pool(self) -> StreamPool:
        if self._pool is None:
            raise self._not_serving()
        return self._pool

    @property
    def limits(self) -> RequestLimits:
        if self._limits is None:
            raise self._not_serving()
        return self._limits

    def _not_serving(self) -> HTTPException:
        if self._stack is not None and self._stack.is_worker_node:
            group = self._stack.cluster.group
            return HTTPException(
                status_code=503,
                detail=f"node {group.node_rank} of {group.node_count} runs model ranks only; send requests to node 0"
                f" ({group.hosts[0]})",
            )
        return HTTPException(status_code=503, detail="the model is still loading")

    # --- native predict --------------------------------------------------------------------------

    async def predict(self, request: Any, http_request: Request | None = None) -> Any:
        return await _answered(self._predict(request, http_request), openai=False)

    async def _predict(self, request: Any, http_request: Request | None) -> Any:
        req = parse_request(PredictRequest, request)
        if req.prompt is not None:
            prompt, messages, prompt_field = req.prompt, None, "prompt"
        else:
            prompt, messages, prompt_field = None, req.messages or [], "messages"
        spec = self._spec(
            req,
            prompt=prompt,
            messages=messages,
            prompt_field=prompt_field,
            max_tokens_field="max_tokens",
            requested_max_tokens=req.max_tokens,
            default_max_tokens=DEFAULT_MAX_TOKENS,
            stop_words=req.stop_words_list,
            keep_stop_text=True,
            bad_words=req.bad_words_list,
            beam_width=req.beam_width,
        )
        stream, first = await self._open(spec, http_request)
        if req.stream:
            return StreamingResponse(self._native_body(stream, first), media_type="text/plain; charset=utf-8")
        text, end = await self._collect(stream, first, http_request)
        return PredictResponse(text=text, finish_reason=end.finish_reason or "stop", usage=_usage(end)).model_dump()

    async def _native_body(self, stream: ResponseStream, first: str | None) -> AsyncIterator[bytes]:
        try:
            if first:
                yield first.encode()
            while True:
                text = await stream.next_text()
                if text is None:
                    break
                yield text.encode()
            if stream.end is not None and stream.end.error is not None:
                logger.warning("stream ended by an error: %s", stream.end.error)
                raise StreamFailed(stream.end.error)  # aborts the chunked body: a visible, broken transfer
        finally:
            stream.close()

    # --- OpenAI-compatible -----------------------------------------------------------------------

    async def chat_completions(self, request: Any, http_request: Request | None = None) -> Any:
        return await _answered(self._chat_completions(request, http_request), openai=True)

    async def completions(self, request: Any, http_request: Request | None = None) -> Any:
        return await _answered(self._completions(request, http_request), openai=True)

    async def _chat_completions(self, request: Any, http_request: Request | None) -> Any:
        req = parse_request(ChatCompletionRequest, request)
        _refuse_what_the_engine_cannot_do(req)
        if req.n > 1 or req.wants_log_probs():
            return await self._chat_choices(req, http_request)
        spec = self._chat_spec(req)
        model = req.model or SERVED_MODEL_NAME
        stream, first = await self._open(spec, http_request)
        if req.stream:
            return StreamingResponse(self._chat_sse(stream, first, req, model), media_type="text/event-stream")
        text, end = await self._collect(stream, first, http_request)
        return ChatCompletion(
            id=completion_id("chatcmpl"),
            model=model,
            choices=[ChatChoice(message=AssistantMessage(content=text), finish_reason=end.finish_reason or "stop")],
            usage=_usage(end),
        ).model_dump()

    async def _completions(self, request: Any, http_request: Request | None) -> Any:
        req = parse_request(CompletionRequest, request)
        _refuse_what_the_engine_cannot_do(req)
        prompts = req.prompts()
        if req.n > 1 or req.wants_log_probs() or len(prompts) > 1 or not isinstance(prompts[0], str):
            return await self._completion_choices(req, http_request)
        spec = self._completion_spec(req, req.prompt_text())
        model = req.model or SERVED_MODEL_NAME
        stream, first = await self._open(spec, http_request)
        if req.stream:
            return StreamingResponse(self._completion_sse(stream, first, req, model), media_type="text/event-stream")
        text, end = await self._collect(stream, first, http_request)
        return Completion(
            id=completion_id("cmpl"),
            model=model,
            choices=[CompletionChoice(text=text, finish_reason=end.finish_reason or "stop")],
            usage=_usage(end),
        ).model_dump()

    async def _chat_sse(
        self, stream: ResponseStream, first: str | None, req: ChatCompletionRequest, model: str
    ) -> AsyncIterator[bytes]:
        envelope = {"id": completion_id("chatcmpl"), "model": model}
        template = ChunkTemplate(
            ChatCompletionChunk(**envelope, choices=[ChatChunkChoice(delta=ChatDelta(content=ChunkTemplate.mark()))])
        )

        def chunk(delta: ChatDelta, finish_reason: str | None = None) -> bytes:
            return sse_event(
                ChatCompletionChunk(**envelope, choices=[ChatChunkChoice(delta=delta, finish_reason=finish_reason)])
            )

        def closing(end: StreamEnd) -> list[bytes]:
            events = [chunk(ChatDelta(), end.finish_reason)]
            if req.wants_usage_chunk():
                events.append(sse_event(ChatCompletionChunk(**envelope, choices=[], usage=_usage(end))))
            return events

        yield chunk(ChatDelta(role="assistant", content=""))
        async for event in _sse_events(stream, first, template, closing):
            yield event

    async def _completion_sse(
        self, stream: ResponseStream, first: str | None, req: CompletionRequest, model: str
    ) -> AsyncIterator[bytes]:
        envelope = {"id": completion_id("cmpl"), "model": model}
        template = ChunkTemplate(
            Completion(**envelope, choices=[CompletionChoice(text=ChunkTemplate.mark(), finish_reason=None)])
        )

        def closing(end: StreamEnd) -> list[bytes]:
            events = [sse_event(Completion(**envelope, choices=[CompletionChoice(text="", finish_reason=end.finish_reason)]))]
            if req.wants_usage_chunk():
                events.append(sse_event(Completion(**envelope, choices=[], usage=_usage(end))))
            return events

        async for event in _sse_events(stream, first, template, closing):
            yield event

    # --- shared steps ----------------------------------------------------------------------------

    def _chat_spec(self, req: ChatCompletionRequest) -> GenerationSpec:
        max_tokens_field, requested = req.requested_max_tokens()
        return self._spec(
            req,
            prompt=None,
            messages=req.messages,
            prompt_field="messages",
            max_tokens_field=max_tokens_field,
            requested_max_tokens=requested,
            default_max_tokens=self.limits.max_output_len,
            stop_words=req.stop_words(),
            default_top_p=OPENAI_DEFAULT_TOP_P,
        )

    def _completion_spec(self, req: CompletionRequest, prompt: str | None) -> GenerationSpec:
        return self._spec(
            req,
            prompt=prompt,
            messages=None,
            prompt_field="prompt",
            max_tokens_field="max_tokens",
            requested_max_tokens=req.max_tokens,
            default_max_tokens=OPENAI_DEFAULT_COMPLETION_MAX_TOKENS,
            stop_words=req.stop_words(),
            default_top_p=OPENAI_DEFAULT_TOP_P,
        )

    def _spec(
        self,
        req: Any,
        *,
        prompt: str | None,
        messages: Any,
        prompt_field: str,
        max_tokens_field: str,
        requested_max_tokens: int | None,
        default_max_tokens: int,
        stop_words: list[str],
        keep_stop_text: bool = False,
        bad_words: list[str] | None = None,
        beam_width: int | None = None,
        default_top_p: float | None = None,
    ) -> GenerationSpec:
        limits = self.limits
        max_tokens = resolve_max_tokens(max_tokens_field, requested_max_tokens, default_max_tokens, limits)
        params = to_generation_params(
            req,
            text_input="",
            max_tokens=max_tokens,
            limits=limits,
            stop_words=stop_words,
            bad_words=bad_words or (),
            beam_width=beam_width,
            default_top_p=default_top_p,
        )
        return GenerationSpec(
            params=params,
            prompt=prompt,
            messages=None if messages is None else tuple((m.role, m.text()) for m in messages),
            prompt_field=prompt_field,
            keep_stop_text=keep_stop_text,
            literal_special_tokens=getattr(req, "literal_special_tokens", True),
        )

    async def _open(self, spec: GenerationSpec, http_request: Request | None) -> tuple[ResponseStream, str | None]:
        """Hand the request to a worker and wait for its first text before any HTTP status is sent:
        a refused request is then a clean 4xx/5xx rather than a broken stream; a client that leaves
        while waiting cancels the request."""
        try:
            stream = await self.pool.submit(spec)
            stream.listener = self._listener
            self._listener.metrics.request_queued()
        except PoolBusy as exc:
            raise _Refused(429, f"too many requests in flight ({exc}); retry shortly", {"Retry-After": str(RETRY_AFTER_S)})
        except PoolUnavailable:
            raise _Refused(503, "the model is restarting; retry shortly", {"Retry-After": str(RETRY_AFTER_S)})
        try:
            while not await stream.wait_for_text(DISCONNECT_POLL_S):
                if http_request is not None and await http_request.is_disconnected():
                    raise _Refused(499, "client disconnected while waiting for the first token")
            first = await stream.next_text()
        except BaseException:
            stream.close()
            raise
        end = stream.end
        if first is None and end is not None and end.error is not None:
            stream.close()
            raise _Refused(end.status or 503, end.error, counted=True)
        return stream, first

    async def _collect(
        self, stream: ResponseStream, first: str | None, http_request: Request | None
    ) -> tuple[str, StreamEnd]:
        async def read_all() -> str:
            parts = [first] if first else []
            while (text := await stream.next_text()) is not None:
                parts.append(text)
            return "".join(parts)

        try:
            text = await _unless_disconnected(read_all(), http_request, "the answer")
        finally:
            stream.close()
        end = stream.end
        assert end is not None
        if end.error is not None:
            raise _Refused(end.status or 503, end.error, counted=True)
        return text, end

    # --- several choices: n > 1, a list of prompts, token-id prompts, log probs -------------------
    # One engine request per (prompt, choice); choices are indexed prompt-major (prompt i, choice j
    # is index i * n + j), as OpenAI does. Admission is all or nothing, and every sibling is
    # cancelled when the client leaves or one of them fails.

    async def _chat_choices(self, req: ChatCompletionRequest, http_request: Request | None) -> Any:
        spec = self._chat_spec(req)
        specs = choice_specs(req, [spec])
        model = req.model or SERVED_MODEL_NAME
        opened = await self._open_choices(specs, http_request)
        top = req.top_logprobs or 0
        if req.stream:
            return StreamingResponse(self._chatchoices_sse(opened, req, model, top), media_type="text/event-stream")
        answers = await self._collect_choices(opened, http_request)
        choices = [
            ChatChoice(
                index=index,
                message=AssistantMessage(content=text),
                finish_reason=end.finish_reason or "stop",
                logprobs=chat_logprobs(entries, top) if req.wants_log_probs() else None,
            )
            for index, (text, entries, end) in enumerate(answers)
        ]
        return ChatCompletion(
            id=completion_id("chatcmpl"), model=model, choices=choices, usage=choices_usage([a[2] for a in answers], req.n)
        ).model_dump()

    async def _completion_choices(self, req: CompletionRequest, http_request: Request | None) -> Any:
        prompts = req.prompts()
        first_text = next((p for p in prompts if isinstance(p, str)), None)
        base = self._completion_spec(req, first_text)
        per_prompt = []
        for i, prompt in enumerate(prompts):
            field = f"prompt[{i}]" if req.batched() else "prompt"
            if isinstance(prompt, str):
                per_prompt.append(dataclasses.replace(base, prompt=prompt, prompt_field=field))
            else:
                self._check_token_ids(field, prompt)
                per_prompt.append(dataclasses.replace(base, prompt=None, prompt_ids=tuple(prompt), prompt_field=field))
        specs = choice_specs(req, per_prompt)
        model = req.model or SERVED_MODEL_NAME
        opened = await self._open_choices(specs, http_request)
        if req.stream:
            return StreamingResponse(self._completionchoices_sse(opened, req, model), media_type="text/event-stream")
        answers = await self._collect_choices(opened, http_request)
        choices = [
            CompletionChoice(
                index=index,
                text=text,
                finish_reason=end.finish_reason or "stop",
                logprobs=completion_logprobs(entries) if req.wants_log_probs() else None,
            )
            for index, (text, entries, end) in enumerate(answers)
        ]
        return Completion(
            id=completion_id("cmpl"), model=model, choices=choices, usage=choices_usage([a[2] for a in answers], req.n)
        ).model_dump()

    def _check_token_ids(self, field: str, ids: list[int]) -> None:
        limits = self.limits
        if len(ids) > limits.max_input_len:
            raise field_error(field, f"the prompt is {len(ids)} tokens, above this deployment's max_input_len ({limits.max_input_len})")
        if limits.vocab_size is not None:
            for j, token in enumerate(ids):
                if token >= limits.vocab_size:
                    raise field_error(f"{field}[{j}]", f"{token} is not a token id (vocabulary size {limits.vocab_size})")

    async def _open_choices(
        self, specs: list[GenerationSpec], http_request: Request | None
    ) -> list[OpenedChoice]:
        """Every choice handed to a worker and its first text read, before any HTTP status is sent;
        all admitted or none (429), and any refused choice refuses the request."""
        pool = self.pool
        if len(specs) > pool.max_in_flight:
            raise field_error(
                "n",
                f"{len(specs)} choices (n x prompts) are more than this deployment admits at once ({pool.max_in_flight})",
            )
        busy = _Refused(
            429,
            f"too many requests in flight ({pool.open_streams} + {len(specs)} choices, the limit is {pool.max_in_flight}); retry shortly",
            {"Retry-After": str(RETRY_AFTER_S)},
        )
        if pool.open_streams + len(specs) > pool.max_in_flight:
            raise busy
        streams: list[ResponseStream] = []

        async def first_of(stream: ResponseStream) -> tuple[str | None, list[LogProbEntry]]:
            text = await stream.next_text()
            return text, stream.take_log_probs()

        try:
            for spec in specs:
                try:
                    stream = await pool.submit(spec)
                except PoolBusy:  # taken meanwhile by requests that arrived during a submit
                    raise busy from None
                except PoolUnavailable:
                    raise _Refused(503, "the model is restarting; retry shortly", {"Retry-After": str(RETRY_AFTER_S)}) from None
                stream.listener = self._listener
                self._listener.metrics.request_queued()
                streams.append(stream)
            firsts = await _unless_disconnected(
                asyncio.gather(*(first_of(stream) for stream in streams)), http_request, "the first token"
            )
        except BaseException:
            for stream in streams:
                stream.close()
            raise
        for stream, (first, _) in zip(streams, firsts):
            end = stream.end
            if first is None and end is not None and end.error is not None:
                for other in streams:
                    other.close()
                raise _Refused(end.status or 503, end.error, counted=True)
        return [(stream, first, entries) for stream, (first, entries) in zip(streams, firsts)]

    async def _collect_choices(
        self, opened: list[OpenedChoice], http_request: Request | None
    ) -> list[tuple[str, list[LogProbEntry], StreamEnd]]:
        """Every choice read to its end; the first that fails ends the others (and the request)."""

        async def read_all(stream: ResponseStream, first: str | None, entries: list[LogProbEntry]) -> str:
            parts = [first] if first else []
            while (text := await stream.next_text()) is not None:
                parts.append(text)
            entries += stream.take_log_probs()
            if stream.end is not None and stream.end.error is not None:
                raise _ChoiceFailed
            return "".join(parts)

        readers = [asyncio.ensure_future(read_all(*choice)) for choice in opened]
        texts: list[str] = []
        try:
            texts = await _unless_disconnected(asyncio.gather(*readers), http_request, "the answer")
        except _ChoiceFailed:
            pass  # its stream's end says why, below
        finally:
            close_all(opened)  # cancels the engine requests of choices still running
            for reader in readers:
                reader.cancel()
        for stream, _, _ in opened:
            end = stream.end
            if end is not None and end.error is not None:
                raise _Refused(end.status or 503, end.error, counted=True)
        answers = []
        for text, (stream, _, entries) in zip(texts, opened):
            assert stream.end is not None
            answers.append((text, entries, stream.end))
        return answers

    def _chatchoices_sse(
        self, opened: list[OpenedChoice], req: ChatCompletionRequest, model: str, top_logprobs: int
    ) -> AsyncIterator[bytes]:
        envelope = {"id": completion_id("chatcmpl"), "model": model}
        wants = req.wants_log_probs()

        def chunk(index: int, text: str, entries: list[LogProbEntry], finish_reason: str | None) -> bytes:
            logprobs = chat_logprobs(entries, top_logprobs) if wants and (entries or finish_reason is None) else None
            delta = ChatDelta(content=text) if finish_reason is None else ChatDelta()
            choice = ChatChunkChoice(index=index, delta=delta, finish_reason=finish_reason, logprobs=logprobs)
            return sse_event(ChatCompletionChunk(**envelope, choices=[choice]))

        roles = [
            sse_event(ChatCompletionChunk(**envelope, choices=[ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""))]))
            for index in range(len(opened))
        ]
        def usage(ends: list[StreamEnd]) -> bytes:
            return sse_event(ChatCompletionChunk(**envelope, choices=[], usage=choices_usage(ends, req.n)))

        return choices_sse(opened, chunk, roles, usage if req.wants_usage_chunk() else None)

    def _completionchoices_sse(self, opened: list, req: CompletionRequest, model: str) -> AsyncIterator[bytes]:
        envelope = {"id": completion_id("cmpl"), "model": model}
        wants = req.wants_log_probs()
        offsets = [0] * len(opened)  # characters of each choice's text sent so far

        def chunk(index: int, text: str, entries: list[LogProbEntry], finish_reason: str | None) -> bytes:
            logprobs = None
            if wants and (entries or finish_reason is None):
                logprobs = completion_logprobs(entries, offsets[index])
            offsets[index] += len(text)
            choice = CompletionChoice(index=index, text=text, finish_reason=finish_reason, logprobs=logprobs)
            return sse_event(Completion(**envelope, choices=[choice]))

        def usage(ends: list[StreamEnd]) -> bytes:
            return sse_event(Completion(**envelope, choices=[], usage=choices_usage(ends, req.n)))

        return choices_sse(opened, chunk, [], usage if req.wants_usage_chunk() else None)


async def _sse_events(
    stream: ResponseStream, first: str | None, template: ChunkTemplate, closing: Callable[[StreamEnd], list[bytes]]
) -> AsyncIterator[bytes]:
    """An OpenAI stream's events: a chunk per piece of text, then `closing(end)` and `[DONE]`, or an
    `event: error` (and no `[DONE]`) when the request failed mid-stream."""
    async for text, end in _texts_then_end(stream, first):
        if end is None:
            yield template.event(text)
        elif end.error is not None:
            logger.warning("stream ended by an error: %s", end.error)
            yield sse_error(end.error)
        else:
            for event in closing(end):
                yield event
            yield SSE_DONE


async def _texts_then_end(stream: ResponseStream, first: str | None) -> AsyncIterator[tuple[str, StreamEnd | None]]:
    """(text, None) per chunk of text, then ("", end) once; closes the stream whatever happens."""
    try:
        if first:
            yield first, None
        while True:
            text = await stream.next_text()
            if text is None:
                break
            yield text, None
        assert stream.end is not None
        yield "", stream.end
    finally:
        stream.close()


def stream_pool(plan: ServingPlan, grpc_url: str) -> StreamPool:
    """The stream workers `plan.runtime` asks for, on the engine (or the text ensemble)."""
    import os

    from trtllm_truss.config.schema import DetokenizeIn
    from trtllm_truss.repository.models import ENGINE, ENSEMBLE
    from trtllm_truss.streaming.environment import worker_environment
    from trtllm_truss.streaming.generation import WorkerSettings

    runtime = plan.runtime
    settings = WorkerSettings(
        grpc_url=grpc_url,
        tokenizer_dir=str(plan.tokenizer_dir),
        max_input_len=plan.max_input_len,
        max_output_len=plan.max_output_len,
        engine_model=ENGINE,
        text_ensemble=ENSEMBLE if runtime.detokenize_in == DetokenizeIn.POSTPROCESSING else None,
        trust_remote_code=runtime.trust_remote_code,
        llmapi=plan.backend == "llmapi",
    )
    queued = runtime.max_queued_requests if runtime.max_queued_requests is not None else 2 * plan.max_batch_size
    return StreamPool(
        settings,
        workers=runtime.stream_workers or default_worker_count(),
        max_in_flight=plan.max_batch_size + queued,
        environment=worker_environment(os.environ),
        chunk_rate=runtime.max_stream_chunks_per_s,
    )


async def _unless_disconnected(work: Awaitable[T], http_request: Request | None, waiting_for: str) -> T:
    """`work`'s result; if the HTTP client leaves first, `work` is cancelled (and with it the
    request) and the answer is 499. Needed where no StreamingResponse is watching the client yet."""
    task = asyncio.ensure_future(work)
    if http_request is None:
        return await task
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await http_request.is_disconnected():
                raise _Refused(499, f"client disconnected while waiting for {waiting_for}")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)



# --- several choices: module-level helpers ---------------------------------------------------------


def _refuse_what_the_engine_cannot_do(req: ChatCompletionRequest | CompletionRequest) -> None:
    """400 naming the field for what is valid OpenAI but that this engine path cannot answer."""
    response_format = getattr(req, "response_format", None)
    if response_format is not None and response_format.type != "text":
        raise field_error(
            "response_format",
            f"{response_format.type!r} needs guided decoding, which this deployment's engine path does not offer"
            " (only {\"type\": \"text\"} is served)",
        )
    if isinstance(req, ChatCompletionRequest):
        if req.tools or req.tool_choice not in (None, "none"):
            raise field_error(
                "tools" if req.tools else "tool_choice",
                "tool calls need guided decoding, which this deployment's engine path does not offer",
            )
        field, alternatives = "top_logprobs", req.top_logprobs or 0
    else:
        field, alternatives = "logprobs", req.logprobs or 0
    # TensorRT-LLM returns the sampled token's log prob only (output_log_probs): the most likely
    # token is known only when decoding is greedy, and never more than one.
    if alternatives > 1 or (alternatives == 1 and not req.greedy()):
        raise field_error(
            field,
            f"{alternatives} most likely tokens are not available: the engine returns the log prob of the"
            f" sampled token only; use {field}: 0, or 1 with temperature: 0",
        )
