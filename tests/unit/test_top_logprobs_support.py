"""Where each position's most likely tokens come from (OpenAI's top_logprobs): our num_top_log_probs
output on the tensor stand-in and our llmapi model, none on NVIDIA's C++ backend or on TensorRT-LLM 1.0's
PyTorch sampler, whose limits make the dialects refuse more than the sampled token naming the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.config.runtime import RuntimeConfig
from trtllm_truss.planning.plan import ServingPlan
from trtllm_truss.planning.probe import RuntimeFacts


def _plan(backend: str, version: str | None = None, *, double: bool = False) -> ServingPlan:
    return ServingPlan(
        backend=backend, tokenizer_dir=Path("/t"), model_dir=Path("/m"), max_batch_size=4, max_input_len=8,
        max_output_len=8, runtime=RuntimeConfig(), facts=RuntimeFacts(trtllm_version=version), llm_api_double=double,
    )


@pytest.mark.parametrize(
    "plan",
    [_plan("pytorch"), _plan("llmapi", double=True), _plan("llmapi", "1.1.0"), _plan("llmapi", "1.2.1")],
    ids=["stand-in", "llmapi-double", "llmapi-1.1.0", "llmapi-1.2.1"],
)
def test_our_python_engines_return_the_most_likely_tokens(plan):
    assert RequestLimits.from_plan(plan).top_logprobs_off is None


@pytest.mark.parametrize(
    "plan, says",
    [(_plan("tensorrtllm", "0.21.0"), "C++ backend"), (_plan("llmapi", "1.0.0"), "TensorRT-LLM 1.0.0")],
    ids=["cpp-backend", "llmapi-1.0.0"],
)
def test_engines_without_them_say_why(plan, says):
    assert says in RequestLimits.from_plan(plan).top_logprobs_off
