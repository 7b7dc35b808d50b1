"""Triton python-backend model `preprocessing`: prompt text and word lists -> token ids.

Tensor interface as NVIDIA's inflight_batcher_llm preprocessing (see repository/interface.py).
Parameters (config.pbtxt, strings): `tokenizer_dir`, `add_special_tokens` (true|false),
`max_input_len` and `max_output_len` (optional; over-long requests fail alone with a clear error).
A whole dynamic batch is tokenized in one call (trtllm_truss.preprocess).
"""

from __future__ import annotations

import json

import triton_python_backend_utils as pb_utils
from trtllm_truss.preprocess import (
    PreprocessingError,
    RawRequest,
    as_text,
    preprocess_batch,
)
from trtllm_truss.tokenizer import load_tokenizer


def _parameter(config: dict, key: str) -> str | None:
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return value if value else None


def _optional_int(request, name: str) -> int | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    array = tensor.as_numpy()
    return int(array.reshape(-1)[0]) if array.size else None


def _words(request, name: str) -> tuple[str, ...] | None:
    """None when the input was not sent (NVIDIA's preprocessing encodes that differently)."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return tuple(as_text(w) for w in tensor.as_numpy().reshape(-1))


def _floats(request, name: str) -> tuple[float, ...] | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tuple(float(v) for v in tensor.as_numpy().reshape(-1))


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        tokenizer_dir = _parameter(config, "tokenizer_dir")
        if tokenizer_dir is None:
            raise ValueError("preprocessing: parameter tokenizer_dir is required")
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.add_special_tokens = (_parameter(config, "add_special_tokens") or "true").lower() == "true"
        max_input = _parameter(config, "max_input_len")
        max_output = _parameter(config, "max_output_len")
        self.max_input_len = int(max_input) if max_input else None
        self.max_output_len = int(max_output) if max_output else None

    def _read(self, request) -> RawRequest:
        query = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy().reshape(-1)
        output_len = pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy().reshape(-1)
        if query.size != 1 or output_len.size != 1:
            raise PreprocessingError("text_input/max_tokens: send exactly one value per request")
        if pb_utils.get_input_tensor_by_name(request, "DECODER_QUERY") is not None:
            raise PreprocessingError("decoder_text_input: encoder-decoder models are not supported by this repository")
        return RawRequest(
            query=as_text(query[0]),
            request_output_len=int(output_len[0]),
            bad_words=_words(request, "BAD_WORDS_DICT"),
            stop_words=_words(request, "STOP_WORDS_DICT"),
            end_id=_optional_int(request, "END_ID"),
            pad_id=_optional_int(request, "PAD_ID"),
            embedding_bias_words=_words(request, "EMBEDDING_BIAS_WORDS"),
            embedding_bias_weights=_floats(request, "EMBEDDING_BIAS_WEIGHTS"),
        )

    def execute(self, requests):
        raws: list[RawRequest | PreprocessingError] = []
        for request in requests:
            try:
                raws.append(self._read(request))
            except (PreprocessingError, UnicodeDecodeError) as exc:
                raws.append(PreprocessingError(str(exc)))
        valid = [r for r in raws if isinstance(r, RawRequest)]
        processed = iter(
            preprocess_batch(
                self.tokenizer,
                valid,
                add_special_tokens=self.add_special_tokens,
                max_input_len=self.max_input_len,
                max_output_len=self.max_output_len,
            )
        )
        responses = []
        for raw in raws:
            result = next(processed) if isinstance(raw, RawRequest) else raw
            if isinstance(result, PreprocessingError):
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(result))))
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("INPUT_ID", result.input_ids),
                        pb_utils.Tensor("REQUEST_INPUT_LEN", result.input_length),
                        pb_utils.Tensor("REQUEST_OUTPUT_LEN", result.request_output_len),
                        pb_utils.Tensor("BAD_WORDS_IDS", result.bad_words_ids),
                        pb_utils.Tensor("STOP_WORDS_IDS", result.stop_words_ids),
                        pb_utils.Tensor("OUT_END_ID", result.end_id),
                        pb_utils.Tensor("OUT_PAD_ID", result.pad_id),
                        pb_utils.Tensor("DECODER_INPUT_ID", result.decoder_input_ids),
                        pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", result.decoder_input_length),
                        pb_utils.Tensor("EMBEDDING_BIAS", result.embedding_bias),
                    ]
                )
            )
        return responses
