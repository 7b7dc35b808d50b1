"""Triton python-backend model `tensorrt_llm` (decoupled): the PyTorch engine stand-in.

Speaks NVIDIA's `tensorrt_llm` tensor interface so the ensemble and NVIDIA's core-model clients work
unchanged; the engine itself is `trtllm_truss.engine_standin` (continuous batching, independent of
Triton). See STANDIN_MODEL_INTERFACE for the exact tensors and parameters read here.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import secrets
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
    Guide,
    RequestRejected,
    SamplingParams,
    StandinSettings,
    build_engine,
    parse_word_list,
)
from trtllm_truss.engine_standin.guide_metrics import GuideCacheMetrics
from trtllm_truss.engine_standin.nvidia_metrics import NvidiaMetrics, engine_values
from trtllm_truss.engine_standin.responses import (
    ENGINE_OUTPUT_NAMES,
    NO_EXTRAS,
    PerfMetrics,
    ResponseExtras,
    generation_logits_array,
    response_arrays,
)
from trtllm_truss.engine_standin.stop_relay import StopRelay
from trtllm_truss.engine_standin.stream_interval import IntervalBuffer
from trtllm_truss.engine_standin.unsupported_inputs import refuse_unsupported
from trtllm_truss.engine_standin.world import join_world
from trtllm_truss.stub_watch import watch_parent

STANDIN_MODEL_INTERFACE = """
Model name in the rendered repository: tensorrt_llm. backend: "python", decoupled: runtime.decoupled_mode
(not decoupled: one response per request, streaming and batches refused with NVIDIA's messages),
max_batch_size > 0: every tensor below has a leading batch dimension. A request of N rows (decoupled
only, as NVIDIA's) is N generations; every response belongs to one row and carries batch_index.

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
  random_seed* UINT64 [1]         default: a fresh random seed per request (unseeded sampling differs)
  return_log_probs* BOOL [1]  exclude_input_in_output* BOOL [1]  streaming* BOOL [1]
  num_return_sequences* INT32 [1] sequences per row (decoupled only when > 1); sequence s > 0 of a
                                  seeded request samples with random_seed + s
  return_context_logits* return_generation_logits* return_perf_metrics* BOOL [1]
  embedding_bias* FP32 [-1]       one value per vocabulary id, added to the logits (empty: none)
  decoder_input_ids* INT32 [-1]  decoder_input_lengths* INT32 [1]   accepted, ignored (decoder-only)
  guided_decoding_guide_type* guided_decoding_guide* BYTES [1]   NVIDIA's guided decoding (json,
                                  json_schema, regex, ebnf_grammar; and structural_tag), enforced with
                                  llguidance (engine_standin/guidance.py); an unknown type or a guide
                                  without a type is refused (NVIDIA's backend ignores both)
  runtime_top_p_min/decay/reset_ids*, early_stopping*, beam_search_diversity_rate*, prompt_embedding_table*,
  prompt_table_extra_ids*, prompt_vocab_size*, draft_input_ids*, draft_logits*, draft_acceptance_threshold*,
  lookahead_window_size*, lookahead_ngram_size*, lookahead_verification_set_size*, retention_*
                                  declared with NVIDIA's dtypes; a request sending one (non-empty) is refused
                                  naming it and why (engine_standin/unsupported_inputs.py)
  lora_task_id* UINT64 [1]        a LoRA adapter of parameters.lora_adapters (none: the base model); an
                                  unknown id fails the request with NVIDIA's "LoRA task <id> not found in cache"
  stop* BOOL [1]                  true: cancel the in-flight request with the same Triton request id
                                  (on whichever instance serves it); answered by one empty final
                                  response; without a request id: NVIDIA's error

Outputs:
  output_ids INT32 [-1,-1]        beams x tokens; streaming: only the new tokens of this response;
                                  otherwise one response, prompt first unless exclude_input_in_output
  sequence_length INT32 [-1]      tokens in output_ids per beam
  cum_log_probs FP32 [-1]         per beam, cumulative over the generated tokens (0 unless asked)
  output_log_probs FP32 [-1,-1]   beams x generated tokens of this response (zeros unless asked)
  prefix_ids INT32 [-1]           ours: up to prefix_window_tokens ids immediately preceding this
                                  response's output_ids in prompt + generated (empty if none)
  batch_index INT32 [1]           the row this response belongs to (only when the request has > 1)
  sequence_index INT32 [1]        0..num_return_sequences-1 (only when num_return_sequences > 1)
  context_logits FP32 [-1,-1]     prompt_len x vocab, in every response (return_context_logits)
  generation_logits FP32 [-1,-1,-1]  streaming: tokens x beams x vocab of this response; otherwise
                                  beams x request_output_len x vocab (return_generation_logits)
                                  (the synthetic engine's logits are zero-filled placeholders)
  kv_cache_alloc_new_blocks, kv_cache_reused_blocks, kv_cache_alloc_total_blocks, total_draft_tokens,
  total_accepted_draft_tokens INT32 [1]; arrival_time_ns, first_scheduled_time_ns,
  first_token_time_ns, last_token_time_ns INT64 [1]; acceptance_rate FP32 [1]
                                  in every response with return_perf_metrics (PerfMetrics says how
                                  the stand-in fills them)

Parameters (string_value): model_dir (required unless synthetic), tokenizer_dir, max_batch_size,
  max_input_len, max_output_len, max_num_sequences, max_beam_width (must be 1), device
  (cpu|cuda|auto), dtype (float32|float16|bfloat16), num_threads, exclude_input_in_output
  (default for requests that do not send it; true|false), synthetic (true|false),
  synthetic_step_time_ms, prefix_window_tokens (default 8), sender_threads (default 1),
  merge_responses (default false), stream_interval (default 1: TensorRT-LLM's LLM API setting, see
  engine_standin/stream_interval.py), lora_adapters (JSON {"<task id>": {"name", "dir"}}: peft adapters loaded at
  startup and mixed row by row in every batch), lora_max_loras (different adapters per engine step).

Responses: one per generation (row x sequence) per engine step, as NVIDIA's engine sends them; the
final flag comes with the last generation's last response; a sender that falls
behind queues them in order (merge_responses=true instead merges the waiting tokens of a request
into one response). Several instances (instance_group count) each run their own engine with a
share of max_batch_size; a `send()` is an IPC round trip to tritonserver, so more instances and
sender threads offer more responses per second.
"""

log = logging.getLogger("tensorrt_llm_pytorch")

# How often the sender thread asks Triton whether in-flight requests were cancelled by their clients.
CANCEL_CHECK_PERIOD_S = 0.05
ACTIVE_REQUESTS_METRIC = "trtllm_standin_active_requests"
# Requests that ended because their client cancelled them (stream closed, or NVIDIA's `stop` input):
# tells a freed slot apart from a generation that simply finished.
CANCELLED_REQUESTS_METRIC = "trtllm_standin_cancelled_requests_total"
# NVIDIA's message (model_instance_state.cc, handleStopRequest) for a stop request without an id.
STOP_WITHOUT_ID_ERROR = "Trying to stop a request but request ID is not provided"
# NVIDIA's messages (utils.cc, createRequestsFromInputTensors) when the model is not decoupled.
BATCH_NEEDS_DECOUPLED_ERROR = "Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy"
STREAMING_NEEDS_DECOUPLED_ERROR = "Streaming is only supported if model is deployed using decoupled mode."
# Ours: NVIDIA's backend would send several responses where a non-decoupled model may send one.
SEQUENCES_NEED_DECOUPLED_ERROR = "num_return_sequences > 1 requires the tensorrt_llm model to be decoupled (runtime.decoupled_mode)"

def _input(request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _scalar(request, name: str, default):
    array = _input(request, name)
    if array is None or array.size == 0:
        return default
    return array.reshape(-1)[0].item()


def _row(array, row: int):
    """Row `row` of a batched input (Triton gives every input of a request the same batch size)."""
    if array is None:
        return None
    if array.ndim == 0:
        return array.reshape(1)
    return array[row] if array.shape[0] > row else array[0]


def _row_text(arrays: dict, name: str, row: int) -> str | None:
    """A BYTES [1] input of row `row` as text (None when absent or empty)."""
    value = _row(arrays.get(name), row)
    if value is None or value.size == 0:
        return None
    item = value.reshape(-1)[0]
    text = item.decode("utf-8") if isinstance(item, bytes) else str(item)
    return text or None


def _row_scalar(arrays: dict, name: str, row: int, default):
    value = _row(arrays.get(name), row)
    if value is None or value.size == 0:
        return default
    return value.reshape(-1)[0].item()


class _Group:
    """The generations (rows x sequences) of one Triton request: they share its response sender,
    and only the last of them to finish sends the final flag (NVIDIA's pendingBatchedRequestIds).
    Touched only by the lane all of them are pinned to."""

    def __init__(self, size: int) -> None:
        self.remaining = size

    def finish_one(self) -> bool:
        """True for the generation that finishes last."""
        self.remaining -= 1
        return self.remaining == 0


@dataclass
class _InFlight:
    """One Triton request being served: what its sender lane needs to build its responses."""

    engine_id: str
    # The request's Triton id, read while execute() runs: in decoupled mode the request object is
    # released once execute() returns, so the sender threads must never touch it afterwards.
    triton_id: str
    sender: object  # the response sender stays valid until the final response; it answers is_cancelled()
    lane: _Lane  # every response of this request leaves from this lane's thread, in order
    streaming: bool
    exclude_input: bool
    want_log_probs: bool
    outputs: frozenset  # the requested outputs: only these are built (engine_standin/responses.py says why)
    history: deque  # the last prefix_window tokens of prompt + already-sent tokens
    group: _Group = field(default_factory=lambda: _Group(1))
    generation: GenerationRequest | None = None  # the engine request (perf metrics read its admission time)
    batch_index: int | None = None  # set when the Triton request has several rows
    sequence_index: int | None = None  # set when num_return_sequences > 1
    want_perf: bool = False
    arrival_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    context_logits: object = None  # numpy [prompt_len, vocab], from the first output
    generation_logits: list = field(default_factory=list)  # numpy rows not yet sent
    prompt: list[int] = field(default_factory=list)  # kept only when the prompt is echoed
    sent_tokens: list[int] = field(default_factory=list)  # non-streaming: everything, sent at the end
    sent_log_probs: list[float] = field(default_factory=list)
    cum_log_prob: float = 0.0
    finished: bool = False
    interval: IntervalBuffer | None = None  # stream_interval > 1, streaming: outputs held between answers


class _Lane:
    """A sender thread and its FIFO of engine outputs. `send()` is an IPC round trip to
    tritonserver that releases the GIL, so several lanes send in parallel; a request is pinned to
    one lane so its responses keep their order."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.cond = threading.Condition()
        self.outputs: deque = deque()  # (flight, GenerationOutput), in the engine's order
        # The requests pinned here (engine id -> flight). Only this lane's thread sends their
        # responses and asks their senders is_cancelled(): asking from another thread raced with the
        # final response (which frees the sender's factory) and crashed tritonserver (SIGSEGV).
        self.flights: dict[str, _InFlight] = {}
        self.thread: threading.Thread | None = None


def _merged(outputs) -> list[tuple[_InFlight, list[int], list[float], GenerationOutput | None]]:
    """merge_responses: everything waiting for one request becomes one response (first-seen order)."""
    by_flight: dict[int, list] = {}
    for flight, output in outputs:
        entry = by_flight.setdefault(id(flight), [flight, [], [], None])
        entry[1].extend(output.token_ids)
        entry[2].extend(output.log_probs or ())
        if output.finished:
            entry[3] = output
    return [tuple(entry) for entry in by_flight.values()]


def _instance_position(args: dict, model_config: dict) -> tuple[int, int]:
    """(this instance's index, instances of the model). Triton names instances `<group>_<n>`."""
    count = sum(int(group.get("count", 1)) for group in model_config.get("instance_group", [])) or 1
    try:
        index = int(str(args.get("model_instance_name", "")).rsplit("_", 1)[1])
    except (IndexError, ValueError):
        index = 0
    return min(index, count - 1), count


def _world_join_timeout_s() -> float:
    from trtllm_truss.cluster import DEFAULT_NODE_WAIT_S, NODE_WAIT_ENV

    return float(os.environ.get(NODE_WAIT_ENV) or DEFAULT_NODE_WAIT_S)


class TritonPythonModel:
    def initialize(self, args) -> None:
        model_config = json.loads(args["model_config"])
        # NVIDIA's decoupled_mode: not decoupled, every request gets exactly one response (no streaming).
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        parameters = {k: v.get("string_value", "") for k, v in model_config.get("parameters", {}).items()}
        beam = parameters.get("max_beam_width", "1").strip() or "1"
        if beam != "1":
            raise pb_utils.TritonModelException(f"parameters.max_beam_width: the PyTorch stand-in supports only 1, got {beam}")
        settings = StandinSettings.from_parameters(parameters)
        # Each instance (a stub process with its own engine) gets its share of the batch limit,
        # so all instances together run at most max_batch_size sequences, as one engine would.
        self.instance_index, self.instance_count = _instance_position(args, model_config)
        total = settings.limits.max_batch_size
        share = total // self.instance_count + (1 if self.instance_index < total % self.instance_count else 0)
        if share < 1:
            raise pb_utils.TritonModelException(
                f"instance_group: {self.instance_count} instances exceed max_batch_size={total} (each needs a slot)"
            )
        self.settings = dataclasses.replace(settings, limits=dataclasses.replace(settings.limits, max_batch_size=share))
        self.prefix_window = int(parameters.get("prefix_window_tokens", "8") or 8)
        self.default_end_id = _eos_token_id(self.settings)
        self.engine: EngineBase = build_engine(self.settings)
        # Several ranks (nodes): rank 0 is ready only once every rank has joined, as NVIDIA's executor.
        self._world = join_world(os.environ, _world_join_timeout_s()) if self.instance_index == 0 else None
        instance_name = str(args.get("model_instance_name", args["model_name"]))
        # Requests the engine holds (running or waiting) on Triton's /metrics: shows slots freed
        # after a client cancels. Refreshed with the cancellation checks, off the per-token path.
        # (The family must outlive its metric, so both are kept.) One series per instance.
        labels = {"model": args["model_name"], "instance": instance_name}
        self._active_family = pb_utils.MetricFamily(
            name=ACTIVE_REQUESTS_METRIC,
            description="requests held by the PyTorch stand-in engine (running or waiting)",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self._active_gauge = self._active_family.Metric(labels=labels)
        self._cancelled_family = pb_utils.MetricFamily(
            name=CANCELLED_REQUESTS_METRIC,
            description="requests the PyTorch stand-in engine ended because their client cancelled them",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self._cancelled_counter = self._cancelled_family.Metric(labels=labels)
        self._guide_metrics = GuideCacheMetrics(pb_utils.MetricFamily, labels)
        # NVIDIA's nv_trt_llm_* series (engine_standin/nvidia_metrics.py says how they map).
        self._all_slots = total
        self._nvidia_metrics = NvidiaMetrics(
            pb_utils.MetricFamily,
            args["model_name"],
            str(args.get("model_version", "1")),
            reports_constants=self.instance_index == 0,
        )

        self._lock = threading.Lock()  # guards the two maps below
        self._in_flight: dict[str, _InFlight] = {}
        self._by_triton_id: dict[str, list[str]] = {}  # Triton id -> its generations' engine ids
        self._stopping = threading.Event()
        self._lanes = [_Lane(i) for i in range(self.settings.sender_threads)]
        self._next_lane = itertools.count()
        for lane in self._lanes:
            lane.thread = threading.Thread(target=self._send_loop, args=(lane,), name=f"tensorrt_llm-sender-{lane.index}", daemon=True)
            lane.thread.start()
        self._watcher = threading.Thread(target=self._watch_loop, name="tensorrt_llm-watch", daemon=True)
        self._watcher.start()
        self._stop_relay = StopRelay(args["model_name"], self.instance_index, self.instance_count, self._stop_local)
        self._parent_watch = watch_parent(instance_name)  # ends this stub if tritonserver goes (stub_watch.py)
        log.info(
            "PyTorch stand-in instance %d/%d ready (%s, %d sequence slots, %d sender threads, %s)",
            self.instance_index + 1,
            self.instance_count,
            "synthetic" if self.settings.synthetic else self.settings.model_dir,
            share,
            len(self._lanes),
            _response_pace(self.settings),
        )

    # ------------------------------------------------------------------ requests
    def execute(self, requests):
        rejected: list[tuple[object, str]] = []
        for request in requests:
            try:
                self._accept(request)
            except RequestRejected as exc:
                rejected.append((request, str(exc)))
            except Exception as exc:  # a malformed request fails alone
                log.exception("rejected a request")
                rejected.append((request, f"tensorrt_llm (PyTorch stand-in): {exc}"))
        if rejected and len(rejected) == len(requests):
            # Raising is the only way a python-backend model makes Triton count a request as failed
            # (nv_inference_request_failure, reason BACKEND: the python backend reports statistics
            # per execute(), failed only when it raises, decoupled or not; an error response sent
            # through a sender counts as a success). The backend then answers every request of
            # this execute() with the error, so only when all of them were refused (the usual case:
            # a bad request arrives alone), and always before any response sender was taken (a
            # raise after a sender was taken would let the backend delete a factory the stub still
            # uses). Otherwise each refusal goes through its sender.
            raise pb_utils.TritonModelException("; ".join(dict.fromkeys(message for _, message in rejected)))
        for request, message in rejected:
            self._fail(request.get_response_sender(), message)

    def _stop_local(self, triton_id: str) -> bool:
        """Cancel the generations of the request with this Triton id if this instance serves it."""
        with self._lock:
            engine_ids = list(self._by_triton_id.get(triton_id, ()))
        for engine_id in engine_ids:
            self.engine.cancel(engine_id)
        return bool(engine_ids)

    def _accept(self, request) -> None:
        """Refusals raise before the response sender is taken (execute() may fail the request)."""
        triton_id = request.request_id() or ""
        if _scalar(request, "stop", False):
            # NVIDIA's contract: a request with stop=true ends the in-flight request of the same id
            # (served by this instance or, with several instances, by a sibling) and gets one
            # empty final response; an unknown id is not an error (it may have finished already).
            if not triton_id:
                raise RequestRejected(STOP_WITHOUT_ID_ERROR)
            if not self._stop_local(triton_id):
                self._stop_relay.forward(triton_id)
            request.get_response_sender().send(pb_utils.InferenceResponse(output_tensors=[]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        arrays = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
        refuse_unsupported(arrays)
        input_ids = arrays.get("input_ids")
        if input_ids is None:
            raise RequestRejected("input_ids: required")
        rows = input_ids.shape[0] if input_ids.ndim >= 2 else 1
        if not self.decoupled and rows > 1:
            raise RequestRejected(BATCH_NEEDS_DECOUPLED_ERROR)
        if not self.decoupled and _scalar(request, "streaming", False):
            raise RequestRejected(STREAMING_NEEDS_DECOUPLED_ERROR)
        if input_ids.ndim < 2:
            input_ids = input_ids.reshape(1, -1)
        # Every generation is built and validated before the sender is taken: a bad row fails the
        # whole request, as NVIDIA's backend refuses it before enqueueing any of its rows.
        flights: list[tuple[_InFlight, GenerationRequest]] = []
        arrival_ns = time.monotonic_ns()
        sequences = [int(_row_scalar(arrays, "num_return_sequences", row, 1)) for row in range(rows)]
        for row, count in enumerate(sequences):
            if count < 1:
                raise RequestRejected(f"num_return_sequences: must be >= 1, got {count}")
            if count > 1 and not self.decoupled:
                raise RequestRejected(SEQUENCES_NEED_DECOUPLED_ERROR)
        group = _Group(sum(sequences))
        lane = self._lanes[next(self._next_lane) % len(self._lanes)]  # one lane: the sender is shared
        requested = frozenset(request.requested_output_names()) or ENGINE_OUTPUT_NAMES
        for row in range(rows):
            for sequence in range(sequences[row]):
                flights.append(
                    self._generation(
                        arrays, input_ids[row], row, sequence, triton_id,
                        batch_index=row if rows > 1 else None,
                        sequence_index=sequence if sequences[row] > 1 else None,
                        group=group, lane=lane, requested=requested, arrival_ns=arrival_ns,
                    )
                )
        sender = request.get_response_sender()
        with self._lock:
            for flight, _ in flights:
                flight.sender = sender
                self._in_flight[flight.engine_id] = flight
                flight.lane.flights[flight.engine_id] = flight
            if triton_id:
                # A later request with the same id takes the id over, as in NVIDIA's backend
                # (mTritonRequestIdToRequestIds): `stop` then ends that request's generations.
                self._by_triton_id[triton_id] = [flight.engine_id for flight, _ in flights]
        for index, (flight, generation) in enumerate(flights):
            try:
                self.engine.submit(generation, lambda output, f=flight: self._on_output(f, output))
            except RequestRejected as exc:  # shutting down: the sender is taken, so answer through it
                for other, _ in flights[index:]:
                    self._forget(other)
                self._fail(sender, str(exc))
                for other, _ in flights[:index]:
                    self.engine.cancel(other.engine_id)
                return

    def _generation(
        self, arrays: dict, row_ids, row: int, sequence: int, triton_id: str, *,
        batch_index: int | None, sequence_index: int | None, group: _Group, lane: _Lane,
        requested: frozenset, arrival_ns: int,
    ) -> tuple[_InFlight, GenerationRequest]:
        """One engine request for row `row`, sequence `sequence` of a Triton request."""
        flat = row_ids.reshape(-1)
        where = f" (row {row})" if batch_index is not None else ""
        length = int(_row_scalar(arrays, "input_lengths", row, flat.size))
        if not 0 < length <= flat.size:
            raise RequestRejected(f"input_lengths: {length} does not fit the {flat.size} input_ids sent{where}")
        prompt = flat[:length].astype(np.int64).tolist()
        output_len = _row_scalar(arrays, "request_output_len", row, None)
        if output_len is None:
            raise RequestRejected("request_output_len: required")
        end_id = _row_scalar(arrays, "end_id", row, self.default_end_id)
        seed = _row_scalar(arrays, "random_seed", row, None)
        sampling = SamplingParams(
            temperature=float(_row_scalar(arrays, "temperature", row, 1.0)),
            top_k=int(_row_scalar(arrays, "runtime_top_k", row, 0)),
            top_p=float(_row_scalar(arrays, "runtime_top_p", row, 0.0)),
            repetition_penalty=float(_row_scalar(arrays, "repetition_penalty", row, 1.0)),
            presence_penalty=float(_row_scalar(arrays, "presence_penalty", row, 0.0)),
            frequency_penalty=float(_row_scalar(arrays, "frequency_penalty", row, 0.0)),
            min_length=int(_row_scalar(arrays, "min_length", row, 0)),
            # No seed: a fresh one per request, so unseeded sampling is not repeated across requests.
            # Several sequences of a seeded request: seed + sequence, so they differ reproducibly.
            random_seed=secrets.randbits(64) if seed is None else (int(seed) + sequence) & 0xFFFF_FFFF_FFFF_FFFF,
        )
        try:
            stop_words = parse_word_list(_row(arrays.get("stop_words_list"), row), "stop_words_list")
            bad_words = parse_word_list(_row(arrays.get("bad_words_list"), row), "bad_words_list")
        except ValueError as exc:
            raise RequestRejected(f"{exc}{where}") from exc
        bias = _row(arrays.get("embedding_bias"), row)
        guide_type = _row_text(arrays, "guided_decoding_guide_type", row)
        guide_text = _row_text(arrays, "guided_decoding_guide", row)
        if guide_text is not None and guide_type is None:
            raise RequestRejected(f"guided_decoding_guide: sent without guided_decoding_guide_type{where}")
        engine_id = uuid.uuid4().hex
        generation = GenerationRequest(
            request_id=engine_id,
            input_ids=prompt,
            max_new_tokens=int(output_len),
            end_id=None if end_id is None else int(end_id),
            pad_id=_row_scalar(arrays, "pad_id", row, None),
            sampling=sampling,
            stop_words=stop_words,
            bad_words=bad_words,
            beam_width=int(_row_scalar(arrays, "beam_width", row, 1)),
            return_log_probs=bool(_row_scalar(arrays, "return_log_probs", row, False)),
            # NVIDIA's preprocessing sends an empty bias when none was asked for.
            embedding_bias=bias.reshape(-1).astype(np.float32).tolist() if bias is not None and bias.size else None,
            return_context_logits=bool(_row_scalar(arrays, "return_context_logits", row, False)),
            return_generation_logits=bool(_row_scalar(arrays, "return_generation_logits", row, False)),
            guide=Guide(guide_type, guide_text) if guide_type is not None else None,
            lora_task_id=_optional_int(_row_scalar(arrays, "lora_task_id", row, None)),
        )
        try:
            self.engine.validate(generation)  # refusals raise here, before the sender is taken
        except RequestRejected as exc:
            raise RequestRejected(f"{exc}{where}") from exc
        streaming = bool(_row_scalar(arrays, "streaming", row, False))
        exclude_input = bool(_row_scalar(arrays, "exclude_input_in_output", row, self.settings.exclude_input_in_output))
        flight = _InFlight(
            engine_id=engine_id,
            triton_id=triton_id,
            sender=None,  # set once every generation of the request is accepted
            lane=lane,
            streaming=streaming,
            exclude_input=exclude_input,
            want_log_probs=generation.return_log_probs,
            outputs=requested,
            history=deque(prompt[-self.prefix_window :], maxlen=self.prefix_window),
            group=group,
            generation=generation,
            batch_index=batch_index,
            sequence_index=sequence_index,
            want_perf=bool(_row_scalar(arrays, "return_perf_metrics", row, False)),
            arrival_ns=arrival_ns,
            prompt=prompt if not (streaming or exclude_input) else [],
            interval=IntervalBuffer(self.settings.stream_interval) if streaming and self.settings.stream_interval > 1 else None,
        )
        return flight, generation

    def _forget(self, flight: _InFlight) -> None:
        with self._lock:
            self._in_flight.pop(flight.engine_id, None)
            flight.lane.flights.pop(flight.engine_id, None)
            engine_ids = self._by_triton_id.get(flight.triton_id)
            if engine_ids and flight.engine_id in engine_ids:
                engine_ids.remove(flight.engine_id)
                if not engine_ids:
                    del self._by_triton_id[flight.triton_id]

    @staticmethod
    def _fail(sender, message: str, *, final: bool = True) -> None:
        # Not final: another generation of the same request is still running (batch / n > 1).
        sender.send(
            pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message)),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0,
        )

    # ------------------------------------------------------- engine -> responses
    def _on_output(self, flight: _InFlight, output: GenerationOutput) -> None:
        """Engine thread: only queue; the request's lane builds and sends, one response per output."""
        if flight.want_perf and output.token_ids:
            now = time.monotonic_ns()
            flight.first_token_ns = flight.first_token_ns or now
            flight.last_token_ns = now
        if flight.interval is not None:
            output = flight.interval.admit(output)
            if output is None:
                return
        lane = flight.lane
        with lane.cond:
            lane.outputs.append((flight, output))
            lane.cond.notify()

    def _send_loop(self, lane: _Lane) -> None:
        merge = self.settings.merge_responses
        next_check = time.monotonic() + CANCEL_CHECK_PERIOD_S
        while True:
            with lane.cond:
                while not lane.outputs and not self._stopping.is_set():
                    remaining = next_check - time.monotonic()
                    if remaining <= 0:
                        break
                    lane.cond.wait(remaining)
                if not lane.outputs and self._stopping.is_set():
                    return
                outputs, lane.outputs = lane.outputs, deque()
            # A helper's locals die when it returns: a finished request's response sender must not
            # outlive its final response (Triton unloads the model only once every sender is gone).
            if outputs:
                self._send_outputs(lane, outputs, merge)
            del outputs
            if time.monotonic() >= next_check:
                self._check_cancellations(lane)
                next_check = time.monotonic() + CANCEL_CHECK_PERIOD_S

    def _send_outputs(self, lane: _Lane, outputs, merge: bool) -> None:
        if merge:
            batches = [(*entry, None) for entry in _merged(outputs)]  # logits only travel unmerged
        else:
            batches = [(f, o.token_ids, o.log_probs or [], o if o.finished else None, o) for f, o in outputs]
        for flight, tokens, log_probs, finish, output in batches:
            if output is not None:
                if output.context_logits is not None:
                    flight.context_logits = output.context_logits
                if output.generation_logits is not None:
                    flight.generation_logits.append(output.generation_logits)
            try:
                self._respond(flight, tokens, log_probs, finish)
            except Exception:
                log.exception("sending a response failed; cancelling request %s", flight.engine_id)
                self.engine.cancel(flight.engine_id)
                if finish is not None:
                    # _respond counted this generation as finished: end the request visibly.
                    try:
                        self._fail(flight.sender, "tensorrt_llm (PyTorch stand-in): building the response failed", final=flight.group.remaining == 0)
                    except Exception:
                        log.exception("sending the error response failed for %s", flight.engine_id)
            if finish is not None:
                flight.finished = True
                flight.sender = None  # released: see _send_loop
                lane.flights.pop(flight.engine_id, None)
                self._forget(flight)
                if finish.finish_reason is FinishReason.CANCELLED:
                    try:
                        self._cancelled_counter.increment(1)
                    except Exception:
                        log.exception("updating %s failed", CANCELLED_REQUESTS_METRIC)

    def _update_nvidia_metrics(self) -> None:
        limits = self.settings.limits
        self._nvidia_metrics.update(
            engine_values(
                running=self.engine.running_requests,
                waiting=self.engine.waiting_requests,
                slots=limits.max_batch_size,
                all_slots=self._all_slots,
                tokens_per_slot=limits.max_input_len + limits.max_output_len,
                iterations=self.engine.iterations,
            )
        )

    def _watch_loop(self) -> None:
        """Now and then: refresh the gauges, only when the engine changed. Each metric call is an IPC
        round trip that blocks for good if tritonserver vanishes meanwhile (see stub_watch.py), so an
        idle instance makes none."""
        last = None
        while not self._stopping.wait(CANCEL_CHECK_PERIOD_S):
            engine = self.engine
            guides = engine.guides.stats() if engine.guides is not None else None
            state = (engine.active_requests, engine.running_requests, engine.waiting_requests, engine.iterations, guides)
            if state == last:
                continue
            try:  # a metrics failure must not stop the updates
                self._active_gauge.set(state[0])
                self._update_nvidia_metrics()
                if guides is not None:
                    self._guide_metrics.update(guides)
                last = state
            except Exception:
                log.exception("updating the metrics failed")

    def _check_cancellations(self, lane: _Lane) -> None:
        """On the lane's own thread (see _Lane.flights); a helper, so no sender stays referenced."""
        with self._lock:
            watched = list(lane.flights.values())
        for flight in watched:
            sender = flight.sender
            try:
                if sender is not None and not flight.finished and sender.is_cancelled():
                    self.engine.cancel(flight.engine_id)
            except Exception:
                log.exception("checking cancellation of %s failed", flight.engine_id)

    def _extras(self, flight: _InFlight, *, streaming: bool) -> ResponseExtras:
        """batch_index, sequence_index, logits and perf metrics, as far as this request has them."""
        generation = flight.generation
        if not (
            flight.batch_index is not None
            or flight.sequence_index is not None
            or flight.want_perf
            or (generation is not None and (generation.return_context_logits or generation.return_generation_logits))
        ):
            return NO_EXTRAS
        generation_logits = None
        if generation is not None and generation.return_generation_logits:
            generation_logits = generation_logits_array(
                flight.generation_logits, self.engine.vocab_size, streaming=streaming, max_new_tokens=generation.max_new_tokens
            )
            flight.generation_logits = []
        perf = None
        if flight.want_perf:
            scheduled = (generation.first_scheduled_ns if generation is not None else None) or flight.arrival_ns
            perf = PerfMetrics(
                arrival_time_ns=flight.arrival_ns,
                first_scheduled_time_ns=scheduled,
                first_token_time_ns=flight.first_token_ns or scheduled,
                last_token_time_ns=flight.last_token_ns or scheduled,
            )
        return ResponseExtras(
            batch_index=flight.batch_index,
            sequence_index=flight.sequence_index,
            context_logits=flight.context_logits,
            generation_logits=generation_logits,
            perf=perf,
        )

    def _respond(self, flight: _InFlight, tokens: list[int], log_probs: list[float], finish: GenerationOutput | None) -> None:
        # The request's last generation to finish carries the final flag (one generation: its own).
        last = finish is not None and flight.group.finish_one()
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0
        if finish is not None and finish.finish_reason is FinishReason.ERROR:
            self._fail(flight.sender, finish.error or "tensorrt_llm (PyTorch stand-in): request failed", final=last)
            return
        if not flight.want_log_probs:
            log_probs = []
        if flight.streaming:
            if tokens:
                prefix = list(flight.history)
                flight.history.extend(tokens)
                flight.cum_log_prob += float(sum(log_probs))
                response = self._response(
                    flight.outputs, tokens, log_probs, flight.cum_log_prob, prefix, len(tokens), self._extras(flight, streaming=True)
                )
                flight.sender.send(response, flags=flags)
            elif last:
                flight.sender.send(flags=flags)
            elif finish is not None:
                # Another generation of the request still runs: this one's end, with no new tokens.
                response = self._response(flight.outputs, [], [], flight.cum_log_prob, [], 0, self._extras(flight, streaming=True))
                flight.sender.send(response, flags=0)
            return
        flight.sent_tokens.extend(tokens)
        flight.sent_log_probs.extend(log_probs)
        if finish is None:
            return
        if finish.finish_reason is FinishReason.CANCELLED:
            if last:
                # Not decoupled: the one response a request must get (a bare final flag is refused).
                flight.sender.send(None if self.decoupled else pb_utils.InferenceResponse(output_tensors=[]), flags=flags)
            return
        cum = float(sum(flight.sent_log_probs))
        extras = self._extras(flight, streaming=False)
        if flight.exclude_input:
            response = self._response(
                flight.outputs, flight.sent_tokens, flight.sent_log_probs, cum, list(flight.history), len(flight.sent_tokens), extras
            )
        else:
            # Prompt first; log-probs still cover the generated tokens only.
            response = self._response(
                flight.outputs, flight.prompt + flight.sent_tokens, flight.sent_log_probs, cum, [], len(flight.sent_tokens), extras
            )
        flight.sender.send(response, flags=flags)

    @staticmethod
    def _response(*args):
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, array) for name, array in response_arrays(*args)]
        )

    def finalize(self) -> None:
        if self._world is not None:
            self._world.close()
        self.engine.shutdown()  # ends what is left with an error response, queued on the lanes
        self._stopping.set()
        for lane in self._lanes:
            with lane.cond:
                lane.cond.notify_all()
        for lane in self._lanes:
            if lane.thread is not None:
                lane.thread.join(timeout=2)
        self._watcher.join(timeout=1)
        self._stop_relay.close()
        try:
            self._nvidia_metrics.withdraw()
        except Exception:
            log.exception("withdrawing the nv_trt_llm metrics failed")
        self._parent_watch.finalized()  # tritonserver waits for this stub's exit without a timeout


def _response_pace(settings: StandinSettings) -> str:
    pace = "merged responses" if settings.merge_responses else "one response per token"
    return pace if settings.stream_interval == 1 else f"{pace}, streamed every {settings.stream_interval} steps"


def _optional_int(value) -> int | None:
    return None if value is None else int(value)


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
