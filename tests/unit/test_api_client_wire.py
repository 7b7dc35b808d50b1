"""The ensemble client's wire format: request tensors by NVIDIA name, response parsing, final flag."""

from __future__ import annotations

import struct

import pytest
from tritonclient.grpc import service_pb2

from trtllm_truss.client import EnsembleInterface, GenerationParams, UpstreamError, build_request, parse_response

NVIDIA_ENSEMBLE = EnsembleInterface(
    batched=True,
    inputs=frozenset(
        "text_input max_tokens bad_words stop_words end_id pad_id top_k top_p temperature length_penalty "
        "repetition_penalty min_length presence_penalty frequency_penalty random_seed return_log_probs "
        "beam_width stream exclude_input_in_output".split()
    ),
    outputs=frozenset({"text_output", "cum_log_probs", "output_log_probs", "sequence_length"}),
)


def _inputs(request):
    return {t.name: t for t in request.inputs}


def test_request_carries_only_set_inputs_with_nvidia_names_and_dtypes():
    params = GenerationParams(
        text_input="héllo", max_tokens=7, temperature=0.5, random_seed=2**63 + 1, stop_words=("\n", "END")
    )
    request = build_request(params, NVIDIA_ENSEMBLE, request_id="r1")
    tensors = _inputs(request)
    assert set(tensors) == {"text_input", "max_tokens", "stream", "temperature", "random_seed", "stop_words"}
    assert tensors["text_input"].datatype == "BYTES" and list(tensors["text_input"].shape) == [1, 1]
    assert tensors["text_input"].contents.bytes_contents == ["héllo".encode()]
    assert tensors["max_tokens"].datatype == "INT32" and list(tensors["max_tokens"].contents.int_contents) == [7]
    assert tensors["random_seed"].datatype == "UINT64" and list(tensors["random_seed"].contents.uint64_contents) == [
        2**63 + 1
    ]
    assert list(tensors["stop_words"].shape) == [1, 2] and list(tensors["stop_words"].contents.bytes_contents) == [
        b"\n",
        b"END",
    ]
    assert tensors["stream"].contents.bool_contents == [True]
    assert request.id == "r1" and request.model_name == "ensemble"
    assert request.parameters["triton_enable_empty_final_response"].bool_param
    assert [o.name for o in request.outputs] == ["text_output", "sequence_length"]  # no log probs


def test_unbatched_ensemble_and_seed_alias():
    newer = EnsembleInterface(batched=False, inputs=frozenset({"text_input", "max_tokens", "stream", "seed"}))
    tensors = _inputs(
        build_request(GenerationParams(text_input="x", max_tokens=1, random_seed=5), newer, request_id="r")
    )
    assert list(tensors["text_input"].shape) == [1] and "seed" in tensors and "random_seed" not in tensors


def test_input_the_ensemble_lacks_is_refused_by_name():
    minimal = EnsembleInterface(batched=True, inputs=frozenset({"text_input", "max_tokens", "stream"}))
    with pytest.raises(UpstreamError, match="'top_k'"):
        build_request(GenerationParams(text_input="x", max_tokens=1, top_k=3), minimal, request_id="r")


def _response(texts: list[bytes], final: bool | None, count: int | None = None) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse()
    if texts:
        response.outputs.add(name="text_output", datatype="BYTES", shape=[1, len(texts)])
        response.raw_output_contents.append(b"".join(struct.pack("<I", len(t)) + t for t in texts))
    if count is not None:
        response.outputs.add(name="sequence_length", datatype="INT32", shape=[1, 2])
        response.raw_output_contents.append(struct.pack("<ii", count, count + 5))  # beam 0 counts
    if final is not None:
        response.parameters["triton_final_response"].bool_param = final
    return response


def test_final_flag_on_a_response_that_carries_data_keeps_the_data():
    delta = parse_response(_response(["the end ✓".encode()], final=True, count=3))
    assert delta.final and delta.text == "the end ✓" and delta.token_count == 3


def test_empty_final_response_and_plain_delta():
    assert parse_response(_response([], final=True)).final
    delta = parse_response(_response([b"a", b"b"], final=False))
    assert not delta.final and delta.text == "ab" and delta.token_count is None
