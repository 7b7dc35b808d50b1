"""Where values come from and which source wins: TRTLLM_ env > DJL alias > config.yaml > default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from trtllm_truss.config import Backend, Dtype, Quantization, Source, load_config

S = "model_metadata.trt_llm"
LLAMA = {"base_model_architecture": "llama", "huggingface_ckpt_repository": "meta-llama/Meta-Llama-3-8B"}


def write(root: Path, metadata: dict, accelerator: str | None = None, **top: Any) -> Path:
    config: dict[str, Any] = {"model_name": "p", "model_metadata": metadata, **top}
    if accelerator:
        config["resources"] = {"accelerator": accelerator}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    return root


def test_file_beats_default_and_sources_say_so(tmp_path: Path):
    resolved = load_config(write(tmp_path, {"trt_llm": {"build": {**LLAMA, "max_input_len": 2048}}}), environ={})
    build = resolved.trt_llm.build
    assert build.max_input_len == 2048 and build.max_output_len == 512
    assert resolved.sources[f"{S}.build.max_input_len"] == Source("file", "config.yaml")
    assert resolved.sources[f"{S}.build.max_output_len"] == Source("default")
    assert resolved.source_of("build.max_output_len").kind == "default"
    assert resolved.trt_llm.runtime.exclude_input_in_output is False
    assert resolved.trt_llm.runtime.backend is Backend.AUTO
    # every leaf has a source, and only leaves of the selected mode are listed
    assert set(resolved.sources) == set(resolved.values())
    assert not any(key.startswith(f"{S}.serve") for key in resolved.sources)


def test_env_beats_file_with_typed_parsing(tmp_path: Path):
    root = write(
        tmp_path, {"trt_llm": {"build": {**LLAMA, "max_input_len": 2048}, "runtime": {"enable_kv_cache_reuse": True}}}
    )
    env = {
        "TRTLLM_BUILD__MAX_INPUT_LEN": "4096",
        "TRTLLM_RUNTIME__ENABLE_KV_CACHE_REUSE": "false",
        "TRTLLM_RUNTIME__KV_CACHE_FREE_GPU_MEM_FRACTION": "0.5",
        "TRTLLM_RUNTIME__PYTORCH__DEVICE": "CPU",
        "TRTLLM_RUNTIME__PYTORCH__NUM_THREADS": "3",
        "TRTLLM_RUNTIME__PYTORCH__SYNTHETIC__STEP_TIME_MS": "2.5",
        "TRTLLM_BUILD__PLUGIN_CONFIGURATION__MULTI_BLOCK_MODE": "1",
        "TRTLLM_BUILD__HUGGINGFACE_CKPT_REVISION": "none",  # null word -> None for optional fields
        "TRTLLM_LOG_LEVEL": "debug",  # TensorRT-LLM's own variable (no '__'): ignored
    }
    resolved = load_config(root, environ=env)
    config = resolved.trt_llm
    assert config.build.max_input_len == 4096
    assert config.runtime.enable_kv_cache_reuse is False
    assert config.runtime.kv_cache_free_gpu_mem_fraction == 0.5
    assert config.runtime.pytorch.device.value == "cpu"
    assert config.runtime.pytorch.num_threads == 3
    assert config.runtime.pytorch.synthetic is not None and config.runtime.pytorch.synthetic.step_time_ms == 2.5
    assert config.build.plugin_configuration.multi_block_mode is True
    assert config.build.huggingface_ckpt_revision is None
    assert resolved.sources[f"{S}.build.max_input_len"] == Source("env", "TRTLLM_BUILD__MAX_INPUT_LEN")
    assert resolved.sources[f"{S}.runtime.pytorch.synthetic.step_time_ms"].detail.startswith(
        "TRTLLM_RUNTIME__PYTORCH__SYNTHETIC"
    )


def test_env_section_as_json(tmp_path: Path):
    root = write(tmp_path, {"trt_llm": {"build": LLAMA, "runtime": {"pytorch": {"synthetic": {"step_time_ms": 9}}}}})
    resolved = load_config(root, environ={"TRTLLM_RUNTIME__PYTORCH__SYNTHETIC": "null"})
    assert resolved.trt_llm.runtime.pytorch.synthetic is None
    resolved = load_config(root, environ={"TRTLLM_RUNTIME__PYTORCH__SYNTHETIC": '{"step_time_ms": 1}'})
    assert resolved.trt_llm.runtime.pytorch.synthetic.step_time_ms == 1
    assert resolved.source_of("runtime.pytorch.synthetic.step_time_ms").detail == "TRTLLM_RUNTIME__PYTORCH__SYNTHETIC"


def test_trtllm_env_beats_djl_alias_beats_file(tmp_path: Path):
    root = write(tmp_path, {"trt_llm": {"build": {**LLAMA, "max_input_len": 100}}})
    djl_only = load_config(root, environ={"OPTION_MAX_INPUT_LEN": "200"})
    assert djl_only.trt_llm.build.max_input_len == 200
    assert djl_only.sources[f"{S}.build.max_input_len"] == Source("env", "OPTION_MAX_INPUT_LEN (DJL alias)")
    both = load_config(root, environ={"OPTION_MAX_INPUT_LEN": "200", "TRTLLM_BUILD__MAX_INPUT_LEN": "300"})
    assert both.trt_llm.build.max_input_len == 300
    assert both.sources[f"{S}.build.max_input_len"].detail == "TRTLLM_BUILD__MAX_INPUT_LEN"


def test_process_env_beats_config_environment_variables(tmp_path: Path):
    root = write(
        tmp_path,
        {"trt_llm": {"build": LLAMA}},
        environment_variables={"TRTLLM_BUILD__MAX_BATCH_SIZE": "8", "OPTION_MAX_OUTPUT_LEN": "64"},
    )
    from_file = load_config(root, environ={})
    assert from_file.trt_llm.build.max_batch_size == 8 and from_file.trt_llm.build.max_output_len == 64
    assert (
        from_file.source_of("build.max_batch_size").detail
        == "TRTLLM_BUILD__MAX_BATCH_SIZE in config.yaml environment_variables"
    )
    overridden = load_config(root, environ={"TRTLLM_BUILD__MAX_BATCH_SIZE": "16"})
    assert overridden.trt_llm.build.max_batch_size == 16
    assert overridden.source_of("build.max_batch_size").detail == "TRTLLM_BUILD__MAX_BATCH_SIZE"


def test_djl_environment_alone_defines_a_build(tmp_path: Path):
    """A DJL LMI deployment's variables (plus the one key DJL infers) configure a whole build."""
    root = write(tmp_path, {}, accelerator="A10G:4")
    env = {
        "HF_MODEL_ID": "mistralai/Mistral-7B-v0.1",
        "TENSOR_PARALLEL_DEGREE": "max",
        "OPTION_ROLLING_BATCH": "trtllm",
        "OPTION_MAX_ROLLING_BATCH_SIZE": "64",
        "OPTION_MAX_INPUT_LEN": "1024",
        "OPTION_MAX_OUTPUT_LEN": "512",
        "OPTION_QUANTIZE": "smoothquant",
        "OPTION_SMOOTHQUANT_ALPHA": "0.5",
        "OPTION_SMOOTHQUANT_PER_TOKEN": "true",
        "OPTION_DTYPE": "fp16",
        "OPTION_MAX_NUM_TOKENS": "4096",
        "OPTION_BATCH_SCHEDULER_POLICY": "max_utilization",
        "OPTION_ENABLE_KV_CACHE_REUSE": "true",
        "OPTION_ROTARY_BASE": "10000",
        "TRTLLM_BUILD__BASE_MODEL_ARCHITECTURE": "MISTRAL",
    }
    resolved = load_config(root, environ=env)
    build = resolved.trt_llm.build
    assert build.huggingface_ckpt_repository == "mistralai/Mistral-7B-v0.1"
    assert build.tensor_parallel_count == 4  # "max" = every GPU of resources.accelerator
    assert (build.max_batch_size, build.max_input_len, build.max_output_len, build.max_num_tokens) == (
        64,
        1024,
        512,
        4096,
    )
    assert build.quantization_type is Quantization.SMOOTH_QUANT and build.dtype is Dtype.FLOAT16
    assert build.smoothquant.alpha == 0.5 and build.smoothquant.per_token is True
    assert resolved.trt_llm.runtime.batch_scheduler_policy.value == "max_utilization"
    assert resolved.trt_llm.runtime.enable_kv_cache_reuse is True
    assert resolved.source_of("build.tensor_parallel_count") == Source("env", "TENSOR_PARALLEL_DEGREE (DJL alias)")
    assert any(w.startswith("OPTION_ROTARY_BASE: ignored") for w in resolved.warnings)


def test_djl_tensor_parallel_degree_applies_to_serve(tmp_path: Path):
    root = write(tmp_path, {"trt_llm": {"serve": {"engine_repository": "org/engine"}}}, accelerator="H100:8")
    resolved = load_config(root, environ={"OPTION_TENSOR_PARALLEL_DEGREE": "8"})
    assert resolved.trt_llm.mode == "serve" and resolved.trt_llm.world_size == 8


def test_djl_names_of_one_setting_may_agree(tmp_path: Path):
    root = write(tmp_path, {"trt_llm": {"build": LLAMA}}, accelerator="H100:2")
    resolved = load_config(root, environ={"TENSOR_PARALLEL_DEGREE": "2", "OPTION_TENSOR_PARALLEL_DEGREE": "2"})
    assert resolved.trt_llm.tensor_parallel_count == 2


def test_legacy_keys_mean_serve(tmp_path: Path):
    root = write(
        tmp_path,
        {
            "engine_repository": "org/llama-engine",
            "tokenizer_repository": "org/llama-tok",
            "tensor_parallelism": 2,
            "example_model_input": {"prompt": "x"},
        },
        accelerator="A100:2",
    )
    resolved = load_config(root, environ={"TRTLLM_SERVE__ENGINE_REVISION": "v2"})
    serve = resolved.trt_llm.serve
    assert resolved.trt_llm.mode == "serve"
    assert (serve.engine_repository, serve.tokenizer_repository, serve.tensor_parallel_count) == (
        "org/llama-engine",
        "org/llama-tok",
        2,
    )
    assert serve.engine_revision == "v2"
    assert resolved.source_of("serve.tensor_parallel_count") == Source(
        "file", "config.yaml model_metadata.tensor_parallelism (legacy)"
    )


def test_tokenizer_defaults_to_engine(tmp_path: Path):
    root = write(tmp_path, {"trt_llm": {"serve": {"engine_repository": "org/engine", "engine_revision": "abc"}}})
    resolved = load_config(root, environ={})
    serve = resolved.trt_llm.serve
    assert (serve.tokenizer_repository, serve.tokenizer_revision) == ("org/engine", "abc")
    assert resolved.source_of("serve.tokenizer_repository") == Source("default", "= serve.engine_repository")


def test_fewer_ranks_than_gpus_warns(tmp_path: Path):
    resolved = load_config(write(tmp_path, {"trt_llm": {"build": LLAMA}}, accelerator="H100:2"), environ={})
    assert resolved.accelerator is not None and (resolved.accelerator.gpu, resolved.accelerator.count) == ("H100", 2)
    assert resolved.accelerator.compute_capability == 90
    assert any("uses 1 of the 2 GPUs" in w for w in resolved.warnings)


def test_secret_names_listed_and_values_flagged(tmp_path: Path):
    token = "hf_" + "z" * 30
    root = write(tmp_path, {"trt_llm": {"build": LLAMA}}, secrets={"hf_access_token": token, "other": None})
    resolved = load_config(root, environ={})
    assert resolved.secrets == ["hf_access_token", "other"]
    assert any(w.startswith("secrets.hf_access_token:") for w in resolved.warnings)
    assert token not in repr(resolved)


@pytest.mark.parametrize("environ", [None, {}])
def test_environ_none_reads_process_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, environ):
    monkeypatch.setenv("TRTLLM_BUILD__MAX_BEAM_WIDTH", "4")
    resolved = load_config(write(tmp_path, {"trt_llm": {"build": LLAMA}}), environ=environ)
    assert resolved.trt_llm.build.max_beam_width == (4 if environ is None else 1)


def test_quantization_with_the_pytorch_stand_in_warns(tmp_path: Path):
    root = write(
        tmp_path,
        {"trt_llm": {"build": {**LLAMA, "quantization_type": "weights_int8"}, "runtime": {"backend": "pytorch"}}},
    )
    resolved = load_config(root, environ={})
    assert any(w.startswith(f"{S}.build.quantization_type: weights_int8 is not applied") for w in resolved.warnings)
