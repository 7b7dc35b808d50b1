"""Our llmapi Triton model against NVIDIA's LLM API of every 1.x release the plan allows.

Every keyword our model passes (triton_models/tensorrt_llm_llmapi/llm_request.py: generate_async,
SamplingParams, GuidedDecodingParams, LoRARequest, all by keyword) and every key of the model.yaml it is
given must be in the records of tests/data/trtllm_flags/<version>/llmapi_generate.json. Each record names,
part by part, where it was read: NVIDIA's versioned documentation source pages of that release (url, tag,
docs build commit), or says plainly that a part is still a bracket (`read: false`, `not_read`). The
LLM-API double must not accept a name the real classes lack either, and a name no record has must fail.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

FLAGS = Path(__file__).resolve().parents[1] / "data" / "trtllm_flags"
PACKAGE = Path(__file__).resolve().parents[2] / "packages" / "trtllm_truss"
REQUEST_MODULE = PACKAGE / "triton_models" / "tensorrt_llm_llmapi" / "llm_request.py"
VERSIONS = ("1.0.0", "1.1.0", "1.2.0", "1.2.1")
# Records read part by part from NVIDIA's versioned docs pages: all of them.
PAGE_READ_VERSIONS = VERSIONS
# Call name in llm_request.py -> the record's list of accepted keywords.
CALLS = {
    "generate_async": "generate_async_keywords",
    "SamplingParams": "sampling_params_fields",
    "GuidedDecodingParams": "guided_decoding_params_fields",
    "LoRARequest": "lora_request_fields",
}


def record(version: str) -> dict:
    doc = json.loads((FLAGS / version / "llmapi_generate.json").read_text())
    assert doc["trtllm_version"] == version and doc["source"]["repository"] == "NVIDIA/TensorRT-LLM"
    sampling = doc["sources"]["sampling_params"]
    assert sampling.get("commit") or sampling["stored_copy"]["commit"], "provenance missing"
    return doc


def model_yaml_names_missing(args: dict, version: str) -> dict[str, set]:
    """The names of a rendered model.yaml (LLM() keywords and the fields of the configs it nests) that the
    version's record lacks; empty when the version accepts every one."""
    names = record(version)
    missing = {
        "LLM()": set(args) - set(names["llm_args"]),
        "KvCacheConfig": set(args.get("kv_cache_config", {})) - set(names["kv_cache_config_fields"]),
        "SchedulerConfig": set(args.get("scheduler_config", {})) - set(names["scheduler_config_fields"]),
        "LoraConfig": set(args.get("lora_config", {})) - set(names["lora_config_fields"]),
        "CapacitySchedulerPolicy": {args.get("scheduler_config", {}).get("capacity_scheduler_policy")}
        - set(names["capacity_scheduler_policy_members"]) - {None},
        "guided_decoding_backend": {args.get("guided_decoding_backend")} - set(names["guided_decoding_backend_values"])
        - {None},
    }
    return {part: names for part, names in missing.items() if names}


def keywords_missing(source: str, version: str) -> dict[str, set]:
    """Keywords of the LLM-API calls in `source` that the version's record lacks."""
    accepted = record(version)
    missing = {}
    for name, calls in calls_of_source(source).items():
        used = {k.arg for call in calls for k in call.keywords}
        if used - set(accepted[CALLS[name]]):
            missing[name] = used - set(accepted[CALLS[name]])
    return missing


@pytest.mark.parametrize("version", PAGE_READ_VERSIONS)
def test_each_part_of_the_record_says_where_it_was_read_or_that_it_was_not(version):
    sources = record(version)["sources"]
    for part in ("generate_async", "sampling_params", "guided_decoding_params", "lora_request", "lora_config",
                 "llm_args", "kv_cache_config", "scheduler_config", "logprobs"):
        source = sources[part]
        if source["read"]:
            assert f"nvidia.github.io/TensorRT-LLM/{version}/" in source["url"], (part, source)
            assert source["tag"] == f"v{version}" and source["docs_built_from_commit"], (part, source)
            assert len(source["stored_copy"]["commit"]) == 40, (part, source)
        else:
            assert source["not_read"].startswith("not read"), (part, source)


def calls_of(path: Path) -> dict[str, list[ast.Call]]:
    return calls_of_source(path.read_text())


def calls_of_source(source: str) -> dict[str, list[ast.Call]]:
    found: dict[str, list[ast.Call]] = {name: [] for name in CALLS}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CALLS:
            found[node.func.attr].append(node)
    return found


def test_our_model_calls_the_llm_api_by_keyword_only():
    found = calls_of(REQUEST_MODULE)
    assert all(found.values()), {name: len(calls) for name, calls in found.items()}
    for name, calls in found.items():
        for call in calls:
            assert not call.args, f"{name}: positional arguments at line {call.lineno}"
            assert all(k.arg is not None for k in call.keywords), f"{name}: **kwargs at line {call.lineno}"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_keyword_our_model_passes_is_in_the_record_of_each_version(version):
    assert keywords_missing(REQUEST_MODULE.read_text(), version) == {}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_double_accepts_no_name_the_real_classes_lack(version):
    from trtllm_truss.engine_standin import llmapi_double as double

    accepted = record(version)
    for cls, key in (
        (double.SamplingParams, "sampling_params_fields"),
        (double.GuidedDecodingParams, "guided_decoding_params_fields"),
        (double.LoRARequest, "lora_request_fields"),
    ):
        fields = {f.name for f in dataclasses.fields(cls)}
        assert fields <= set(accepted[key]), (cls.__name__, fields - set(accepted[key]))


@pytest.mark.parametrize("version", VERSIONS)
def test_a_name_no_release_has_fails_the_contract(version):
    """The checks above must be able to fail: a made-up keyword at each level is reported, by name."""
    args = {
        "model": "/m", "made_up_llm_argument": 1,
        "kv_cache_config": {"max_tokens": 8, "made_up_kv_field": 1},
        "scheduler_config": {"capacity_scheduler_policy": "MADE_UP_POLICY"},
        "lora_config": {"lora_dir": [], "made_up_lora_field": 1},
        "guided_decoding_backend": "made_up_engine",
    }
    assert model_yaml_names_missing(args, version) == {
        "LLM()": {"made_up_llm_argument"}, "KvCacheConfig": {"made_up_kv_field"}, "LoraConfig": {"made_up_lora_field"},
        "CapacitySchedulerPolicy": {"MADE_UP_POLICY"}, "guided_decoding_backend": {"made_up_engine"},
    }
    source = "llm.generate_async(inputs, made_up_keyword=1)\nllmapi.SamplingParams(max_tokens=1, made_up_sampling=2)\n"
    assert keywords_missing(source, version) == {
        "generate_async": {"made_up_keyword"}, "SamplingParams": {"made_up_sampling"},
    }


def test_model_yaml_keys_are_llm_arguments_of_the_record(tmp_path):
    """The fullest model.yaml we render (guides, LoRA, chunked prefill, fp8 KV cache, host offload) against each
    version's record of LLM() / KvCacheConfig / SchedulerConfig names and LoraConfig's fields."""
    from types import SimpleNamespace

    from trtllm_truss.config import load_config
    from trtllm_truss.planning.lora import PlannedAdapter
    from trtllm_truss.repository.llmapi import llm_args

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "config.yaml").write_text(
        "model_name: t\nmodel_metadata:\n  trt_llm:\n    build:\n      base_model_architecture: llama\n"
        "      huggingface_ckpt_repository: ckpt\n      quantization_type: fp8_kv\n      max_num_tokens: 4096\n"
        "    runtime:\n      enable_chunked_context: true\n      stream_interval: 4\n"
        "      max_tokens_in_paged_kv_cache: 8192\n      kv_cache_host_memory_bytes: 1000000\n"
        "      kv_cache_onboard_blocks: true\n"
    )
    trt = load_config(tmp_path, environ={}).trt_llm
    args = llm_args(
        trt.build, trt.runtime, "/m", guide_engine="xgrammar",
        adapters=(PlannedAdapter("pirate", 1, tmp_path / "pirate"),), lora_configuration=SimpleNamespace(max_lora_rank=8, max_loras=2),
    )
    assert {"host_cache_size", "max_tokens", "onboard_blocks", "dtype"} <= set(args["kv_cache_config"])
    for version in VERSIONS:
        assert model_yaml_names_missing(args, version) == {}, version
    assert args["guided_decoding_backend"] == "xgrammar" and args["stream_interval"] == 4


@pytest.mark.parametrize("version", VERSIONS)
def test_top_logprobs_on_llmapi_follow_what_each_version_returns(version):
    """num_top_log_probs reaches SamplingParams.logprobs only where the version's PyTorch sampler returns k
    most likely tokens (the record's max_logprobs); elsewhere the dialects keep the cap of 1 and say why."""
    from pathlib import Path as P

    from trtllm_truss.api.limits import RequestLimits
    from trtllm_truss.config.runtime import RuntimeConfig
    from trtllm_truss.planning.plan import ServingPlan
    from trtllm_truss.planning.probe import RuntimeFacts

    plan = ServingPlan(
        backend="llmapi", tokenizer_dir=P("/t"), model_dir=P("/m"), max_batch_size=4, max_input_len=8,
        max_output_len=8, runtime=RuntimeConfig(), facts=RuntimeFacts(trtllm_version=version),
    )
    off = RequestLimits.from_plan(plan).top_logprobs_off
    if record(version)["max_logprobs"] == 1:
        assert off is not None and version in off
    else:
        assert off is None
