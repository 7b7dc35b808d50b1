"""TEST DOUBLE of TensorRT-LLM's `tensorrt_llm` model that can hang (python backend, decoupled).

It answers each request with one token (`output_ids` = the last prompt token, `sequence_length` 1)
while the file named by the `hang_file` parameter does not exist. While that file exists it answers
nothing: requests are kept open, unanswered, as a wedged engine would keep them. Removing the file
lets later requests through again (the held ones stay unanswered, as after a real hang).
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.hang_file = config["parameters"]["hang_file"]["string_value"]
        self.held = []  # senders of requests a "hung" engine never answers

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            if os.path.exists(self.hang_file):
                self.held.append(sender)
                continue
            prompt = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1)
            token = int(prompt[-1]) if prompt.size else 0
            outputs = [
                pb_utils.Tensor("output_ids", np.array([[[token]]], dtype=np.int32)),
                pb_utils.Tensor("sequence_length", np.array([[1]], dtype=np.int32)),
            ]
            sender.send(
                pb_utils.InferenceResponse(output_tensors=outputs), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
        return None
