"""The stream workers' work on the serving process's own event loop: no worker process, no relay hop.

For fronts that are already several processes (the direct front, one event loop per process): there the
hop to a worker process (a socket write, a frame, a read and a wake-up per update, on both sides) only
costs CPU. Each request runs `generation.WorkerModel.run` as a task beside the HTTP handlers; its text
reaches its `ResponseStream` directly. Same interface as `pool.StreamPool` (submit, admission, 429 past
the bound, close cancels the request in the engine), so the request core cannot tell them apart.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from trtllm_truss.streaming.generation import WorkerModel, WorkerSettings
from trtllm_truss.streaming.pool import Admission, BoundedPool, PoolUnavailable, ResponseStream
from trtllm_truss.streaming.protocol import GenerationSpec, StreamEnd, WorkerInfo

logger = logging.getLogger(__name__)

STOPPING = StreamEnd(error="the server is stopping", status=503)


class InProcessPool(BoundedPool):
    """`StreamPool`'s interface, its work done here. Also each stream's "worker" (`ResponseStream` reaches
    the pool and `forget` through it)."""

    def __init__(
        self, settings: WorkerSettings, *, max_in_flight: int, chunk_rate: float = 10_000.0, admission: Admission | None = None
    ) -> None:
        super().__init__(max_in_flight=max_in_flight, chunk_rate=chunk_rate, admission=admission)
        self.settings = settings
        self.pool = self
        self._model: WorkerModel | None = None
        self._info: WorkerInfo | None = None
        self._running: dict[int, tuple[ResponseStream, asyncio.Task]] = {}
        self._rids = itertools.count(1)
        self._stopping = False

    @property
    def info(self) -> WorkerInfo | None:
        return self._info

    def start(self) -> None:
        """Load the tokenizer and the engine client (blocking, before serving)."""
        self._model = WorkerModel(self.settings)
        self._info = self._model.info()

    async def warm_up(self) -> None:  # BoundedPool's
        if self._model is not None:
            await self._model.warm_up()

    def alive(self) -> bool:
        return self._model is not None and not self._stopping

    def stop(self, wait: bool = True) -> None:
        """End every open stream (503) and cancel its request; safe in a signal handler. `wait` is the
        pool's interface: nothing here outlives the event loop."""
        self._stopping = True
        running, self._running = self._running, {}
        for stream, task in running.values():
            task.cancel()
            stream._deliver("", None, STOPPING)

    async def submit(self, spec: GenerationSpec) -> ResponseStream:
        if self._model is None or self._stopping:
            raise PoolUnavailable("the server is stopping")
        background = self.claim()
        stream = ResponseStream(next(self._rids), self)  # type: ignore[arg-type]  # the pool is its own worker
        stream.background = background
        task = asyncio.get_running_loop().create_task(self._run(stream, spec))
        self._running[stream.rid] = (stream, task)
        return stream

    async def _run(self, stream: ResponseStream, spec: GenerationSpec) -> None:
        assert self._model is not None
        try:
            end = await self._model.run(spec, lambda text, log_probs: stream._deliver(text, log_probs, None),
                                        on_replica=lambda name: setattr(stream, "replica", name))
        except asyncio.CancelledError:
            return  # closed by the HTTP side, or the server is stopping (which ended the stream)
        except Exception as exc:  # a bug must end its own request visibly, never the process
            logger.exception("request %d failed", stream.rid)
            end = StreamEnd(error=f"the request failed: {type(exc).__name__}", status=500)
        finally:
            self._running.pop(stream.rid, None)
        stream._deliver("", None, end)

    def forget(self, stream: ResponseStream) -> None:
        """The HTTP side closed the stream: a request still running is cancelled (the engine client
        then sends NVIDIA's stop, which frees the engine slot)."""
        running = self._running.pop(stream.rid, None)
        if running is not None:
            running[1].cancel()

    async def close(self) -> None:
        if self._model is not None:
            await self._model.close()
