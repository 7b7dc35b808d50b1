"""A fleet as the stack a front serves from, shared by both fronts.

`start_fleet_stack` plans the fleet (`planning.fleet.plan_for`), starts its replicas (`runtime.fleet.FleetReplicas`)
and waits until one is ready; the direct front's launcher (`fronts.fleet.FleetFront`) and truss's server
(`fronts.service.LLMService`, where `model_metadata.trt_llm.fleet` is set) both serve from what it returns.
Each front process then streams on its own event loop, with Dynamo's router on that loop
(`streaming.fleet_router.attach_router`): the direct front's frontends attach it when their server starts,
truss's server on its first readiness check or request (`LoopRouter`: truss runs `load()` on a thread of
its own, and the router must live on the loop that serves the requests).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ROUTER_CLOSE_S = 10.0  # how long a stop from another thread waits for the router's close on the serving loop


class FleetError(RuntimeError):
    """The fleet cannot be served (its plan, or NVIDIA Dynamo missing)."""


class FleetServer:
    """What a front asks of "the server", answered for the whole fleet."""

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
class FleetStack:
    plan: Any  # the serving plan as the fleet's fronts use it (fleet_front_plan)
    server: FleetServer
    replicas: Any  # runtime.fleet.FleetReplicas
    fleet_plan: Any = None  # planning.fleet.FleetPlan
    front_settings: Any = None  # streaming.fleet_router.FleetFrontSettings: what each front's router is built from
    repository_dir: Path | None = None
    is_worker_node: bool = False
    cluster: Any = None

    def stop(self) -> None:
        self.replicas.stop()


def start_fleet_stack(
    truss_dir: Path, environ: Mapping[str, str] | None, *, secrets: Mapping[str, Any] | None = None,
    replicas: int | None = None, advertise_host: str | None = None, log_dir: Path | None = None,
    startup_timeout_s: float | None = None, watched: bool = False, progress: Callable[[str], None] = lambda _: None,
) -> FleetStack:
    """The fleet's replicas started and ready (every one stopped again if that fails); the fleet then serves
    while at least one of them is (`FleetServer.ready`).

    `replicas` overrides `fleet.replicas`; `watched`: started, and started again when one exits, from a
    thread of the fleet's own (`FleetReplicas.start_watched`; a front whose caller's thread ends, as truss's
    load thread does) instead of the caller's thread and its `check()` calls."""
    import os

    from trtllm_truss.config import load_config
    from trtllm_truss.config.fleet import FleetConfig
    from trtllm_truss.planning.fleet import FleetPlanError, plan_for
    from trtllm_truss.planning.plan import make_plan
    from trtllm_truss.planning.probe import probe_facts
    from trtllm_truss.runtime.fleet import FleetReplicas

    require_dynamo()
    environ = os.environ if environ is None else environ
    resolved = load_config(truss_dir, environ, secrets=secrets)
    facts = probe_facts()
    plan = make_plan(resolved, facts, environ=environ)
    fleet = resolved.trt_llm.fleet or FleetConfig()
    try:
        fleet_plan = plan_for(fleet, resolved, plan, gpu_count=facts.gpu_count, replicas=replicas)
    except FleetPlanError as exc:
        raise FleetError(str(exc)) from None
    for line in fleet_plan.describe():
        logger.info("%s", line.lstrip("# "))
    for warning in fleet_plan.warnings:
        logger.warning("%s", warning)
    fleet_replicas = FleetReplicas(truss_dir, fleet_plan, fleet, environ=environ, startup_timeout_s=startup_timeout_s,
                                   advertise_host=advertise_host or advertise_host_for(fleet, environ), log_dir=log_dir)
    stack = FleetStack(plan=fleet_front_plan(plan), server=FleetServer(fleet_replicas), replicas=fleet_replicas,
                       fleet_plan=fleet_plan)
    progress(f"starting {fleet_plan.replicas} replica(s)")
    try:
        if watched:
            fleet_replicas.start_watched()
        else:
            fleet_replicas.start()
        fleet_replicas.wait_ready(startup_timeout_s or fleet.replica_join_timeout_s, check=not watched)
    except BaseException:
        fleet_replicas.stop()
        raise
    stack.front_settings = front_settings(
        fleet_plan, {**fleet_replicas.discovery_env, "DYN_LOG": environ.get("DYN_LOG", "warn")})
    return stack


def front_settings(plan: Any, environment: dict[str, str]) -> Any:
    """What each front's router is built from (`streaming.fleet_router.FleetFrontSettings`): the fleet's plan
    (discovery, router mode and Dynamo's router weights, the engine's KV block size) and Dynamo's variables."""
    from trtllm_truss.streaming.fleet_router import FleetFrontSettings

    return FleetFrontSettings(
        namespace=plan.namespace, discovery=plan.discovery, router_mode=plan.router_mode,
        block_size=plan.tokens_per_block, router_temperature=plan.router_temperature,
        overlap_score_credit=plan.overlap_score_credit, prefill_load_scale=plan.prefill_load_scale,
        approximate_ttl_s=plan.approximate_ttl_s, environment=tuple(sorted(environment.items())),
    )


def fleet_front_plan(plan: Any) -> Any:
    """The serving plan as the fleet's fronts use it: streaming on their own event loop (the router lives
    there), no engine probe of their own."""
    runtime = plan.runtime
    front = runtime.direct_front.model_copy(update={"stream_worker_processes": False})
    return dataclasses.replace(plan, runtime=runtime.model_copy(update={"direct_front": front}))


def advertise_host_for(fleet: Any, environ: Any) -> str:
    """Where other hosts' fronts reach this host's replicas (`fleet.advertise_host`, else see its description)."""
    import socket

    if fleet.advertise_host:
        return fleet.advertise_host
    if fleet.discovery.value == "file":
        return "127.0.0.1"  # one host
    if environ.get("POD_IP"):
        return environ["POD_IP"]
    return socket.gethostbyname(socket.gethostname())


def require_dynamo() -> None:
    """NVIDIA Dynamo is installed. Found, not imported: Dynamo sets its logging up (DYN_LOG) when it is first
    imported, which in a front is when its router starts, with the fleet's variables set."""
    import importlib.util

    try:
        found = importlib.util.find_spec("dynamo.llm") is not None
    except ImportError:  # no `dynamo` package at all
        found = False
    if not found:
        raise FleetError(
            "a fleet (model_metadata.trt_llm.fleet, serve --replicas) needs NVIDIA Dynamo: pip install"
            " 'trtllm-truss[fleet]' && pip install --no-deps ai-dynamo-runtime==1.6.1 ai-dynamo==1.6.1"
            " (docs/deploy.md, \"Fleet\")") from None


class LoopRouter:
    """Dynamo's router for a pool that streams on a server's event loop it does not start (truss's): attached
    on that loop at its first use (`ready()`: the readiness check or a request), closed at stop from any thread."""

    def __init__(self, pool: Any, settings: Any) -> None:
        self._pool = pool
        self._settings = settings
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.router: Any = None  # streaming.fleet_router.FleetRouter once attached

    async def ready(self) -> None:
        """Attach the router on the running loop, once (the requests that arrive meanwhile wait for it)."""
        if self.router is not None:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.router is not None:
                return
            from trtllm_truss.streaming.fleet_router import attach_router

            router = await attach_router(self._pool, self._settings)
            await self._pool.warm_up()  # as a direct frontend before it accepts
            self._loop = asyncio.get_running_loop()
            self.router = router

    def close(self) -> None:
        """The pool's streams ended and the router closed, on its loop (from the thread that stops the service)."""
        loop, router = self._loop, self.router
        if loop is None or router is None or loop.is_closed():
            self._pool.stop()
            return

        async def close_on_loop() -> None:
            self._pool.stop()
            await self._pool.close()
            await router.close()

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:  # on the serving loop itself: nothing may wait for it
            loop.create_task(close_on_loop())
            return
        try:
            asyncio.run_coroutine_threadsafe(close_on_loop(), loop).result(ROUTER_CLOSE_S)
        except Exception as exc:  # noqa: BLE001 - the loop stopped meanwhile, or the close hung: the stop goes on
            logger.warning("fleet router: close on the serving loop did not finish (%s)", type(exc).__name__)
        self.router = None
