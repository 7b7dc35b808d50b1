"""What `model/model.py` delegates to: start the stack, validate requests, stream from the ensemble.

Streams are returned as `StreamingResponse` objects rather than async generators: truss runs a
returned generator to completion in a background task whatever the client does (and turns its
exceptions into a normal end of stream), whereas a `StreamingResponse` is cancelled by Starlette when
the client disconnects, which cancels the gRPC call and so the Triton request.

Errors in the middle of a stream are visible: the native text stream is aborted (the chunked body
never completes, so clients see a truncated transfer), and an OpenAI SSE stream gets an
`event: error` message and stops without `[DONE]`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from contextlib import aclosing, contextmanager
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError

from trtllm_truss.api.errors import from_validation_error
from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.api.native import DEFAULT_MAX_TOKENS, PredictRequest, PredictResponse, Usage
from trtllm_truss.api.openai import (
    OPENAI_DEFAULT_COMPLETION_MAX_TOKENS,
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
    completion_id,
    sse_error,
    sse_event,
)
from trtllm_truss.api.prompt import PromptTokenizer, PromptTokens
from trtllm_truss.api.sampling import check_prompt_length, resolve_max_tokens, to_generation_params
from trtllm_truss.api.stops import StopSequenceTrimmer
from trtllm_truss.client import Delta, EnsembleClient, GenerationParams, UpstreamError
from trtllm_truss.config.schema import DetokenizeIn
from trtllm_truss.detokenize import TokenDecoder
from trtllm_truss.preprocess import parse_prompt_too_long
from trtllm_truss.repository.models import ENSEMBLE, IDS_ENSEMBLE

if TYPE_CHECKING:
    from trtllm_truss.plan import ServingPlan

logger = logging.getLogger(__name__)
# Upper bound on tokens that cover no byte of the text: BOS/EOS and a sentencepiece dummy prefix.
TOKENS_A_TOKENIZER_ADDS = 4

RequestModel = TypeVar("RequestModel", bound=BaseModel)
T = TypeVar("T")
DISCONNECT_POLL_S = 0.25
SERVED_MODEL_NAME = "model"


def parse_request(model: type[RequestModel], body: Any) -> RequestModel:
    if not isinstance(body, Mapping):
        raise HTTPException(
            status_code=422, detail=f"invalid request: body: expected a JSON object, got {type(body).__name__}"
        )
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


@contextmanager
def openai_error_shape() -> Iterator[None]:
    """OpenAI clients read `{"error": {"message": ...}}` (truss wraps `detail` in `{"error": ...}`)."""
    try:
        yield
    except HTTPException as exc:
        if isinstance(exc.detail, str):
            error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
            detail = {"message": exc.detail, "type": error_type, "param": None, "code": exc.status_code}
            raise HTTPException(status_code=exc.status_code, detail=detail) from None
        raise


def upstream_http_error(exc: UpstreamError) -> HTTPException:
    return HTTPException(status_code=503, detail=f"upstream unavailable: {exc}")


@dataclass
class Generation:
    """Accumulates one request's output; knows its usage and finish reason at the end."""

    prompt_tokens: PromptTokens
    max_tokens: int
    parts: list[str] = field(default_factory=list)
    reported_tokens: int = 0
    all_counts_reported: bool = True

    def add(self, delta: Delta) -> None:
        self.parts.append(delta.text)
        if delta.token_count is None:
            self.all_counts_reported = False
        else:
            self.reported_tokens += delta.token_count

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def completion_tokens(self, tokenizer: PromptTokenizer) -> int:
        # Prefer the engine's own counts; re-tokenizing the text is the fallback for ensembles
        # that report only text.
        if self.all_counts_reported and self.parts:
            return self.reported_tokens
        return tokenizer.count_completion(self.text)

    def finish(self, tokenizer: PromptTokenizer) -> tuple[str, Usage]:
        completion = self.completion_tokens(tokenizer)
        reason = "length" if completion >= self.max_tokens else "stop"
        return reason, Usage.of(self.prompt_tokens.value, completion)

    def finish_reason(self, tokenizer: PromptTokenizer) -> str:
        """Without usage: the prompt is then never counted (streams that do not report usage)."""
        return "length" if self.completion_tokens(tokenizer) >= self.max_tokens else "stop"


@dataclass(frozen=True)
class StreamEnd:
    """The last item of an SSE text stream: what is left to send and why it ended."""

    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None  # set when the upstream failed mid-stream


def ensemble_client(grpc_url: str, plan: ServingPlan) -> EnsembleClient:
    """The client `runtime.detokenize_in` asks for: token ids from `ensemble_ids`, decoded here
    (default), or text from NVIDIA's `ensemble` (decoded by the postprocessing model)."""
    if plan.runtime.detokenize_in == DetokenizeIn.PROXY:
        from trtllm_truss.tokenizer import load_tokenizer

        decoder = TokenDecoder(load_tokenizer(plan.tokenizer_dir), skip_special_tokens=True)
        return EnsembleClient(
            grpc_url,
            model_name=IDS_ENSEMBLE,
            decoder=decoder,
        )
    return EnsembleClient(grpc_url, model_name=ENSEMBLE)


@dataclass(frozen=True)
class PreparedRequest:
    params: GenerationParams
    prompt_tokens: PromptTokens  # exact count computed lazily, see api/prompt.py
    max_tokens: int
    prompt_field: str  # where the prompt came from, for errors about it ("prompt" or "messages")


class LLMService:
    """Owns the Triton stack, the shared gRPC client and the tokenizer of one deployment."""

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
        self._client: EnsembleClient | None = None
        self._tokenizer: PromptTokenizer | None = None
        self._limits: RequestLimits | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    def load(self, progress: Callable[[str], None] | None = None) -> None:
        """Blocking: configuration -> plan -> artifacts -> repository -> tritonserver ready.

        `progress` receives a short description of each stage as it starts.
        """
        from trtllm_truss.stack import start_stack  # imported here: the heavy part of startup

        started = time.monotonic()
        self._stack = start_stack(
            self.truss_dir, secrets=self._secrets, environ=self._environ, progress=progress or (lambda _: None)
        )
        plan = self._stack.plan
        self._tokenizer = PromptTokenizer.load(plan.tokenizer_dir)
        self._limits = RequestLimits.from_plan(plan, vocab_size=self._tokenizer.vocab_size)
        self._client = ensemble_client(self._stack.server.grpc_url, plan)
        # Everything loaded so far (torch and transformers: ~400k objects) lives as long as the
        # process; left to the collector, each full collection walks all of it (~200 ms with the
        # event loop stopped, several times a minute under load). Frozen, it is never walked again.
        gc.freeze()
        logger.info("stack ready in %.1f s (backend %s)", time.monotonic() - started, plan.backend)

    def shutdown(self) -> None:
        if self._stack is not None:
            self._stack.stop()

    async def is_healthy(self) -> bool:
        """tritonserver alive and the ensemble ready."""
        if self._stack is None or self._client is None or not self._stack.server.alive:
            return False
        return await self._client.is_ready()

    @property
    def client(self) -> EnsembleClient:
        if self._client is None:
            raise HTTPException(status_code=503, detail="the model is still loading")
        return self._client

    @property
    def tokenizer(self) -> PromptTokenizer:
        if self._tokenizer is None:
            raise HTTPException(status_code=503, detail="the model is still loading")
        return self._tokenizer

    @property
    def limits(self) -> RequestLimits:
        if self._limits is None:
            raise HTTPException(status_code=503, detail="the model is still loading")
        return self._limits

    # --- native predict --------------------------------------------------------------------------

    async def predict(self, request: Any, http_request: Request | None = None) -> dict | StreamingResponse:
        req = parse_request(PredictRequest, request)
        if req.prompt is not None:
            text, prompt_field = req.prompt, "prompt"
        else:
            text, prompt_field = self.tokenizer.render_chat(req.messages or []), "messages"
        prepared = self._prepare(
            req,
            text=text,
            prompt_field=prompt_field,
            max_tokens_field="max_tokens",
            requested_max_tokens=req.max_tokens,
            default_max_tokens=DEFAULT_MAX_TOKENS,
            stop_words=req.stop_words_list,
            bad_words=req.bad_words_list,
            beam_width=req.beam_width,
        )
        if req.stream:
            deltas, first = await self._start(prepared, http_request)
            return StreamingResponse(self._native_stream(first, deltas), media_type="text/plain; charset=utf-8")
        generation = await self._collect(prepared, http_request)
        reason, usage = generation.finish(self.tokenizer)
        return PredictResponse(text=generation.text, finish_reason=reason, usage=usage).model_dump()

    async def _native_stream(self, first: Delta | None, deltas: AsyncIterator[Delta]) -> AsyncIterator[bytes]:
        # An UpstreamError raised here aborts the chunked body: the client sees a broken transfer,
        # never an error message disguised as generated text.
        async with aclosing(deltas):
            if first is not None and first.text:
                yield first.text.encode()
            async for delta in deltas:  # directly, not through `_with_first`: one generator less per token
                if delta.text:
                    yield delta.text.encode()

    # --- OpenAI-compatible -----------------------------------------------------------------------

    async def chat_completions(self, request: Any, http_request: Request | None = None) -> dict | StreamingResponse:
        with openai_error_shape():
            return await self._chat_completions(request, http_request)

    async def completions(self, request: Any, http_request: Request | None = None) -> dict | StreamingResponse:
        with openai_error_shape():
            return await self._completions(request, http_request)

    async def _chat_completions(self, request: Any, http_request: Request | None) -> dict | StreamingResponse:
        req = parse_request(ChatCompletionRequest, request)
        text = self.tokenizer.render_chat(req.messages)
        max_tokens_field, requested = req.requested_max_tokens()
        prepared = self._prepare(
            req,
            text=text,
            prompt_field="messages",
            max_tokens_field=max_tokens_field,
            requested_max_tokens=requested,
            default_max_tokens=self.limits.max_output_len,
            stop_words=req.stop_words(),
        )
        model = req.model or SERVED_MODEL_NAME
        if req.stream:
            deltas, first = await self._start(prepared, http_request)
            stream = self._chat_sse(prepared, first, deltas, req, model)
            return StreamingResponse(stream, media_type="text/event-stream")
        generation = await self._collect(prepared, http_request)
        content, reason, usage = self._trimmed_result(generation, req.stop_words())
        return ChatCompletion(
            id=completion_id("chatcmpl"),
            model=model,
            choices=[ChatChoice(message=AssistantMessage(content=content), finish_reason=reason)],
            usage=usage,
        ).model_dump()

    async def _completions(self, request: Any, http_request: Request | None) -> dict | StreamingResponse:
        req = parse_request(CompletionRequest, request)
        prepared = self._prepare(
            req,
            text=req.prompt_text(),
            prompt_field="prompt",
            max_tokens_field="max_tokens",
            requested_max_tokens=req.max_tokens,
            default_max_tokens=OPENAI_DEFAULT_COMPLETION_MAX_TOKENS,
            stop_words=req.stop_words(),
        )
        model = req.model or SERVED_MODEL_NAME
        if req.stream:
            deltas, first = await self._start(prepared, http_request)
            stream = self._completion_sse(prepared, first, deltas, req, model)
            return StreamingResponse(stream, media_type="text/event-stream")
        generation = await self._collect(prepared, http_request)
        text, reason, usage = self._trimmed_result(generation, req.stop_words())
        return Completion(
            id=completion_id("cmpl"),
            model=model,
            choices=[CompletionChoice(text=text, finish_reason=reason)],
            usage=usage,
        ).model_dump()

    async def _chat_sse(
        self,
        prepared: PreparedRequest,
        first: Delta | None,
        deltas: AsyncIterator[Delta],
        req: ChatCompletionRequest,
        model: str,
    ) -> AsyncIterator[bytes]:
        envelope = {"id": completion_id("chatcmpl"), "model": model}

        def chunk(delta: ChatDelta, finish_reason: str | None = None) -> bytes:
            return sse_event(
                ChatCompletionChunk(**envelope, choices=[ChatChunkChoice(delta=delta, finish_reason=finish_reason)])
            )

        yield chunk(ChatDelta(role="assistant", content=""))
        async for item in self._sse_texts(prepared, first, deltas, req.stop_words(), req.wants_usage_chunk()):
            if isinstance(item, str):
                yield chunk(ChatDelta(content=item))
            elif item.error is not None:
                yield sse_error(item.error)
            else:
                if item.text:
                    yield chunk(ChatDelta(content=item.text))
                yield chunk(ChatDelta(), item.finish_reason)
                if req.wants_usage_chunk():
                    yield sse_event(ChatCompletionChunk(**envelope, choices=[], usage=item.usage))
                yield SSE_DONE

    async def _completion_sse(
        self,
        prepared: PreparedRequest,
        first: Delta | None,
        deltas: AsyncIterator[Delta],
        req: CompletionRequest,
        model: str,
    ) -> AsyncIterator[bytes]:
        envelope = {"id": completion_id("cmpl"), "model": model}
        async for item in self._sse_texts(prepared, first, deltas, req.stop_words(), req.wants_usage_chunk()):
            if isinstance(item, str):
                yield sse_event(Completion(**envelope, choices=[CompletionChoice(text=item, finish_reason=None)]))
            elif item.error is not None:
                yield sse_error(item.error)
            else:
                choice = CompletionChoice(text=item.text, finish_reason=item.finish_reason)
                yield sse_event(Completion(**envelope, choices=[choice]))
                if req.wants_usage_chunk():
                    yield sse_event(Completion(**envelope, choices=[], usage=item.usage))
                yield SSE_DONE

    async def _sse_texts(
        self,
        prepared: PreparedRequest,
        first: Delta | None,
        deltas: AsyncIterator[Delta],
        stop_words: list[str],
        with_usage: bool,
    ) -> AsyncIterator[str | StreamEnd]:
        """Text per delta (stop sequences held back and removed), then one `StreamEnd` (with usage
        only if `with_usage`)."""
        generation = Generation(prepared.prompt_tokens, prepared.max_tokens)
        trimmer = StopSequenceTrimmer(stop_words)
        async with aclosing(deltas):
            try:
                async for delta in _with_first(first, deltas):
                    generation.add(delta)
                    text = trimmer.feed(delta.text)
                    if text:
                        yield text
            except UpstreamError as exc:
                logger.warning("stream ended by an upstream error: %s", exc)
                yield StreamEnd(error=str(exc))
                return
        if with_usage:
            reason, usage = generation.finish(self.tokenizer)
        else:
            reason, usage = generation.finish_reason(self.tokenizer), None
        yield StreamEnd(text=trimmer.flush(), finish_reason="stop" if trimmer.stopped else reason, usage=usage)

    # --- shared steps ----------------------------------------------------------------------------

    def _prepare(
        self,
        req: Any,
        *,
        text: str,
        prompt_field: str,
        max_tokens_field: str,
        requested_max_tokens: int | None,
        default_max_tokens: int,
        stop_words: list[str],
        bad_words: list[str] | None = None,
        beam_width: int | None = None,
    ) -> PreparedRequest:
        limits = self.limits
        prompt_tokens = self.tokenizer.prompt_tokens(text)
        # Counted here only when it could matter: every token but the few a tokenizer adds itself
        # covers at least one byte of the text, so a prompt this short in UTF-8 cannot exceed
        # max_input_len and skips the count (the largest per-request cost of the proxy). Longer ones
        # are counted and refused before reaching Triton; preprocessing enforces the exact limit too,
        # and `_upstream_error` answers its refusal with the same 400.
        # An empty text is counted too (free): with no BOS it is zero tokens, a 400, not an engine error.
        if not text or len(text.encode("utf-8")) + TOKENS_A_TOKENIZER_ADDS > limits.max_input_len:
            check_prompt_length(prompt_field, prompt_tokens.value, limits)
        max_tokens = resolve_max_tokens(max_tokens_field, requested_max_tokens, default_max_tokens, limits)
        params = to_generation_params(
            req,
            text_input=text,
            max_tokens=max_tokens,
            limits=limits,
            stop_words=stop_words,
            bad_words=bad_words or (),
            beam_width=beam_width,
        )
        return PreparedRequest(params=params, prompt_tokens=prompt_tokens, max_tokens=max_tokens, prompt_field=prompt_field)

    async def _start(
        self, prepared: PreparedRequest, http_request: Request | None
    ) -> tuple[AsyncIterator[Delta], Delta | None]:
        """Open the stream and wait for its first delta before any HTTP status is sent.

        A dead server or a request Triton refuses is then a clean 503 (400 for a prompt that
        preprocessing refuses as too long) rather than a broken stream; a client that leaves while
        waiting cancels the request.
        """
        deltas = self.client.generate(prepared.params)
        try:
            first = await _unless_disconnected(anext(deltas, None), http_request, "the first token")
        except UpstreamError as exc:
            await deltas.aclose()
            raise self._upstream_error(exc, prepared) from exc
        except BaseException:
            await deltas.aclose()
            raise
        return deltas, first

    async def _collect(self, prepared: PreparedRequest, http_request: Request | None) -> Generation:
        generation = Generation(prepared.prompt_tokens, prepared.max_tokens)

        async def run() -> Generation:
            async for delta in self.client.generate(prepared.params):
                generation.add(delta)
            return generation

        try:
            return await _unless_disconnected(run(), http_request, "the answer")
        except UpstreamError as exc:
            raise self._upstream_error(exc, prepared) from exc

    def _upstream_error(self, exc: UpstreamError, prepared: PreparedRequest) -> HTTPException:
        """503, or the 400 of an over-long prompt when preprocessing refused it for that reason."""
        too_long = parse_prompt_too_long(str(exc))
        if too_long is not None:
            tokens, _ = too_long
            try:
                check_prompt_length(prepared.prompt_field, tokens, self.limits)
            except HTTPException as client_error:
                return client_error
        return upstream_http_error(exc)

    def _trimmed_result(self, generation: Generation, stop_words: list[str]) -> tuple[str, str, Usage]:
        trimmer = StopSequenceTrimmer(stop_words)
        text = trimmer.feed(generation.text) + trimmer.flush()
        reason, usage = generation.finish(self.tokenizer)
        return text, ("stop" if trimmer.stopped else reason), usage


async def _with_first(first: Delta | None, rest: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
    if first is not None:
        yield first
    async for delta in rest:
        yield delta


async def _unless_disconnected(work: Awaitable[T], http_request: Request | None, waiting_for: str) -> T:
    """`work`'s result; if the HTTP client leaves first, `work` is cancelled (and with it the Triton
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
                raise HTTPException(status_code=499, detail=f"client disconnected while waiting for {waiting_for}")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
