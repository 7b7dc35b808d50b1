"""Engine health that sees a hung engine: a one-token generation sent straight to the engine model.

Triton's model-ready flag stays true when the engine has stopped producing tokens (a wedged
executor, a stuck NCCL collective, a python stub that no longer answers). `EngineProbe` sends a
cheap generation (one prompt token, `request_output_len` 1) to the engine model over Triton gRPC on
an interval, each with a timeout, and reports unhealthy when one is not answered in time. A hung
engine therefore reads unhealthy within `interval_s + timeout_s` of hanging.

The probe runs on its own thread with its own event loop, so it works the same under truss's event
loop, in a stream worker or in a plain script; `healthy` and `last_error` are safe to read from any
thread. The request is NVIDIA's `tensorrt_llm` interface: `input_ids`, `input_lengths`,
`request_output_len`, `streaming`, which every backend's engine model takes (NVIDIA's C++ backend, our
llmapi model and the stand-in).
The engine models are decoupled, so the probe uses the bidirectional stream (ModelInfer refuses
decoupled models). Under full load the probe waits its turn like any request: choose `timeout_s`
above the worst first-token latency you accept.

While unhealthy it probes every `RETRY_S` (or `interval_s` if shorter), on a channel that reconnects within
a second: a restarted tritonserver reads healthy within about a second of serving again, not up to a whole
interval later (a probe that failed during a 4 s restart kept readiness at 503 for up to 10 s more with the
default 10 s interval).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from trtllm_truss.config.enums import DetokenizeIn
from trtllm_truss.engine.stream_end import read_to_end
from trtllm_truss.repository.models import ENGINE, WINDOW_RELAY

logger = logging.getLogger(__name__)

_probe_ids = itertools.count(1)
RETRY_S = 0.5


class EngineProbe:
    """Probe `model_name` at `grpc_url` (host:port) every `interval_s`, each probe bounded by `timeout_s`."""

    def __init__(
        self,
        grpc_url: str,
        interval_s: float = 10.0,
        timeout_s: float = 5.0,
        *,
        model_name: str = ENGINE,
        probe_token_id: int = 1,
    ):
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be positive")
        self.grpc_url = grpc_url
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.model_name = model_name
        self.probe_token_id = int(probe_token_id)
        self._lock = threading.Lock()
        self._healthy = False  # unproven until the first probe is answered
        self._last_error: str | None = "no probe has completed yet"
        self._last_success_monotonic: float | None = None
        self._probes = 0
        self._failures = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    # --- state, readable from any thread ---------------------------------------------------------

    @property
    def healthy(self) -> bool:
        with self._lock:
            return self._healthy

    @property
    def last_error(self) -> str | None:
        with self._lock:
            return self._last_error

    @property
    def last_success_age_s(self) -> float | None:
        with self._lock:
            stamp = self._last_success_monotonic
        return None if stamp is None else time.monotonic() - stamp

    @property
    def probe_count(self) -> int:
        with self._lock:
            return self._probes

    @property
    def failure_count(self) -> int:
        with self._lock:
            return self._failures

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("EngineProbe already started")
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            self._stop = asyncio.Event()
            ready.set()
            try:
                loop.run_until_complete(self._run())
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="engine-probe", daemon=True)
        self._thread.start()
        ready.wait()

    def stop(self, timeout_s: float | None = None) -> None:
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None or loop is None or stop is None:
            return
        try:
            loop.call_soon_threadsafe(stop.set)
        except RuntimeError:  # loop already closed
            pass
        thread.join(timeout_s if timeout_s is not None else self.timeout_s + 5.0)
        self._thread = None

    def __enter__(self) -> EngineProbe:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- the probe ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        from tritonclient.grpc.aio import InferenceServerClient

        from trtllm_truss.engine.client import CHANNEL_ARGS

        assert self._stop is not None
        client = InferenceServerClient(self.grpc_url, channel_args=CHANNEL_ARGS)
        try:
            while not self._stop.is_set():
                await self._probe_once(client)
                wait_s = self.interval_s if self.healthy else min(self.interval_s, RETRY_S)
                try:
                    await asyncio.wait_for(self._stop.wait(), timeout=wait_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            try:
                await client.close()
            except Exception:  # noqa: BLE001 - closing a broken channel must not mask the stop
                pass

    def _inputs(self) -> list:
        from tritonclient.grpc import InferInput

        def tensor(name: str, datatype: str, array: np.ndarray) -> InferInput:
            item = InferInput(name, list(array.shape), datatype)
            item.set_data_from_numpy(array)
            return item

        return [  # NVIDIA's tensorrt_llm model (inflight_batcher_llm), batch of one
            tensor("input_ids", "INT32", np.array([[self.probe_token_id]], dtype=np.int32)),
            tensor("input_lengths", "INT32", np.array([[1]], dtype=np.int32)),
            tensor("request_output_len", "INT32", np.array([[1]], dtype=np.int32)),
            tensor("streaming", "BOOL", np.array([[False]], dtype=bool)),
        ]

    async def _probe_once(self, client) -> None:
        request_id = f"trtllm-truss-health-{next(_probe_ids)}"
        started = time.monotonic()
        stream = None
        error: str | None = None
        try:
            inputs = self._inputs()

            async def requests():
                yield {"model_name": self.model_name, "inputs": inputs, "request_id": request_id}

            async def first_answer() -> None:
                nonlocal stream
                stream = client.stream_infer(inputs_iterator=requests())
                async for result, failure in stream:
                    if failure is not None:
                        raise RuntimeError(f"engine answered with an error: {failure}")
                    if result is not None:
                        return  # any response proves the engine generates
                raise RuntimeError("the stream closed without a response")

            await asyncio.wait_for(first_answer(), timeout=self.timeout_s)
            # Let Triton end the call: a cancel racing its end leaks the request, and with it the
            # engine model at shutdown (trtllm_truss.engine.stream_end).
            await read_to_end(stream)
        except asyncio.TimeoutError:
            error = f"{self.model_name} did not answer a one-token generation within {self.timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001 - every failure is an unhealthy reading, with its reason
            error = f"{self.model_name} probe failed: {type(exc).__name__}: {exc}"
        finally:
            if stream is not None:
                try:
                    stream.cancel()  # a no-op once the call has ended
                except Exception:  # noqa: BLE001
                    pass
        with self._lock:
            self._probes += 1
            if error is None:
                self._healthy = True
                self._last_error = None
                self._last_success_monotonic = time.monotonic()
            else:
                self._failures += 1
                was_healthy, self._healthy = self._healthy, False
                self._last_error = error
        if error is None:
            logger.debug("engine probe answered in %.3f s", time.monotonic() - started)
        elif was_healthy:
            logger.warning("engine unhealthy: %s", error)


def stack_probe(grpc_url: str, repository: Path, plan: Any) -> EngineProbe:
    """The probe of a served stack (`plan.runtime.health`), not started.

    It reaches the `tensorrt_llm_window` relay when our routes stream text through it
    (`runtime.detokenize_in: postprocessing` with the relay rendered): the relay forwards the probe to
    the engine, and a relay whose stub has died (python_backend's deadlock, docs/deploy.md) then reads
    unhealthy too, where a probe of the engine alone would still pass. Otherwise it reaches the engine.
    """
    health = plan.runtime.health
    through_relay = plan.runtime.detokenize_in == DetokenizeIn.POSTPROCESSING and (Path(repository) / WINDOW_RELAY).is_dir()
    return EngineProbe(grpc_url, health.interval_s, health.timeout_s, model_name=WINDOW_RELAY if through_relay else ENGINE)
