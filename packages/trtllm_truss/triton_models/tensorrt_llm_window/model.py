"""Triton python-backend model `tensorrt_llm_window` (decoupled): relays `tensorrt_llm` and adds `prefix_ids`.

Why: stateless streaming detokenization needs, with each response, the ids that precede its tokens
(docs/design.md). NVIDIA's C++ `tensorrtllm` backend cannot send them: in streaming mode `output_ids`
carry only the new tokens, and no input asks for more (tensorrtllm_backend v0.19.0 and the
`triton_backend/` of TensorRT-LLM main read no "return all generated tokens" input, although the
executor has `Request::setReturnAllGeneratedTokens`). So on the GPU path the ensemble calls this relay,
which forwards each request unchanged to `tensorrt_llm` (BLS, same request id so NVIDIA's `stop`
requests still find it) and keeps, for the life of that one request only, the last few ids it has
seen. Any instance can serve any request: nothing is shared between requests or instances.

Inputs: whatever the ensemble sends for `tensorrt_llm` (passed through as they come).
Outputs: whatever the engine sent (`output_ids`, `sequence_length`, log probs, and when the request
asks for them logits, perf metrics, `batch_index`, `sequence_index`), plus `prefix_ids` INT32 [-1]: up
to `prefix_window_tokens` ids preceding this response's tokens (per batch row and sequence).
Parameters: `engine_model` (default tensorrt_llm), `prefix_window_tokens` (default 8),
`exclude_input_in_output` (the engine's default for requests that do not send the input),
`max_concurrent_streams` (default 64): engine streams relayed at once; more wait here, as they would
in the engine's queue (the engine runs at most max_batch_size sequences anyway). Bounding them keeps
the python backend's BLS machinery from being flooded by hundreds of simultaneous streams.

Known: python_backend's stub itself can deadlock when several threads run BLS streams at once (a lock-order
cycle between `exec`, its message thread and `next`; docs/deploy.md, "The window relay's deadlock"). The
stub's watchdog then ends it, and the stack's health probe, which goes through this relay when our routes
do, reads unhealthy.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils
from trtllm_truss.runtime.stub_watch import watch_parent

ENGINE_OUTPUTS = ["output_ids", "sequence_length", "cum_log_probs", "output_log_probs"]
# Sent by the engine only when a request asks for them (NVIDIA's fillTritonResponse).
ENGINE_OPTIONAL_OUTPUTS = [
    "context_logits",
    "generation_logits",
    "batch_index",
    "sequence_index",
    "kv_cache_alloc_new_blocks",
    "kv_cache_reused_blocks",
    "kv_cache_alloc_total_blocks",
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
]


def _scalar(inputs: dict, name: str, default):
    array = inputs.get(name)
    if array is None:
        return default
    array = array.reshape(-1)
    return array[0].item() if array.size else default


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        parameters = {k: v.get("string_value", "") for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        self.engine_model = parameters.get("engine_model") or "tensorrt_llm"
        self.window = int(parameters.get("prefix_window_tokens") or 8)
        self.default_exclude = (parameters.get("exclude_input_in_output") or "false").lower() == "true"
        self._active: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._streams = threading.BoundedSemaphore(int(parameters.get("max_concurrent_streams") or 64))
        # Finished engine response iterators not yet known to be cleaned up by the stub: (sequence, iterator).
        self._finished: list[tuple[int, object]] = []
        self._sequence = 0
        self._parent_watch = watch_parent(str(args.get("model_instance_name", "tensorrt_llm_window")))

    def execute(self, requests):
        # Decoupled: return at once; one relay thread per request streams the engine's responses.
        # Everything the thread needs is read (and copied) here: Triton releases a decoupled request
        # once execute() returns, so a thread must not touch the request object afterwards.
        for request in requests:
            inputs = {t.name(): np.array(t.as_numpy(), copy=True) for t in request.inputs()}
            job = (inputs, request.request_id(), request.get_response_sender())
            thread = threading.Thread(target=self._relay_guarded, args=job, daemon=True)
            with self._lock:
                self._active.add(thread)
            thread.start()

    def _relay_guarded(self, inputs: dict, request_id: str, sender) -> None:
        engine_streams: list = []  # the engine's response iterator, once exec() returned it
        error = None
        try:
            with self._streams:
                self._relay(inputs, request_id, sender, engine_streams)
        except Exception as exc:  # noqa: BLE001 -- the request fails alone, visibly
            error = exc
        try:
            self._release_after_cleanup(engine_streams, sender)
        finally:
            with self._lock:
                self._active.discard(threading.current_thread())
        if error is None:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        else:
            sender.send(
                pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"tensorrt_llm_window: {error}")),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )

    def _release_after_cleanup(self, engine_streams: list, sender) -> None:
        """Drop finished engine iterators only once the stub has cleaned them up.

        Why: when the stub's message thread performs the BLS cleanup of a finished iterator that Python
        no longer references, it frees the responses' numpy arrays without the GIL. Python 3.12 crashes
        on that (python_backend fixed it in r24.12, "Hold GIL when deleting numpy array"; the stub of
        nvidia-pytriton 0.7.0 is r24.10). That thread handles its queue in order and `is_cancelled()`
        waits for its own turn in it, so after one answered `is_cancelled()` every cleanup queued
        before it is done and Python holds the last reference, released here with the GIL.
        """
        for stream in engine_streams:
            for _ in stream:  # a stream left early (an error): consume to its end, which queues its cleanup
                pass
        with self._lock:
            for stream in engine_streams:
                self._sequence += 1
                self._finished.append((self._sequence, stream))
            mark = self._sequence
        engine_streams.clear()
        if sender.is_cancelled():
            return  # a cached answer, no round trip: a later request releases these
        with self._lock:
            released = [stream for sequence, stream in self._finished if sequence <= mark]
            self._finished = [(sequence, stream) for sequence, stream in self._finished if sequence > mark]
        del released  # the last references: the iterators and their tensors are freed here, with the GIL

    def _relay(self, inputs: dict, request_id: str, sender, engine_streams: list) -> None:
        input_ids = inputs.get("input_ids")
        rows = input_ids.reshape(input_ids.shape[0], -1) if input_ids is not None and input_ids.ndim >= 2 else np.zeros((1, 0), dtype=np.int32)
        lengths = inputs.get("input_lengths")
        lengths = lengths.reshape(-1).tolist() if lengths is not None else [rows.shape[1]] * rows.shape[0]
        prompts = [rows[i, : int(lengths[i] if i < len(lengths) else rows.shape[1])].tolist() for i in range(rows.shape[0])]
        streaming = bool(_scalar(inputs, "streaming", False))
        exclude = bool(_scalar(inputs, "exclude_input_in_output", self.default_exclude))
        engine_request = pb_utils.InferenceRequest(
            model_name=self.engine_model,
            inputs=[pb_utils.Tensor(name, array) for name, array in inputs.items()],
            requested_output_names=ENGINE_OUTPUTS + ENGINE_OPTIONAL_OUTPUTS,
            request_id=request_id,
        )
        # Per (batch row, sequence): prompt + tokens so far; lives only in this call.
        histories: dict[tuple[int, int], list[int]] = {}
        responses = engine_request.exec(decoupled=True)
        engine_streams.append(responses)
        for response in responses:
            if response.has_error():
                raise RuntimeError(response.error().message())
            outputs = response.output_tensors()
            if not outputs:
                continue  # the engine's flag-only final response
            by_name = {t.name(): t for t in outputs}
            row = int(by_name["batch_index"].as_numpy().reshape(-1)[0]) if "batch_index" in by_name else 0
            sequence = int(by_name["sequence_index"].as_numpy().reshape(-1)[0]) if "sequence_index" in by_name else 0
            prompt = prompts[row] if row < len(prompts) else []
            history = histories.setdefault((row, sequence), list(prompt))
            tokens = by_name["output_ids"].as_numpy()
            first_beam = tokens.reshape(-1, tokens.shape[-1])[0] if tokens.size else np.zeros(0, dtype=np.int32)
            count = int(by_name["sequence_length"].as_numpy().reshape(-1)[0]) if "sequence_length" in by_name else first_beam.size
            new = first_beam[: max(0, min(count, first_beam.size))].tolist()
            if streaming:
                prefix = history[-self.window :] if self.window else []
                history.extend(new)
            else:
                # One response: it starts with the prompt unless the prompt is excluded.
                prefix = prompt[-self.window :] if exclude and self.window else []
            prefix_tensor = pb_utils.Tensor("prefix_ids", np.asarray(prefix, dtype=np.int32).reshape(1, len(prefix)))
            sender.send(pb_utils.InferenceResponse(output_tensors=[*outputs, prefix_tensor]))

    def finalize(self) -> None:
        with self._lock:
            active = list(self._active)
        for thread in active:
            thread.join(timeout=5.0)
        self._parent_watch.finalized()
