"""Which replica of the fleet takes an engine request: NVIDIA Dynamo's router decides, we stream.

A front process (one of the direct front's N) that serves a fleet holds one `FleetRouter` on its event
loop: a Dynamo `DistributedRuntime` with the fleet's discovery, a client of the replicas' endpoint
(`runtime.fleet_replica`: one instance per replica) and, for router modes kv and approximate, Dynamo's
`KvRouter` over that endpoint (fed by the replicas' KV events, or without events:
`KvRouterConfig(use_kv_events=False)`). For each engine request, after the prompt is tokenized:

- kv / approximate: `KvRouter.best_worker(token_ids, request_id=...)` picks the replica (the router
  records the request as active there); `mark_prefill_complete` at its first response and `free` at its
  end keep the router's load view right (what `KvRouter.generate` does for requests it streams itself);
- round_robin: the endpoint client's own `round_robin` picks it (a describe call to that replica).

The stream itself goes from this process to the chosen replica's Triton gRPC (`engine.EngineClient`), as
with one replica: every dialect, parser, guide, LoRA, cancellation and usage works as it does there. A
replica's Triton address comes from its instance once (a describe call through Dynamo's request plane,
cached per instance id). The replica that takes a request is named by its Dynamo instance id (the id
Dynamo's router returns, and the one the replica's describe answer gives for round robin), which the
front sends back in the `x-replica` response header. The tokens the router hashes are the engine's prompt ids, in blocks of the
engine's tokens_per_block, so its view matches the events' blocks.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from trtllm_truss.engine.client import UpstreamError

logger = logging.getLogger(__name__)

ENDPOINT = "replica.generate"  # runtime.fleet_replica.ENDPOINT (streaming never imports runtime's process code)
DESCRIBE = {"op": "describe"}
NO_REPLICA_WAIT_S = 5.0  # how long a request waits for a first replica before its 503
SUSPECT_S = 30.0  # how long a replica that failed a request is avoided while discovery still lists it


class NoReplica(UpstreamError):
    """No replica of the fleet can take the request now (HTTP 503)."""


@dataclass(frozen=True)
class FleetFrontSettings:
    """What a front process needs to reach the fleet (picklable: it travels to the direct front's processes)."""

    namespace: str
    discovery: str
    router_mode: str  # kv | approximate | round_robin
    block_size: int
    router_temperature: float = 0.0
    overlap_score_credit: float = 1.0  # KvRouterConfig's names and defaults (Dynamo 1.6.1), as config.fleet's
    prefill_load_scale: float = 1.0
    approximate_ttl_s: float = 120.0
    environment: tuple[tuple[str, str], ...] = ()  # Dynamo's discovery variables (DYN_FILE_KV, ETCD_ENDPOINTS)


class Route:
    """One engine request's replica, and what the router is told of its lifecycle."""

    def __init__(self, router: FleetRouter, engine: Any, worker_id: int | None, request_id: str | None) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.replica: str | None = None if worker_id is None else str(worker_id)  # its Dynamo instance id
        self._router = router
        self._request_id = request_id
        self._prefilled = False
        self._done = False

    async def first_response(self) -> None:
        if self._prefilled or self._request_id is None:
            return
        self._prefilled = True
        await self._router.call_router("mark_prefill_complete", self._request_id)

    async def done(self) -> None:
        if self._done or self._request_id is None:
            return
        self._done = True
        await self._router.call_router("free", self._request_id)

    async def follow(self, responses: Any) -> Any:
        """`responses` (the engine's stream) passed through, the router told of its first and last."""
        try:
            async with aclosing(responses):
                async for item in responses:
                    await self.first_response()
                    yield item
        finally:
            await self.done()


class FleetRouter:
    def __init__(self, settings: FleetFrontSettings, engine_model: str) -> None:
        self.settings = settings
        self.engine_model = engine_model
        self.runtime: Any = None
        self.client: Any = None
        self.kv_router: Any = None
        self.kv_router_config: Any = None  # the KvRouterConfig the router was built with
        self._engines_by_url: dict[str, Any] = {}
        self._urls_by_worker: dict[int, tuple[str, str | None]] = {}  # instance id -> (Triton gRPC, its name)
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid()}-"
        self.routed: dict[int, int] = {}  # worker id -> requests routed there (for logs and tests)
        self._failed: dict[int, float] = {}  # worker id -> when a request failed on it

    async def start(self) -> None:
        for name, value in self.settings.environment:
            os.environ[name] = value  # read by Dynamo when it loads (DYN_LOG) and when its runtime starts its discovery
        from dynamo.llm import KvRouter, KvRouterConfig
        from dynamo.runtime import DistributedRuntime

        loop = asyncio.get_running_loop()
        self.runtime = DistributedRuntime(loop, self.settings.discovery, "tcp", event_plane="zmq")
        endpoint = self.runtime.endpoint(f"{self.settings.namespace}.{ENDPOINT}")
        self.client = await endpoint.client()
        mode = self.settings.router_mode
        if mode in ("kv", "approximate"):
            config = self.kv_router_config = KvRouterConfig(
                router_temperature=self.settings.router_temperature,
                overlap_score_credit=self.settings.overlap_score_credit,
                prefill_load_scale=self.settings.prefill_load_scale,
                use_kv_events=mode == "kv",
                router_ttl_secs=self.settings.approximate_ttl_s,
            )
            self.kv_router = KvRouter(endpoint, self.settings.block_size, config)
        logger.info("fleet router: Dynamo %s router over %s.%s (%s discovery), KV block size %d", mode,
                    self.settings.namespace, ENDPOINT, self.settings.discovery, self.settings.block_size)

    def replicas(self) -> list[int]:
        return list(self.client.instance_ids()) if self.client is not None else []

    async def _wait_for_replica(self) -> None:
        if self.replicas():
            return
        try:
            await asyncio.wait_for(self.client.wait_for_instances(), NO_REPLICA_WAIT_S)
        except asyncio.TimeoutError:
            raise NoReplica("no replica of the fleet is ready; try again shortly") from None

    async def _describe(self, worker_id: int | None) -> tuple[str, str | None]:
        """The Triton gRPC address and the name (Dynamo instance id) of `worker_id` (round robin: of the
        replica Dynamo's client picks)."""
        if worker_id is not None and worker_id in self._urls_by_worker:
            return self._urls_by_worker[worker_id]
        try:
            if worker_id is None:
                stream = await self.client.round_robin(DESCRIBE)
            else:
                stream = await self.client.direct(DESCRIBE, worker_id)
            answer = None
            async for item in stream:
                answer = item.data() if hasattr(item, "data") else item
        except Exception as exc:  # noqa: BLE001 - Dynamo's errors: the replica is gone or going
            raise NoReplica(f"the chosen replica did not answer ({type(exc).__name__}: {exc})") from None
        if not isinstance(answer, dict) or "grpc_url" not in answer:
            raise NoReplica("the chosen replica did not say where its engine is")
        instance = answer.get("instance")
        found = answer["grpc_url"], None if instance is None else str(instance)
        if worker_id is not None:
            self._urls_by_worker[worker_id] = found
        return found

    def _engine(self, url: str) -> Any:
        engine = self._engines_by_url.get(url)
        if engine is None:
            from trtllm_truss.engine.engine_client import EngineClient

            engine = self._engines_by_url[url] = EngineClient(url, model_name=self.engine_model)
        return engine

    def _suspects(self) -> set[int]:
        """Replicas whose engine or worker failed a request lately and that discovery still lists."""
        now = time.monotonic()
        live = set(self.replicas())
        self._failed = {w: t for w, t in self._failed.items() if w in live and now - t < SUSPECT_S}
        return set(self._failed)

    def _failed_on(self, route: Route) -> None:
        if route.worker_id is not None:
            self._failed[route.worker_id] = time.monotonic()
            self._urls_by_worker.pop(route.worker_id, None)

    async def route(self, token_ids: list[int]) -> Route:
        """By the prompt's tokens alone: TensorRT-LLM's events do not name a block's LoRA adapter (its
        serializer leaves `lora_id` out), so hashing the adapter in would match no event. A replica that
        failed a request moments ago and that discovery has not dropped yet is avoided: Dynamo's own load
        figures (`get_potential_loads`) pick among the others."""
        await self._wait_for_replica()
        avoid = self._suspects()
        if self.kv_router is None:
            return await self._round_robin(avoid)
        request_id = f"{self._prefix}{next(self._ids)}"
        try:
            worker_id, _dp_rank, _overlap = await self.kv_router.best_worker(
                token_ids, request_id=request_id, update_indexer=self.settings.router_mode == "approximate",
            )
        except Exception as exc:  # noqa: BLE001 - "no endpoints available": every replica left meanwhile
            raise NoReplica(f"the fleet's router found no replica ({exc})") from None
        route = Route(self, None, worker_id, request_id)
        if worker_id in avoid:
            await route.done()
            loads = await self.kv_router.get_potential_loads(token_ids)
            others = [row for row in loads if row["worker_id"] not in avoid]
            if not others:
                raise NoReplica("no replica of the fleet is ready; try again shortly")
            best = min(others, key=lambda row: (row["potential_prefill_tokens"], row["potential_decode_blocks"]))
            route = Route(self, None, best["worker_id"], None)
        self.routed[route.worker_id] = self.routed.get(route.worker_id, 0) + 1
        try:
            route.engine = self._engine((await self._describe(route.worker_id))[0])
        except BaseException:
            self._failed_on(route)
            await route.done()
            raise
        return route

    async def _round_robin(self, avoid: set[int]) -> Route:
        """Dynamo's client picks the next replica; one that does not answer is passed over (up to one turn)."""
        failure: Exception | None = None
        for _ in range(max(1, len(self.replicas()))):
            try:
                url, name = await self._describe(None)
                route = Route(self, self._engine(url), None, None)
                route.replica = name
                return route
            except NoReplica as exc:
                failure = exc
        raise failure or NoReplica("no replica of the fleet is ready; try again shortly")

    async def stream(self, token_ids: list[int], generate_on: Callable[[Any], Any],
                     on_replica: Callable[[str], None] | None = None) -> Any:
        """`generate_on(engine)`'s responses from the replica the router picks. A replica that fails before
        its first response (gone, or going: its gRPC is down) is avoided and the request routed once more;
        after a first response, its failure is the client's (the stream ends with the error). `on_replica`
        is told each route's replica before its stream starts (the last one told is the one that served)."""
        for attempt in (1, 2):
            route = await self.route(token_ids)
            if on_replica is not None and route.replica is not None:
                on_replica(route.replica)
            started = False
            try:
                async with aclosing(route.follow(generate_on(route.engine))) as responses:
                    async for item in responses:
                        started = True
                        yield item
                return
            except UpstreamError as exc:
                if started or attempt == 2 or getattr(exc, "status", 503) != 503:
                    raise
                self._failed_on(route)
                logger.warning("fleet: replica %s failed before answering (%s); routing the request again",
                               route.worker_id, exc)

    async def call_router(self, method: str, request_id: str) -> None:
        try:
            await getattr(self.kv_router, method)(request_id)
        except Exception as exc:  # noqa: BLE001 - bookkeeping: a failure must not fail the request
            logger.debug("fleet router: %s(%s) failed: %s", method, request_id, exc)

    async def close(self) -> None:
        for engine in self._engines_by_url.values():
            await engine.close()
        self._engines_by_url.clear()
        if self.runtime is not None:
            self.runtime.shutdown()
            self.runtime = None


class _EachRequestsEngine:
    """A fleet front's pool has no engine of its own: each request's is the one its route names."""

    async def interface(self) -> None:
        return None

    async def close(self) -> None:
        return None


def check_routable(pool: Any) -> Any:
    """The pool's in-process model, where Dynamo's router can pick its requests' replicas (else RuntimeError)."""
    model = getattr(pool, "_model", None)
    if model is None:
        raise RuntimeError("a fleet's front streams on its own event loop: runtime.direct_front.stream_worker_processes"
                           " must be false")
    if model.ensemble is not None:
        raise RuntimeError("runtime.detokenize_in: postprocessing is not served by a fleet (the router needs the"
                           " prompt's token ids); use the default, worker")
    return model


async def attach_router(pool: Any, settings: FleetFrontSettings) -> FleetRouter:
    """Make an in-process pool (`streaming.in_process.InProcessPool`) stream each request from the replica
    Dynamo's router picks."""
    model = check_routable(pool)
    router = FleetRouter(settings, model.settings.engine_model)
    await router.start()
    await model.engine.close()
    model.engine = _EachRequestsEngine()
    model.router = router
    return router
