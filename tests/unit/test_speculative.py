"""`model_metadata.trt_llm.speculative`, FP4 and host KV offload: the schema, the refusals, and every name each
backend gets, checked against NVIDIA's records of named versions:

* trtllm-build flags: tests/data/trtllm_flags/{0.16.0,0.21.0}/trtllm-build.json (tensorrt_llm/commands/build.py);
* quantize.py flags: tests/data/trtllm_flags/0.21.0/quantize.json; 1.x QuantConfig: 1.2.0/llm_api.json;
* C++ backend parameters: tensorrtllm_backend v0.19.0 model_instance_state.cc (the contract test's table);
* llmapi `speculative_config` and `kv_cache_config`: 1.0.0/speculative_config.json, 1.0.0/llmapi_model.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from test_repository_nvidia_contract import NVIDIA_TENSORRTLLM_PARAMETERS, _accepts
from trtllm_flags_check import FLAGS_DIR, flag_problems, load_flags
from trtllm_truss.artifacts.build import LlmApiSpec, plan_build
from trtllm_truss.artifacts.build_recipes import BuildPlanError
from trtllm_truss.cli import main
from trtllm_truss.config.build import BuildConfig
from trtllm_truss.config.runtime import RuntimeConfig
from trtllm_truss.config.schema import TrtLlmConfig
from trtllm_truss.config.speculative import lookahead_max_draft_len
from trtllm_truss.planning.plan import ServingPlan
from trtllm_truss.repository import repository_configs
from trtllm_truss.repository.llmapi import llm_args as model_yaml_document
from trtllm_truss.planning.speculation import (
    engine_build,
    engine_speculation_problem,
    speculation_problems,
)

SPECULATIVE_RECORD = json.loads((FLAGS_DIR / "1.0.0" / "speculative_config.json").read_text())
LLMAPI_RECORD = json.loads((FLAGS_DIR / "1.0.0" / "llmapi_model.json").read_text())
LLM_API_1_2 = json.loads((FLAGS_DIR / "1.2.0" / "llm_api.json").read_text())
BUILD = {"base_model_architecture": "llama", "huggingface_ckpt_repository": "owner/model"}
LOOKAHEAD = {"speculative_decoding_mode": "lookahead", "lookahead_window_size": 8, "lookahead_ngram_size": 3,
             "lookahead_verification_set_size": 3}


def _config(speculative: dict | None, build: dict | None = None, runtime: dict | None = None) -> TrtLlmConfig:
    return TrtLlmConfig.model_validate(
        {"build": {**BUILD, **(build or {})}, "runtime": runtime or {}, "speculative": speculative}
    )


# ---- schema -------------------------------------------------------------------------------------------


def test_baseten_speculator_names_are_accepted() -> None:
    config = _config({"speculative_decoding_mode": "LOOKAHEAD_DECODING", "lookahead_window_size": 5,
                      "lookahead_ngram_size": 5, "lookahead_verification_set_size": 5})
    assert config.speculative.speculative_decoding_mode.value == "lookahead"
    draft = _config({"speculative_decoding_mode": "DRAFT_TOKENS_EXTERNAL", "num_draft_tokens": 4,
                     "draft_repository": "owner/draft"})
    assert draft.speculative.speculative_decoding_mode.value == "draft_target"


@pytest.mark.parametrize(
    "window,ngram,verification,expected",
    [(4, 3, 4, 15), (8, 3, 3, 21), (5, 5, 5, 39), (1, 1, 0, 0), (8, 2, 1, 8)],
)
def test_lookahead_draft_len_is_nvidias_formula(window: int, ngram: int, verification: int, expected: int) -> None:
    # (N == 1 ? 0 : N - 2) + (W - 1 + G) * (N - 1): decodingConfig.cpp calculateSpeculativeResourceTuple
    assert lookahead_max_draft_len(window, ngram, verification) == expected


@pytest.mark.parametrize(
    "speculative,key,message",
    [
        ({"speculative_decoding_mode": "lookahead", "lookahead_ngram_size": 1, "lookahead_window_size": 4},
         "lookahead_ngram_size", "must be 1"),
        ({"speculative_decoding_mode": "ngram", "num_draft_tokens": 4}, "ngram_max_matching_size", "required"),
        ({"speculative_decoding_mode": "eagle3", "num_draft_tokens": 3}, "draft_repository", "required"),
        ({"speculative_decoding_mode": "lookahead", "num_draft_tokens": 3}, "num_draft_tokens", "does not apply"),
        ({"speculative_decoding_mode": "medusa"}, "speculative_decoding_mode", "allowed values"),
    ],
)
def test_schema_refusals_name_the_key(speculative: dict, key: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        _config(speculative)
    named = {e.get("ctx", {}).get("field") for e in info.value.errors()} | {str(e["loc"][-1]) for e in info.value.errors()}
    assert key in named and message in str(info.value)


def test_beam_search_with_speculation_is_refused() -> None:
    with pytest.raises(ValidationError, match="beam_search"):
        _config(LOOKAHEAD, build={"max_beam_width": 4})


# ---- what each backend refuses --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "speculative,backend,version,refused",
    [
        (LOOKAHEAD, "tensorrtllm", "0.19.0", None),
        (LOOKAHEAD, "tensorrtllm", "0.16.0", "needs TensorRT-LLM >= 0.19"),
        (LOOKAHEAD, "llmapi", "1.0.0", "refuses Lookahead"),
        ({"speculative_decoding_mode": "draft_target", "num_draft_tokens": 4, "draft_repository": "o/d"},
         "tensorrtllm", "0.21.0", "tensorrt_llm_bls"),
        ({"speculative_decoding_mode": "eagle3", "num_draft_tokens": 3, "draft_repository": "o/e"},
         "tensorrtllm", "1.0.0", "LLM-API backend only"),
        ({"speculative_decoding_mode": "eagle3", "num_draft_tokens": 3, "draft_repository": "o/e"},
         "llmapi", "1.0.0", None),
        ({"speculative_decoding_mode": "mtp", "num_draft_tokens": 1}, "llmapi", "1.0.0", "DeepSeek-V3"),
        ({"speculative_decoding_mode": "ngram", "num_draft_tokens": 4, "ngram_max_matching_size": 3},
         "llmapi", "1.0.0", None),
        (LOOKAHEAD, "pytorch", None, None),  # the stand-in: a config warning, not a plan refusal
    ],
)
def test_backend_refusals_give_nvidias_reason(speculative, backend, version, refused) -> None:
    problems = speculation_problems(_config(speculative), backend, version)
    if refused is None:
        assert problems == []
    else:
        assert len(problems) == 1 and refused in problems[0]
        assert problems[0].startswith("model_metadata.trt_llm.speculative.speculative_decoding_mode:")


def test_mtp_is_allowed_for_deepseek() -> None:
    config = _config({"speculative_decoding_mode": "mtp", "num_draft_tokens": 2},
                     build={"base_model_architecture": "deepseek"})
    assert speculation_problems(config, "llmapi", "1.0.0") == []


# ---- engine builds ----------------------------------------------------------------------------------------


def _plan_build(config: TrtLlmConfig, version: str):
    return plan_build(engine_build(config.build, config.speculative), trtllm_version=version,
                      checkpoint_dir=Path("/ckpt"), output_dir=Path("/engine"), work_dir=Path("/work"),
                      examples_dir=None, python="python3")


@pytest.mark.parametrize("version", ["0.16.0", "0.21.0"])
def test_lookahead_engine_build_flags_are_in_nvidias_trtllm_build(version: str) -> None:
    plan = _plan_build(_config(LOOKAHEAD), version)
    build = plan.steps[-1].argv
    core = load_flags(version, "trtllm-build")
    plugins = load_flags(version, "trtllm-build.plugin_args")
    assert flag_problems(build[1:], {**core["flags"], **plugins["flags"]}, ["--checkpoint_dir"]) == []
    mode = build[build.index("--speculative_decoding_mode") + 1]
    assert mode == "lookahead_decoding" and mode in core["flags"]["--speculative_decoding_mode"]["choices"]
    assert build[build.index("--max_draft_len") + 1] == str(lookahead_max_draft_len(8, 3, 3)) == "21"


def test_speculation_changes_the_engine_cache_key() -> None:
    from trtllm_truss.planning.plan import engine_cache_key
    from trtllm_truss.planning.probe import RuntimeFacts

    plain = _config(None).build
    key = lambda build: engine_cache_key(build, checkpoint_revision="a" * 40, facts=RuntimeFacts())
    assert key(engine_build(plain, None)) == key(plain)
    assert key(engine_build(plain, _config(LOOKAHEAD).speculative)) != key(plain)


def test_lookahead_engine_on_1x_passes_nvidias_lookahead_config() -> None:
    plan = _plan_build(_config(LOOKAHEAD), "1.2.0")
    spec = plan.llm_api_spec
    assert spec is not None and "speculative_config" in LLMAPI_RECORD["llm_args"]
    lookahead = SPECULATIVE_RECORD["decoding_types"]["Lookahead"]
    assert spec.speculative_config["decoding_type"] == "Lookahead"
    assert set(spec.speculative_config) - {"decoding_type"} <= set(lookahead["fields"])
    assert LlmApiSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize("quantization,qformat,kv", [("fp4", "nvfp4", None), ("fp4_kv", "nvfp4", "fp8")])
def test_fp4_quantize_flags_in_the_0_21_record(quantization: str, qformat: str, kv: str | None) -> None:
    plan = _plan_build(_config(None, build={"quantization_type": quantization}), "0.21.0")
    argv = plan.steps[0].argv
    record = load_flags("0.21.0", "quantize")
    assert flag_problems(argv[2:], record["flags"], record["required"]) == []
    assert argv[argv.index("--qformat") + 1] == qformat
    assert (argv[argv.index("--kv_cache_dtype") + 1] if kv else "--kv_cache_dtype" not in argv) in (kv, True)


def test_fp4_needs_0_17_and_fp4_kv_cache_needs_1x() -> None:
    with pytest.raises(BuildPlanError, match="0.17"):
        _plan_build(_config(None, build={"quantization_type": "fp4"}), "0.16.0")
    with pytest.raises(BuildPlanError, match="no FP4 KV cache"):
        _plan_build(_config(None, build={"quantization_type": "fp4_fp4_kv"}), "0.21.0")
    spec = _plan_build(_config(None, build={"quantization_type": "fp4_fp4_kv"}), "1.2.0").llm_api_spec
    assert spec.quant_config == {"quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4"}
    assert "NVFP4" in LLM_API_1_2["quant_algo_members"] and "NVFP4" in LLM_API_1_2["kv_cache_quant_algo_members"]


# ---- runtime names ------------------------------------------------------------------------------------------


def test_cpp_backend_parameters_for_lookahead_and_host_offload() -> None:
    config = _config(LOOKAHEAD, runtime={"kv_cache_host_memory_bytes": 1 << 34, "kv_cache_onboard_blocks": True})
    plan = ServingPlan(backend="tensorrtllm", tokenizer_dir=Path("/t"), engine_dir=Path("/e"), max_batch_size=8,
                       max_input_len=64, max_output_len=64, runtime=config.runtime, speculative=config.speculative)
    params = repository_configs(plan)["tensorrt_llm"].parameter_dict
    for name, value in params.items():
        assert _accepts(NVIDIA_TENSORRTLLM_PARAMETERS[name], value), (name, value)
    assert params["decoding_mode"] == "lookahead"
    assert (params["lookahead_window_size"], params["lookahead_ngram_size"],
            params["lookahead_verification_set_size"]) == ("8", "3", "3")
    assert params["kv_cache_host_memory_bytes"] == str(1 << 34) and params["kv_cache_onboard_blocks"] == "true"


@pytest.mark.parametrize(
    "speculative,expected",
    [
        ({"speculative_decoding_mode": "eagle3", "num_draft_tokens": 3, "draft_repository": "o/e"},
         {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model_dir": "/models/draft"}),
        ({"speculative_decoding_mode": "draft_target", "num_draft_tokens": 5, "draft_repository": "o/d"},
         {"decoding_type": "DraftTarget", "max_draft_len": 5, "speculative_model_dir": "/models/draft"}),
        ({"speculative_decoding_mode": "ngram", "num_draft_tokens": 4, "ngram_max_matching_size": 3},
         {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 3}),
        ({"speculative_decoding_mode": "mtp", "num_draft_tokens": 3},
         {"decoding_type": "MTP", "num_nextn_predict_layers": 3}),
    ],
)
def test_llmapi_speculative_config_uses_the_1_0_names(speculative: dict, expected: dict) -> None:
    config = _config(speculative, build={"base_model_architecture": "deepseek"},
                     runtime={"kv_cache_host_memory_bytes": 1 << 30})
    document = model_yaml_document(config.build, config.runtime, "/models/ckpt", config.speculative, "/models/draft")
    assert document["speculative_config"] == expected
    record = SPECULATIVE_RECORD["decoding_types"][expected["decoding_type"]]
    assert set(expected) - {"decoding_type"} <= set(record["fields"]) and "pytorch" in record["backends"]
    assert document["kv_cache_config"]["host_cache_size"] == 1 << 30
    assert set(document["kv_cache_config"]) <= set(LLMAPI_RECORD["kv_cache_config_fields"])


def test_validate_prints_the_llmapi_speculative_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "resources": {"accelerator": "H100"},
        "model_metadata": {"trt_llm": {
            "build": {**BUILD, "huggingface_ckpt_repository": str(tmp_path)},
            "runtime": {"backend": "llmapi"},
            "speculative": {"speculative_decoding_mode": "ngram", "num_draft_tokens": 4, "ngram_max_matching_size": 3},
        }},
    }))
    assert main(["validate", str(tmp_path), "--trtllm-version", "1.0.0"]) == 0
    out = capsys.readouterr().out
    assert "speculative_config:" in out and "decoding_type: NGram" in out


def test_validate_refuses_lookahead_on_llmapi_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "resources": {"accelerator": "H100"},
        "model_metadata": {"trt_llm": {"build": {**BUILD, "huggingface_ckpt_repository": str(tmp_path)},
                                       "runtime": {"backend": "llmapi"}, "speculative": LOOKAHEAD}},
    }))
    assert main(["validate", str(tmp_path), "--trtllm-version", "1.0.0"]) == 1
    err = capsys.readouterr().err
    assert "speculative.speculative_decoding_mode" in err and "refuses Lookahead" in err


def test_fp4_on_hopper_is_refused_naming_the_accelerator(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "resources": {"accelerator": "H100:2"},
        "model_metadata": {"trt_llm": {"build": {**BUILD, "quantization_type": "nvfp4", "tensor_parallel_count": 2}}},
    }))
    assert main(["validate", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "quantization_type: fp4 (NVFP4) needs a Blackwell GPU" in err and "H100 is SM 9.0" in err


def test_build_config_subclass_validates_like_the_build_section() -> None:
    build = BuildConfig(**BUILD)
    assert engine_build(build, None) is build
    assert RuntimeConfig().kv_cache_host_memory_bytes is None


def test_validate_prints_the_lookahead_engine_flags_and_parameters(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "resources": {"accelerator": "H100"},
        "model_metadata": {"trt_llm": {"build": {**BUILD, "huggingface_ckpt_repository": str(tmp_path)},
                                       "runtime": {"backend": "tensorrtllm"}, "speculative": LOOKAHEAD}},
    }))
    assert main(["validate", str(tmp_path), "--trtllm-version", "0.19.0"]) == 0
    out = capsys.readouterr().out
    assert "--speculative_decoding_mode lookahead_decoding --max_draft_len 21" in out
    assert ("# tensorrt_llm parameters for speculative decoding: decoding_mode=lookahead, lookahead_window_size=8,"
            " lookahead_ngram_size=3, lookahead_verification_set_size=3") in out
    assert main(["validate", str(tmp_path), "--trtllm-version", "0.18.0"]) == 1
    assert "needs TensorRT-LLM >= 0.19" in capsys.readouterr().err


def test_a_served_engine_must_have_been_built_for_the_lookahead_sizes() -> None:
    spec = _config(LOOKAHEAD).speculative  # needs 21 draft tokens
    # build_config as NVIDIA writes it: speculative_decoding_mode is the SpeculativeDecodingMode IntFlag
    assert "was not built for it" in engine_speculation_problem({"speculative_decoding_mode": 1, "max_draft_len": 0}, spec)
    assert "--max_draft_len 8" in engine_speculation_problem({"speculative_decoding_mode": 8, "max_draft_len": 8}, spec)
    assert engine_speculation_problem({"speculative_decoding_mode": 8, "max_draft_len": 21}, spec) is None
