"""gRPC streaming client for the Triton ensembles (NVIDIA `inflight_batcher_llm` tensor interface).

It reads either `ensemble_ids` (token ids out; this client detokenizes them, so no streamed token
crosses a python-backend model: the default) or NVIDIA's text `ensemble` (`text_output`, decoded by
the postprocessing model). Both take the same inputs.

One `tritonclient.grpc.aio.InferenceServerClient` (one HTTP/2 channel) is shared by every request;
each generation is one bidirectional `ModelStreamInfer` call on that channel, so cancelling the call
(closing the iterator, or the HTTP client going away) makes Triton cancel the request. Triton
propagates an ensemble's cancellation only to steps not yet scheduled, never to the decoupled engine
step already generating, so an early close also sends NVIDIA's `stop` request (the `stop` input, same
request id) to the engine model: that is what frees the engine slot.

The engine model's own clients (token ids for the stream workers, NVIDIA's llmapi model) ride this
one's `stream_call`: `trtllm_truss.engine.engine_client`; what of an error a client may read:
`trtllm_truss.engine.rpc_errors`.

Requests are built as protobuf messages with typed `contents` rather than through `InferInput`:
the aio client's `stream_infer` cannot set `triton_enable_empty_final_response` (a reserved
parameter), without which a decoupled ensemble never tells the client that a request has finished.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import struct
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, fields
from functools import partial

import grpc
import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from trtllm_truss.engine.detokenize import StreamDetokenizer, TokenDecoder
from trtllm_truss.repository.models import ENGINE as ENGINE_MODEL
from trtllm_truss.repository.models import ENSEMBLE
from trtllm_truss.engine.rpc_errors import STUB_DOWN_MESSAGE, describe_rpc_error, engine_message, stub_down
from trtllm_truss.engine.stream_end import end_call

logger = logging.getLogger(__name__)

STOP_REQUEST_TIMEOUT_S = 5.0
TEXT_OUTPUT = "text_output"
IDS_OUTPUT = "output_ids"  # [beams, tokens] (after the batch dimension); streaming: only new tokens
# Our ensemble's addition to NVIDIA's outputs: tokens in this response per beam. Ensembles without
# it (NVIDIA's own) still work; usage is then counted by re-tokenizing the text.
TOKEN_COUNT_OUTPUT = "sequence_length"
# NVIDIA's per-request speculative-decoding totals (perf outputs, with return_perf_metrics), in this order.
DRAFT_STATS_OUTPUTS = ("total_draft_tokens", "total_accepted_draft_tokens")
# NVIDIA's per-request count of prompt KV blocks found in the engine's cache (perf output, with return_perf_metrics).
KV_REUSED_BLOCKS_OUTPUT = "kv_cache_reused_blocks"
LOG_PROBS_OUTPUT = "output_log_probs"  # [beams, tokens] of this response (FP32), when return_log_probs
FINAL_RESPONSE_PARAMETER = "triton_final_response"
RECONNECT_WAIT_S = 2.0
# For every process that streams from Triton (stream workers, direct-front processes). grpcio's
# EventEngine client, on by default, passes each read through its own event_engine threads before the
# poller thread hands it to the event loop; with it off the poller thread reads the socket itself: the
# direct front spent 9-23 % less CPU per streamed token on a 32-core host (docs/performance.md, "grpcio's
# EventEngine client off where tokens stream"). `GRPC_EXPERIMENTS` is grpc core's switch for its
# experiments; a value the user set wins. grpc logs "Unknown experiment" (and then ignores it) for a name
# its version no longer has: tests/unit/test_stream_environment.py checks the pinned grpcio knows it.
GRPC_CLIENT_ENVIRONMENT = {"GRPC_EXPERIMENTS": "-event_engine_client"}
# tritonclient's own defaults for message sizes, plus a short reconnect backoff: after the supervisor
# restarts a dead tritonserver the channel must find it again within a second or so, not after
# gRPC's default exponential backoff (up to two minutes).
CHANNEL_ARGS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class UpstreamError(RuntimeError):
    """Triton could not serve a request: server unreachable or gone, or an error from a model.

    `status` is the HTTP status a client should get: 503 when Triton or the engine cannot be reached,
    400 when the engine refused the request itself (its message says why).
    """

    status = 503


class EngineRefusedError(UpstreamError):
    """A model answered the request with an error: the request's fault, not an outage."""

    status = 400


@dataclass(frozen=True)
class GenerationParams:
    """One generation request in the ensemble's own terms (NVIDIA tensor names).

    `None` means "not sent": the ensemble's optional input then takes the engine's default.
    """

    text_input: str
    max_tokens: int
    stream: bool = True
    end_id: int | None = None
    pad_id: int | None = None
    top_k: int | None = None
    top_p: float | None = None
    temperature: float | None = None
    random_seed: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    min_length: int | None = None
    beam_width: int | None = None
    exclude_input_in_output: bool | None = None
    return_log_probs: bool | None = None
    # num_top_log_probs (ours, not NVIDIA's: repository/interface.py): the k most likely tokens of each
    # position, from our python engines only (with return_log_probs).
    top_log_probs: int | None = None
    stop_words: Sequence[str] = field(default_factory=tuple)
    bad_words: Sequence[str] = field(default_factory=tuple)
    # Guided decoding (TensorRT-LLM's GuidedDecodingParams): type "json_schema" with the schema's
    # JSON text, ... (sent by the structured-output work; the request core sets them for tool_choice).
    guided_decoding_guide_type: str | None = None
    guided_decoding_guide: str | None = None
    lora_task_id: int | None = None  # NVIDIA's lora_task_id: a LoRA adapter the engine serves (None: the base model)


# Triton datatype and protobuf `contents` field of every scalar input.
_SCALAR_INPUTS: dict[str, tuple[str, str]] = {
    "max_tokens": ("INT32", "int_contents"),
    "end_id": ("INT32", "int_contents"),
    "pad_id": ("INT32", "int_contents"),
    "top_k": ("INT32", "int_contents"),
    "min_length": ("INT32", "int_contents"),
    "beam_width": ("INT32", "int_contents"),
    "top_p": ("FP32", "fp32_contents"),
    "temperature": ("FP32", "fp32_contents"),
    "repetition_penalty": ("FP32", "fp32_contents"),
    "presence_penalty": ("FP32", "fp32_contents"),
    "frequency_penalty": ("FP32", "fp32_contents"),
    "length_penalty": ("FP32", "fp32_contents"),
    "random_seed": ("UINT64", "uint64_contents"),
    "stream": ("BOOL", "bool_contents"),
    "exclude_input_in_output": ("BOOL", "bool_contents"),
    "return_log_probs": ("BOOL", "bool_contents"),
    "lora_task_id": ("UINT64", "uint64_contents"),
}
# Ensembles after tensorrtllm_backend v0.19 call the seed `seed`.
_INPUT_ALIASES = {"random_seed": ("seed",)}
_WORD_LIST_INPUTS = {"stop_words": "stop_words", "bad_words": "bad_words"}


@dataclass(frozen=True)
class Delta:
    """One streamed piece of output.

    `token_count` is the number of tokens behind `text` when the ensemble reports it, else None.
    `final` marks the request's last response. The finish reason is not here: telling "length"
    from "stop" needs the request's max_tokens, which the service knows (`serving.generation.Generation`).
    """

    text: str
    token_count: int | None = None
    final: bool = False


@dataclass(frozen=True)
class EnsembleInterface:
    """What the served ensemble declares: batching and the names of its inputs and outputs."""

    batched: bool
    inputs: frozenset[str]
    outputs: frozenset[str] = frozenset({TEXT_OUTPUT})


def build_request(
    params: GenerationParams,
    interface: EnsembleInterface,
    request_id: str,
    model_name: str = ENSEMBLE,
    *,
    read_ids: bool = False,
) -> service_pb2.ModelInferRequest:
    """The protobuf request for `params`; inputs the ensemble does not declare are refused.
    `read_ids`: ask for `output_ids` instead of `text_output`."""
    request = service_pb2.ModelInferRequest(model_name=model_name, id=request_id)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    # Only what the proxy reads: log-prob tensors are neither computed into responses nor sent.
    for output in (IDS_OUTPUT if read_ids else TEXT_OUTPUT, TOKEN_COUNT_OUTPUT):
        if output in interface.outputs:
            request.outputs.add(name=output)
    lead = [1] if interface.batched else []

    def add(name: str, datatype: str, shape: list[int]) -> service_pb2.InferTensorContents:
        tensor = request.inputs.add(name=name, datatype=datatype, shape=lead + shape)
        return tensor.contents

    add("text_input", "BYTES", [1]).bytes_contents.append(params.text_input.encode("utf-8"))
    for param in fields(params):
        name = param.name
        value = getattr(params, name)
        if name == "text_input" or value is None:
            continue
        if name in _WORD_LIST_INPUTS:
            if not value:
                continue
            tensor_name = _WORD_LIST_INPUTS[name]
            require_input(interface, tensor_name, name)
            add(tensor_name, "BYTES", [len(value)]).bytes_contents.extend(w.encode("utf-8") for w in value)
            continue
        datatype, contents_field = _SCALAR_INPUTS[name]
        tensor_name = _resolve_input_name(interface, name)
        getattr(add(tensor_name, datatype, [1]), contents_field).append(value)
    return request


def build_stop_request(request_id: str, *, batched: bool, model_name: str = ENGINE_MODEL) -> service_pb2.ModelInferRequest:
    """NVIDIA's cancellation request: `stop=true` for the in-flight request with the same id."""
    request = service_pb2.ModelInferRequest(model_name=model_name, id=request_id)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    lead = [1] if batched else []
    for name, values in (("input_ids", [0]), ("input_lengths", [1]), ("request_output_len", [1])):
        request.inputs.add(name=name, datatype="INT32", shape=lead + [1]).contents.int_contents.extend(values)
    request.inputs.add(name="stop", datatype="BOOL", shape=lead + [1]).contents.bool_contents.append(True)
    return request


def _resolve_input_name(interface: EnsembleInterface, name: str) -> str:
    for candidate in (name, *_INPUT_ALIASES.get(name, ())):
        if candidate in interface.inputs:
            return candidate
    require_input(interface, name, name)
    return name


def require_input(interface: EnsembleInterface, tensor_name: str, param_name: str) -> None:
    if tensor_name not in interface.inputs:
        raise UpstreamError(
            f"the served ensemble has no input {tensor_name!r} (needed for {param_name!r}); "
            f"it accepts: {', '.join(sorted(interface.inputs))}"
        )


def _deserialize_bytes(raw: bytes) -> list[bytes]:
    """Triton's BYTES wire format: each element is a 4-byte little-endian length then the bytes."""
    items: list[bytes] = []
    offset = 0
    while offset < len(raw):
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        items.append(raw[offset : offset + length])
        offset += length
    return items


def text_of(raw: bytes) -> str:
    """The text of a BYTES output; the usual single element (one beam) is sliced without a list."""
    if len(raw) >= 4 and struct.unpack_from("<I", raw)[0] == len(raw) - 4:
        return raw[4:].decode("utf-8", errors="replace")
    return "".join(item.decode("utf-8", errors="replace") for item in _deserialize_bytes(raw))


def first_beam_ids(raw: bytes, shape: Sequence[int]) -> list[int]:
    """Beam 0's ids of an INT32 `output_ids` tensor ([batch,] beams, tokens): its first row."""
    tokens = int(shape[-1]) if shape else 0
    return np.frombuffer(raw, dtype="<i4", count=min(tokens, len(raw) // 4)).tolist()


def parse_response(response: service_pb2.ModelInferResponse, detokenizer: StreamDetokenizer | None = None) -> Delta:
    """Text (and token count if reported) of one streamed response, and whether it is the last.

    With a `detokenizer` (reading `ensemble_ids`) the text is decoded from the first beam's
    `output_ids`, of which `sequence_length` are valid. The final flag may ride on a response that
    also carries data, so the payload is always read.
    """
    final_param = response.parameters.get(FINAL_RESPONSE_PARAMETER)
    final = bool(final_param is not None and final_param.bool_param)
    text = ""
    token_count: int | None = None
    ids: list[int] | None = None
    for output, raw in zip(response.outputs, response.raw_output_contents):
        if output.name == TEXT_OUTPUT:
            text = text_of(raw)
        elif output.name == IDS_OUTPUT and detokenizer is not None:
            ids = first_beam_ids(raw, output.shape)
        elif output.name == TOKEN_COUNT_OUTPUT and len(raw) >= 4:
            (token_count,) = struct.unpack_from("<i", raw)  # the first beam's
    if ids is not None:
        if token_count is not None:
            ids = ids[: max(token_count, 0)]
        token_count = len(ids)
        text = detokenizer.feed(ids) if ids else ""
    return Delta(text=text, token_count=token_count, final=final)


class EnsembleClient:
    """Streams generations from an ensemble over one shared gRPC channel.

    With a `decoder` it reads token ids (`output_ids`) when the served model has them, as
    `ensemble_ids` does, and turns them into text itself; otherwise it reads `text_output`.
    """

    def __init__(
        self,
        grpc_url: str,
        *,
        model_name: str = ENSEMBLE,
        decoder: TokenDecoder | None = None,
        exclude_input_in_output: bool = True,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.grpc_url = grpc_url
        self.model_name = model_name
        self._decoder = decoder
        # Sent for requests whose params do not say (the proxy never echoes the prompt).
        self._exclude_input_default = exclude_input_in_output
        self._connect_timeout_s = connect_timeout_s
        self._client: InferenceServerClient | None = None
        self._interface: EnsembleInterface | None = None
        self._interface_lock: asyncio.Lock | None = None
        self._stop_tasks: set[asyncio.Task] = set()  # strong references until each stop is sent

    def _triton(self) -> InferenceServerClient:
        # Created lazily so that it binds to the event loop that serves the requests.
        if self._client is None:
            self._client = InferenceServerClient(self.grpc_url, channel_args=CHANNEL_ARGS)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def is_ready(self, timeout_s: float = 2.0) -> bool:
        """Server live and the ensemble ready (False, never an exception, when unreachable)."""
        try:
            client = self._triton()
            return bool(
                await client.is_server_live(client_timeout=timeout_s)
                and await client.is_model_ready(self.model_name, client_timeout=timeout_s)
            )
        except (InferenceServerException, grpc.RpcError, OSError):
            return False

    async def interface(self) -> EnsembleInterface:
        """The ensemble's declared inputs and outputs, read once (a restart serves the same repository)."""
        if self._interface is not None:
            return self._interface
        if self._interface_lock is None:
            self._interface_lock = asyncio.Lock()
        async with self._interface_lock:
            if self._interface is None:
                interface = await self.read_interface()
                if TEXT_OUTPUT not in interface.outputs and not (IDS_OUTPUT in interface.outputs and self._decoder):
                    needs = f"{TEXT_OUTPUT!r}" + (f" or {IDS_OUTPUT!r}" if self._decoder else "")
                    logger.error("Triton at %s: model %s has no output %s", self.grpc_url, self.model_name, needs)
                    raise UpstreamError(
                        f"model {self.model_name!r} has no output {needs}; "
                        f"it has: {', '.join(sorted(interface.outputs))}"
                    )
                self._interface = interface
        return self._interface

    async def read_interface(self) -> EnsembleInterface:
        """The served model's declared batching, inputs and outputs, from its config."""
        try:
            config = await self._triton().get_model_config(
                self.model_name, as_json=True, client_timeout=self._connect_timeout_s
            )
        except InferenceServerException as exc:
            # The address is for the operator's log; the client's message names none.
            logger.warning("Triton at %s: model config of %s unavailable: %s", self.grpc_url, self.model_name, exc)
            raise UpstreamError("the engine is unavailable") from exc
        config = config.get("config", config)
        return EnsembleInterface(
            batched=int(config.get("max_batch_size", 0)) > 0,
            inputs=frozenset(i["name"] for i in config.get("input", [])),
            outputs=frozenset(o["name"] for o in config.get("output", [])),
        )

    async def generate(self, params: GenerationParams) -> AsyncIterator[Delta]:
        """Stream the deltas of one generation; leaving the loop early cancels the Triton request."""
        interface = await self.interface()
        if params.exclude_input_in_output is None:
            # Always sent: the repository's default for requests that do not say is NVIDIA's
            # (false: the prompt comes back first), which is not what the proxy's callers want.
            params = dataclasses.replace(params, exclude_input_in_output=self._exclude_input_default)
        read_ids = self._decoder is not None and IDS_OUTPUT in interface.outputs
        request = build_request(
            params, interface, request_id=uuid.uuid4().hex, model_name=self.model_name, read_ids=read_ids
        )
        detokenizer = None
        if read_ids:
            exclude_input = params.exclude_input_in_output
            if exclude_input is None:
                exclude_input = self._exclude_input_default
            # Streamed tokens never include the prompt; a whole answer does unless excluded.
            continues_prompt = bool(params.text_input) and (params.stream or exclude_input)
            detokenizer = StreamDetokenizer(self._decoder, continues_prompt=continues_prompt)
        stop = partial(build_stop_request, request.id, batched=interface.batched)
        async with aclosing(self.stream_call(request, stop)) as responses:
            async for response in responses:
                delta = parse_response(response, detokenizer)
                if delta.text or delta.token_count:
                    yield delta

    async def stream_call(
        self, request: service_pb2.ModelInferRequest, stop_request: Callable[[], service_pb2.ModelInferRequest]
    ) -> AsyncIterator[service_pb2.ModelInferResponse]:
        """Send `request` on a new `ModelStreamInfer` call of the shared channel and yield each
        response up to the final one. Leaving early cancels the call and sends `stop_request()`
        (NVIDIA's `stop`, same request id) in the background: that is what frees the engine slot.

        The first write is retried once when the channel was still backing off from a restarted
        tritonserver. (tritonclient's own aio `stream_infer` cannot send the final-response flag,
        see the module docstring; hence the raw stub.)
        """
        triton = self._triton()
        call = triton._client_stub.ModelStreamInfer(wait_for_ready=False)
        finished = False
        retried = False
        try:
            while True:
                try:
                    await call.write(request)
                    message = await call.read()
                    break
                except grpc.aio.AioRpcError as exc:
                    if retried or exc.code() != grpc.StatusCode.UNAVAILABLE or not await _reconnected(triton):
                        raise
                    retried = True
                    call.cancel()
                    call = triton._client_stub.ModelStreamInfer(wait_for_ready=False)
            while True:
                if message is grpc.aio.EOF:
                    raise UpstreamError("the engine closed the stream before the request finished")
                if message.error_message:
                    if stub_down(message.error_message):
                        logger.warning("Triton at %s: %s", self.grpc_url, message.error_message)
                        raise UpstreamError(STUB_DOWN_MESSAGE)
                    raise EngineRefusedError(f"the engine refused the request: {engine_message(message.error_message)}")
                response = message.infer_response
                final = response.parameters.get(FINAL_RESPONSE_PARAMETER)
                finished = final is not None and final.bool_param
                yield response
                if finished:
                    break
                message = await call.read()
        except grpc.aio.AioRpcError as exc:
            raise UpstreamError(describe_rpc_error(self.grpc_url, exc)) from exc
        finally:
            if finished:  # close our side and let Triton end the stream (trtllm_truss.engine.stream_end)
                await end_call(call)
            # A no-op once the call has completed; otherwise this is what tells Triton to cancel.
            call.cancel()
            if not finished:
                task = asyncio.get_running_loop().create_task(self._send_stop(stop_request()))
                self._stop_tasks.add(task)
                task.add_done_callback(self._stop_tasks.discard)

    async def _send_stop(self, stop_request: service_pb2.ModelInferRequest) -> None:
        """Free the engine slot of an abandoned request (best effort: the request may have just ended)."""
        call = self._triton()._client_stub.ModelStreamInfer(wait_for_ready=False)
        try:
            await call.write(stop_request)
            await asyncio.wait_for(call.read(), timeout=STOP_REQUEST_TIMEOUT_S)  # its one, final answer
            # Not a cancel right after that answer: it can leak the stop request in Triton, and with it
            # the engine model at shutdown (trtllm_truss.engine.stream_end).
            await end_call(call)
        except (grpc.aio.AioRpcError, asyncio.TimeoutError, asyncio.CancelledError) as exc:
            logger.debug("stop request for %s not delivered: %r", stop_request.id, exc)
        finally:
            call.cancel()


async def _reconnected(triton: InferenceServerClient) -> bool:
    """Whether the channel connects within RECONNECT_WAIT_S (after a tritonserver restart it may
    still be waiting out its reconnect backoff when the first request arrives)."""
    try:
        await asyncio.wait_for(triton._channel.channel_ready(), RECONNECT_WAIT_S)
        return True
    except (asyncio.TimeoutError, grpc.aio.AioRpcError):
        return False
