"""What `trtllm-truss validate` and `build --dry-run` print for each shipped example, checked against NVIDIA.

Both commands plan for the deployment's machine: the TensorRT-LLM of the example's `base_image`, the GPUs
of `resources.accelerator`. Every command they print is parsed and each flag (and value, where the
script restricts it) must be in the records of that TensorRT-LLM version under tests/data/trtllm_flags/
(each names the NVIDIA source path and commit). `validate` also runs the plan-time refusals: a setting the
chosen backend would ignore is an error naming its key, exit 1, before anything is downloaded or built.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trtllm_flags_check import command_problems, flag_problems, load_flags, printed_commands
from trtllm_truss.artifacts.target import IMAGE_TRTLLM_VERSIONS
from trtllm_truss.cli import main
from trtllm_truss.planning.probe import RuntimeFacts

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.parent for p in (REPO / "examples").glob("*/config.yaml"))
IMAGES_DIR = REPO / "tests" / "data" / "images"
LLMAPI_NAMES = json.loads((REPO / "tests" / "data" / "trtllm_flags" / "1.0.0" / "llmapi_model.json").read_text())


@pytest.fixture(autouse=True)
def laptop(monkeypatch, tmp_path):
    """A machine without TensorRT-LLM or GPUs (as a developer's or CI's), with no reachable hub: the plans
    must come from the config alone."""
    import trtllm_truss.planning.probe

    monkeypatch.setattr(trtllm_truss.planning.probe, "probe_facts", lambda **kwargs: RuntimeFacts())
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # refused at once: the cache key stays unknown
    monkeypatch.setenv("TRTLLM_TRUSS_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    for name in ("TRTLLM_EXAMPLES_DIR", "HF_TOKEN", "TRUSS_SECRET_hf_access_token"):
        monkeypatch.delenv(name, raising=False)


def _image_version(example: Path) -> str:
    image = yaml.safe_load((example / "config.yaml").read_text())["base_image"]["image"]
    return IMAGE_TRTLLM_VERSIONS[image]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_image_versions_agree_with_the_recorded_images() -> None:
    recorded = {}
    for path in IMAGES_DIR.glob("*.json"):
        doc = json.loads(path.read_text())
        recorded[doc["image"]] = doc["trtllm_version"]
    version_only = json.loads((REPO / "tests" / "data" / "image_versions.json").read_text())["images"]
    assert not set(version_only) & set(recorded)
    recorded.update({image: entry["trtllm_version"] for image, entry in version_only.items()})
    assert IMAGE_TRTLLM_VERSIONS == recorded
    for example in EXAMPLES:  # every example names an image whose TensorRT-LLM we know
        assert _image_version(example)


@pytest.mark.parametrize("command", [["validate"], ["build", "--dry-run"]], ids=["validate", "build-dry-run"])
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_plan_uses_only_flags_of_its_images_release(example: Path, command: list[str], capsys) -> None:
    version = _image_version(example)
    code, out, err = _run(capsys, command[0], str(example), *command[1:])
    assert code == 0, err
    assert f"TensorRT-LLM {version} (base_image " in out
    config = yaml.safe_load((example / "config.yaml").read_text())["model_metadata"]["trt_llm"]
    commands = printed_commands(out)
    if config.get("runtime", {}).get("backend") == "llmapi":  # no build: the model.yaml, in 1.0's names
        assert commands == [] and "(llmapi): no engine build" in out
        document = yaml.safe_load(out.split("model.yaml of the Triton repository:\n", 1)[1].split("\n# KV cache")[0])
        assert set(document) <= set(LLMAPI_NAMES["llm_args"])
        speculative = document.get("speculative_config")
        if speculative is not None:
            record = json.loads((REPO / "tests" / "data" / "trtllm_flags" / "1.0.0" / "speculative_config.json").read_text())
            assert set(speculative) - {"decoding_type"} <= set(record["decoding_types"][speculative["decoding_type"]]["fields"])
        return
    if "serve" in config:
        assert commands == [] and "would fetch engine: " in out and "would fetch tokenizer: " in out
        return
    steps = [line for line in out.splitlines() if line.startswith("# ") and line[2:3].isdigit()]
    assert len(commands) == len(steps) == 2, out
    tools = []
    for argv in commands:
        tool, problems = command_problems(argv, version)
        assert problems == [], f"{tool} of TensorRT-LLM {version}: {problems}"
        tools.append(tool)
    assert tools[-1] == "trtllm-build"
    quantization = config["build"].get("quantization_type", "no_quant")
    calibrated = quantization in ("fp8", "fp8_kv", "fp4", "fp4_kv", "awq")
    assert tools[0] == ("quantize" if calibrated else "convert_checkpoint (llama)")
    # the image's interpreter, not this machine's
    assert all(argv[0] == "/usr/bin/python3" for argv in commands if argv[0] != "trtllm-build")


def test_0_16_records_reject_what_only_later_releases_accept() -> None:
    """The checks above can fail: flags of later releases are not in the 0.16.0 records."""
    convert = load_flags("0.16.0", "convert_checkpoint.llama")
    quantize = load_flags("0.16.0", "quantize")
    assert flag_problems(["--use_nvfp4"], convert["flags"], []) == ["--use_nvfp4 is not a flag of this version"]
    assert flag_problems(["--qformat", "nvfp4"], quantize["flags"], [])[0].startswith("--qformat 'nvfp4' not in")
    assert flag_problems(["--int8-kv_cache"], convert["flags"], []) == ["--int8-kv_cache is not a flag of this version"]
    assert "--use_nvfp4" in convert["uncertain"] and "--qformat nvfp4" in quantize["uncertain"]
    # and what the plans emit for every convert-script quantization is there
    for flag in ("--use_weight_only", "--weight_only_precision", "--int8_kv_cache", "--smoothquant", "--per_token",
                 "--per_channel", "--tp_size", "--pp_size", "--dtype", "--model_dir", "--output_dir"):
        assert flag in convert["flags"], flag
    for flag in ("--qformat", "--kv_cache_dtype", "--calib_size", "--tp_size", "--pp_size", "--dtype"):
        assert flag in quantize["flags"], flag


def _example_copy(tmp_path: Path, name: str, edit) -> Path:
    data = yaml.safe_load((REPO / "examples" / name / "config.yaml").read_text())
    edit(data["model_metadata"]["trt_llm"])
    truss = tmp_path / name
    truss.mkdir()
    (truss / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return truss


def test_validate_reports_plan_refusals_with_their_keys(tmp_path: Path, capsys) -> None:
    def edit(trt):
        trt["runtime"]["max_num_sequences"] = 64
        trt["build"]["plugin_configuration"]["multi_block_mode"] = True

    truss = _example_copy(tmp_path, "legacy-llama3-8b-fp8-engine-h100", edit)
    code, out, err = _run(capsys, "validate", str(truss))
    assert code == 1
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2, err
    assert errors[0].startswith("error: model_metadata.trt_llm.runtime.max_num_sequences: ")
    assert errors[1].startswith("error: model_metadata.trt_llm.build.plugin_configuration.multi_block_mode: ")
    assert "TensorRT-LLM 0.16.0" in errors[1] and printed_commands(out) == []
    # the same refusals from build --dry-run, and serve would refuse them at load (make_plan raises them)
    code, _, err = _run(capsys, "build", str(truss), "--dry-run")
    assert code == 1 and err.count("error: model_metadata.trt_llm.") == 2
    # version-dependent: multi_block_mode is still a trtllm-build flag on 0.12, max_num_sequences never reaches NVIDIA's backend
    code, out, err = _run(capsys, "validate", str(truss), "--trtllm-version", "0.12.0")
    assert code == 1 and err.count("error: ") == 1 and "runtime.max_num_sequences" in err


def test_validate_prints_the_llmapi_model_yaml_with_only_names_of_the_1_0_interface(tmp_path: Path, capsys) -> None:
    def edit(trt):
        trt["runtime"] = {"backend": "auto", "kv_cache_free_gpu_mem_fraction": 0.85, "enable_chunked_context": True,
                          "enable_kv_cache_reuse": True}
        trt["build"].pop("plugin_configuration", None)  # engine build options: refused with llmapi (test below)

    truss = _example_copy(tmp_path, "mixtral-8x7b-tp4-h100", edit)
    code, out, err = _run(capsys, "validate", str(truss), "--trtllm-version", "1.0.0")
    assert code == 0, err
    assert "# backend llmapi: " in out
    text = out.split("/1/model.yaml of the Triton repository:\n", 1)[1]
    document = yaml.safe_load(text)
    assert set(document) <= set(LLMAPI_NAMES["llm_args"]), set(document) - set(LLMAPI_NAMES["llm_args"])
    assert set(document["kv_cache_config"]) <= set(LLMAPI_NAMES["kv_cache_config_fields"])
    assert set(document["scheduler_config"]) <= set(LLMAPI_NAMES["scheduler_config_fields"])
    assert (document["tensor_parallel_size"], document["max_seq_len"], document["enable_chunked_prefill"]) == (4, 32768, True)
    assert document["kv_cache_config"]["free_gpu_memory_fraction"] == 0.85


def test_validate_refuses_settings_llmapi_would_ignore(tmp_path: Path, capsys) -> None:
    def edit(trt):
        trt["runtime"]["backend"] = "auto"
        # settings of the C++ engine path and of the CPU stand-in (as a truss moved from elsewhere keeps them)
        trt["runtime"]["max_num_sequences"] = 8
        trt["runtime"]["pytorch"] = {"num_threads": 4}
        trt["build"]["plugin_configuration"] = {"use_paged_context_fmha": True}

    truss = _example_copy(tmp_path, "mixtral-8x7b-tp4-h100", edit)
    code, _, err = _run(capsys, "validate", str(truss), "--trtllm-version", "1.0.0")
    assert code == 1
    assert "error: model_metadata.trt_llm.runtime.max_num_sequences: not used by backend llmapi" in err
    assert "error: model_metadata.trt_llm.runtime.pytorch.num_threads: a setting of the CPU stand-in" in err
    assert "error: model_metadata.trt_llm.build.plugin_configuration.use_paged_context_fmha: " in err


def test_cpu_deployment_plans_the_stand_in(capsys) -> None:
    code, out, err = _run(capsys, "validate", str(REPO))
    assert code == 0, err
    assert "# backend pytorch: " in out and printed_commands(out) == []


LLAMA_SCRIPT_ARCHITECTURES = ["llama", "mistral", "mixtral", "deepseek", "internlm"]
QUANTIZATIONS = ["no_quant", "weights_int8", "weights_kv_int8", "weights_int4", "weights_kv_int4", "smooth_quant", "awq",
                 "fp8", "fp8_kv"]


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
@pytest.mark.parametrize("architecture", LLAMA_SCRIPT_ARCHITECTURES)
def test_0_16_plans_of_the_llama_script_family_use_only_recorded_flags(architecture: str, quantization: str) -> None:
    """Beyond the examples: every quantization of every architecture NVIDIA converts with
    examples/llama/convert_checkpoint.py, planned for 0.16.0 (the Triton 24.12 image)."""
    from pydantic import ValidationError

    from trtllm_truss.artifacts.build import plan_build
    from trtllm_truss.config.build import BuildConfig

    try:
        config = BuildConfig(base_model_architecture=architecture, huggingface_ckpt_repository="o/m",
                             quantization_type=quantization, tensor_parallel_count=2,
                             **({"smoothquant": {"per_token": True, "per_channel": True}} if quantization == "smooth_quant" else {}))
    except ValidationError:
        pytest.skip("combination rejected by the schema")
    plan = plan_build(config, trtllm_version="0.16.0", checkpoint_dir=Path("/ckpt"), output_dir=Path("/engine"),
                      work_dir=Path("/work"), python="/usr/bin/python3")
    printed = printed_commands(plan.describe())
    assert [argv[0] for argv in printed] == ["/usr/bin/python3", "trtllm-build"]
    for argv in printed:
        tool, problems = command_problems(argv, "0.16.0")
        assert problems == [], f"{tool}: {problems}"
