"""Generated build commands vs. the flags NVIDIA's scripts of each targeted version accept.

The flag lists in tests/data/trtllm_flags/<version>/ were read from NVIDIA/TensorRT-LLM sources
(each file names its path and commit). Every architecture x quantization combination the schema
accepts must produce commands whose every flag exists, whose values are in the accepted choices, and
which carry the required flags.
"""

from __future__ import annotations

import itertools
import json
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError
from trtllm_flags_check import FLAGS_DIR, flag_problems, load_flags
from trtllm_truss.artifacts.build import BuildPlan, BuildStep, plan_build
from trtllm_truss.artifacts.build_recipes import BuildPlanError
from trtllm_truss.artifacts.target import IMAGE_TRTLLM_VERSIONS as IMAGE_TRTLLM_VERSION
from trtllm_truss.config.build import BuildConfig
from trtllm_truss.config.enums import (
    Architecture,
    BaichuanModelVersion,
    ChatglmModelVersion,
    Quantization,
)

LLAMA_FAMILY = {Architecture.LLAMA, Architecture.MISTRAL, Architecture.MIXTRAL, Architecture.DEEPSEEK, Architecture.INTERNLM}
CONVERT_FLAGS_FILE = {
    **{arch: "llama" for arch in LLAMA_FAMILY},
    Architecture.FALCON: "falcon",
    Architecture.GPTJ: "gptj",
    Architecture.BAICHUAN: "baichuan",
    Architecture.CHATGLM: "chatglm",
    Architecture.QWEN: "qwen",
    Architecture.GPT2: "gpt",
    Architecture.SANTACODER: "gpt",
    Architecture.STARCODER: "gpt",
}


def config_for(arch: Architecture, quant: Quantization, **extra) -> BuildConfig | None:
    fields = {
        "base_model_architecture": arch,
        "huggingface_ckpt_repository": "owner/model",
        "quantization_type": quant,
        "tensor_parallel_count": 2,
        **extra,
    }
    if arch is Architecture.CHATGLM:
        fields["chatglm_model_version"] = ChatglmModelVersion.CHATGLM3_6B
    if arch is Architecture.BAICHUAN:
        fields["baichuan_model_version"] = BaichuanModelVersion.V2_13B
    try:
        return BuildConfig(**fields)
    except ValidationError:
        return None  # the schema rejects this combination


def make_plan(config: BuildConfig, version: str) -> BuildPlan:
    return plan_build(
        config,
        trtllm_version=version,
        checkpoint_dir=Path("/ckpt"),
        output_dir=Path("/engine"),
        work_dir=Path("/work"),
        examples_dir=None,
        python="python3",
    )


def script_args(step: BuildStep) -> tuple[str, ...]:
    assert step.argv[0] == "python3"
    return step.argv[2:]


COMBINATIONS = list(itertools.product(Architecture, Quantization))


@pytest.mark.parametrize("arch,quant", COMBINATIONS, ids=[f"{a.value}-{q.value}" for a, q in COMBINATIONS])
def test_late_0x_commands_accepted(arch: Architecture, quant: Quantization) -> None:
    version = "0.21.0"
    config = config_for(arch, quant)
    if config is None:
        pytest.skip("combination rejected by the schema")
    if quant is Quantization.FP4_FP4_KV:  # the 0.21.0 quantize.py record: --kv_cache_dtype int8 | fp8
        with pytest.raises(BuildPlanError, match="no FP4 KV cache"):
            make_plan(config, version)
        return
    plan = make_plan(config, version)
    first, build = plan.steps
    if first.name == "convert_checkpoint":
        flags = load_flags(version, f"convert_checkpoint.{CONVERT_FLAGS_FILE[arch]}")
        assert first.argv[1].endswith(flags["source"]["path"].removeprefix("examples/")), first.argv[1]
    else:
        assert first.name == "quantize"
        flags = load_flags(version, "quantize")
        assert first.argv[1].endswith("examples/quantization/quantize.py")
    assert flag_problems(script_args(first), flags["flags"], flags["required"]) == []
    core = load_flags(version, "trtllm-build")
    plugins = load_flags(version, "trtllm-build.plugin_args")
    assert build.argv[0] == "trtllm-build"
    assert flag_problems(build.argv[1:], {**core["flags"], **plugins["flags"]}, ["--checkpoint_dir", "--output_dir"]) == []


@pytest.mark.parametrize("arch", sorted(LLAMA_FAMILY, key=lambda a: a.value), ids=lambda a: a.value)
@pytest.mark.parametrize("quant", [Quantization.NO_QUANT, Quantization.WEIGHTS_INT8, Quantization.WEIGHTS_KV_INT4, Quantization.SMOOTH_QUANT], ids=lambda q: q.value)
def test_0_11_convert_and_plugin_flags_accepted(arch: Architecture, quant: Quantization) -> None:
    """0.11.0: convert_checkpoint (llama family) and the plugin options of trtllm-build."""
    version = "0.11.0"
    config = config_for(arch, quant, plugin_configuration={"multi_block_mode": True})
    assert config is not None
    first, build = make_plan(config, version).steps
    assert first.argv[1] == "examples/llama/convert_checkpoint.py"
    flags = load_flags(version, "convert_checkpoint.llama")
    assert flag_problems(script_args(first), flags["flags"], flags["required"]) == []
    plugin_flags = load_flags(version, "trtllm-build.plugin_args")["flags"]
    args = build.argv[1:]
    for index, token in enumerate(args):
        if token.startswith("--") and (token.endswith("_plugin") or args[index + 1] in ("enable", "disable")):
            assert token in plugin_flags, f"{token} is not a plugin option of {version}"
            choices = plugin_flags[token]["choices"]
            assert choices is None or args[index + 1] in choices
    assert "--paged_kv_cache" in args and "--kv_cache_type" not in args
    assert "--multi_block_mode" in args


@pytest.mark.parametrize("arch,quant", COMBINATIONS, ids=[f"{a.value}-{q.value}" for a, q in COMBINATIONS])
def test_llm_api_arguments_accepted(arch: Architecture, quant: Quantization) -> None:
    config = config_for(arch, quant)
    if config is None:
        pytest.skip("combination rejected by the schema")
    plan = make_plan(config, "1.2.0")
    api = json.loads((FLAGS_DIR / "1.2.0" / "llm_api.json").read_text())
    spec = plan.llm_api_spec
    assert plan.flow == "llm_api" and spec is not None
    assert set(plan.steps[0].argv[1:3]) == {"-m", "trtllm_truss.artifacts.llmapi_build"}
    assert {"model", "dtype", "tensor_parallel_size", "pipeline_parallel_size"} <= set(api["llm_kwargs"])
    assert set(spec.build_config) <= set(api["build_config_fields"])
    assert spec.build_config["kv_cache_type"] in api["kv_cache_type_members"]
    assert set(spec.plugin_config) <= set(api["plugin_config_fields"])
    for name in ("gemm_plugin", "gpt_attention_plugin"):
        assert spec.plugin_config[name] in api["plugin_dtype_choices"]
    assert set(spec.quant_config) <= set(api["quant_config_fields"])
    if "quant_algo" in spec.quant_config:
        assert spec.quant_config["quant_algo"] in api["quant_algo_members"]
    if "kv_cache_quant_algo" in spec.quant_config:
        assert spec.quant_config["kv_cache_quant_algo"] in api["kv_cache_quant_algo_members"]
    if spec.calib_config is not None:
        assert set(spec.calib_config) <= set(api["calib_config_fields"])


def test_checker_catches_the_hyphen_bug() -> None:
    """The flag an older truss passed (`--int8-kv_cache`) must fail the check."""
    flags = load_flags("0.21.0", "convert_checkpoint.llama")
    assert flag_problems(("--model_dir", "m", "--output_dir", "o", "--int8-kv_cache"), flags["flags"], []) == [
        "--int8-kv_cache is not a flag of this version"
    ]
    assert flag_problems(("--weight_only_precision", "int2"), flags["flags"], [])[0].startswith("--weight_only_precision 'int2'")


def test_quantization_mapping() -> None:
    mk = lambda q, **kw: make_plan(config_for(Architecture.LLAMA, q, **kw), "0.21.0").steps[0].argv
    assert mk(Quantization.FP8_KV)[mk(Quantization.FP8_KV).index("--qformat") + 1] == "fp8"
    assert "--kv_cache_dtype" in mk(Quantization.FP8_KV) and "--kv_cache_dtype" not in mk(Quantization.FP8)
    awq = mk(Quantization.AWQ, awq={"calib_size": 64})
    assert awq[awq.index("--qformat") + 1] == "int4_awq" and awq[awq.index("--calib_size") + 1] == "64"
    sq = mk(Quantization.SMOOTH_QUANT, smoothquant={"alpha": 0.5, "per_token": True})
    assert sq[sq.index("--smoothquant") + 1] == "0.5" and "--per_token" in sq and "--per_channel" not in sq
    # Falcon's converter has no INT8 KV cache: the plan falls back to quantize.py.
    falcon = make_plan(config_for(Architecture.FALCON, Quantization.WEIGHTS_KV_INT8), "0.21.0").steps[0]
    assert falcon.name == "quantize" and falcon.argv[falcon.argv.index("--kv_cache_dtype") + 1] == "int8"


def test_versions_change_the_flow_and_spelling() -> None:
    config = config_for(Architecture.LLAMA, Quantization.NO_QUANT)
    old = make_plan(config, "0.11.0").steps[1].argv
    new = make_plan(config, "0.21.0").steps[1].argv
    assert "--max_output_len" in old and "--max_seq_len" in new
    assert new[new.index("--max_seq_len") + 1] == str(config.max_input_len + config.max_output_len)
    assert make_plan(config, "1.0.0rc4").flow == "llm_api"
    with pytest.raises(ValueError, match="0.9 or newer"):
        make_plan(config, "0.8.0")


def test_chatglm_rejects_pipeline_parallel() -> None:
    config = config_for(Architecture.CHATGLM, Quantization.NO_QUANT, pipeline_parallel_count=2)
    with pytest.raises(ValueError, match="build.pipeline_parallel_count must be 1 for chatglm"):
        make_plan(config, "0.21.0")


def test_example_dir_found_in_the_release_wins_over_the_version_rule(tmp_path: Path) -> None:
    from trtllm_truss.artifacts.build_recipes import TrtllmVersion as V
    from trtllm_truss.artifacts.build_recipes import convert_script_relpath

    assert convert_script_relpath(Architecture.FALCON, V.parse("0.16.0")) == "falcon/convert_checkpoint.py"
    assert convert_script_relpath(Architecture.FALCON, V.parse("0.21.0")) == "models/contrib/falcon/convert_checkpoint.py"
    (tmp_path / "falcon").mkdir()
    (tmp_path / "falcon" / "convert_checkpoint.py").write_text("")
    assert convert_script_relpath(Architecture.FALCON, V.parse("0.21.0"), tmp_path) == "falcon/convert_checkpoint.py"
    (tmp_path / "internlm").mkdir()
    (tmp_path / "internlm" / "convert_checkpoint.py").write_text("")
    assert convert_script_relpath(Architecture.INTERNLM, V.parse("0.12.0"), tmp_path) == "internlm/convert_checkpoint.py"
    assert convert_script_relpath(Architecture.INTERNLM, V.parse("0.12.0")) == "llama/convert_checkpoint.py"


def test_recorded_flag_files_are_well_formed() -> None:
    files = sorted(FLAGS_DIR.glob("*/*.json"))
    assert {p.parent.name for p in files} >= {"0.11.0", "0.21.0", "1.0.0", "1.2.0"}
    for path in files:
        doc = json.loads(path.read_text())
        assert doc["trtllm_version"] == path.parent.name, path
        assert doc["source"]["repository"] == "NVIDIA/TensorRT-LLM" and doc["source"]["path"], path
        # A commit, or (where the code index does not expose it) the index id and a version_basis saying so.
        assert doc["source"].get("commit") or (doc["source"].get("index_id") and doc["version_basis"]), path
        for flag, spec in doc.get("flags", {}).items():
            assert flag.startswith("-") and isinstance(spec["takes_value"], bool), (path, flag)
            assert spec["choices"] is None or all(isinstance(c, str) for c in spec["choices"]), (path, flag)


def test_flag_extractor_reads_argparse_calls(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("extract_argparse_flags", FLAGS_DIR / "extract_argparse_flags.py")
    extractor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extractor)
    source = textwrap.dedent("""\
        import argparse
        VERSIONS = ['a', 'b']
        def parse():
            p = argparse.ArgumentParser()
            p.add_argument('--model_dir', type=str, required=True)
            p.add_argument('--smoothquant', '-sq', type=float, default=None)
            p.add_argument('--int8_kv_cache', action='store_true')
            p.add_argument('--weight_only_precision', nargs='?', const='int8', choices=['int8', 'int4'])
            p.add_argument('--variant', default=None, choices=[None] + VERSIONS)
            p.add_argument('--embedding_sharding_dim', type=int, choices=[0, 1])
            p.add_argument('positional')
            return p
        """)
    flags, required = extractor.extract_flags(source)
    assert required == ["--model_dir"]
    assert flags["-sq"] == flags["--smoothquant"] == {"takes_value": True, "choices": None}
    assert flags["--int8_kv_cache"] == {"takes_value": False, "choices": None}
    assert flags["--weight_only_precision"]["choices"] == ["int8", "int4"]
    assert flags["--variant"]["choices_unresolved"] == "[None] + VERSIONS"
    assert flags["--embedding_sharding_dim"]["choices"] == ["0", "1"]
    assert "positional" not in flags


# The TensorRT-LLM release inside each NVIDIA image a shipped example names (NVIDIA's framework
# support matrix: Triton 24.12 trtllm-python-py3 carries TensorRT-LLM 0.16.0; tensorrtllm_backend
# tag v0.16.0 pins that TensorRT-LLM commit).
EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


def _shipped_build_examples() -> list[Path]:
    return sorted(p for p in EXAMPLES_DIR.glob("*/config.yaml") if "build:" in p.read_text())


@pytest.mark.parametrize("config_path", _shipped_build_examples(), ids=lambda p: p.parent.name)
def test_shipped_examples_build_with_flags_of_their_images_release(config_path: Path) -> None:
    """Each example's trtllm-build command uses only options recorded for the TensorRT-LLM of its image;
    settings that release would ignore are refused (none in the shipped examples)."""
    import yaml
    from trtllm_truss.config.schema import TrtLlmConfig
    from trtllm_truss.planning.backend_settings import backend_setting_problems
    from trtllm_truss.planning.speculation import engine_build, speculation_problems

    raw = yaml.safe_load(config_path.read_text())
    version = IMAGE_TRTLLM_VERSION[raw["base_image"]["image"]]
    config = TrtLlmConfig.model_validate(raw["model_metadata"]["trt_llm"])
    if config.runtime.backend.value == "llmapi":
        pytest.skip("backend llmapi builds no engine (its model.yaml: test_example_plans.py)")
    assert backend_setting_problems(config, "tensorrtllm", version) == []
    assert speculation_problems(config, "tensorrtllm", version) == []
    build = make_plan(engine_build(config.build, config.speculative), version).steps[1]
    core = load_flags(version, "trtllm-build")
    plugins = load_flags(version, "trtllm-build.plugin_args")
    assert build.argv[0] == "trtllm-build"
    assert flag_problems(build.argv[1:], {**core["flags"], **plugins["flags"]}, ["--checkpoint_dir", "--output_dir"]) == []
    assert "--kv_cache_type" in build.argv and "--multi_block_mode" not in build.argv


def test_0_16_records_catch_options_that_release_does_not_have() -> None:
    core = load_flags("0.16.0", "trtllm-build")["flags"]
    plugins = load_flags("0.16.0", "trtllm-build.plugin_args")["flags"]
    accepted = {**core, **plugins}
    assert flag_problems(("--multi_block_mode",), accepted, []) == ["--multi_block_mode is not a flag of this version"]
    assert flag_problems(("--max_output_len",), accepted, []) == ["--max_output_len is not a flag of this version"]
    assert flag_problems(("--kv_cache_type", "paged", "--use_fused_mlp", "enable"), accepted, []) == []
