"""make_plan: backend choice from probed facts, where artifacts go, and what must be fetched."""

from __future__ import annotations

import importlib.util
import json
import stat
from pathlib import Path

import pytest
from trtllm_truss.config import load_config
from trtllm_truss.planning.plan import PlanError, choose_backend, make_plan, stand_in_limits
from trtllm_truss.planning.probe import GpuInfo, RuntimeFacts, parse_nvidia_smi_csv, probe_facts, probe_gpus

CPU_ONLY = RuntimeFacts(trtllm_unavailable_reason="TensorRT-LLM is not installed (pip package tensorrt_llm)")
H100_X2 = RuntimeFacts(
    gpus=(GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 81559),) * 2,
    trtllm_version="0.12.0",
    tensorrt_version="10.3.0",
    trtllm_unavailable_reason=None,
)


def truss(tmp_path: Path, trt_llm_yaml: str, *, accelerator: str | None = "H100:2") -> Path:
    resources = f"resources:\n  accelerator: {accelerator}\n  use_gpu: true\n" if accelerator else ""
    body = "".join(f"    {line}\n" for line in trt_llm_yaml.strip().splitlines())
    (tmp_path / "config.yaml").write_text(f"model_name: t\n{resources}model_metadata:\n  trt_llm:\n{body}")
    return tmp_path


def local_checkpoint(path: Path, max_position_embeddings: int = 1024) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(
        json.dumps({"model_type": "llama", "max_position_embeddings": max_position_embeddings})
    )
    (path / "model.safetensors").write_bytes(b"\0" * 8)
    (path / "tokenizer.json").write_text("{}")
    return path


BUILD_LOCAL = """
build:
  base_model_architecture: llama
  huggingface_ckpt_repository: ckpt
  max_input_len: 300
  max_output_len: 100
  max_batch_size: 4
  max_beam_width: 2
  tensor_parallel_count: 2
"""


def test_auto_on_a_cpu_machine_runs_the_build_checkpoint_with_pytorch(tmp_path):
    ckpt = local_checkpoint(tmp_path / "ckpt")
    plan = make_plan(load_config(truss(tmp_path, BUILD_LOCAL), environ={}), CPU_ONLY, artifacts_dir=tmp_path / "a")
    assert plan.backend == "pytorch" and "TensorRT-LLM is not installed" in plan.backend_reason
    assert plan.model_dir == ckpt.resolve() and plan.tokenizer_dir == ckpt.resolve() and plan.engine_dir is None
    assert (plan.max_input_len, plan.max_output_len, plan.max_batch_size, plan.max_beam_width) == (300, 100, 4, 2)
    assert plan.limits_final and plan.world_size == 1  # the stand-in is one process, never mpirun
    assert [(f.role, f.location) for f in plan.fetches] == [("model", "local")]


def test_auto_with_tensorrt_llm_and_gpus_plans_a_build(tmp_path):
    local_checkpoint(tmp_path / "ckpt")
    plan = make_plan(
        load_config(truss(tmp_path, BUILD_LOCAL, accelerator="H100:2"), environ={}),
        H100_X2,
        artifacts_dir=tmp_path / "a",
    )
    assert plan.backend == "tensorrtllm" and "0.12.0" in plan.backend_reason
    assert plan.engine_dir is None and plan.build is not None and plan.checkpoint is not None
    assert (plan.tensor_parallel_count, plan.world_size) == (2, 2)
    assert plan.checkpoint.kind == "checkpoint" and plan.fetches[0].kind == "tokenizer"


def test_hub_checkpoint_is_planned_as_a_download_under_the_artifacts_dir(tmp_path):
    config = BUILD_LOCAL.replace(
        "huggingface_ckpt_repository: ckpt",
        "huggingface_ckpt_repository: meta-llama/Llama-3.1-8B\n  huggingface_ckpt_revision: v1.0",
    )
    plan = make_plan(load_config(truss(tmp_path, config), environ={}), CPU_ONLY, artifacts_dir=tmp_path / "a")
    (model,) = plan.fetches
    assert (model.location, model.kind, model.revision) == ("hub", "checkpoint", "v1.0")
    assert model.dest == tmp_path / "a" / "downloads" / "checkpoint" / "meta-llama--Llama-3.1-8B" / "v1.0"
    assert plan.model_dir == model.dest


def test_artifacts_dir_comes_from_the_environment(tmp_path):
    config = BUILD_LOCAL.replace("huggingface_ckpt_repository: ckpt", "huggingface_ckpt_repository: org/model")
    plan = make_plan(
        load_config(truss(tmp_path, config), environ={}),
        CPU_ONLY,
        environ={"TRTLLM_TRUSS_ARTIFACTS_DIR": str(tmp_path / "env-dir")},
    )
    assert plan.artifacts_dir == tmp_path / "env-dir"
    assert str(plan.model_dir).startswith(str(tmp_path / "env-dir"))


def test_forced_tensorrtllm_without_it_is_a_clear_error(tmp_path):
    local_checkpoint(tmp_path / "ckpt")
    config = BUILD_LOCAL + "runtime:\n  backend: tensorrtllm\n"
    with pytest.raises(
        PlanError,
        match=r"runtime\.backend is tensorrtllm but TensorRT-LLM is not installed.*set runtime\.backend: auto",
    ):
        make_plan(load_config(truss(tmp_path, config), environ={}), CPU_ONLY, artifacts_dir=tmp_path / "a")


def test_forced_tensorrtllm_with_too_few_gpus_is_a_clear_error():
    one_gpu = RuntimeFacts(gpus=H100_X2.gpus[:1], trtllm_version="0.12.0", trtllm_unavailable_reason=None)
    with pytest.raises(PlanError, match=r"world size 4 .* 1 GPU\(s\) are visible"):
        choose_backend("tensorrtllm", one_gpu, 4)
    backend, reason = choose_backend("auto", one_gpu, 4)
    assert backend == "pytorch" and "needs 4 GPUs, 1 visible" in reason


SERVE = """
serve:
  engine_repository: acme/llama-engine
  engine_revision: v2
  tensor_parallel_count: 2
"""


def test_serve_with_tensorrtllm_fetches_engine_and_tokenizer_and_waits_for_engine_limits(tmp_path):
    plan = make_plan(
        load_config(truss(tmp_path, SERVE, accelerator="H100:2"), environ={}), H100_X2, artifacts_dir=tmp_path / "a"
    )
    engine, tokenizer = plan.fetches
    assert (engine.role, engine.kind, engine.revision) == ("engine", "engine", "v2")
    assert (tokenizer.role, tokenizer.kind, tokenizer.revision) == ("tokenizer", "tokenizer", "v2")
    assert plan.engine_dir == engine.dest and plan.tokenizer_dir == tokenizer.dest and engine.dest != tokenizer.dest
    assert not plan.limits_final  # the engine's config.json decides max_* in prepare_artifacts


def test_serve_with_the_stand_in_needs_runtime_pytorch_model(tmp_path):
    with pytest.raises(PlanError, match=r"model_metadata\.trt_llm\.runtime\.pytorch\.model: required"):
        make_plan(
            load_config(truss(tmp_path, SERVE, accelerator="H100:2"), environ={}), CPU_ONLY, artifacts_dir=tmp_path
        )
    local_checkpoint(tmp_path / "standin")
    config = SERVE + "runtime:\n  pytorch:\n    model: ./standin\n"
    plan = make_plan(
        load_config(truss(tmp_path, config, accelerator="H100:2"), environ={}), CPU_ONLY, artifacts_dir=tmp_path / "a"
    )
    assert plan.backend == "pytorch" and plan.model_dir == (tmp_path / "standin").resolve()
    assert [f.role for f in plan.fetches] == ["model", "tokenizer"] and not plan.limits_final


def test_local_folder_with_a_revision_is_rejected(tmp_path):
    local_checkpoint(tmp_path / "ckpt")
    config = BUILD_LOCAL.replace(
        "huggingface_ckpt_repository: ckpt", "huggingface_ckpt_repository: ckpt\n  huggingface_ckpt_revision: main"
    )
    with pytest.raises(
        PlanError, match=r"build\.huggingface_ckpt_repository: 'ckpt' is a local folder, which has no revisions"
    ):
        make_plan(load_config(truss(tmp_path, config), environ={}), CPU_ONLY, artifacts_dir=tmp_path / "a")


def test_stand_in_limits_follow_the_checkpoint_context_window():
    class Runtime:
        max_num_sequences = None

    assert stand_in_limits({"max_position_embeddings": 1024}, Runtime()) == {
        "max_batch_size": 32,
        "max_input_len": 768,
        "max_output_len": 256,
        "max_beam_width": 1,
    }
    assert stand_in_limits({}, Runtime())["max_input_len"] + stand_in_limits({}, Runtime())["max_output_len"] == 2048


# --- probing -------------------------------------------------------------------------------------


def test_nvidia_smi_output_is_parsed():
    gpus = parse_nvidia_smi_csv("NVIDIA H100 80GB HBM3, 9.0, 81559\nNVIDIA H100 80GB HBM3, 9.0, 81559\n")
    assert len(gpus) == 2 and gpus[0].sm == 90 and gpus[0].memory_mib == 81559
    assert parse_nvidia_smi_csv("Tesla T4, [N/A], 15360")[0].compute_capability is None


def test_probe_runs_nvidia_smi_and_falls_back_for_old_drivers(tmp_path):
    fake = tmp_path / "nvidia-smi"  # a test double for the driver tool: old drivers reject compute_cap
    fake.write_text(
        '#!/bin/sh\ncase "$1" in *compute_cap*) echo \'Field "compute_cap" is not a valid field\' >&2; exit 2;; esac\n'
        "echo 'NVIDIA A10G, 23028'\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    gpus, note = probe_gpus(str(fake))
    assert gpus == (GpuInfo("NVIDIA A10G", None, 23028),) and "compute capability" in note


def test_probe_without_tensorrt_llm_says_why():
    if importlib.util.find_spec("tensorrt_llm") is not None:
        pytest.skip("TensorRT-LLM is installed here")
    facts = probe_facts()
    assert not facts.trtllm_usable and "TensorRT-LLM is not installed" in facts.trtllm_unavailable_reason
