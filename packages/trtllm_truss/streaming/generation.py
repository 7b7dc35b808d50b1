"""One request inside a stream worker: prompt -> token ids -> engine stream -> text, stop strings, usage.

Free of the transport: `WorkerModel.run(spec, emit)` calls `emit(text)` for each piece of text and
returns the request's `StreamEnd`, so it is tested without processes or sockets.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import HTTPException

from trtllm_truss.api.openai import LogProbEntry
from trtllm_truss.api.stops import StopSequenceTrimmer
from trtllm_truss.engine.client import EnsembleClient, UpstreamError
from trtllm_truss.engine.detokenize import StreamDetokenizer, TokenDecoder
from trtllm_truss.engine.engine_client import EngineClient
from trtllm_truss.planning.lora import worker_lora_weights  # noqa: F401 - what fronts.service.stream_pool passes here
from trtllm_truss.streaming.itl import ItlAccumulator
from trtllm_truss.engine.preprocess import word_list_tensor
from trtllm_truss.streaming.lora_tasks import LoraTasks, generate_with_lora
from trtllm_truss.streaming.protocol import GenerationSpec, StreamEnd, WorkerInfo
from trtllm_truss.streaming.schema_check import answer_valid

logger = logging.getLogger(__name__)

# emit(text, log_probs): text for the client (or, for a request with output parsers, a list of its
# parts: streaming.protocol), and [(text the token added, log prob, token bytes)] of the tokens
# behind it when the request asked for log probs (else None).
Emit = Callable[["str | list", "list[LogProbEntry] | None"], None]

# Tokens a tokenizer may add that cover no byte of the text (BOS/EOS, a sentencepiece dummy prefix).
TOKENS_A_TOKENIZER_ADDS = 4
WARM_UP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class WorkerSettings:
    """What a worker needs to serve requests (JSON-serialisable: it travels on the command line)."""

    grpc_url: str
    tokenizer_dir: str
    max_input_len: int
    max_output_len: int
    engine_model: str = "tensorrt_llm"
    # The text ensemble instead of the engine (runtime.detokenize_in: postprocessing): Triton's
    # postprocessing model decodes, the worker still matches stop strings and counts usage.
    text_ensemble: str | None = None
    trust_remote_code: bool = False  # runtime.trust_remote_code: the tokenizer's own code may run
    # The engine speculates (model_metadata.trt_llm.speculative on tensorrtllm): ask it for its draft totals.
    draft_stats: bool = False
    # The engine reuses prompt KV blocks of this many tokens (runtime.enable_kv_cache_reuse): ask it how many
    # blocks each request reused (kv_cache_reused_blocks) and report them as cached tokens. 0: not asked.
    kv_block_tokens: int = 0
    # runtime.tool_call_parser / reasoning_parser: "auto" is resolved here, from the chat template.
    tool_call_parser: str = "auto"
    reasoning_parser: str = "auto"
    # Backend tensorrtllm with build.lora_adapters: task id -> folder of NVIDIA's model.lora_*.npy, sent with
    # a task's first request (streaming/lora_tasks.py).
    lora_weights: dict[str, str] = dataclasses.field(default_factory=dict)


def _turn_text(turn: Any) -> str:
    """A chat turn's text, (role, text) or a dict (whose content is text, or None with tool calls)."""
    if isinstance(turn, tuple):
        return turn[1]
    content = turn.get("content")
    return content if isinstance(content, str) else ""


class RequestError(Exception):
    """The request cannot be served as sent: an HTTP 4xx whose message names the field."""

    def __init__(self, field: str, message: str, status: int = 400) -> None:
        super().__init__(f"invalid request: {field}: {message}")
        self.status = status


class LogProbRelease:
    """Log-prob entries handed out with the text their tokens added: an entry leaves once the stop
    matcher has released its text, so each update's entries and text agree, and tokens past a stop
    string that was cut off are not reported (the token the cut falls in is)."""

    def __init__(self) -> None:
        self._pending: collections.deque[LogProbEntry] = collections.deque()
        self._released = 0  # characters of text released so far
        self._covered = 0  # characters of text the released entries added

    def add(self, entries: list[LogProbEntry]) -> None:
        self._pending.extend(entries)

    def release(self, chars: int) -> list[LogProbEntry]:
        """The entries whose text lies within the text released so far, after `chars` more."""
        self._released += chars
        out = []
        pending = self._pending
        while pending and self._covered + len(pending[0][0]) <= self._released:
            entry = pending.popleft()
            self._covered += len(entry[0])
            out.append(entry)
        return out

    def rest(self, cut: bool) -> list[LogProbEntry]:
        """At the end: every entry left, or after a stop string cut the text, those whose text
        begins before the cut."""
        out = []
        pending = self._pending
        while pending and (not cut or self._covered < self._released):
            entry = pending.popleft()
            self._covered += len(entry[0])
            out.append(entry)
        pending.clear()
        return out


class WorkerModel:
    """What a worker loads once: the tokenizer (prompts, chat template, decoding) and the engine client."""

    def __init__(self, settings: WorkerSettings) -> None:
        from trtllm_truss.engine.tokenizer import load_tokenizer

        self.settings = settings
        self.tokenizer = load_tokenizer(Path(settings.tokenizer_dir), trust_remote_code=settings.trust_remote_code)
        self._chat: Any = None  # transformers' tokenizer, for chat templates: loaded at the first chat request (_load_chat)
        self._chat_loading: concurrent.futures.Future | None = None
        self.decoder = TokenDecoder(self.tokenizer, skip_special_tokens=True)
        # No token covers more bytes than the longest one in the vocabulary: a prompt longer than
        # max_input_len such tokens is over the limit without being tokenized.
        self.max_token_bytes = TokenDecoder(self.tokenizer, skip_special_tokens=False).max_token_bytes
        self.max_prompt_bytes = (settings.max_input_len + TOKENS_A_TOKENIZER_ADDS) * self.max_token_bytes
        from trtllm_truss import parsers
        from trtllm_truss.engine.tokenizer import read_added_tokens, read_chat_template

        family = parsers.detect(read_chat_template(settings.tokenizer_dir), read_added_tokens(settings.tokenizer_dir))
        self.tool_call_parser = parsers.resolve(settings.tool_call_parser, family.tool_parser)
        self.reasoning_parser = parsers.resolve(settings.reasoning_parser, family.reasoning_parser)
        # Decodes parsed answers: the parsers' markers that are special tokens stay in the text.
        keep = parsers.keep_tokens(self.tool_call_parser, self.reasoning_parser)
        self.marker_decoder = (
            TokenDecoder(self.tokenizer, skip_special_tokens=True, keep=frozenset(keep)) if keep else self.decoder
        )
        self.engine = EngineClient(settings.grpc_url, model_name=settings.engine_model)
        self.ensemble = EnsembleClient(settings.grpc_url, model_name=settings.text_ensemble) if settings.text_ensemble else None
        self.lora = LoraTasks(settings.lora_weights) if settings.lora_weights else None
        self.router: Any = None  # a fleet's streaming.fleet_router.FleetRouter: it picks the engine per request

    @property
    def chat(self) -> Any:
        if self._chat is None:
            self._chat = self._read_chat()
        return self._chat

    def _read_chat(self) -> Any:
        from trtllm_truss.api.prompt import PromptTokenizer

        return PromptTokenizer.load(Path(self.settings.tokenizer_dir), trust_remote_code=self.settings.trust_remote_code)

    async def _load_chat(self) -> None:
        """`chat` loaded on a thread: importing transformers takes seconds, and this event loop carries
        other streams meanwhile. Chat requests that arrive during the load wait for the same one."""
        loading = self._chat_loading
        if loading is None:
            executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chat-template")
            loading = self._chat_loading = executor.submit(self._read_chat)
            executor.shutdown(wait=False)  # its thread ends with the load
        try:
            chat = await asyncio.shield(asyncio.wrap_future(loading))
        except Exception:
            if self._chat_loading is loading:
                self._chat_loading = None  # the next chat request tries again, as the first did
            raise
        self._chat = chat

    async def warm_up(self) -> None:
        """Build now what the first request would otherwise build on the event loop while the requests
        of a burst wait: the tokenizer's literal copy and the engine's interface (the gRPC channel up, the
        model's config read). Best effort: a tritonserver not yet reachable leaves the interface to the
        first request."""
        self.tokenizer.encode("warm-up", add_special_tokens=False, literal_special_tokens=True)
        try:
            await asyncio.wait_for((self.ensemble or self.engine).interface(), WARM_UP_TIMEOUT_S)
        except (UpstreamError, asyncio.TimeoutError) as exc:
            logger.debug("engine interface not read at start (%s); the first request reads it", exc)

    def info(self) -> WorkerInfo:
        import os

        return WorkerInfo(
            pid=os.getpid(),
            vocab_size=self.tokenizer.vocab_size,
            max_token_bytes=self.max_token_bytes,
            tool_call_parser=self.tool_call_parser,
            reasoning_parser=self.reasoning_parser,
        )

    async def close(self) -> None:
        await self.engine.close()
        if self.ensemble is not None:
            await self.ensemble.close()

    # --- prompt -------------------------------------------------------------------------------

    def prompt_text(self, spec: GenerationSpec) -> str:
        """The prompt as text: what the byte bound measures, and what the text ensemble is sent."""
        if spec.prompt_ids is not None:
            if self.ensemble is not None:
                raise RequestError(
                    spec.prompt_field, "token-id prompts need the engine's ids (runtime.detokenize_in: worker, backend tensorrtllm)"
                )
            return ""
        if spec.messages is not None:
            if self.ensemble is not None:
                return self._chat_call(self.chat.render_chat, spec)
            return "".join(_turn_text(turn) for turn in spec.messages)
        return spec.prompt or ""

    def _chat_call(self, method: Callable, spec: GenerationSpec) -> Any:
        from trtllm_truss.parsers import template_turns

        messages = template_turns(self.tool_call_parser, spec.messages) if spec.messages else spec.messages
        try:
            return method(messages, spec.prompt_field, tools=spec.tools, template_kwargs=dict(spec.chat_template_kwargs))
        except HTTPException as exc:  # field_error: its detail already names the field
            raise RequestError(spec.prompt_field, str(exc.detail).split(f"{spec.prompt_field}: ", 1)[-1]) from None

    def prompt_ids(self, spec: GenerationSpec, text: str) -> list[int]:
        """Chat turns: exactly the ids of the model's template and tokenizer (one BOS; control-token
        text in a message stays text). A raw prompt: BOS added as preprocessing adds it, special-token
        text plain text unless the request asked otherwise (`literal_special_tokens`)."""
        limit = self.settings.max_input_len
        if spec.prompt_ids is not None:
            ids = list(spec.prompt_ids)
            vocab = self.tokenizer.vocab_size
            for j, token in enumerate(ids):
                if token >= vocab:
                    raise RequestError(f"{spec.prompt_field}[{j}]", f"{token} is not a token id (vocabulary size {vocab})")
        elif len(text) > self.max_prompt_bytes or len(text.encode("utf-8")) > self.max_prompt_bytes:
            raise RequestError(
                spec.prompt_field,
                f"the prompt is over {limit} tokens, this deployment's max_input_len (refused by its length"
                f" of {len(text)} characters without tokenizing it)",
            )
        elif spec.messages is not None:
            ids = self._chat_call(self.chat.chat_ids, spec)
        else:
            ids = self.tokenizer.encode(
                text, add_special_tokens=True, literal_special_tokens=spec.literal_special_tokens
            )
        if len(ids) > limit:
            raise RequestError(
                spec.prompt_field, f"the prompt is {len(ids)} tokens, above this deployment's max_input_len ({limit})"
            )
        if not ids:
            raise RequestError(spec.prompt_field, "the prompt is empty")
        return ids

    # --- one request ----------------------------------------------------------------------------

    async def run(self, spec: GenerationSpec, emit: Emit, on_replica: Callable[[str], None] | None = None) -> StreamEnd:
        """`on_replica`: told the name of the fleet's replica that takes the request (a fleet's front only)."""
        prompt_tokens = 0
        try:
            if spec.messages is not None and self._chat is None:
                await self._load_chat()
            text = self.prompt_text(spec)
            ids = self.prompt_ids(spec, text)
            prompt_tokens = len(ids)
            if spec.count_only:
                return StreamEnd(prompt_tokens=prompt_tokens)
            return await self._stream(spec, text, ids, emit, on_replica)
        except RequestError as exc:
            return StreamEnd(error=str(exc), status=exc.status, prompt_tokens=prompt_tokens)
        except UpstreamError as exc:
            return StreamEnd(error=str(exc), status=exc.status, prompt_tokens=prompt_tokens, engine_down=exc.status == 503)

    async def _stream(self, spec: GenerationSpec, text: str, ids: list[int], emit: Emit,
                      on_replica: Callable[[str], None] | None = None) -> StreamEnd:
        params = spec.params
        tokenizer = self.tokenizer
        if params.end_id is None:  # what NVIDIA's preprocessing sends when the client does not say
            params = dataclasses.replace(params, end_id=tokenizer.eos_id, pad_id=params.pad_id or tokenizer.pad_id)
        elif params.pad_id is None and tokenizer.pad_id is not None:
            params = dataclasses.replace(params, pad_id=tokenizer.pad_id)
        stops = StopSequenceTrimmer(params.stop_words, keep_stop=spec.keep_stop_text)
        last_text_at = 0.0
        gaps = ItlAccumulator()
        completion = 0
        draft_totals = [0, 0]  # the engine's running totals: draft tokens, accepted draft tokens
        kv_reused = [0]  # prompt KV blocks the engine found in its cache
        if params.return_log_probs and self.ensemble is not None:
            raise RequestError("logprobs", "not available with runtime.detokenize_in: postprocessing (no token ids)")
        parser = None
        if spec.reasoning_parser is not None or spec.tool_parser is not None:
            from trtllm_truss.parsers import OutputParser

            # The prompt's last tokens tell whether the template opened a reasoning block (16: the opener may be
            # several tokens, as Kimi K3's `<|open|>think<|sep|>`; special tokens kept, whatever the parsers keep).
            tail = self.tokenizer.decode(ids[-16:], skip_special_tokens=False) if spec.reasoning_parser is not None else ""
            parser = OutputParser.create(spec.reasoning_parser, spec.tool_parser, spec.tool_parser_arg, tail, spec.tools)
            if spec.thinking_guide is not None and tail.rstrip().endswith(spec.thinking_guide[0]):
                params = dataclasses.replace(params, guided_decoding_guide=spec.thinking_guide[1])
        pieces = self._pieces(
            params, text, ids, draft_totals if self.settings.draft_stats else None, parsed=parser is not None,
            kv_reused=kv_reused if self.settings.kv_block_tokens else None, on_replica=on_replica,
        )
        release = LogProbRelease() if params.return_log_probs else None
        generated: list[str] = []  # the answer's text, validated against spec.output_schema at the end
        async with aclosing(pieces):
            async for piece, tokens, log_probs in pieces:
                completion += tokens
                if spec.output_schema is not None:
                    generated.append(piece)
                out = stops.feed(piece)
                entries = None
                if release is not None:
                    release.add(log_probs or [])
                    entries = release.release(len(out))
                if out or entries:
                    if out:
                        now = time.monotonic()
                        if last_text_at:
                            gaps.add(now - last_text_at)
                        last_text_at = now
                    if parser is None:
                        emit(out, entries or None)
                    elif (parts := parser.feed(out) if out else []) or entries:
                        emit(parts, entries or None)
                if stops.stopped:
                    break  # closing the stream cancels the engine request: nothing more is generated
        tail = stops.flush()
        rest = None
        if release is not None:
            rest = release.release(len(tail)) + release.rest(cut=stops.stopped)
        reason = "stop" if stops.stopped or completion < params.max_tokens else "length"
        if parser is not None:
            # Cut by the limit: a call the limit cut keeps the arguments generated so far (parsers/section.py).
            parts = (parser.feed(tail) if tail else []) + parser.finish(cut=reason == "length")
            if parts or rest:
                emit(parts, rest or None)
        elif tail or rest:
            emit(tail, rest or None)
        if reason == "stop" and parser is not None and parser.tool_calls:
            reason = "tool_calls"
        schema_valid = None
        if spec.output_schema is not None and completion < params.max_tokens and not stops.stopped:
            schema_valid = answer_valid(spec.output_schema, "".join(generated))
        return StreamEnd(
            finish_reason=reason, prompt_tokens=len(ids), completion_tokens=completion, itl=gaps.summary(),
            draft_tokens=draft_totals[0], accepted_draft_tokens=draft_totals[1],
            stop_sequence=stops.stopped_by, schema_valid=schema_valid,
            cached_tokens=min(kv_reused[0] * self.settings.kv_block_tokens, len(ids)),
        )

    async def _pieces(
        self, params, text: str, ids: list[int], draft_totals: list[int] | None = None, *, parsed: bool = False,
        kv_reused: list[int] | None = None, on_replica: Callable[[str], None] | None = None,
    ) -> AsyncIterator[tuple[str, int, list | None]]:
        """(text, tokens, [(token text, log prob)] or None) per engine response."""
        engine_params = dataclasses.replace(params, stop_words=(), bad_words=(), exclude_input_in_output=True)
        if self.ensemble is not None:
            async with aclosing(self.ensemble.generate(dataclasses.replace(engine_params, text_input=text, stream=True))) as deltas:
                async for delta in deltas:
                    yield delta.text, delta.token_count or 0, None
            return
        bad_words = word_list_tensor(self.tokenizer, list(params.bad_words)) if params.bad_words else None
        decoder = self.marker_decoder if parsed else self.decoder
        detokenizer = StreamDetokenizer(decoder, continues_prompt=True)

        def on_draft_stats(draft: int, accepted: int) -> None:
            draft_totals[:] = (draft, accepted)  # running totals: the last response's are the request's

        def on_kv_reuse(blocks: int) -> None:
            kv_reused[0] = max(blocks, 0)

        extra: dict = {} if draft_totals is None else {"on_draft_stats": on_draft_stats}
        if kv_reused is not None:
            extra["on_kv_reuse"] = on_kv_reuse

        def generate_on(engine: Any) -> AsyncIterator:
            return generate_with_lora(
                engine.generate_ids, self.lora, params.lora_task_id, ids, engine_params, bad_words=bad_words, **extra
            )

        # A fleet: the replica Dynamo's router picks (streaming/fleet_router.py).
        generate = (generate_on(self.engine) if self.router is None
                    else self.router.stream(ids, generate_on, on_replica=on_replica))
        async with aclosing(generate) as responses:
            async for new_ids, log_probs in responses:
                if log_probs is None:
                    yield detokenizer.feed(new_ids), len(new_ids), None
                    continue
                # Token by token, so each entry's text is what its token added to the answer (""
                # for the first bytes of a character spread over tokens): the texts concatenate to
                # the answer, and `bytes` keeps each token's own.
                texts, entries = [], []
                values, tops = log_probs.values, log_probs.top
                missing = len(new_ids) - len(values)  # 0 unless the engine sent too few
                for k, token in enumerate(new_ids):
                    added = detokenizer.feed([token])
                    texts.append(added)
                    if k >= missing:
                        raw = decoder.token_bytes([token])
                        top = tops[k - missing] if tops is not None and k - missing < len(tops) else ()
                        likely = tuple((added, v, raw) if t == token else _alternative(decoder, t, v) for t, v in top)
                        entries.append((added, values[k - missing], raw, likely))
                yield "".join(texts), len(new_ids), entries


def _alternative(decoder, token: int, log_prob: float) -> tuple[str, float, bytes]:
    """One of a position's most likely tokens, not the sampled one (listed with the text it added), as
    OpenAI lists it: the token's own text (its bytes read as UTF-8, a partial character replaced), log
    prob and bytes."""
    raw = decoder.token_bytes([token])
    return raw.decode("utf-8", errors="replace"), log_prob, raw
