"""Target `engine`: the `tensorrt_llm` model directly, token ids in and out over gRPC streaming,
with NVIDIA's tensor names. Output tokens are counted exactly from `output_ids` (in streaming mode
each response carries only its new tokens)."""

from __future__ import annotations

from typing import AsyncIterator

import numpy as np

from trtllm_truss.bench.targets.base import IgnoreEos, StreamChunk, TargetName
from trtllm_truss.bench.targets.triton_grpc import TritonModelStream, output_shape
from trtllm_truss.bench.workload import BenchRequest

ENGINE_MODEL = "tensorrt_llm"


class EngineTarget:
    name: TargetName = "engine"

    def __init__(
        self, grpc_url: str, ignore_eos: IgnoreEos = "min_length", model_name: str = ENGINE_MODEL,
        guides: list[str] | None = None,
    ):
        self.url = grpc_url
        self.ignore_eos = ignore_eos
        self._triton = TritonModelStream(grpc_url, model_name)
        # JSON Schemas (NVIDIA's guided_decoding_guide_type json_schema): request i uses guides[i % n].
        self.guides = guides
        if guides:
            self.name = "engine_guided"

    async def open(self) -> None:
        await self._triton.open()
        needed = ["input_ids", "input_lengths", "request_output_len", "streaming"]
        if self.ignore_eos != "none":
            needed.append(self.ignore_eos)
        if self.guides:
            needed += ["guided_decoding_guide_type", "guided_decoding_guide"]
        self._triton.require_inputs(needed)

    async def close(self) -> None:
        await self._triton.close()

    def build_inputs(self, request: BenchRequest) -> list:
        t = self._triton
        one = lambda v: np.array([v], dtype=np.int32)  # noqa: E731 - shape [1] scalars of the interface
        inputs = [
            t.tensor("input_ids", np.asarray(request.input_ids, dtype=np.int32)),
            t.tensor("input_lengths", one(request.input_len)),
            t.tensor("request_output_len", one(request.output_len)),
            t.tensor("streaming", np.array([True])),
        ]
        if self.guides:
            guide = self.guides[request.index % len(self.guides)]
            inputs.append(t.tensor("guided_decoding_guide_type", np.array([b"json_schema"], dtype=object)))
            inputs.append(t.tensor("guided_decoding_guide", np.array([guide.encode("utf-8")], dtype=object)))
        return inputs + t.ignore_eos_inputs(self.ignore_eos, request.output_len)

    async def stream(self, request: BenchRequest) -> AsyncIterator[StreamChunk]:
        async for result in self._triton.stream(self.build_inputs(request), ["output_ids"]):
            shape = output_shape(result, "output_ids")
            # [beams, tokens] or [batch, beams, tokens]: the last dimension counts new tokens.
            yield StreamChunk(token_count=shape[-1] if shape else 0)
