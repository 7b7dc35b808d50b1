"""One process of the direct front: `python -m trtllm_truss.fronts.direct_app` (started by `fronts.direct`).

It reads its `FrontendSettings` (pickled) from stdin, starts its own stream workers on the replica's
tritonserver, and serves the routes below with uvicorn on the listening socket the launcher passed
(every frontend accepts from the same socket). The dialects and the request core are the same code as
under truss's server (`serving/`); what differs is only who reads the body and routes.

| route | what |
|---|---|
| `POST /v1/models/model:predict`, `POST /predict` | native (Baseten's trt_llm API) |
| `POST /v1/completions`, `/v1/chat/completions`, `/v1/responses`, `/v1/messages` | the dialects |
| `GET`, `DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`, `POST /v1/responses/{id}/cancel` | stored responses (`serving.stored_responses`) |
| `/v1/conversations...` (create, read, update, delete; items: list, add, read, delete) | conversations (`serving.conversations`) |
| `POST /v1/messages/count_tokens`, `/v1/responses/input_tokens` | a request's input tokens (serving.token_count) |
| `POST`, `GET /v1/files`, `GET`, `DELETE /v1/files/{id}`, `GET /v1/files/{id}/content`, `POST`, `GET /v1/batches`, `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`, `/v1/messages/batches...` | batches (`serving.batches`; run by frontend 0's `serving.batch_runner`) |
| `GET /v1/models` | OpenAI's model list: the served name and the LoRA adapters |
| `GET /v1/models/model`, `GET /health/ready` | readiness: 200 once tritonserver and this process's workers are up, else 503 |
| `GET /health/live` | liveness: 503 once tritonserver died for good (the container should be replaced) |
| `GET /metrics` | the serving metrics summed over every frontend (`fronts.replica_state`), and the replica's guide compile service's (`trtllm_guide_*`) |

With `runtime.direct_front.api_key_secret` set, every POST route and `GET /v1/models` need
`Authorization: Bearer <key>` (`/v1/messages` also takes Anthropic's `x-api-key`); a missing or wrong
key is a 401 in that route's error shape. The key is never logged.
"""

from __future__ import annotations

import contextlib
import ctypes
import hmac
import logging
import os
import pickle
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from trtllm_truss.api.body import read_json_body
from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.api.messages import error_response as anthropic_error
from trtllm_truss.fronts.accept import RECHECK_SIGNAL, ConnectionFiller
from trtllm_truss.serving import chat, completions, conversations, messages, native, responses, stored_responses
from trtllm_truss.serving.core import SERVED_MODEL_NAME, RequestCore, use_serving_metrics
from trtllm_truss.serving.replica_header import replica_header
from trtllm_truss.serving.metrics import ServingMetrics
from trtllm_truss.serving.native import native_error
from trtllm_truss.serving.openai_shared import openai_error

logger = logging.getLogger("trtllm_truss.direct_front")

GRACEFUL_SHUTDOWN_S = 5.0  # open responses end within it once the stream workers are gone
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class FrontendSettings:
    """What the launcher hands each frontend (over a pipe: the API key and secret values never reach an
    environment or a command line)."""

    index: int
    launcher_pid: int
    socket_fd: int
    state_path: str
    plan: Any  # planning.plan.ServingPlan
    grpc_url: str
    stream_workers: int
    api_key: str | None
    secret_values: frozenset[str]
    http: str
    loop: str
    fill_connections: int = 0  # fronts.accept; 0: the kernel spreads connections (uvicorn's own listener)
    log_level: str = "INFO"
    guides: Any = None  # guides.compile_service.ServiceSettings of the replica's guide compile service (None: off)
    store_url: str | None = None  # runtime.store's PostgreSQL connection string (a secret: over the pipe too)
    fleet: Any = None  # streaming.fleet_router.FleetFrontSettings: Dynamo's router picks each request's replica


def _json(result: Any) -> Response:
    if isinstance(result, Response):
        return result
    if isinstance(result, BaseModel):
        result = result.model_dump(mode="json", exclude_none=True)
    return JSONResponse(result)


ErrorRenderer = Callable[..., Response]
Handler = Callable[[RequestCore, Any, Request], Awaitable[Any]]


class DirectApp:
    """The routes of one frontend over its request core."""

    def __init__(self, core: RequestCore, is_ready: Callable[[], bool], is_live: Callable[[], bool],
                 api_key: str | None, batches: Any = None) -> None:
        self.core = core
        self.batches = batches  # serving.batches.BatchRoutes (None: no batch routes)
        self._is_ready = is_ready
        self._is_live = is_live
        self._api_key = api_key.encode() if api_key else None

    def _authorized(self, request: Request, anthropic: bool = False) -> bool:
        if self._api_key is None:
            return True
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._api_key):
            return True
        if anthropic:
            return hmac.compare_digest(request.headers.get("x-api-key", "").encode(), self._api_key)
        return False

    def route(self, handle: Handler, render_error: ErrorRenderer, anthropic: bool = False):
        core = self.core

        async def endpoint(request: Request) -> Response:
            if not self._authorized(request, anthropic):
                return _unauthorized(render_error)
            try:
                body = await read_json_body(request, max_bytes=core.limits.max_body_bytes)
            except Exception as exc:  # HTTPException: a 4xx of the body, or 503 while loading
                status = getattr(exc, "status_code", None)
                if status is None:
                    raise
                return render_error(status, str(exc.detail), None)
            response = _json(await handle(core, body, request))
            response.headers.update(replica_header(request))  # a fleet: the replica(s) that took it
            return response

        return endpoint

    def stored_route(self, handle: Callable[..., Awaitable[Any]], *params: str, body: bool = False):
        """A route over a stored object (`/v1/responses/{response_id}...`, `/v1/conversations/...`): the key
        checked, then `handle(core, *path params, [body,] request)`."""
        core = self.core

        async def endpoint(request: Request) -> Response:
            if not self._authorized(request):
                return _unauthorized(openai_error)
            args: list[Any] = [request.path_params[name] for name in params]
            if body:
                try:
                    args.append(await read_json_body(request, max_bytes=core.limits.max_body_bytes))
                except Exception as exc:  # HTTPException: a 4xx of the body, or 503 while loading
                    status = getattr(exc, "status_code", None)
                    if status is None:
                        raise
                    return openai_error(status, str(exc.detail), None)
            return _json(await handle(core, *args, request))

        return endpoint

    def stored_routes(self) -> list[Route]:
        """Stored responses and conversations (`serving.stored_responses`, `serving.conversations`)."""
        r, c, item = "response_id", "conversation_id", "item_id"
        routes = [
            ("GET", "/v1/responses/{response_id}", stored_responses.retrieve, (r,), False),
            ("DELETE", "/v1/responses/{response_id}", stored_responses.delete, (r,), False),
            ("GET", "/v1/responses/{response_id}/input_items", stored_responses.input_items, (r,), False),
            ("POST", "/v1/responses/{response_id}/cancel", stored_responses.cancel, (r,), False),
            ("POST", "/v1/conversations", conversations.create, (), True),
            ("GET", "/v1/conversations/{conversation_id}", conversations.retrieve, (c,), False),
            ("POST", "/v1/conversations/{conversation_id}", conversations.update, (c,), True),
            ("DELETE", "/v1/conversations/{conversation_id}", conversations.delete, (c,), False),
            ("GET", "/v1/conversations/{conversation_id}/items", conversations.list_items, (c,), False),
            ("POST", "/v1/conversations/{conversation_id}/items", conversations.add_items, (c,), True),
            ("GET", "/v1/conversations/{conversation_id}/items/{item_id}", conversations.retrieve_item, (c, item), False),
            ("DELETE", "/v1/conversations/{conversation_id}/items/{item_id}", conversations.delete_item, (c, item), False),
        ]
        return [Route(path, self.stored_route(handle, *params, body=body), methods=[method])
                for method, path, handle, params, body in routes]

    async def models(self, request: Request) -> Response:
        if not self._authorized(request):
            return _unauthorized(openai_error)
        limits = self.core.limits
        created = int(time.time())
        names = [limits.served_model_name or SERVED_MODEL_NAME] + [name for name, _ in limits.lora_task_ids]
        data = [{"id": name, "object": "model", "created": created, "owned_by": "trtllm-truss"} for name in names]
        return JSONResponse({"object": "list", "data": data})

    async def ready(self, request: Request) -> Response:
        return JSONResponse({}) if self._is_ready() else JSONResponse({"error": "not ready"}, status_code=503)

    async def live(self, request: Request) -> Response:
        return JSONResponse({}) if self._is_live() else JSONResponse({"error": "tritonserver is gone"}, status_code=503)

    async def metrics(self, request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    def starlette(self, lifespan: Callable[[Starlette], Any] | None = None) -> Starlette:
        native_route = self.route(native.predict, native_error)
        routes = [
            Route("/v1/models/model:predict", native_route, methods=["POST"]),
            Route("/predict", native_route, methods=["POST"]),
            Route("/v1/completions", self.route(completions.completions, openai_error), methods=["POST"]),
            Route("/v1/chat/completions", self.route(chat.chat_completions, openai_error), methods=["POST"]),
            Route("/v1/responses", self.route(responses.responses, openai_error), methods=["POST"]),
            *self.stored_routes(),
            Route("/v1/messages", self.route(messages.messages, anthropic_error, anthropic=True), methods=["POST"]),
            Route("/v1/messages/count_tokens", self.route(messages.count_tokens, anthropic_error, anthropic=True), methods=["POST"]),
            Route("/v1/responses/input_tokens", self.route(responses.input_tokens, openai_error), methods=["POST"]),
            *self._batch_routes(),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/model", self.ready, methods=["GET"]),
            Route("/health/ready", self.ready, methods=["GET"]),
            Route("/health/live", self.live, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ]
        return Starlette(routes=routes, lifespan=lifespan)


    def _batch_routes(self) -> list[Route]:
        """The batch routes, each behind the key check (Anthropic's also take `x-api-key`)."""
        if self.batches is None:
            return []
        routes = []
        for path, endpoint, method in self.batches.routes():
            anthropic = path.startswith("/v1/messages/")
            routes.append(Route(path, self._keyed(endpoint, anthropic_error if anthropic else openai_error, anthropic),
                                methods=[method]))
        return routes

    def _keyed(self, endpoint: Callable[[Request], Awaitable[Response]], render_error: ErrorRenderer,
               anthropic: bool) -> Callable[[Request], Awaitable[Response]]:
        async def keyed(request: Request) -> Response:
            if not self._authorized(request, anthropic):
                return _unauthorized(render_error)
            return await endpoint(request)

        return keyed


def _unauthorized(render_error: ErrorRenderer) -> Response:
    message = "a valid API key is required: send it as `Authorization: Bearer <key>`"
    headers = {"WWW-Authenticate": "Bearer"}
    if render_error is openai_error:
        return openai_error(401, message, headers, code="invalid_api_key")
    return render_error(401, message, headers)


# --- the process ------------------------------------------------------------------------------------


def _die_with_launcher(launcher_pid: int) -> None:
    """SIGTERM when the launcher dies without a word (trtllm-serve's frontend watchdog, in the kernel)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        logger.warning("cannot ask for a parent-death signal; this frontend outlives a killed launcher")
    if os.getppid() != launcher_pid:  # died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _configure_logging(settings: FrontendSettings) -> None:
    from trtllm_truss.config.errors import install_log_redaction, remember_secret_values

    logging.basicConfig(
        level=settings.log_level,
        format=f"%(asctime)s frontend {settings.index} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    remember_secret_values(settings.secret_values)
    install_log_redaction()
    native.quiet_aborted_streams()


def _unregister_process_collectors() -> None:
    """As truss's server: only what is summed over the processes is on /metrics (one process's CPU
    and GC would read as the replica's)."""
    from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, REGISTRY

    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        with contextlib.suppress(KeyError, ValueError):
            REGISTRY.unregister(collector)


def serve(settings: FrontendSettings) -> None:
    import uvicorn

    from trtllm_truss.fronts.replica_state import ReplicaState
    from trtllm_truss.fronts.service import register_guide_metrics, stream_pool

    _die_with_launcher(settings.launcher_pid)
    _configure_logging(settings)
    state = ReplicaState.open(Path(settings.state_path))
    _unregister_process_collectors()
    metrics = ServingMetrics(model_name=SERVED_MODEL_NAME, state=state.metrics_array(settings.index),
                             peers=state.all_metrics_arrays())
    metrics.reset_gauges()
    use_serving_metrics(metrics)

    plan = settings.plan
    pool = stream_pool(plan, settings.grpc_url, workers=settings.stream_workers,
                       admission=state.admission(settings.index))
    pool.start()
    info = pool.info
    checker = None
    if settings.guides is not None:
        from trtllm_truss.guides.compile_client import GuideServiceClient

        checker = GuideServiceClient(settings.guides)
        register_guide_metrics(checker)
    core = RequestCore()
    from trtllm_truss.fronts.store_setup import open_deployment_store

    core.store = open_deployment_store(plan.runtime.store, settings.store_url)
    core.availability = state.availability()  # a refusal in any frontend: every frontend's readiness 503
    core.attach(pool, RequestLimits.from_plan(
        plan, vocab_size=info and info.vocab_size, max_token_bytes=info and info.max_token_bytes), checker)

    from trtllm_truss.serving.batch_runner import BatchRunner
    from trtllm_truss.serving.batches import BatchRoutes

    batches = plan.runtime.batches
    # Frontend 0 runs the host's batches: it has a request core and stream workers of its own (the launcher
    # has neither), and one runner per host keeps the lines in flight within runtime.batches.max_in_flight.
    # Its share follows the host's interactive requests: every frontend's admitted ones less its lines' own.
    runner = None
    if core.store is not None and batches.enabled and settings.index == 0:
        runner = BatchRunner(core, batches, interactive_in_flight=lambda: state.admitted() - pool.background_streams)
    if core.store is not None and batches.enabled:
        from prometheus_client import REGISTRY

        from trtllm_truss.serving.batch_metrics import BatchCollector

        REGISTRY.register(BatchCollector(core.store, model_name=SERVED_MODEL_NAME))

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        router = None
        if settings.fleet is not None:
            from trtllm_truss.streaming.fleet_router import attach_router

            router = await attach_router(pool, settings.fleet)
        await pool.warm_up()  # before accepting: a frontend's first burst finds it built (streaming.generation)
        if runner is not None:
            runner.start()
        yield
        if runner is not None:
            await runner.stop()  # lines on the engine are not answered: they run again at the next start
        pool.stop()  # waits for the workers the exit signal killed
        await pool.close()
        if router is not None:
            await router.close()

    app = DirectApp(
        core,
        is_ready=lambda: state.stack_ready and pool.alive() and not core.availability.refusing(),
        is_live=lambda: not state.stack_failed,
        api_key=settings.api_key,
        batches=BatchRoutes(core.store, batches),
    ).starlette(lifespan)
    config = uvicorn.Config(
        app, http=settings.http, loop=settings.loop, lifespan="on", access_log=False, log_level="warning",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, timeout_keep_alive=30,
    )
    listener = socket.socket(fileno=settings.socket_fd)
    filler = None
    if settings.fill_connections > 0:
        filler = ConnectionFiller(listener, state, settings.index, settings.fill_connections)
        signal.signal(RECHECK_SIGNAL, signal.SIG_IGN)  # before the pid is published: peers signal it
    def on_exit() -> None:
        if runner is not None:
            runner.halt()  # first: a batch line cut off by the workers' stop must not be kept as answered
        pool.stop(wait=False)

    server = _Server(config, on_exit=on_exit, filler=filler)
    import gc

    gc.freeze()  # what is loaded lives as long as the process (as LLMService.load)
    state.frontend_started(settings.index, os.getpid())  # the launcher waits for this
    logger.info("serving (pid %d, %s stream workers, %s)", os.getpid(), settings.stream_workers or "no",
                f"filled up to {settings.fill_connections} connections" if filler else "connections spread by the kernel")
    server.run(sockets=[] if filler else [listener])


class _Server:
    """uvicorn's server whose exit signal first ends this frontend's open streams (with an error; its
    stream workers, if any, are killed), so the graceful shutdown does not wait for generations to finish.
    With a `ConnectionFiller`, it accepts through that instead of a listening server of its own."""

    def __new__(cls, config: Any, on_exit: Callable[[], None], filler: ConnectionFiller | None = None) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                if not self.should_exit:
                    on_exit()
                super().handle_exit(sig, frame)

            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets=sockets)
                if filler is not None and not self.should_exit:
                    protocol = filler.protocol_class(self.config.http_protocol_class)
                    filler.start(lambda: protocol(config=self.config, server_state=self.server_state,
                                                  app_state=self.lifespan.state))

            async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
                if filler is not None:
                    filler.stop()
                await super().shutdown(sockets=sockets)

        return Server(config)


def main() -> None:
    settings: FrontendSettings = pickle.load(sys.stdin.buffer)
    serve(settings)


if __name__ == "__main__":
    main()
