"""A fleet on one host: `trtllm-truss serve DIR --replicas N`.

Who owns what (one host; several hosts run the same with one discovery, docs/deploy.md "Fleet"):

| process | owns |
|---|---|
| launcher (`FleetFront`, this module; the direct front's launcher, `fronts.direct`) | the fleet's plan (`planning.fleet`), the replicas (`runtime.fleet.FleetReplicas`: started, started again when one exits, stopped), the file-discovery directory, the listening socket, the shared state, the frontends; readiness: ready while at least one replica's tritonserver is |
| replica `i` (`runtime.fleet_replica`, N of them, each its own process group) | its stack (artifacts, repository, tritonserver and its supervisor, which restarts it) on its GPUs; its Dynamo worker: the instance of `<namespace>.replica.generate` that says where its Triton is, its model registration (KV block size), the KV events relayed from its engine to Dynamo's event plane; it leaves the fleet while its tritonserver is down |
| tritonserver of replica `i`, its stubs | as with one replica; the engine's python model relays its KV cache events to its replica (`runtime.kv_event_relay`) |
| frontend `j` (`fronts.direct_app`, M of them) | as with one replica (HTTP, dialects, request core, tokenizer, detokenizer), plus its `streaming.fleet_router.FleetRouter`: a Dynamo runtime, the endpoint's client and Dynamo's `KvRouter`, which picks the replica of each engine request; the frontend streams from that replica's Triton gRPC itself |

Nothing of ours decides where a request goes: Dynamo's router does (kv: by the replicas' KV events and
load; approximate: by where it sent prefixes before; round_robin: Dynamo's client). A replica that dies
(or is stopped) leaves the fleet: its open streams end with an error (their gRPC stream breaks), the router
stops choosing it (its instance unregisters at once on a clean stop or a tritonserver death; discovery's
lease drops a killed one), and the launcher starts it again: it rejoins as a new instance.
Stop (SIGTERM / SIGINT to the launcher): the frontends (as the direct front), then every replica
(SIGTERM: it leaves the fleet, stops its tritonserver and Dynamo's runtime), then the discovery directory.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtllm_truss.fronts.direct import DirectFront, DirectFrontError

logger = logging.getLogger(__name__)

FIRST_REPLICA_TIMEOUT_S = 600.0


class _FleetServer:
    """What the direct front's launcher asks of "the server", answered for the whole fleet."""

    grpc_url = "fleet"  # never dialled: each request's engine is its route's (streaming.fleet_router)
    failed = None

    def __init__(self, replicas: Any) -> None:
        self._replicas = replicas

    @property
    def alive(self) -> bool:
        return True

    def ready(self) -> bool:
        return self._replicas.ready_count() > 0

    def add_exit_listener(self, listener: Callable[[Any], None]) -> None:
        pass  # each replica watches its own tritonserver


@dataclasses.dataclass
class _FleetStack:
    plan: Any
    server: _FleetServer
    replicas: Any
    repository_dir: Path | None = None
    is_worker_node: bool = False
    cluster: Any = None

    def stop(self) -> None:
        self.replicas.stop()


class FleetFront(DirectFront):
    def __init__(self, truss_dir: Path | str, *, replicas: int | None = None, advertise_host: str | None = None,
                 log_dir: Path | None = None, **kwargs: Any) -> None:
        super().__init__(truss_dir, **kwargs)
        self._replica_count = replicas
        self._advertise_host = advertise_host
        self._log_dir = log_dir
        self.fleet_plan: Any = None
        self.replicas: Any = None
        self._front_settings: Any = None

    def _start_stack(self, progress: Callable[[str], None]) -> Any:
        from trtllm_truss.config import load_config
        from trtllm_truss.config.fleet import FleetConfig
        from trtllm_truss.planning.fleet import FleetPlanError, plan_for
        from trtllm_truss.planning.plan import make_plan
        from trtllm_truss.planning.probe import probe_facts
        from trtllm_truss.runtime.fleet import FleetReplicas

        _require_dynamo()
        resolved = load_config(self.truss_dir, self._environ)
        facts = probe_facts()
        plan = make_plan(resolved, facts, environ=self._environ)
        fleet = resolved.trt_llm.fleet or FleetConfig()
        try:
            self.fleet_plan = plan_for(fleet, resolved, plan, gpu_count=facts.gpu_count, replicas=self._replica_count)
        except FleetPlanError as exc:
            raise DirectFrontError(str(exc)) from None
        for line in self.fleet_plan.describe():
            logger.info("%s", line.lstrip("# "))
        for warning in self.fleet_plan.warnings:
            logger.warning("%s", warning)
        self.replicas = FleetReplicas(self.truss_dir, self.fleet_plan, fleet, environ=self._environ,
                                      startup_timeout_s=self._startup_timeout_s,
                                      advertise_host=self._advertise_host or advertise_host(fleet, self._environ),
                                      log_dir=self._log_dir)
        stack = _FleetStack(plan=_fleet_front_plan(plan), server=_FleetServer(self.replicas), replicas=self.replicas)
        self.stack = stack  # stop() reaches the replicas even if the wait below fails
        progress(f"starting {self.fleet_plan.replicas} replica(s)")
        self.replicas.start()
        self.replicas.wait_ready(self._startup_timeout_s or fleet.replica_join_timeout_s)
        self._front_settings = front_settings(
            self.fleet_plan, {**self.replicas.discovery_env, "DYN_LOG": self._environ.get("DYN_LOG", "warn")})
        return stack

    def _frontend_extra(self) -> dict[str, Any]:
        return {"fleet": self._front_settings}

    def _start_probe(self, plan: Any) -> None:
        pass  # each replica's stack is its own; the fleet is ready while one replica is

    def check(self) -> bool:
        if self.replicas is not None:
            self.replicas.check()
        return super().check()


def front_settings(plan: Any, environment: dict[str, str]) -> Any:
    """What each frontend's router is built from (`streaming.fleet_router.FleetFrontSettings`): the fleet's plan
    (discovery, router mode and Dynamo's router weights, the engine's KV block size) and Dynamo's variables."""
    from trtllm_truss.streaming.fleet_router import FleetFrontSettings

    return FleetFrontSettings(
        namespace=plan.namespace, discovery=plan.discovery, router_mode=plan.router_mode,
        block_size=plan.tokens_per_block, router_temperature=plan.router_temperature,
        overlap_score_credit=plan.overlap_score_credit, prefill_load_scale=plan.prefill_load_scale,
        approximate_ttl_s=plan.approximate_ttl_s, environment=tuple(sorted(environment.items())),
    )


def _fleet_front_plan(plan: Any) -> Any:
    """The serving plan as the fleet's frontends use it: streaming on their own event loop (the router
    lives there), no engine probe of their own."""
    runtime = plan.runtime
    front = runtime.direct_front.model_copy(update={"stream_worker_processes": False})
    return dataclasses.replace(plan, runtime=runtime.model_copy(update={"direct_front": front}))


def advertise_host(fleet: Any, environ: Any) -> str:
    """Where other hosts' fronts reach this host's replicas (`fleet.advertise_host`, else see its description)."""
    import socket

    if fleet.advertise_host:
        return fleet.advertise_host
    if fleet.discovery.value == "file":
        return "127.0.0.1"  # one host
    if environ.get("POD_IP"):
        return environ["POD_IP"]
    return socket.gethostbyname(socket.gethostname())


def _require_dynamo() -> None:
    try:
        import dynamo.llm  # noqa: F401
    except ImportError:
        raise DirectFrontError(
            "serve --replicas needs NVIDIA Dynamo: pip install 'trtllm-truss[fleet]' && pip install --no-deps"
            " ai-dynamo-runtime==1.6.1 ai-dynamo==1.6.1 (docs/deploy.md, \"Fleet\")") from None

