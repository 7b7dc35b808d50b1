"""LLM-API double: what our llmapi Triton model uses of `tensorrt_llm` (1.x), run by the stand-in engine.

It exists only because TensorRT-LLM cannot run on a machine without NVIDIA GPUs (this one, CI): there,
`runtime.backend: llmapi` renders our model (triton_models/tensorrt_llm_llmapi/model.py) with parameter
`llm_api: double`, and the model imports these names instead of `tensorrt_llm`'s. The engine behind them
is the tensor stand-in's own (`engine_standin.build_engine`: the same scheduler, guide masks from the grammar
engine `guided_decoding_backend` names, and peft adapters), run where TensorRT-LLM runs its executor: in a worker
process behind ZMQ IPC, its responses handed to each result by a dispatch thread once per engine iteration
(engine_standin/llmapi_executor.py says which TensorRT-LLM 1.2.1 process and queue each part stands for).

What it mirrors, with NVIDIA's names (recorded per version in tests/data/trtllm_flags/<version>/llmapi_*.json):
- `LLM(**model.yaml)`: the LLM() keyword arguments; those the stand-in cannot apply (KV cache, parallelism,
  speculation, ...) are accepted and listed in the startup log, an unknown one is a TypeError as in
  TorchLlmArgs (pydantic, extra="forbid").
- `LLM.generate_async(inputs=, sampling_params=, lora_request=, streaming=)` -> a result to iterate
  (streaming: after each engine response; otherwise once, finished), with `abort()` and `outputs`, a list
  of `CompletionOutput(index, token_ids, logprobs, finish_reason)`: token_ids accumulate, as NVIDIA's do.
- `SamplingParams`, `GuidedDecodingParams`, `LoRARequest`: keyword-only dataclasses with a subset of the
  real fields (a name the real class lacks cannot be given here either).
- `stream_interval`: a streamed request answers at its first token, every `stream_interval` steps and at
  the end (engine_standin/stream_interval.py, as TensorRT-LLM's PyExecutor).
- LoRA: the adapters of `lora_config.lora_dir` are loaded with peft at startup, each named as TensorRT-LLM keys
  its adapters (by `lora_int_id`: `lora_<id>`, whatever its folder is called); a `LoRARequest`'s `lora_path`
  picks one of them (TensorRT-LLM loads an adapter on first use instead).
- KV cache reuse (engine_standin/llmapi_kv.py): `kv_cache_config` sizes the engine's block pool,
  `SamplingParams(return_perf_metrics=True)` fills `CompletionOutput.request_perf_metrics`, and
  `get_kv_cache_events(timeout)` / `get_kv_cache_events_async(timeout)` return the engine's KV cache events.
- Its own settings (keyword arguments of `LLM` beside model.yaml's, from the llmapi model's parameters):
  the guide whitespace and the synthetic engine (runtime.pytorch.synthetic, to bench the llmapi path:
  `trtllm-truss bench --compare-backends pytorch,llmapi`, docs/performance.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from trtllm_truss.engine_standin.llmapi_executor import DEFAULT_GC_GEN0_THRESHOLD, ExecutorProxy, Response
from trtllm_truss.engine_standin.llmapi_kv import RequestPerfMetrics, kv_pool_parameters, request_perf_metrics
from trtllm_truss.engine_standin.settings import StandinSettings, checkpoint_eos_token_id
from trtllm_truss.engine_standin.types import (
    FinishReason,
    GenerationRequest,
    Guide,
)
from trtllm_truss.engine_standin.types import SamplingParams as EngineSampling

log = logging.getLogger("tensorrt_llm_llmapi")

# LLM() arguments the double applies; every other name our model.yaml may carry is accepted and not applied.
_APPLIED_LLM_ARGS = frozenset(
    {
        "model", "tokenizer", "max_batch_size", "max_input_len", "max_seq_len", "stream_interval", "lora_config",
        "guided_decoding_backend", "garbage_collection_gen0_threshold", "kv_cache_config",
    }
)
_ACCEPTED_LLM_ARGS = _APPLIED_LLM_ARGS | frozenset(
    {
        "backend", "dtype", "tensor_parallel_size", "pipeline_parallel_size", "moe_expert_parallel_size",
        "max_beam_width", "max_num_tokens", "enable_chunked_prefill", "scheduler_config",
        "speculative_config", "enable_lora", "skip_tokenizer_init",
    }
)
_FINISH = {
    FinishReason.END_ID: "stop",
    FinishReason.STOP_WORDS: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "cancelled",
}


class RequestError(RuntimeError):
    """NVIDIA's tensorrt_llm.executor.utils.RequestError: the request failed (raised while iterating)."""


@dataclass(kw_only=True)
class GuidedDecodingParams:
    json: str | dict | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None

    def guide(self) -> Guide | None:
        """The stand-in's guide (NVIDIA's guide types, as SamplingParams._get_guided_decoding_params maps them)."""
        if self.json_object:
            return Guide("json")
        if self.json is not None:
            return Guide("json_schema", self.json if isinstance(self.json, str) else json.dumps(self.json))
        if self.regex is not None:
            return Guide("regex", self.regex)
        if self.grammar is not None:
            return Guide("ebnf_grammar", self.grammar)
        if self.structural_tag is not None:
            return Guide("structural_tag", self.structural_tag)
        return None


@dataclass(kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad: str | list[str] | None = None
    bad_token_ids: list[int] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    embedding_bias: Any = None
    n: int = 1
    best_of: int | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: int | None = None
    guided_decoding: GuidedDecodingParams | None = None
    detokenize: bool = True
    return_perf_metrics: bool = False

    def __post_init__(self) -> None:
        self.best_of = self.best_of or self.n
        if self.best_of < self.n:  # NVIDIA's SamplingParams._validate
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if self.lora_path and not Path(self.lora_path).exists():  # as NVIDIA's LoRARequest
            raise ValueError(f"lora_path ({self.lora_path}) does not exist.")


class Logprob(NamedTuple):
    logprob: float
    rank: int | None = None


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    request_perf_metrics: RequestPerfMetrics | None = None  # with SamplingParams(return_perf_metrics=True)


def _token_logprobs(token: int, log_prob: float, top: tuple[list[int], list[float]] | None) -> dict[int, Logprob]:
    """One position of CompletionOutput.logprobs as TensorRT-LLM 1.x fills it with SamplingParams(logprobs=k):
    the k most likely tokens by rank, and the sampled token besides them when it is not one of them."""
    entries = {t: Logprob(v, rank) for rank, (t, v) in enumerate(zip(*top), start=1)} if top else {}
    if token not in entries:
        entries[token] = Logprob(log_prob, None if top else 1)
    return entries


class GenerationResult:
    """One generate_async request: iterate it (streaming: after each engine response; otherwise once, at
    the end), or `await aresult()`. The executor's dispatch thread hands its outputs to the event loop that
    called generate_async, once per message of the worker (an engine iteration)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, n: int, streaming: bool, executor: ExecutorProxy, perf: bool = False
    ) -> None:
        self.outputs = [CompletionOutput(index) for index in range(n)]
        self._perf = perf
        self.streaming = streaming
        self.finished = False
        self._loop = loop
        self._executor = executor
        self._engine_ids: list[str] = []
        self._open = n
        self._error: str | None = None
        self._updates: asyncio.Queue[bool] = asyncio.Queue()

    def abort(self) -> None:
        for engine_id in self._engine_ids:
            self._executor.cancel(engine_id)

    def _on_output(self, index: int, response: Response) -> None:  # on the event loop
        _, token_ids, log_probs, top_log_probs, finish, error, *kv_blocks = response
        kv = kv_blocks[0] if kv_blocks else None
        completion = self.outputs[index]
        if kv is not None and self._perf:
            completion.request_perf_metrics = request_perf_metrics(*kv)
        completion.token_ids.extend(token_ids)
        if log_probs is not None:
            tops = top_log_probs or [None] * len(token_ids)
            completion.logprobs.extend(_token_logprobs(t, p, top) for t, p, top in zip(token_ids, log_probs, tops))
        if finish is not None:
            if finish == FinishReason.ERROR.value:
                self._error = self._error or error or "the request failed"
            completion.finish_reason = _FINISH.get(finish, "stop")
            self._open -= 1
            self.finished = self._open == 0
        if self.streaming or self.finished:
            self._updates.put_nowait(self.finished)

    def __aiter__(self) -> GenerationResult:
        return self

    async def __anext__(self) -> GenerationResult:
        if self.finished and self._updates.empty():
            raise StopAsyncIteration
        await self._updates.get()
        if self._error is not None:
            raise RequestError(self._error)
        return self

    async def aresult(self) -> GenerationResult:
        async for _ in self:
            pass
        return self


class LLM:
    """Stands in for `tensorrt_llm.LLM` (see the module docstring for what it applies)."""

    def __init__(
        self,
        *,
        double_guided_whitespace: str = "compact",
        double_synthetic_step_time_ms: float | None = None,
        double_synthetic_prefill_time_per_token_ms: float | None = None,
        **kwargs: Any,
    ) -> None:
        """`kwargs`: model.yaml's LLM() arguments; `double_guided_whitespace`, `double_synthetic_step_time_ms`:
        the double's own settings (runtime.pytorch.guided_whitespace and .synthetic, the llmapi model's
        `guided_whitespace` and `synthetic_step_time_ms` parameters; a step time: the synthetic engine)."""
        unknown = sorted(set(kwargs) - _ACCEPTED_LLM_ARGS)
        if unknown:
            raise TypeError(f"LLM-API double: unexpected LLM() arguments {unknown}")
        if kwargs.get("guided_decoding_backend") not in (None, "xgrammar", "llguidance"):  # TorchLlmArgs' Literal
            raise ValueError(f"guided_decoding_backend: {kwargs['guided_decoding_backend']!r} is not xgrammar or llguidance")
        model = str(kwargs["model"])
        max_seq_len = int(kwargs.get("max_seq_len") or 2048)
        self.max_input_len = int(kwargs.get("max_input_len") or max_seq_len)
        self.max_seq_len = max_seq_len
        self.stream_interval = int(kwargs.get("stream_interval") or 1)
        lora_dirs = [str(Path(d).resolve()) for d in (kwargs.get("lora_config") or {}).get("lora_dir", [])]
        # TensorRT-LLM keys an adapter by its LoRARequest (lora_int_id), never by its folder's name: the
        # stand-in engine's peft adapter of task t is `lora_<t>`, t its position in lora_dir (our lora_int_id).
        self._adapter_task = {directory: task for task, directory in enumerate(lora_dirs, start=1)}
        parameters = {
            "model_dir": model,
            "tokenizer_dir": str(kwargs.get("tokenizer") or model),
            "max_batch_size": str(kwargs.get("max_batch_size") or 8),
            "max_input_len": str(self.max_input_len),
            "max_output_len": str(max_seq_len),  # the double checks prompt + max_tokens <= max_seq_len itself
            "lora_adapters": json.dumps({str(t): {"name": f"lora_{t}", "dir": d} for d, t in self._adapter_task.items()}),
            # llm_args.py: Optional[Literal["xgrammar", "llguidance"]], None (the default) = no guided decoding.
            "guided_decoding_backend": kwargs.get("guided_decoding_backend") or "none",
            "guided_whitespace": double_guided_whitespace,
        }
        parameters.update(kv_pool_parameters(kwargs.get("kv_cache_config")))
        if double_synthetic_step_time_ms is not None:  # the stand-in's synthetic engine, at this step time
            parameters["synthetic_step_time_ms"] = str(double_synthetic_step_time_ms)
            if double_synthetic_prefill_time_per_token_ms:
                parameters["synthetic_prefill_time_per_token_ms"] = str(double_synthetic_prefill_time_per_token_ms)
        if not lora_dirs:
            del parameters["lora_adapters"]
        max_loras = (kwargs.get("lora_config") or {}).get("max_loras")
        if max_loras:
            parameters["lora_max_loras"] = str(max_loras)
        self.settings = StandinSettings.from_parameters(parameters)
        self.eos_token_id = checkpoint_eos_token_id(model)  # the tokenizer's end token, as TensorRT-LLM's default
        self.not_applied = sorted(set(kwargs) - _APPLIED_LLM_ARGS)
        self._tokenizer = None
        # engine request id -> (its result, sequence index); touched by the caller's loop and the dispatch thread.
        self._pending: dict[str, tuple[GenerationResult, int]] = {}
        self._pending_lock = threading.Lock()
        gen0 = kwargs.get("garbage_collection_gen0_threshold")
        self.executor = ExecutorProxy(
            parameters, self.stream_interval, self._dispatch,
            gc_gen0_threshold=DEFAULT_GC_GEN0_THRESHOLD if gen0 is None else int(gen0),
        )

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.settings.tokenizer_dir))
        return self._tokenizer

    def _words(self, strings: str | list[str] | None, ids: list[int] | None) -> list[list[int]]:
        """Token-id sequences of single ids and strings (encoded as SamplingParams._setup does)."""
        words = [[int(i)] for i in ids or ()]
        for text in [strings] if isinstance(strings, str) else strings or ():
            words.append(self.tokenizer.encode(text, add_special_tokens=False))
        return words

    def generate_async(
        self,
        *,
        inputs: list[int],
        sampling_params: SamplingParams,
        lora_request: LoRARequest | None = None,
        streaming: bool = False,
    ) -> GenerationResult:
        """Queue `inputs` (token ids) with the executor: n generations, sequence i seeded seed + i."""
        if self.executor.error is not None:  # as TensorRT-LLM's proxy once its worker is gone
            raise RequestError(f"the executor is gone: {self.executor.error}")
        params = sampling_params
        prompt = [int(t) for t in inputs]
        if len(prompt) + params.max_tokens > self.max_seq_len:
            raise ValueError(
                f"The sum of prompt length ({len(prompt)}) and max_tokens ({params.max_tokens}) should not exceed"
                f" max_seq_len ({self.max_seq_len})"
            )
        task = None
        if lora_request is not None:
            task = self._adapter_task.get(str(Path(lora_request.lora_path).resolve()))
            if task is None:
                raise ValueError(
                    f"LLM-API double: lora_path {lora_request.lora_path} is not among lora_config.lora_dir, the"
                    " adapters it loaded at startup"
                )
        end_id = params.end_id if params.end_id is not None else self.eos_token_id
        seed = secrets.randbits(63) if params.seed is None else int(params.seed)
        bias = params.embedding_bias
        guide = params.guided_decoding.guide() if params.guided_decoding is not None else None
        result = GenerationResult(asyncio.get_running_loop(), params.n, streaming, self.executor, params.return_perf_metrics)
        requests = []
        for index in range(params.n):
            requests.append(
                GenerationRequest(
                    request_id=uuid.uuid4().hex,
                    input_ids=prompt,
                    max_new_tokens=params.max_tokens,
                    end_id=end_id,
                    pad_id=params.pad_id,
                    sampling=EngineSampling(
                        temperature=1.0 if params.temperature is None else params.temperature,
                        top_k=params.top_k or 0,
                        top_p=params.top_p or 0.0,
                        repetition_penalty=1.0 if params.repetition_penalty is None else params.repetition_penalty,
                        presence_penalty=params.presence_penalty or 0.0,
                        frequency_penalty=params.frequency_penalty or 0.0,
                        min_length=params.min_tokens or 0,
                        random_seed=(seed + index) & 0xFFFF_FFFF_FFFF_FFFF,
                    ),
                    stop_words=self._words(params.stop, params.stop_token_ids),
                    bad_words=self._words(params.bad, params.bad_token_ids),
                    return_log_probs=bool(params.logprobs),
                    top_log_probs=params.logprobs or 0,
                    embedding_bias=None if bias is None else [float(v) for v in bias.reshape(-1).tolist()],
                    guide=guide,
                    lora_task_id=task,
                )
            )
        with self._pending_lock:
            for index, request in enumerate(requests):
                result._engine_ids.append(request.request_id)
                self._pending[request.request_id] = (result, index)
        self.executor.submit([(request, streaming) for request in requests])
        return result

    def _dispatch(self, outputs: list[Response] | None) -> None:
        """Dispatch thread: one message of the worker (an iteration's outputs, in engine order) to the loops
        of their results, one wake-up per loop; None: the worker died, every pending result fails."""
        with self._pending_lock:
            if outputs is None:
                error = f"the executor is gone: {self.executor.error}"
                outputs = [(rid, [], None, None, FinishReason.ERROR.value, error, None) for rid in self._pending]
            routed: dict[asyncio.AbstractEventLoop, list] = {}
            for output in outputs:
                entry = self._pending.pop(output[0], None) if output[4] is not None else self._pending.get(output[0])
                if entry is not None:
                    routed.setdefault(entry[0]._loop, []).append((entry, output))
        for loop, batch in routed.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # that loop is closed: its caller is gone
                pass

    def get_kv_cache_events(self, timeout: float | None = 2) -> list[dict]:
        """TensorRT-LLM's KV cache events since the last call (waiting up to `timeout` s for one), as dicts in its
        JSON shape (engine_standin/kv_events.py); none unless kv_cache_config.event_buffer_max_size > 0."""
        return self.executor.kv_events.drain(timeout or 0.0)

    async def get_kv_cache_events_async(self, timeout: float | None = 2):
        """The same events, one by one (an async iterator, as TensorRT-LLM's), waited for off the event loop."""
        events = await asyncio.get_running_loop().run_in_executor(None, self.get_kv_cache_events, timeout)
        for event in events:
            yield event

    def shutdown(self) -> None:
        self.executor.shutdown()


def _deliver(batch: list) -> None:
    """Event loop: hand each output to its result, in engine order."""
    for (result, index), output in batch:
        result._on_output(index, output)


def applied_summary(llm: LLM, args: Mapping[str, Any]) -> str:
    """One line for the startup log: what the double runs and which LLM() arguments it cannot apply."""
    return (
        f"LLM-API double (TensorRT-LLM cannot run on this machine): {_engine_summary(llm, args)},"
        f" stream_interval {llm.stream_interval}, {len(llm._adapter_task)} LoRA adapter(s); LLM() arguments not"
        f" applied by the double: {', '.join(llm.not_applied) or 'none'}"
    )


def _engine_summary(llm: LLM, args: Mapping[str, Any]) -> str:
    step = llm.settings.synthetic_step_time_ms
    if step is not None:  # runtime.pytorch.synthetic: no model runs, whatever `model` names
        return f"stand-in's SYNTHETIC engine ({step:g} ms steps, no model: tokens at no model cost)"
    return f"stand-in engine on {args.get('model')}"
