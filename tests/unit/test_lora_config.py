"""LoRA adapters from config to request: build.lora_adapters / lora_configuration / runtime.lora_cache_*
(errors naming the key), the plan (task ids, fetches, adapter_config.json checked against the limits,
backends that would not apply them), the stand-in's rendered parameters, and the request core's
`model` -> NVIDIA's lora_task_id (404 model_not_found). No torch needed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from trtllm_truss.planning import lora
from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.artifacts.completeness import IncompleteArtifactError, check_complete
from trtllm_truss.artifacts.sources import wanted
from trtllm_truss.config import ConfigError, load_config
from trtllm_truss.planning.plan import PlanError, make_plan
from trtllm_truss.planning.probe import GpuInfo, RuntimeFacts
from trtllm_truss.repository.models import repository_configs
from trtllm_truss.serving.core import Refused, lora_task_id

ROOT = Path(__file__).resolve().parents[2]
PIRATE = ROOT / "data" / "embedded-lora" / "pirate"
CHECKPOINT = ROOT / "data" / "embedded-llama"
SECTION = "model_metadata.trt_llm"


def truss(tmp_path: Path, build: dict, runtime: dict | None = None) -> Path:
    section = {
        "build": {"base_model_architecture": "llama", "huggingface_ckpt_repository": str(CHECKPOINT), **build},
        "runtime": runtime or {},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"model_name": "t", "model_metadata": {"trt_llm": section}}))
    return tmp_path


def problems(tmp_path: Path, build: dict, runtime: dict | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(truss(tmp_path, build, runtime), environ={})
    return caught.value.problems


def plan_of(tmp_path: Path, build: dict, runtime: dict | None = None, facts: RuntimeFacts | None = None):
    resolved = load_config(truss(tmp_path, build, runtime), environ={})
    return make_plan(resolved, facts or RuntimeFacts(), artifacts_dir=tmp_path / "artifacts")


# --- config -------------------------------------------------------------------------------------


def test_adapters_by_name_with_shorthand_and_revision(tmp_path):
    build = {
        "lora_adapters": {"pirate": str(PIRATE), "remote": {"repo": "org/adapter", "revision": "v1"}},
        "lora_configuration": {"max_lora_rank": 16, "lora_target_modules": ["attn_q", "attn_v"], "max_loras": 2},
    }
    config = load_config(truss(tmp_path, build), environ={}).trt_llm.build
    assert config.lora_adapters["pirate"].repo == str(PIRATE) and config.lora_adapters["pirate"].revision is None
    assert (config.lora_adapters["remote"].repo, config.lora_adapters["remote"].revision) == ("org/adapter", "v1")
    assert config.lora_configuration.max_loras == 2


@pytest.mark.parametrize(
    ("build", "runtime", "expected"),
    [
        ({"lora_adapters": {"bad name": "org/a"}}, None, f"{SECTION}.build.lora_adapters.bad name: an adapter name is"),
        ({"lora_adapters": {"model": "org/a"}}, None, f"{SECTION}.build.lora_adapters.model: an adapter name is"),
        ({"lora_configuration": {"max_lora_rank": 8}}, None, f"{SECTION}.build.lora_configuration: only applies with"),
        (
            {"lora_adapters": {"a": "org/a"}, "lora_configuration": {"lora_target_modules": ["q_proj"]}},
            None,
            f"{SECTION}.build.lora_configuration.lora_target_modules",
        ),
        ({"lora_adapters": {"a": {"repo": "org/a", "rev": "x"}}}, None, f"{SECTION}.build.lora_adapters.a.rev: unknown key"),
        ({}, {"lora_cache_optimal_adapter_size": 64, "lora_cache_max_adapter_size": 8},
         f"{SECTION}.runtime.lora_cache_optimal_adapter_size: 64 is above lora_cache_max_adapter_size 8"),
    ],
)
def test_errors_name_the_key(tmp_path, build, runtime, expected):
    lines = problems(tmp_path, build, runtime)
    assert any(line.startswith(expected) for line in lines), lines


def test_a_hugging_face_module_name_is_answered_with_nvidias(tmp_path):
    (line,) = problems(tmp_path, {"lora_adapters": {"a": "org/a"}, "lora_configuration": {"lora_target_modules": ["q_proj"]}})
    assert "'q_proj' is the Hugging Face name of 'attn_q'" in line


# --- plan ---------------------------------------------------------------------------------------


def test_the_stand_in_plan_fetches_each_adapter_with_a_task_id(tmp_path):
    remote = {"repo": "org/adapter", "revision": "v1"}
    plan = plan_of(tmp_path, {"lora_adapters": {"pirate": str(PIRATE), "remote": remote}})
    assert plan.backend == "pytorch"
    assert [(a.name, a.task_id) for a in plan.lora_adapters] == [("pirate", 1), ("remote", 2)]
    assert plan.lora_adapters[0].dir == PIRATE
    adapters = [r for r in plan.fetches if r.role == "adapter"]
    assert [(r.kind, r.location, r.source, r.revision) for r in adapters] == [
        ("adapter", "local", str(PIRATE), None),
        ("adapter", "hub", "org/adapter", "v1"),
    ]
    assert plan.lora_adapters[1].dir == adapters[1].dest  # where the fetch puts it


def test_an_adapter_the_limits_cannot_take_is_a_plan_error_naming_it(tmp_path):
    build = {
        "lora_adapters": {"pirate": str(PIRATE)},
        "lora_configuration": {"max_lora_rank": 4, "lora_target_modules": ["attn_q", "attn_v"]},
    }
    with pytest.raises(PlanError) as caught:
        plan_of(tmp_path, build)
    assert caught.value.problems == [
        f"{SECTION}.build.lora_adapters.pirate: rank 8 is above {SECTION}.build.lora_configuration.max_lora_rank 4;"
        " raise max_lora_rank or use a smaller adapter",
        f"{SECTION}.build.lora_adapters.pirate: targets attn_dense, attn_k (NVIDIA's names), not in"
        f" {SECTION}.build.lora_configuration.lora_target_modules [attn_q, attn_v]; add them there",
    ]


def test_adapter_config_problems(tmp_path):
    info = lora.read_adapter("pirate", PIRATE)
    assert (info.rank, info.hf_modules) == (8, ("k_proj", "o_proj", "q_proj", "v_proj"))
    assert info.nvidia_modules == ("attn_dense", "attn_k", "attn_q", "attn_v")
    config = json.loads((PIRATE / "adapter_config.json").read_text())
    for change, message in [
        ({"target_modules": "all-linear"}, "target_modules is the pattern 'all-linear'"),
        ({"peft_type": "IA3"}, "is a IA3 adapter, not LoRA"),
        ({"target_modules": ["q_proj", "lm_head"]}, None),
    ]:
        (tmp_path / "adapter_config.json").write_text(json.dumps({**config, **change}))
        if message is None:
            found = lora.adapter_problems("x", lora.read_adapter("x", tmp_path), None)
            assert found == [f"{SECTION}.build.lora_adapters.x: targets lm_head, which NVIDIA's LoRA does not apply to"
                             " (it takes down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj)"]
        else:
            with pytest.raises(lora.AdapterError, match=message):
                lora.read_adapter("x", tmp_path)


def test_backends_that_would_not_apply_adapters_refuse_them(tmp_path):
    gpu = RuntimeFacts(gpus=(GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 81559),), trtllm_version="0.21.0",
                       trtllm_unavailable_reason=None)
    with pytest.raises(PlanError, match=r"lora_configuration.lora_target_modules: required with backend tensorrtllm"):
        plan_of(tmp_path, {"lora_adapters": {"pirate": str(PIRATE)}}, facts=gpu)
    resolved = load_config(truss(tmp_path, {"lora_adapters": {"pirate": str(PIRATE)}}, {"lora_cache_max_adapter_size": 8}), environ={})
    problems = lora.backend_problems(resolved.trt_llm.build, resolved.trt_llm.runtime, "llmapi", "1.0.0")
    assert problems == [
        f"{SECTION}.runtime.lora_cache_max_adapter_size: a parameter of NVIDIA's C++ backend; the LLM-API backend"
        " sizes its LoRA cache by adapters (LoraConfig.max_loras / max_cpu_loras); remove it",
    ]
    with pytest.raises(PlanError, match=r"runtime.detokenize_in: postprocessing .* no lora_task_id input"):
        plan_of(tmp_path, {"lora_adapters": {"pirate": str(PIRATE)}}, {"detokenize_in": "postprocessing"})


def test_adapter_fetches_take_only_peft_files_and_check_them(tmp_path):
    assert wanted("adapter_config.json", "adapter") and wanted("adapter_model.safetensors", "adapter")
    assert not wanted("README.md", "adapter") and not wanted("training_args.bin", "adapter")
    check_complete(PIRATE, "adapter", what="pirate")
    shutil.copy(PIRATE / "adapter_config.json", tmp_path)
    with pytest.raises(IncompleteArtifactError, match="needs adapter_model.safetensors"):
        check_complete(tmp_path, "adapter", what="x")


# --- repository and the stand-in's settings -----------------------------------------------------


@pytest.mark.torch  # engine_standin imports torch
def test_the_stand_in_gets_the_task_ids_and_declares_lora_task_id(tmp_path):
    from trtllm_truss.engine_standin.settings import StandinSettings

    plan = plan_of(tmp_path, {"lora_adapters": {"pirate": str(PIRATE)}, "lora_configuration": {"max_loras": 1}})
    engine = repository_configs(plan)["tensorrt_llm"]
    params = engine.parameter_dict
    assert json.loads(params["lora_adapters"]) == {"1": {"name": "pirate", "dir": str(PIRATE)}}
    tensor = next(t for t in engine.inputs if t.name == "lora_task_id")
    assert (tensor.data_type.value, tensor.dims, tensor.optional) == ("TYPE_UINT64", (1,), True)
    settings = StandinSettings.from_parameters(params)
    assert settings.lora_adapters == {1: ("pirate", PIRATE)} and settings.max_loras == 1


# --- request core -------------------------------------------------------------------------------


def test_model_becomes_the_task_id_or_a_404():
    limits = RequestLimits(64, 64, lora_task_ids=(("pirate", 1), ("other", 2)), served_model_name="embedded")
    assert [lora_task_id(m, limits) for m in (None, "", "model", "embedded", "pirate", "other")] == [
        None, None, None, None, 1, 2
    ]
    with pytest.raises(Refused) as caught:
        lora_task_id("parrot", limits)
    assert caught.value.status == 404 and caught.value.error == {"param": "model", "code": "model_not_found"}
    assert "'parrot'" in caught.value.message and "'pirate', 'other'" in caught.value.message
    # No adapters and no served name: one model, whatever the client calls it (as before).
    assert lora_task_id("gpt-4o", RequestLimits(64, 64)) is None
    with pytest.raises(Refused):
        lora_task_id("gpt-4o", RequestLimits(64, 64, served_model_name="embedded"))


def test_adapters_and_target_modules_from_the_environment_take_json(tmp_path):
    environ = {
        "TRTLLM_BUILD__LORA_ADAPTERS": '{"a": {"repo": "org/a", "revision": "v1"}}',
        "TRTLLM_BUILD__LORA_CONFIGURATION__LORA_TARGET_MODULES": '["attn_q", "attn_v"]',
    }
    resolved = load_config(truss(tmp_path, {}), environ=environ)
    build = resolved.trt_llm.build
    assert (build.lora_adapters["a"].repo, build.lora_adapters["a"].revision) == ("org/a", "v1")
    assert build.lora_configuration.lora_target_modules == ["attn_q", "attn_v"]
    assert str(resolved.sources[f"{SECTION}.build.lora_adapters.a.repo"]) == "env (TRTLLM_BUILD__LORA_ADAPTERS)"


def test_llmapi_serves_adapters_as_lora_requests(tmp_path):
    """NVIDIA's own llmapi model passed no LoRA request (tests/data/trtllm_lora/llmapi_model_lora.json); ours
    sends a LoRARequest per task id (tests/unit/test_llmapi_model_contract.py), so nothing is refused."""
    record = json.loads((ROOT / "tests" / "data" / "trtllm_lora" / "llmapi_model_lora.json").read_text())
    assert "lora" not in record["quote"]
    trt = load_config(truss(tmp_path, {"lora_adapters": {"a": "org/a"}}), environ={}).trt_llm
    assert lora.backend_problems(trt.build, trt.runtime, "llmapi", "1.0.0") == []