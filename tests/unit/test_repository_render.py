"""Rendering: files on disk, valid Triton protobuf text, golden GPU repository, safe replacement."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from trtllm_truss.planning.plan import ServingPlan
from trtllm_truss.repository import (
    MODEL_NAMES,
    WINDOW_RELAY,
    RepositoryError,
    render_repository,
    repository_configs,
    to_pbtxt,
)
from trtllm_truss.repository.render import MARKER_FILE, TRITON_MODELS_DIR

try:
    from trtllm_truss.config import RuntimeConfig
except ImportError:
    from trtllm_truss.config.runtime import RuntimeConfig

GOLDEN_DIR = Path(__file__).resolve().parent / "golden" / "repository_tensorrtllm"
UPDATE_GOLDEN = os.environ.get("UPDATE_GOLDEN") == "1"  # regenerate after an intended change, then review the diff


def _plan(backend: str = "tensorrtllm", *, tokenizer_dir: str = "/models/tokenizer", **runtime: object) -> ServingPlan:
    return ServingPlan(
        backend=backend,  # type: ignore[arg-type]
        tokenizer_dir=Path(tokenizer_dir),
        engine_dir=Path("/models/engine") if backend == "tensorrtllm" else None,
        model_dir=Path("/models/hf") if backend == "pytorch" else None,
        max_batch_size=64,
        max_input_len=2048,
        max_output_len=1024,
        runtime=RuntimeConfig(**runtime),
    )


def _parse(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(encoding="utf-8"), model_config_pb2.ModelConfig())


@pytest.mark.parametrize("backend", ["tensorrtllm", "pytorch"])
def test_rendered_repository_layout_and_valid_protobuf(tmp_path: Path, backend: str) -> None:
    repo = render_repository(_plan(backend), tmp_path / "repo", import_path=())  # () : copied verbatim
    model_names = (*MODEL_NAMES, WINDOW_RELAY) if backend == "tensorrtllm" else MODEL_NAMES
    assert sorted(p.name for p in repo.iterdir() if p.is_dir()) == sorted(model_names)
    python_models = {"preprocessing", "postprocessing"} | ({"tensorrt_llm"} if backend == "pytorch" else {WINDOW_RELAY})
    for name in model_names:
        text = (repo / name / "config.pbtxt").read_text(encoding="utf-8")
        assert "${" not in text
        parsed = _parse(repo / name / "config.pbtxt")  # Triton's own ModelConfig schema
        assert parsed.name == name
        assert (repo / name / "1").is_dir()
        model_py = repo / name / "1" / "model.py"
        assert model_py.is_file() == (name in python_models), name
        if name in python_models:
            assert parsed.backend == "python"
    for name, source in (("preprocessing", "preprocessing"), ("postprocessing", "postprocessing")):
        assert (repo / name / "1" / "model.py").read_bytes() == (TRITON_MODELS_DIR / source / "model.py").read_bytes()
    engine = _parse(repo / "tensorrt_llm" / "config.pbtxt")
    assert engine.backend == ("tensorrtllm" if backend == "tensorrtllm" else "python")
    assert engine.model_transaction_policy.decoupled
    ensemble = _parse(repo / "ensemble" / "config.pbtxt")
    assert ensemble.platform == "ensemble"
    engine_step = WINDOW_RELAY if backend == "tensorrtllm" else "tensorrt_llm"
    assert [s.model_name for s in ensemble.ensemble_scheduling.step] == ["preprocessing", engine_step, "postprocessing"]


def test_parsed_protobuf_equals_the_typed_config(tmp_path: Path) -> None:
    plan = _plan("pytorch", tokenizer_dir='/odd "dir"/ünï\\códe', preprocessing_instance_count=3, max_queue_size=9)
    for config in repository_configs(plan).values():
        parsed = text_format.Parse(to_pbtxt(config), model_config_pb2.ModelConfig())
        assert {k: v.string_value for k, v in parsed.parameters.items()} == config.parameter_dict
        assert [i.name for i in parsed.input] == [t.name for t in config.inputs]
        assert [list(i.dims) for i in parsed.input] == [list(t.dims) for t in config.inputs]
        assert [i.optional for i in parsed.input] == [t.optional for t in config.inputs]
        assert [model_config_pb2.DataType.Name(i.data_type) for i in parsed.input] == [
            t.data_type.value for t in config.inputs
        ]
        assert [o.name for o in parsed.output] == [t.name for t in config.outputs]
        assert parsed.max_batch_size == 64
    pre = repository_configs(plan)["preprocessing"]
    assert pre.parameter_dict["tokenizer_dir"] == '/odd "dir"/ünï\\códe'  # quoted and escaped, not mangled
    assert pre.instance_groups[0].count == 3


def test_runtime_instance_counts_and_ordering(tmp_path: Path) -> None:
    configs = repository_configs(_plan(preprocessing_instance_count=2, postprocessing_instance_count=5))
    assert configs["preprocessing"].instance_groups[0].count == 2
    assert configs["postprocessing"].instance_groups[0].count == 5
    # several postprocessing instances decode one stream's responses concurrently; order must hold
    assert configs["postprocessing"].dynamic_batching.preserve_ordering


def test_unset_optional_values_are_omitted() -> None:
    engine = repository_configs(_plan("pytorch"))["tensorrt_llm"].parameter_dict
    assert "num_threads" not in engine and "synthetic_step_time_ms" not in engine and "max_num_sequences" not in engine
    assert engine["synthetic"] == "false"
    synthetic = repository_configs(_plan("pytorch", pytorch={"synthetic": {"step_time_ms": 5.0}, "num_threads": 2}))
    params = synthetic["tensorrt_llm"].parameter_dict
    assert params["synthetic"] == "true" and params["synthetic_step_time_ms"] == "5.0" and params["num_threads"] == "2"


def test_gpu_repository_matches_golden_files(tmp_path: Path) -> None:
    repo = render_repository(_plan("tensorrtllm", max_tokens_in_paged_kv_cache=8192), tmp_path / "repo")
    for name in (*MODEL_NAMES, WINDOW_RELAY):
        rendered = (repo / name / "config.pbtxt").read_text(encoding="utf-8")
        golden = GOLDEN_DIR / name / "config.pbtxt"
        if UPDATE_GOLDEN:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(rendered, encoding="utf-8")
        assert golden.is_file(), f"{golden} missing: run with UPDATE_GOLDEN=1 and review it"
        assert rendered == golden.read_text(encoding="utf-8"), f"{name}: differs from {golden}"


def test_rerender_replaces_our_repository_but_not_foreign_directories(tmp_path: Path) -> None:
    repo = render_repository(_plan("pytorch"), tmp_path / "repo")
    (repo / "stale.txt").write_text("old")
    again = render_repository(_plan("tensorrtllm"), tmp_path / "repo")
    assert again == repo and not (repo / "stale.txt").exists() and (repo / MARKER_FILE).is_file()
    assert not (repo / "tensorrt_llm" / "1" / "model.py").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["repo"]  # no scratch or old directories left behind
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "important.txt").write_text("keep")
    with pytest.raises(RepositoryError, match="not a repository rendered by trtllm-truss"):
        render_repository(_plan(), foreign)
    assert (foreign / "important.txt").read_text() == "keep"


def test_missing_plan_fields_are_named() -> None:
    gpu = _plan("tensorrtllm")
    with pytest.raises(RepositoryError, match="plan.engine_dir"):
        repository_configs(ServingPlan(**{**gpu.__dict__, "engine_dir": None}))
    cpu = _plan("pytorch")
    with pytest.raises(RepositoryError, match="plan.model_dir"):
        repository_configs(ServingPlan(**{**cpu.__dict__, "model_dir": None}))
    with pytest.raises(RepositoryError, match="plan.backend"):
        repository_configs(ServingPlan(**{**cpu.__dict__, "backend": "onnx"}))


def test_engine_model_source_replaces_only_a_python_engine(tmp_path: Path) -> None:
    double = tmp_path / "double.py"
    double.write_text("# a python engine\n")
    repo = render_repository(_plan("pytorch"), tmp_path / "repo", engine_model_source=double, import_path=())
    assert (repo / "tensorrt_llm" / "1" / "model.py").read_text() == "# a python engine\n"
    with pytest.raises(RepositoryError, match="engine_model_source"):
        render_repository(_plan("tensorrtllm"), tmp_path / "gpu", engine_model_source=double)


def test_import_path_header_goes_after_docstring_and_future_imports() -> None:
    from trtllm_truss.repository.render import with_import_path

    source = '"""doc"""\n\nfrom __future__ import annotations\n\nimport json\n'
    rendered = with_import_path(source, ["/packages", "/extra"])
    compile(rendered, "model.py", "exec")  # a __future__ import must stay first
    lines = rendered.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("import sys as _sys"))
    assert lines.index("from __future__ import annotations") < header < lines.index("import json")
    assert lines[header + 1] == "_sys.path[:0] = [_p for _p in ['/packages', '/extra'] if _p not in _sys.path]"


def test_rendered_python_models_carry_the_package_directory(tmp_path: Path) -> None:
    from trtllm_truss.repository.render import PACKAGES_DIR

    repo = render_repository(_plan("pytorch"), tmp_path / "repo", import_path=[str(PACKAGES_DIR)])
    for model in ("preprocessing", "postprocessing", "tensorrt_llm"):
        text = (repo / model / "1" / "model.py").read_text()
        assert f"_sys.path[:0] = [_p for _p in [{str(PACKAGES_DIR)!r}]" in text
