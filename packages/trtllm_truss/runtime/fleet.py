"""The replicas of a fleet on this host: N `runtime.fleet_replica` processes, started, kept and stopped.

Each replica is one process (its stack and its Dynamo worker; see `runtime.fleet_replica`) in its own
process group, on its GPUs (CUDA_VISIBLE_DEVICES from the fleet's plan; none on CPU) and its Triton ports.
A replica that exits is started again (same index, same GPUs, same ports: it rejoins the fleet as a new
Dynamo instance) unless the fleet is stopping; `stop_replica(i)` / `start_replica(i)` take one out and
back (faults tests, rolling restarts). A replica's parent-death signal follows the *thread* that started it
(Linux: the signal is sent when that thread ends), so a caller whose thread ends before the fleet does (truss's
load thread) starts them with `start_watched()`: started, and started again, from a thread of the fleet's own.
`stop()` ends every replica (SIGTERM: each leaves the fleet, stops
its tritonserver and Dynamo's runtime; SIGKILL to the group of one still there after REPLICA_STOP_S) and
removes the file-discovery directory it made: no process and no file of the fleet is left.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_truss.config.sources import env_name
from trtllm_truss.planning.fleet import FleetPlan
from trtllm_truss.runtime.fleet_replica import ReplicaSettings

logger = logging.getLogger(__name__)

REPLICA_STOP_S = 30.0
WATCH_INTERVAL_S = 1.0  # start_watched: how often an exited replica is looked for
INSTANCE_COUNT_PATH = ("runtime", "pytorch", "instance_count")  # the stand-in's engine instances (config.runtime)
PACKAGES_DIR = Path(__file__).resolve().parents[2]


def discovery_environment(fleet: Any, plan: FleetPlan, file_dir: str | None) -> dict[str, str]:
    """Dynamo's variables for the fleet's discovery (what `DistributedRuntime` reads at start)."""
    if plan.discovery == "file":
        return {"DYN_FILE_KV": file_dir or ""}
    if plan.discovery == "etcd":
        return {"ETCD_ENDPOINTS": ",".join(fleet.etcd.endpoints)}
    namespace = fleet.kubernetes.namespace
    return {"POD_NAMESPACE": namespace} if namespace else {}


@dataclass
class _Replica:
    settings: ReplicaSettings
    gpus: tuple[int, ...]
    process: subprocess.Popen | None = None
    starts: int = 0
    held: bool = False  # stopped on purpose: not started again until start_replica
    log: Any = field(default=None, repr=False)


class FleetReplicas:
    def __init__(self, truss_dir: Path, plan: FleetPlan, fleet_config: Any, *, environ: Mapping[str, str] | None = None,
                 startup_timeout_s: float | None = None, advertise_host: str = "127.0.0.1",
                 log_dir: Path | None = None) -> None:
        from trtllm_truss.runtime.launch import choose_free_ports

        self.plan = plan
        self._environ = dict(os.environ if environ is None else environ)
        self._made_dir: str | None = None
        file_dir = None
        if plan.discovery == "file":
            file_dir = fleet_config.file.directory
            if file_dir is None:
                file_dir = self._made_dir = tempfile.mkdtemp(prefix="trtllm-truss-fleet-discovery-")
        self.discovery_env = discovery_environment(fleet_config, plan, file_dir)
        self._log_dir = log_dir
        self._replicas: list[_Replica] = []
        for i in range(plan.replicas):
            ports = choose_free_ports()
            settings = ReplicaSettings(
                truss_dir=str(Path(truss_dir).resolve()), index=i, namespace=plan.namespace, discovery=plan.discovery,
                kv_events=plan.kv_events, block_size=plan.tokens_per_block, advertise_host=advertise_host,
                startup_timeout_s=startup_timeout_s, launcher_pid=os.getpid(),
                ports=(ports.http, ports.grpc, ports.metrics),
            )
            self._replicas.append(_Replica(settings, plan.gpu_sets[i] if plan.gpu_sets else ()))
        self._lock = threading.Lock()
        self._stopping = False
        self._watcher: threading.Thread | None = None
        self._watch_stop = threading.Event()
        self.restarts = 0

    def __len__(self) -> int:
        return len(self._replicas)

    def pids(self) -> list[int]:
        return [r.process.pid for r in self._replicas if r.process is not None and r.process.poll() is None]

    def pid(self, index: int) -> int | None:
        process = self._replicas[index].process
        return process.pid if process is not None and process.poll() is None else None

    def _env(self, replica: _Replica) -> dict[str, str]:
        from trtllm_truss.config.child_env import child_environment

        env = child_environment(self._environ)
        env.update(self.discovery_env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGES_DIR), env.get("PYTHONPATH", "")) if p)
        # Triton's python stub embeds the first python3 on PATH: this interpreter's.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        if self.plan.engine_instances is not None:  # the plan's engine instances (planning.fleet: one KV pool a replica)
            env[env_name(INSTANCE_COUNT_PATH)] = str(self.plan.engine_instances)
        if replica.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, replica.gpus))
        env.setdefault("DYN_LOG", "warn")
        return env

    def _spawn(self, replica: _Replica) -> None:
        out = None
        if self._log_dir is not None:
            out = (self._log_dir / f"replica-{replica.settings.index}.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "trtllm_truss.runtime.fleet_replica"], stdin=subprocess.PIPE, stdout=out,
            stderr=subprocess.STDOUT if out is not None else None, env=self._env(replica), start_new_session=True,
        )
        if out is not None:
            out.close()
        assert process.stdin is not None
        try:
            process.stdin.write(replica.settings.to_json().encode())
            process.stdin.close()
        except BrokenPipeError:
            pass  # it died at once; the monitor sees it
        replica.process = process
        replica.starts += 1
        logger.info("replica %d: started (pid %d%s)", replica.settings.index, process.pid,
                    f", GPUs {','.join(map(str, replica.gpus))}" if replica.gpus else "")

    def start(self) -> None:
        for replica in self._replicas:
            self._spawn(replica)

    def start_watched(self, interval_s: float = WATCH_INTERVAL_S) -> None:
        """start(), then check() every `interval_s` until stop(), all on one daemon thread that lives as long as
        the fleet (the replicas' parent-death signal is bound to it); returns once every replica is spawned."""
        spawned = threading.Event()
        failure: list[BaseException] = []

        def watch() -> None:
            try:
                self.start()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                failure.append(exc)
                return
            finally:
                spawned.set()
            while not self._watch_stop.wait(interval_s):
                try:
                    self.check()
                except Exception:  # a failed restart must not end the watch: the next turn tries again
                    logger.exception("fleet: restarting a replica failed")

        self._watcher = threading.Thread(target=watch, name="fleet-replicas", daemon=True)
        self._watcher.start()
        spawned.wait()
        if failure:
            raise failure[0]

    def ready_count(self) -> int:
        return sum(1 for r in self._replicas if self._ready(r))

    def _ready(self, replica: _Replica) -> bool:
        if replica.process is None or replica.process.poll() is not None:
            return False
        url = f"http://127.0.0.1:{replica.settings.ports[0]}/v2/health/ready"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                return response.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout_s: float, count: int | None = None, check: bool = True) -> None:
        """Until `count` replicas (default: all) have a ready tritonserver; raises naming the ones not up.
        `check`: restart a replica that exited meanwhile from this thread (False: the watcher does)."""
        want = len(self._replicas) if count is None else count
        deadline = time.monotonic() + timeout_s
        while True:
            if self.ready_count() >= want:
                return
            dead = [r.settings.index for r in self._replicas if r.process is not None and r.process.poll() is not None
                    and r.starts >= 3]
            if dead:
                raise RuntimeError(f"fleet: replica(s) {dead} exited while starting (see their log above)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"fleet: {want} replica(s) not ready within {timeout_s:g} s")
            if check:
                self.check()
            time.sleep(0.5)  # polling other processes' readiness over HTTP

    def check(self) -> None:
        """One monitor turn: a replica that exited (not held) is started again."""
        with self._lock:
            if self._stopping:
                return
            for replica in self._replicas:
                process = replica.process
                if process is not None and process.poll() is not None and not replica.held:
                    logger.warning("replica %d exited with %s; starting it again", replica.settings.index,
                                   process.returncode)
                    self._spawn(replica)
                    self.restarts += 1

    def stop_replica(self, index: int, *, kill: bool = False) -> None:
        """Take replica `index` out (SIGTERM, a clean leave; `kill`: SIGKILL, a crash) until start_replica."""
        replica = self._replicas[index]
        with self._lock:
            replica.held = True
        self._end(replica, signal.SIGKILL if kill else signal.SIGTERM)

    def start_replica(self, index: int) -> None:
        replica = self._replicas[index]
        with self._lock:
            replica.held = False
            if replica.process is None or replica.process.poll() is not None:
                self._spawn(replica)

    def _end(self, replica: _Replica, signum: int) -> None:
        process = replica.process
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=REPLICA_STOP_S)
        except subprocess.TimeoutExpired:
            logger.warning("replica %d still running %g s after SIGTERM; killing its group", replica.settings.index,
                           REPLICA_STOP_S)
        try:
            os.killpg(process.pid, signal.SIGKILL)  # whatever of its group is left (a stub that hung)
        except ProcessLookupError:
            pass
        process.wait()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        self._watch_stop.set()
        threads = [threading.Thread(target=self._end, args=(r, signal.SIGTERM)) for r in self._replicas]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self._made_dir is not None:
            shutil.rmtree(self._made_dir, ignore_errors=True)
            self._made_dir = None

