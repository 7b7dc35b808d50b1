"""The fleet's plan: how many replicas this host runs, on which GPUs, how they are found and routed.

Pure (no I/O): made from the section (`config.fleet`), the serving plan's backend and the GPUs this host
has. `validate` prints it; `runtime.fleet` starts what it says.

Which backends give KV cache events: NVIDIA's LLM API (`LLM.get_kv_cache_events_async`, TensorRT-LLM
1.x, with block reuse and `kv_cache_config.event_buffer_max_size` > 0: what Dynamo's own TensorRT-LLM
worker reads, `dynamo/trtllm/publisher.py`) and the stand-in, which gives them in the same shape. NVIDIA's
C++ backend (`tensorrtllm` through Triton) exposes none to its clients, so it is routed by Dynamo's KV router
without events (approximate: the router remembers where it sent each prefix).

A replica has one KV cache: TensorRT-LLM runs one executor (one block pool) per replica, whatever the
number of Triton instances in front of it, and so does our llmapi model (its instances are clients of one
LLM). The stand-in (backend pytorch) is different: each of its Triton instances is an engine with its own
block pool, and Triton, not Dynamo's router, picks the instance. So a KV-routed fleet of the stand-in gives
each replica one engine instance unless `runtime.pytorch.instance_count` is set, and warns where it is set
above 1 (the instances split the replica's cache: the router's view of what it holds is wrong).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_truss.config.fleet import FleetConfig, RouterMode

DEFAULT_TOKENS_PER_BLOCK = 64  # trtllm-build's default tokens_per_block (the engine, and the stand-in)
# The LLM API's: TensorRT-LLM 1.x KvCacheConfig.tokens_per_block default, which our llmapi model.yaml leaves
# as is (repository/llmapi.py sets no tokens_per_block; engine_standin/llmapi_kv.py holds the same default).
LLMAPI_TOKENS_PER_BLOCK = 32
BACKENDS_WITH_KV_EVENTS = ("llmapi", "pytorch")
KV_ROUTED = (RouterMode.KV, RouterMode.APPROXIMATE)
INSTANCE_COUNT_KEY = "model_metadata.trt_llm.runtime.pytorch.instance_count"
ROUTER_COST_KEYS = frozenset({"router_temperature", "overlap_score_credit", "prefill_load_scale"})  # kv, approximate


@dataclass(frozen=True)
class FleetPlan:
    replicas: int
    gpus_per_replica: int  # 0: CPU
    gpu_sets: tuple[tuple[int, ...], ...]  # CUDA_VISIBLE_DEVICES of each replica (empty on CPU)
    namespace: str
    discovery: str
    discovery_detail: str
    router_mode: str
    kv_events: bool  # the backend gives KV cache events (and the router mode uses them)
    backend: str
    tokens_per_block: int
    router_temperature: float = 0.0
    overlap_score_credit: float = 1.0
    prefill_load_scale: float = 1.0
    approximate_ttl_s: float = 120.0
    replica_join_timeout_s: float = 600.0
    # Backend pytorch: the stand-in's engine instances each replica gets from the fleet (1 for KV routing, where
    # runtime.pytorch.instance_count is not set), else None (the replica's own plan decides).
    engine_instances: int | None = None
    configured_engine_instances: int | None = None  # runtime.pytorch.instance_count as set
    warnings: tuple[str, ...] = ()

    def describe(self) -> list[str]:
        where = (f"{self.gpus_per_replica} GPU(s) each: " + "; ".join(",".join(map(str, s)) for s in self.gpu_sets)
                 if self.gpus_per_replica else "CPU (stacks of the embedded default)")
        events = ("yes, the router is fed by them" if self.kv_events else
                  "not used (router_mode " + self.router_mode + ")" if self.backend in BACKENDS_WITH_KV_EVENTS
                  else "none (backend " + self.backend + "): routed without events")
        return [
            f"# fleet: {self.replicas} replica(s) on this host, {where}",
            f"#   Dynamo namespace {self.namespace}, discovery {self.discovery} ({self.discovery_detail})",
            f"#   router: Dynamo's {self.router_mode} router{self._weights()}; KV block size {self.tokens_per_block}"
            f" tokens; KV events: {events}",
            *self._engine_line(),
        ]

    def _weights(self) -> str:
        if self.router_mode not in {m.value for m in KV_ROUTED}:
            return ""
        return (f" (overlap_score_credit {self.overlap_score_credit:g}, prefill_load_scale {self.prefill_load_scale:g},"
                f" router_temperature {self.router_temperature:g})")

    def _engine_line(self) -> list[str]:
        if self.backend != "pytorch":
            return []
        if self.engine_instances is not None:
            how = "one KV block pool a replica, as TensorRT-LLM's one executor"
            return [f"#   engine instances per replica: {self.engine_instances} ({how})"]
        if self.configured_engine_instances is not None:
            split = (", each with its own KV block pool: they split the replica's cache"
                     if self.configured_engine_instances > 1 and self.router_mode in {m.value for m in KV_ROUTED} else "")
            return [f"#   engine instances per replica: {self.configured_engine_instances}"
                    f" (runtime.pytorch.instance_count{split})"]
        return ["#   engine instances per replica: the stand-in's default (runtime.pytorch.instance_count)"]


class FleetPlanError(ValueError):
    """A fleet setting the plan cannot honour; the message names the key."""


def tokens_per_block_of(build) -> int:
    plugins = getattr(build, "plugin_configuration", None)
    return getattr(plugins, "tokens_per_block", None) or DEFAULT_TOKENS_PER_BLOCK


def make_fleet_plan(
    fleet: FleetConfig,
    *,
    backend: str,
    gpu_count: int,
    gpus_per_replica: int,
    enable_kv_cache_reuse: bool,
    tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK,
    replicas: int | None = None,
    event_buffer_max_size: int | None = None,
    engine_instance_count: int | None = None,
) -> FleetPlan:
    """`replicas` (from `serve --replicas`) overrides the section's; `engine_instance_count`:
    runtime.pytorch.instance_count as set (None: not set). Raises FleetPlanError naming the key."""
    key = "model_metadata.trt_llm.fleet"
    count = replicas if replicas is not None else fleet.replicas
    if count < 1:
        raise FleetPlanError(f"{key}.replicas: {count}; at least 1")
    mode = fleet.router_mode
    if mode is RouterMode.KV and backend not in BACKENDS_WITH_KV_EVENTS:
        raise FleetPlanError(
            f"{key}.router_mode: kv needs the replicas' KV cache events, and backend {backend} (NVIDIA's C++ backend"
            " through Triton) gives none; set router_mode: approximate (Dynamo's KV router without events)")
    if mode is RouterMode.KV and not enable_kv_cache_reuse:
        raise FleetPlanError(
            f"{key}.router_mode: kv routes by reused KV blocks, but model_metadata.trt_llm.runtime.enable_kv_cache_reuse"
            " is false (no block is reused, no event is sent); set it true (with runtime.event_buffer_max_size, e.g."
            " TRTLLM_RUNTIME__ENABLE_KV_CACHE_REUSE=true TRTLLM_RUNTIME__EVENT_BUFFER_MAX_SIZE=10000), or router_mode:"
            " round_robin")
    if mode is RouterMode.KV and event_buffer_max_size == 0:  # None: a runtime section without the setting
        raise FleetPlanError(
            f"{key}.router_mode: kv is fed by the engine's KV cache events, but"
            " model_metadata.trt_llm.runtime.event_buffer_max_size is 0 (TensorRT-LLM keeps none); set it (e.g."
            " 10000), or router_mode: approximate")
    gpu_sets: tuple[tuple[int, ...], ...] = ()
    per = 0
    if gpu_count:
        per = max(1, gpus_per_replica)
        if count * per > gpu_count:
            raise FleetPlanError(
                f"{key}.replicas: {count} replica(s) x {per} GPU(s) each need {count * per} GPUs; this host has"
                f" {gpu_count}")
        gpu_sets = tuple(tuple(range(i * per, (i + 1) * per)) for i in range(count))
    engine_instances = None
    warnings: tuple[str, ...] = ()
    if backend == "pytorch" and mode in KV_ROUTED:
        if engine_instance_count is None:
            engine_instances = 1
        elif engine_instance_count > 1:
            warnings = (
                f"{INSTANCE_COUNT_KEY}: {engine_instance_count} engine instances split each replica's KV cache (each"
                " instance of the stand-in has its own block pool and Triton picks the instance, while Dynamo's router"
                " sees one replica), so prefixes the router sends to a replica are often not found there; remove the"
                " setting (a KV-routed fleet gives each replica 1, as TensorRT-LLM's one executor) or set 1",)
    if mode not in KV_ROUTED:
        unused = sorted(ROUTER_COST_KEYS & fleet.model_fields_set)
        warnings += tuple(f"{key}.{name}: set, but router_mode {mode.value} weighs no cost (only kv and approximate"
                          " do); remove it or choose one of those" for name in unused)
    if fleet.discovery.value == "file":
        detail = f"directory {fleet.file.directory}" if fleet.file.directory else "a directory of this run"
    elif fleet.discovery.value == "etcd":
        detail = "etcd " + ", ".join(fleet.etcd.endpoints)  # type: ignore[union-attr]
    else:
        detail = f"namespace {fleet.kubernetes.namespace or 'of the pod'}"
    return FleetPlan(
        replicas=count,
        gpus_per_replica=per,
        gpu_sets=gpu_sets,
        namespace=fleet.namespace,
        discovery=fleet.discovery.value,
        discovery_detail=detail,
        router_mode=mode.value,
        kv_events=mode is RouterMode.KV,
        backend=backend,
        tokens_per_block=tokens_per_block,
        router_temperature=fleet.router_temperature,
        overlap_score_credit=fleet.overlap_score_credit,
        prefill_load_scale=fleet.prefill_load_scale,
        approximate_ttl_s=fleet.approximate_ttl_s,
        replica_join_timeout_s=fleet.replica_join_timeout_s,
        engine_instances=engine_instances,
        configured_engine_instances=engine_instance_count,
        warnings=warnings,
    )


def fleet_report(resolved, plan, replicas: int | None = None) -> tuple[list[str], list[str], list[str]]:
    """What `validate` prints of the fleet (lines, warnings, problems); nothing without a fleet section or
    --replicas."""
    fleet = resolved.trt_llm.fleet
    if fleet is None and replicas is None:
        return [], [], []
    fleet = fleet or FleetConfig()
    accelerator = resolved.accelerator
    try:
        fleet_plan = plan_for(fleet, resolved, plan, replicas=replicas,
                              gpu_count=accelerator.count if accelerator is not None else 0)
    except FleetPlanError as exc:
        return [], [], [str(exc)]
    return fleet_plan.describe(), list(fleet_plan.warnings), []


def plan_for(fleet: FleetConfig, resolved, plan, *, gpu_count: int, replicas: int | None = None) -> FleetPlan:
    trt = resolved.trt_llm
    return make_fleet_plan(
        fleet,
        backend=plan.backend,
        gpu_count=gpu_count,
        gpus_per_replica=trt.world_size,
        enable_kv_cache_reuse=trt.runtime.enable_kv_cache_reuse,
        tokens_per_block=LLMAPI_TOKENS_PER_BLOCK if plan.backend == "llmapi" else tokens_per_block_of(trt.build),
        replicas=replicas,
        event_buffer_max_size=getattr(trt.runtime, "event_buffer_max_size", None),
        engine_instance_count=trt.runtime.pytorch.instance_count,
    )
