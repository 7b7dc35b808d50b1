"""How an OpenAI request becomes several engine requests (n, batch prompts) and what is refused
before any: the seeds of the choices, their order, usage, and the 400s naming the field.
The fan-out itself runs against truss's server in tests/integration/test_truss_server_openai.py."""

from __future__ import annotations

import pytest
from fastapi import HTTPException

from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.api.openai import ChatCompletionRequest, CompletionRequest
from trtllm_truss.api.sampling import UINT64_MAX
from trtllm_truss.engine.client import GenerationParams
from trtllm_truss.serving.core import choice_specs as _choice_specs
from trtllm_truss.serving.openai_shared import refuse_what_the_engine_cannot_do as _refuse_what_the_engine_cannot_do
from trtllm_truss.serving.openai_shared import request_guide, usage_of
from trtllm_truss.serving.request import Finish
from trtllm_truss.streaming.protocol import GenerationSpec

CHAT = [{"role": "user", "content": "x"}]


def choice_specs(req, prompts):
    return _choice_specs(req.n, req.seed, prompts)


def _prompt_specs(*prompts: str) -> list[GenerationSpec]:
    return [GenerationSpec(GenerationParams("", max_tokens=4), prompt=p, prompt_field=f"prompt[{i}]") for i, p in enumerate(prompts)]


def test_choices_are_prompt_major_with_seed_plus_j():
    req = CompletionRequest.model_validate({"prompt": ["a", "b"], "n": 3, "seed": 10})
    specs = choice_specs(req, _prompt_specs("a", "b"))
    assert [(s.prompt, s.params.random_seed) for s in specs] == [
        ("a", 10), ("a", 11), ("a", 12), ("b", 10), ("b", 11), ("b", 12)
    ]


def test_derived_seeds_wrap_within_the_uint64_tensor():
    req = CompletionRequest.model_validate({"prompt": "a", "n": 2, "seed": UINT64_MAX})
    assert [s.params.random_seed for s in choice_specs(req, _prompt_specs("a"))] == [UINT64_MAX, 0]


def test_unseeded_choices_get_their_own_random_seeds_and_one_choice_keeps_the_engines():
    req = CompletionRequest.model_validate({"prompt": "a", "n": 4})
    seeds = [s.params.random_seed for s in choice_specs(req, _prompt_specs("a"))]
    assert len(set(seeds)) == 4 and all(0 <= s <= UINT64_MAX for s in seeds)
    single = CompletionRequest.model_validate({"prompt": "a", "logprobs": 0})
    (spec,) = choice_specs(single, _prompt_specs("a"))
    assert spec.params.random_seed is None


def test_usage_counts_each_prompt_once_and_every_choices_tokens():
    ends = [Finish("length", prompt_tokens=p, completion_tokens=c) for p, c in [(5, 3), (5, 4), (7, 1), (7, 2)]]
    usage = usage_of(ends, n=2)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (12, 10, 22)


CPP_BACKEND = RequestLimits(8, 8, top_logprobs_off="NVIDIA's C++ backend returns the sampled token's log prob only")
OUR_ENGINES = RequestLimits(8, 8, top_logprobs_off=None)


@pytest.mark.parametrize(
    "model, body, field",
    [
        (ChatCompletionRequest, {"logprobs": True, "top_logprobs": 2, "temperature": 0}, "top_logprobs"),
        (ChatCompletionRequest, {"logprobs": True, "top_logprobs": 1}, "top_logprobs"),  # not greedy
        (CompletionRequest, {"logprobs": 5, "top_k": 1}, "logprobs"),
        (CompletionRequest, {"logprobs": 1, "temperature": 0.5}, "logprobs"),
    ],
)
def test_what_the_engine_cannot_answer_is_400_naming_the_field(model, body, field):
    base = {"messages": CHAT} if model is ChatCompletionRequest else {"prompt": "x"}
    with pytest.raises(HTTPException) as caught:
        _refuse_what_the_engine_cannot_do(model.model_validate({**base, **body}), CPP_BACKEND)
    assert caught.value.status_code == 400 and f"{field}:" in caught.value.detail
    assert "C++ backend" in caught.value.detail  # says why
    # Our python engines (stand-in, llmapi model) return the most likely tokens themselves.
    _refuse_what_the_engine_cannot_do(model.model_validate({**base, **body}), OUR_ENGINES)


def test_json_mode_is_guided_decoding_of_any_json_object():
    req = ChatCompletionRequest.model_validate({"messages": CHAT, "response_format": {"type": "json_object"}})
    guide = request_guide(req)
    assert (guide.type, guide.guide, guide.field) == ("json_schema", '{"type":"object"}', "response_format")


@pytest.mark.parametrize(
    "model, body",
    [
        (ChatCompletionRequest, {"logprobs": True, "top_logprobs": 1, "temperature": 0}),
        (ChatCompletionRequest, {"logprobs": True, "top_logprobs": 1, "top_k": 1, "temperature": 0.9}),
        (ChatCompletionRequest, {"logprobs": True, "top_logprobs": 0, "temperature": 0.9, "top_p": 1.0}),
        (ChatCompletionRequest, {"response_format": {"type": "text"}, "tools": [], "tool_choice": "none"}),
        (CompletionRequest, {"logprobs": 0, "temperature": 0.9, "top_p": 1.0}),
        (CompletionRequest, {"logprobs": 1, "temperature": 0}),
    ],
)
def test_what_the_engine_answers_exactly_is_served(model, body):
    base = {"messages": CHAT} if model is ChatCompletionRequest else {"prompt": "x"}
    _refuse_what_the_engine_cannot_do(model.model_validate({**base, **body}), CPP_BACKEND)
