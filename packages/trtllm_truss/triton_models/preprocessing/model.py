"""Triton python-backend model `preprocessing`: prompt text and word lists -> token ids.

Tensor interface as NVIDIA's inflight_batcher_llm preprocessing (see repository/interface.py).
Parameters (config.pbtxt, strings): `tokenizer_dir`, `add_special_tokens` (true|false),
`max_input_len` and `max_output_len` (optional; over-long requests fail alone with a clear error).
A whole dynamic batch is tokenized in one call (trtllm_truss.engine.preprocess). A request of batch size N
(N rows in every input, as NVIDIA's clients send with --batch-inputs) gets N rows in every output;
a bad row fails its request.
"""

from __future__ import annotations

import json

import triton_python_backend_utils as pb_utils
from trtllm_truss.engine.preprocess import (
    PreprocessedRequest,
    PreprocessingError,
    RawRequest,
    as_text,
    preprocess_batch,
    stack_rows,
)
from trtllm_truss.runtime.stub_watch import watch_parent
from trtllm_truss.engine.tokenizer import load_tokenizer


def _parameter(config: dict, key: str) -> str | None:
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return value if value else None


def _rows(request, name: str, count: int) -> list | None:
    """Row i of input `name` (as a flat array) for each of the request's `count` rows; None when
    the input was not sent (NVIDIA's preprocessing encodes that differently)."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    array = tensor.as_numpy()
    array = array.reshape(array.shape[0], -1) if array.ndim >= 1 and array.shape[0] == count else array.reshape(1, -1)
    return [array[i] if array.shape[0] == count else array[0] for i in range(count)]


def _int_or_none(row) -> int | None:
    return int(row[0]) if row is not None and row.size else None


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
        # Right padding of INPUT_ID for requests of several rows: the tokenizer's pad (else eos), as NVIDIA's.
        self.pad_id = next((i for i in (self.tokenizer.pad_id, self.tokenizer.eos_id) if i is not None), 0)
        self._parent_watch = watch_parent(str(args.get("model_instance_name", "preprocessing")))

    def finalize(self) -> None:
        self._parent_watch.finalized()

    def _read(self, request) -> list[RawRequest]:
        """One RawRequest per row of the request."""
        query = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy()
        count = query.shape[0] if query.ndim >= 1 else 1
        queries = query.reshape(count, -1)
        output_lens = _rows(request, "REQUEST_OUTPUT_LEN", count)
        if queries.shape[1] != 1 or any(row.size != 1 for row in output_lens):
            raise PreprocessingError("text_input/max_tokens: send exactly one value per row")
        if pb_utils.get_input_tensor_by_name(request, "DECODER_QUERY") is not None:
            raise PreprocessingError("decoder_text_input: encoder-decoder models are not supported by this repository")
        columns = {
            name: _rows(request, name, count)
            for name in ("BAD_WORDS_DICT", "STOP_WORDS_DICT", "END_ID", "PAD_ID", "EMBEDDING_BIAS_WORDS", "EMBEDDING_BIAS_WEIGHTS")
        }

        def words(name: str, i: int) -> tuple[str, ...] | None:
            rows = columns[name]
            return None if rows is None else tuple(as_text(w) for w in rows[i])

        def floats(name: str, i: int) -> tuple[float, ...] | None:
            rows = columns[name]
            return None if rows is None else tuple(float(v) for v in rows[i])

        return [
            RawRequest(
                query=as_text(queries[i, 0]),
                request_output_len=int(output_lens[i][0]),
                bad_words=words("BAD_WORDS_DICT", i),
                stop_words=words("STOP_WORDS_DICT", i),
                end_id=_int_or_none(columns["END_ID"][i] if columns["END_ID"] is not None else None),
                pad_id=_int_or_none(columns["PAD_ID"][i] if columns["PAD_ID"] is not None else None),
                embedding_bias_words=words("EMBEDDING_BIAS_WORDS", i),
                embedding_bias_weights=floats("EMBEDDING_BIAS_WEIGHTS", i),
            )
            for i in range(count)
        ]

    def execute(self, requests):
        per_request: list[list[RawRequest] | PreprocessingError] = []
        for request in requests:
            try:
                per_request.append(self._read(request))
            except (PreprocessingError, UnicodeDecodeError) as exc:
                per_request.append(PreprocessingError(str(exc)))
        rows = [row for entry in per_request if isinstance(entry, list) for row in entry]
        processed = iter(
            preprocess_batch(
                self.tokenizer,
                rows,
                add_special_tokens=self.add_special_tokens,
                max_input_len=self.max_input_len,
                max_output_len=self.max_output_len,
            )
        )
        responses = []
        for entry in per_request:
            if isinstance(entry, PreprocessingError):
                result: PreprocessedRequest | PreprocessingError = entry
            else:
                results = [next(processed) for _ in entry]
                errors = [(i, r) for i, r in enumerate(results) if isinstance(r, PreprocessingError)]
                if errors:
                    i, error = errors[0]
                    result = PreprocessingError(f"{error} (row {i})" if len(results) > 1 else str(error))
                else:
                    result = stack_rows(results, self.pad_id)  # type: ignore[arg-type]
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
