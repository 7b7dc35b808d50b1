"""Whether a deployment's engine returns each position's most likely tokens (OpenAI's top_logprobs).

Our python engines do, up to repository.interface.MAX_TOP_LOG_PROBS (our num_top_log_probs input and
output_top_log_probs / output_top_ids outputs): the tensor stand-in, and our llmapi model on the LLM-API
double or on a TensorRT-LLM whose PyTorch sampler returns SamplingParams.logprobs = k > 1 tokens. NVIDIA's
C++ backend has no such output: there the dialects list the sampled token only, as the most likely one
under greedy decoding.
"""

from __future__ import annotations

from trtllm_truss.planning.plan import ServingPlan
from trtllm_truss.planning.probe import version_tuple

# The PyTorch backend's sampler returns k > 1 most likely tokens from 1.1 (NVIDIA PR #7756, Sept 2025;
# 1.0's returns the sampled token's only, PR #6097): `max_logprobs` in
# tests/data/trtllm_flags/<version>/llmapi_generate.json.
LLMAPI_TOP_LOGPROBS_SINCE = (1, 1)


def top_logprobs_off(plan: ServingPlan) -> str | None:
    """None when the plan's engine returns each position's most likely tokens, else why not (the 400 says it)."""
    if plan.backend == "tensorrtllm":
        return "NVIDIA's C++ backend (runtime.backend: tensorrtllm) returns the log prob of the sampled token only"
    version = plan.facts.trtllm_version
    if plan.backend == "llmapi" and not plan.llm_api_double and version_tuple(version) < LLMAPI_TOP_LOGPROBS_SINCE:
        return (
            f"TensorRT-LLM {version}'s PyTorch sampler returns the log prob of the sampled token only"
            " (SamplingParams.logprobs > 1 from 1.1)"
        )
    return None
