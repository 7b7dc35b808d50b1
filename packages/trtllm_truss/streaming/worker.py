"""A stream-worker process: `python -m trtllm_truss.streaming.worker --fd N --settings JSON`.

Started by `pool.StreamPool` with one end of a socket pair. It loads the tokenizer, says `ready`,
then serves `start`/`cancel` messages: each request runs as a task (`generation.WorkerModel.run`),
and everything the tasks emit within one event-loop turn leaves in one frame, text of the same
request joined (merging only what is already waiting: at low load each token leaves on its own).
It exits when the truss process closes its end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys

from trtllm_truss.streaming.generation import WorkerModel, WorkerSettings
from trtllm_truss.streaming.protocol import FrameReader, GenerationSpec, StreamEnd, encode_frame

logger = logging.getLogger("trtllm_truss.stream_worker")


class WorkerProtocol(asyncio.Protocol):
    def __init__(self, model: WorkerModel, closed: asyncio.Future) -> None:
        self._model = model
        self._closed = closed
        self._reader = FrameReader()
        self._transport: asyncio.Transport | None = None
        self._tasks: dict[int, asyncio.Task] = {}
        self._texts: dict[int, list[str]] = {}  # rid -> text emitted since the last flush
        self._log_probs: dict[int, list] = {}  # rid -> [(token text, log prob)] since the last flush
        self._ends: dict[int, StreamEnd] = {}
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport) -> None:
        self._transport = transport
        transport.write(encode_frame([("ready", self._model.info())]))

    def data_received(self, data: bytes) -> None:
        for message in self._reader.feed(data):
            kind, rid = message[0], message[1]
            if kind == "start":
                self._tasks[rid] = self._loop.create_task(self._serve(rid, message[2]))
            elif kind == "cancel":
                task = self._tasks.get(rid)
                if task is not None:
                    task.cancel()

    def connection_lost(self, exc) -> None:
        for task in self._tasks.values():
            task.cancel()
        if not self._closed.done():
            self._closed.set_result(None)

    async def _serve(self, rid: int, spec: GenerationSpec) -> None:
        try:
            end = await self._model.run(spec, lambda text, log_probs: self._emit(rid, text, log_probs))
        except asyncio.CancelledError:
            self._texts.pop(rid, None)  # the truss process has forgotten this request
            self._log_probs.pop(rid, None)
            return
        except Exception as exc:  # a bug must end its own request visibly, never the worker
            logger.exception("request %d failed", rid)
            end = StreamEnd(error=f"the stream worker failed the request: {type(exc).__name__}", status=500)
        finally:
            self._tasks.pop(rid, None)
        self._ends[rid] = end
        self._schedule_flush()

    def _emit(self, rid: int, text: str | list, log_probs: list | None) -> None:
        parts = self._texts.get(rid)
        if parts is None:
            self._texts[rid] = [text]
        else:
            parts.append(text)
        if log_probs:
            self._log_probs.setdefault(rid, []).extend(log_probs)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        texts, self._texts = self._texts, {}
        log_probs, self._log_probs = self._log_probs, {}
        ends, self._ends = self._ends, {}
        updates = [(rid, _joined(parts), log_probs.get(rid), ends.pop(rid, None)) for rid, parts in texts.items()]
        updates.extend((rid, "", None, end) for rid, end in ends.items())
        if updates and self._transport is not None and not self._transport.is_closing():
            self._transport.write(encode_frame(updates))


def _joined(pieces: list) -> str | list:
    """A request's emits since the last flush: strings joined, or parsed parts concatenated."""
    if len(pieces) == 1:
        return pieces[0]
    if pieces[0].__class__ is str:
        return "".join(pieces)
    return [part for parts in pieces for part in parts]


async def serve(sock: socket.socket, settings: WorkerSettings) -> None:
    model = WorkerModel(settings)
    await model.warm_up()
    loop = asyncio.get_running_loop()
    closed: asyncio.Future = loop.create_future()
    transport, _ = await loop.create_unix_connection(lambda: WorkerProtocol(model, closed), sock=sock)
    try:
        await closed
    finally:
        transport.close()
        await model.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trtllm_truss.streaming.worker")
    parser.add_argument("--fd", type=int, required=True, help="this worker's end of the socket pair")
    parser.add_argument("--settings", required=True, help="WorkerSettings as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[stream-worker %(process)d] %(name)s: %(message)s")
    settings = WorkerSettings(**json.loads(args.settings))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=args.fd)
    sock.setblocking(False)
    try:
        asyncio.run(serve(sock, settings))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
