"""Starting the guide compile service (`guides.compile_service`), and asking it about guides.

`GuideService` is the owner's handle: truss's server (`fronts.service.LLMService`) and the direct front's
launcher (`fronts.direct.DirectFront`) each start one per replica, from a thread that lives as long as it
(the service's parent-death signal follows that thread) and starts the service again if it dies (an exit
with 0 is its answer to SIGTERM or SIGINT, e.g. to the owner's process group: then it stays stopped).
`GuideServiceClient` is a frontend's side: one connection per event loop, many guides in flight on it,
and the service's counts read from its stats file for `/metrics`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trtllm_truss.guides import wire
from trtllm_truss.guides.compile_service import ServiceSettings, read_stats

log = logging.getLogger(__name__)

START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 5.0
RESTART_DELAY_S = 1.0
ANSWER_MARGIN_S = 10.0  # beyond the budget and the wait, before a silent service is given up on


class GuideServiceUnavailable(RuntimeError):
    """The service did not answer (it is starting again): the request is a 503."""


class GuideService:
    """The compile service of one replica: `start()` (blocks until it is ready), `stop()`."""

    def __init__(self, settings: ServiceSettings, environ: Mapping[str, str] | None = None, *,
                 owns_directory: bool = False) -> None:
        self.settings = settings
        self._owns_directory = owns_directory
        self._environ = dict(os.environ if environ is None else environ)
        self._process: subprocess.Popen | None = None
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: str | None = None
        self.restarts = 0

    @classmethod
    def in_temporary_directory(cls, environ: Mapping[str, str] | None = None, **settings: Any) -> GuideService:
        """A service whose sockets live in a new directory (in /dev/shm where writable), removed at stop."""
        shm = Path("/dev/shm")
        parent = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
        directory = tempfile.mkdtemp(prefix="trtllm-truss-guides-", dir=parent)
        return cls(ServiceSettings(directory=directory, **settings), environ, owns_directory=True)

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def client(self) -> GuideServiceClient:
        return GuideServiceClient(self.settings)

    def start(self, timeout_s: float = START_TIMEOUT_S, *, wait: bool = True) -> None:
        """Start it; `wait`: until it is ready (else call `wait_ready`)."""
        Path(self.settings.directory).mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._keep, name="guide-service", daemon=True)
        self._thread.start()
        if wait:
            self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until its compile processes are up; raises RuntimeError (and stops it) if it cannot start."""
        if not self._ready.wait(timeout_s) or self._failure is not None:
            reason = self._failure or f"not ready within {timeout_s:g} s"
            self.stop()
            raise RuntimeError(f"the guide compile service did not start: {reason}")

    def _command(self) -> tuple[list[str], dict[str, str]]:
        from trtllm_truss.config.child_env import child_environment

        env = child_environment(self._environ)
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")  # the compile parent forks: no tokenizer threads
        env.setdefault("OMP_NUM_THREADS", "1")
        return [sys.executable, "-m", "trtllm_truss.guides.compile_service"], env

    def _keep(self) -> None:
        """Start the service, wait for its "ready", and start it again whenever it dies (until stop)."""
        command, env = self._command()
        line = json.dumps({**dataclasses.asdict(self.settings), "owner_pid": os.getpid()}) + "\n"
        while not self._stopping.is_set():
            # In the owner's process group: whatever stops the group (a test harness, the launcher's stop) stops it.
            process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self._process = process
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(line.encode())
                process.stdin.close()
            except BrokenPipeError:
                pass
            for output in process.stdout:
                if output.strip() == b"ready":
                    self._ready.set()
            code = process.wait()
            if self._stopping.is_set() or code == 0:  # 0: it was told to stop (a signal to the process group)
                return
            if not self._ready.is_set():
                self._failure = f"it exited with {code} while starting (see its log above)"
                self._ready.set()
                return
            log.warning("the guide compile service exited with %s; starting it again", code)
            self.restarts += 1
            time.sleep(RESTART_DELAY_S)

    def stop(self) -> None:
        self._stopping.set()
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(STOP_TIMEOUT_S)
        if self._owns_directory:
            shutil.rmtree(self.settings.directory, ignore_errors=True)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.waiting: dict[int, asyncio.Future] = {}
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            while True:
                message = await wire.read(self.reader)
                if message is None:
                    break
                future = self.waiting.pop(message.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(message)
        except (ConnectionError, wire.WireError, ValueError):
            pass
        finally:
            self.writer.close()
            for future in self.waiting.values():
                if not future.done():
                    future.set_exception(GuideServiceUnavailable("the guide compile service closed the connection"))
            self.waiting.clear()

    @property
    def open(self) -> bool:
        return not self.task.done() and not self.writer.is_closing()


class GuideServiceClient:
    """A frontend's side of the service (settings as the owner started it)."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self._ids = itertools.count()
        # id(loop) -> the connection of that event loop, or the task opening it (its callers share it)
        self._connections: dict[int, asyncio.Task[_Connection]] = {}

    @property
    def budget_s(self) -> float:
        return self.settings.budget_s

    async def _open(self) -> _Connection:
        try:
            reader, writer = await asyncio.open_unix_connection(self.settings.socket_path, limit=1 << 20)
        except OSError as exc:
            raise GuideServiceUnavailable(f"the guide compile service is not reachable: {exc.strerror or exc}") from None
        return _Connection(reader, writer)

    async def _connection(self) -> _Connection:
        """The event loop's one connection: opened by the first caller, every caller meanwhile waits for that
        one (two would leave one without a reference, its reader task collected while requests wait on it)."""
        loop = asyncio.get_running_loop()
        opening = self._connections.get(id(loop))
        if opening is not None and opening.done() and (opening.cancelled() or opening.exception() is not None
                                                         or not opening.result().open):
            opening = None
        if opening is None:
            opening = self._connections[id(loop)] = loop.create_task(self._open())
        return await asyncio.shield(opening)

    async def check(self, guide_type: str, guide: str | None, strict: bool) -> dict[str, Any]:
        """The service's verdict: {"accepted": {...}} | {"refused": {...}} | {"busy": {...}}; raises
        GuideServiceUnavailable when it does not answer."""
        connection = await self._connection()
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        connection.waiting[request_id] = future
        try:
            wire.write(connection.writer, {"id": request_id, "type": guide_type, "guide": guide, "strict": strict})
            limit = self.settings.budget_s + self.settings.waiting_s + ANSWER_MARGIN_S
            return await asyncio.wait_for(future, limit)
        except asyncio.TimeoutError:
            raise GuideServiceUnavailable("the guide compile service did not answer in time") from None
        except ConnectionError as exc:
            raise GuideServiceUnavailable(f"the guide compile service is not reachable: {exc}") from None
        finally:
            connection.waiting.pop(request_id, None)

    def stats(self) -> dict[str, float]:
        return read_stats(self.settings.stats_path)
