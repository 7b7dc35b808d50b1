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
        ({"overlap_score_credit": -1}, "fleet.overlap_score_credit"),
        ({"prefill_load_scale": float("inf")}, "fleet.prefill_load_scale"),
        ({"router_temperature": float("nan")}, "fleet.router_temperature"),
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

    runtime = SimpleNamespace(enable_kv_cache_reuse=True, event_buffer_max_size=100,
                              pytorch=SimpleNamespace(instance_count=None))
    build = SimpleNamespace(plugin_configuration=SimpleNamespace(tokens_per_block=16))
    resolved = SimpleNamespace(trt_llm=SimpleNamespace(world_size=1, runtime=runtime, build=build))
    sizes = {backend: plan_for(FleetConfig(), resolved, SimpleNamespace(backend=backend), gpu_count=0).tokens_per_block
             for backend in ("pytorch", "llmapi")}
    assert sizes == {"pytorch": 16, "llmapi": 32}


# --- one KV cache a replica: the stand-in's engine instances ------------------------------------------


def test_a_kv_routed_fleet_of_the_stand_in_gives_each_replica_one_engine_instance():
    """Each instance of the stand-in has its own block pool; TensorRT-LLM's replica has one executor."""
    for mode in ("kv", "approximate"):
        plan = make_fleet_plan(FleetConfig(router_mode=mode), backend="pytorch", gpu_count=0, gpus_per_replica=1,
                               enable_kv_cache_reuse=True)
        assert plan.engine_instances == 1 and not plan.warnings, mode
        assert "#   engine instances per replica: 1 (one KV block pool a replica" in plan.describe()[3]
    # Round robin routes by no cache: the replica keeps the stand-in's own default.
    rr = make_fleet_plan(FleetConfig(router_mode="round_robin"), backend="pytorch", gpu_count=0, gpus_per_replica=1,
                         enable_kv_cache_reuse=True)
    assert rr.engine_instances is None and not rr.warnings and "default" in rr.describe()[3]
    # The llmapi model's instances are clients of one LLM (one pool): nothing to choose, no line.
    llmapi = make_fleet_plan(FleetConfig(), backend="llmapi", gpu_count=0, gpus_per_replica=1,
                             enable_kv_cache_reuse=True, engine_instance_count=4)
    assert llmapi.engine_instances is None and not llmapi.warnings and len(llmapi.describe()) == 3


def test_engine_instances_set_by_the_user_are_kept_and_more_than_one_is_warned_about():
    split = make_fleet_plan(FleetConfig(), backend="pytorch", gpu_count=0, gpus_per_replica=1,
                            enable_kv_cache_reuse=True, engine_instance_count=8)
    assert split.engine_instances is None  # the user's setting stands
    assert len(split.warnings) == 1
    assert split.warnings[0].startswith("model_metadata.trt_llm.runtime.pytorch.instance_count: 8 engine instances"
                                        " split each replica's KV cache")
    assert "they split the replica's cache" in split.describe()[3]
    one = make_fleet_plan(FleetConfig(), backend="pytorch", gpu_count=0, gpus_per_replica=1,
                          enable_kv_cache_reuse=True, engine_instance_count=1)
    assert one.engine_instances is None and not one.warnings
    rr = make_fleet_plan(FleetConfig(router_mode="round_robin"), backend="pytorch", gpu_count=0, gpus_per_replica=1,
                         enable_kv_cache_reuse=True, engine_instance_count=8)
    assert not rr.warnings


def test_validate_prints_the_engine_instances_and_warns_naming_the_key(tmp_path: Path, capsys):
    synthetic = {**KV_RUNTIME, "pytorch": {"synthetic": {"step_time_ms": 1}}}
    root = write(tmp_path, {"replicas": 2}, runtime=synthetic)
    assert main(["validate", str(root)]) == 0
    captured = capsys.readouterr()
    assert "#   engine instances per replica: 1 (one KV block pool a replica" in captured.out
    assert "instance_count" not in captured.err
    root = write(tmp_path, {"replicas": 2}, runtime={**KV_RUNTIME, "pytorch": {"instance_count": 4}})
    assert main(["validate", str(root)]) == 0
    captured = capsys.readouterr()
    assert "warning: model_metadata.trt_llm.runtime.pytorch.instance_count: 4 engine instances split" in captured.err
    assert "#   engine instances per replica: 4 (runtime.pytorch.instance_count" in captured.out


def test_the_replicas_get_the_plans_engine_instances_as_a_config_override(tmp_path: Path):
    """The replica's own stack reads it as any TRTLLM_ override (runtime.pytorch.instance_count)."""
    from trtllm_truss.runtime.fleet import FleetReplicas

    environ = {"PATH": os.environ["PATH"]}
    plan = make_fleet_plan(FleetConfig(replicas=2), backend="pytorch", gpu_count=0, gpus_per_replica=1,
                           enable_kv_cache_reuse=True)
    replicas = FleetReplicas(tmp_path, plan, FleetConfig(replicas=2), environ=environ)
    try:
        env = replicas._env(replicas._replicas[0])
        assert env["TRTLLM_RUNTIME__PYTORCH__INSTANCE_COUNT"] == "1"
        resolved = load_config(write(tmp_path, None, runtime={"pytorch": {"synthetic": {}}}), env)
        assert resolved.trt_llm.runtime.pytorch.instance_count == 1
    finally:
        replicas.stop()
    kept = make_fleet_plan(FleetConfig(replicas=2), backend="pytorch", gpu_count=0, gpus_per_replica=1,
                           enable_kv_cache_reuse=True, engine_instance_count=3)
    replicas = FleetReplicas(tmp_path, kept, FleetConfig(replicas=2), environ=environ)
    try:
        assert "TRTLLM_RUNTIME__PYTORCH__INSTANCE_COUNT" not in replicas._env(replicas._replicas[0])
    finally:
        replicas.stop()


# --- Dynamo's router weights ------------------------------------------------------------------------------


def test_the_router_weights_reach_the_frontends_router_settings():
    """Dynamo 1.6.1's KvRouterConfig names (overlap_score_credit, prefill_load_scale, router_temperature), from
    the section through the plan to what each frontend builds its KvRouterConfig from."""
    from trtllm_truss.fronts.fleet import front_settings

    fleet = FleetConfig(overlap_score_credit=2.5, prefill_load_scale=3.0, router_temperature=0.25)
    plan = make_fleet_plan(fleet, backend="pytorch", gpu_count=0, gpus_per_replica=1, enable_kv_cache_reuse=True)
    assert "(overlap_score_credit 2.5, prefill_load_scale 3, router_temperature 0.25)" in plan.describe()[2]
    settings = front_settings(plan, {"DYN_FILE_KV": "/tmp/x"})
    assert (settings.overlap_score_credit, settings.prefill_load_scale, settings.router_temperature) == (2.5, 3.0, 0.25)
    assert settings.environment == (("DYN_FILE_KV", "/tmp/x"),)
    defaults = front_settings(make_fleet_plan(FleetConfig(), backend="pytorch", gpu_count=0, gpus_per_replica=1,
                                              enable_kv_cache_reuse=True), {})
    assert (defaults.overlap_score_credit, defaults.prefill_load_scale, defaults.router_temperature) == (1.0, 1.0, 0.0)


def test_router_weights_set_for_round_robin_are_warned_about_naming_the_key():
    fleet = FleetConfig(router_mode="round_robin", overlap_score_credit=2.0)
    plan = make_fleet_plan(fleet, backend="pytorch", gpu_count=0, gpus_per_replica=1, enable_kv_cache_reuse=True)
    assert [w.split(":")[0] for w in plan.warnings] == ["model_metadata.trt_llm.fleet.overlap_score_credit"]
    assert "overlap_score_credit" not in plan.describe()[2]
    quiet = make_fleet_plan(FleetConfig(router_mode="round_robin"), backend="pytorch", gpu_count=0,
                            gpus_per_replica=1, enable_kv_cache_reuse=True)
    assert not quiet.warnings
