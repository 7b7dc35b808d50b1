"""Shared gRPC streaming plumbing for the two Triton targets (engine model, ensemble)."""

from __future__ import annotations

import itertools
from typing import Any, AsyncIterator

import numpy as np

from trtllm_truss.bench.targets.base import TargetError


def grpc_address(url: str) -> str:
    """tritonclient wants `host:port`; accept `grpc://host:port` too."""
    for prefix in ("grpc://", "http://"):
        if url.startswith(prefix):
            return url[len(prefix):]
    return url


class TritonModelStream:
    """One `tritonclient.grpc.aio` client shared by every request of a target; one gRPC stream per
    request (Triton ends the stream after the request's final response)."""

    def __init__(self, url: str, model_name: str):
        self.url = url
        self.model_name = model_name
        self._client: Any = None
        self.batched = False
        self.input_names: set[str] = set()
        self.output_names: set[str] = set()
        self._ids = itertools.count()

    async def open(self) -> None:
        import tritonclient.grpc.aio as grpcclient  # imported here: the http target does not need it

        self._client = grpcclient.InferenceServerClient(grpc_address(self.url))
        try:
            config = await self._model_config()
        except BaseException:
            await self.close()
            raise
        # With max_batch_size > 0 every tensor carries a leading batch dimension of 1.
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self.input_names = {t["name"] for t in config.get("input", [])}
        self.output_names = {t["name"] for t in config.get("output", [])}

    async def _model_config(self) -> dict:
        try:
            ready = await self._client.is_model_ready(self.model_name)
        except Exception as exc:  # connection refused surfaces as InferenceServerException
            raise TargetError(f"Triton at {self.url} is not reachable: {exc}") from exc
        if not ready:
            raise TargetError(f"Triton at {self.url}: model '{self.model_name}' is not ready")
        return (await self._client.get_model_config(self.model_name, as_json=True))["config"]

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def require_inputs(self, names: list[str]) -> None:
        missing = [n for n in names if n not in self.input_names]
        if missing:
            raise TargetError(
                f"Triton at {self.url}: model '{self.model_name}' has no input(s) {', '.join(missing)}"
                f" (it has {', '.join(sorted(self.input_names))})"
            )

    def ignore_eos_inputs(self, ignore_eos: str, output_len: int) -> list[Any]:
        """What makes the engine generate exactly `output_len` tokens (NVIDIA's names, both models)."""
        if ignore_eos == "min_length":
            return [self.tensor("min_length", np.array([output_len], dtype=np.int32))]
        if ignore_eos == "end_id":
            return [self.tensor("end_id", np.array([-1], dtype=np.int32))]
        return []

    def tensor(self, name: str, values: np.ndarray) -> Any:
        import tritonclient.grpc.aio as grpcclient

        array = values[np.newaxis, ...] if self.batched else values
        datatype = {np.dtype(np.int32): "INT32", np.dtype(np.bool_): "BOOL", np.dtype(np.object_): "BYTES"}[
            array.dtype
        ]
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        return tensor

    async def stream(self, inputs: list[Any], outputs: list[str]) -> AsyncIterator[Any]:
        """Yield each `InferResult` of one request; a Triton error raises. Closing the generator
        early cancels the gRPC stream, which cancels the request in Triton."""
        import tritonclient.grpc.aio as grpcclient

        request = {
            "model_name": self.model_name,
            "inputs": inputs,
            "outputs": [grpcclient.InferRequestedOutput(n) for n in outputs],
            "request_id": f"bench-{next(self._ids)}",
        }

        async def one_request():
            yield request

        responses = self._client.stream_infer(one_request())
        try:
            async for result, error in responses:
                if error is not None:
                    raise RuntimeError(f"Triton error from '{self.model_name}': {error}")
                yield result
        finally:
            responses.cancel()


def output_shape(result: Any, name: str) -> list[int] | None:
    """Shape of an output from the response header, without deserializing its data."""
    tensor = result.get_output(name)
    return None if tensor is None else list(tensor.shape)
