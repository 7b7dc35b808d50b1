"""The LLM-API double's executor, kept where TensorRT-LLM 1.x keeps its own: in a worker process behind IPC.

TensorRT-LLM's `LLM` does not run its engine in the caller's process. `GenerationExecutor.create` starts
worker process(es) (`executor/worker.py`: the PyExecutor and its loop thread) and talks to them through
`GenerationExecutorProxy` (`executor/proxy.py`): requests go out on one ZMQ IPC queue (`ipc.py`
`IpcQueue`), each worker iteration's responses come back on another as one message, and the proxy's
`dispatch_result_thread` hands them to each request's `GenerationResult`, waking the caller's event loop
once per message. This module is that shape for the double (docs/design.md, "The LLM-API double"):

| TensorRT-LLM 1.2.1 | here |
|---|---|
| `GenerationExecutorProxy` in the LLM's process (`proxy.py`) | `ExecutorProxy`: owns the two queues and the worker process |
| `request_queue` (IpcQueue, proxy -> worker) | a ZMQ PUSH -> PULL pair over `ipc://`, pickled messages |
| `result_queue` (IpcQueue, worker -> proxy), one message per iteration's responses | the same, the other way |
| `dispatch_result_thread` -> `GenerationResult.queue` (`_AsyncQueue.notify_many`: one wake-up per batch) | `ExecutorProxy._dispatch`, calling `on_batch` once per message |
| `dispatch_result_task` waits under `customized_gc_thresholds(garbage_collection_gen0_threshold)` (an LLM() argument, 20,000 by default): the process's gen-0 GC threshold is that while the thread waits, most of the time | the same, `gc_gen0_threshold` |
| the MPI worker (`worker.py` `worker_main`), PyExecutor loop thread | `python -m trtllm_truss.engine_standin.llmapi_executor`: the stand-in engine's thread |
| `PyExecutor._handle_responses` (stream_interval) + `await_response_thread` (batches an iteration's responses) | the worker's response thread, with `stream_interval.IntervalBuffer` per streamed request |
| a worker that dies: the proxy fails every pending result and the LLM refuses new requests | the same (`ExecutorDied`) |
| KV cache events: the worker's event manager, fetched by the proxy for `LLM.get_kv_cache_events` | the worker's engine's `kv_events`, sent on the result queue as they come (`("kv_events", [...])`), buffered in `ExecutorProxy.kv_events` |

pyzmq is imported when an executor starts (TensorRT-LLM depends on it; this package pins it where the
stand-in runs), so the module imports on every Python.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trtllm_truss.engine_standin.kv_events import KVEventBuffer
from trtllm_truss.engine_standin.types import FinishReason, GenerationOutput, GenerationRequest
from trtllm_truss.runtime.stub_watch import exit_with_parent

log = logging.getLogger("tensorrt_llm_llmapi.executor")

# How long the proxy waits for the worker's engine (a model load) before giving up.
START_TIMEOUT_S = float(os.environ.get("TRTLLM_TRUSS_DOUBLE_START_TIMEOUT_S", "600"))
POLL_MS = 100  # the dispatch thread notices a dead worker within this
DEFAULT_GC_GEN0_THRESHOLD = 20000  # TorchLlmArgs.garbage_collection_gen0_threshold's default (1.0.0-1.2.1)
_PYTHON_GC_THRESHOLDS = gc.get_threshold()
# One response on the result queue: (engine request id, new token ids, their log probs or None, their k most
# likely tokens or None, the FinishReason value once finished else None, the error or None, and on a request's
# first response after its prefill its prompt's KV blocks (total, reused from the cache), else None). Plain tuples:
# unpickling a dataclass per response cost the proxy's dispatch thread a fifth of its process at 100k/s.
Response = tuple
_SUBMIT, _CANCEL, _SHUTDOWN = "submit", "cancel", "shutdown"


class ExecutorDied(RuntimeError):
    """The worker process is gone: every request in flight failed, and no new one is taken."""


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


class ExecutorProxy:
    """The caller's side: submit and cancel go out as messages; each message of responses from the worker
    is handed to `on_batch(list[Response])` on the dispatch thread."""

    def __init__(
        self, parameters: Mapping[str, str], stream_interval: int, on_batch: Callable[[list], None], gc_gen0_threshold: int
    ) -> None:
        import zmq

        self._on_batch = on_batch
        self._gc_gen0_threshold = gc_gen0_threshold
        self._dir = tempfile.mkdtemp(prefix="trtllm-llmapi-double-")
        self._context = zmq.Context()
        self._requests = self._context.socket(zmq.PUSH)
        self._results = self._context.socket(zmq.PULL)
        for sock in (self._requests, self._results):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
        request_address = f"ipc://{self._dir}/requests"
        result_address = f"ipc://{self._dir}/results"
        self._requests.bind(request_address)
        self._results.bind(result_address)
        self._send_lock = threading.Lock()  # a ZMQ socket is used by one thread at a time
        self.error: str | None = None
        # The worker engine's KV cache events, kept for LLM.get_kv_cache_events (kv_cache_config.event_buffer_max_size).
        max_events = int(parameters.get("event_buffer_max_size") or 0)
        self.kv_events = KVEventBuffer(max_events, window_size=0)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH", "")) if p)
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, request_address, result_address, str(os.getpid())],
            stdin=subprocess.PIPE, env=env,
        )
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"parameters": dict(parameters), "stream_interval": stream_interval}).encode())
        self._process.stdin.close()
        self.info = self._wait_ready()
        self._stopping = False
        self._dispatcher = threading.Thread(target=self._dispatch, name="dispatch_result_thread", daemon=True)
        self._dispatcher.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def _wait_ready(self) -> dict[str, Any]:
        import zmq

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._results.poll(POLL_MS, zmq.POLLIN):
                kind, payload = pickle.loads(self._results.recv())
                if kind == "ready":
                    return payload
                self._close()
                raise RuntimeError(f"LLM-API double: the executor worker failed to start: {payload}")
            if self._process.poll() is not None:
                self._close()
                raise RuntimeError(f"LLM-API double: the executor worker exited with {self._process.returncode} while starting")
        self._close()
        raise RuntimeError(f"LLM-API double: the executor worker was not ready within {START_TIMEOUT_S:g} s")

    def _send(self, message: tuple) -> None:
        if self.error is not None:
            raise ExecutorDied(self.error)
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            self._requests.send(data)

    def submit(self, requests: list[tuple[GenerationRequest, bool]]) -> None:
        """(request, streaming) pairs, in one message."""
        self._send((_SUBMIT, requests))

    def cancel(self, request_id: str) -> None:
        if self.error is None:
            self._send((_CANCEL, request_id))

    def _dispatch(self) -> None:
        import zmq

        while not self._stopping:
            try:
                if self._gc_gen0_threshold:  # as TensorRT-LLM's dispatch_result_task, while it waits
                    gc.set_threshold(self._gc_gen0_threshold)
                try:
                    ready = self._results.poll(POLL_MS, zmq.POLLIN)
                finally:
                    if self._gc_gen0_threshold:
                        gc.set_threshold(*_PYTHON_GC_THRESHOLDS)
                if not ready:
                    if self._process.poll() is not None and not self._stopping:
                        self._died(f"the executor worker process (pid {self._process.pid}) exited with {self._process.returncode}")
                        return
                    continue
                kind, payload = pickle.loads(self._results.recv())
            except zmq.ZMQError:
                return  # closed by shutdown
            if kind == "responses":
                self._on_batch(payload)
            elif kind == "kv_events":
                self.kv_events.extend(payload)

    def _died(self, reason: str) -> None:
        self.error = reason
        log.error("LLM-API double: %s; every request in flight fails", reason)
        self._on_batch(None)  # None: fail everything pending (ExecutorDied)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        if self._stopping:
            return
        self._stopping = True
        try:
            if self.error is None:
                self._send((_SHUTDOWN, None))
        except Exception:
            pass
        try:
            self._process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._dispatcher.join(timeout_s)
        self._close()

    def _close(self) -> None:
        self._requests.close(0)
        self._results.close(0)
        self._context.term()
        shutil.rmtree(self._dir, ignore_errors=True)


# ----------------------------------------------------------------------------------- the worker


class _Worker:
    """The worker process: the stand-in engine, a request loop (main thread) and a response thread that
    sends every response made since its last send as one message (an iteration's responses)."""

    def __init__(self, request_address: str, result_address: str, config: dict[str, Any]) -> None:
        import zmq

        from trtllm_truss.engine_standin import build_engine
        from trtllm_truss.engine_standin.settings import StandinSettings

        self._context = zmq.Context()
        self._requests = self._context.socket(zmq.PULL)
        self._results = self._context.socket(zmq.PUSH)
        for sock in (self._requests, self._results):
            sock.setsockopt(zmq.LINGER, 1000)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
        self._requests.connect(request_address)
        self._results.connect(result_address)
        self.stream_interval = int(config.get("stream_interval") or 1)
        try:
            self.engine = build_engine(StandinSettings.from_parameters(config["parameters"]))
        except Exception as exc:
            self._results.send(pickle.dumps(("failed", f"{type(exc).__name__}: {exc}")))
            raise
        self._outbox: deque[Response] = deque()
        self._ready = threading.Condition()
        self._stopping = False
        self._kv_events_waiting = False
        self.engine.kv_events.on_event = self._kv_event_made
        self._sender = threading.Thread(target=self._send_responses, name="await_response_thread", daemon=True)
        self._sender.start()
        info = {"vocab_size": self.engine.vocab_size, "pid": os.getpid(), "engine": type(self.engine).__name__}
        self._results.send(pickle.dumps(("ready", info)))
        self._kv_event_made()  # events the engine made while starting (its "created" event) follow "ready"

    def _kv_event_made(self) -> None:  # engine thread: the response thread sends the engine's events
        with self._ready:
            self._kv_events_waiting = True
            self._ready.notify()

    def _queue(self, output: GenerationOutput, kv: tuple[int, int] | None = None) -> None:  # engine thread
        response = (
            output.request_id, output.token_ids, output.log_probs, output.top_log_probs,
            output.finish_reason.value if output.finished and output.finish_reason is not None else None, output.error,
            kv,
        )
        with self._ready:
            self._outbox.append(response)
            if len(self._outbox) == 1:
                self._ready.notify()

    def _send_responses(self) -> None:
        while True:
            with self._ready:
                while not self._outbox and not self._kv_events_waiting and not self._stopping:
                    self._ready.wait()
                if not self._outbox and not self._kv_events_waiting:
                    return
                batch, self._outbox = list(self._outbox), deque()
                events_waiting, self._kv_events_waiting = self._kv_events_waiting, False
            if events_waiting and (events := self.engine.kv_events.drain()):
                # Before the responses: a request's blocks are known to be stored once it answers.
                self._results.send(pickle.dumps(("kv_events", events), protocol=pickle.HIGHEST_PROTOCOL))
            if batch:
                self._results.send(pickle.dumps(("responses", batch), protocol=pickle.HIGHEST_PROTOCOL))

    def _submit(self, request: GenerationRequest, streaming: bool) -> None:
        from trtllm_truss.engine_standin.stream_interval import IntervalBuffer
        from trtllm_truss.engine_standin.types import RequestRejected

        interval = IntervalBuffer(self.stream_interval) if streaming and self.stream_interval > 1 else None
        kv_sent = [False]

        def on_output(output: GenerationOutput) -> None:
            if interval is not None:  # as PyExecutor._handle_responses: answer at this step or hold
                output = interval.admit(output)
                if output is None:
                    return
            kv = None
            if not kv_sent[0] and request.kv_total_blocks is not None:  # the engine prefilled it
                kv, kv_sent[0] = (request.kv_total_blocks, request.kv_reused_blocks), True
            self._queue(output, kv)

        try:
            self.engine.submit(request, on_output)
        except RequestRejected as exc:  # the executor answers a request it cannot serve with an error response
            self._queue(GenerationOutput(request.request_id, [], None, True, FinishReason.ERROR, str(exc)))

    def run(self) -> None:
        while True:
            kind, payload = pickle.loads(self._requests.recv())
            if kind == _SUBMIT:
                for request, streaming in payload:
                    self._submit(request, streaming)
            elif kind == _CANCEL:
                self.engine.cancel(payload)
            elif kind == _SHUTDOWN:
                break
        self.engine.shutdown()  # ends what is left with an error output
        with self._ready:
            self._stopping = True
            self._ready.notify()
        self._sender.join(10)
        self._requests.close(0)
        self._results.close()
        self._context.term()


def main(argv: list[str]) -> int:
    request_address, result_address, parent_pid = argv[0], argv[1], int(argv[2])
    exit_with_parent(parent_pid)  # as TensorRT-LLM's workers end with their proxy
    logging.basicConfig(level=logging.INFO, format="[llmapi-double worker] %(levelname)s %(message)s")
    config = json.loads(sys.stdin.buffer.read() or b"{}")
    _Worker(request_address, result_address, config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
