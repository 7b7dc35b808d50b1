"""What `model/model.py` delegates to: the deployment's lifecycle, and one method per route.

`LLMService.load()` starts the stack (config -> plan -> artifacts -> repository -> tritonserver) and
the stream workers, then hands them to the request core (`trtllm_truss.serving.core`). Each route is
a dialect module over that core (`serving.native`, `serving.chat`, `serving.completions`,
`serving.responses`, `serving.messages`); a new route is a new dialect module and a one-line method
here and in `model/model.py`.

With `model_metadata.trt_llm.fleet` set, `load()` starts the fleet's replicas instead of one stack
(`fronts.fleet_stack`, as `serve --replicas` does) and streams on truss's event loop, each request from the
replica NVIDIA Dynamo's router picks (`fronts.fleet_stack.LoopRouter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import Request

from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.serving import chat, completions, messages, native, responses
from trtllm_truss.serving.core import RequestCore, serving_metrics
from trtllm_truss.serving.replica_header import with_replica_header
from trtllm_truss.streaming.in_process import InProcessPool
from trtllm_truss.streaming.pool import Admission, StreamPool, default_worker_count

if TYPE_CHECKING:
    from trtllm_truss.planning.plan import ServingPlan

logger = logging.getLogger(__name__)


class LLMService:
    """Owns the Triton stack and the stream workers of one deployment."""

    def __init__(
        self,
        truss_dir: Path | str,
        secrets: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.truss_dir = Path(truss_dir)
        self._secrets = secrets
        self._environ = environ
        self._stack: Any = None
        self._pool: StreamPool | None = None
        self._engine_probe: Any = None
        self._guides: Any = None  # guides.compile_client.GuideService
        self._fleet: Any = None  # a fleet's fronts.fleet_stack.LoopRouter: Dynamo's router on truss's loop
        self._stop_signals_chained = False
        self._shutdown_lock = threading.Lock()
        self.core = RequestCore()
        serving_metrics()  # registered at construction, as before: /metrics lists them from the start

    # --- lifecycle -------------------------------------------------------------------------------

    def load(self, progress: Callable[[str], None] | None = None) -> None:
        """Blocking: configuration -> plan -> artifacts -> repository -> tritonserver ready -> workers ready.

        `progress` receives a short description of each stage as it starts.
        """
        from trtllm_truss.config.errors import install_log_redaction
        from trtllm_truss.runtime.stack import start_stack  # imported here: the heavy part of startup

        install_log_redaction()  # truss has configured logging by now: no secret value in its records
        native.quiet_aborted_streams()
        progress = progress or (lambda _: None)
        started = time.monotonic()
        from trtllm_truss.config import fleet_configured

        fleet = fleet_configured(self.truss_dir, self._environ, secrets=self._secrets)
        if fleet:
            from trtllm_truss.fronts.fleet_stack import start_fleet_stack

            # Started from a thread of the fleet's own: this one (truss's load thread) ends when load() returns.
            self._stack = start_fleet_stack(self.truss_dir, self._environ, secrets=self._secrets, watched=True,
                                            progress=progress)
        else:
            self._stack = start_stack(self.truss_dir, secrets=self._secrets, environ=self._environ, progress=progress)
        plan = self._stack.plan
        if self._stack.is_worker_node:  # its ranks are node 0's to start; this truss serves no requests
            group = self._stack.cluster.group
            self.core.unavailable = (
                f"node {group.node_rank} of {group.node_count} runs model ranks only; send requests to node 0"
                f" ({group.hosts[0]})"
            )
            return
        try:
            import os

            from trtllm_truss.engine.tokenizer import ensure_tokenizer_json
            from trtllm_truss.fronts.store_setup import open_deployment_store, store_url

            store_config = plan.runtime.store
            environ = os.environ if self._environ is None else self._environ
            self.core.store = open_deployment_store(store_config, store_url(store_config, self._secrets, environ))
            # truss's server routes only POST /v1/responses: a background response could never be polled.
            self.core.background_off = "truss's server cannot route GET /v1/responses/{id}: serve with the direct front"

            # A sentencepiece-only tokenizer is converted once here, not by every worker.
            ensure_tokenizer_json(plan.tokenizer_dir, trust_remote_code=plan.runtime.trust_remote_code)
            self._guides = guide_service(plan, self._environ)
            if self._guides is not None:
                progress("starting the guide compile service")
                self._guides.start(wait=False)  # warms up while the stream workers start
            progress("starting the stream workers" if not fleet else "loading the tokenizer (streams on this loop)")
            # A fleet streams on truss's event loop, where Dynamo's router lives (as a direct frontend of a fleet).
            self._pool = stream_pool(plan, self._stack.server.grpc_url, workers=0 if fleet else None)
            self._pool.start()
            if fleet:
                from trtllm_truss.fronts.fleet_stack import LoopRouter
                from trtllm_truss.streaming.fleet_router import check_routable

                check_routable(self._pool)
                self._fleet = LoopRouter(self._pool, self._stack.front_settings)
            checker = None
            if self._guides is not None:
                self._guides.wait_ready()
                checker = self._guides.client()
                register_guide_metrics(checker)
        except BaseException:
            if self._guides is not None:
                self._guides.stop()
            self._stack.stop()
            raise
        info = self._pool.info
        self.core.attach(
            self._pool,
            RequestLimits.from_plan(plan, vocab_size=info and info.vocab_size, max_token_bytes=info and info.max_token_bytes),
            checker,
        )
        if plan.runtime.health.enabled and not fleet:  # a fleet's replicas each watch their own stack
            from trtllm_truss.engine.health import stack_probe

            self._engine_probe = stack_probe(self._stack.server.grpc_url, self._stack.repository_dir, plan)
            self._engine_probe.start()
        # Everything loaded so far lives as long as the process; left to the collector, each full
        # collection walks all of it with the event loop stopped. Frozen, it is never walked again.
        gc.freeze()
        logger.info(
            "stack ready in %.1f s (backend %s, %d stream workers)",
            time.monotonic() - started,
            plan.backend,
            len(getattr(self._pool, "pids", ())),
        )

    def shutdown(self) -> None:
        """Stop everything load() started; idempotent, from any thread (see stop_signals)."""
        with self._shutdown_lock:
            # Every gRPC client first: tritonserver waits for open streams before it can stop.
            if self._engine_probe is not None:
                self._engine_probe.stop()
            if self._fleet is not None:
                self._fleet.close()  # the streams on truss's loop ended there, then Dynamo's router closed
                self._fleet = None
            elif self._pool is not None:
                self._pool.stop()
            if self._guides is not None:
                self._guides.stop()
            if self._stack is not None:
                self._stack.stop()

    async def is_healthy(self) -> bool:
        """tritonserver alive with its models ready, a stream worker running, and the engine answering
        its probe (a hung engine reads unhealthy within runtime.health's interval + timeout)."""
        if not self._stop_signals_chained and self._pool is not None:
            # truss's first call on its event loop, i.e. its main thread (stop_signals says why)
            from trtllm_truss.runtime.stop_signals import chain_stop_handlers

            self._stop_signals_chained = chain_stop_handlers(self.shutdown)
        if self._stack is not None and self._stack.is_worker_node:
            return True  # prepared; the world's health is node 0's to report
        if self._stack is None or self._pool is None or not self._stack.server.alive or not self._pool.alive():
            return False
        if self._fleet is not None:
            await self._fleet.ready()  # Dynamo's router on this loop, before the first request needs it
        if self.core.availability.refusing():  # requests refused for an unavailable engine (serving.availability)
            return False
        # Triton's own readiness of the models (a restarted tritonserver is alive before it is ready);
        # a blocking loopback HTTP call, so off the event loop.
        if not await asyncio.to_thread(self._stack.server.ready):
            return False
        probe = self._engine_probe
        if probe is not None and not probe.healthy:
            if probe.last_error:
                logger.warning("engine probe: %s", probe.last_error)
            return False
        return True

    @property
    def limits(self) -> RequestLimits:
        return self.core.limits

    # --- routes: one dialect module each ---------------------------------------------------------

    async def _serve(self, handle: Callable[..., Any], request: Any, http_request: Request | None) -> Any:
        if self._fleet is None:
            return await handle(self.core, request, http_request)
        await self._fleet.ready()  # a request may come before truss's first readiness check
        return with_replica_header(await handle(self.core, request, http_request), http_request)

    async def predict(self, request: Any, http_request: Request | None = None) -> Any:
        return await self._serve(native.predict, request, http_request)

    async def chat_completions(self, request: Any, http_request: Request | None = None) -> Any:
        return await self._serve(chat.chat_completions, request, http_request)

    async def completions(self, request: Any, http_request: Request | None = None) -> Any:
        return await self._serve(completions.completions, request, http_request)

    async def responses(self, request: Any, http_request: Request | None = None) -> Any:
        return await self._serve(responses.responses, request, http_request)

    async def messages(self, request: Any, http_request: Request | None = None) -> Any:
        return await self._serve(messages.messages, request, http_request)


def max_in_flight(plan: ServingPlan) -> int:
    """Requests a replica admits at once: the engine's batch and runtime.max_queued_requests beyond it."""
    runtime = plan.runtime
    queued = runtime.max_queued_requests if runtime.max_queued_requests is not None else 2 * plan.max_batch_size
    return plan.max_batch_size + queued


def guide_service(plan: ServingPlan, environ: Mapping[str, str] | None = None, directory: str | None = None) -> Any:
    """The replica's guide compile service (`guides.compile_client.GuideService`, not started) as
    `plan.runtime.guides` configures it, over the model's tokenizer with the deployment's grammar engine; None
    where guided decoding is off (every guided request is a 400 before any check). `directory`: where its
    sockets live (None: a new temporary one, removed at stop)."""
    import os

    from trtllm_truss.guides.compile_client import GuideService
    from trtllm_truss.guides.compile_service import ServiceSettings

    engine = plan.guide_engine
    if engine is None:
        return None
    config = plan.runtime.guides
    settings = dict(engine=engine, tokenizer_dir=str(plan.tokenizer_dir), budget_s=config.compile_budget_s,
                    processes=config.compile_processes, cache_bytes=config.cache_bytes,
                    log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()))
    environ = os.environ if environ is None else environ
    if directory is None:
        return GuideService.in_temporary_directory(environ, **settings)
    return GuideService(ServiceSettings(directory=directory, **settings), environ)


def register_guide_metrics(checker: Any, registry: Any = None) -> Any:
    """The guide service's counts on `/metrics` (`serving.metrics.GuideCacheCollector`, on prometheus_client's
    default registry: truss's and the direct front's `/metrics`)."""
    from prometheus_client import REGISTRY

    from trtllm_truss.serving.core import SERVED_MODEL_NAME
    from trtllm_truss.serving.metrics import GuideCacheCollector

    global _GUIDE_COLLECTOR
    registry = REGISTRY if registry is None else registry
    if _GUIDE_COLLECTOR is not None:  # a service started again in this process replaces the last one's
        with contextlib.suppress(KeyError):
            registry.unregister(_GUIDE_COLLECTOR)
    _GUIDE_COLLECTOR = GuideCacheCollector(checker.stats, model_name=SERVED_MODEL_NAME)
    registry.register(_GUIDE_COLLECTOR)
    return _GUIDE_COLLECTOR


_GUIDE_COLLECTOR: Any = None


def stream_pool(
    plan: ServingPlan, grpc_url: str, *, workers: int | None = None, admission: Admission | None = None
) -> StreamPool | InProcessPool:
    """The stream workers `plan.runtime` asks for (or `workers`; 0: none, their work on this process's
    event loop), on the engine (or the text ensemble); `admission`: a bound shared with other processes
    (the direct front)."""
    import os

    from trtllm_truss.config.enums import DetokenizeIn
    from trtllm_truss.repository.models import ENGINE, ENSEMBLE
    from trtllm_truss.streaming.environment import worker_environment
    from trtllm_truss.streaming.generation import WorkerSettings, worker_lora_weights

    runtime = plan.runtime
    from trtllm_truss.config import ConfigError
    from trtllm_truss.parsers import setting_problems

    if problems := setting_problems(runtime.tool_call_parser, runtime.reasoning_parser):
        raise ConfigError(problems)
    settings = WorkerSettings(
        grpc_url=grpc_url,
        tokenizer_dir=str(plan.tokenizer_dir),
        max_input_len=plan.max_input_len,
        max_output_len=plan.max_output_len,
        engine_model=ENGINE,
        text_ensemble=ENSEMBLE if runtime.detokenize_in == DetokenizeIn.POSTPROCESSING else None,
        trust_remote_code=runtime.trust_remote_code,
        draft_stats=plan.backend == "tensorrtllm" and plan.speculative is not None,
        kv_block_tokens=plan.tokens_per_block if runtime.enable_kv_cache_reuse else 0,
        tool_call_parser=runtime.tool_call_parser,
        reasoning_parser=runtime.reasoning_parser, lora_weights=worker_lora_weights(plan.lora_adapters),
    )
    if workers == 0:
        return InProcessPool(
            settings, max_in_flight=max_in_flight(plan), chunk_rate=runtime.max_stream_chunks_per_s, admission=admission
        )
    return StreamPool(
        settings,
        workers=workers or runtime.stream_workers or default_worker_count(),
        max_in_flight=max_in_flight(plan),
        environment=worker_environment(os.environ),
        chunk_rate=runtime.max_stream_chunks_per_s,
        admission=admission,
    )
