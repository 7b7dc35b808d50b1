"""Target `ensemble`: the Triton ensemble (preprocessing -> tensorrt_llm -> postprocessing) over gRPC
streaming, text in and text out with NVIDIA's user-facing tensor names. Where the ensemble also has
a `sequence_length` output (this project's ensemble adds it beside `text_output`), tokens are
counted exactly from it; otherwise the text is re-tokenized after the run."""

from __future__ import annotations

from typing import AsyncIterator

import numpy as np

from trtllm_truss.engine import client
from trtllm_truss.bench.targets.base import IgnoreEos, StreamChunk, TargetName
from trtllm_truss.bench.targets.triton_grpc import TritonModelStream
from trtllm_truss.bench.workload import BenchRequest

ENSEMBLE_MODEL = "ensemble"
# The ensemble's per-response token count (our addition to NVIDIA's outputs, read by the proxy too).
TOKEN_COUNT_OUTPUT = client.TOKEN_COUNT_OUTPUT


class EnsembleTarget:
    name: TargetName = "ensemble"

    def __init__(self, grpc_url: str, ignore_eos: IgnoreEos = "min_length", model_name: str = ENSEMBLE_MODEL):
        self.url = grpc_url
        self.ignore_eos = ignore_eos
        self._triton = TritonModelStream(grpc_url, model_name)
        self._counts_tokens = False

    async def open(self) -> None:
        await self._triton.open()
        needed = ["text_input", "max_tokens", "stream"]
        if self.ignore_eos != "none":
            needed.append(self.ignore_eos)
        self._triton.require_inputs(needed)
        self._counts_tokens = TOKEN_COUNT_OUTPUT in self._triton.output_names

    async def close(self) -> None:
        await self._triton.close()

    def build_inputs(self, request: BenchRequest) -> list:
        t = self._triton
        one = lambda v: np.array([v], dtype=np.int32)  # noqa: E731 - shape [1] scalars of the interface
        inputs = [
            t.tensor("text_input", np.array([request.prompt.encode("utf-8")], dtype=np.object_)),
            t.tensor("max_tokens", one(request.output_len)),
            t.tensor("stream", np.array([True])),
        ]
        return inputs + t.ignore_eos_inputs(self.ignore_eos, request.output_len)

    async def stream(self, request: BenchRequest) -> AsyncIterator[StreamChunk]:
        outputs = ["text_output", TOKEN_COUNT_OUTPUT] if self._counts_tokens else ["text_output"]
        async for result in self._triton.stream(self.build_inputs(request), outputs):
            data = result.as_numpy("text_output")
            text = "" if data is None else "".join(
                v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in data.reshape(-1)
            )
            count = None
            if self._counts_tokens:
                counts = result.as_numpy(TOKEN_COUNT_OUTPUT)
                count = 0 if counts is None else int(counts.sum())
            yield StreamChunk(token_count=count, text=text)
