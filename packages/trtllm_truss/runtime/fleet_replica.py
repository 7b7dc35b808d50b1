"""One replica of a fleet: this truss's stack (tritonserver, supervised) and its Dynamo worker, one process.

`python -m trtllm_truss.runtime.fleet_replica` reads a `ReplicaSettings` (JSON) on stdin. It

- binds a ZMQ PULL socket and names it to its tritonserver (TRTLLM_TRUSS_KV_EVENTS_ENDPOINT), whose engine
  relays its KV cache events there (`runtime.kv_event_relay`), when the router uses events;
- starts the stack (`runtime.stack.start_stack`: config, plan, artifacts, repository, tritonserver and its
  supervisor, which restarts it), on the GPUs its launcher gave it (CUDA_VISIBLE_DEVICES);
- joins the fleet as a Dynamo worker (`dynamo.runtime.DistributedRuntime` with the fleet's discovery, TCP
  request plane, ZMQ event plane): an endpoint `<namespace>.replica.generate` whose instances are the
  replicas; its handler answers who the replica is (its Triton gRPC address: the fronts stream from
  Triton directly), the model registered with `kv_cache_block_size` = the engine's tokens_per_block (no
  OpenAI surface of Dynamo's own: our fronts serve the dialects), and a `KvEventPublisher` fed with the
  engine's events converted as Dynamo's own TensorRT-LLM worker converts them (`runtime.fleet_events`);
- leaves the fleet while tritonserver is not ready (its instance unregistered at once, not after
  discovery's lease runs out) and tells the router its cached blocks are gone; joins again once ready;
- stops on SIGTERM / SIGINT, or when its launcher dies (parent-death signal): leaves the fleet, shuts
  Dynamo's runtime down, stops the stack. Nothing of it outlives it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_truss.runtime.fleet_events import LiveBlocks
from trtllm_truss.runtime.kv_event_relay import KV_EVENTS_ENDPOINT_ENV

logger = logging.getLogger("trtllm_truss.fleet.replica")

ENDPOINT = "replica.generate"  # component.endpoint under the fleet's namespace
HEALTH_INTERVAL_S = 0.25


@dataclass(frozen=True)
class ReplicaSettings:
    truss_dir: str
    index: int
    namespace: str
    discovery: str  # file | etcd | kubernetes (Dynamo's discovery backend)
    kv_events: bool
    block_size: int
    advertise_host: str = "127.0.0.1"  # how fronts reach this replica's Triton gRPC
    startup_timeout_s: float | None = None
    launcher_pid: int = 0
    ports: tuple[int, int, int] | None = None  # Triton's HTTP, gRPC, metrics ports (None: free ones)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ReplicaSettings:
        data = json.loads(text)
        if data.get("ports") is not None:
            data["ports"] = tuple(data["ports"])
        return cls(**data)


def endpoint_path(namespace: str) -> str:
    return f"{namespace}.{ENDPOINT}"


def _die_with_launcher() -> None:
    """SIGTERM (a clean stop) when the launcher dies, whatever killed it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ReplicaWorker:
    """The Dynamo side of the replica, on this process's event loop."""

    def __init__(self, settings: ReplicaSettings, stack: Any, events_socket: Any) -> None:
        self.settings = settings
        self.stack = stack
        self.events_socket = events_socket  # zmq.asyncio PULL, or None without events
        self.blocks = LiveBlocks(settings.block_size)
        self.stop_requested = asyncio.Event()
        self.registered = False
        self.runtime: Any = None
        self.endpoint: Any = None
        self.publisher: Any = None

    @property
    def grpc_url(self) -> str:
        port = self.stack.server.grpc_url.rsplit(":", 1)[1]
        return f"{self.settings.advertise_host}:{port}"

    async def handle(self, request: Any, context: Any = None):
        """The endpoint: who this replica is (the fronts cache it per instance). `instance`: its Dynamo
        instance id, what the fronts name it by (the `x-replica` response header; Dynamo's own `worker_id`)."""
        yield {"grpc_url": self.grpc_url, "replica": self.settings.index, "instance": self.endpoint.connection_id(),
               "pid": os.getpid()}

    async def run(self) -> None:
        from dynamo.llm import KvEventPublisher, ModelInput, ModelType, WorkerType, register_model
        from dynamo.runtime import DistributedRuntime

        loop = asyncio.get_running_loop()
        self.runtime = DistributedRuntime(loop, self.settings.discovery, "tcp", event_plane="zmq")
        self.endpoint = self.runtime.endpoint(endpoint_path(self.settings.namespace))
        plan = self.stack.plan
        await register_model(
            ModelInput.Tokens, ModelType.Empty, self.endpoint, str(plan.tokenizer_dir),
            f"{self.settings.namespace}-replica", worker_type=WorkerType.Aggregated,
            kv_cache_block_size=self.settings.block_size,
        )
        if self.settings.kv_events:
            # The local indexer lets a router that starts later ask this worker for what it holds.
            self.publisher = KvEventPublisher(self.endpoint, kv_block_size=self.settings.block_size,
                                              enable_local_indexer=True)
        serving = asyncio.ensure_future(self.endpoint.serve_endpoint(self.handle, graceful_shutdown=False))
        self.registered = True
        logger.info("replica %d in the fleet (Dynamo instance %d): Triton gRPC %s, metrics %s", self.settings.index,
                    self.endpoint.connection_id(), self.grpc_url, self.stack.server.metrics_url)
        tasks = [asyncio.ensure_future(self._watch_health())]
        if self.events_socket is not None and self.publisher is not None:
            tasks.append(asyncio.ensure_future(self._pump_events()))
        try:
            await self.stop_requested.wait()
        finally:
            for task in tasks:
                task.cancel()
            await self._leave()
            if self.publisher is not None:
                self.publisher.shutdown()
            self.runtime.shutdown()
            serving.cancel()

    def _publish(self, events: list[dict]) -> None:
        if events and self.publisher is not None:
            self.publisher.publish_batch(events)

    async def _pump_events(self) -> None:
        while True:
            raw = await self.events_socket.recv()
            try:
                batch = json.loads(raw)
            except ValueError:
                logger.warning("a KV event batch that is not JSON was dropped")
                continue
            out: list[dict] = []
            for event in batch:
                data = event.get("data", event)
                if data.get("type") == "created" and self.blocks.created:  # a new engine: its cache is empty
                    gone = self.blocks.forget_all()
                    out += [gone] if gone else []
                out += self.blocks.convert([event])
            self._publish(out)

    async def _leave(self) -> None:
        if self.registered:
            self.registered = False
            try:
                await self.endpoint.unregister_endpoint_instance()
            except Exception as exc:  # noqa: BLE001 - leaving is best effort; discovery's lease ends it anyway
                logger.warning("replica %d: unregistering failed: %s", self.settings.index, exc)
        gone = self.blocks.forget_all()
        if gone:
            self._publish([gone])

    async def _watch_health(self) -> None:
        server = self.stack.server
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            if server.failed is not None:
                logger.error("replica %d: tritonserver could not be restarted; leaving", self.settings.index)
                self.stop_requested.set()
                return
            ready = server.alive and await asyncio.to_thread(server.ready)
            if not ready and self.registered:
                logger.warning("replica %d: tritonserver not ready; out of the fleet until it is", self.settings.index)
                await self._leave()
            elif ready and not self.registered:
                await self.endpoint.register_endpoint_instance()
                self.registered = True
                logger.info("replica %d: back in the fleet", self.settings.index)


def _bind_events_socket() -> tuple[Any, str]:
    import zmq
    import zmq.asyncio

    context = zmq.asyncio.Context.instance()
    sock = context.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    return sock, sock.getsockopt(zmq.LAST_ENDPOINT).decode()


def serve(settings: ReplicaSettings) -> int:
    import uvloop

    from trtllm_truss.runtime.stack import start_stack

    _die_with_launcher()
    events_socket = None
    if settings.kv_events:
        events_socket, address = _bind_events_socket()
        os.environ[KV_EVENTS_ENDPOINT_ENV] = address  # tritonserver and its stubs inherit it
    stopping = {"now": False}

    def stop(*_: Any) -> None:
        stopping["now"] = True
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    stack = None
    try:
        from trtllm_truss.runtime.launch import TritonPorts

        ports = TritonPorts(*settings.ports) if settings.ports else None
        stack = start_stack(Path(settings.truss_dir), ports=ports, startup_timeout_s=settings.startup_timeout_s)
        for s, handler in previous.items():  # from here the worker's loop handles the stop signals
            signal.signal(s, handler)
        worker = ReplicaWorker(settings, stack, events_socket)

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for s in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(s, worker.stop_requested.set)
            await worker.run()

        uvloop.run(main())
        failed = stack.server.failed is not None
        return 2 if failed else 0
    except KeyboardInterrupt:
        return 0 if stopping["now"] else 130
    finally:
        if stack is not None:
            stack.stop()
        if events_socket is not None:
            events_socket.close(0)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[fleet replica %(process)d] %(levelname)s %(message)s",
                        stream=sys.stderr)
    settings = ReplicaSettings.from_json(sys.stdin.read())
    sys.exit(serve(settings))


if __name__ == "__main__":
    main()
