"""The truss side of the stream workers: start them, route requests, turn their updates into streams.

Truss's server is one process and one asyncio thread; everything per token happens in the workers.
Here, per worker wake-up, one socket read delivers many requests' updates: each is appended to its
`ResponseStream` and its reader woken once, so a stream whose HTTP writer fell behind gets all the
text that has arrived as one chunk (and at low load every token as its own chunk).

A worker that dies hands the requests it never answered to another worker, once (the client saw
nothing of them), fails the rest at once (the stream ends with an error; a 503 where no other worker runs)
and is started again; requests beyond `max_in_flight` are refused with 429 rather than queued
without bound.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import asdict
from typing import Protocol

from trtllm_truss.api.openai import LogProbEntry
from trtllm_truss.streaming.generation import WorkerSettings
from trtllm_truss.streaming.protocol import FrameReader, GenerationSpec, StreamEnd, WorkerInfo, encode_frame

logger = logging.getLogger(__name__)

WORKER_START_TIMEOUT_S = 120.0
WORKER_RESTART_BACKOFF_S = 1.0

# True in a batch line's task (`serving.batch_runner`): the streams it submits are counted apart
# (`BoundedPool.background_streams`), so that what the host admitted less them is its interactive load.
background_request: ContextVar[bool] = ContextVar("background_request", default=False)


class PoolBusy(Exception):
    """More requests in flight than the pool admits (runtime.max_in_flight_requests)."""


class PoolUnavailable(Exception):
    """No stream worker is running (all died and are restarting)."""


def default_worker_count(cpu_count: int | None = None) -> int:
    """Half the cores (the engine, tritonserver and truss's own thread need the rest), 1 to 8."""
    cpus = cpu_count or os.cpu_count() or 1
    return max(1, min(8, cpus // 2))


class Admission(Protocol):
    """A bound on requests in flight shared beyond this pool (the direct front's processes share one per
    replica). `take()` claims a slot, False when none is free; `give_back()` returns one."""

    def take(self) -> bool: ...

    def give_back(self) -> None: ...


class StreamListener(Protocol):
    """Told when a stream's first text is read and when the HTTP side closes it (metrics)."""

    def stream_started(self, stream: ResponseStream) -> None: ...

    def stream_closed(self, stream: ResponseStream) -> None: ...


class ResponseStream:
    """One request's output as its worker sends it. `next_text()` returns everything that arrived since
    the last call (None once the request has ended and all text was read); `end` says how it ended."""

    __slots__ = (
        "rid", "_worker", "_parts", "_log_probs", "_read_log_probs", "end", "_waiter", "_closed", "_last_text_at",
        "opened_at", "first_text_at", "listener", "spec", "background", "replica",
    )

    def __init__(self, rid: int, worker: _Worker, spec: GenerationSpec | None = None) -> None:
        self.rid = rid
        self._worker = worker
        # The request, until its worker's first update: a worker that dies before it sends one hands the
        # request to another (`StreamPool.move`).
        self.spec = spec
        self._parts: list[str] = []
        self._log_probs: list[LogProbEntry] = []  # of the text not read yet
        self._read_log_probs: list[LogProbEntry] = []  # of the text next_parts() returned
        self.end: StreamEnd | None = None
        self._waiter: asyncio.Future | None = None
        self._closed = False
        self._last_text_at = 0.0
        self.opened_at = time.monotonic()
        self.first_text_at: float | None = None
        self.listener: StreamListener | None = None
        self.background = False  # a batch line's stream (`background_request`), as `claim` counted it
        self.replica: str | None = None  # the fleet's replica that takes the request, where a fleet's router told

    def _deliver(self, text: str | list, log_probs: list | None, end: StreamEnd | None) -> None:
        self.spec = None
        if text:
            if text.__class__ is str:
                self._parts.append(text)
            else:  # parsed parts (protocol docstring)
                self._parts += text
        if log_probs:
            self._log_probs += log_probs
        if end is not None:
            self.end = end
        if self._waiter is not None:
            _wake(self._waiter)

    async def wait_for_text(self, timeout_s: float) -> bool:
        """Whether text (or the end) arrived within `timeout_s`. The socket callback wakes the caller
        directly, with no task in between: on a busy event loop each task hop costs a whole loop turn."""
        if self._parts or self.end is not None:
            return True
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        return bool(self._parts) or self.end is not None

    async def next_text(self) -> str | None:
        """The text that arrived since the last call, joined (for requests without output parsers)."""
        parts = await self.next_parts()
        if parts is None:
            return None
        return parts[0] if len(parts) == 1 else "".join(parts)

    async def next_parts(self) -> list | None:
        """Everything that arrived since the last call: strings, or for a parsed request its parts
        (`streaming.protocol`); None once the request has ended and all was read."""
        loop = asyncio.get_running_loop()
        while not self._parts:
            if self.end is not None:
                return None
            self._waiter = loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self.end is None and self._last_text_at:
            # Pacing under load: at most `chunk_rate` chunks/s over all open streams, so truss's one
            # thread keeps up; a chunk then carries every token that arrived meanwhile (none is lost).
            due = self._last_text_at + self._worker.pool.chunk_gap_s()
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
        self._last_text_at = loop.time()
        if self.first_text_at is None:
            self.first_text_at = time.monotonic()
            if self.listener is not None:
                self.listener.stream_started(self)
        parts, self._parts = self._parts, []
        if self._log_probs:
            self._read_log_probs += self._log_probs
            self._log_probs = []
        return parts

    def take_log_probs(self) -> list[LogProbEntry]:
        """The log-prob entries (streaming.protocol) of the text next_parts() returned since the last call,
        and once the request has ended and all text was read, every one left (requests that asked for log
        probs). Entries of text that arrived after it stay for the call that reads that text."""
        taken, self._read_log_probs = self._read_log_probs, []
        if self.end is not None and not self._parts and self._log_probs:
            taken += self._log_probs
            self._log_probs = []
        return taken

    def close(self) -> None:
        """The HTTP side is done with this stream: a request still running is cancelled in its worker."""
        if self._closed:
            return
        self._closed = True
        self._worker.pool.release(self.background)
        self._worker.forget(self)
        if self.listener is not None:
            self.listener.stream_closed(self)


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _WorkerProtocol(asyncio.Protocol):
    def __init__(self, worker: _Worker) -> None:
        self._worker = worker
        self._reader = FrameReader()

    def data_received(self, data: bytes) -> None:
        streams = self._worker.streams
        try:
            updates = self._reader.feed(data)
        except Exception:
            logger.exception("stream worker %d sent an unreadable frame; restarting it", self._worker.index)
            self._worker.kill()
            return
        for rid, text, log_probs, end in updates:
            stream = streams.get(rid)
            if stream is not None:
                if end is not None:
                    del streams[rid]
                stream._deliver(text, log_probs, end)

    def connection_lost(self, exc: Exception | None) -> None:
        self._worker.lost()


class _Worker:
    """One worker process and the streams it serves."""

    def __init__(self, pool: StreamPool, index: int) -> None:
        self.pool = pool
        self.index = index
        self.streams: dict[int, ResponseStream] = {}
        self.restarting = False
        self.process: subprocess.Popen | None = None
        self.info: WorkerInfo | None = None
        self._sock: socket.socket | None = None
        self._transport: asyncio.Transport | None = None
        self._attaching: asyncio.Future | None = None

    @property
    def running(self) -> bool:
        return not self.restarting and self.process is not None and self.process.poll() is None

    def spawn(self) -> None:
        """Start the process and wait (blocking) until it has loaded and said ready."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            command = [
                sys.executable, "-m", "trtllm_truss.streaming.worker",
                "--fd", str(child.fileno()), "--settings", json.dumps(asdict(self.pool.settings)),
            ]
            process = subprocess.Popen(
                command, pass_fds=(child.fileno(),), env=self.pool.environment, stdin=subprocess.DEVNULL
            )
        finally:
            child.close()
        try:
            self.info = _await_ready(parent, process, self.pool.start_timeout_s)
        except BaseException:
            process.kill()
            process.wait()
            parent.close()
            raise
        parent.setblocking(False)
        self.process, self._sock, self._transport = process, parent, None
        logger.info("stream worker %d ready (pid %d)", self.index, process.pid)

    async def attach(self) -> None:
        """Hand the socket to the serving event loop (the one truss's requests arrive on); requests
        arriving while that happens wait for it."""
        if self._attaching is not None:
            await asyncio.shield(self._attaching)
        elif self._transport is None and self._sock is not None:
            loop = asyncio.get_running_loop()
            sock, self._sock = self._sock, None
            self._attaching = loop.create_future()
            try:
                self._transport, _ = await loop.create_unix_connection(lambda: _WorkerProtocol(self), sock=sock)
            finally:
                self._attaching.set_result(None)
                self._attaching = None

    def send(self, message: tuple) -> None:
        if self._transport is None or self._transport.is_closing():
            raise PoolUnavailable(f"stream worker {self.index} is not connected")
        self._transport.write(encode_frame([message]))

    def forget(self, stream: ResponseStream) -> None:
        if self.streams.pop(stream.rid, None) is not None and stream.end is None:
            try:
                self.send(("cancel", stream.rid))
            except PoolUnavailable:
                pass

    def kill(self) -> None:
        """Stop the process; its socket closing then fails its requests (`lost`)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self._sock is not None:  # never handed to an event loop
            self._sock.close()
            self._sock = None

    @property
    def connected(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def lost(self) -> None:
        """The socket closed: the process died (or was stopped). Move the requests it never answered to
        another worker, fail the rest, start another process."""
        self._transport = None
        streams, self.streams = self.streams, {}
        self.pool._restart_later(self)  # first: this worker is no longer a place to move requests to
        failed = [stream for stream in streams.values() if not self.pool.move(stream)]
        for stream in failed:
            stream._deliver("", None, StreamEnd(error="the stream worker serving this request stopped", status=503))
        if streams:
            logger.warning(
                "stream worker %d stopped; %d request(s) failed, %d moved to another worker",
                self.index, len(failed), len(streams) - len(failed),
            )


def _await_ready(sock: socket.socket, process: subprocess.Popen, timeout_s: float) -> WorkerInfo:
    reader = FrameReader()
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"stream worker exited with status {process.returncode} while starting (see its log above)")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"stream worker not ready within {timeout_s:g} s")
        sock.settimeout(min(remaining, 0.5))
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        if not data:
            process.wait(timeout=5)
            raise RuntimeError(f"stream worker exited with status {process.returncode} while starting (see its log above)")
        for message in reader.feed(data):
            if message[0] == "ready":
                return message[1]


class BoundedPool:
    """What every pool shares: the bound on requests in flight (its own, or a replica's `admission`) and
    the pacing of chunks by the streams open."""

    def __init__(self, *, max_in_flight: int, chunk_rate: float, admission: Admission | None) -> None:
        self.admission = admission  # None: max_in_flight bounds this pool's own open streams
        self.max_in_flight = max_in_flight
        self.chunk_rate = chunk_rate
        self.open_streams = 0  # streams the HTTP side still reads (submitted, not closed)
        self.background_streams = 0  # of them, batch lines' (`background_request`)

    async def warm_up(self) -> None:
        """Before serving, on the serving loop: what a first request would build (stream workers warm
        themselves as they start)."""

    def chunk_gap_s(self) -> float:
        """The shortest time between two chunks of one stream: 0 at low load (every token its own
        chunk), open streams / chunk_rate when that many streams would exceed the rate."""
        return self.open_streams / self.chunk_rate

    def claim(self) -> bool:
        """A slot for one more request (counted in open_streams), or PoolBusy. Held until the HTTP side
        closes the stream (`release`): a request is admitted until its answer is out. True for a batch
        line's request (counted in background_streams too: `release` must be told)."""
        if self.admission is None:
            if self.open_streams >= self.max_in_flight:
                raise PoolBusy(f"{self.open_streams} requests in flight, the limit is {self.max_in_flight}")
        elif not self.admission.take():
            raise PoolBusy(f"the replica's {self.max_in_flight} requests in flight are taken")
        self.open_streams += 1
        background = background_request.get()
        self.background_streams += background
        return background

    def release(self, background: bool = False) -> None:
        self.open_streams -= 1
        self.background_streams -= background
        if self.admission is not None:
            self.admission.give_back()


class StreamPool(BoundedPool):
    """N stream workers; `submit` routes a request to the least busy one."""

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        workers: int,
        max_in_flight: int,
        environment: Mapping[str, str],
        chunk_rate: float = 10_000.0,
        start_timeout_s: float = WORKER_START_TIMEOUT_S,
        admission: Admission | None = None,
    ) -> None:
        super().__init__(max_in_flight=max_in_flight, chunk_rate=chunk_rate, admission=admission)
        self.settings = settings
        self.environment = dict(environment)
        self.start_timeout_s = start_timeout_s
        self.restarts = 0
        self._workers = [_Worker(self, i) for i in range(workers)]
        self._rids = itertools.count(1)
        self._stopping = False

    @property
    def info(self) -> WorkerInfo | None:
        """What the workers know of the tokenizer (they all load the same one)."""
        return next((w.info for w in self._workers if w.info is not None), None)

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process is not None and w.running]

    @property
    def in_flight(self) -> int:
        return sum(len(w.streams) for w in self._workers)

    def start(self) -> None:
        """Blocking (truss's `load()`): every worker started and ready, in parallel."""
        errors: list[BaseException] = []

        def spawn(worker: _Worker) -> None:
            try:
                worker.spawn()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=spawn, args=(w,)) for w in self._workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            self.stop()
            raise errors[0]

    def stop(self, wait: bool = True) -> None:
        """Kill every worker (not restarted); `wait=False` only signals them (safe in a signal handler)."""
        self._stopping = True
        for worker in self._workers:
            worker.kill()
            if wait and worker.process is not None:
                try:
                    worker.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass

    def alive(self) -> bool:
        return any(w.running for w in self._workers)

    async def close(self) -> None:
        """Nothing to close here: each worker closes its own engine client when its socket closes."""

    async def submit(self, spec: GenerationSpec) -> ResponseStream:
        # Claimed before the first await: requests arriving meanwhile see the slot taken.
        background = self.claim()
        try:
            running = []
            for worker in self._workers:
                if worker.running:
                    running.append(worker)
                else:  # died before its socket was watched (between load() and the first request)
                    self._restart_later(worker)
            for worker in running:  # every one: a worker that dies moves its requests to a connected one
                if not worker.connected:  # no coroutine per worker per request once all are attached
                    await worker.attach()
            stream = ResponseStream(0, None, spec)  # type: ignore[arg-type]  # `_start` gives it its worker
            stream.background = background
            if not self._start(stream):
                raise PoolUnavailable("no stream worker is running")
        except BaseException:
            self.release(background)
            raise
        return stream

    def move(self, stream: ResponseStream) -> bool:
        """Start a request whose worker died before answering it on another worker, if one runs: a request
        that reached a worker as it was killed is served, not refused. Once only: a request that itself
        brought its worker down takes at most one more with it."""
        if stream.spec is None or self._stopping or not self._start(stream):
            return False
        stream.spec = None
        return True

    def _start(self, stream: ResponseStream) -> bool:
        """Send the stream's request, under a new id, to the least busy running, connected worker."""
        workers = [w for w in self._workers if w.running and w.connected]
        if not workers:
            return False
        worker = min(workers, key=lambda w: len(w.streams))
        rid = next(self._rids)
        worker.send(("start", rid, stream.spec))
        stream.rid, stream._worker = rid, worker
        worker.streams[rid] = stream
        return True

    def _restart_later(self, worker: _Worker) -> None:
        if self._stopping or worker.restarting:
            return
        worker.restarting = True

        def restart() -> None:
            try:
                if worker.process is not None:
                    worker.process.wait()
                while not self._stopping:
                    try:
                        worker.spawn()
                        self.restarts += 1
                        return
                    except Exception:
                        logger.exception("restarting stream worker %d failed; trying again", worker.index)
                        time.sleep(WORKER_RESTART_BACKOFF_S)  # backoff between attempts, not synchronisation
            finally:
                worker.restarting = False

        threading.Thread(target=restart, name=f"stream-worker-{worker.index}-restart", daemon=True).start()
