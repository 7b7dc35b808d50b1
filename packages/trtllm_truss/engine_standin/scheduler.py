"""Continuous batching: one scheduler thread admits requests between decode steps.

A request submitted while others decode is prefilled alone (no padding), then its row joins the
running batch's KV cache before the next step; finished and cancelled rows leave it at once, freeing
their slot. A guided request first waits for its guide to compile (engine_standin/guidance.py, off
this thread) and joins the queue only then. At most `max_batch_size` sequences run; the rest wait in
FIFO order. A failing request, a failing callback or a failing step ends the requests concerned with
an error, never the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from trtllm_truss.engine_standin.guidance import (
    GuideCompiler,
    TokenMasker,
    matcher_error,
)
from trtllm_truss.engine_standin.kv_blocks import BlockPool, Lease
from trtllm_truss.engine_standin.kv_cache import BatchKVCache
from trtllm_truss.engine_standin.kv_events import KVEventBuffer
from trtllm_truss.engine_standin.model_runner import CausalLMRunner
from trtllm_truss.engine_standin.sampling import (
    SequenceSamplingState,
    select_next_tokens,
)
from trtllm_truss.engine_standin.types import (
    EngineLimits,
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    RequestRejected,
)
from trtllm_truss.engine_standin.words import ends_with_any
from trtllm_truss.guides.guide import GUIDE_TYPES

log = logging.getLogger(__name__)

OutputCallback = Callable[[GenerationOutput], None]


@dataclass
class _Sequence:
    """A request the scheduler owns: waiting in the queue, or a row of the running batch."""

    request: GenerationRequest
    on_output: OutputCallback
    state: SequenceSamplingState | None = None
    pad: int = 0  # masked columns on the left of this row in the batch cache
    finished: bool = False
    cycle_offset: int = 0  # synthetic engine: where this request starts in the token cycle
    matcher: object = None  # llguidance.LLMatcher of a guided request, fed every token it emits
    lease: Lease | None = None  # the KV blocks this request holds in the engine's block pool


class EngineBase:
    """Queue, admission, cancellation and output plumbing shared by the model and synthetic engines."""

    guides: GuideCompiler | None = None  # set by engines that enforce guided decoding

    def __init__(
        self,
        limits: EngineLimits,
        vocab_size: int,
        *,
        name: str = "engine-standin",
        adapters: Mapping[int, str] | None = None,
        max_loras: int | None = None,
        kv_pool: BlockPool | None = None,
    ) -> None:
        self.limits = limits
        # Paged KV blocks and prefix reuse (engine_standin/kv_blocks.py); without a pool nothing is reused.
        self.kv_pool = kv_pool or BlockPool(64, 1, reuse=False)
        # KV cache events in TensorRT-LLM's shape for consumers in this process: kv_events.drain(timeout_s).
        self.kv_events = self.kv_pool.events or KVEventBuffer(0, window_size=limits.max_input_len + limits.max_output_len)
        self.vocab_size = vocab_size
        # NVIDIA's lora_task_id -> LoRA adapter name; at most max_loras different adapters run in one step.
        self.adapters = dict(adapters or {})
        self.max_loras = max_loras
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._preparing: dict[str, _Sequence] = {}  # guided requests whose guide is compiling
        self._cancelled: set[str] = set()
        self._known: set[str] = set()  # ids waiting or running, to refuse duplicates
        self._wake = threading.Condition()
        self._stopping = False
        self.iterations = 0  # engine steps run (NVIDIA's "Iteration Counter")
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    # ----------------------------------------------------------------- public API
    def start(self) -> EngineBase:
        self._thread.start()
        return self

    def shutdown(self, timeout_s: float = 10.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def submit(self, request: GenerationRequest, on_output: OutputCallback) -> None:
        """Queue a request; raises `RequestRejected` (naming the option) if it cannot be served."""
        self.validate(request)
        with self._wake:
            if self._stopping:
                raise RequestRejected("the engine is shutting down")
            if request.request_id in self._known:
                raise RequestRejected(f"request id {request.request_id!r} is already in flight")
            self._known.add(request.request_id)
            seq = _Sequence(request, on_output)
            if request.guide is None:
                self._waiting.append(seq)
                self._wake.notify_all()
                return
            self._preparing[request.request_id] = seq
        assert self.guides is not None  # validate() refused the guide otherwise
        try:
            self.guides.prepare(request.guide, lambda matcher, error: self._guide_ready(seq, matcher, error))
        except RuntimeError as exc:  # the compile pool was shut down: the engine is stopping
            with self._wake:
                self._preparing.pop(request.request_id, None)
                self._known.discard(request.request_id)
            raise RequestRejected(f"the engine is shutting down ({exc})") from None

    def _guide_ready(self, seq: _Sequence, matcher, error: str | None) -> None:
        """From submit() (cache hit), a compile thread or the compile timeout: queue or refuse the request."""
        with self._wake:
            if self._preparing.pop(seq.request.request_id, None) is None:
                return  # cancelled or shut down meanwhile: already answered
            if error is None:
                seq.matcher = matcher
                self._waiting.append(seq)
                self._wake.notify_all()
                return
        guide_type = seq.request.guide.guide_type if seq.request.guide else "?"
        self._finish(seq, FinishReason.ERROR, f"guided_decoding_guide ({guide_type}): {error}")

    def cancel(self, request_id: str) -> None:
        """Ends the request at the next step boundary (output with finish_reason CANCELLED) and frees its slot."""
        with self._wake:
            if request_id in self._known:
                self._cancelled.add(request_id)
                self._wake.notify_all()

    @property
    def active_requests(self) -> int:
        """Requests accepted and not yet finished (running or waiting)."""
        with self._wake:
            return len(self._known)

    @property
    def running_requests(self) -> int:
        return len(self._running)

    @property
    def waiting_requests(self) -> int:
        return len(self._waiting) + len(self._preparing)

    def validate(self, request: GenerationRequest) -> None:
        limits = self.limits
        n = len(request.input_ids)
        if request.beam_width != 1:
            raise RequestRejected(f"beam_width={request.beam_width} is not supported by the PyTorch stand-in engine (only 1)")
        if n == 0:
            raise RequestRejected("input_ids: the prompt is empty")
        if n > limits.max_input_len:
            raise RequestRejected(f"input_lengths: {n} tokens exceed max_input_len={limits.max_input_len}")
        if request.max_new_tokens < 1:
            raise RequestRejected(f"request_output_len: must be at least 1, got {request.max_new_tokens}")
        if request.max_new_tokens > limits.max_output_len:
            raise RequestRejected(
                f"request_output_len: {request.max_new_tokens} exceeds max_output_len={limits.max_output_len}"
            )
        bad_ids = [t for t in request.input_ids if not 0 <= t < self.vocab_size]
        if bad_ids:
            raise RequestRejected(f"input_ids: token id {bad_ids[0]} is outside the vocabulary (0..{self.vocab_size - 1})")
        if request.embedding_bias is not None and len(request.embedding_bias) != self.vocab_size:
            raise RequestRejected(
                f"embedding_bias: {len(request.embedding_bias)} values, the vocabulary has {self.vocab_size}"
            )
        if request.lora_task_id is not None and request.lora_task_id not in self.adapters:
            # NVIDIA's message (PeftCacheManager::addRequestPeft) for a task id it holds no weights for.
            raise RequestRejected(
                f"LoRA task {request.lora_task_id} not found in cache. Please send LoRA weights with request"
            )
        sampling = request.sampling
        if sampling.top_k < 0:
            raise RequestRejected(f"runtime_top_k: must be >= 0, got {sampling.top_k}")
        if not 0.0 <= sampling.top_p <= 1.0:
            raise RequestRejected(f"runtime_top_p: must be within [0, 1], got {sampling.top_p}")
        if sampling.temperature < 0.0:
            raise RequestRejected(f"temperature: must be >= 0, got {sampling.temperature}")
        if sampling.repetition_penalty <= 0.0:
            raise RequestRejected(f"repetition_penalty: must be > 0, got {sampling.repetition_penalty}")
        if sampling.min_length < 0:
            raise RequestRejected(f"min_length: must be >= 0, got {sampling.min_length}")
        guide = request.guide
        if guide is not None:
            if self.guides is None:
                raise RequestRejected(
                    "guided_decoding_guide_type: the synthetic stand-in engine has no model to guide; serve the model"
                )
            if guide.guide_type not in GUIDE_TYPES:
                raise RequestRejected(
                    f"guided_decoding_guide_type: {guide.guide_type!r} is not one of {', '.join(GUIDE_TYPES)}"
                )
            if guide.guide_type != "json" and not guide.guide:
                raise RequestRejected(f"guided_decoding_guide: required for guide type {guide.guide_type!r}")

    def adapter_of(self, request: GenerationRequest) -> str | None:
        return None if request.lora_task_id is None else self.adapters[request.lora_task_id]

    def _adapter_slot_free(self, seq: _Sequence, admitted: list[_Sequence]) -> bool:
        """Whether `seq`'s adapter may join this step: within max_loras different adapters (the base
        model takes no slot). A request that must wait keeps its place at the head of the queue."""
        wanted = self.adapter_of(seq.request)
        if self.max_loras is None or wanted is None:
            return True
        in_use = {self.adapter_of(s.request) for s in self._running + admitted} - {None}
        return wanted in in_use or len(in_use) < self.max_loras

    # ------------------------------------------------------------ for subclasses
    def _start(self, seq: _Sequence) -> bool:
        """Prefill `seq` and emit its first token; True if it keeps running."""
        raise NotImplementedError

    def _step(self) -> None:
        """One decode step for every running sequence."""
        raise NotImplementedError

    def _remove_rows(self, keep: list[int]) -> None:
        """Keep only these rows of the running batch (indices into `self._running`)."""
        self._running = [self._running[i] for i in keep]

    def _reset_batch(self) -> None:
        """Drop all batch state after a failed step."""

    def _lease(self, seq: _Sequence, *, match: bool = True) -> Lease:
        """Hold the cached blocks that prefix `seq`'s prompt (none with `match` false) and record the
        request's block counts (NVIDIA's kv_cache_reused_blocks / kv_cache_alloc_total_blocks)."""
        request = seq.request
        seq.lease = self.kv_pool.acquire(request.input_ids, request.lora_task_id, match=match)
        request.kv_reused_blocks = seq.lease.reused_blocks
        request.kv_total_blocks = seq.lease.total_blocks
        return seq.lease

    # ---------------------------------------------------------------- plumbing
    def _emit(self, seq: _Sequence, output: GenerationOutput) -> None:
        if output.finished:
            seq.finished = True
            if seq.lease is not None:  # its blocks stay cached, now evictable
                self.kv_pool.release(seq.lease)
                seq.lease = None
            with self._wake:
                self._known.discard(seq.request.request_id)
                self._cancelled.discard(seq.request.request_id)
        try:
            seq.on_output(output)
        except Exception:  # a broken consumer ends its own request, not the engine
            log.exception("output callback failed for request %s; cancelling it", seq.request.request_id)
            if not seq.finished:
                self.cancel(seq.request.request_id)

    def _finish(self, seq: _Sequence, reason: FinishReason, error: str | None = None) -> None:
        generated = seq.state.generated if seq.state else 0
        self._emit(
            seq,
            GenerationOutput(seq.request.request_id, [], None, True, reason, error, generated),
        )

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._wake:
                while not self._stopping and not self._waiting and not self._running and not self._cancelled:
                    self._wake.wait()
                if self._stopping:
                    break
                cancelled = self._cancelled
                self._cancelled = set()
                admitted: list[_Sequence] = []
                while (
                    self._waiting
                    and len(self._running) + len(admitted) < self.limits.max_batch_size
                    and self._adapter_slot_free(self._waiting[0], admitted)
                ):
                    admitted.append(self._waiting.popleft())
                    admitted[-1].request.first_scheduled_ns = time.monotonic_ns()
                # Cancelled requests still waiting (or compiling their guide) never start.
                for seq in [s for s in self._waiting if s.request.request_id in cancelled]:
                    self._waiting.remove(seq)
                    admitted.append(seq)
                for request_id in cancelled & self._preparing.keys():
                    admitted.append(self._preparing.pop(request_id))
            try:
                self._apply_cancellations(cancelled)
                for seq in admitted:
                    if seq.request.request_id in cancelled:
                        self._finish(seq, FinishReason.CANCELLED)
                        continue
                    try:
                        if self._start(seq):
                            self._running.append(seq)
                    except Exception as exc:
                        log.exception("request %s failed to start", seq.request.request_id)
                        self._finish(seq, FinishReason.ERROR, f"engine stand-in failed to start the request: {exc}")
                if self._running:
                    self.iterations += 1
                    self._step()
            except Exception as exc:  # a failed step ends the running requests, the loop goes on
                log.exception("engine step failed; ending %d running requests", len(self._running))
                running, self._running = self._running, []
                self._reset_batch()
                for seq in running:
                    if not seq.finished:
                        self._finish(seq, FinishReason.ERROR, f"engine stand-in step failed: {exc}")
        with self._wake:
            preparing, self._preparing = list(self._preparing.values()), {}
        for seq in list(self._running) + list(self._waiting) + preparing:
            if not seq.finished:
                self._finish(seq, FinishReason.ERROR, "the engine was shut down")
        if self.guides is not None:
            self.guides.shutdown()

    def _apply_cancellations(self, cancelled: set[str]) -> None:
        if not cancelled:
            return
        keep = []
        for i, seq in enumerate(self._running):
            if seq.request.request_id in cancelled:
                self._finish(seq, FinishReason.CANCELLED)
            else:
                keep.append(i)
        if len(keep) != len(self._running):
            self._remove_rows(keep)

    def _after_token(self, seq: _Sequence, token: int, log_prob: float | None, logits=None, top=None) -> GenerationOutput:
        """Record a sampled token and decide whether the request is finished (TensorRT-LLM's rules).
        `logits`: this step's raw logits row [vocab] when the request returns generation logits."""
        request, state = seq.request, seq.state
        assert state is not None
        if request.end_id is not None and token == request.end_id:
            # The end token ends the request and is not returned.
            return GenerationOutput(request.request_id, [], None, True, FinishReason.END_ID, None, state.generated)
        if seq.matcher is not None and not seq.matcher.consume_token(token):
            # The token was allowed, so a step limit (LLParserLimits) failed the matcher while consuming it.
            error = f"guided decoding: {matcher_error(seq.matcher)}"
            return GenerationOutput(request.request_id, [], None, True, FinishReason.ERROR, error, state.generated)
        state.append(token)
        reason = None
        if request.stop_words and ends_with_any(state.tokens, request.stop_words):
            reason = FinishReason.STOP_WORDS
        elif state.generated >= request.max_new_tokens:
            reason = FinishReason.LENGTH
        elif seq.matcher is not None and seq.matcher.is_stopped():
            # The guide is complete: only the end token could follow, so the request ends as if it came
            # (one step sooner; max tokens reached at the same time is LENGTH, as NVIDIA's engine says).
            reason = FinishReason.END_ID
        log_probs = [log_prob] if log_prob is not None else None
        generation_logits = None
        if request.return_generation_logits and logits is not None:
            generation_logits = logits.reshape(1, -1).numpy().astype("float32", copy=True)
        return GenerationOutput(
            request.request_id, [token], log_probs, reason is not None, reason, None, state.generated,
            generation_logits=generation_logits, top_log_probs=[top] if top is not None else None,
        )


class StandinEngine(EngineBase):
    """Runs a Hugging Face causal LM with continuous batching (see module docstring)."""

    def __init__(
        self,
        runner: CausalLMRunner,
        limits: EngineLimits,
        *,
        name: str = "engine-standin",
        guides: GuideCompiler | None = None,
        adapters: Mapping[int, str] | None = None,
        max_loras: int | None = None,
        kv_pool: BlockPool | None = None,
    ) -> None:
        super().__init__(limits, runner.vocab_size, name=name, adapters=adapters, max_loras=max_loras, kv_pool=kv_pool)
        self.runner = runner
        self._cache = BatchKVCache()
        self.guides = guides or GuideCompiler(runner.model_dir)
        self._masker: TokenMasker | None = None

    def _constrain(self, running: list[_Sequence], errors: dict[int, str]):
        """The masking of this step's guided rows (None without any); rows that cannot go on land in `errors`."""
        rows = [(i, seq.matcher, seq.request.end_id) for i, seq in enumerate(running) if seq.matcher is not None]
        if not rows:
            return None
        if self._masker is None:  # a matcher exists, so the compiler's tokenizer is loaded
            self._masker = self.guides.masker()
        return lambda logits: errors.update(self._masker.apply(logits, rows))

    def _start(self, seq: _Sequence) -> bool:
        request = seq.request
        seq.state = SequenceSamplingState(request, list(request.input_ids), self.vocab_size)
        # Context logits cover every prompt position, so such a request computes its whole prompt.
        lease = self._lease(seq, match=not request.return_context_logits)
        logits, cache, context = self.runner.prefill(
            request.input_ids, all_logits=request.return_context_logits, adapter=self.adapter_of(request),
            prefix=lease.reused_payloads,
        )
        size = self.kv_pool.tokens_per_block
        self.kv_pool.store(lease, request.input_ids, lambda i: self.runner.block_kv(cache, i * size, (i + 1) * size))
        raw = logits.clone() if request.return_generation_logits else None
        errors: dict[int, str] = {}
        tokens, log_probs, tops = select_next_tokens(
            logits[None, :], [seq.state], request.return_log_probs, self._constrain([seq], errors),
            [request.top_log_probs if request.return_log_probs else 0],
        )
        if errors:
            self._finish(seq, FinishReason.ERROR, f"guided decoding: {errors[0]}")
            return False
        output = self._after_token(seq, tokens[0], log_probs[0] if log_probs else None, raw, tops[0] if tops else None)
        if context is not None:
            output.context_logits = context.numpy().astype("float32", copy=False)
        self._emit(seq, output)
        if output.finished:
            return False
        # Join the running batch: whichever side is shorter is padded on the left.
        mine, theirs = self._cache.length, cache.length
        self._cache.append_rows(cache)
        if theirs > mine:
            for other in self._running:
                other.pad += theirs - mine
            seq.pad = 0
        else:
            seq.pad = mine - theirs
        return True

    def _step(self) -> None:
        running = self._running
        states = [seq.state for seq in running]
        last = [s.tokens[-1] for s in states]
        positions = [len(s.tokens) - 1 for s in states]
        adapters = [self.adapter_of(seq.request) for seq in running] if self.adapters else None
        logits = self.runner.decode(self._cache, last, positions, [seq.pad for seq in running], adapters)
        want_log_probs = any(seq.request.return_log_probs for seq in running)
        # Raw rows kept before sampling transforms them, only for requests that return them.
        raw = {i: logits[i].clone() for i, seq in enumerate(running) if seq.request.return_generation_logits}
        errors: dict[int, str] = {}
        top_counts = [seq.request.top_log_probs if seq.request.return_log_probs else 0 for seq in running]
        tokens, log_probs, tops = select_next_tokens(logits, states, want_log_probs, self._constrain(running, errors), top_counts)
        keep = []
        for i, seq in enumerate(running):
            if i in errors:
                self._finish(seq, FinishReason.ERROR, f"guided decoding: {errors[i]}")
                continue
            output = self._after_token(
                seq, tokens[i], log_probs[i] if log_probs and seq.request.return_log_probs else None, raw.get(i),
                tops[i] if tops else None,
            )
            if output.finished and output.error is None:
                self._store_generated(i, seq)
            self._emit(seq, output)
            if not output.finished:
                keep.append(i)
        if len(keep) != len(running):
            self._remove_rows(keep)

    def _store_generated(self, row: int, seq: _Sequence) -> None:
        """A finished sequence's full blocks past its prompt (its answer) join the cache, as TensorRT-LLM stores
        a finished request's blocks: a next turn that repeats the answer reuses them."""
        if seq.lease is None or not self.kv_pool.reuse or seq.state is None:
            return
        covered = self._cache.length - seq.pad  # tokens whose KV is in the batch cache (not the last sampled)
        size = self.kv_pool.tokens_per_block
        tensors = self._cache.layer_tensors()

        def payload(index: int):
            start = seq.pad + index * size
            return [(k[row, :, start : start + size].clone(), v[row, :, start : start + size].clone()) for k, v in tensors]

        self.kv_pool.store(seq.lease, seq.state.tokens[:covered], payload)

    def _remove_rows(self, keep: list[int]) -> None:
        super()._remove_rows(keep)
        if not keep:
            self._cache = BatchKVCache()
            return
        # Columns that are padding in every remaining row are dropped with the finished rows.
        drop = min(seq.pad for seq in self._running)
        self._cache.keep_rows(keep, drop_leading=drop)
        for seq in self._running:
            seq.pad -= drop

    def _reset_batch(self) -> None:
        self._cache = BatchKVCache()
