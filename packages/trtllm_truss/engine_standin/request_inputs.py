"""The request side of the `tensorrt_llm` stand-in model: a Triton request's input tensors as engine requests.

`triton_models/tensorrt_llm_pytorch/model.py` (STANDIN_MODEL_INTERFACE lists the tensors) reads a request
in two steps, with its own wiring in between: `read_rows` checks what all generations of the request share,
`read_generation` builds and validates one engine request per row and sequence. Every refusal raises
`RequestRejected` before the model takes the request's response sender.

Imports without Triton: `triton_python_backend_utils` exists only in the python backend stub, so the
functions that read a tensor by name take it as the `pb_utils` parameter.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trtllm_truss.engine_standin.types import (
    GenerationRequest,
    Guide,
    RequestRejected,
    SamplingParams,
)
from trtllm_truss.engine_standin.unsupported_inputs import refuse_unsupported
from trtllm_truss.engine_standin.words import parse_word_list
from trtllm_truss.repository.interface import MAX_TOP_LOG_PROBS

# NVIDIA's message (model_instance_state.cc, handleStopRequest) for a stop request without an id.
STOP_WITHOUT_ID_ERROR = "Trying to stop a request but request ID is not provided"
# NVIDIA's messages (utils.cc, createRequestsFromInputTensors) when the model is not decoupled.
BATCH_NEEDS_DECOUPLED_ERROR = "Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy"
STREAMING_NEEDS_DECOUPLED_ERROR = "Streaming is only supported if model is deployed using decoupled mode."
# Ours: NVIDIA's backend would send several responses where a non-decoupled model may send one.
SEQUENCES_NEED_DECOUPLED_ERROR = "num_return_sequences > 1 requires the tensorrt_llm model to be decoupled (runtime.decoupled_mode)"


def request_input(pb_utils, request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def request_scalar(pb_utils, request, name: str, default):
    array = request_input(pb_utils, request, name)
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


def _optional_int(value) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class RequestRows:
    """What every generation of one Triton request shares, checked before any of them is built."""

    arrays: dict  # input name -> numpy array, as Triton gave them
    input_ids: np.ndarray  # [rows, ids]
    arrival_ns: int
    sequences: list[int]  # num_return_sequences of each row

    @property
    def rows(self) -> int:
        return len(self.sequences)


@dataclass(frozen=True)
class ParsedGeneration:
    """One engine request (a row and sequence of a Triton request) and how its responses are asked for."""

    generation: GenerationRequest  # validated by the engine
    prompt: list[int]
    batch_index: int | None  # set when the Triton request has several rows
    sequence_index: int | None  # set when num_return_sequences > 1
    streaming: bool
    exclude_input: bool
    want_perf: bool


def read_rows(pb_utils, request, *, decoupled: bool) -> RequestRows:
    """The request's rows and sequences per row; refusals raise RequestRejected."""
    arrays = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
    refuse_unsupported(arrays)
    input_ids = arrays.get("input_ids")
    if input_ids is None:
        raise RequestRejected("input_ids: required")
    rows = input_ids.shape[0] if input_ids.ndim >= 2 else 1
    if not decoupled and rows > 1:
        raise RequestRejected(BATCH_NEEDS_DECOUPLED_ERROR)
    if not decoupled and request_scalar(pb_utils, request, "streaming", False):
        raise RequestRejected(STREAMING_NEEDS_DECOUPLED_ERROR)
    if input_ids.ndim < 2:
        input_ids = input_ids.reshape(1, -1)
    arrival_ns = time.monotonic_ns()
    sequences = [int(_row_scalar(arrays, "num_return_sequences", row, 1)) for row in range(rows)]
    for row, count in enumerate(sequences):
        if count < 1:
            raise RequestRejected(f"num_return_sequences: must be >= 1, got {count}")
        if count > 1 and not decoupled:
            raise RequestRejected(SEQUENCES_NEED_DECOUPLED_ERROR)
    return RequestRows(arrays=arrays, input_ids=input_ids, arrival_ns=arrival_ns, sequences=sequences)


def read_generation(
    request: RequestRows, row: int, sequence: int, *,
    default_end_id: int | None, default_exclude_input: bool, validate: Callable[[GenerationRequest], None],
) -> ParsedGeneration:
    """One engine request for row `row`, sequence `sequence` of a Triton request, checked by `validate`
    (the engine's)."""
    arrays = request.arrays
    batch_index = row if request.rows > 1 else None
    sequence_index = sequence if request.sequences[row] > 1 else None
    flat = request.input_ids[row].reshape(-1)
    where = f" (row {row})" if batch_index is not None else ""
    length = int(_row_scalar(arrays, "input_lengths", row, flat.size))
    if not 0 < length <= flat.size:
        raise RequestRejected(f"input_lengths: {length} does not fit the {flat.size} input_ids sent{where}")
    prompt = flat[:length].astype(np.int64).tolist()
    output_len = _row_scalar(arrays, "request_output_len", row, None)
    if output_len is None:
        raise RequestRejected("request_output_len: required")
    end_id = _row_scalar(arrays, "end_id", row, default_end_id)
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
        top_log_probs=_top_log_probs(_row_scalar(arrays, "num_top_log_probs", row, 0), where),
        # NVIDIA's preprocessing sends an empty bias when none was asked for.
        embedding_bias=bias.reshape(-1).astype(np.float32).tolist() if bias is not None and bias.size else None,
        return_context_logits=bool(_row_scalar(arrays, "return_context_logits", row, False)),
        return_generation_logits=bool(_row_scalar(arrays, "return_generation_logits", row, False)),
        guide=Guide(guide_type, guide_text) if guide_type is not None else None,
        lora_task_id=_optional_int(_row_scalar(arrays, "lora_task_id", row, None)),
    )
    try:
        validate(generation)  # refusals raise here, before the sender is taken
    except RequestRejected as exc:
        raise RequestRejected(f"{exc}{where}") from exc
    return ParsedGeneration(
        generation=generation,
        prompt=prompt,
        batch_index=batch_index,
        sequence_index=sequence_index,
        streaming=bool(_row_scalar(arrays, "streaming", row, False)),
        exclude_input=bool(_row_scalar(arrays, "exclude_input_in_output", row, default_exclude_input)),
        want_perf=bool(_row_scalar(arrays, "return_perf_metrics", row, False)),
    )


def _top_log_probs(value, where: str) -> int:
    k = int(value)
    if not 0 <= k <= MAX_TOP_LOG_PROBS:
        raise RequestRejected(f"num_top_log_probs: {k} is not within 0..{MAX_TOP_LOG_PROBS}{where}")
    return k
