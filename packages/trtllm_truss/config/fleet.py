"""`model_metadata.trt_llm.fleet`: several replicas of this truss behind NVIDIA Dynamo's router.

The section only says what the fleet is (how many replicas on this host, how they find each other,
how Dynamo's router chooses among them); which processes it takes is `runtime.fleet` and the front
that asks the router is `fronts.fleet_router`. Names here are Dynamo 1.6.1's: the discovery backends of
`dynamo.runtime.DistributedRuntime` ("file", "etcd", "kubernetes"), the router modes of
`dynamo.llm.RouterMode` (KV with KV events, KV without them: `KvRouterConfig(use_kv_events=False)`,
which Dynamo calls approximate; round robin), and `KvRouterConfig`'s `router_temperature`,
`overlap_score_credit`, `prefill_load_scale` and `router_ttl_secs` (Dynamo 1.6.1's router cost: a replica's
prefill blocks less `overlap_score_credit` x its cached prefix blocks, floored at 0, times
`prefill_load_scale`, plus its decode blocks; the lowest cost wins, or a softmax at `router_temperature`).
"""

from __future__ import annotations

import enum

from pydantic import Field, model_validator

from trtllm_truss.config.fields import NonEmptyStr, StrictModel, field_problem


class DiscoveryBackend(str, enum.Enum):
    FILE = "file"  # one host: a directory of JSON records (DYN_FILE_KV)
    ETCD = "etcd"  # several hosts: an etcd cluster (ETCD_ENDPOINTS)
    KUBERNETES = "kubernetes"  # Dynamo's operator: discovery from the pods' own records


class RouterMode(str, enum.Enum):
    KV = "kv"  # Dynamo's KV router fed by the replicas' KV cache events
    APPROXIMATE = "approximate"  # Dynamo's KV router without events: it remembers where it sent prefixes
    ROUND_ROBIN = "round_robin"  # Dynamo's round robin over the live replicas (no KV awareness)


class FileDiscovery(StrictModel):
    directory: NonEmptyStr | None = Field(
        None,
        description="Directory Dynamo's file discovery keeps its records in (DYN_FILE_KV); default: a"
        " directory under the fleet's run directory, created and removed by `serve --replicas`.",
    )


class EtcdDiscovery(StrictModel):
    endpoints: list[NonEmptyStr] = Field(
        description="etcd client URLs every host of the fleet reaches (ETCD_ENDPOINTS), e.g."
        " [http://10.0.0.5:2379].",
        min_length=1,
    )

    @model_validator(mode="after")
    def _urls(self) -> EtcdDiscovery:
        for index, url in enumerate(self.endpoints):
            if not url.startswith(("http://", "https://")):
                raise field_problem(f"endpoints.{index}", f"{url!r} is not an etcd client URL; expected http(s)://HOST:PORT")
        return self


class KubernetesDiscovery(StrictModel):
    namespace: NonEmptyStr | None = Field(
        None, description="Kubernetes namespace of the fleet's pods (POD_NAMESPACE); default: the pod's own."
    )


class FleetConfig(StrictModel):
    replicas: int = Field(
        1,
        ge=1,
        le=64,
        description="Replicas this host runs (`serve --replicas` overrides it): one per GPU where there are"
        " GPUs (each gets tensor_parallel x pipeline_parallel of them), else stacks of the embedded default.",
    )
    namespace: NonEmptyStr = Field(
        "trtllm-truss",
        pattern=r"^[a-z0-9][a-z0-9_-]*$",
        description="Dynamo namespace of the fleet: replicas and fronts with the same namespace (and"
        " discovery) are one fleet, whichever host they run on.",
    )
    discovery: DiscoveryBackend = Field(
        DiscoveryBackend.FILE,
        description="How replicas and fronts find each other: file (one host), etcd (several hosts), kubernetes"
        " (Dynamo's operator).",
    )
    file: FileDiscovery = Field(default_factory=FileDiscovery, description="Settings of discovery: file.")
    etcd: EtcdDiscovery | None = Field(None, description="Settings of discovery: etcd (required with it).")
    kubernetes: KubernetesDiscovery = Field(
        default_factory=KubernetesDiscovery, description="Settings of discovery: kubernetes."
    )
    router_mode: RouterMode = Field(
        RouterMode.KV,
        description="kv: Dynamo's KV router fed by the replicas' KV events (backends that give them);"
        " approximate: the same router without events (NVIDIA's C++ backend gives none through Triton);"
        " round_robin: no KV awareness.",
    )
    router_temperature: float = Field(
        0.0, ge=0.0, allow_inf_nan=False,
        description="Dynamo's KvRouterConfig.router_temperature: 0 always picks the best replica.",
    )
    overlap_score_credit: float = Field(
        1.0, ge=0.0, allow_inf_nan=False,
        description="router_mode kv / approximate: Dynamo's KvRouterConfig.overlap_score_credit, how many prefill"
        " blocks each cached prefix block takes off a replica's cost; above 1 favours the replica holding the prefix"
        " over a less loaded one, 0 routes by load alone (Dynamo's frontend: --router-kv-overlap-score-credit).",
    )
    prefill_load_scale: float = Field(
        1.0, ge=0.0, allow_inf_nan=False,
        description="router_mode kv / approximate: Dynamo's KvRouterConfig.prefill_load_scale, the weight of a"
        " replica's prefill blocks left after the overlap credit against its decode blocks (Dynamo's frontend:"
        " --router-prefill-load-scale).",
    )
    approximate_ttl_s: float = Field(
        120.0, gt=0.0, description="router_mode approximate: how long the router assumes a routed prefix stays cached"
        " (KvRouterConfig.router_ttl_secs)."
    )
    advertise_host: NonEmptyStr | None = Field(
        None,
        description="The address the fronts of other hosts reach this host's replicas at (their Triton gRPC); default:"
        " 127.0.0.1 with discovery file, else POD_IP where set (Kubernetes), else this host's name resolved.",
    )
    replica_join_timeout_s: float = Field(
        600.0, gt=0.0, description="How long the front waits for a first replica to join before it answers 503."
    )

    @model_validator(mode="after")
    def _discovery_settings(self) -> FleetConfig:
        if self.discovery is DiscoveryBackend.ETCD and self.etcd is None:
            raise field_problem("etcd", "discovery etcd needs etcd.endpoints (the etcd client URLs every host reaches)")
        if self.discovery is not DiscoveryBackend.ETCD and self.etcd is not None:
            raise field_problem("etcd", f"set, but discovery is {self.discovery.value}; remove it or set discovery: etcd")
        return self

    @property
    def uses_kv_events(self) -> bool:
        return self.router_mode is RouterMode.KV
