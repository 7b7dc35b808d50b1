"""TEST DOUBLE of NVIDIA's llmapi `tensorrt_llm` model's interface (python backend, decoupled,
max_batch_size 0): answers `text_input` with `text_output` = "pong" once per request. Used to check
that the health probe's text request has the names, types and shapes of NVIDIA's config.pbtxt."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            max_tokens = pb_utils.get_input_tensor_by_name(request, "sampling_param_max_tokens").as_numpy()
            assert text.shape == (1,) and max_tokens.tolist() == [1], (text.shape, max_tokens)
            output = pb_utils.Tensor("text_output", np.array([b"pong"], dtype=np.object_))
            sender.send(
                pb_utils.InferenceResponse(output_tensors=[output]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
        return None
