"""Request and response schemas of the HTTP layer (native predict and OpenAI-compatible routes).

Everything here is validated before any request reaches Triton; problems become
`fastapi.HTTPException` (422 for a malformed body, 400 for limits) whose message names the field.
"""

from trtllm_truss.api.errors import field_error, from_validation_error
from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.api.native import ChatMessage, PredictRequest, PredictResponse, Usage
from trtllm_truss.api.openai import ChatCompletionRequest, CompletionRequest

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "PredictRequest",
    "PredictResponse",
    "RequestLimits",
    "Usage",
    "field_error",
    "from_validation_error",
]
