"""Raw `tensorrt_llm` requests over gRPC, for tests that call the engine model directly (not the ensemble).

`raw_inputs` builds the input tensors from name -> numpy array (NVIDIA's names; the dtype gives Triton's
datatype), `first_event` / `request_error` send one request on a stream of its own and read its first
answer, and `Stream` keeps one stream open for many requests and collects their responses.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Mapping

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

ENGINE_MODEL = "tensorrt_llm"


def raw_inputs(arrays: Mapping[str, np.ndarray]) -> list[grpcclient.InferInput]:
    """One InferInput per array, in order: INT32, BOOL, BYTES (object arrays of bytes), UINT64, FP32..."""
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def engine_inputs(ids: list[int], max_tokens: int, *, streaming: bool = True, stop: bool | None = None) -> list:
    """One row of prompt token ids, with NVIDIA's `streaming` and (when given) `stop`."""
    arrays = {
        "input_ids": np.array([ids], dtype=np.int32),
        "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[max_tokens]], dtype=np.int32),
        "streaming": np.array([[streaming]], dtype=np.bool_),
    }
    if stop is not None:
        arrays["stop"] = np.array([[stop]], dtype=np.bool_)
    return raw_inputs(arrays)


def first_event(
    url: str, inputs: list, *, request_id: str = "", timeout_s: float = 60.0, enable_empty_final_response: bool = False
) -> tuple[object, object]:
    """(result, error) of the first answer to one request, sent on a stream of its own; the stream is
    then half-closed (not cancelled): Triton ends the request."""
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        client.async_stream_infer(
            ENGINE_MODEL, inputs, request_id=request_id, enable_empty_final_response=enable_empty_final_response
        )
        return events.get(timeout=timeout_s)
    finally:
        client.stop_stream()
        client.close()


def request_error(url: str, inputs: list, *, request_id: str = "", timeout_s: float = 60.0):
    """The error the first answer to one request carries (None when it is a response)."""
    _result, error = first_event(url, inputs, request_id=request_id, timeout_s=timeout_s)
    return error


class Stream:
    """One gRPC stream to `tensorrt_llm`; responses per request id until the final flag."""

    def __init__(self, url: str) -> None:
        self.events: queue.Queue = queue.Queue()
        # A channel of its own: grpc shares sockets between channels, and another client closing
        # its channel could tear down this stream.
        self.client = grpcclient.InferenceServerClient(url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
        self.client.start_stream(callback=lambda result, error: self.events.put((result, error)))

    def send(self, request_id: str, inputs: list) -> None:
        self.client.async_stream_infer(ENGINE_MODEL, inputs, request_id=request_id, enable_empty_final_response=True)

    def collect(self, ids: set[str], timeout_s: float) -> dict[str, list]:
        """request id -> list of (token ids of each data response), until every id got its final response."""
        out: dict[str, list] = {i: [] for i in ids}
        pending = set(ids)
        deadline = time.monotonic() + timeout_s
        while pending:
            try:
                result, error = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no final response for {sorted(pending)} within {timeout_s} s: {out}") from None
            assert error is None, error.message()
            response = result.get_response()
            tokens = result.as_numpy("output_ids")
            if tokens is not None:
                out[response.id].append(tokens.reshape(-1).tolist())
            if response.parameters["triton_final_response"].bool_param:
                pending.discard(response.id)
        return out

    def close(self) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()
