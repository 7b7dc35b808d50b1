"""The schema on its own: every accepted spelling, defaults, derived properties, repository strings."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from trtllm_truss.config import (
    Architecture,
    BuildConfig,
    Dtype,
    Quantization,
    RuntimeConfig,
    ServeConfig,
    TrtLlmConfig,
    is_hub_repo_id,
    parse_accelerator,
    resolve_repository,
)

LLAMA = {"base_model_architecture": "llama", "huggingface_ckpt_repository": "a/b"}

QUANTIZATION_SPELLINGS = [
    # TRT-LLM Builder Truss (upper case)
    ("NO_QUANT", Quantization.NO_QUANT),
    ("WEIGHTS_ONLY_INT8", Quantization.WEIGHTS_INT8),
    ("WEIGHTS_KV_INT8", Quantization.WEIGHTS_KV_INT8),
    ("WEIGHTS_ONLY_INT4", Quantization.WEIGHTS_INT4),
    ("WEIGHTS_KV_INT4", Quantization.WEIGHTS_KV_INT4),
    ("SMOOTH_QUANT", Quantization.SMOOTH_QUANT),
    ("FP8", Quantization.FP8),
    ("FP8_KV", Quantization.FP8_KV),
    # truss lowercase
    ("no_quant", Quantization.NO_QUANT),
    ("weights_int8", Quantization.WEIGHTS_INT8),
    ("weights_kv_int8", Quantization.WEIGHTS_KV_INT8),
    ("weights_int4", Quantization.WEIGHTS_INT4),
    ("weights_kv_int4", Quantization.WEIGHTS_KV_INT4),
    ("smooth_quant", Quantization.SMOOTH_QUANT),
    ("fp8", Quantization.FP8),
    ("fp8_kv", Quantization.FP8_KV),
    # DJL LMI
    ("smoothquant", Quantization.SMOOTH_QUANT),
    ("awq", Quantization.AWQ),
    (" Fp8-KV ", Quantization.FP8_KV),
]


@pytest.mark.parametrize(("spelling", "expected"), QUANTIZATION_SPELLINGS)
def test_quantization_spellings(spelling: str, expected: Quantization):
    assert BuildConfig(**LLAMA, quantization_type=spelling).quantization_type is expected


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("LLAMA", Architecture.LLAMA),
        ("Mixtral", Architecture.MIXTRAL),
        ("gpt-j", Architecture.GPTJ),
        ("SantaCoder", Architecture.SANTACODER),
    ],
)
def test_architecture_spellings(spelling: str, expected: Architecture):
    assert BuildConfig(**{**LLAMA, "base_model_architecture": spelling}).base_model_architecture is expected


@pytest.mark.parametrize(
    ("spelling", "expected"), [("fp16", Dtype.FLOAT16), ("BF16", Dtype.BFLOAT16), ("float32", Dtype.FLOAT32)]
)
def test_dtype_spellings(spelling: str, expected: Dtype):
    assert BuildConfig(**LLAMA, dtype=spelling).dtype is expected


def test_runtime_defaults():
    runtime = RuntimeConfig()
    assert runtime.backend.value == "auto"
    assert runtime.exclude_input_in_output is False  # NVIDIA's default
    assert runtime.decoupled_mode is True
    assert runtime.preprocessing_instance_count == 2 and runtime.postprocessing_instance_count == 2
    assert runtime.startup_timeout_s == 600 and runtime.tritonserver_path is None
    assert (
        runtime.pytorch.model is None and runtime.pytorch.device.value == "auto" and runtime.pytorch.synthetic is None
    )


def test_modes_and_parallelism_properties():
    built = TrtLlmConfig(build={**LLAMA, "tensor_parallel_count": 2, "pipeline_parallel_count": 3})
    assert (built.mode, built.tensor_parallel_count, built.pipeline_parallel_count, built.world_size) == (
        "build",
        2,
        3,
        6,
    )
    assert built.build.max_seq_len == 1024 + 512
    served = TrtLlmConfig(serve={"engine_repository": "s3://bucket/engines/llama", "tensor_parallel_count": 2})
    assert (served.mode, served.world_size) == ("serve", 2)
    assert served.serve.tokenizer_repository == "s3://bucket/engines/llama"


def test_models_are_frozen_and_strict():
    config = TrtLlmConfig(build=LLAMA)
    with pytest.raises(ValidationError):
        config.build.max_input_len = 5  # type: ignore[misc]
    with pytest.raises(ValidationError, match="extra"):
        ServeConfig(engine_repository="a/b", engine_repo="x")


def test_parse_accelerator_forms():
    assert parse_accelerator(None) is None
    assert str(parse_accelerator("H100:2")) == "H100:2"
    assert parse_accelerator({"accelerator": "L4", "count": 4}).count == 4
    assert parse_accelerator("L40S").compute_capability == 89
    with pytest.raises(ValueError, match="did you mean 'H200'"):
        parse_accelerator("H20")
    with pytest.raises(ValueError, match="positive integer"):
        parse_accelerator("T4:0")


def test_resolve_repository(tmp_path: Path):
    (tmp_path / "data" / "embedded-llama").mkdir(parents=True)
    local = resolve_repository("data/embedded-llama", tmp_path)
    assert local.kind == "local" and local.local_path == (tmp_path / "data" / "embedded-llama").resolve()
    # the same shape without a folder behind it is a hub repo id
    hub = resolve_repository("meta-llama/Meta-Llama-3-8B", tmp_path)
    assert (hub.kind, hub.repo_id) == ("hub", "meta-llama/Meta-Llama-3-8B")
    assert resolve_repository("hf://data/embedded-llama", tmp_path).kind == "hub"  # explicit hub wins
    assert resolve_repository("gpt2", tmp_path).repo_id == "gpt2"
    absolute = resolve_repository(str(tmp_path / "missing"), tmp_path)
    assert absolute.kind == "local" and absolute.local_path == (tmp_path / "missing").resolve()
    assert resolve_repository("./engines", tmp_path).local_path == (tmp_path / "engines").resolve()
    s3 = resolve_repository("s3://bucket/engines/llama/", tmp_path)
    assert (s3.kind, s3.bucket, s3.prefix, str(s3)) == ("s3", "bucket", "engines/llama", "s3://bucket/engines/llama")
    with pytest.raises(ValueError, match="names no bucket"):
        resolve_repository("s3:///x", tmp_path)
    with pytest.raises(ValueError, match="neither an existing folder"):
        resolve_repository("a/b/c", tmp_path)
    assert not is_hub_repo_id("org/../x") and is_hub_repo_id("Org-1/name.v2_x")
