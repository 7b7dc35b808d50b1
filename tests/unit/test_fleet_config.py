"""`model_metadata.trt_llm.fleet`: strict settings whose errors name the key, and the fleet's plan that
`validate` prints (replicas, GPUs each, discovery, router mode, whether the backend gives KV events)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from trtllm_truss.cli import main
from trtllm_truss.config import ConfigError, load_config
from trtllm_truss.config.fleet import FleetConfig
from trtllm_truss.config.runtime import RuntimeConfig
from trtllm_truss.planning.fleet import FleetPlanError, make_fleet_plan

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT = str(ROOT / "data" / "embedded-llama")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch):
    for name in list(os.environ):
        if name.startswith(("TRTLLM_", "OPTION_")):
            monkeypatch.delenv(name)


def write(root: Path, fleet: dict | None, runtime: dict | None = None, **top) -> Path:
    section = {"build": {"base_model_architecture": "llama", "huggingface_ckpt_repository": CHECKPOINT}}
    if fleet is not None:
        section["fleet"] = fleet
    if runtime is not None:
        section["runtime"] = runtime
    (root / "config.yaml").write_text(yaml.safe_dump({"model_name": "fleet", "model_metadata": {"trt_llm": section},
                                                      **top}))
    return root


@pytest.mark.parametrize(
    ("fleet", "key"),
    [
        ({"replicas": 0}, "fleet.replicas"),
        ({"router_mode": "fastest"}, "fleet.router_mode"),
        ({"discovery": "consul"}, "fleet.discovery"),
        ({"discovery": "etcd"}, "fleet.etcd"),
        ({"discovery": "etcd", "etcd": {"endpoints": ["10.0.0.5:2379"]}}, "fleet.etcd.endpoints.0"),
        ({"etcd": {"endpoints": ["http://10.0.0.5:2379"]}}, "fleet.etcd"),
        ({"replica": 2}, "fleet.replica"),
        ({"namespace": "Has Spaces"}, "fleet.namespace"),
    ],
)
def test_a_bad_setting_names_its_key(tmp_path: Path, fleet: dict, key: str):
    with pytest.raises(ConfigError) as raised:
        load_config(write(tmp_path, fleet))
    assert any(f"model_metadata.trt_llm.{key}" in problem for problem in raised.value.problems), raised.value.problems


def test_defaults_and_etcd_settings(tmp_path: Path):
    resolved = load_config(write(tmp_path, {"replicas": 3, "discovery": "etcd",
                                            "etcd": {"endpoints": ["http://10.0.0.5:2379"]}}))
    fleet = resolved.trt_llm.fleet
    assert fleet.replicas == 3 and fleet.discovery.value == "etcd" and fleet.router_mode.value == "kv"
    assert load_config(write(tmp_path, None)).trt_llm.fleet is None


def test_plan_places_one_replica_per_gpu_set_and_refuses_too_many():
    fleet = FleetConfig(replicas=2)
    plan = make_fleet_plan(fleet, backend="llmapi", gpu_count=4, gpus_per_replica=2, enable_kv_cache_reuse=True)
    assert plan.gpu_sets == ((0, 1), (2, 3)) and plan.kv_events
    with pytest.raises(FleetPlanError, match="fleet.replicas: 3 replica"):
        make_fleet_plan(fleet, backend="llmapi", gpu_count=4, gpus_per_replica=2, enable_kv_cache_reuse=True, replicas=3)
    cpu = make_fleet_plan(fleet, backend="pytorch", gpu_count=0, gpus_per_replica=1, enable_kv_cache_reuse=True)
    assert cpu.gpu_sets == () and cpu.replicas == 2 and "CPU" in cpu.describe()[0]


def test_kv_mode_needs_events_and_reuse():
    with pytest.raises(FleetPlanError, match="fleet.router_mode: kv .* backend tensorrtllm"):
        make_fleet_plan(FleetConfig(), backend="tensorrtllm", gpu_count=1, gpus_per_replica=1,
                        enable_kv_cache_reuse=True)
    with pytest.raises(FleetPlanError, match="enable_kv_cache_reuse"):
        make_fleet_plan(FleetConfig(), backend="pytorch", gpu_count=0, gpus_per_replica=1, enable_kv_cache_reuse=False)
    approximate = make_fleet_plan(FleetConfig(router_mode="approximate"), backend="tensorrtllm", gpu_count=2,
                                  gpus_per_replica=1, enable_kv_cache_reuse=False)
    assert not approximate.kv_events and "none (backend tensorrtllm)" in approximate.describe()[2]


def test_kv_mode_needs_the_event_buffer_where_the_runtime_has_one():
    with pytest.raises(FleetPlanError, match="runtime.event_buffer_max_size is 0"):
        make_fleet_plan(FleetConfig(), backend="pytorch", gpu_count=0, gpus_per_replica=1, enable_kv_cache_reuse=True,
                        event_buffer_max_size=0)


KV_RUNTIME = {"enable_kv_cache_reuse": True}
if "event_buffer_max_size" in RuntimeConfig.model_fields:  # the stand-in's KV events (runtime.event_buffer_max_size)
    KV_RUNTIME["event_buffer_max_size"] = 1000


def test_validate_prints_the_fleet_plan(tmp_path: Path, capsys):
    root = write(tmp_path, {"replicas": 2, "router_mode": "kv"}, runtime=KV_RUNTIME)
    assert main(["validate", str(root)]) == 0
    out = capsys.readouterr().out
    assert "# fleet: 2 replica(s) on this host, CPU" in out
    assert "discovery file" in out and "Dynamo's kv router" in out and "KV events: yes" in out


def test_validate_refuses_kv_routing_without_reuse_naming_the_key(tmp_path: Path, capsys):
    root = write(tmp_path, {"replicas": 2})
    assert main(["validate", str(root)]) == 1
    assert "error: model_metadata.trt_llm.fleet.router_mode: kv" in capsys.readouterr().err


def test_the_block_size_is_the_engines_own():
    """The router hashes blocks of the engine's size: build.plugin_configuration.tokens_per_block for the
    engine and the stand-in, TensorRT-LLM's KvCacheConfig default (32) for the LLM API, which our model.yaml
    leaves as is."""
    from types import SimpleNamespace

    from trtllm_truss.planning.fleet import plan_for

    runtime = SimpleNamespace(enable_kv_cache_reuse=True, event_buffer_max_size=100)
    build = SimpleNamespace(plugin_configuration=SimpleNamespace(tokens_per_block=16))
    resolved = SimpleNamespace(trt_llm=SimpleNamespace(world_size=1, runtime=runtime, build=build))
    sizes = {backend: plan_for(FleetConfig(), resolved, SimpleNamespace(backend=backend), gpu_count=0).tokens_per_block
             for backend in ("pytorch", "llmapi")}
    assert sizes == {"pytorch": 16, "llmapi": 32}
