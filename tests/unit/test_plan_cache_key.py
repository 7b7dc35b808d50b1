"""The engine cache key: every input that changes the engine changes it; nothing else does."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from trtllm_truss.config import BuildConfig, load_config
from trtllm_truss.planning.plan import ENGINE_CACHE_KEY_VERSION, engine_cache_key, engine_cache_key_inputs, make_plan
from trtllm_truss.planning.probe import GpuInfo, RuntimeFacts

SHA = "4538057447" * 4
FACTS = RuntimeFacts(
    gpus=(GpuInfo("NVIDIA H100 80GB HBM3", "9.0"),) * 4,
    trtllm_version="0.12.0",
    tensorrt_version="10.3.0",
    trtllm_unavailable_reason=None,
)
BASE = {"base_model_architecture": "llama", "huggingface_ckpt_repository": "meta-llama/Llama-3.1-8B"}

# One changed value per build field (nested ones per sub-field). Built from the schema's own field list
# below, so a new BuildConfig field fails this test until it is listed here or excluded on purpose.
VARIANTS: dict[str, tuple[dict, dict]] = {
    # field: (base overrides, changed overrides)
    "base_model_architecture": ({}, {"base_model_architecture": "mistral"}),
    "dtype": ({}, {"dtype": "bfloat16"}),
    "max_input_len": ({}, {"max_input_len": 4096}),
    "max_output_len": ({}, {"max_output_len": 2048}),
    "max_batch_size": ({}, {"max_batch_size": 8}),
    "max_beam_width": ({}, {"max_beam_width": 4}),
    "max_num_tokens": ({}, {"max_num_tokens": 16384}),
    "quantization_type": ({}, {"quantization_type": "fp8"}),
    "smoothquant": (
        {"quantization_type": "smooth_quant"},
        {"quantization_type": "smooth_quant", "smoothquant": {"alpha": 0.5}},
    ),
    "awq": ({"quantization_type": "awq"}, {"quantization_type": "awq", "awq": {"calib_size": 64}}),
    "tensor_parallel_count": ({}, {"tensor_parallel_count": 2}),
    "pipeline_parallel_count": ({}, {"pipeline_parallel_count": 2}),
    "expert_parallel_count": ({"tensor_parallel_count": 2}, {"tensor_parallel_count": 2, "expert_parallel_count": 2}),
    "plugin_configuration": ({}, {"plugin_configuration": {"multi_block_mode": True}}),
    "chatglm_model_version": (
        {"base_model_architecture": "chatglm", "chatglm_model_version": "chatglm2_6b"},
        {"base_model_architecture": "chatglm", "chatglm_model_version": "chatglm3_6b"},
    ),
    "baichuan_model_version": (
        {"base_model_architecture": "baichuan", "baichuan_model_version": "v1_7b"},
        {"base_model_architecture": "baichuan", "baichuan_model_version": "v2_7b"},
    ),
    "lora_configuration": (
        {"lora_adapters": {"a": "org/a"}},
        {"lora_adapters": {"a": "org/a"}, "lora_configuration": {"max_lora_rank": 16}},
    ),
}
# Not engine inputs: where the engine is published, and where the checkpoint lives (its identity
# enters as the resolved revision, a separate argument).
# LoRA adapters are sent to the engine at runtime, not built into it.
EXCLUDED = {"publish_repository", "huggingface_ckpt_repository", "huggingface_ckpt_revision", "lora_adapters"}


def key(build: dict, *, revision: str = SHA, facts: RuntimeFacts = FACTS) -> str:
    return engine_cache_key(BuildConfig.model_validate({**BASE, **build}), checkpoint_revision=revision, facts=facts)


def test_every_build_field_is_covered():
    assert set(BuildConfig.model_fields) == set(VARIANTS) | EXCLUDED


@pytest.mark.parametrize("field", sorted(VARIANTS))
def test_changing_any_build_field_changes_the_key(field):
    base, changed = VARIANTS[field]
    assert key(base) != key(changed)


@pytest.mark.parametrize(
    "plugin", ["multi_block_mode", "paged_kv_cache", "use_fused_mlp", "use_paged_context_fmha", "use_custom_all_reduce"]
)
def test_each_plugin_option_changes_the_key(plugin):
    default = BuildConfig.model_validate(BASE).plugin_configuration
    flipped = {"plugin_configuration": {plugin: not getattr(default, plugin)}}
    assert key({}) != key(flipped)


def test_explicit_defaults_and_spellings_normalise_to_the_same_key():
    assert key({}) == key({"dtype": "float16", "quantization_type": "NO_QUANT", "max_beam_width": 1})
    assert key({"quantization_type": "WEIGHTS_ONLY_INT8"}) == key({"quantization_type": "weights_int8"})


def test_excluded_fields_do_not_change_the_key():
    assert key({}) == key({"publish_repository": "acme/engines"})
    assert key({}) == key({"huggingface_ckpt_repository": "/models/llama", "huggingface_ckpt_revision": "main"})


def test_checkpoint_revision_and_runtime_versions_and_gpu_change_the_key():
    base = key({})
    assert key({}, revision="0" * 40) != base
    for change in (
        {"trtllm_version": "0.13.0"},
        {"tensorrt_version": "10.4.0"},
        {"gpus": (GpuInfo("NVIDIA H200", "9.0"),)},  # same SM, other GPU model
        {"gpus": (GpuInfo("NVIDIA H100 80GB HBM3", "8.9"),)},  # same name, other SM
    ):
        assert key({}, facts=dataclasses.replace(FACTS, **change)) != base, change


def test_key_is_canonical_sha256_and_versioned():
    inputs = engine_cache_key_inputs(BuildConfig.model_validate(BASE), checkpoint_revision=SHA, facts=FACTS)
    assert inputs["cache_key_version"] == ENGINE_CACHE_KEY_VERSION
    assert inputs["gpu"] == {"model": "NVIDIA H100 80GB HBM3", "sm": 90}
    assert (inputs["tensor_parallel"], inputs["pipeline_parallel"]) == (1, 1)
    digest = key({})
    assert len(digest) == 64 and set(digest) <= set("0123456789abcdef")
    # Same content in another key order -> same key (canonical JSON).
    as_dict = BuildConfig.model_validate(BASE).model_dump(mode="json")
    reordered = dict(reversed(list(as_dict.items())))
    assert engine_cache_key(reordered, checkpoint_revision=SHA, facts=FACTS) == digest


def test_an_unresolved_revision_is_refused():
    with pytest.raises(ValueError, match="resolved commit sha"):
        engine_cache_key(BASE, checkpoint_revision="", facts=FACTS)


def _truss(tmp_path: Path) -> Path:
    (tmp_path / "config.yaml").write_text(
        "model_name: t\nresources:\n  accelerator: H100:4\n  use_gpu: true\n"
        "model_metadata:\n  trt_llm:\n    build:\n      base_model_architecture: llama\n"
        "      huggingface_ckpt_repository: meta-llama/Llama-3.1-8B\n"
    )
    return tmp_path


def test_through_the_config_runtime_knobs_keep_the_key_and_build_overrides_change_it(tmp_path):
    truss_dir = _truss(tmp_path)

    def plan_key(environ: dict[str, str]) -> str:
        plan = make_plan(load_config(truss_dir, environ=environ), FACTS, artifacts_dir=tmp_path / "a")
        return engine_cache_key(plan.build, checkpoint_revision=SHA, facts=plan.facts)

    base = plan_key({})
    runtime_only = {
        "TRTLLM_RUNTIME__KV_CACHE_FREE_GPU_MEM_FRACTION": "0.5",
        "TRTLLM_RUNTIME__ENABLE_KV_CACHE_REUSE": "true",
        "TRTLLM_RUNTIME__EXCLUDE_INPUT_IN_OUTPUT": "false",
        "TRTLLM_RUNTIME__PREPROCESSING_INSTANCE_COUNT": "4",
    }
    assert plan_key(runtime_only) == base
    assert plan_key({"TRTLLM_BUILD__MAX_INPUT_LEN": "2048"}) != base


def test_secrets_never_enter_the_key(tmp_path):
    token = "hf_SECRET_should_not_appear"
    truss_dir = _truss(tmp_path)
    plan = make_plan(
        load_config(truss_dir, environ={"HF_TOKEN": token, "TRUSS_SECRET_hf_access_token": token}),
        FACTS,
        artifacts_dir=tmp_path / "a",
    )
    inputs = engine_cache_key_inputs(plan.build, checkpoint_revision=SHA, facts=plan.facts)
    assert token not in json.dumps(inputs)
