"""Table-driven: malformed configs and environment combinations, each must fail with a line that
names the exact key path (and the allowed values where there is a fixed set)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from trtllm_truss.config import ConfigError, load_config

S = "model_metadata.trt_llm"
LLAMA = {"base_model_architecture": "llama", "huggingface_ckpt_repository": "meta-llama/Meta-Llama-3-8B"}
ENGINE = {"engine_repository": "org/engine"}


@dataclass
class Case:
    id: str
    metadata: Any  # the whole model_metadata value
    expected_key: str  # a problem line must start with this (full dotted path or variable name)
    fragment: str = ""  # and contain this
    env: dict[str, str] = field(default_factory=dict)
    accelerator: str | None = None
    top_level: dict[str, Any] = field(default_factory=dict)


def build(**overrides: Any) -> dict:
    return {"trt_llm": {"build": {**LLAMA, **overrides}}}


def serve(**overrides: Any) -> dict:
    return {"trt_llm": {"serve": {**ENGINE, **overrides}}}


def with_runtime(section: dict, **runtime: Any) -> dict:
    return {"trt_llm": {**section["trt_llm"], "runtime": runtime}}


CASES = [
    Case(
        "quantization-unknown",
        build(quantization_type="int3"),
        f"{S}.build.quantization_type",
        "allowed values: no_quant",
    ),
    Case(
        "architecture-unknown",
        build(base_model_architecture="llama7"),
        f"{S}.build.base_model_architecture",
        "allowed values: llama, mistral",
    ),
    Case(
        "checkpoint-missing",
        {"trt_llm": {"build": {"base_model_architecture": "llama"}}},
        f"{S}.build.huggingface_ckpt_repository",
        "required",
    ),
    Case(
        "checkpoint-empty",
        build(huggingface_ckpt_repository=""),
        f"{S}.build.huggingface_ckpt_repository",
        "at least 1 character",
    ),
    Case("dtype-unknown", build(dtype="float8"), f"{S}.build.dtype", "allowed values: float16, bfloat16, float32"),
    Case(
        "unknown-build-key", build(max_input_lenght=10), f"{S}.build.max_input_lenght", "did you mean 'max_input_len'?"
    ),
    Case("unknown-section-key", {"trt_llm": {"build": LLAMA, "runtim": {}}}, f"{S}.runtim", "did you mean 'runtime'?"),
    Case(
        "unknown-plugin-key",
        build(plugin_configuration={"paged_kv_cach": True}),
        f"{S}.build.plugin_configuration.paged_kv_cach",
        "did you mean 'paged_kv_cache'?",
    ),
    Case(
        "unknown-serve-key",
        serve(tokenizer_repo="a/b"),
        f"{S}.serve.tokenizer_repo",
        "did you mean 'tokenizer_repository'?",
    ),
    Case("max-input-zero", build(max_input_len=0), f"{S}.build.max_input_len", "greater than or equal to 1"),
    Case("max-output-negative", build(max_output_len=-5), f"{S}.build.max_output_len", "greater than or equal to 1"),
    Case("max-input-not-int", build(max_input_len="long"), f"{S}.build.max_input_len", "valid integer"),
    Case("lengths-sum-cap", build(max_input_len=1 << 20, max_output_len=10), f"{S}.build.max_output_len", "exceeds"),
    Case("beam-zero", build(max_beam_width=0), f"{S}.build.max_beam_width", "greater than or equal to 1"),
    Case("batch-zero", build(max_batch_size=0), f"{S}.build.max_batch_size", "greater than or equal to 1"),
    Case("tp-zero", build(tensor_parallel_count=0), f"{S}.build.tensor_parallel_count", "greater than or equal to 1"),
    Case(
        "num-tokens-below-input",
        build(max_input_len=4096, max_num_tokens=1024),
        f"{S}.build.max_num_tokens",
        "enable_chunked_context",
    ),
    Case(
        "chatglm-needs-version",
        build(base_model_architecture="chatglm"),
        f"{S}.build.chatglm_model_version",
        "chatglm3_6b",
    ),
    Case(
        "baichuan-needs-version",
        build(base_model_architecture="baichuan"),
        f"{S}.build.baichuan_model_version",
        "v2_13b",
    ),
    Case(
        "chatglm-version-unknown",
        build(base_model_architecture="chatglm", chatglm_model_version="chatglm9"),
        f"{S}.build.chatglm_model_version",
        "allowed values",
    ),
    Case(
        "version-for-wrong-arch",
        build(baichuan_model_version="v2_7b"),
        f"{S}.build.baichuan_model_version",
        "only applies",
    ),
    Case(
        "smoothquant-without-sq",
        build(quantization_type="fp8", smoothquant={"alpha": 0.5}),
        f"{S}.build.smoothquant",
        "smooth_quant",
    ),
    Case(
        "smoothquant-alpha-range",
        build(quantization_type="SMOOTH_QUANT", smoothquant={"alpha": 1.5}),
        f"{S}.build.smoothquant.alpha",
        "less than or equal to 1",
    ),
    Case("awq-without-awq", build(awq={"calib_size": 64}), f"{S}.build.awq", "quantization_type awq"),
    Case(
        "tokens-per-block",
        build(plugin_configuration={"tokens_per_block": 100}),
        f"{S}.build.plugin_configuration.tokens_per_block",
        "power of two",
    ),
    Case(
        "bool-not-bool",
        build(plugin_configuration={"paged_kv_cache": "maybe"}),
        f"{S}.build.plugin_configuration.paged_kv_cache",
        "valid boolean",
    ),
    Case("build-and-serve", {"trt_llm": {"build": LLAMA, "serve": ENGINE}}, f"{S}:", "cannot both be set"),
    Case("neither-mode", {"trt_llm": {"runtime": {}}}, f"{S}:", "exactly one of build"),
    Case("section-not-mapping", {"trt_llm": "llama"}, f"{S}:", "expected a mapping"),
    Case("build-not-mapping", {"trt_llm": {"build": "llama"}}, f"{S}.build", "mapping"),
    Case(
        "engine-missing",
        {"trt_llm": {"serve": {"tensor_parallel_count": 1}}},
        f"{S}.serve.engine_repository",
        "required",
    ),
    Case("s3-no-bucket", serve(engine_repository="s3://"), f"{S}.serve.engine_repository", "s3://BUCKET"),
    Case(
        "s3-with-revision",
        serve(engine_repository="s3://b/engines", engine_revision="main"),
        f"{S}.serve.engine_revision",
        "s3://",
    ),
    Case(
        "runtime-backend",
        with_runtime(build(), backend="vllm"),
        f"{S}.runtime.backend",
        "allowed values: auto, tensorrtllm, llmapi, pytorch",
    ),
    Case(
        "runtime-fraction",
        with_runtime(build(), kv_cache_free_gpu_mem_fraction=1.5),
        f"{S}.runtime.kv_cache_free_gpu_mem_fraction",
        "less than or equal to 1",
    ),
    Case(
        "runtime-policy",
        with_runtime(build(), batch_scheduler_policy="fifo"),
        f"{S}.runtime.batch_scheduler_policy",
        "guaranteed_no_evict",
    ),
    Case(
        "runtime-instances",
        with_runtime(build(), preprocessing_instance_count=0),
        f"{S}.runtime.preprocessing_instance_count",
        "greater than or equal to 1",
    ),
    Case(
        "runtime-pytorch-device",
        with_runtime(build(), pytorch={"device": "tpu"}),
        f"{S}.runtime.pytorch.device",
        "allowed values: auto, cpu, cuda",
    ),
    Case(
        "runtime-synthetic-step",
        with_runtime(build(), pytorch={"synthetic": {"step_time_ms": -1}}),
        f"{S}.runtime.pytorch.synthetic.step_time_ms",
        ">= 0".replace(">= 0", "greater than or equal to 0"),
    ),
    Case(
        "runtime-synthetic-unknown",
        with_runtime(build(), pytorch={"synthetic": {"tokens_per_second": 5}}),
        f"{S}.runtime.pytorch.synthetic.tokens_per_second",
        "allowed keys: step_time_ms",
    ),
    Case(
        "kv-reuse-needs-fmha",
        {
            "trt_llm": {
                "build": {**LLAMA, "plugin_configuration": {"use_paged_context_fmha": False}},
                "runtime": {"enable_kv_cache_reuse": True},
            }
        },
        f"{S}.runtime.enable_kv_cache_reuse",
        "use_paged_context_fmha",
    ),
    Case(
        "kv-events-need-reuse",
        with_runtime(build(), event_buffer_max_size=1024),
        f"{S}.runtime.event_buffer_max_size",
        "needs runtime.enable_kv_cache_reuse",
    ),
    Case(
        "serve-pytorch-needs-model", with_runtime(serve(), backend="pytorch"), f"{S}.runtime.pytorch.model", "required"
    ),
    # hardware versus resources.accelerator
    Case(
        "fp8-on-a100", build(quantization_type="FP8"), f"{S}.build.quantization_type", "SM >= 8.9", accelerator="A100"
    ),
    Case(
        "fp8-kv-on-t4",
        build(quantization_type="fp8_kv"),
        f"{S}.build.quantization_type",
        "T4 is SM 7.5",
        accelerator="T4",
    ),
    Case("bf16-on-t4", build(dtype="bf16"), f"{S}.build.dtype", "bfloat16 needs SM >= 8.0", accelerator="T4"),
    Case(
        "tp-exceeds-gpus",
        build(tensor_parallel_count=4),
        f"{S}.build.tensor_parallel_count",
        "H100:4",
        accelerator="H100:2",
    ),
    Case(
        "tp-pp-exceeds-gpus",
        serve(tensor_parallel_count=2, pipeline_parallel_count=2),
        f"{S}.serve.tensor_parallel_count",
        "= 4 GPUs",
        accelerator="A100:2",
    ),
    Case("tp-without-gpus", build(tensor_parallel_count=2), f"{S}.build.tensor_parallel_count", "not set"),
    Case(
        "tensorrtllm-without-gpu", with_runtime(build(), backend="tensorrtllm"), f"{S}.runtime.backend", "needs a GPU"
    ),
    Case("accelerator-unknown", build(), "resources.accelerator", "did you mean 'H100'?", accelerator="H10O:2"),
    Case("accelerator-count", build(), "resources.accelerator", "positive integer", accelerator="H100:zero"),
    # legacy keys and truss's own key
    Case(
        "legacy-with-section",
        {**build(), "engine_repository": "org/engine"},
        "model_metadata.engine_repository",
        f"{S}.serve.engine_repository",
    ),
    Case(
        "legacy-bad-tp",
        {"engine_repository": "org/engine", "tensor_parallelism": "two"},
        f"{S}.serve.tensor_parallel_count",
        "valid integer",
    ),
    Case(
        "top-level-trt-llm",
        build(),
        "trt_llm:",
        "model_metadata.trt_llm",
        top_level={"trt_llm": {"build": {"base_model": "decoder"}}},
    ),
    # TRTLLM_ environment overrides
    Case(
        "env-unknown-field",
        build(),
        "TRTLLM_BUILD__MAX_INPUT_LENN",
        "did you mean TRTLLM_BUILD__MAX_INPUT_LEN?",
        env={"TRTLLM_BUILD__MAX_INPUT_LENN": "5"},
    ),
    Case(
        "env-unknown-section",
        build(),
        "TRTLLM_BUIDL__MAX_INPUT_LEN",
        f"unknown key {S}.buidl",
        env={"TRTLLM_BUIDL__MAX_INPUT_LEN": "5"},
    ),
    Case(
        "env-value-not-a-section",
        build(),
        "TRTLLM_BUILD__DTYPE__X",
        f"{S}.build.dtype is a value",
        env={"TRTLLM_BUILD__DTYPE__X": "1"},
    ),
    Case(
        "env-bad-int",
        build(),
        f"{S}.build.max_input_len",
        "[set by TRTLLM_BUILD__MAX_INPUT_LEN]",
        env={"TRTLLM_BUILD__MAX_INPUT_LEN": "1k"},
    ),
    Case(
        "env-bad-bool",
        build(),
        f"{S}.runtime.exclude_input_in_output",
        "valid boolean",
        env={"TRTLLM_RUNTIME__EXCLUDE_INPUT_IN_OUTPUT": "sometimes"},
    ),
    Case(
        "env-bad-enum",
        build(),
        f"{S}.runtime.pytorch.device",
        "allowed values",
        env={"TRTLLM_RUNTIME__PYTORCH__DEVICE": "gpu"},
    ),
    Case(
        "batches-under-load-above-idle",
        build(),
        f"{S}.runtime.batches.max_in_flight_under_load",
        "more than max_in_flight (4)",
        env={"TRTLLM_RUNTIME__BATCHES__MAX_IN_FLIGHT_UNDER_LOAD": "8"},
    ),
    Case(
        "batches-under-load-negative",
        build(),
        f"{S}.runtime.batches.max_in_flight_under_load",
        "greater than or equal to 0",
        env={"TRTLLM_RUNTIME__BATCHES__MAX_IN_FLIGHT_UNDER_LOAD": "-1"},
    ),
    Case(
        "env-serve-into-build",
        build(),
        f"{S}:",
        "cannot both be set",
        env={"TRTLLM_SERVE__ENGINE_REPOSITORY": "org/engine"},
    ),
    # DJL aliases
    Case(
        "djl-quantize",
        build(),
        f"{S}.build.quantization_type",
        "[set by OPTION_QUANTIZE (DJL alias)]",
        env={"OPTION_QUANTIZE": "gptq"},
    ),
    Case(
        "djl-tp-max-no-gpu",
        build(),
        f"{S}.build.tensor_parallel_count",
        "TENSOR_PARALLEL_DEGREE=max needs resources.accelerator",
        env={"TENSOR_PARALLEL_DEGREE": "max"},
    ),
    Case(
        "djl-tp-disagree",
        build(),
        f"{S}.build.tensor_parallel_count",
        "disagree",
        env={"TENSOR_PARALLEL_DEGREE": "2", "OPTION_TENSOR_PARALLEL_DEGREE": "4"},
        accelerator="H100:4",
    ),
    Case(
        "djl-build-alias-in-serve",
        serve(),
        f"{S}.build.max_input_len",
        "unset OPTION_MAX_INPUT_LEN",
        env={"OPTION_MAX_INPUT_LEN": "1024"},
    ),
    Case(
        "djl-tp-max-exceeds-pp",
        build(pipeline_parallel_count=2),
        f"{S}.build.tensor_parallel_count",
        "= 8 GPUs",
        env={"TENSOR_PARALLEL_DEGREE": "max"},
        accelerator="H100:4",
    ),
    Case("nothing-at-all", {"other": 1}, f"{S}:", "exactly one of build"),
    # YAML reads unquoted numbers as numbers: a repository or revision must be given as a string (quoted),
    # never coerced (`12345` would otherwise become the repo id "12345", `1e3` the revision "1000.0").
    Case("repository-int", build(huggingface_ckpt_repository=12345), f"{S}.build.huggingface_ckpt_repository", "string"),
    Case("revision-int", build(huggingface_ckpt_revision=1234567), f"{S}.build.huggingface_ckpt_revision", "string"),
    Case("revision-float", build(huggingface_ckpt_revision=1e3), f"{S}.build.huggingface_ckpt_revision", "string"),
    Case("publish-int", build(publish_repository=7), f"{S}.build.publish_repository", "string"),
    Case("engine-repository-int", serve(engine_repository=42), f"{S}.serve.engine_repository", "string"),
    Case("engine-revision-int", serve(engine_revision=7), f"{S}.serve.engine_revision", "string"),
    Case("tokenizer-repository-int", serve(tokenizer_repository=1), f"{S}.serve.tokenizer_repository", "string"),
    Case("tokenizer-revision-bool", serve(tokenizer_revision=True), f"{S}.serve.tokenizer_revision", "string"),
    Case(
        "tritonserver-path-int",
        with_runtime(serve(), tritonserver_path=5),
        f"{S}.runtime.tritonserver_path",
        "string",
    ),
    Case(
        "pytorch-model-int",
        with_runtime(build(), pytorch={"model": 3}),
        f"{S}.runtime.pytorch.model",
        "expected a string (quote the value in config.yaml)",
    ),
]


def write_truss(root: Path, case: Case) -> Path:
    config: dict[str, Any] = {"model_name": "case", "model_metadata": case.metadata, **case.top_level}
    if case.accelerator:
        config["resources"] = {"accelerator": case.accelerator}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    return root


def test_table_is_large_enough():
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_config_names_key_path(tmp_path: Path, case: Case):
    with pytest.raises(ConfigError) as info:
        load_config(write_truss(tmp_path, case), environ=case.env)
    problems = info.value.problems
    matching = [p for p in problems if p.startswith(case.expected_key) and case.fragment in p]
    assert matching, f"no line starts with {case.expected_key!r} and contains {case.fragment!r}: {problems}"
    for problem in problems:
        assert "\n" not in problem  # one actionable line each
    if case.expected_key.startswith(S + ".") and not case.expected_key.endswith(":"):
        # the path is followed by ':' exactly, so `build.max_input_len` never matches `build.max_input_lenn`
        assert any(p.startswith(case.expected_key + ":") for p in matching), matching


def test_all_problems_reported_at_once(tmp_path: Path):
    case = Case(
        "many", build(max_input_len=0, dtype="fp9", max_input_lenght=3), "", env={"TRTLLM_RUNTIME__BACKND": "x"}
    )
    with pytest.raises(ConfigError) as info:
        load_config(write_truss(tmp_path, case), environ=case.env)
    starts = sorted(p.split(":")[0] for p in info.value.problems)
    assert starts == sorted(
        [f"{S}.build.max_input_len", f"{S}.build.dtype", f"{S}.build.max_input_lenght", "TRTLLM_RUNTIME__BACKND"]
    )


def test_invalid_yaml_and_missing_file(tmp_path: Path):
    with pytest.raises(ConfigError, match="no truss configuration file"):
        load_config(tmp_path, environ={})
    (tmp_path / "config.yaml").write_text("model_metadata:\n  trt_llm: [\n")
    with pytest.raises(ConfigError, match=r"config.yaml: invalid YAML at line \d+"):
        load_config(tmp_path, environ={})
    (tmp_path / "config.yaml").write_text(
        "model_metadata:\n  trt_llm:\n    build:\n      max_input_len: 1\n      max_input_len: 2\n"
    )
    with pytest.raises(
        ConfigError, match=r"config.yaml: invalid YAML at line 5, column 7: duplicate key 'max_input_len'"
    ):
        load_config(tmp_path, environ={})


def test_secret_values_never_appear_in_errors(tmp_path: Path):
    token = "hf_" + "abcdefghijklmnopqrstuvwxyz012345"
    config = {
        "secrets": {"hf_access_token": token},
        "model_metadata": {
            "trt_llm": {"serve": {"engine_repository": f"https://user:{token}@example.com/x", "bogus": 1}}
        },
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as info:
        load_config(
            tmp_path, environ={"TRTLLM_SERVE__ENGINE_REVISION": "", "TRTLLM_SERVE__TENSOR_PARALLEL_COUNT": token}
        )
    text = str(info.value)
    assert f"{S}.serve.bogus" in text and f"{S}.serve.tensor_parallel_count" in text
    assert token not in text and "abcdefghijklmnop" not in text


def test_a_value_only_truss_holds_is_hidden_from_the_errors_once_given(tmp_path: Path):
    """truss's secrets mapping (a local run's values, in neither the environment nor /secrets) is read before
    anything is validated: a secret pasted into the wrong variable is not shown in the error naming it."""
    # Not shaped like a known credential (those are hidden by their shape): only the mapping says it is one.
    token = "open-sesame-" + uuid.uuid4().hex[:8]  # this test's own: redaction remembers values for the whole process
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"secrets": {"hf_access_token": None}}))
    environ = {"TRTLLM_SERVE__TENSOR_PARALLEL_COUNT": token}
    with pytest.raises(ConfigError) as unseen:
        load_config(tmp_path, environ=environ)
    assert token in str(unseen.value)  # nothing said it was a secret
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path, environ=environ, secrets={"hf_access_token": token})
    assert f"{S}.serve.tensor_parallel_count" in str(info.value) and token not in str(info.value)


def test_key_in_the_wrong_section_says_where_it_belongs(tmp_path: Path):
    case = Case("wrong-section", serve(max_input_len=10, kv_cache_free_gpu_mem_fraction=0.5), "")
    with pytest.raises(ConfigError) as info:
        load_config(write_truss(tmp_path, case), environ={})
    problems = info.value.problems
    assert any(
        p.startswith(f"{S}.serve.max_input_len: unknown key; max_input_len belongs in build;") for p in problems
    ), problems
    assert any(
        p.startswith(
            f"{S}.serve.kv_cache_free_gpu_mem_fraction: unknown key; kv_cache_free_gpu_mem_fraction belongs in runtime;"
        )
        for p in problems
    ), problems
