"""Run tritonserver: launch, await readiness, forward logs, restart on death, stop cleanly.

One process for world size 1; for TP*PP > 1 one `mpirun` with one tritonserver rank per GPU, flagged the
way NVIDIA's `scripts/launch_triton_server.py` (tensorrtllm_backend, TensorRT-LLM `triton_backend/`) does
it: rank 0 serves every model, ranks > 0 load only the engine model and join rank 0's executor (the
TensorRT-LLM backend's leader mode).

Readiness comes from Triton's own health endpoints (`/v2/health/ready` and `/v2/models/<m>/ready`), never
from grepping the log. The child runs in its own session so that stopping it can sweep everything it
started (python backend stubs, MPI ranks, which Open MPI puts in process groups of their own). It is
launched under `setpriv --pdeathsig` where available, so a parent killed without a chance to call
stop() (SIGKILL, OOM killer, a test timeout) does not leave tritonserver running with nobody to stop it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from trtllm_truss.config import child_env
from trtllm_truss.runtime.launch import LaunchSpec, TritonPorts, build_launch_command, choose_free_ports
from trtllm_truss.runtime.process_tree import (
    _children_of,
    _kill_session,
    _kill_session_and_wait,
    _remove_shm_regions,
)
from trtllm_truss.runtime.stub_health import StubSet, watch_stubs
from trtllm_truss.runtime.triton_logs import LogForwarder, _without_tables, triton_error_lines
from trtllm_truss.runtime.tritonserver_install import (
    BinaryCandidate,
    TritonInstallation,
    TritonInstallError,
    child_environment,
    locate_tritonserver,
    prepare_installation,
    verify_stub_environment,
)

logger = logging.getLogger(__name__)
# `typing.Self` is Python 3.11+; the package supports 3.10.
_ServerT = TypeVar("_ServerT", bound="TritonServer")

LOOPBACK = "127.0.0.1"
DEFAULT_READY_MODELS = ("ensemble",)
# Triton's words when its HTTP, GRPC or metrics service cannot bind ("Socket '0.0.0.0:N' already in use").
PORT_TAKEN = "already in use"
PORT_RETRIES = 3

__all__ = [
    "RestartPolicy",
    "ServerExit",
    "TritonInstallError",
    "TritonServer",
    "TritonStartupError",
]


class TritonStartupError(RuntimeError):
    """tritonserver died or did not become ready in time; the message carries Triton's own errors."""

    def __init__(self, message: str, *, returncode: int | None = None, log_tail: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.log_tail = list(log_tail)


@dataclass(frozen=True)
class RestartPolicy:
    """Restart a server that dies after it was once ready; startup failures are reported, not retried."""

    enabled: bool = True
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    # Restarted processes that die (or hang) before becoming ready, in a row, before giving up.
    max_consecutive_failures: int = 5
    ready_timeout_s: float = 600.0

    def backoff_s(self, consecutive_failures: int) -> float:
        return min(self.max_backoff_s, self.initial_backoff_s * (2 ** max(0, consecutive_failures - 1)))


@dataclass(frozen=True)
class ServerExit:
    """What listeners learn when tritonserver exits unexpectedly."""

    returncode: int | None
    generation: int  # which launch died (0 = the first)
    was_ready: bool
    will_restart: bool
    log_tail: tuple[str, ...]
    cause: str | None = None  # set when the supervisor ended it: a python-backend stub died (runtime.stub_health)


@dataclass
class _Child:
    process: subprocess.Popen[bytes]
    forwarder: LogForwarder
    generation: int
    started_at: float = field(default_factory=time.monotonic)
    ready: threading.Event = field(default_factory=threading.Event)
    exited: threading.Event = field(default_factory=threading.Event)
    will_restart: bool = False
    stubs: StubSet | None = None  # its python-backend stubs, recorded once ready (runtime.stub_health)
    stub_death: str | None = None

    @property
    def pid(self) -> int:
        return self.process.pid


# -------------------------------------------------------------------------------------------- server


class TritonServer:
    """A supervised tritonserver (or mpirun of tritonserver ranks) serving `repository`.

    URLs: `grpc_url` is `host:port` (what tritonclient.grpc takes); `http_url` and `metrics_url` carry
    the scheme. Use as a context manager to start, await readiness and stop.
    """

    def __init__(
        self,
        repository: Path,
        *,
        world_size: int = 1,
        binary: str | os.PathLike[str] | BinaryCandidate | None = None,
        ports: TritonPorts | None = None,
        env: Mapping[str, str] | None = None,
        work_dir: Path | None = None,
        ready_models: Sequence[str] = DEFAULT_READY_MODELS,
        startup_timeout_s: float = 600.0,
        restart: RestartPolicy = RestartPolicy(),
        log_prefix: str = "tritonserver",
        log_verbose: int = 0,
        stop_timeout_s: float = 15.0,
        mpirun: str = "mpirun",
        check_numpy: bool = True,
        on_exit: Callable[[ServerExit], None] | None = None,
        secrets: Iterable[str] = (),
        mpi_args: Sequence[str] = (),
        rank_prefix: Sequence[str] = (),
    ) -> None:
        self.repository = Path(repository).resolve()
        self.world_size = world_size
        self.ready_models = tuple(ready_models)
        self.startup_timeout_s = startup_timeout_s
        self.restart_policy = restart
        self.log_prefix = log_prefix
        self._binary_setting = binary
        self._env_overrides = dict(env or {})
        self._secret_values = tuple(secrets)  # besides those load_config remembered; see config.child_env
        self._ports = ports
        # Ports we chose may be taken by someone else before Triton binds them (it binds after loading
        # its models); those we can choose again, a user's we cannot.
        self._ports_are_ours = ports is None
        self._port_retries = 0
        self._work_dir = work_dir
        self._owns_work_dir = work_dir is None
        self._log_verbose = log_verbose
        self._stop_timeout_s = stop_timeout_s
        self._mpirun = mpirun
        self._check_numpy = check_numpy
        self._mpi_args = tuple(mpi_args)
        self._rank_prefix = tuple(rank_prefix)
        self._exit_listeners: list[Callable[[ServerExit], None]] = [on_exit] if on_exit else []

        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._child: _Child | None = None
        self._monitor: threading.Thread | None = None
        self._spec: LaunchSpec | None = None
        self._child_env: dict[str, str] | None = None
        self._installation: TritonInstallation | None = None
        self._restarts = 0
        self._ever_ready = False
        self._gave_up: ServerExit | None = None
        self._spawn_error: BaseException | None = None

    # ----------------------------------------------------------------------------- public surface

    @property
    def ports(self) -> TritonPorts:
        if self._ports is None:
            raise RuntimeError("ports are chosen by start(); call it first")
        return self._ports

    @property
    def grpc_url(self) -> str:
        return f"{LOOPBACK}:{self.ports.grpc}"

    @property
    def http_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.http}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.metrics}/metrics"

    @property
    def restarts(self) -> int:
        return self._restarts

    @property
    def generation(self) -> int:
        """Increments on every launch; a client seeing it change knows its streams died with the server."""
        child = self._child
        return child.generation if child else -1

    @property
    def pid(self) -> int | None:
        """PID of tritonserver (or of mpirun for world size > 1)."""
        child = self._child
        return child.pid if child else None

    @property
    def command(self) -> list[str]:
        """The tritonserver (or mpirun) command line."""
        if self._spec is None:
            raise RuntimeError("the command is built by start(); call it first")
        return build_launch_command(self._spec)

    @property
    def installation(self) -> TritonInstallation | None:
        return self._installation

    @property
    def alive(self) -> bool:
        child = self._child
        return child is not None and child.process.poll() is None

    @property
    def failed(self) -> ServerExit | None:
        """Set when the server died and will not be restarted (policy off, or restarts kept failing)."""
        return self._gave_up

    def add_exit_listener(self, listener: Callable[[ServerExit], None]) -> None:
        """`listener` runs (on the monitor thread) whenever tritonserver exits while not being stopped."""
        self._exit_listeners.append(listener)

    def log_tail(self, n: int = 50) -> list[str]:
        child = self._child
        return child.forwarder.tail(n) if child else []

    def start(self) -> TritonServer:
        """Locate and prepare tritonserver, check its python environment, launch it (not awaited)."""
        with self._lock:
            if self._child is not None:
                raise RuntimeError("this TritonServer was already started; create a new one to start again")
            try:
                self._launch()
            except BaseException:
                if self._owns_work_dir and self._work_dir is not None:
                    shutil.rmtree(self._work_dir, ignore_errors=True)
                    self._work_dir = None
                raise
        return self

    def _launch(self) -> None:
        if not self.repository.is_dir():
            raise TritonStartupError(f"model repository {self.repository} does not exist")
        base_env = {**os.environ, **self._env_overrides}
        if isinstance(self._binary_setting, BinaryCandidate):  # already located by the caller
            located = self._binary_setting
        else:
            located = locate_tritonserver(self._binary_setting, base_env)
        if self._work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix="trtllm-truss-triton-"))
        self._installation = prepare_installation(located, self._work_dir)
        # No credential reaches tritonserver, its MPI ranks (mpirun hands them its environment) or the python
        # backend stubs (forked by tritonserver): all of them can be read in /proc/<pid>/environ.
        self._child_env = child_environment(
            self._installation, child_env.child_environment(base_env, secrets=self._secret_values)
        )
        if self._check_numpy:
            verify_stub_environment(self._child_env, self._installation)
        if self.world_size > 1 and shutil.which(self._mpirun, path=self._child_env.get("PATH")) is None:
            raise TritonInstallError(
                f"world size {self.world_size} needs `{self._mpirun}` (Open MPI) on PATH; it was not found"
            )
        if self._ports is None:
            self._ports = choose_free_ports()
        exit_timeout_s = max(1, int(self._stop_timeout_s) - 5)
        self._spec = LaunchSpec(
            binary=self._installation.binary,
            repository=self.repository,
            backend_dir=self._installation.backend_dir,
            ports=self._ports,
            world_size=self.world_size,
            shm_prefix=f"trtllm_truss_{uuid.uuid4().hex[:12]}_",
            log_verbose=self._log_verbose,
            exit_timeout_s=exit_timeout_s,
            mpirun=self._mpirun,
            # A prefix command rather than a preexec_fn, which is unsafe in a process with threads.
            setpriv=shutil.which("setpriv"),
            mpi_args=self._mpi_args,
            rank_prefix=self._rank_prefix,
        )
        logger.info(
            "starting tritonserver from %s (%s), world size %d, repository %s, ports http %d grpc %d metrics %d",
            self._installation.binary, located.source, self.world_size, self.repository,
            self._ports.http, self._ports.grpc, self._ports.metrics,
        )
        spawned = threading.Event()
        self._monitor = threading.Thread(
            target=self._supervise, args=(spawned,), name=f"{self.log_prefix}-monitor", daemon=True
        )
        self._monitor.start()
        spawned.wait()
        if self._spawn_error is not None:
            raise self._spawn_error

    def wait_ready(self, timeout_s: float | None = None, models: Sequence[str] | None = None) -> None:
        """Block until Triton and `models` report ready. Raises TritonStartupError if tritonserver dies
        (and will not be restarted) or `timeout_s` passes; the message has Triton's errors and log tail."""
        models = self.ready_models if models is None else tuple(models)
        timeout_s = self.startup_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            child = self._child
            if child is None:
                raise RuntimeError("wait_ready() before start()")
            if self._stopping.is_set():
                raise TritonStartupError("tritonserver was stopped while waiting for it to become ready")
            running = child.process.poll() is None
            if running and self._probe_ready(models, child):
                return
            if child.exited.is_set() and not child.will_restart:
                raise self._startup_error(child, models, died=True)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._startup_error(child, models, died=False, timeout_s=timeout_s)
            # A running child's exit wakes us at once; a dead one's successor is awaited by polling.
            (child.exited if running else self._stopping).wait(min(0.2, remaining))

    def ready(self, models: Sequence[str] | None = None) -> bool:
        """Triton is live and ready and so is each of `models` (default: the ensemble), and none of its
        python-backend stubs has died (Triton's own readiness does not say: runtime.stub_health)."""
        child = self._child
        if child is None or child.process.poll() is not None:
            return False
        if child.stubs is not None and child.stubs.dead():
            return False
        return self._probe_ready(self.ready_models if models is None else tuple(models), child)

    def stop(self) -> None:
        """SIGTERM, wait, then SIGKILL everything the child started. Idempotent; no restart after this."""
        with self._lock:
            self._stopping.set()
            child = self._child
        if child is not None:
            self._terminate(child)
        monitor = self._monitor
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join(timeout=self._stop_timeout_s + 10)
        if self._spec is not None:
            _remove_shm_regions(self._spec.shm_prefix)
        if self._owns_work_dir and self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)

    def __enter__(self: _ServerT) -> _ServerT:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------- internals

    def _spawn(self, generation: int) -> _Child:
        assert self._spec is not None and self._child_env is not None
        command = build_launch_command(self._spec)
        logger.debug("launching: %s", " ".join(command))
        process = subprocess.Popen(
            command,
            env=self._child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session: stop() can sweep stubs and MPI ranks
        )
        assert process.stdout is not None
        forwarder = LogForwarder(process.stdout, self.log_prefix)
        forwarder.start()
        child = _Child(process=process, forwarder=forwarder, generation=generation)
        threading.Thread(
            target=watch_stubs, name=f"{self.log_prefix}-stubs-{generation}", daemon=True,
            args=(child.pid, child.ready, child.exited, lambda: self._stopping.is_set() or process.poll() is not None,
                  lambda stubs: setattr(child, "stubs", stubs), lambda dead: self._stub_died(child, dead)),
        ).start()
        return child

    def _stub_died(self, child: _Child, dead: list[str]) -> None:
        """A stub of a ready server died: Triton never starts it again, so the server is ended (SIGKILL: a
        SIGTERM would wait out the exit timeout for the requests the stub held) and restarted by the monitor."""
        with self._lock:
            if self._stopping.is_set() or child.process.poll() is not None:
                return
            child.stub_death = f"the python-backend stub of {', '.join(dead)} died"
        logger.error("%s and Triton does not start stubs again: ending tritonserver (pid %d)", child.stub_death, child.pid)
        _kill_session(child.pid, signal.SIGKILL)

    def _probe_ready(self, models: Sequence[str], child: _Child) -> bool:
        paths = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in models)]
        for path in paths:
            try:
                with urllib.request.urlopen(self.http_url + path, timeout=2.0) as response:
                    if response.status != 200:
                        return False
            except (urllib.error.URLError, OSError):
                return False
        if not child.ready.is_set():
            child.ready.set()
            self._ever_ready = True
        return True

    def _startup_error(self, child: _Child, models: Sequence[str], *, died: bool, timeout_s: float = 0.0):
        if died:
            child.forwarder.join(timeout=5)  # drain the pipe: Triton's last words are the useful ones
        tail = child.forwarder.tail()
        errors = triton_error_lines(tail)
        target = ", ".join(models) if models else "the server"
        if died:
            head = (
                f"tritonserver exited with code {child.process.returncode} before {target} became ready "
                f"(repository {self.repository})"
            )
        else:
            head = f"tritonserver did not make {target} ready within {timeout_s:.0f}s (repository {self.repository})"
        parts = [head]
        if errors:
            parts.append("Triton's errors:\n" + "\n".join(f"  {line}" for line in errors[-20:]))
        parts.append("Last log lines:\n" + "\n".join(f"  {line}" for line in _without_tables(tail)[-30:]))
        return TritonStartupError("\n".join(parts), returncode=child.process.returncode, log_tail=tail)

    def _terminate(self, child: _Child) -> None:
        process = child.process
        if process.poll() is None:
            # With mpirun, SIGTERM the ranks themselves: each shuts Triton down gracefully and mpirun
            # exits when they have. (mpirun's own SIGTERM handling SIGKILLs its ranks after a fixed wait.)
            targets = _children_of(child.pid) if self.world_size > 1 else []
            for pid in targets or [child.pid]:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            try:
                process.wait(timeout=self._stop_timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("tritonserver (pid %d) ignored SIGTERM for %.0fs; killing it", child.pid, self._stop_timeout_s)
        _kill_session_and_wait(child.pid)
        process.wait()

    def _supervise(self, spawned: threading.Event) -> None:
        """Monitor thread: launch, notice deaths, notify listeners, restart with backoff.

        Every launch happens on this thread because a parent-death signal fires when the *thread* that
        forked the child ends; this thread lives exactly as long as there is a child to supervise.
        """
        try:
            self._child = self._spawn(generation=0)
        except Exception as exc:  # noqa: BLE001 -- start() re-raises it (e.g. binary not executable)
            self._spawn_error = exc
            return
        finally:
            spawned.set()
        consecutive_failures = 0
        while True:
            child = self._child
            assert child is not None
            child.process.wait()
            # Orphans (stubs, other ranks) would hold the ports and shm the next launch needs.
            _kill_session_and_wait(child.pid)
            child.forwarder.join(timeout=5)
            assert self._spec is not None
            _remove_shm_regions(self._spec.shm_prefix)
            was_ready = child.ready.is_set()
            if not self._stopping.is_set() and self._retry_on_fresh_ports(child):
                continue
            consecutive_failures = 0 if was_ready else consecutive_failures + 1
            stopping = self._stopping.is_set()
            will_restart = (
                not stopping
                and self.restart_policy.enabled
                and self._ever_ready
                and consecutive_failures <= self.restart_policy.max_consecutive_failures
            )
            child.will_restart = will_restart
            child.exited.set()
            if stopping:
                return
            event = ServerExit(
                returncode=child.process.returncode,
                generation=child.generation,
                was_ready=was_ready,
                will_restart=will_restart,
                log_tail=tuple(child.forwarder.tail(50)),
                cause=child.stub_death,
            )
            logger.error(
                "tritonserver (pid %d) exited with code %s%s%s",
                child.pid, child.process.returncode, f" ({child.stub_death})" if child.stub_death else "",
                "; restarting" if will_restart else "",
            )
            for line in triton_error_lines(event.log_tail)[-10:]:
                logger.error("  %s", line)
            for listener in list(self._exit_listeners):
                try:
                    listener(event)
                except Exception:  # a broken listener must not stop supervision
                    logger.exception("tritonserver exit listener failed")
            if not will_restart:
                self._gave_up = event
                return
            if self._stopping.wait(self.restart_policy.backoff_s(max(1, consecutive_failures))):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                self._restarts += 1
                self._child = self._spawn(generation=child.generation + 1)
                restarted = self._child
            logger.info("tritonserver restarted (restart %d, pid %d)", self._restarts, restarted.pid)
            self._await_restart_ready(restarted)

    def _retry_on_fresh_ports(self, child: _Child) -> bool:
        """Relaunch on newly chosen ports when a first start lost one of ours to another process."""
        if (
            self._ever_ready
            or not self._ports_are_ours
            or self._port_retries >= PORT_RETRIES
            or not any(PORT_TAKEN in line for line in child.forwarder.tail(50))
        ):
            return False
        assert self._spec is not None and self._ports is not None
        self._port_retries += 1
        taken = self._ports
        with self._lock:
            if self._stopping.is_set():
                return False
            self._ports = choose_free_ports()
            self._spec = dataclasses.replace(self._spec, ports=self._ports)
            logger.warning(
                "tritonserver lost a port to another process (http %d grpc %d metrics %d); starting again on"
                " http %d grpc %d metrics %d", taken.http, taken.grpc, taken.metrics,
                self._ports.http, self._ports.grpc, self._ports.metrics,
            )
            self._child = self._spawn(generation=child.generation + 1)
        child.will_restart = True
        child.exited.set()
        return True

    def _await_restart_ready(self, child: _Child) -> None:
        """Marks a restarted child ready (so a later death restarts again); kills it if it hangs."""
        deadline = time.monotonic() + self.restart_policy.ready_timeout_s
        while not self._stopping.is_set() and not child.exited.is_set() and child.process.poll() is None:
            if self._probe_ready(self.ready_models, child):
                logger.info("tritonserver ready again after restart %d", self._restarts)
                return
            if time.monotonic() > deadline:
                logger.error("restarted tritonserver not ready within %.0fs; killing it", self.restart_policy.ready_timeout_s)
                _kill_session(child.pid, signal.SIGKILL)
                return
            self._stopping.wait(0.2)
