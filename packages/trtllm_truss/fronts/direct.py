"""The direct front: our own HTTP server in N processes on one port (`trtllm-truss serve DIR --front direct`,
truss's `docker_server`), so the HTTP layer scales with cores instead of truss's one event-loop thread.

Who owns what:

| process | owns |
|---|---|
| launcher (this module, `DirectFront`) | the stack (`runtime.stack.start_stack`: artifacts, repository, tritonserver and its supervisor, which restarts it), the engine probe, the listening socket, the shared state file (`fronts.replica_state`), the frontends (started, restarted when they die, stopped), readiness of the stack written for all |
| frontend `i` (`fronts.direct_app`, N of them) | its uvicorn server accepting from the shared socket (the lowest frontend with room first: `fronts.accept`), its request core and dialects (`serving/`), on the same event loop its tokenizer, gRPC streams to the engine and detokenizer (`streaming.in_process`), its slot of admission and its metrics array |
| stream workers (only with `runtime.direct_front.stream_worker_processes`: W per frontend) | as under truss's server (`streaming.worker`); they exit when their frontend's socket closes |
| guide compile service (`guides.compile_service`, started by the launcher) | the replica's one bound on guide compiles, its compile processes and its cache of checked guides: every frontend asks it over a Unix socket before a guided request is queued (`runtime.guides`) |
| tritonserver, stubs | as under truss's server (`runtime/`), in their own session |

Nothing is relayed between processes per request: a frontend talks to tritonserver itself (or through
its own workers). What must be one per replica is shared memory, not a hop: the admission bound (`SharedAdmission`:
a request beyond `max_in_flight` of the whole replica is a 429 whichever frontend takes it), the metrics
(every frontend's `/metrics` shows the sum of all arrays), readiness (the launcher writes the stack's
state; each frontend answers 503 while tritonserver is down, as well as while its own streaming is).

Stop (SIGTERM or SIGINT to the launcher; Ctrl-C also reaches the frontends and workers directly): every
frontend gets SIGTERM, ends its open streams with an error (and kills its workers, if any) and exits once its
responses are out (at most `direct_app.GRACEFUL_SHUTDOWN_S`); one still running after `FRONTEND_STOP_S` is
killed; then the engine probe and tritonserver stop (`RunningStack.stop`). A frontend whose launcher dies
without a word gets SIGTERM from the kernel (parent-death signal), like tritonserver (`setpriv --pdeathsig`).
Secrets stay in the launcher: frontends get the environment of `streaming.environment` (`config.child_env`'s,
no credentials) and the API key over a pipe, and their stream workers (if any) inherit their (clean)
environment.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

FRONTEND_START_TIMEOUT_S = 180.0
FRONTEND_STOP_S = 10.0
MONITOR_INTERVAL_S = 0.25
DEFAULT_PORT = 8000
PACKAGES_DIR = Path(__file__).resolve().parents[2]  # holds trtllm_truss: on the frontends' PYTHONPATH


class DirectFrontError(RuntimeError):
    pass


def default_frontend_count(cpu_count: int | None = None) -> int:
    """One frontend per 4 cores (the engine, tritonserver, the stubs and the stream workers need the
    rest), 1 to 16."""
    cpus = cpu_count or os.cpu_count() or 1
    return max(1, min(16, cpus // 4))


def fill_connections(configured: int | None, stream_interval: int) -> int:
    """Open connections a frontend takes before the next one takes any (`fronts.accept`; 0: the kernel
    spreads them). Default: 8 per step of `stream_interval`, i.e. about 4,000 engine responses a second
    per frontend at 2 ms steps, which one frontend carried within issue 31's goals on the 32-core host
    (32 streams at interval 4: docs/performance.md)."""
    return 8 * stream_interval if configured is None else configured


def http_implementation(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """uvicorn's HTTP parser and event loop: httptools and uvloop where installed (measured faster:
    docs/performance.md, "Direct front"), else h11 and asyncio. TRTLLM_TRUSS_DIRECT_HTTP (h11, httptools)
    and TRTLLM_TRUSS_DIRECT_LOOP (asyncio, uvloop) choose them, for measuring."""
    import importlib.util

    environ = os.environ if environ is None else environ
    http = environ.get("TRTLLM_TRUSS_DIRECT_HTTP") or ("httptools" if importlib.util.find_spec("httptools") else "h11")
    loop = environ.get("TRTLLM_TRUSS_DIRECT_LOOP") or ("uvloop" if importlib.util.find_spec("uvloop") else "asyncio")
    if http not in ("h11", "httptools") or loop not in ("asyncio", "uvloop"):
        raise DirectFrontError(f"TRTLLM_TRUSS_DIRECT_HTTP={http!r} / TRTLLM_TRUSS_DIRECT_LOOP={loop!r}: expected"
                               " h11|httptools and asyncio|uvloop")
    return http, loop


def resolve_api_key(secret_name: str | None, secrets: Mapping[str, Any] | None, environ: Mapping[str, str]) -> str | None:
    """The value of the truss secret `secret_name` as truss resolves it (the `secrets` mapping, then
    TRUSS_SECRET_<name>, then /secrets/<name>); a named secret with no value is an error."""
    if secret_name is None:
        return None
    from trtllm_truss.config.secrets import SECRET_ENV_PREFIX, secret_value

    value = secret_value(secret_name, secrets, environ)
    if value is None:
        raise DirectFrontError(
            f"model_metadata.trt_llm.runtime.direct_front.api_key_secret: the secret {secret_name!r} has no value"
            f" (set it in the deployment's secrets, or {SECRET_ENV_PREFIX}{secret_name} locally)"
        )
    return value


class DirectFront:
    """The launcher: `start()` brings the stack and the frontends up, `monitor()` keeps them so until
    `stop()`."""

    def __init__(
        self,
        truss_dir: Path | str,
        *,
        host: str = "0.0.0.0",
        port: int = DEFAULT_PORT,
        secrets: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        repository_dir: Path | None = None,
        ports: Any = None,
        startup_timeout_s: float | None = None,
    ) -> None:
        self.truss_dir = Path(truss_dir)
        self.host, self.port = host, port
        self._secrets = secrets
        self._environ = os.environ if environ is None else environ
        self._repository_dir = repository_dir
        self._ports = ports
        self._startup_timeout_s = startup_timeout_s
        self.stack: Any = None
        self.state: Any = None
        self._probe: Any = None
        self._guides: Any = None  # guides.compile_client.GuideService
        self._socket: socket.socket | None = None
        self._work_dir: Path | None = None
        self._frontends: list[subprocess.Popen | None] = []
        self._settings: list[Any] = []
        self.frontend_restarts = 0
        self._stop_lock = threading.Lock()
        self._stopping = False

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def frontend_pids(self) -> list[int]:
        return [p.pid for p in self._frontends if p is not None and p.poll() is None]

    # --- start ----------------------------------------------------------------------------------------

    def start(self, progress: Callable[[str], None] | None = None) -> None:
        progress = progress or (lambda _: None)
        try:
            self._start(progress)
        except BaseException:
            self.stop()
            raise

    def _start(self, progress: Callable[[str], None]) -> None:
        from trtllm_truss.config.errors import known_secret_values
        from trtllm_truss.engine.tokenizer import ensure_tokenizer_json
        from trtllm_truss.fronts.direct_app import FrontendSettings
        from trtllm_truss.fronts.replica_state import ReplicaState
        from trtllm_truss.fronts.service import guide_service, max_in_flight
        from trtllm_truss.streaming.pool import default_worker_count

        # The socket first: a port in use should cost a second, not an engine start.
        self._socket = _listen(self.host, self.port)
        self.port = self._socket.getsockname()[1]
        self.stack = self._start_stack(progress)
        if self.stack.is_worker_node:
            raise DirectFrontError("this node runs model ranks only (node_count > 1): serve the direct front on node 0")
        plan = self.stack.plan
        front = plan.runtime.direct_front
        api_key = resolve_api_key(front.api_key_secret, self._secrets, self._environ)
        from trtllm_truss.fronts.store_setup import open_deployment_store, store_url

        url = store_url(plan.runtime.store, self._secrets, self._environ)
        store = open_deployment_store(plan.runtime.store, url, metrics=False)  # made (or checked) once, here
        if store is not None:
            store.close()
        ensure_tokenizer_json(plan.tokenizer_dir, trust_remote_code=plan.runtime.trust_remote_code)
        frontends = front.processes or default_frontend_count()
        fill = fill_connections(front.fill_connections, plan.runtime.stream_interval) if frontends > 1 else 0
        per_frontend = 0  # each frontend streams on its own event loop
        if front.stream_worker_processes:
            workers = plan.runtime.stream_workers or default_worker_count()
            per_frontend = max(1, -(-workers // frontends))  # the workers' total, spread over the frontends
        self._work_dir = Path(tempfile.mkdtemp(prefix="trtllm-truss-direct-", dir=_shm_dir()))
        self.state = ReplicaState.create(self._work_dir / "replica", frontends=frontends,
                                         max_in_flight=max_in_flight(plan))
        self._guides = guide_service(plan, self._environ, directory=str(self._work_dir / "guides"))
        if self._guides is not None:
            progress("starting the guide compile service")
            self._guides.start(wait=False)  # warms up while the probe and the frontends start
        self._start_probe(plan)
        server = self.stack.server
        server.add_exit_listener(self._tritonserver_exited)
        http, loop = http_implementation(self._environ)
        self._settings = [
            FrontendSettings(
                index=i, launcher_pid=os.getpid(), socket_fd=self._socket.fileno(), state_path=str(self.state.path),
                plan=plan, grpc_url=server.grpc_url, stream_workers=per_frontend, api_key=api_key,
                secret_values=known_secret_values(), http=http, loop=loop, fill_connections=fill, store_url=url,
                log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()),
                guides=self._guides.settings if self._guides is not None else None, **self._frontend_extra(),
            )
            for i in range(frontends)
        ]
        if self._guides is not None:
            self._guides.wait_ready()
        progress(f"starting {frontends} frontend process(es), {per_frontend or 'no'} stream worker(s) each")
        self._frontends = [self._spawn(settings) for settings in self._settings]
        self._wait_frontends(range(frontends))
        # Ready only now: a frontend up before the others would otherwise answer ready while a stop
        # could still find the launcher starting.
        self.state.stack_ready = bool(server.alive and server.ready())
        logger.info("direct front on %s: %d frontends (%s, %s), %s stream workers each, up to %d requests in flight,"
                    " %s", self.url, frontends, http, loop, per_frontend or "no", self.state.max_in_flight,
                    f"each filled up to {fill} connections before the next" if fill else "connections spread by the kernel")

    def _start_stack(self, progress: Callable[[str], None]) -> Any:
        """What the frontends stream from (a fleet's front starts its replicas instead: fronts.fleet)."""
        from trtllm_truss.runtime.stack import start_stack

        return start_stack(
            self.truss_dir, secrets=self._secrets, environ=self._environ, repository_dir=self._repository_dir,
            ports=self._ports, startup_timeout_s=self._startup_timeout_s, progress=progress,
        )

    def _frontend_extra(self) -> dict[str, Any]:
        """More FrontendSettings fields (a fleet's front: how to reach the fleet)."""
        return {}

    def _start_probe(self, plan: Any) -> None:
        if not plan.runtime.health.enabled:
            return
        from trtllm_truss.engine.health import stack_probe

        self._probe = stack_probe(self.stack.server.grpc_url, self.stack.repository_dir, plan)
        self._probe.start()

    def _spawn(self, settings: Any) -> subprocess.Popen:
        from trtllm_truss.streaming.environment import worker_environment

        env = worker_environment(os.environ)
        process = subprocess.Popen(
            [sys.executable, "-m", "trtllm_truss.fronts.direct_app"],
            stdin=subprocess.PIPE, env=env, pass_fds=(settings.socket_fd,),
        )
        assert process.stdin is not None
        try:
            process.stdin.write(pickle.dumps(settings))
            process.stdin.close()
        except BrokenPipeError:
            pass  # it died at once; _wait_frontends says so
        return process

    def _wait_frontends(self, indices: Any) -> None:
        pending = {i: self._frontends[i] for i in indices}
        deadline = time.monotonic() + FRONTEND_START_TIMEOUT_S
        while pending:
            for i, process in list(pending.items()):
                if process is not None and self.state.frontend_pid(i) == process.pid:
                    del pending[i]
                elif process is None or process.poll() is not None:
                    code = None if process is None else process.returncode
                    raise DirectFrontError(f"frontend {i} exited with {code} while starting (see its log above)")
            if time.monotonic() > deadline:
                raise DirectFrontError(f"frontends {sorted(pending)} not up within {FRONTEND_START_TIMEOUT_S:g} s")
            time.sleep(0.05)  # polling a pid written by another process

    # --- keep running ---------------------------------------------------------------------------------

    def _tritonserver_exited(self, event: Any) -> None:
        if self.state is not None:
            self.state.stack_ready = False  # at once, not at the next monitor turn
            if not getattr(event, "will_restart", True):
                self.state.stack_failed = True

    def check(self) -> bool:
        """One turn of the monitor: the stack's readiness written for the frontends, dead frontends
        started again. False once tritonserver died and could not be restarted."""
        server = self.stack.server
        if server.failed is not None:
            self.state.stack_ready, self.state.stack_failed = False, True
            return False
        probe = self._probe
        self.state.stack_ready = bool(server.alive and server.ready() and (probe is None or probe.healthy))
        for i, process in enumerate(self._frontends):
            if process is not None and process.poll() is not None and not self._stopping:
                logger.warning("frontend %d exited with %s; starting it again", i, process.returncode)
                self.state.frontend_exited(i)
                self._frontends[i] = self._spawn(self._settings[i])
                self.frontend_restarts += 1
        return True

    def monitor(self, stop: threading.Event) -> bool:
        """Until `stop` is set (True) or tritonserver is lost for good (False)."""
        while not stop.wait(MONITOR_INTERVAL_S):
            if not self.check():
                return False
        return True

    # --- stop -----------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Frontends (and with them their stream workers), then the probe and the stack; idempotent."""
        with self._stop_lock:
            self._stopping = True
            live = [p for p in self._frontends if p is not None and p.poll() is None]
            for process in live:
                _signal(process, signal.SIGTERM)
            deadline = time.monotonic() + FRONTEND_STOP_S
            for process in live:
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    logger.warning("frontend pid %d still running %g s after SIGTERM; killing it", process.pid, FRONTEND_STOP_S)
                    _signal(process, signal.SIGKILL)
                    process.wait()
            self._frontends = []
            if self._probe is not None:
                self._probe.stop()
                self._probe = None
            if self._guides is not None:
                self._guides.stop()
                self._guides = None
            if self.stack is not None:
                self.stack.stop()
                self.stack = None
            if self._socket is not None:
                self._socket.close()
                self._socket = None
            if self.state is not None:
                self.state.close()
                self.state = None
            if self._work_dir is not None:
                shutil.rmtree(self._work_dir, ignore_errors=True)
                self._work_dir = None


def _signal(process: subprocess.Popen, signum: int) -> None:
    try:
        process.send_signal(signum)
    except ProcessLookupError:
        pass


def _listen(host: str, port: int) -> socket.socket:
    """The one listening socket every frontend accepts from (inherited, so the kernel hands each
    connection to one frontend that is waiting in accept)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise DirectFrontError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _shm_dir() -> str | None:
    """/dev/shm where it is writable (the shared file stays in memory), else the temporary directory."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def start_direct_server(
    truss_dir: Path, log_path: Path, env: Mapping[str, str] | None = None, port: int | None = None
) -> Any:
    """`trtllm-truss serve TRUSS_DIR --front direct` as a child process in its own session, with the same
    handle as truss's server run locally (`fronts.truss_server.TrussServer`: wait_ready, descendants,
    stop); for the bench and the tests."""
    from trtllm_truss.fronts.truss_server import TrussServer, free_port

    port = port or free_port()
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGES_DIR), child_env.get("PYTHONPATH", "")) if p)
    # The stub of Triton's python backend embeds the first python3 on PATH: make it this interpreter's.
    child_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{child_env.get('PATH', '')}"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "trtllm_truss.cli", "serve", str(truss_dir), "--front", "direct",
         "--host", "127.0.0.1", "--port", str(port)],
        env=child_env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,  # one process group: stop() reaches everything
    )
    log.close()
    return TrussServer(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)
