"""The request core: one `GenerationRequest` in, a stream of typed events out, whatever the dialect.

`RequestCore.spec(request)` checks a request against the deployment's limits (400s naming the
dialect's field) and makes the worker's `GenerationSpec` (tools rendered by the chat template,
output parsers chosen, tool_choice turned into a guided-decoding constraint). `open`/`open_all`
hand specs to the stream workers and wait for each one's first output before any HTTP status is
chosen: a refusal before output raises `Refused` (the dialect answers it in its error format via
`answered`), a failure after it is a `Failure` event. `Generation.events()` yields `TextDelta`,
`ReasoningDelta`, `ToolCallDelta`, then `Finish` or `Failure`; `collect` gathers them into an `Answer`.

The truss process runs one asyncio thread: nothing here works per token. Tokens are decoded, stop
strings matched and reasoning / tool calls parsed in the stream workers (`trtllm_truss.parsers`);
an update of a request without parsers is one string, turned into one `TextDelta`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from trtllm_truss.api import structured
from trtllm_truss.api.errors import field_error, from_validation_error
from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.api.sampling import UINT64_MAX, resolve_max_tokens, to_generation_params
from trtllm_truss.api.tools import check_strict_tools, tool_guide
from trtllm_truss.guides import tool_syntax
from trtllm_truss.parsers import forced_syntax
from trtllm_truss.serving.availability import Availability
from trtllm_truss.serving.metrics import ServingMetrics
from trtllm_truss.serving.generation import Generation, GenerationFailed
from trtllm_truss.serving.replica_header import name_replicas
from trtllm_truss.serving.request import Answer, GenerationRequest, Guide
from trtllm_truss.streaming.pool import PoolBusy, PoolUnavailable, ResponseStream, StreamPool
from trtllm_truss.streaming.protocol import GenerationSpec

logger = logging.getLogger(__name__)

RequestModel = TypeVar("RequestModel", bound=BaseModel)
T = TypeVar("T")
DISCONNECT_POLL_S = 0.25
SERVED_MODEL_NAME = "model"
RETRY_AFTER_S = 1


class Refused(Exception):
    """A request answered with an error before any output (the dialect renders it).
    `counted`: its stream already reported the outcome to the metrics."""

    def __init__(
        self,
        status: int,
        message: str,
        headers: Mapping[str, str] | None = None,
        *,
        counted: bool = False,
        error: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.counted = counted
        self.error = error  # the error's `param` / `code` where the dialect's shape has them (model_not_found)


def parse_request(model: type[RequestModel], body: Any) -> RequestModel:
    if not isinstance(body, Mapping):
        raise HTTPException(
            status_code=422, detail=f"invalid request: body: expected a JSON object, got {type(body).__name__}"
        )
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


_METRICS: ServingMetrics | None = None


def serving_metrics() -> ServingMetrics:
    """The process's one set of request metrics on truss's `/metrics` (registered once)."""
    global _METRICS
    if _METRICS is None:
        _METRICS = ServingMetrics(model_name=SERVED_MODEL_NAME)
    return _METRICS


def use_serving_metrics(metrics: ServingMetrics) -> None:
    """Make `metrics` the process's request metrics (the direct front's, on shared memory); before any
    request, in place of the default set."""
    global _METRICS
    if _METRICS is not None:
        _METRICS.unregister()
    _METRICS = metrics


class _MetricsListener:
    """Reports each stream's start (first output) and outcome; the truss thread does this once per
    request, never per token (inter-token gaps come bucketed from the worker)."""

    def stream_started(self, stream: ResponseStream) -> None:
        serving_metrics().request_started()

    def stream_closed(self, stream: ResponseStream) -> None:
        end = stream.end
        if end is None:
            status = "abort"  # the client left (or the request was cancelled) before the end
        elif end.error is not None:
            status = str(end.status or 503)
        else:
            status = end.finish_reason or "stop"
        first = stream.first_text_at
        serving_metrics().request_finished(
            status,
            end.prompt_tokens if end else 0,
            end.completion_tokens if end else 0,
            None if first is None else first - stream.opened_at,
            end.itl if end is not None and end.itl is not None else (),
            e2e_s=time.monotonic() - stream.opened_at,
            was="running" if first is not None else "waiting",
            draft_tokens=end.draft_tokens if end is not None else 0,
            accepted_draft_tokens=end.accepted_draft_tokens if end is not None else 0,
            schema_valid=end.schema_valid if end is not None else None,
            cached_tokens=end.cached_tokens if end is not None else 0,
        )


_LISTENER = _MetricsListener()

ErrorRenderer = Callable[[int, str, "Mapping[str, str] | None"], Any]


async def answered(handling: Awaitable[Any], render_error: ErrorRenderer) -> Any:
    """The dialect's response, or `render_error(status, message, headers)` for a request refused
    before any output (returned, not raised: truss logs a traceback for every raised HTTPException)."""
    try:
        return await handling
    except Refused as exc:
        if not exc.counted:
            serving_metrics().request_finished(str(exc.status), was="none")
        if exc.error:
            return render_error(exc.status, exc.message, exc.headers, **exc.error)
        return render_error(exc.status, exc.message, exc.headers)
    except HTTPException as exc:
        serving_metrics().request_finished(str(exc.status_code), was="none")
        return render_error(exc.status_code, str(exc.detail), None)


async def unless_disconnected(work: Awaitable[T], http_request: Request | None, waiting_for: str) -> T:
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
                raise Refused(499, f"client disconnected while waiting for {waiting_for}")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def check_prompt_bytes(field: str, text: str, limits: RequestLimits) -> None:
    """The cheap bound, before any tokenization: a prompt longer in UTF-8 than `max_input_len`
    tokens of the longest token can cover cannot fit, whatever the tokenizer makes of it."""
    if len(text) * 4 <= limits.max_prompt_bytes:  # 4 bytes per character at most: no need to encode
        return
    size = len(text.encode("utf-8"))
    if size > limits.max_prompt_bytes:
        raise field_error(
            field,
            f"the prompt is {size} bytes, more than this deployment's max_input_len ({limits.max_input_len} "
            f"tokens) can hold (at most {limits.max_prompt_bytes} bytes)",
        )


class RequestCore:
    """Runs `GenerationRequest`s of every dialect on the stream pool. `pool` and `limits` are set
    once the deployment has loaded (until then requests get 503)."""

    def __init__(self) -> None:
        self._pool: StreamPool | None = None
        self._limits: RequestLimits | None = None
        self.guide_checker: structured.GuideChecker | None = None
        self.store: Any = None  # trtllm_truss.store.Store: what outlives a request (None: nothing is kept)
        self.background_off: str | None = None  # why background responses are refused (no route reads them back)
        # Refusals for an unavailable engine and requests served, which readiness follows (serving.availability).
        self.availability = Availability()

    def attach(self, pool: StreamPool, limits: RequestLimits, guide_checker: structured.GuideChecker | None = None) -> None:
        """`guide_checker`: the replica's guide compile service (None: guides are checked in process)."""
        self._pool, self._limits, self.guide_checker = pool, limits, guide_checker

    # Why requests get 503 while nothing is attached (a worker node of a multi-node world serves none).
    unavailable = "the model is still loading"

    @property
    def pool(self) -> StreamPool:
        if self._pool is None:
            raise HTTPException(status_code=503, detail=self.unavailable)
        return self._pool

    @property
    def limits(self) -> RequestLimits:
        if self._limits is None:
            raise HTTPException(status_code=503, detail=self.unavailable)
        return self._limits

    @property
    def tool_call_parser(self) -> str | None:
        info = self.pool.info
        return info.tool_call_parser if info is not None else None

    @property
    def reasoning_parser(self) -> str | None:
        info = self.pool.info
        return info.reasoning_parser if info is not None else None

    # --- request -> specs -------------------------------------------------------------------------

    async def prepare(self, req: GenerationRequest) -> GenerationSpec:
        """`spec(req)` with its output constraint compiled off the event loop (api.structured.check):
        a guide that cannot be enforced is a 400 naming its field before anything is queued."""
        spec = self.spec(req)
        params = spec.params
        if params.guided_decoding_guide_type is not None:
            # A tool_choice guide: the engine path is named by tool_choice, a schema it cannot take by tools.
            own = req.guide.field if req.guide is not None else None
            limits = self.limits
            if limits.guided_decoding_off is not None:
                raise field_error(own or req.tool_choice_field, f"cannot be enforced: {limits.guided_decoding_off}")
            if limits.guide_types is not None and params.guided_decoding_guide_type not in limits.guide_types:
                raise field_error(
                    own or req.tool_choice_field,
                    f"guide type {params.guided_decoding_guide_type!r} is not one this engine takes ({', '.join(limits.guide_types)})",
                )
            check_strict_tools(req.tools, req.strict_tools, limits.guide_engine, req.tools_field)
            tagged = await self._in_own_syntax(req, spec)
            if tagged is not None:
                return tagged
            strict = req.guide.strict if req.guide is not None else False
            guide = Guide(params.guided_decoding_guide_type, params.guided_decoding_guide, own or req.tools_field, strict)
            checked = await self._checked(guide)
            if checked is not None:
                # The engine gets the schema as it enforces it; the worker validates answers against the original.
                schema = params.guided_decoding_guide if params.guided_decoding_guide_type == "json_schema" else None
                spec = dataclasses.replace(
                    spec,
                    params=dataclasses.replace(params, guided_decoding_guide=checked.text),
                    output_schema=schema,
                    unenforced=checked.unenforced,
                )
        return spec

    async def _checked(self, guide: Guide) -> structured.CheckedGuide | None:
        """`structured.check` by the replica's compile service (or in process), its load refusals as 429 / 503."""
        try:
            return await structured.check(guide, engine=self.limits.guide_engine, checker=self.guide_checker)
        except structured.GuideBusy as exc:
            raise Refused(429, exc.message, {"Retry-After": str(exc.retry_after_s)}) from None
        except structured.GuideCheckerUnavailable as exc:
            raise Refused(503, str(exc), {"Retry-After": str(RETRY_AFTER_S)}) from None

    async def _in_own_syntax(self, req: GenerationRequest, spec: GenerationSpec) -> GenerationSpec | None:
        """A forced call's spec guided by xgrammar's structural tag in the model family's own syntax and
        parsed by the family's parser (its `ToolCallParser.forced`, guides.tool_syntax), where this deployment takes it; None where the
        JSON guide stays: the family has no such format, the engine path takes none, or the engine refuses
        this tag (a schema its format cannot write). With a reasoning parser, two tags: the one for a
        prompt that opened the thinking goes with the spec and the stream worker sends it when it does."""
        syntax = forced_syntax(self.tool_call_parser)
        if syntax is None or req.guide is not None or req.tool_choice in ("auto", "none") or self.limits.forced_syntax_off:
            return None
        modes = (tool_syntax.DISABLED,) if spec.reasoning_parser is None else (syntax.closed, tool_syntax.ENABLED)
        tags = []
        for mode in modes:
            text = tool_syntax.request_text(
                syntax, spec.tools or (), str(req.tool_choice), req.parallel_tool_calls, mode, self.limits.guided_whitespace
            )
            try:
                checked = await self._checked(Guide(tool_syntax.TOOL_SYNTAX, text, req.tools_field, False))
            except HTTPException as exc:
                logger.debug("forced call in the JSON guide: the %s tag is refused (%s)", syntax.xgrammar, exc.detail)
                return None
            if checked is None:
                return None
            tags.append(checked)
        thinking = (syntax.think_opener, tags[1].text) if len(tags) > 1 and tags[1].text != tags[0].text else None
        params = dataclasses.replace(
            spec.params, guided_decoding_guide_type=tool_syntax.STRUCTURAL_TAG, guided_decoding_guide=tags[0].text
        )
        return dataclasses.replace(
            spec, params=params, tool_parser=self.tool_call_parser, tool_parser_arg=None, thinking_guide=thinking,
            unenforced=tags[0].unenforced,
        )

    def spec(self, req: GenerationRequest) -> GenerationSpec:
        """The worker's spec of `req` (one choice), or an HTTPException naming the field."""
        limits = self.limits
        default = req.default_max_tokens if req.default_max_tokens is not None else limits.max_output_len
        max_tokens = resolve_max_tokens(req.max_tokens_field, req.max_tokens, default, limits)
        if req.prompt is not None:
            check_prompt_bytes(req.prompt_field, req.prompt, limits)
        elif req.messages is not None:
            check_prompt_bytes(req.prompt_field, "".join(_content_text(m) for m in req.messages), limits)
        params = to_generation_params(
            req.sampling,
            text_input="",
            max_tokens=max_tokens,
            limits=limits,
            stop_words=req.stop,
            bad_words=req.bad_words,
            beam_width=req.beam_width,
            default_top_p=req.default_top_p,
        )
        tools, parser, parser_arg, guide = None, None, None, req.guide
        if req.tools and req.tool_choice != "none":
            tools = tuple(dict(tool) for tool in req.tools)
            if req.tool_choice == "auto":
                parser = self.tool_call_parser
                if parser is None:
                    raise field_error(
                        req.tools_field,
                        "this deployment has no tool-call parser for its model (set model_metadata.trt_llm."
                        "runtime.tool_call_parser)",
                    )
            else:
                if guide is not None:
                    raise field_error(req.tool_choice_field, f"{req.tool_choice!r} cannot be combined with a response format")
                guide, parser, parser_arg = tool_guide(req.tools, req.tool_choice, req.parallel_tool_calls)
        if guide is not None:
            params = dataclasses.replace(
                params, guided_decoding_guide_type=guide.type, guided_decoding_guide=guide.guide
            )
        if req.logprobs:
            # The engine's own most likely tokens where it has them (our python engines); otherwise the
            # dialect lists the sampled token, allowed only as the one most likely under greedy decoding.
            top = req.top_logprobs if limits.top_logprobs_off is None else 0
            params = dataclasses.replace(params, return_log_probs=True, top_log_probs=top or None)
        task_id = lora_task_id(req.model, limits)
        if task_id is not None:
            params = dataclasses.replace(params, lora_task_id=task_id)
        messages = None if req.messages is None else tuple(_template_turn(m) for m in req.messages)
        reasoning = self.reasoning_parser if (messages is not None and req.parse_reasoning) else None
        return GenerationSpec(
            params=params,
            prompt=req.prompt,
            prompt_ids=req.prompt_ids,
            messages=messages,
            prompt_field=req.prompt_field,
            keep_stop_text=req.keep_stop_text,
            literal_special_tokens=req.literal_special_tokens,
            tools=tools,
            chat_template_kwargs=tuple(sorted(req.chat_template_kwargs.items())),
            reasoning_parser=reasoning,
            tool_parser=parser,
            tool_parser_arg=parser_arg,
        )

    def choice_specs(self, req: GenerationRequest, prompts: list[GenerationSpec]) -> list[GenerationSpec]:
        """`req.n` specs per prompt spec, prompt-major, each choice with its own seed: drawn at random
        when the request has none (so unseeded choices differ whatever the engine's default seed),
        else the request's seed + j for choice j (choice 0 is what n=1 gives)."""
        return choice_specs(req.n, req.sampling.seed, prompts)

    # --- running ----------------------------------------------------------------------------------

    async def open(self, spec: GenerationSpec, http_request: Request | None) -> Generation:
        """Hand one spec to a worker and wait for its first output before any HTTP status is sent:
        a refused request is then a clean 4xx/5xx rather than a broken stream; a client that leaves
        while waiting cancels the request."""
        sent = time.monotonic_ns()
        stream = self._submit_one(await self._submit(spec))
        try:
            while not await stream.wait_for_text(DISCONNECT_POLL_S):
                if http_request is not None and await http_request.is_disconnected():
                    raise Refused(499, "client disconnected while waiting for the first token")
            first = await _first_output(stream)
        except BaseException:
            stream.close()
            raise
        end = stream.end
        if first[0] is None and end is not None and end.error is not None:
            stream.close()
            self._refused(end, sent)
            raise Refused(end.status or 503, end.error, counted=True)
        self.availability.served()
        name_replicas(http_request, [stream])
        return _generation(stream, first, spec)

    def _refused(self, end: Any, sent_ns: int) -> None:
        if end.engine_down:
            self.availability.refused(sent_ns)

    async def _submit(self, spec: GenerationSpec) -> ResponseStream:
        try:
            return await self.pool.submit(spec)
        except PoolBusy as exc:
            raise Refused(429, f"too many requests in flight ({exc}); retry shortly", {"Retry-After": str(RETRY_AFTER_S)}) from None
        except PoolUnavailable:
            raise Refused(503, "the model is restarting; retry shortly", {"Retry-After": str(RETRY_AFTER_S)}) from None

    @staticmethod
    def _submit_one(stream: ResponseStream) -> ResponseStream:
        stream.listener = _LISTENER
        serving_metrics().request_queued()
        return stream

    async def open_all(self, specs: list[GenerationSpec], http_request: Request | None, *, field: str = "n") -> list[Generation]:
        """Every spec handed to a worker and its first output read, before any HTTP status is sent;
        all admitted or none (429), and any refused one refuses the request."""
        if len(specs) == 1:
            return [await self.open(specs[0], http_request)]
        pool = self.pool
        if len(specs) > pool.max_in_flight:
            raise field_error(
                field,
                f"{len(specs)} choices (n x prompts) are more than this deployment admits at once ({pool.max_in_flight})",
            )
        busy = Refused(
            429,
            f"too many requests in flight ({pool.open_streams} + {len(specs)} choices, the limit is {pool.max_in_flight}); retry shortly",
            {"Retry-After": str(RETRY_AFTER_S)},
        )
        if pool.open_streams + len(specs) > pool.max_in_flight:
            raise busy
        streams: list[ResponseStream] = []
        sent = time.monotonic_ns()
        try:
            for spec in specs:
                try:
                    streams.append(self._submit_one(await self._submit(spec)))
                except Refused as exc:
                    raise (busy if exc.status == 429 else exc) from None  # taken meanwhile by other arrivals
            firsts = await unless_disconnected(
                asyncio.gather(*(_first_output(stream) for stream in streams)), http_request, "the first token"
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
                self._refused(end, sent)
                raise Refused(end.status or 503, end.error, counted=True)
        self.availability.served()
        name_replicas(http_request, streams)
        return [_generation(stream, first, spec) for stream, first, spec in zip(streams, firsts, specs)]

    async def collect(self, generations: list[Generation], http_request: Request | None) -> list[Answer]:
        """Every generation read to its end; the first that fails ends the others (and the request:
        `Refused` with its status)."""
        readers = [asyncio.ensure_future(generation.collect()) for generation in generations]
        answers: list[Answer] = []
        try:
            answers = await unless_disconnected(asyncio.gather(*readers), http_request, "the answer")
        except GenerationFailed:
            pass  # its stream's end says why, below
        finally:
            for generation in generations:
                generation.close()  # cancels the engine requests still running
            for reader in readers:
                reader.cancel()
        for generation in generations:
            end = generation.stream.end
            if end is not None and end.error is not None:
                raise Refused(end.status or 503, end.error, counted=True)
        return answers


# The response header naming what of a request's JSON Schema the grammar engine does not enforce (sent
# without strict: left out of the guide, docs/api.md); its value "<place>: <keyword>; ..." (ASCII).
UNENFORCED_HEADER = "X-Guided-Decoding-Unenforced"
MAX_UNENFORCED_HEADER_CHARS = 2048


def with_unenforced_header(response: Any, spec: GenerationSpec) -> Any:
    """`response` (a Starlette response, or the dict truss renders as JSON) with `UNENFORCED_HEADER`
    when the request's schema had keywords the engine does not enforce."""
    if not spec.unenforced:
        return response
    value = json.dumps("; ".join(spec.unenforced), ensure_ascii=True)[1:-1]
    if len(value) > MAX_UNENFORCED_HEADER_CHARS:
        value = value[: MAX_UNENFORCED_HEADER_CHARS - 3] + "..."
    if isinstance(response, Response):
        response.headers[UNENFORCED_HEADER] = value
        return response
    return JSONResponse(content=response, headers={UNENFORCED_HEADER: value})


async def _first_output(stream: ResponseStream) -> tuple[list | None, list]:
    """The first parts and, taken in the same step, their log probs: what arrives later belongs to later
    chunks (taken after another await, the first chunk's log probs would cover tokens it has no text of)."""
    parts = await stream.next_parts()
    return parts, stream.take_log_probs()


def _generation(stream: ResponseStream, first: tuple[list | None, list], spec: GenerationSpec) -> Generation:
    """A generation of `spec`: its stream's updates are parts when the worker parses its output."""
    parsed = spec.tool_parser is not None or spec.reasoning_parser is not None
    parts, log_probs = first
    return Generation(stream, parts, parsed, bool(spec.params.return_log_probs), first_log_probs=log_probs)


def choice_specs(n: int, seed: int | None, prompts: list[GenerationSpec]) -> list[GenerationSpec]:
    specs = []
    for base in prompts:
        params = base.params
        for j in range(n):
            choice_seed = params.random_seed
            if n > 1:
                choice_seed = secrets.randbits(64) if seed is None else (seed + j) % (UINT64_MAX + 1)
            specs.append(dataclasses.replace(base, params=dataclasses.replace(params, random_seed=choice_seed)))
    return specs


def lora_task_id(model: str | None, limits: RequestLimits) -> int | None:
    """NVIDIA's lora_task_id of the adapter a request's `model` names; None for the base model (no
    model, "", SERVED_MODEL_NAME or runtime.served_model_name). With neither adapters nor a served
    model name any `model` is the one model served; else another name is a 404 in OpenAI's
    model_not_found shape (each dialect renders it)."""
    adapters = dict(limits.lora_task_ids)
    base = (None, "", SERVED_MODEL_NAME, limits.served_model_name or SERVED_MODEL_NAME)
    if model in base or not (adapters or limits.served_model_name):
        return None
    if model in adapters:
        return adapters[model]
    served = ", ".join(repr(name) for name in dict.fromkeys(base[2:]))
    lora = f" and the LoRA adapters {', '.join(repr(name) for name in adapters)}" if adapters else ""
    shown = repr(model) if len(model) <= 80 else repr(model[:77]) + "..."
    raise Refused(
        404,
        f"The model {shown} does not exist: this deployment serves the base model as {served}{lora}",
        error={"param": "model", "code": "model_not_found"},
    )


def _content_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _template_turn(message: Mapping[str, Any]) -> dict[str, Any]:
    """A chat turn as Hugging Face templates take it: tool-call arguments as objects (templates
    write `arguments | tojson`; the worker gives a template that takes only text the JSON text back:
    api.prompt.wants_text_arguments), not the JSON text OpenAI sends."""
    turn = dict(message)
    calls = turn.get("tool_calls")
    if calls:
        turn["tool_calls"] = [
            {**call, "function": {**call["function"], "arguments": _json_object(call["function"].get("arguments"))}}
            for call in calls
        ]
    return turn


def _json_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments  # checked by the dialect; a template may still take text
    return arguments
