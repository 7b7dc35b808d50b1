"""LoRA on NVIDIA's C++ backend (backend tensorrtllm, TensorRT-LLM 0.x), everything short of the engine:
the plan (adapters fetched and converted once to NVIDIA's layout, the build flags, what is refused), the
engine request carrying `lora_weights` / `lora_config` (raw FP16 / INT32, as Triton needs), and the
stream worker's side of NVIDIA's protocol against `ScriptedCppLoraCache`, a test double of the backend's
LoRA cache (TensorRT-LLM does not run here) that answers NVIDIA's cache-miss message."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import yaml
from trtllm_truss.artifacts import prepare_artifacts
from trtllm_truss.engine.client import EngineRefusedError, EnsembleInterface, GenerationParams
from trtllm_truss.config import load_config
from trtllm_truss.engine.engine_client import build_engine_request
from trtllm_truss.planning.lora import worker_lora_weights
from trtllm_truss.artifacts.lora_weights import NvidiaLora, convert_adapter
from trtllm_truss.planning.plan import PlanError, make_plan
from trtllm_truss.planning.probe import GpuInfo, RuntimeFacts
from trtllm_truss.streaming.lora_tasks import CACHE_MISS, LoraTasks, generate_with_lora

ROOT = Path(__file__).resolve().parents[2]
PIRATE = ROOT / "data" / "embedded-lora" / "pirate"
MODULES = ["attn_q", "attn_k", "attn_v", "attn_dense"]


def gpu(version: str = "0.19.0") -> RuntimeFacts:
    return RuntimeFacts(gpus=(GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 81559),), trtllm_version=version,
                        trtllm_unavailable_reason=None)


def plan_for(tmp_path: Path, facts: RuntimeFacts, **build):
    section = {
        "build": {
            "base_model_architecture": "llama",
            "huggingface_ckpt_repository": str(ROOT / "data" / "embedded-llama"),
            "lora_adapters": {"pirate": str(PIRATE)},
            "lora_configuration": {"max_lora_rank": 8, "lora_target_modules": MODULES},
            **build,
        },
        "runtime": {"backend": "tensorrtllm"},
    }
    config = {"model_name": "t", "resources": {"accelerator": "H100:1"}, "model_metadata": {"trt_llm": section}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    return make_plan(load_config(tmp_path, environ={}), facts, artifacts_dir=tmp_path / "artifacts")


def test_the_engine_plan_fetches_converts_and_builds_for_the_adapters(tmp_path):
    plan = plan_for(tmp_path, gpu())
    assert plan.backend == "tensorrtllm" and [a.name for a in plan.lora_adapters] == ["pirate"]
    assert any(r.role == "adapter" and r.source == str(PIRATE) for r in plan.fetches)
    prepared, _ = prepare_artifacts(plan, environ={})
    (adapter,) = prepared.lora_adapters
    assert adapter.nvidia_dir is not None and adapter.nvidia_dir.is_relative_to(tmp_path / "artifacts" / "lora")
    converted, expected = NvidiaLora.load(adapter.nvidia_dir), convert_adapter(PIRATE, "float16")
    np.testing.assert_array_equal(converted.weights, expected.weights)
    np.testing.assert_array_equal(converted.config, expected.config)
    assert worker_lora_weights(prepared.lora_adapters) == {"1": str(adapter.nvidia_dir)}
    again, _ = prepare_artifacts(plan, environ={})  # made once per adapter revision
    assert again.lora_adapters[0].nvidia_dir == adapter.nvidia_dir


@pytest.mark.parametrize(
    ("facts", "build", "expected"),
    [
        (gpu("1.0.0"), {}, "build.lora_adapters: TensorRT-LLM 1.0.0 engines are built through the LLM API"),
        (gpu(), {"dtype": "bfloat16"}, "trt_llm.build.dtype: LoRA on backend tensorrtllm needs float16"),
        (gpu(), {"lora_configuration": {"max_lora_rank": 8}}, "lora_configuration.lora_target_modules: required with backend tensorrtllm"),
        (gpu(), {"lora_configuration": {"lora_target_modules": MODULES, "max_loras": 2}}, "lora_configuration.max_loras: not a setting"),
    ],
)
def test_what_the_engine_path_refuses(tmp_path, facts, build, expected):
    with pytest.raises(PlanError) as caught:
        plan_for(tmp_path, facts, **build)
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems


def test_the_request_with_the_adapter_is_all_raw_with_fp16_weights():
    converted = convert_adapter(PIRATE, "float16")
    interface = EnsembleInterface(batched=True, inputs=frozenset({"request_output_len", "lora_task_id", "end_id"}))
    params = GenerationParams("", max_tokens=5, end_id=2, lora_task_id=1)
    request = build_engine_request([1, 5, 7], params, interface, "r1", lora=(converted.weights, converted.config))
    assert len(request.raw_input_contents) == len(request.inputs)
    assert all(not tensor.HasField("contents") for tensor in request.inputs)
    raw = {t.name: (t.datatype, list(t.shape), request.raw_input_contents[i]) for i, t in enumerate(request.inputs)}
    assert np.frombuffer(raw["input_ids"][2], "<i4").tolist() == [1, 5, 7]
    assert np.frombuffer(raw["lora_task_id"][2], "<u8").tolist() == [1] and raw["lora_task_id"][0] == "UINT64"
    datatype, shape, data = raw["lora_weights"]
    assert (datatype, shape) == ("FP16", list(converted.weights.shape))
    np.testing.assert_array_equal(np.frombuffer(data, "<f2").reshape(shape), converted.weights)
    assert raw["lora_config"][:2] == ("INT32", [1, 16, 3])
    assert np.frombuffer(raw["lora_config"][2], "<i4").reshape(1, 16, 3).tolist() == converted.config.tolist()
    # The id alone: the ordinary (contents) request.
    plain = build_engine_request([1, 5, 7], params, interface, "r2")
    assert not plain.raw_input_contents and "lora_weights" not in {t.name for t in plain.inputs}


class ScriptedCppLoraCache:
    """Test double of the C++ backend's LoRA cache (TensorRT-LLM cannot run here): a request whose task id
    is not cached and that carries no weights gets NVIDIA's error; one with weights caches them."""

    def __init__(self) -> None:
        self.cached: set[int] = set()
        self.calls: list[tuple[int, bool]] = []

    async def generate_ids(self, ids, params, *, lora=None, bad_words=None):
        self.calls.append((params.lora_task_id, lora is not None))
        if lora is not None:
            self.cached.add(params.lora_task_id)
        elif params.lora_task_id is not None and params.lora_task_id not in self.cached:
            raise EngineRefusedError(
                f"the engine refused the request: LoRA task {params.lora_task_id} not found in cache."
                " Please send LoRA weights with request"
            )
        for token in (11, 12):
            yield [token], None


def run(engine, tasks, task_id):
    async def collect():
        out = []
        async for new_ids, _ in generate_with_lora(engine.generate_ids, tasks, task_id, [1], GenerationParams("", 2, lora_task_id=task_id), bad_words=None):
            out += new_ids
        return out

    return asyncio.run(collect())


def test_the_worker_sends_weights_first_then_the_id_and_again_after_eviction(tmp_path):
    convert_adapter(PIRATE, "float16").save(tmp_path / "pirate")
    engine, tasks = ScriptedCppLoraCache(), LoraTasks({1: tmp_path / "pirate"})
    assert run(engine, tasks, 1) == [11, 12] and run(engine, tasks, 1) == [11, 12]
    assert engine.calls == [(1, True), (1, False)]
    engine.cached.clear()  # evicted (or tritonserver restarted)
    assert run(engine, tasks, 1) == [11, 12]
    assert engine.calls[2:] == [(1, False), (1, True)]
    assert run(engine, None, None) == [11, 12] and engine.calls[-1] == (None, False)  # the base model


def test_a_miss_after_sending_the_weights_or_another_error_is_not_retried(tmp_path):
    convert_adapter(PIRATE, "float16").save(tmp_path / "pirate")

    class Full(ScriptedCppLoraCache):
        async def generate_ids(self, ids, params, *, lora=None, bad_words=None):
            self.calls.append((params.lora_task_id, lora is not None))
            raise EngineRefusedError("LoRA task 1 not found in cache. Please send LoRA weights with request")
            yield  # pragma: no cover

    engine = Full()
    with pytest.raises(EngineRefusedError):
        run(engine, LoraTasks({1: tmp_path / "pirate"}), 1)
    assert engine.calls == [(1, True)]
    assert CACHE_MISS.search("LoRA task 10 not found in cache. Please send LoRA weights with request")


@pytest.mark.parametrize("version", ["0.16.0", "0.19.0", "0.21.0"])
def test_validate_prints_an_engine_build_nvidias_flags_accept(tmp_path, monkeypatch, capsys, version):
    import trtllm_truss.planning.probe
    from trtllm_flags_check import command_problems, printed_commands
    from trtllm_truss.cli import main

    monkeypatch.setattr(trtllm_truss.planning.probe, "probe_facts", lambda **kwargs: RuntimeFacts())
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("TRTLLM_TRUSS_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    section = {
        "build": {
            "base_model_architecture": "llama",
            "huggingface_ckpt_repository": "meta-llama/Llama-3.1-8B-Instruct",
            "lora_adapters": {"pirate": str(PIRATE), "sql": {"repo": "org/sql-lora", "revision": "v2"}},
            "lora_configuration": {"max_lora_rank": 16, "lora_target_modules": MODULES},
        },
        "runtime": {"lora_cache_gpu_memory_fraction": 0.05},
    }
    config = {"model_name": "t", "resources": {"accelerator": "H100:1"}, "model_metadata": {"trt_llm": section}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["validate", str(tmp_path), "--trtllm-version", version]) == 0
    out = capsys.readouterr().out
    commands = printed_commands(out)
    assert commands and all(command_problems(argv, version)[1] == [] for argv in commands)
    (build,) = [argv for argv in commands if argv[0] == "trtllm-build"]
    assert build[build.index("--lora_target_modules") + 1 :][:4] == MODULES
    assert "# LoRA adapter 'sql' (lora_task_id 2, request model='sql')" in out
