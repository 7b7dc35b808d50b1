"""The LLM host: the one process that owns `tensorrt_llm.LLM` for every Triton instance of our llmapi model.

Which process owns what (one tritonserver, our llmapi model `tensorrt_llm` with N instances):

| process | owns |
|---|---|
| tritonserver | gRPC/HTTP, the model's N instances, their response senders |
| instance stub i (model.py) | reading its requests' tensors, one `submit` per row to the host, and every Triton `send()` of its requests' responses, from its own receive thread |
| the LLM host (this module; started by the first instance, ends with it) | `LLM(**model.yaml)` (TensorRT-LLM's, or the double's), its asyncio loop: `generate_async` per row, iterating the results, one frame per instance per loop turn carrying every update of that turn |
| TensorRT-LLM's executor worker(s) (or the double's: engine_standin/llmapi_executor.py) | the engine, behind the LLM's proxy and its ZMQ queues |

Why: a python-backend `send()` is a round trip to tritonserver (2,000-2,900 responses/s from one stub
thread), and more sender threads in one stub crashed tritonserver 2.51; the LLM must live in one process.
So sending is spread over N stubs, each with one sender thread, while one LLM batches everything, as
`trtllm-serve` spreads HTTP over frontends in front of one executor. The host only forwards: tokens,
log probs and ends, never Triton tensors (docs/design.md, "The LLM-API path").

Run: `python -m trtllm_truss.triton_models.tensorrt_llm_llmapi.llm_host NAME MODEL_YAML PARENT_PID` (NAME: the
abstract socket's, without its leading NUL), the
model's parameters (JSON) on stdin. The listening socket is bound before the LLM is built, so the
instances wait on it for `ready` (or `failed` and the reason).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

import yaml

from trtllm_truss.engine_standin.settings import StandinSettings
from trtllm_truss.runtime.kv_event_relay import relay_from_environment
from trtllm_truss.runtime.stub_watch import exit_with_parent
from trtllm_truss.triton_models.tensorrt_llm_llmapi.host_link import encode, take_frame
from trtllm_truss.triton_models.tensorrt_llm_llmapi.llm_request import (
    LLM_API_DOUBLE,
    double_settings,
    kv_block_counts,
    load_llm_api,
    submit,
    token_log_probs,
    token_top_log_probs,
)

log = logging.getLogger("tensorrt_llm_llmapi.host")
FAILED_LINGER_S = 30.0  # a host whose LLM could not be built answers `failed` this long, then exits
EXECUTOR_CHECK_S = 0.5
FAILURES_DRAIN_S = 5.0  # a dead executor's failures of the open requests reach their instances within this


class _Instance(asyncio.Protocol):
    """One instance's connection: its rows in flight, and the updates of this loop turn. Its frames are read
    and handled in the loop's I/O callback (`data_received`), with no task to wake: where the host is at a
    full core a submit would otherwise wait one more loop turn (docs/performance.md, "Where a first token's
    time goes")."""

    def __init__(self, host: LlmHost) -> None:
        self.host = host
        self.transport: Any = None
        self.results: dict[Any, Any] = {}  # key -> GenerationResult
        self.outbox: list[tuple] = []  # this turn's updates; one list for the connection's life (`_follow` holds it)
        self._buffer = bytearray()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(encode([("ready", {"pid": os.getpid()})]))

    def data_received(self, data: bytes) -> None:
        """Every whole frame read so far, its messages handled in order; a frame over the limit, or one that
        does not unpickle, raises, and the loop closes the connection."""
        buffer = self._buffer
        buffer += data
        while (messages := take_frame(buffer)) is not None:
            for message in messages:
                self.host._handle(self, message)

    def connection_lost(self, exc: Exception | None) -> None:
        """The instance is gone (finalized, or its stub died), or this host is stopping: nobody reads these
        results any more, so their slots are freed."""
        self.host.instances.discard(self)
        for result in list(self.results.values()):
            result.abort()

    def push(self, update: tuple) -> None:
        if not self.outbox:
            self.host.loop.call_soon(self.flush)  # after every result woken in this turn
        self.outbox.append(update)

    def flush(self) -> None:
        try:
            if not self.transport.is_closing():
                self.transport.write(encode(self.outbox))
        finally:  # emptied whatever happens: a list left full would never schedule its flush again
            self.outbox.clear()


class LlmHost:
    def __init__(self, llm: Any, api: Any, parameters: dict[str, str]) -> None:
        self.llm = llm
        self.api = api
        self.loop = asyncio.get_running_loop()
        self.tokenizer_dir = parameters.get("tokenizer_dir") or None
        self.adapters = StandinSettings.from_parameters(
            {"model_dir": "-", "lora_adapters": parameters.get("lora_adapters", "")}
        ).lora_adapters
        self._tokenizer = None
        self._by_triton_id: dict[str, set[tuple[_Instance, Any]]] = {}
        self.instances: set[_Instance] = set()
        self.follows: set[asyncio.Task] = set()  # every row's `_follow`, until it has pushed its end
        self.stopped = asyncio.Event()

    def _decode(self, ids: list[int]) -> str:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        return self._tokenizer.decode(ids)

    def connect(self) -> _Instance:
        """A new instance's connection (the protocol factory of the host's listening socket)."""
        instance = _Instance(self)
        self.instances.add(instance)
        return instance

    def _handle(self, instance: _Instance, message: tuple) -> None:
        kind = message[0]
        if kind == "submit":
            _, key, generation, n, streaming, triton_id, *perf = message
            self._submit(instance, key, generation, n, streaming, triton_id, bool(perf and perf[0]))
        elif kind == "abort":
            result = instance.results.get(message[1])
            if result is not None:
                result.abort()
        elif kind == "stop":
            for owner, key in list(self._by_triton_id.get(message[1], ())):
                result = owner.results.get(key)
                if result is not None:
                    result.abort()
        elif kind == "shutdown":
            self.stopped.set()

    def _submit(
        self, instance: _Instance, key: Any, generation: Any, n: int, streaming: bool, triton_id: str, perf: bool = False
    ) -> None:
        try:
            result = submit(
                self.llm, self.api, generation, n=n, streaming=streaming, adapters=self.adapters, decode=self._decode, perf=perf
            )
        except Exception as exc:  # the LLM API refused it (its own validation)
            instance.push((key, None, None, None, None, None, str(exc)))
            return
        instance.results[key] = result
        if triton_id:
            self._by_triton_id.setdefault(triton_id, set()).add((instance, key))
        follow = self.loop.create_task(self._follow(instance, key, result, generation, n, triton_id, perf))
        self.follows.add(follow)
        follow.add_done_callback(self.follows.discard)

    async def _follow(
        self, instance: _Instance, key: Any, result: Any, generation: Any, n: int, triton_id: str, perf: bool = False
    ) -> None:
        """Every new token of the row's sequences to its instance, each sequence's end with its last tokens.
        Without log probs an update is built and appended to the instance's outbox inline, with no call: this
        loop runs once per token of every stream, in the process the LLM API itself keeps busy
        (docs/performance.md, "The LLM host's own work per token")."""
        push = instance.push
        outbox, schedule, flush = instance.outbox, self.loop.call_soon, instance.flush
        want = generation.return_log_probs
        k = generation.top_log_probs if want else 0
        sent = [0] * n  # tokens sent of each sequence; -1 once its end was sent
        kv_sent = [not perf] * n  # each sequence's KV block counts go once, with return_perf_metrics

        def message(completion: Any, start: int, finish: str | None) -> tuple:
            tokens = completion.token_ids[start:]  # a new list: the LLM API's own grows on
            entries = completion.logprobs[start : start + len(tokens)] if want else None
            log_probs = token_log_probs(entries, tokens) if want else None
            update = (key, completion.index, tokens, log_probs, token_top_log_probs(entries, k) if k else None, finish, None)
            if not kv_sent[completion.index] and (kv := kv_block_counts(completion)) is not None:
                kv_sent[completion.index] = True
                update += (kv,)
            return update

        try:
            async for update in result:
                for completion in update.outputs:
                    index = completion.index
                    start = sent[index]
                    if start < 0:
                        continue
                    finish = completion.finish_reason
                    end = len(completion.token_ids)
                    if end == start and finish is None:
                        continue
                    if want or not kv_sent[index]:
                        push(message(completion, start, finish))
                    else:  # the common case; the turn's first update schedules the flush
                        if not outbox:
                            schedule(flush)
                        outbox.append((key, index, completion.token_ids[start:], None, None, finish, None))
                    sent[index] = -1 if finish is not None else end
            for completion in result.outputs:  # a sequence the LLM API ended without a finish reason
                if sent[completion.index] >= 0:
                    push(message(completion, sent[completion.index], completion.finish_reason or "stop"))
        except Exception as exc:  # RequestError: the executor failed the request
            push((key, None, None, None, None, None, str(exc) or type(exc).__name__))
        finally:
            instance.results.pop(key, None)
            owners = self._by_triton_id.get(triton_id)
            if owners is not None:
                owners.discard((instance, key))
                if not owners:
                    del self._by_triton_id[triton_id]

    async def watch_executor(self) -> None:
        """The double's executor worker gone: this host ends, so every instance fails its requests and the
        stack's probe reads the engine unhealthy. (TensorRT-LLM's own LLM fails each request itself.)"""
        executor = getattr(self.llm, "executor", None)
        while executor is not None and not self.stopped.is_set():
            if getattr(executor, "error", None) is not None:
                log.error("LLM host: the executor is gone (%s); exiting", executor.error)
                # The double's dispatch thread fails every open request just after it sets the error: those
                # failures reach their instances first, so each stream ends with the executor's reason, not the
                # bare "host gone" of a closed connection; their frames are flushed (call_soon) before the stop.
                if self.follows:
                    await asyncio.wait(set(self.follows), timeout=FAILURES_DRAIN_S)
                await asyncio.sleep(0)
                self.stopped.set()
                return
            await asyncio.sleep(EXECUTOR_CHECK_S)


def build_llm(model_yaml: Path, parameters: dict[str, str]) -> tuple[Any, Any, dict[str, Any]]:
    """(LLM, the API it comes from, model.yaml's arguments) from our llmapi model's parameters: TensorRT-LLM's
    LLM, or the double's with its own settings (llm_api: double). Call it on the event loop that will use
    it: the LLM API binds its result queues to the running loop."""
    kind = parameters.get("llm_api", "tensorrt_llm").strip() or "tensorrt_llm"
    api = load_llm_api(kind)
    llm_args = yaml.safe_load(model_yaml.read_text(encoding="utf-8")) or {}
    extra = double_settings(parameters) if kind == LLM_API_DOUBLE else {}
    llm = api.LLM(**llm_args, **extra)
    if kind == LLM_API_DOUBLE:
        from trtllm_truss.engine_standin.llmapi_double import applied_summary

        log.warning("%s", applied_summary(llm, llm_args))
    return llm, api, llm_args


async def _run(listener: socket.socket, model_yaml: Path, parameters: dict[str, str]) -> int:
    try:
        llm, api, _ = build_llm(model_yaml, parameters)
    except Exception as exc:
        log.exception("LLM host: building the LLM failed")
        reason = f"building the LLM failed: {type(exc).__name__}: {exc}"

        async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(encode([("failed", reason)]))
            await writer.drain()
            writer.close()

        server = await asyncio.start_unix_server(refuse, sock=listener)
        await asyncio.sleep(FAILED_LINGER_S)
        server.close()
        return 1
    host = LlmHost(llm, api, parameters)
    # In a fleet: the LLM's KV cache events (LLM.get_kv_cache_events, TensorRT-LLM 1.x with
    # kv_cache_config.event_buffer_max_size) to the replica's Dynamo worker (runtime/kv_event_relay.py).
    relay = relay_from_environment(getattr(llm, "get_kv_cache_events", None), name="kv-events")
    server = await asyncio.get_running_loop().create_unix_server(host.connect, sock=listener)
    asyncio.get_running_loop().create_task(host.watch_executor())
    log.info("LLM host ready (pid %d): model.yaml %s", os.getpid(), model_yaml)
    await host.stopped.wait()
    server.close()
    for instance in list(host.instances):  # each frees its rows' slots (connection_lost)
        if instance.transport is not None:
            instance.transport.close()
    current = asyncio.current_task()
    for task in asyncio.all_tasks():  # the watch, rows still followed
        if task is not current:
            task.cancel()
    if relay is not None:
        relay.close()
    broken = getattr(getattr(llm, "executor", None), "error", None) is not None
    try:
        llm.shutdown()
    except Exception:
        log.exception("LLM host: shutting the LLM down failed")
    return 1 if broken else 0


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's where installed (what trtllm-serve's uvicorn runs), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def main(argv: list[str]) -> int:
    address, model_yaml, parent_pid = "\0" + argv[0], Path(argv[1]), int(argv[2])  # an abstract socket name
    exit_with_parent(parent_pid)  # the instance that started it; tritonserver's other stubs see the socket close
    logging.basicConfig(level=logging.INFO, format="[llmapi host] %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    parameters = json.loads(sys.stdin.buffer.read() or b"{}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(256)
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(_run(listener, model_yaml, parameters))
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
