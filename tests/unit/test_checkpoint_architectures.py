"""Architectures from the checkpoint's config.json against TensorRT-LLM's PyTorch backend of the deployment's release.

Records: tests/data/trtllm_pytorch_models/<version>.json (NVIDIA's supported-models page of each release, with its
source); the package's copy (planning/data/pytorch_architectures.json) is what validate and init check against.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trtllm_truss.cli import main
from trtllm_truss.planning import architectures
from trtllm_truss.planning.architectures import CheckpointArchitecture, architecture_problems

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "tests" / "data" / "trtllm_pytorch_models"
EXAMPLE = ROOT / "examples" / "llama3.1-8b-fp8-h100" / "config.yaml"  # TensorRT-LLM 1.2.1 (26.07 image), llmapi
RECORDED = ("1.0.0", "1.1.0", "1.2.0", "1.2.1")


@pytest.fixture(autouse=True)
def no_hub(monkeypatch: pytest.MonkeyPatch):
    """Nothing here may reach a hub: a hub id resolves to a closed loopback port."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    for name in ("HF_TOKEN", "TRUSS_SECRET_hf_access_token"):
        monkeypatch.delenv(name, raising=False)


def test_the_package_copy_is_the_recorded_registry_of_each_release() -> None:
    packaged = json.loads(architectures.REGISTRY_FILE.read_text())["versions"]
    assert sorted(packaged) == sorted(RECORDED)
    for version in RECORDED:
        record = json.loads((RECORDS / f"{version}.json").read_text())
        assert record["trtllm_version"] == version and record["tag"] == f"v{version}"
        assert record["source"]["repository"] == "NVIDIA/TensorRT-LLM" and len(record["source"]["commit"]) == 40
        assert version in record["source"]["path"]
        # every name of the page's tables, row labels replaced by the architecture they stand for
        labels = {label: entry["architecture"] for label, entry in record["row_labels"].items()}
        rows = [labels.get(row, row) for table in record["tables"].values() for row in table]
        assert sorted(set(rows)) == record["architectures"] == packaged[version]


@pytest.mark.parametrize(
    ("name", "served_from"),
    [
        ("LlamaForCausalLM", "1.0.0"),
        ("Qwen3ForCausalLM", "1.0.0"),
        ("Qwen3MoeForCausalLM", "1.0.0"),  # Qwen3-Coder
        ("DeepseekV3ForCausalLM", "1.0.0"),  # DeepSeek V3/R1, Kimi K2
        ("Llama4ForConditionalGeneration", "1.0.0"),
        ("GptOssForCausalLM", "1.0.0"),  # the 1.0/1.1 pages' "GPT-OSS" row
        ("Phi3ForCausalLM", "1.1.0"),
        ("NemotronHForCausalLM", "1.2.0"),
        ("MiniMaxM2ForCausalLM", "1.2.0"),
        ("DeepseekV32ForCausalLM", "1.2.0"),
    ],
)
def test_releases_serving_an_architecture(name: str, served_from: str) -> None:
    assert architectures.serving_versions(name) == list(RECORDED[RECORDED.index(served_from):])


def test_versions_map_to_their_release_and_unrecorded_ones_are_not_checked() -> None:
    assert architectures.recorded_version("1.2.1") == "1.2.1"
    assert architectures.recorded_version("1.2.1.post1") == "1.2.1"
    assert architectures.recorded_version("1.3.0") is None and architectures.recorded_version(None) is None


def _truss(tmp_path: Path, architectures_json: list[str] | None, *, base_model_architecture: str | None = None,
           quantization: str | None = None) -> Path:
    """The 1.2.1 llmapi example with a local checkpoint whose config.json names `architectures_json`."""
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    if architectures_json is not None:
        (checkpoint / "config.json").write_text(json.dumps({"architectures": architectures_json}))
    config = yaml.safe_load(EXAMPLE.read_text())
    build = config["model_metadata"]["trt_llm"]["build"]
    build.pop("base_model_architecture")
    build["huggingface_ckpt_repository"] = "./ckpt"
    if base_model_architecture is not None:
        build["base_model_architecture"] = base_model_architecture
    if quantization is not None:
        build["quantization_type"] = quantization
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


@pytest.mark.parametrize(
    "name", ["GptOssForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM", "Llama4ForConditionalGeneration"]
)
def test_validate_accepts_2026_checkpoints_on_1_2_1_without_base_model_architecture(tmp_path: Path, capsys, name: str):
    assert main(["validate", str(_truss(tmp_path, [name]))]) == 0
    out = capsys.readouterr().out
    assert f"# architecture: {name} (config.json of ./ckpt); TensorRT-LLM 1.2.1's PyTorch backend serves it" in out
    assert "# backend llmapi" in out and "runtime.tool_call_parser" in out  # the parsers follow the architecture


def test_an_architecture_1_2_1_does_not_serve_is_an_error_naming_it(tmp_path: Path, capsys):
    assert main(["validate", str(_truss(tmp_path, ["Gemma2ForCausalLM"]))]) == 1
    err = capsys.readouterr().err
    assert "error: model_metadata.trt_llm.build.huggingface_ckpt_repository: the checkpoint's architecture" in err
    assert "Gemma2ForCausalLM is not served by TensorRT-LLM 1.2.1's PyTorch backend" in err


def test_an_architecture_of_a_later_release_names_the_releases_that_serve_it(tmp_path: Path, capsys):
    root = _truss(tmp_path, ["MiniMaxM2ForCausalLM"])
    assert main(["validate", str(root), "--trtllm-version", "1.1.0"]) == 1
    assert "MiniMaxM2ForCausalLM is not served by TensorRT-LLM 1.1.0's PyTorch backend" in capsys.readouterr().err
    problems = architecture_problems(
        _build(None), "llmapi", "1.1.0", CheckpointArchitecture("x", ("MiniMaxM2ForCausalLM",))
    )
    assert problems and problems[0].endswith("served by TensorRT-LLM 1.2.0, 1.2.1: choose a base_image with one of them")


def test_a_base_model_architecture_contradicting_the_checkpoint_is_an_error_naming_the_key(tmp_path: Path, capsys):
    root = _truss(tmp_path, ["Qwen3MoeForCausalLM"], base_model_architecture="llama")
    assert main(["validate", str(root)]) == 1
    err = capsys.readouterr().err
    assert "error: model_metadata.trt_llm.build.base_model_architecture: llama, but the checkpoint's config.json" in err
    assert "names Qwen3MoeForCausalLM; set it to qwen or remove it" in err


def test_a_base_model_architecture_agreeing_with_the_checkpoint_is_accepted(tmp_path: Path):
    assert main(["validate", str(_truss(tmp_path, ["Qwen3MoeForCausalLM"], base_model_architecture="qwen"))]) == 0


def test_the_engine_build_path_still_requires_base_model_architecture(tmp_path: Path, capsys):
    root = _truss(tmp_path, ["LlamaForCausalLM"])
    config = yaml.safe_load((root / "config.yaml").read_text())
    config["model_metadata"]["trt_llm"]["runtime"]["backend"] = "tensorrtllm"
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["validate", str(root)]) == 1
    err = capsys.readouterr().err
    assert "error: model_metadata.trt_llm.build.base_model_architecture: required on the engine-build path" in err


def test_an_unreadable_config_json_is_said_not_checked(tmp_path: Path, capsys):
    root = _truss(tmp_path, None)  # hub unreachable / no config.json: validate degrades, it does not crash
    config = yaml.safe_load((root / "config.yaml").read_text())
    config["model_metadata"]["trt_llm"]["build"]["huggingface_ckpt_repository"] = "some-org/some-model"
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["validate", str(root)]) == 0
    assert "# architecture: not checked: config.json of some-org/some-model could not be read" in capsys.readouterr().out


def _build(given: str | None):
    from trtllm_truss.config.build import BuildConfig

    data = {"huggingface_ckpt_repository": "a/b"}
    if given is not None:
        data["base_model_architecture"] = given
    return BuildConfig.model_validate(data)


def test_mtp_without_base_model_architecture_needs_a_deepseek_checkpoint() -> None:
    class Spec:
        mode = "mtp"

    qwen = CheckpointArchitecture("x", ("Qwen3ForCausalLM",))
    deepseek = CheckpointArchitecture("x", ("DeepseekV3ForCausalLM",))
    assert any("speculative.mode: mtp" in p for p in architecture_problems(_build(None), "llmapi", "1.2.1", qwen, Spec()))
    assert architecture_problems(_build(None), "llmapi", "1.2.1", deepseek, Spec()) == []


# --- init writes only what validate accepts ---------------------------------------------------------


def test_init_refuses_fp8_on_llmapi_with_the_alternatives(tmp_path: Path, capsys):
    truss_dir = tmp_path / "qwen"
    argv = ["init", str(truss_dir), "--checkpoint-repository", "Qwen/Qwen2.5-7B-Instruct", "--architecture", "qwen",
            "--quantization", "fp8", "--accelerator", "H100:2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--quantization fp8" in err and "runs no" in err and "calibration" in err
    assert "pre-quantized checkpoint" in err and "--from legacy-llama3-8b-fp8-engine-h100" in err
    assert not truss_dir.exists()


def test_init_fp8_on_the_engine_path_writes_a_truss_validate_accepts(tmp_path: Path, capsys):
    truss_dir = tmp_path / "qwen"
    argv = ["init", str(truss_dir), "--from", "legacy-llama3-8b-fp8-engine-h100", "--checkpoint-repository",
            "Qwen/Qwen2.5-7B-Instruct", "--architecture", "qwen", "--quantization", "fp8", "--accelerator", "H100:2"]
    assert main(argv) == 0
    assert main(["validate", str(truss_dir)]) == 0


def test_init_refuses_a_checkpoint_the_release_does_not_serve_and_writes_nothing(tmp_path: Path, capsys):
    checkpoint = tmp_path / "gemma2"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"architectures": ["Gemma2ForCausalLM"]}))
    truss_dir = tmp_path / "t"
    assert main(["init", str(truss_dir), "--checkpoint-repository", str(checkpoint)]) == 1
    err = capsys.readouterr().err
    assert "was not written" in err and "Gemma2ForCausalLM is not served by TensorRT-LLM 1.2.1" in err
    assert not truss_dir.exists()


def test_init_with_another_checkpoint_lets_its_config_json_name_the_architecture(tmp_path: Path, capsys):
    """The default example names llama for its own checkpoint; a Qwen3-MoE checkpoint must not inherit it."""
    checkpoint = tmp_path / "qwen3-moe"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"]}))
    truss_dir = tmp_path / "t"
    assert main(["init", str(truss_dir), "--checkpoint-repository", str(checkpoint), "--accelerator", "H100"]) == 0
    written = yaml.safe_load((truss_dir / "config.yaml").read_text())["model_metadata"]["trt_llm"]["build"]
    assert "base_model_architecture" not in written
    capsys.readouterr()
    assert main(["validate", str(truss_dir)]) == 0
    assert "# architecture: Qwen3MoeForCausalLM" in capsys.readouterr().out


@pytest.mark.parametrize("example", sorted(p.parent.name for p in (ROOT / "examples").glob("*/config.yaml")))
def test_every_example_still_validates(example: str, capsys):
    assert main(["validate", str(ROOT / "examples" / example)]) == 0, capsys.readouterr().err


def test_the_table_in_configuration_md_is_the_registry() -> None:
    """docs/configuration.md "The checkpoint's architecture": each row lists a release's names (or the previous
    row's plus the new ones)."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("### The checkpoint's architecture", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| 1.")]
    registry = architectures.registry()
    previous: set[str] = set()
    seen = []
    for row in rows:
        releases, names = (cell.strip() for cell in row.strip("|").split("|"))
        versions = [part.split(" ")[0] for part in releases.split(", ")]
        listed = {n.strip() for n in names.split("'s, and ", 1)[-1].split(",")}
        expected = (previous | listed) if "'s, and " in names else listed
        for version in versions:
            assert set(registry[version]) == expected, version
            seen.append(version)
        previous = expected
    assert sorted(seen) == sorted(registry)
