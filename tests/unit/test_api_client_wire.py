"""The ensemble client's wire format: request tensors by NVIDIA name, response parsing, final flag."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from tritonclient.grpc import service_pb2
from trtllm_truss.engine.client import (
    EnsembleInterface,
    GenerationParams,
    UpstreamError,
    build_request,
    parse_response,
)
from trtllm_truss.engine.detokenize import StreamDetokenizer, TokenDecoder
from trtllm_truss.engine.tokenizer import load_tokenizer

EMBEDDED_TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"

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


IDS_ENSEMBLE = EnsembleInterface(
    batched=True, inputs=NVIDIA_ENSEMBLE.inputs, outputs=frozenset({"output_ids", "sequence_length"})
)


def test_reading_ids_asks_for_output_ids_instead_of_text():
    request = build_request(GenerationParams(text_input="x", max_tokens=1), IDS_ENSEMBLE, "r", "ensemble_ids", read_ids=True)
    assert request.model_name == "ensemble_ids"
    assert [o.name for o in request.outputs] == ["output_ids", "sequence_length"]


def _ids_response(beams: list[list[int]], lengths: list[int] | None, final: bool = False) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse()
    width = max(len(b) for b in beams)
    response.outputs.add(name="output_ids", datatype="INT32", shape=[1, len(beams), width])
    padded = [b + [0] * (width - len(b)) for b in beams]
    response.raw_output_contents.append(struct.pack(f"<{len(beams) * width}i", *[i for b in padded for i in b]))
    if lengths is not None:
        response.outputs.add(name="sequence_length", datatype="INT32", shape=[1, len(lengths)])
        response.raw_output_contents.append(struct.pack(f"<{len(lengths)}i", *lengths))
    response.parameters["triton_final_response"].bool_param = final
    return response


@pytest.fixture(scope="module")
def embedded_decoder() -> TokenDecoder:
    if not (EMBEDDED_TOKENIZER_DIR / "tokenizer.json").is_file():
        pytest.skip("data/embedded-llama is missing")
    return TokenDecoder(load_tokenizer(EMBEDDED_TOKENIZER_DIR))


def test_streamed_ids_decode_across_responses_like_the_whole_sequence(embedded_decoder: TokenDecoder):
    text = "ab 👨‍👩‍👧 你好 𓀀 end"
    ids = load_tokenizer(EMBEDDED_TOKENIZER_DIR).encode(text, add_special_tokens=False)
    detokenizer = StreamDetokenizer(embedded_decoder, continues_prompt=False)
    deltas = [parse_response(_ids_response([[i]], [1]), detokenizer) for i in ids]  # one token per response
    assert "".join(d.text for d in deltas) == text == embedded_decoder.decode(ids)
    assert all(d.token_count == 1 for d in deltas)
    assert any(d.text == "" for d in deltas)  # a character split over tokens waits for its last byte


def test_only_the_first_beams_valid_ids_are_decoded(embedded_decoder: TokenDecoder):
    tokenizer = load_tokenizer(EMBEDDED_TOKENIZER_DIR)
    best, other = tokenizer.encode("best beam", add_special_tokens=False), tokenizer.encode("x", add_special_tokens=False)
    padded_best = best + tokenizer.encode(" padding", add_special_tokens=False)
    delta = parse_response(_ids_response([padded_best, other], [len(best), len(other)], final=True), StreamDetokenizer(embedded_decoder, continues_prompt=False))
    assert delta.final and delta.text == "best beam" and delta.token_count == len(best)
    without_lengths = parse_response(_ids_response([best], None), StreamDetokenizer(embedded_decoder, continues_prompt=False))
    assert without_lengths.text == "best beam" and without_lengths.token_count == len(best)


# The engine model's inputs as the rendered repository declares them (GPU path), guided decoding included.
def _engine_interface() -> EnsembleInterface:
    from trtllm_truss.repository.interface import engine_inputs

    return EnsembleInterface(batched=True, inputs=frozenset(t.name for t in engine_inputs(cpp_backend=True)))


def test_engine_request_carries_the_guide_as_nvidias_bytes_inputs():
    from trtllm_truss.engine.engine_client import build_engine_request

    schema = '{"type":"object","properties":{"é":{"type":"integer"}}}'
    params = GenerationParams(
        text_input="", max_tokens=4, guided_decoding_guide_type="json_schema", guided_decoding_guide=schema
    )
    tensors = _inputs(build_engine_request([1, 2], params, _engine_interface(), "r"))
    for name, value in (("guided_decoding_guide_type", b"json_schema"), ("guided_decoding_guide", schema.encode())):
        assert tensors[name].datatype == "BYTES" and list(tensors[name].shape) == [1, 1]
        assert list(tensors[name].contents.bytes_contents) == [value]


def test_engine_request_without_a_guide_or_with_json_sends_no_guide_text():
    from trtllm_truss.engine.engine_client import build_engine_request

    interface = _engine_interface()
    plain = _inputs(build_engine_request([1], GenerationParams(text_input="", max_tokens=1), interface, "r"))
    assert not {"guided_decoding_guide_type", "guided_decoding_guide"} & set(plain)
    params = GenerationParams(text_input="", max_tokens=1, guided_decoding_guide_type="json")
    tensors = _inputs(build_engine_request([1], params, interface, "r"))
    assert list(tensors["guided_decoding_guide_type"].contents.bytes_contents) == [b"json"]
    assert "guided_decoding_guide" not in tensors


def test_engine_request_to_a_model_without_guided_inputs_is_refused_by_name():
    from trtllm_truss.engine.engine_client import build_engine_request

    older = EnsembleInterface(batched=True, inputs=frozenset({"input_ids", "input_lengths", "request_output_len", "streaming"}))
    params = GenerationParams(text_input="", max_tokens=1, guided_decoding_guide_type="regex", guided_decoding_guide="a+")
    with pytest.raises(UpstreamError, match="guided_decoding_guide_type"):
        build_engine_request([1], params, older, "r")
