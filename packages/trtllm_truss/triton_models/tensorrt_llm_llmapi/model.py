"""Triton python-backend model `tensorrt_llm` for backend `llmapi`: TensorRT-LLM's LLM API behind NVIDIA's
token-id tensor interface.

NVIDIA's own llmapi Triton model takes text and answers text; this one takes the inputs of NVIDIA's C++
`tensorrt_llm` model (input_ids, request_output_len, streaming, end_id, sampling, stop/bad words, guided
decoding, lora_task_id, return_log_probs, num_return_sequences, stop, ...: the tensor stand-in's interface,
STANDIN_MODEL_INTERFACE in triton_models/tensorrt_llm_pytorch/model.py, read by the same reader) and answers
output_ids, sequence_length, cum_log_probs, output_log_probs and prefix_ids per response (and, ours, the k
most likely tokens of each position: num_top_log_probs in, output_top_log_probs / output_top_ids out, from
SamplingParams.logprobs=k), so the ensembles,
the stream workers and NVIDIA's core-model clients work as on every other backend.

Each row of a request is one `LLM.generate_async(inputs=, sampling_params=, lora_request=, streaming=)` call
(llm_request.py builds it); `num_return_sequences` is SamplingParams.n, each sequence's responses carry
sequence_index. The LLM is built from `1/model.yaml` (LLM() arguments from the typed configuration, as
repository/llmapi.py renders them), its stream_interval and speculative_config included. A request whose
client goes away (Triton cancellation) or that NVIDIA's `stop` input names is aborted.

Parameters (string_value): llm_api (tensorrt_llm | double: the LLM-API double of
engine_standin/llmapi_double.py, only where TensorRT-LLM cannot run), tokenizer_dir, max_input_len,
max_output_len, exclude_input_in_output, prefix_window_tokens, lora_adapters (JSON {"<task id>": {"name",
"dir"}}: build.lora_adapters, each sent as a LoRARequest), guided_whitespace (compact | flexible:
runtime.pytorch.guided_whitespace, given to the double only; no LLM() argument of TensorRT-LLM's), synthetic
(true | false) and synthetic_step_time_ms (runtime.pytorch.synthetic: the double's stand-in engine emits tokens
without a model, for `trtllm-truss bench`; the double only).

Everything that talks to the LLM runs on one asyncio loop thread: generate_async, iterating its results,
sending responses and asking the response senders whether their clients cancelled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import triton_python_backend_utils as pb_utils
import yaml
from trtllm_truss.engine_standin.request_inputs import STOP_WITHOUT_ID_ERROR, read_generation, read_rows, request_scalar
from trtllm_truss.engine_standin.responses import ENGINE_OUTPUT_NAMES, ResponseExtras, response_arrays
from trtllm_truss.engine_standin.senders import accept_each, fail
from trtllm_truss.engine_standin.settings import StandinSettings
from trtllm_truss.engine_standin.types import EngineLimits, GenerationRequest, RequestRejected
from trtllm_truss.runtime.stub_watch import watch_parent
from trtllm_truss.triton_models.tensorrt_llm_llmapi.llm_request import (
    LLM_API_DOUBLE,
    double_settings,
    load_llm_api,
    submit,
    token_log_probs,
    token_top_log_probs,
)

log = logging.getLogger("tensorrt_llm_llmapi")
CANCEL_CHECK_PERIOD_S = 0.05
# is_cancelled() is an IPC round trip to tritonserver made on the loop thread that also sends every response:
# past this many checks a second (many requests in flight), each request is checked less often instead.
CANCEL_CHECKS_PER_S = 250
MODEL_YAML = "model.yaml"
_UNSUPPORTED_FLAGS = {
    "return_context_logits": "context logits are not wired through this model",
    "return_generation_logits": "generation logits are not wired through this model",
}


@dataclass
class Flight:
    """One Triton request: its rows' LLM results, and what its responses need."""

    triton_id: str
    sender: object
    streaming: bool
    exclude_input: bool
    want_log_probs: bool
    top_log_probs: int  # num_top_log_probs (ours): k most likely tokens per position, 0 for none
    outputs: frozenset
    rows: int
    results: list = field(default_factory=list)
    done: bool = False


class TritonPythonModel:
    def initialize(self, args) -> None:
        model_config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        parameters = {k: v.get("string_value", "") for k, v in model_config.get("parameters", {}).items()}
        self.kind = parameters.get("llm_api", "tensorrt_llm").strip() or "tensorrt_llm"
        self.api = load_llm_api(self.kind)
        self.prefix_window = int(parameters.get("prefix_window_tokens", "8") or 8)
        self.exclude_input = parameters.get("exclude_input_in_output", "false").strip().lower() == "true"
        self.limits = EngineLimits(
            max_batch_size=1,
            max_input_len=int(parameters.get("max_input_len") or 1 << 30),
            max_output_len=int(parameters.get("max_output_len") or 1 << 30),
        )
        # lora_task_id -> (name, folder): the stand-in's reader of the same parameter.
        self.adapters = StandinSettings.from_parameters(
            {"model_dir": "-", "lora_adapters": parameters.get("lora_adapters", "")}
        ).lora_adapters
        self.tokenizer_dir = parameters.get("tokenizer_dir") or None
        # The double's own settings (its stand-in engine), kept apart from model.yaml's LLM() arguments.
        self.double_settings = double_settings(parameters) if self.kind == LLM_API_DOUBLE else {}
        self._tokenizer = None
        model_yaml = Path(args["model_repository"]) / str(args["model_version"]) / MODEL_YAML
        llm_args = yaml.safe_load(model_yaml.read_text(encoding="utf-8")) or {}
        self.default_end_id = _eos_token_id(Path(llm_args["model"]))
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tensorrt_llm-llmapi", daemon=True)
        self._thread.start()
        # Built on the loop thread: the LLM API binds its result queues to the loop that runs it.
        self.llm = asyncio.run_coroutine_threadsafe(self._build(llm_args), self.loop).result()
        self._flights: dict[str, Flight] = {}  # Triton id -> request, for NVIDIA's `stop`
        self._active: set[int] = set()
        self._watch = asyncio.run_coroutine_threadsafe(self._watch_cancellations(), self.loop)
        self._parent_watch = watch_parent(str(args.get("model_instance_name", args["model_name"])))
        if self.kind == LLM_API_DOUBLE:
            from trtllm_truss.engine_standin.llmapi_double import applied_summary

            log.warning("%s", applied_summary(self.llm, llm_args))
        log.info("llmapi model ready: %s LLM API, model.yaml %s", self.kind, model_yaml)

    async def _build(self, llm_args: dict):
        return self.api.LLM(**llm_args, **self.double_settings)

    # ------------------------------------------------------------------ requests
    def execute(self, requests):
        accept_each(pb_utils, requests, self._accept, "tensorrt_llm (LLM API)", log)

    def _validate(self, generation: GenerationRequest) -> None:
        limits = self.limits
        if generation.beam_width != 1:
            raise RequestRejected(f"beam_width={generation.beam_width}: this model streams beam width 1 only")
        if not generation.input_ids:
            raise RequestRejected("input_ids: the prompt is empty")
        if len(generation.input_ids) > limits.max_input_len:
            raise RequestRejected(f"input_lengths: {len(generation.input_ids)} tokens exceed max_input_len={limits.max_input_len}")
        if not 1 <= generation.max_new_tokens <= limits.max_output_len:
            raise RequestRejected(f"request_output_len: {generation.max_new_tokens} is not within 1..{limits.max_output_len}")
        if generation.lora_task_id is not None and generation.lora_task_id not in self.adapters:
            # NVIDIA's message (PeftCacheManager::addRequestPeft), as the C++ backend and the stand-in say it.
            raise RequestRejected(f"LoRA task {generation.lora_task_id} not found in cache. Please send LoRA weights with request")
        for name, why in _UNSUPPORTED_FLAGS.items():
            if getattr(generation, name):
                raise RequestRejected(f"{name}: {why}")

    def _accept(self, request) -> None:
        triton_id = request.request_id() or ""
        if request_scalar(pb_utils, request, "stop", False):
            if not triton_id:
                raise RequestRejected(STOP_WITHOUT_ID_ERROR)
            self.loop.call_soon_threadsafe(self._abort, triton_id)
            request.get_response_sender().send(
                pb_utils.InferenceResponse(output_tensors=[]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
            return
        shape = read_rows(pb_utils, request, decoupled=self.decoupled)
        rows = []
        for row in range(shape.rows):
            parsed = read_generation(
                shape, row, 0, default_end_id=self.default_end_id, default_exclude_input=self.exclude_input,
                validate=self._validate,
            )
            rows.append((parsed, shape.sequences[row]))
        first = rows[0][0]
        flight = Flight(
            triton_id=triton_id,
            sender=request.get_response_sender(),
            streaming=first.streaming,
            exclude_input=first.exclude_input,
            want_log_probs=first.generation.return_log_probs,
            top_log_probs=first.generation.top_log_probs if first.generation.return_log_probs else 0,
            outputs=frozenset(request.requested_output_names()) or ENGINE_OUTPUT_NAMES,
            rows=shape.rows,
        )
        asyncio.run_coroutine_threadsafe(self._serve(flight, rows), self.loop)

    def _abort(self, triton_id: str) -> None:
        flight = self._flights.get(triton_id)
        if flight is not None:
            for result in flight.results:
                result.abort()

    def _decode(self, ids: list[int]) -> str:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        return self._tokenizer.decode(ids)

    async def _serve(self, flight: Flight, rows) -> None:
        """Every row of the request, concurrently; the last response carries the final flag."""
        if flight.triton_id:
            self._flights[flight.triton_id] = flight
        self._active.add(id(flight))
        try:
            try:
                results = [
                    submit(self.llm, self.api, parsed.generation, n=count, streaming=flight.streaming,
                           adapters=self.adapters, decode=self._decode)
                    for parsed, count in rows
                ]
            except Exception as exc:  # the LLM API refused the request (its own validation)
                fail(pb_utils, flight.sender, f"tensorrt_llm (LLM API): {exc}")
                return
            flight.results = results
            outcome = await asyncio.gather(
                *(self._stream(flight, row, parsed, count, result) for row, ((parsed, count), result) in enumerate(zip(rows, results))),
                return_exceptions=True,
            )
            errors = [str(e) for e in outcome if isinstance(e, BaseException)]
            if errors:
                for result in results:
                    result.abort()
                fail(pb_utils, flight.sender, f"tensorrt_llm (LLM API): {errors[0]}")
                return
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            responses = [response for row in outcome for response in row]
            if not responses:  # streamed (or cancelled before any token): the final flag alone
                flight.sender.send(None if self.decoupled else pb_utils.InferenceResponse(output_tensors=[]), flags=final)
                return
            for response in responses[:-1]:
                flight.sender.send(response, flags=0)
            flight.sender.send(responses[-1], flags=final)
        except Exception:
            log.exception("serving request %s failed", flight.triton_id)
        finally:
            flight.done = True
            flight.sender = None  # a sender must not outlive its final response
            self._active.discard(id(flight))
            if flight.triton_id and self._flights.get(flight.triton_id) is flight:
                del self._flights[flight.triton_id]

    async def _stream(self, flight: Flight, row: int, parsed, count: int, result) -> list:
        """One row's result: streamed, a response per new tokens of each sequence is sent at once (returns
        []); otherwise the responses to send at the end, one per sequence (prompt first unless
        exclude_input_in_output; none for a cancelled request)."""
        prompt = parsed.prompt
        sent = [0] * count
        history = [deque(prompt[-self.prefix_window :], maxlen=self.prefix_window) for _ in range(count)]
        cum = [0.0] * count
        k = flight.top_log_probs
        async for update in result:
            outputs = update.outputs
            for completion in outputs:
                index = completion.index
                tokens = list(completion.token_ids[sent[index] :])
                if not tokens:
                    continue
                log_probs = token_log_probs(completion.logprobs[sent[index] :], tokens) if flight.want_log_probs else []
                tops = token_top_log_probs(completion.logprobs[sent[index] :][: len(tokens)], k) if k else None
                sent[index] += len(tokens)
                cum[index] += float(sum(log_probs))
                if not flight.streaming:
                    continue
                prefix = list(history[index])
                history[index].extend(tokens)
                response = self._response(flight, row, index, count, tokens, log_probs, cum[index], prefix, len(tokens), tops)
                if flight.sender is not None:
                    flight.sender.send(response, flags=0)
        if flight.streaming or any(c.finish_reason == "cancelled" for c in result.outputs):
            return []
        responses = []
        for completion in result.outputs:
            index = completion.index
            tokens = list(completion.token_ids)
            log_probs = token_log_probs(completion.logprobs, tokens) if flight.want_log_probs else []
            tops = token_top_log_probs(completion.logprobs[: len(tokens)], k) if k else None
            ids = tokens if flight.exclude_input else prompt + tokens
            prefix = list(history[index]) if flight.exclude_input else []
            responses.append(self._response(flight, row, index, count, ids, log_probs, cum[index], prefix, len(tokens), tops))
        return responses

    def _response(self, flight, row, index, count, tokens, log_probs, cum, prefix, generated, tops=None):
        extras = ResponseExtras(
            batch_index=row if flight.rows > 1 else None, sequence_index=index if count > 1 else None
        )
        arrays = response_arrays(
            flight.outputs, tokens, log_probs if flight.want_log_probs else [], cum, prefix, generated, extras, tops
        )
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in arrays])

    async def _watch_cancellations(self) -> None:
        """Triton cancellation (the client went away): abort the LLM request, which frees its slot."""
        while True:
            await asyncio.sleep(max(CANCEL_CHECK_PERIOD_S, len(self._flights) / CANCEL_CHECKS_PER_S))
            for flight in list(self._flights.values()):
                sender = flight.sender
                try:
                    if sender is not None and not flight.done and sender.is_cancelled():
                        for result in flight.results:
                            result.abort()
                except Exception:
                    log.exception("checking cancellation of %s failed", flight.triton_id)

    def finalize(self) -> None:
        self._watch.cancel()
        shutdown = getattr(self.llm, "shutdown", None)
        if shutdown is not None:
            shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self._parent_watch.finalized()


def _eos_token_id(model_dir: Path) -> int | None:
    """The checkpoint's end token (generation_config.json first, as transformers does)."""
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            if isinstance(value, list):
                value = value[0] if value else None
            if isinstance(value, int):
                return value
    return None
