"""gRPC clients of the engine model itself (`tensorrt_llm`), as the stream workers use them: token ids
in and out over NVIDIA's `tensorrt_llm` inputs (the C++ backend, our llmapi model and the stand-in), riding
`client.EnsembleClient.stream_call` (one shared channel, reconnect retry, NVIDIA's `stop` request when the
caller leaves early)."""

from __future__ import annotations

import asyncio
import logging
import struct
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial

import numpy as np
from tritonclient.grpc import service_pb2

from trtllm_truss.engine.client import (
    DRAFT_STATS_OUTPUTS,
    IDS_OUTPUT,
    KV_REUSED_BLOCKS_OUTPUT,
    LOG_PROBS_OUTPUT,
    TOKEN_COUNT_OUTPUT,
    EnsembleClient,
    EnsembleInterface,
    GenerationParams,
    build_stop_request,
    first_beam_ids,
    require_input,
)
from trtllm_truss.artifacts.lora_weights import add_request_inputs
from trtllm_truss.repository.interface import TOP_IDS_OUTPUT, TOP_LOG_PROBS_INPUT, TOP_LOG_PROBS_OUTPUT
from trtllm_truss.repository.models import ENGINE as ENGINE_MODEL

logger = logging.getLogger("trtllm_truss.engine.client")


# GenerationParams field -> NVIDIA `tensorrt_llm` input (name, Triton datatype, protobuf contents field).
_ENGINE_SCALAR_INPUTS: dict[str, tuple[str, str, str]] = {
    "max_tokens": ("request_output_len", "INT32", "int_contents"),
    "end_id": ("end_id", "INT32", "int_contents"),
    "pad_id": ("pad_id", "INT32", "int_contents"),
    "top_k": ("runtime_top_k", "INT32", "int_contents"),
    "top_p": ("runtime_top_p", "FP32", "fp32_contents"),
    "temperature": ("temperature", "FP32", "fp32_contents"),
    "random_seed": ("random_seed", "UINT64", "uint64_contents"),
    "repetition_penalty": ("repetition_penalty", "FP32", "fp32_contents"),
    "presence_penalty": ("presence_penalty", "FP32", "fp32_contents"),
    "frequency_penalty": ("frequency_penalty", "FP32", "fp32_contents"),
    "length_penalty": ("len_penalty", "FP32", "fp32_contents"),
    "min_length": ("min_length", "INT32", "int_contents"),
    "beam_width": ("beam_width", "INT32", "int_contents"),
    "return_log_probs": ("return_log_probs", "BOOL", "bool_contents"),
    "exclude_input_in_output": ("exclude_input_in_output", "BOOL", "bool_contents"),
    "lora_task_id": ("lora_task_id", "UINT64", "uint64_contents"),
    "top_log_probs": (TOP_LOG_PROBS_INPUT.name, "INT32", "int_contents"),
}


@dataclass(frozen=True)
class ResponseLogProbs:
    """The log probs of one response's new tokens: the sampled token's (`values`, NVIDIA's output_log_probs)
    and, when num_top_log_probs was sent, each token's k most likely (token id, log prob), largest first."""

    values: list[float]
    top: list[list[tuple[int, float]]] | None = None

    def last(self, count: int) -> ResponseLogProbs:
        """Those of the last `count` tokens (a response's own tokens end its rows)."""
        return ResponseLogProbs(self.values[-count:], self.top[-count:] if self.top is not None else None)


def _top_rows(values_raw: bytes, values_shape, ids_raw: bytes) -> list[list[tuple[int, float]]]:
    """Beam 0 of output_top_log_probs / output_top_ids ([..., beams, tokens, k]) as per-token pairs; padding
    (id -1) dropped."""
    if len(values_shape) < 2:
        return []
    tokens, k = int(values_shape[-2]), int(values_shape[-1])
    values = np.frombuffer(values_raw, dtype="<f4", count=min(tokens * k, len(values_raw) // 4)).reshape(-1, k) if k else []
    ids = np.frombuffer(ids_raw, dtype="<i4", count=min(tokens * k, len(ids_raw) // 4)).reshape(-1, k) if k else []
    return [
        [(int(t), float(v)) for t, v in zip(id_row, value_row) if t >= 0]
        for id_row, value_row in zip(ids, values)
    ]


def build_engine_request(
    input_ids: Sequence[int],
    params: GenerationParams,
    interface: EnsembleInterface,
    request_id: str,
    *,
    model_name: str = ENGINE_MODEL,
    bad_words: np.ndarray | None = None,
    draft_stats: bool = False,
    lora: tuple[np.ndarray, np.ndarray] | None = None,
    kv_stats: bool = False,
) -> service_pb2.ModelInferRequest:
    """A streaming request for the engine model itself, with token ids (NVIDIA's `tensorrt_llm`
    inputs). Stop strings are not sent: the stream worker matches them on the decoded text.
    `draft_stats`: ask for NVIDIA's speculative-decoding perf outputs (return_perf_metrics); `kv_stats`: for its
    count of prompt KV blocks reused from the cache (kv_cache_reused_blocks, the same switch)."""
    request = service_pb2.ModelInferRequest(model_name=model_name, id=request_id)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    # Only what is read: each extra output is one more tensor per streamed response for the engine
    # to build (in streaming mode output_ids holds exactly the response's new tokens).
    request.outputs.add(name=IDS_OUTPUT)
    if params.return_log_probs:
        request.outputs.add(name=LOG_PROBS_OUTPUT)
        if params.top_log_probs:
            request.outputs.add(name=TOP_LOG_PROBS_OUTPUT.name)
            request.outputs.add(name=TOP_IDS_OUTPUT.name)
    if draft_stats:
        for name in DRAFT_STATS_OUTPUTS:
            request.outputs.add(name=name)
    if kv_stats:
        request.outputs.add(name=KV_REUSED_BLOCKS_OUTPUT)
    lead = [1] if interface.batched else []

    def add(name: str, datatype: str, shape: list[int]) -> service_pb2.InferTensorContents:
        return request.inputs.add(name=name, datatype=datatype, shape=lead + shape).contents

    add("input_ids", "INT32", [len(input_ids)]).int_contents.extend(input_ids)
    add("input_lengths", "INT32", [1]).int_contents.append(len(input_ids))
    add("streaming", "BOOL", [1]).bool_contents.append(True)
    for name, (tensor_name, datatype, contents_field) in _ENGINE_SCALAR_INPUTS.items():
        value = getattr(params, name)
        if value is None:
            continue
        require_input(interface, tensor_name, name)
        getattr(add(tensor_name, datatype, [1]), contents_field).append(value)
    if draft_stats or kv_stats:
        require_input(interface, "return_perf_metrics", "draft_stats" if draft_stats else "kv_stats")
        add("return_perf_metrics", "BOOL", [1]).bool_contents.append(True)
    if bad_words is not None and bad_words.size:
        require_input(interface, "bad_words_list", "bad_words")
        add("bad_words_list", "INT32", list(bad_words.shape[-2:])).int_contents.extend(bad_words.reshape(-1).tolist())
    if params.guided_decoding_guide_type is not None:
        # NVIDIA's guided-decoding inputs (tensorrtllm_backend v0.19.0): BYTES [1] each; "json" has no guide.
        for name in ("guided_decoding_guide_type", "guided_decoding_guide"):
            value = getattr(params, name)
            if value is None:
                continue
            require_input(interface, name, name)
            add(name, "BYTES", [1]).bytes_contents.append(value.encode("utf-8"))
    if lora is not None:  # NVIDIA's LoRA protocol (streaming/lora_tasks.py): the adapter with the task id
        add_request_inputs(request, *lora, batched=interface.batched)
    return request


class EngineClient:
    """Streams token ids from the engine model (`tensorrt_llm`) over one shared gRPC channel.

    No ensemble and no python-backend hop: the stream workers tokenize and detokenize themselves.
    Calling the engine model directly also makes gRPC cancellation reach it (Triton cancels a
    decoupled model's own request, unlike an ensemble's step already running); NVIDIA's `stop`
    request is sent as well, as NVIDIA's backend documents it.
    """

    def __init__(self, grpc_url: str, *, model_name: str = ENGINE_MODEL, connect_timeout_s: float = 5.0) -> None:
        self.grpc_url = grpc_url
        self.model_name = model_name
        self._ensemble = EnsembleClient(grpc_url, model_name=model_name, connect_timeout_s=connect_timeout_s)
        self._interface: EnsembleInterface | None = None
        self._interface_lock = asyncio.Lock()

    async def close(self) -> None:
        await self._ensemble.close()

    async def is_ready(self, timeout_s: float = 2.0) -> bool:
        return await self._ensemble.is_ready(timeout_s)

    async def interface(self) -> EnsembleInterface:
        """The engine model's inputs and outputs, read once: the first requests of a burst wait for one read."""
        if self._interface is None:
            async with self._interface_lock:
                if self._interface is None:  # a failed read (tritonserver down) is tried again by the next
                    self._interface = await self._ensemble.read_interface()
        return self._interface

    async def generate_ids(
        self,
        input_ids: Sequence[int],
        params: GenerationParams,
        *,
        bad_words: np.ndarray | None = None,
        on_draft_stats: Callable[[int, int], None] | None = None,
        lora: tuple[np.ndarray, np.ndarray] | None = None,
        on_kv_reuse: Callable[[int], None] | None = None,
    ) -> AsyncIterator[tuple[list[int], ResponseLogProbs | None]]:
        """The new token ids of each streamed response (beam 0) and, when `params.return_log_probs`,
        their log probabilities (with params.top_log_probs, each token's most likely ones too); leaving
        early cancels the request. `on_draft_stats(draft, accepted)`
        gets the request's running totals of draft and accepted draft tokens from each response
        that carries them (NVIDIA's perf outputs, speculative decoding); `on_kv_reuse(blocks)` the request's count
        of prompt KV blocks the engine reused from its cache (kv_cache_reused_blocks), from each response."""
        interface = await self.interface()
        request = build_engine_request(
            input_ids, params, interface, uuid.uuid4().hex, model_name=self.model_name, bad_words=bad_words,
            draft_stats=on_draft_stats is not None, lora=lora, kv_stats=on_kv_reuse is not None,
        )
        stop = partial(build_stop_request, request.id, batched=interface.batched)
        async with aclosing(self._ensemble.stream_call(request, stop)) as responses:
            async for response in responses:
                ids: list[int] = []
                count: int | None = None
                log_probs: list[float] | None = None
                top_raw: dict[str, tuple[bytes, object]] = {}
                stats: dict[str, int] = {}
                for output, raw in zip(response.outputs, response.raw_output_contents):
                    if output.name in DRAFT_STATS_OUTPUTS and len(raw) >= 4:
                        (stats[output.name],) = struct.unpack_from("<i", raw)
                    elif output.name == KV_REUSED_BLOCKS_OUTPUT and len(raw) >= 4 and on_kv_reuse is not None:
                        on_kv_reuse(struct.unpack_from("<i", raw)[0])
                    elif output.name == IDS_OUTPUT:
                        ids = first_beam_ids(raw, output.shape)
                    elif output.name == TOKEN_COUNT_OUTPUT and len(raw) >= 4:
                        (count,) = struct.unpack_from("<i", raw)
                    elif output.name == LOG_PROBS_OUTPUT:
                        tokens = int(output.shape[-1]) if output.shape else 0
                        log_probs = np.frombuffer(raw, dtype="<f4", count=min(tokens, len(raw) // 4)).tolist()
                    elif output.name in (TOP_LOG_PROBS_OUTPUT.name, TOP_IDS_OUTPUT.name):
                        top_raw[output.name] = (raw, list(output.shape))
                if count is not None:
                    ids = ids[: max(count, 0)]
                if on_draft_stats is not None and len(stats) == len(DRAFT_STATS_OUTPUTS):
                    on_draft_stats(*(stats[name] for name in DRAFT_STATS_OUTPUTS))
                if ids:
                    if log_probs is None:
                        yield ids, None
                        continue
                    top = None
                    if len(top_raw) == 2:
                        (values_raw, shape), (ids_raw, _) = top_raw[TOP_LOG_PROBS_OUTPUT.name], top_raw[TOP_IDS_OUTPUT.name]
                        top = _top_rows(values_raw, shape, ids_raw)
                    # The response's own tokens are the last ones of its log-prob rows.
                    yield ids, ResponseLogProbs(log_probs, top).last(len(ids))
