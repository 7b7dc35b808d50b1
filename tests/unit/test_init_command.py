"""`trtllm-truss init`: the folder it writes passes truss's own validation, and what `truss push`
would upload (truss's own archive function, honouring .truss_ignore) is the served code only."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
import yaml

from trtllm_truss.cli import main
from trtllm_truss.commands.init import available_examples
from trtllm_truss.config import load_config

# Nothing of development may reach the upload.
DEVELOPMENT_PARTS = {"tests", "docs", ".venv", "__pycache__", ".pytest_cache", ".git", "requirements", "scripts"}


def _upload(truss_dir: Path) -> dict[str, int]:
    """Member name -> size of the archive `truss push` builds (truss.remote.baseten.core.archive_dir)."""
    pytest.importorskip("truss")
    from truss.remote.baseten.core import archive_dir

    archive = archive_dir(truss_dir)
    with tarfile.open(fileobj=archive, mode="r:*") as tar:
        return {m.name: m.size for m in tar.getmembers() if m.isfile()}


def _truss_validates(truss_dir: Path) -> None:
    pytest.importorskip("truss")
    from truss.base.truss_config import TrussConfig

    config = TrussConfig.from_yaml(truss_dir / "config.yaml")
    config.validate_forbid_extra()  # what `truss push` runs
    assert config.model_metadata["trt_llm"]


@pytest.mark.parametrize("example", available_examples())
def test_init_from_each_example_validates_and_uploads_only_served_files(tmp_path: Path, example: str, capsys):
    truss_dir = tmp_path / "my-truss"
    assert main(["init", str(truss_dir), "--from", example]) == 0
    assert "truss push" in capsys.readouterr().out
    _truss_validates(truss_dir)
    shipped = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / example / "config.yaml").read_text())
    written = yaml.safe_load((truss_dir / "config.yaml").read_text())
    assert written["model_name"] == "my-truss"
    assert {k: v for k, v in written.items() if k != "model_name"} == {k: v for k, v in shipped.items() if k != "model_name"}

    # development leftovers inside the folder must stay out of the upload
    (truss_dir / "packages" / "trtllm_truss" / "__pycache__").mkdir()
    (truss_dir / "packages" / "trtllm_truss" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0" * 10)
    (truss_dir / "tests").mkdir()
    (truss_dir / "tests" / "test_x.py").write_text("")
    (truss_dir / ".venv" / "lib").mkdir(parents=True)
    (truss_dir / ".venv" / "lib" / "big.so").write_bytes(b"\0" * 1000)

    upload = _upload(truss_dir)
    names = set(upload)
    assert {"config.yaml", "model/model.py", "packages/trtllm_truss/__init__.py", ".truss_ignore"} <= names
    assert "packages/trtllm_truss/fronts/service.py" in names
    leaked = sorted(n for n in names if DEVELOPMENT_PARTS & set(Path(n).parts) or n.endswith((".pyc", ".log")))
    assert not leaked, leaked
    total = sum(upload.values())
    print(f"{example}: {len(upload)} files, {total / 1e6:.2f} MB to upload")
    assert total < 10e6  # the package and model code only: a few MB


def test_flags_set_the_common_choices(tmp_path: Path):
    truss_dir = tmp_path / "qwen"
    # fp8 is a calibration at engine build: the engine-build example (the LLM-API default refuses it at init)
    argv = ["init", str(truss_dir), "--from", "legacy-llama3-8b-fp8-engine-h100", "--checkpoint-repository",
            "Qwen/Qwen2.5-7B-Instruct", "--architecture", "qwen"]
    assert main([*argv, "--quantization", "fp8", "--accelerator", "H100:2", "--name", "qwen-fp8"]) == 0
    _truss_validates(truss_dir)
    resolved = load_config(truss_dir, environ={})
    build = resolved.trt_llm.build
    assert (build.huggingface_ckpt_repository, build.base_model_architecture.value) == ("Qwen/Qwen2.5-7B-Instruct", "qwen")
    assert build.quantization_type.value == "fp8" and resolved.trt_llm.world_size == 2
    assert str(resolved.accelerator) == "H100:2"
    assert yaml.safe_load((truss_dir / "config.yaml").read_text())["model_name"] == "qwen-fp8"


def test_engine_repository_starts_from_the_serving_example(tmp_path: Path):
    truss_dir = tmp_path / "served"
    assert main(["init", str(truss_dir), "--engine-repository", "org/engine", "--accelerator", "H100:4"]) == 0
    resolved = load_config(truss_dir, environ={})
    assert resolved.trt_llm.mode == "serve" and resolved.trt_llm.serve.engine_repository == "org/engine"
    assert resolved.trt_llm.world_size == 4


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--from", "no-such-example"], "--from no-such-example: no such example"),
        (["--engine-repository", "a/b", "--quantization", "fp8"], "--architecture/--quantization"),
        (["--accelerator", "H100:two"], "--accelerator H100:two"),
    ],
)
def test_bad_choices_name_the_flag(tmp_path: Path, capsys, extra: list[str], message: str):
    assert main(["init", str(tmp_path / "t"), *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_value_the_schema_refuses_names_the_key(tmp_path: Path, capsys):
    assert main(["init", str(tmp_path / "t"), "--quantization", "fp9"]) == 1
    assert "quantization_type" in capsys.readouterr().err


def test_refuses_a_non_empty_folder_without_force(tmp_path: Path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["init", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["init", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_init_front_direct_writes_a_docker_server_truss_that_truss_validates_and_builds(tmp_path: Path):
    truss_dir = tmp_path / "direct"
    assert main(["init", str(truss_dir), "--front", "direct"]) == 0
    _truss_validates(truss_dir)
    written = yaml.safe_load((truss_dir / "config.yaml").read_text())
    server = written["docker_server"]
    assert server["server_port"] != 8080  # Baseten's proxy holds 8080
    assert "--front direct" in server["start_command"] and f"--port {server['server_port']}" in server["start_command"]
    assert (server["readiness_endpoint"], server["liveness_endpoint"]) == ("/health/ready", "/health/live")
    assert server["predict_endpoint"] == "/v1/models/model:predict"
    names = {r.split("==")[0] for r in written["requirements"]}
    assert {"fastapi", "uvicorn", "httptools", "uvloop", "tritonclient[grpc]"} <= names
    load_config(truss_dir, environ={})  # model_metadata.trt_llm untouched and valid
    # truss's own image build context for a docker_server truss: supervisord runs our start_command
    from truss.contexts.image_builder.serving_image_builder import ServingImageBuilderContext

    build_dir = tmp_path / "build"
    ServingImageBuilderContext.run(truss_dir).prepare_image_build_dir(build_dir)
    assert server["start_command"] in (build_dir / "supervisord.conf").read_text()
