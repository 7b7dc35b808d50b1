"""Triton python-backend model `postprocessing`: token ids -> text, stateless across instances.

Inputs: `TOKENS_BATCH` INT32 [-1, -1] (beams x tokens; in streaming mode only the new tokens),
`SEQUENCE_LENGTH` INT32 [-1] (valid tokens per beam), optional `PREFIX_IDS` INT32 [-1] (up to 8 ids
preceding these tokens, sent by the engine). Output: `OUTPUT` STRING [-1] (one text per beam).
Parameters: `tokenizer_dir`, `skip_special_tokens` (true|false, default true). Each response's text is exactly the characters whose last byte lies in
its tokens (trtllm_truss.engine.detokenize), so any instance can serve any response of any stream.
"""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from trtllm_truss.engine.detokenize import TokenDecoder
from trtllm_truss.runtime.stub_watch import watch_parent
from trtllm_truss.engine.tokenizer import load_tokenizer


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        tokenizer_dir = parameters.get("tokenizer_dir")
        if not tokenizer_dir:
            raise ValueError("postprocessing: parameter tokenizer_dir is required")
        skip_special = (parameters.get("skip_special_tokens") or "true").lower() == "true"
        self.decoder = TokenDecoder(load_tokenizer(tokenizer_dir), skip_special_tokens=skip_special)
        self._parent_watch = watch_parent(str(args.get("model_instance_name", "postprocessing")))

    def finalize(self) -> None:
        self._parent_watch.finalized()

    def _decode(self, request) -> np.ndarray:
        tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
        lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
        prefix_tensor = pb_utils.get_input_tensor_by_name(request, "PREFIX_IDS")
        prefix = prefix_tensor.as_numpy().reshape(-1).tolist() if prefix_tensor is not None else []
        # With max_batch_size > 0 every tensor carries a leading batch dimension of 1.
        beams = tokens.reshape(-1, tokens.shape[-1]) if tokens.ndim >= 2 else tokens.reshape(1, -1)
        lengths = lengths.reshape(-1)
        texts = []
        for beam_index, beam in enumerate(beams):
            length = int(lengths[beam_index]) if beam_index < lengths.size else beam.size
            length = max(0, min(length, beam.size))
            texts.append(self.decoder.decode_new(prefix, beam[:length].tolist()).encode("utf-8"))
        # 1-D, one text per beam, as NVIDIA's postprocessing returns it (clients read output[i].decode()).
        return np.array(texts, dtype=np.object_)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                output = pb_utils.Tensor("OUTPUT", self._decode(request))
                responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
            except Exception as exc:  # noqa: BLE001 -- one bad request must not fail the others in the batch
                responses.append(
                    pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"postprocessing: {exc}"))
                )
        return responses
