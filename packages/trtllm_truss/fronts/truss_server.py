"""Run truss's own model server (truss 0.18.35) on a truss directory, locally, without docker.

The steps are truss's: `ServingImageBuilderContext.prepare_image_build_dir` writes the image build
context (including the normalised config.yaml the server needs), `DockerBuildEmulator` applies the
Dockerfile's COPY/ENV into a folder, and `fs_root/app/main.py` is the server's entry point, run here
with this repository's Python and `fs_root/packages` on PYTHONPATH.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

# What a truss ships (truss's Dockerfile copies these); the rest of a repository (virtual
# environments, caches, tests) is left out of the staged copy.
TRUSS_PARTS = ("config.yaml", "model", "packages", "data")
READY_PATH = "/v1/models/model"


class TrussServerError(RuntimeError):
    pass


def stage_truss(truss_dir: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for part in TRUSS_PARTS:
        src = truss_dir / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.is_file():
            shutil.copy2(src, dest / part)
    return dest


def build_server_root(truss_dir: Path, work_dir: Path) -> Path:
    """The folder a truss image would contain (`/app`, `/packages`, ...), built without docker."""
    from truss.contexts.image_builder.serving_image_builder import ServingImageBuilderContext
    from truss.contexts.local_loader.docker_build_emulator import DockerBuildEmulator

    staged = stage_truss(truss_dir, work_dir / "truss")
    build_dir = work_dir / "build"
    fs_root = work_dir / "fs"
    fs_root.mkdir(parents=True)
    ServingImageBuilderContext.run(staged).prepare_image_build_dir(build_dir)
    DockerBuildEmulator(build_dir / "Dockerfile", build_dir).run(fs_root)
    if not (fs_root / "app" / "main.py").is_file():
        raise TrussServerError(f"truss build emulation produced no app/main.py under {fs_root}")
    return fs_root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class TrussServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float) -> None:
        """Poll readiness (200 once `load()` returned) until the deadline or the server's death."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise TrussServerError(f"truss server exited with {self.process.returncode}:\n{self.log_tail()}")
                try:
                    if client.get(self.url + READY_PATH).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.25)
        raise TrussServerError(f"truss server not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def descendants(self, name: str) -> list[psutil.Process]:
        """Processes started under the server whose executable name is `name` (e.g. tritonserver)."""
        return self._descendants(lambda child: child.name() == name)

    def stream_workers(self) -> list[psutil.Process]:
        """The model's live stream-worker processes (python -m trtllm_truss.streaming.worker)."""
        return self._descendants(
            lambda child: "trtllm_truss.streaming.worker" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE
        )

    def stream_processes(self) -> list[psutil.Process]:
        """The processes a request's stream runs in: the stream workers, or where there are none (the direct
        front's default) its HTTP processes, each of which streams on its own event loop."""
        return self.stream_workers() or self._descendants(
            lambda child: "trtllm_truss.fronts.direct_app" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE
        )

    def _descendants(self, matches: Callable[[psutil.Process], bool]) -> list[psutil.Process]:
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        found = []
        for child in children:
            try:
                if matches(child):
                    found.append(child)
            except psutil.NoSuchProcess:
                continue
        return found

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (the model's shutdown stops tritonserver), then SIGKILL the whole group."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=5)


def start_truss_server(fs_root: Path, log_path: Path, env: Mapping[str, str] | None = None) -> TrussServer:
    port = free_port()
    child_env = {**os.environ, **(env or {})}
    child_env.update(INFERENCE_SERVER_PORT=str(port), PYTHONPATH=str(fs_root / "packages"))
    # The stub of Triton's python backend embeds the first python3 on PATH: make it this venv's.
    child_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{child_env.get('PATH', '')}"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "main.py"],
        cwd=fs_root / "app",
        env=child_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # one process group: stop() reaches tritonserver too
    )
    log.close()
    return TrussServer(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)
