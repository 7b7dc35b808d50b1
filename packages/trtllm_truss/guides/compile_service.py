"""The front's guide compile service: one process per replica that owns what a guide costs.

`python -m trtllm_truss.guides.compile_service` (started by `guides.compile_client.GuideService`: truss's
server starts one, the direct front's launcher one for all its frontends; settings as one JSON line on
stdin). Frontends send it each guide before the request is queued (`api.structured.check`) over a Unix
socket (`guides.wire` frames, tagged by an id, many in flight per connection) and get its verdict:
`accepted` (the guide to send and what of it is not enforced), `refused` (the 400's message), or `busy`
(no compile process could take it in time: a 429 with Retry-After, the guide is not at fault).

- **Known guides first.** Verdicts, refusals included, are kept in an LRU bounded in bytes
  (`guides.cache.BytesLRU`; a verdict's text and notes, `cache_bytes`), keyed by the guide's hash; a known
  guide is answered from it at once, never behind waiting compiles. Requests for a guide already being
  compiled wait for that one compile.
- **A budget per guide.** A new guide goes to one of `processes` warm compile processes
  (`guides.compile_worker`, forked from a parent that holds the tokenizer) that checks it and compiles it
  over the tokenizer; one still working `budget_s` after it got the guide is killed (SIGKILL: the
  compilers cannot be interrupted) and replaced, and the guide is refused, naming the budget. That
  refusal is cached like the others.
- **Small guides first, and room kept for them.** Waiting guides are taken smallest first; guides over
  `small_guide_bytes` hold at most `processes - 1` of the processes, so one is always there for small
  ones. A guide that cannot start within `wait_s` (default: the budget) is `busy`, as is one that would
  take the waiting guides' text over `MAX_WAITING_BYTES`.

Counts and the cache's size are written to a small shared file (`stats_path`, `STATS_FIELDS` as float64s)
that every frontend reads for `/metrics` (`serving.metrics.GuideCacheCollector`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import heapq
import itertools
import json
import logging
import mmap
import os
import signal
import struct
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_truss.guides import wire
from trtllm_truss.guides.cache import BytesLRU

log = logging.getLogger("trtllm_truss.guide_service")

SMALL_GUIDE_BYTES = 16 << 10  # guides up to this take any compile process (tool schemas, response formats)
MAX_WAITING_BYTES = 64 << 20  # text of the guides waiting for a compile process, at most
ENTRY_OVERHEAD_BYTES = 256  # a cached verdict's key, tuple and dict, besides its strings
FORK_RETRY_S = 1.0
FORK_TIMEOUT_S = 10.0  # a fork asked for that has not connected by then is asked for again
STATS_FIELDS = (
    "entries", "bytes", "limit_bytes", "hits", "misses", "evictions", "compiles", "compile_seconds",
    "refused", "over_budget", "busy", "workers", "workers_replaced", "budget_s",
)
_STATS = struct.Struct(f"<{len(STATS_FIELDS)}d")


@dataclass(frozen=True)
class ServiceSettings:
    engine: str  # xgrammar | llguidance, the deployment's (guides.engines.guide_engine)
    tokenizer_dir: str
    directory: str  # holds the two sockets and the stats file
    budget_s: float
    processes: int
    cache_bytes: int
    wait_s: float | None = None  # None: budget_s
    small_guide_bytes: int = SMALL_GUIDE_BYTES
    recycle_bytes: int = 128 << 20  # a compile process holding more of its own is replaced
    log_level: str = "WARNING"

    @property
    def socket_path(self) -> str:
        return str(Path(self.directory) / "guides.sock")

    @property
    def worker_socket_path(self) -> str:
        return str(Path(self.directory) / "workers.sock")

    @property
    def stats_path(self) -> str:
        return str(Path(self.directory) / "stats")

    @property
    def waiting_s(self) -> float:
        return self.budget_s if self.wait_s is None else self.wait_s


def over_budget(budget_s: float) -> str:
    return (f"checking and compiling it takes longer than {budget_s:g} s, this deployment's budget for one guide"
            " (runtime.guides.compile_budget_s); simplify it")


def busy(settings: ServiceSettings) -> dict[str, Any]:
    return {"busy": {"message": f"every guide compile process is taken (runtime.guides.compile_processes:"
                                f" {settings.processes}); retry shortly",
                     "retry_after": max(1, round(settings.budget_s))}}


def guide_key(guide_type: str, guide: str | None, strict: bool) -> str:
    text = json.dumps([guide_type, guide, bool(strict)], ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def verdict_bytes(verdict: Mapping[str, Any]) -> int:
    """What a cached verdict holds: its strings (as Python keeps them) and a fixed overhead."""
    body = verdict.get("accepted") or verdict.get("refused") or {}
    strings = [v for v in body.values() if isinstance(v, str)] + list(body.get("unenforced") or ())
    return ENTRY_OVERHEAD_BYTES + sum(sys.getsizeof(s) for s in strings)


class StatsFile:
    """`STATS_FIELDS` as float64s in a small file: the service writes, frontends read (`read_stats`)."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(fd, _STATS.size)
        self._map = mmap.mmap(fd, _STATS.size)
        os.close(fd)
        self.values = dict.fromkeys(STATS_FIELDS, 0.0)

    def write(self, **values: float) -> None:
        self.values.update(values)
        _STATS.pack_into(self._map, 0, *(float(self.values[name]) for name in STATS_FIELDS))


def read_stats(path: str) -> dict[str, float]:
    """The service's counts as last written (zeros while it has written none)."""
    try:
        with open(path, "rb") as file:
            data = file.read(_STATS.size)
    except OSError:
        return dict.fromkeys(STATS_FIELDS, 0.0)
    if len(data) < _STATS.size:
        return dict.fromkeys(STATS_FIELDS, 0.0)
    return dict(zip(STATS_FIELDS, _STATS.unpack(data)))


class _Job:
    __slots__ = ("key", "request", "size", "waiters", "started", "done")

    def __init__(self, key: str, request: dict[str, Any], size: int) -> None:
        self.key, self.request, self.size = key, request, size
        self.waiters: list[asyncio.Future] = []
        self.started = self.done = False


@dataclass
class _Worker:
    pid: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not self.writer.is_closing()

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.writer.close()


class CompileService:
    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.cache: BytesLRU[str, dict[str, Any]] = BytesLRU(settings.cache_bytes)
        self._pending: dict[str, _Job] = {}
        self._waiting: list[tuple[int, int, _Job]] = []
        self._waiting_bytes = 0
        self._order = itertools.count()
        self._idle: list[_Worker] = []
        self._workers: dict[int, _Worker] = {}
        self._large_running = 0
        self._asked: list[float] = []  # when each fork not yet connected was asked for
        self._zygote: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._ready = asyncio.Event()
        self.counts = dict(compiles=0, compile_seconds=0.0, refused=0, over_budget=0, busy=0, workers_replaced=0)
        self.stats = StatsFile(settings.stats_path)
        self._publish()

    # --- running --------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        settings = self.settings
        workers = await asyncio.start_unix_server(self._worker_connected, path=settings.worker_socket_path)
        watcher = asyncio.ensure_future(self._keep_zygote())
        clients = None
        try:
            await asyncio.wait({asyncio.ensure_future(self._ready.wait()), asyncio.ensure_future(stop.wait())},
                               return_when=asyncio.FIRST_COMPLETED)
            # Clients only once a compile process is up: until then they read the service as unavailable (503).
            clients = await asyncio.start_unix_server(self._client_connected, path=settings.socket_path)
            print("ready", flush=True)  # the owner waits for this line
            await stop.wait()
        finally:
            self._stopping = True
            watcher.cancel()
            if clients is not None:
                clients.close()
            workers.close()
            for worker in list(self._workers.values()):
                worker.kill()
            if self._zygote is not None and self._zygote.returncode is None:
                self._zygote.kill()
                await self._zygote.wait()

    async def _keep_zygote(self) -> None:
        """The fork parent, started again if it dies (its workers die with it)."""
        settings = self.settings
        while not self._stopping:
            self._zygote = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "trtllm_truss.guides.compile_worker", stdin=asyncio.subprocess.PIPE)
            assert self._zygote.stdin is not None
            self._zygote.stdin.write((json.dumps({
                "engine": settings.engine, "tokenizer_dir": settings.tokenizer_dir, "socket": settings.worker_socket_path,
                "recycle_bytes": settings.recycle_bytes, "service_pid": os.getpid(), "log_level": settings.log_level,
            }) + "\n").encode())
            self._asked.clear()
            self._fork(settings.processes)
            code = await self._zygote.wait()
            if self._stopping:
                return
            log.warning("the guide compile parent exited with %s; starting it again", code)
            for worker in list(self._workers.values()):
                self._drop(worker)
            await asyncio.sleep(FORK_RETRY_S)

    def _fork(self, count: int) -> None:
        """Ask the fork parent for up to `count` workers, never past `processes` with those asked for."""
        zygote = self._zygote
        now = time.monotonic()
        self._asked = [at for at in self._asked if now - at < FORK_TIMEOUT_S]  # one that never came is forgotten
        count = min(count, self.settings.processes - len(self._workers) - len(self._asked))
        if zygote is None or zygote.returncode is not None or zygote.stdin is None or count <= 0:
            return
        self._asked += [now] * count
        zygote.stdin.write(b"fork\n" * count)

    def _drop(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.pop(worker.pid, None)
        if worker in self._idle:
            self._idle.remove(worker)
        self._publish()

    def _replace(self, worker: _Worker) -> None:
        self._drop(worker)
        self.counts["workers_replaced"] += 1
        self._fork(1)

    async def _worker_connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = await wire.read(reader)
        if not isinstance(hello, dict) or "pid" not in hello:
            writer.close()
            return
        if self._asked:
            self._asked.pop(0)
        if hello.get("why") and not self._workers:
            log.warning("guides are checked without compiling them: %s", hello["why"])
        worker = _Worker(int(hello["pid"]), reader, writer)
        self._workers[worker.pid] = worker
        self._idle.append(worker)
        self._ready.set()
        self._publish()
        self._dispatch()

    # --- clients --------------------------------------------------------------------------------

    async def _client_connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answering: set[asyncio.Future] = set()
        try:
            while True:
                message = await wire.read(reader)
                if message is None:
                    break
                task = asyncio.ensure_future(self._answer(message, writer))
                answering.add(task)
                task.add_done_callback(answering.discard)
        except (ConnectionError, wire.WireError, ValueError) as exc:
            log.warning("a guide client sent what cannot be read: %s", exc)
        except asyncio.CancelledError:  # the service is stopping
            pass
        finally:
            for task in answering:
                task.cancel()
            writer.close()

    async def _answer(self, message: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        verdict = await self.check(str(message.get("type")), message.get("guide"), bool(message.get("strict")))
        if not writer.is_closing():
            wire.write(writer, {"id": message.get("id"), **verdict})

    async def check(self, guide_type: str, guide: str | None, strict: bool) -> dict[str, Any]:
        key = guide_key(guide_type, guide, strict)
        cached = self.cache.get(key)
        if cached is not None:
            self._publish()
            return cached
        job = self._pending.get(key)
        if job is None:
            size = len(guide or "")
            if self._waiting_bytes + size > MAX_WAITING_BYTES:
                self.counts["busy"] += 1
                self._publish()
                return busy(self.settings)
            job = self._pending[key] = _Job(key, {"type": guide_type, "guide": guide, "strict": strict}, size)
            heapq.heappush(self._waiting, (size, next(self._order), job))
            self._waiting_bytes += size
            asyncio.get_running_loop().call_later(self.settings.waiting_s, self._expire, job)
            self._dispatch()
        else:
            self.cache.misses -= 1  # joined a compile in flight: a hit, not a second miss
            self.cache.hits += 1
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        job.waiters.append(future)
        self._publish()
        return await future

    def _expire(self, job: _Job) -> None:
        """Not started within the wait: busy (not cached; the guide is not at fault)."""
        if job.started or job.done:
            return
        self.counts["busy"] += 1
        self._finish(job, busy(self.settings), cache=False)

    def _finish(self, job: _Job, verdict: dict[str, Any], *, cache: bool) -> None:
        if job.done:
            return
        job.done = True
        if not job.started:
            self._waiting_bytes -= job.size
        if self._pending.get(job.key) is job:
            del self._pending[job.key]
        if cache:
            self.cache.put(job.key, verdict, verdict_bytes(verdict))
        for future in job.waiters:
            if not future.done():
                future.set_result(verdict)
        self._publish()

    # --- compile processes ----------------------------------------------------------------------

    def _dispatch(self) -> None:
        settings = self.settings
        self._fork(settings.processes)  # any worker missing (a fork that never connected) is asked for again
        large_room = max(1, settings.processes - 1)
        while self._waiting and self._idle:
            size, _, job = self._waiting[0]
            if job.done or job.started:
                heapq.heappop(self._waiting)
                continue
            large = size > settings.small_guide_bytes
            if large and self._large_running >= large_room:
                return  # the smallest waiting guide is large: every other one is too
            worker = self._idle.pop()
            if not worker.alive():
                self._replace(worker)
                continue
            heapq.heappop(self._waiting)
            job.started = True
            self._waiting_bytes -= job.size
            if large:
                self._large_running += 1
            asyncio.ensure_future(self._run(worker, job, large))

    async def _run(self, worker: _Worker, job: _Job, large: bool) -> None:
        budget = self.settings.budget_s
        started = time.monotonic()
        reply: Any = None
        timed_out = False
        try:
            wire.write(worker.writer, job.request)
            reply = await asyncio.wait_for(wire.read(worker.reader), budget)
        except asyncio.TimeoutError:
            timed_out = True
        except (ConnectionError, wire.WireError, ValueError):
            reply = None
        finally:
            if large:
                self._large_running -= 1
        elapsed = time.monotonic() - started
        self.counts["compiles"] += 1
        self.counts["compile_seconds"] += elapsed
        if timed_out:
            self.counts["over_budget"] += 1
            verdict: dict[str, Any] = {"refused": {"message": over_budget(budget), "place": ""}}
            self._replace(worker)
        elif not isinstance(reply, dict) or not ("accepted" in reply or "refused" in reply):
            self.counts["refused"] += 1
            verdict = {"refused": {"message": "cannot be enforced: the engine's compiler crashed compiling it", "place": ""}}
            self._replace(worker)
        else:
            verdict = {k: reply[k] for k in ("accepted", "refused") if k in reply}
            if "refused" in verdict:
                self.counts["refused"] += 1
            if reply.get("retire"):
                self._replace(worker)
            else:
                self._idle.append(worker)
        self._finish(job, verdict, cache=True)
        self._dispatch()

    def _publish(self) -> None:
        stats = self.cache.stats()
        self.stats.write(entries=stats.entries, bytes=stats.bytes, limit_bytes=stats.limit_bytes, hits=stats.hits,
                         misses=stats.misses, evictions=stats.evictions, workers=len(self._workers),
                         budget_s=self.settings.budget_s, **self.counts)


def main() -> None:
    from trtllm_truss.guides.compile_worker import die_with_parent

    raw = json.loads(sys.stdin.readline())
    settings = ServiceSettings(**{f.name: raw[f.name] for f in dataclasses.fields(ServiceSettings) if f.name in raw})
    logging.basicConfig(level=settings.log_level, stream=sys.stderr,
                        format="%(asctime)s guide-service %(levelname)s %(name)s: %(message)s")
    die_with_parent(signal.SIGTERM)
    if os.getppid() != raw.get("owner_pid", os.getppid()):
        return

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await CompileService(settings).run(stop)

    asyncio.run(serve())


if __name__ == "__main__":
    main()
