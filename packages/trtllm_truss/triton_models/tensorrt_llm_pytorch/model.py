"""Triton python-backend model `tensorrt_llm` (decoupled): the PyTorch engine stand-in.

Speaks NVIDIA's `tensorrt_llm` tensor interface so the ensemble and NVIDIA's core-model clients work
unchanged; the engine itself is `trtllm_truss.engine_standin` (continuous batching, independent of
Triton). See STANDIN_MODEL_INTERFACE for the exact tensors and parameters read here.

This module keeps the model's lifecycle (initialize / execute / finalize, metrics, the watch thread, stop
requests across instances) and its wiring; a request's tensors are read into engine requests by
`engine_standin/request_inputs.py`, and the responses are built and sent by the sender lanes of
`engine_standin/senders.py`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections import deque

import triton_python_backend_utils as pb_utils
from trtllm_truss.engine_standin import (
    EngineBase,
    GenerationRequest,
    RequestRejected,
    StandinSettings,
    build_engine,
)
from trtllm_truss.engine_standin.guide_metrics import GuideCacheMetrics
from trtllm_truss.engine_standin.settings import checkpoint_eos_token_id
from trtllm_truss.engine_standin.nvidia_metrics import NvidiaMetrics, engine_values
from trtllm_truss.engine_standin.request_inputs import (
    STOP_WITHOUT_ID_ERROR,
    read_generation,
    read_rows,
    request_scalar,
)
from trtllm_truss.engine_standin.responses import ENGINE_OUTPUT_NAMES
from trtllm_truss.engine_standin.senders import (
    CANCEL_CHECK_PERIOD_S,
    Group,
    InFlight,
    Senders,
    accept_each,
    fail,
)
from trtllm_truss.engine_standin.stop_relay import StopRelay
from trtllm_truss.engine_standin.stream_interval import IntervalBuffer
from trtllm_truss.engine_standin.world import join_world
from trtllm_truss.runtime.kv_event_relay import relay_from_environment
from trtllm_truss.runtime.stub_watch import watch_parent

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
  startup and mixed row by row in every batch), lora_max_loras (different adapters per engine step),
  guided_decoding_backend (xgrammar (default) | llguidance | none: the grammar engine of guided requests),
  guided_whitespace (compact (default) | flexible: runtime.pytorch.guided_whitespace), tokens_per_block,
  enable_kv_cache_reuse, max_tokens_in_paged_kv_cache, event_buffer_max_size (the paged KV block pool,
  engine_standin/kv_blocks.py), synthetic_prefill_time_per_token_ms.

Responses: one per generation (row x sequence) per engine step, as NVIDIA's engine sends them; the
final flag comes with the last generation's last response; a sender that falls
behind queues them in order (merge_responses=true instead merges the waiting tokens of a request
into one response). Several instances (instance_group count) each run their own engine with a
share of max_batch_size; a `send()` is an IPC round trip to tritonserver, so more instances and
sender threads offer more responses per second.
"""

log = logging.getLogger("tensorrt_llm_pytorch")

ACTIVE_REQUESTS_METRIC = "trtllm_standin_active_requests"
# Requests that ended because their client cancelled them (stream closed, or NVIDIA's `stop` input):
# tells a freed slot apart from a generation that simply finished.
CANCELLED_REQUESTS_METRIC = "trtllm_standin_cancelled_requests_total"


def _instance_position(args: dict, model_config: dict) -> tuple[int, int]:
    """(this instance's index, instances of the model). Triton names instances `<group>_<n>`."""
    count = sum(int(group.get("count", 1)) for group in model_config.get("instance_group", [])) or 1
    try:
        index = int(str(args.get("model_instance_name", "")).rsplit("_", 1)[1])
    except (IndexError, ValueError):
        index = 0
    return min(index, count - 1), count


def _world_join_timeout_s() -> float:
    from trtllm_truss.runtime.cluster import DEFAULT_NODE_WAIT_S, NODE_WAIT_ENV

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
        self.default_end_id = checkpoint_eos_token_id(self.settings.model_dir)
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

        self._lock = threading.Lock()  # guards the two maps below (and every lane's flights)
        self._in_flight: dict[str, InFlight] = {}
        self._by_triton_id: dict[str, list[str]] = {}  # Triton id -> its generations' engine ids
        self._stopping = threading.Event()
        self._senders = Senders(
            pb_utils, self.engine, count=self.settings.sender_threads, merge=self.settings.merge_responses,
            decoupled=self.decoupled, lock=self._lock, stopping=self._stopping, forget=self._forget,
            count_cancelled=self._count_cancelled,
        )
        self._senders.start()
        self._watcher = threading.Thread(target=self._watch_loop, name="tensorrt_llm-watch", daemon=True)
        self._watcher.start()
        self._stop_relay = StopRelay(args["model_name"], self.instance_index, self.instance_count, self._stop_local)
        self._parent_watch = watch_parent(instance_name)  # ends this stub if tritonserver goes (runtime/stub_watch.py)
        # In a fleet: the engine's KV cache events to the replica's Dynamo worker (runtime/kv_event_relay.py).
        events = getattr(self.engine, "kv_events", None)
        self._kv_relay = relay_from_environment(
            events.drain if getattr(events, "enabled", False) else None, name=f"kv-events-{self.instance_index}")
        log.info(
            "PyTorch stand-in instance %d/%d ready (%s, %d sequence slots, %d sender threads, %s)",
            self.instance_index + 1,
            self.instance_count,
            "synthetic" if self.settings.synthetic else self.settings.model_dir,
            share,
            len(self._senders.lanes),
            _response_pace(self.settings),
        )

    # ------------------------------------------------------------------ requests
    def execute(self, requests):
        accept_each(pb_utils, requests, self._accept, "tensorrt_llm (PyTorch stand-in)")

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
        if request_scalar(pb_utils, request, "stop", False):
            # NVIDIA's contract: a request with stop=true ends the in-flight request of the same id
            # (served by this instance or, with several instances, by a sibling) and gets one
            # empty final response; an unknown id is not an error (it may have finished already).
            if not triton_id:
                raise RequestRejected(STOP_WITHOUT_ID_ERROR)
            if not self._stop_local(triton_id):
                self._stop_relay.forward(triton_id)
            request.get_response_sender().send(pb_utils.InferenceResponse(output_tensors=[]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        # Every generation is built and validated before the sender is taken: a bad row fails the
        # whole request, as NVIDIA's backend refuses it before enqueueing any of its rows.
        shape = read_rows(pb_utils, request, decoupled=self.decoupled)
        flights: list[tuple[InFlight, GenerationRequest]] = []
        group = Group(sum(shape.sequences))
        lane = self._senders.next_lane()  # one lane: the sender is shared
        requested = frozenset(request.requested_output_names()) or ENGINE_OUTPUT_NAMES
        for row in range(shape.rows):
            for sequence in range(shape.sequences[row]):
                parsed = read_generation(
                    shape, row, sequence, default_end_id=self.default_end_id,
                    default_exclude_input=self.settings.exclude_input_in_output, validate=self.engine.validate,
                )
                generation, streaming = parsed.generation, parsed.streaming
                flight = InFlight(
                    engine_id=generation.request_id,
                    triton_id=triton_id,
                    sender=None,  # set once every generation of the request is accepted
                    lane=lane,
                    streaming=streaming,
                    exclude_input=parsed.exclude_input,
                    want_log_probs=generation.return_log_probs,
                    outputs=requested,
                    history=deque(parsed.prompt[-self.prefix_window :], maxlen=self.prefix_window),
                    group=group,
                    generation=generation,
                    batch_index=parsed.batch_index,
                    sequence_index=parsed.sequence_index,
                    want_perf=parsed.want_perf,
                    arrival_ns=shape.arrival_ns,
                    prompt=parsed.prompt if not (streaming or parsed.exclude_input) else [],
                    interval=IntervalBuffer(self.settings.stream_interval) if streaming and self.settings.stream_interval > 1 else None,
                )
                flights.append((flight, generation))
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
                self.engine.submit(generation, lambda output, f=flight: self._senders.on_output(f, output))
            except RequestRejected as exc:  # shutting down: the sender is taken, so answer through it
                for other, _ in flights[index:]:
                    self._forget(other)
                fail(pb_utils, sender, str(exc))
                for other, _ in flights[:index]:
                    self.engine.cancel(other.engine_id)
                return

    def _forget(self, flight: InFlight) -> None:
        with self._lock:
            self._in_flight.pop(flight.engine_id, None)
            flight.lane.flights.pop(flight.engine_id, None)
            engine_ids = self._by_triton_id.get(flight.triton_id)
            if engine_ids and flight.engine_id in engine_ids:
                engine_ids.remove(flight.engine_id)
                if not engine_ids:
                    del self._by_triton_id[flight.triton_id]

    def _count_cancelled(self) -> None:
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
        round trip that blocks for good if tritonserver vanishes meanwhile (see runtime/stub_watch.py), so an
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

    def finalize(self) -> None:
        if self._kv_relay is not None:
            self._kv_relay.close()
        if self._world is not None:
            self._world.close()
        self.engine.shutdown()  # ends what is left with an error response, queued on the lanes
        self._stopping.set()
        self._senders.join()
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
