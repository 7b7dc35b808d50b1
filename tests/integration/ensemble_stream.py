"""A small tritonclient.grpc helper: many ensemble requests on one bidirectional stream.

Responses are collected per request id until Triton's final flag (`enable_empty_final_response`),
taking the payload of a final response that also carries data.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from engine_wire import first_event, raw_inputs

_DTYPES = {bool: ("BOOL", np.bool_), int: ("INT32", np.int32), float: ("FP32", np.float32)}


def ensemble_inputs(prompt: str, max_tokens: int, *, stream: bool, **options: Any) -> list[grpcclient.InferInput]:
    """Inputs with NVIDIA's names; `bad_words`/`stop_words` take lists, `random_seed` an int (UINT64).
    `exclude_input_in_output` defaults to true here (the repository's default is NVIDIA's false)."""
    options.setdefault("exclude_input_in_output", True)
    inputs = []

    def add(name: str, datatype: str, array: np.ndarray) -> None:
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)

    add("text_input", "BYTES", np.array([[prompt.encode("utf-8")]], dtype=np.object_))
    add("max_tokens", "INT32", np.array([[max_tokens]], dtype=np.int32))
    add("stream", "BOOL", np.array([[stream]], dtype=np.bool_))
    for name, value in options.items():
        if name in ("bad_words", "stop_words"):
            add(name, "BYTES", np.array([[w.encode("utf-8") for w in value]], dtype=np.object_))
        elif name == "random_seed":
            add(name, "UINT64", np.array([[value]], dtype=np.uint64))
        else:
            datatype, dtype = _DTYPES[type(value)]
            add(name, datatype, np.array([[value]], dtype=dtype))
    return inputs


@dataclass
class StreamResult:
    chunks: list[str] = field(default_factory=list)
    error: str | None = None
    done: bool = False
    first_at: float | None = None
    last_at: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.chunks)


def run_on_stream(
    url: str, requests: dict[str, list[grpcclient.InferInput]], *, timeout_s: float = 120.0
) -> dict[str, StreamResult]:
    """Send every request on one stream and wait (polling a queue, bounded) for all to finish."""
    events: queue.Queue = queue.Queue()
    results = {request_id: StreamResult() for request_id in requests}
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: events.put((result, error, time.monotonic())))
    try:
        for request_id, inputs in requests.items():
            client.async_stream_infer("ensemble", inputs, request_id=request_id, enable_empty_final_response=True)
        deadline = time.monotonic() + timeout_s
        pending = set(requests)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{len(pending)} of {len(requests)} streams unfinished after {timeout_s} s")
            try:
                result, error, at = events.get(timeout=remaining)
            except queue.Empty:
                continue
            if error is not None:
                # An error response carries no id we can rely on; fail loudly with the server's message.
                raise AssertionError(f"stream error: {error}")
            response = result.get_response()
            state = results[response.id]
            text = result.as_numpy("text_output")
            if text is not None:
                state.chunks.extend(t.decode("utf-8") for t in text.reshape(-1))
                state.first_at = state.first_at or at
                state.last_at = at
            if response.parameters["triton_final_response"].bool_param:
                state.done = True
                pending.discard(response.id)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    return results


def stop_engine_request(url: str, request_id: str, *, timeout_s: float = 30.0) -> None:
    """NVIDIA's cancellation contract: a request to `tensorrt_llm` with `stop=true` and the same
    request id ends the in-flight generation (the ensemble gives its steps the ensemble's id).

    Needed because Triton propagates an ensemble's cancellation only to steps scheduled after it,
    never to an in-flight decoupled step (triton core, ensemble_scheduler.cc ScheduleSteps)."""
    inputs = raw_inputs({
        "input_ids": np.zeros((1, 1), dtype=np.int32),
        "input_lengths": np.ones((1, 1), dtype=np.int32),
        "request_output_len": np.ones((1, 1), dtype=np.int32),
        "stop": np.ones((1, 1), dtype=np.bool_),
    })
    _response, error = first_event(url, inputs, request_id=request_id, timeout_s=timeout_s, enable_empty_final_response=True)
    if error is not None:
        raise AssertionError(f"stop request failed: {error}")
