"""Triton python-backend model `tensorrt_llm` (decoupled): the PyTorch engine stand-in.

Speaks NVIDIA's `tensorrt_llm` tensor interface so the ensemble and NVIDIA's core-model clients work
unchanged; the engine itself is `trtllm_truss.engine_standin` (continuous batching, independent of
Triton). See STANDIN_MODEL_INTERFACE for the exact tensors and parameters read here.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import triton_python_backend_utils as pb_utils
from trtllm_truss.engine_standin import (
    EngineBase,
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    RequestRejected,
    SamplingParams,
    StandinSettings,
    build_engine,
    parse_word_list,
)
from trtllm_truss.engine_standin.responses import ENGINE_OUTPUT_NAMES, response_arrays

STANDIN_MODEL_INTERFACE = """
Model name in the rendered repository: tensorrt_llm. backend: "python", decoupled: true,
max_batch_size > 0 (every tensor below has a leading batch dimension of 1 per request).

Inputs (NVIDIA's names and dtypes; * = optional):
  input_ids INT32 [-1]            prompt token ids (ragged); only the first input_lengths are used
  input_lengths INT32 [1]
  request_output_len INT32 [1]    tokens to generate (1..max_output_len)
  end_id* INT32 [1]               default: eos_token_id of the checkpoint's config.json
  pad_id* INT32 [1]               accepted (outputs are never padded per request)
  stop_words_list* INT32 [2,-1]   row 0 ids, row 1 cumulative end offsets padded with -1
  bad_words_list* INT32 [2,-1]    same format
  beam_width* INT32 [1]           only 1; other values fail that request with an error
  temperature* FP32 [1]  runtime_top_k* INT32 [1]  runtime_top_p* FP32 [1]
  len_penalty* FP32 [1] (beam search only: accepted, no effect)  repetition_penalty* FP32 [1]
  presence_penalty* FP32 [1]  frequency_penalty* FP32 [1]  min_length* INT32 [1]
  random_seed* UINT64 [1]
  return_log_probs* BOOL [1]  exclude_input_in_output* BOOL [1]  streaming* BOOL [1]
  stop* BOOL [1]                  true: cancel the in-flight request with the same Triton request id

Outputs:
  output_ids INT32 [-1,-1]        beams x tokens; streaming: only the new tokens of this response;
                                  otherwise one response, prompt first unless exclude_input_in_output
  sequence_length INT32 [-1]      tokens in output_ids per beam
  cum_log_probs FP32 [-1]         per beam, cumulative over the generated tokens (0 unless asked)
  output_log_probs FP32 [-1,-1]   beams x generated tokens of this response (zeros unless asked)
  prefix_ids INT32 [-1]           ours: up to prefix_window_tokens ids immediately preceding this
                                  response's output_ids in prompt + generated (empty if none)

Parameters (string_value): model_dir (required unless synthetic), tokenizer_dir, max_batch_size,
  max_input_len, max_output_len, max_num_sequences, max_beam_width (must be 1), device
  (cpu|cuda|auto), dtype (float32|float16|bfloat16), num_threads, exclude_input_in_output
  (default for requests that do not send it; true|false), synthetic (true|false),
  synthetic_step_time_ms, prefix_window_tokens (default 8).
"""

log = logging.getLogger("tensorrt_llm_pytorch")

# How often the sender thread asks Triton whether in-flight requests were cancelled by their clients.
CANCEL_CHECK_PERIOD_S = 0.05
ACTIVE_REQUESTS_METRIC = "trtllm_standin_active_requests"
# Requests that ended because their client cancelled them (stream closed, or NVIDIA's `stop` input):
# tells a freed slot apart from a generation that simply finished.
CANCELLED_REQUESTS_METRIC = "trtllm_standin_cancelled_requests_total"

def _input(request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _scalar(request, name: str, default):
    array = _input(request, name)
    if array is None or array.size == 0:
        return default
    return array.reshape(-1)[0].item()


@dataclass
class _InFlight:
    """One Triton request being served: what the sender thread needs to build its responses."""

    engine_id: str
    # The request's Triton id, read while execute() runs: in decoupled mode the request object is
    # released once execute() returns, so the sender thread must never touch it afterwards.
    triton_id: str
    sender: object  # the response sender stays valid until the final response; it answers is_cancelled()
    streaming: bool
    exclude_input: bool
    want_log_probs: bool
    outputs: frozenset  # the requested outputs: only these are built (engine_standin/responses.py says why)
    history: deque  # the last prefix_window tokens of prompt + already-sent tokens
    prompt: list[int] = field(default_factory=list)  # kept only when the prompt is echoed
    pending: list[int] = field(default_factory=list)
    pending_log_probs: list[float] = field(default_factory=list)
    sent_tokens: list[int] = field(default_factory=list)  # non-streaming: everything, sent at the end
    sent_log_probs: list[float] = field(default_factory=list)
    cum_log_prob: float = 0.0
    finish: GenerationOutput | None = None


class TritonPythonModel:
    def initialize(self, args) -> None:
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException(
                "tensorrt_llm (PyTorch stand-in): config.pbtxt needs model_transaction_policy { decoupled: true }"
            )
        parameters = {k: v.get("string_value", "") for k, v in model_config.get("parameters", {}).items()}
        beam = parameters.get("max_beam_width", "1").strip() or "1"
        if beam != "1":
            raise pb_utils.TritonModelException(f"parameters.max_beam_width: the PyTorch stand-in supports only 1, got {beam}")
        self.settings = StandinSettings.from_parameters(parameters)
        self.prefix_window = int(parameters.get("prefix_window_tokens", "8") or 8)
        self.default_end_id = _eos_token_id(self.settings)
        self.engine: EngineBase = build_engine(self.settings)
        # Requests the engine holds (running or waiting) on Triton's /metrics: shows slots freed
        # after a client cancels. Refreshed with the cancellation checks, off the per-token path.
        # (The family must outlive its metric, so both are kept.)
        self._active_family = pb_utils.MetricFamily(
            name=ACTIVE_REQUESTS_METRIC,
            description="requests held by the PyTorch stand-in engine (running or waiting)",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self._active_gauge = self._active_family.Metric(labels={"model": args["model_name"]})
        self._cancelled_family = pb_utils.MetricFamily(
            name=CANCELLED_REQUESTS_METRIC,
            description="requests the PyTorch stand-in engine ended because their client cancelled them",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self._cancelled_counter = self._cancelled_family.Metric(labels={"model": args["model_name"]})

        self._lock = threading.Condition()
        self._in_flight: dict[str, _InFlight] = {}
        self._by_triton_id: dict[str, str] = {}
        self._ready: dict[str, _InFlight] = {}
        self._stopping = False
        self._sender_thread = threading.Thread(target=self._send_loop, name="tensorrt_llm-sender", daemon=True)
        self._sender_thread.start()
        log.info("PyTorch stand-in ready (%s)", "synthetic" if self.settings.synthetic else self.settings.model_dir)

    # ------------------------------------------------------------------ requests
    def execute(self, requests):
        for request in requests:
            try:
                self._accept(request)
            except RequestRejected as exc:
                self._fail(request.get_response_sender(), str(exc))
            except Exception as exc:  # a malformed request fails alone
                log.exception("rejected a request")
                self._fail(request.get_response_sender(), f"tensorrt_llm (PyTorch stand-in): {exc}")

    def _accept(self, request) -> None:
        sender = request.get_response_sender()
        triton_id = request.request_id() or ""
        if _scalar(request, "stop", False):
            # NVIDIA's contract: a request with stop=true ends the in-flight request of the same id.
            with self._lock:
                engine_id = self._by_triton_id.get(triton_id)
            if engine_id is not None:
                self.engine.cancel(engine_id)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        input_ids = _input(request, "input_ids")
        if input_ids is None:
            raise RequestRejected("input_ids: required")
        if input_ids.ndim >= 2 and input_ids.shape[0] != 1:
            raise RequestRejected(f"input_ids: batch dimension must be 1 per request, got {input_ids.shape[0]}")
        flat = input_ids.reshape(-1)
        length = int(_scalar(request, "input_lengths", flat.size))
        if not 0 < length <= flat.size:
            raise RequestRejected(f"input_lengths: {length} does not fit the {flat.size} input_ids sent")
        prompt = flat[:length].astype(np.int64).tolist()
        output_len = _scalar(request, "request_output_len", None)
        if output_len is None:
            raise RequestRejected("request_output_len: required")
        end_id = _scalar(request, "end_id", self.default_end_id)
        sampling = SamplingParams(
            temperature=float(_scalar(request, "temperature", 1.0)),
            top_k=int(_scalar(request, "runtime_top_k", 0)),
            top_p=float(_scalar(request, "runtime_top_p", 0.0)),
            repetition_penalty=float(_scalar(request, "repetition_penalty", 1.0)),
            presence_penalty=float(_scalar(request, "presence_penalty", 0.0)),
            frequency_penalty=float(_scalar(request, "frequency_penalty", 0.0)),
            min_length=int(_scalar(request, "min_length", 0)),
            random_seed=int(_scalar(request, "random_seed", 0)),
        )
        try:
            stop_words = parse_word_list(_input(request, "stop_words_list"), "stop_words_list")
            bad_words = parse_word_list(_input(request, "bad_words_list"), "bad_words_list")
        except ValueError as exc:
            raise RequestRejected(str(exc)) from exc
        engine_id = uuid.uuid4().hex
        generation = GenerationRequest(
            request_id=engine_id,
            input_ids=prompt,
            max_new_tokens=int(output_len),
            end_id=None if end_id is None else int(end_id),
            pad_id=_scalar(request, "pad_id", None),
            sampling=sampling,
            stop_words=stop_words,
            bad_words=bad_words,
            beam_width=int(_scalar(request, "beam_width", 1)),
            return_log_probs=bool(_scalar(request, "return_log_probs", False)),
        )
        streaming = bool(_scalar(request, "streaming", False))
        exclude_input = bool(_scalar(request, "exclude_input_in_output", self.settings.exclude_input_in_output))
        flight = _InFlight(
            engine_id=engine_id,
            triton_id=triton_id,
            sender=sender,
            streaming=streaming,
            exclude_input=exclude_input,
            want_log_probs=generation.return_log_probs,
            outputs=frozenset(request.requested_output_names()) or ENGINE_OUTPUT_NAMES,
            history=deque(prompt[-self.prefix_window :], maxlen=self.prefix_window),
            prompt=prompt if not (streaming or exclude_input) else [],
        )
        with self._lock:
            self._in_flight[engine_id] = flight
            if triton_id:
                self._by_triton_id[triton_id] = engine_id
        try:
            self.engine.submit(generation, lambda output, f=flight: self._on_output(f, output))
        except RequestRejected:
            self._forget(flight)
            raise

    def _forget(self, flight: _InFlight) -> None:
        with self._lock:
            self._in_flight.pop(flight.engine_id, None)
            self._ready.pop(flight.engine_id, None)
            if self._by_triton_id.get(flight.triton_id) == flight.engine_id:
                del self._by_triton_id[flight.triton_id]

    @staticmethod
    def _fail(sender, message: str) -> None:
        sender.send(
            pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message)),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    # ------------------------------------------------------- engine -> responses
    def _on_output(self, flight: _InFlight, output: GenerationOutput) -> None:
        """Engine thread: only buffer; the sender thread builds and sends (several tokens if it fell behind)."""
        with self._lock:
            flight.pending.extend(output.token_ids)
            if output.log_probs:
                flight.pending_log_probs.extend(output.log_probs)
            if output.finished:
                flight.finish = output
            self._ready[flight.engine_id] = flight
            self._lock.notify()

    def _send_loop(self) -> None:
        next_cancel_check = 0.0
        while True:
            with self._lock:
                if not self._ready and not self._stopping:
                    # Wake up now and then to notice requests cancelled by their clients.
                    self._lock.wait(timeout=CANCEL_CHECK_PERIOD_S)
                if self._stopping and not self._ready:
                    return
                ready, self._ready = self._ready, {}
                batches = []
                for flight in ready.values():
                    batches.append((flight, flight.pending, flight.pending_log_probs, flight.finish))
                    flight.pending, flight.pending_log_probs = [], []
                now = time.monotonic()
                watched = list(self._in_flight.values()) if now >= next_cancel_check else []
            for flight, tokens, log_probs, finish in batches:
                try:
                    self._respond(flight, tokens, log_probs, finish)
                except Exception:
                    log.exception("sending a response failed; cancelling request %s", flight.engine_id)
                    self.engine.cancel(flight.engine_id)
                if finish is not None:
                    self._forget(flight)
                    if finish.finish_reason is FinishReason.CANCELLED:
                        try:
                            self._cancelled_counter.increment(1)
                        except Exception:
                            log.exception("updating %s failed", CANCELLED_REQUESTS_METRIC)
            if now >= next_cancel_check:
                next_cancel_check = now + CANCEL_CHECK_PERIOD_S
                try:  # a metrics failure must not stop the responses
                    self._active_gauge.set(self.engine.active_requests)
                except Exception:
                    log.exception("updating %s failed", ACTIVE_REQUESTS_METRIC)
                for flight in watched:
                    try:
                        if flight.finish is None and flight.sender.is_cancelled():
                            self.engine.cancel(flight.engine_id)
                    except Exception:
                        log.exception("checking cancellation of %s failed", flight.engine_id)

    def _respond(self, flight: _InFlight, tokens: list[int], log_probs: list[float], finish: GenerationOutput | None) -> None:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if finish is not None and finish.finish_reason is FinishReason.ERROR:
            self._fail(flight.sender, finish.error or "tensorrt_llm (PyTorch stand-in): request failed")
            return
        if not flight.want_log_probs:
            log_probs = []
        if flight.streaming:
            if tokens:
                prefix = list(flight.history)
                flight.history.extend(tokens)
                flight.cum_log_prob += float(sum(log_probs))
                response = self._response(flight.outputs, tokens, log_probs, flight.cum_log_prob, prefix, len(tokens))
                flight.sender.send(response, flags=final if finish is not None else 0)
            elif finish is not None:
                flight.sender.send(flags=final)
            return
        flight.sent_tokens.extend(tokens)
        flight.sent_log_probs.extend(log_probs)
        if finish is None:
            return
        if finish.finish_reason is FinishReason.CANCELLED:
            flight.sender.send(flags=final)
            return
        cum = float(sum(flight.sent_log_probs))
        if flight.exclude_input:
            response = self._response(
                flight.outputs, flight.sent_tokens, flight.sent_log_probs, cum, list(flight.history), len(flight.sent_tokens)
            )
        else:
            # Prompt first; log-probs still cover the generated tokens only.
            response = self._response(
                flight.outputs, flight.prompt + flight.sent_tokens, flight.sent_log_probs, cum, [], len(flight.sent_tokens)
            )
        flight.sender.send(response, flags=final)

    @staticmethod
    def _response(*args):
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, array) for name, array in response_arrays(*args)]
        )

    def finalize(self) -> None:
        self.engine.shutdown()
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        self._sender_thread.join(timeout=5)


def _eos_token_id(settings: StandinSettings) -> int | None:
    """The checkpoint's end token (generation_config.json first, as transformers does), if it has one."""
    if settings.model_dir is None:
        return None
    for name in ("generation_config.json", "config.json"):
        path = settings.model_dir / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            if isinstance(value, list):
                value = value[0] if value else None
            if isinstance(value, int):
                return value
    return None
