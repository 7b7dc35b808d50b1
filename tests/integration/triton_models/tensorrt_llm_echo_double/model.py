"""TEST DOUBLE of TensorRT-LLM's `tensorrt_llm` model: an "echo engine" (python backend, decoupled).

It "generates" the prompt's own tokens (without special tokens), so tests know the exact text a
request must produce — emoji, CJK and whitespace included — without a model. It honours what the
repository wiring must deliver: request_output_len, end_id, stop_words_list (generation ends after
the word, whose tokens are kept, as in TensorRT-LLM), streaming (chunks of 1, 2, 3 tokens in turn,
so multi-token responses are exercised), exclude_input_in_output, and it sends `prefix_ids` (up to
8 ids preceding each response's tokens) like the stand-in engine. Everything else is ignored.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from trtllm_truss.engine.tokenizer import load_tokenizer

WINDOW = 8
CHUNK_CYCLE = (1, 2, 3)


def _optional(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    array = tensor.as_numpy().reshape(-1)
    return array[0].item() if array.size else default


def _words(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    array = tensor.as_numpy().reshape(2, -1)
    ids, offsets = array[0].tolist(), array[1].tolist()
    words, start = [], 0
    for end in offsets:
        if end < 0:
            break
        words.append(ids[start:end])
        start = end
    return words


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = config["parameters"]
        self.default_exclude = parameters["exclude_input_in_output"]["string_value"] == "true"
        self.special_ids = load_tokenizer(parameters["tokenizer_dir"]["string_value"]).special_ids

    def _respond(self, sender, tokens, prefix, final, wanted):
        outputs = [
            pb_utils.Tensor("output_ids", np.array([[tokens]], dtype=np.int32).reshape(1, 1, -1)),
            pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32)),
            pb_utils.Tensor("cum_log_probs", np.zeros((1, 1), dtype=np.float32)),
            pb_utils.Tensor("output_log_probs", np.zeros((1, 1, max(1, len(tokens))), dtype=np.float32)),
            pb_utils.Tensor("prefix_ids", np.array([prefix[-WINDOW:]], dtype=np.int32).reshape(1, -1)),
        ]
        # Only requested outputs, as the stand-in engine does (see InFlight.outputs in engine_standin/senders.py).
        outputs = [t for t in outputs if not wanted or t.name() in wanted]
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=flags)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            wanted = set(request.requested_output_names())
            prompt = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1).tolist()
            max_new = int(_optional(request, "request_output_len", 16))
            end_id = _optional(request, "end_id", None)
            streaming = bool(_optional(request, "streaming", False))
            exclude = bool(_optional(request, "exclude_input_in_output", self.default_exclude))
            stops = _words(request, "stop_words_list")
            echo = [t for t in prompt if t not in self.special_ids and t != end_id]
            generated = []
            for token in echo[:max_new]:
                generated.append(token)
                if any(w and generated[-len(w):] == w for w in stops):
                    break
            if not streaming:
                tokens = generated if exclude else prompt + generated
                self._respond(sender, tokens, prompt if exclude else [], final=True, wanted=wanted)
                continue
            history = list(prompt)
            pos, cycle = 0, 0
            if not generated:
                self._respond(sender, [], history, final=True, wanted=wanted)
                continue
            while pos < len(generated):
                step = CHUNK_CYCLE[cycle % len(CHUNK_CYCLE)]
                chunk = generated[pos : pos + step]
                self._respond(sender, chunk, history, final=pos + step >= len(generated), wanted=wanted)
                history.extend(chunk)
                pos += step
                cycle += 1
