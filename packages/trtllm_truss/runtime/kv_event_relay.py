"""KV cache events out of tritonserver, to the replica's Dynamo worker (`runtime.fleet_replica`).

Runs inside Triton's python backend (the stand-in's `tensorrt_llm` model, the LLM-API host): a thread
drains the engine's events in TensorRT-LLM's own JSON shape (`LLM.get_kv_cache_events(timeout)`, or the
stand-in's `kv_events.drain(timeout_s)`, the same shape) and sends each batch, as JSON, on a ZMQ PUSH
socket connected to the address in TRTLLM_TRUSS_KV_EVENTS_ENDPOINT. Only when that variable is set (the
fleet sets it for its replicas' tritonservers); otherwise nothing starts and the engine's buffer is
drained by nobody (a bounded buffer: it drops its oldest).

The converting to Dynamo's events is the worker's (as Dynamo's own TensorRT-LLM worker converts them,
`dynamo/trtllm/publisher.py`), so this side stays a pipe: no Dynamo import in a Triton stub. PUSH, not PUB:
a batch sent before the worker's socket is up waits (up to SEND_HWM batches) instead of being dropped by a
subscription not yet made; past that, batches are dropped and counted, never blocking the engine.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

KV_EVENTS_ENDPOINT_ENV = "TRTLLM_TRUSS_KV_EVENTS_ENDPOINT"
DRAIN_TIMEOUT_S = 0.5  # how long one drain waits for a first event (also how soon close() is seen)
SEND_HWM = 10_000  # batches queued for a worker not reachable yet


class KvEventRelay:
    """A thread: `drain(timeout_s) -> list[dict]` in, JSON batches out on a PUSH socket to `endpoint`."""

    def __init__(self, drain: Callable[[float], list], endpoint: str, *, name: str = "kv-event-relay") -> None:
        import zmq

        self._drain = drain
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, SEND_HWM)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(endpoint)
        self.endpoint = endpoint
        self.sent = 0
        self.dropped = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> KvEventRelay:
        self._thread.start()
        return self

    def _loop(self) -> None:
        import zmq

        while not self._closed.is_set():
            try:
                events = self._drain(DRAIN_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - a failing drain must not end the relay (or the stub)
                log.exception("draining KV cache events failed")
                self._closed.wait(DRAIN_TIMEOUT_S)
                continue
            if not events:
                continue
            try:
                self._socket.send(json.dumps(list(events)).encode(), zmq.NOBLOCK)
                self.sent += len(events)
            except zmq.Again:
                self.dropped += len(events)
        self._socket.close(0)

    def close(self) -> None:
        self._closed.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * DRAIN_TIMEOUT_S)


def relay_from_environment(drain: Callable[[float], list] | None, *, name: str) -> KvEventRelay | None:
    """The relay when the fleet asked for one (TRTLLM_TRUSS_KV_EVENTS_ENDPOINT) and the engine gives events."""
    endpoint = os.environ.get(KV_EVENTS_ENDPOINT_ENV)
    if not endpoint:
        return None
    if drain is None:
        log.warning("%s is set but this engine gives no KV cache events; the fleet routes it without them",
                    KV_EVENTS_ENDPOINT_ENV)
        return None
    log.info("relaying KV cache events to %s", endpoint)
    return KvEventRelay(drain, endpoint, name=name).start()
