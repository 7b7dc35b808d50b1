"""Real artifact servers on loopback for tests: olah (HF hub protocol over local git repos), moto (S3).

Test modules in tests/integration import the fixture functions they use
(`from fixtures_hubs import hub_fixture, moto_s3_fixture`), which pytest registers as `hub` and `moto_s3`;
`pytest_plugins` only works in the root conftest.

- `hub` (session): olah serving git repos (git-lfs for *.engine / *.safetensors) created by the tests,
  behind a small auth-checking front: olah neither requires nor checks tokens, so the front demands
  `Authorization: Bearer <hub.token>` for repos of the org `private` (like a gated/private repo on the
  hub) and records what it saw, so tests can check token plumbing end to end.
- `moto_s3` (session): `moto_server` with environment variables for boto3.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
OLAH_CLI = REPO_ROOT / ".venv-olah" / "bin" / "olah-cli"
MOTO_SERVER = Path(sys.executable).parent / "moto_server"
PRIVATE_ORG = "private"
LFS_PATTERNS = ("*.engine", "*.safetensors")
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "tests",
    "GIT_AUTHOR_EMAIL": "tests@example.invalid",
    "GIT_COMMITTER_NAME": "tests",
    "GIT_COMMITTER_EMAIL": "tests@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_http(url_host: str, port: int, path: str, timeout_s: float, proc: subprocess.Popen, log: Path) -> None:
    """Poll until the server answers (any status) or fail with its log tail."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            conn = http.client.HTTPConnection(url_host, port, timeout=2)
            conn.request("GET", path)
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server on port {port} not ready after {timeout_s}s:\n{log.read_text()[-2000:]}")


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


# --- git repos served as hub repos ---------------------------------------------------------------


class HubMirror:
    """Non-bare git repos under <root>/models/<org>/<name>, the layout olah serves offline."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _git(self, repo: Path, *args: str) -> str:
        env = {**os.environ, **_GIT_ENV}
        done = subprocess.run(
            ["git", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr}")
        return done.stdout.strip()

    def repo_path(self, repo_id: str) -> Path:
        return self.root / "models" / repo_id

    def create(self, repo_id: str, files: dict[str, bytes | str]) -> str:
        """Create a repo whose first commit on `main` holds `files`; return the commit sha."""
        repo = self.repo_path(repo_id)
        if repo.exists():
            shutil.rmtree(repo)
        repo.mkdir(parents=True)
        self._git(repo, "init", "-q", "-b", "main")
        self._git(repo, "lfs", "install", "--local")
        self._git(repo, "lfs", "track", *LFS_PATTERNS)
        return self.commit(repo_id, files, message="initial")

    def commit(
        self,
        repo_id: str,
        files: dict[str, bytes | str],
        *,
        message: str = "update",
        delete: tuple[str, ...] = (),
        branch: str | None = None,
    ) -> str:
        repo = self.repo_path(repo_id)
        if branch is not None:
            existing = self._git(repo, "branch", "--list", branch)
            self._git(repo, "checkout", "-q", *(() if existing else ("-b",)), branch)
        for name, content in files.items():
            path = repo / name
            data = content.encode() if isinstance(content, str) else content
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        for name in delete:
            self._git(repo, "rm", "-q", name)
        self._git(repo, "add", "-A")
        self._git(repo, "commit", "-q", "--allow-empty", "-m", message)
        sha = self._git(repo, "rev-parse", "HEAD")
        if branch is not None:
            self._git(repo, "checkout", "-q", "main")
        return sha

    def tag(self, repo_id: str, name: str, ref: str = "HEAD") -> None:
        self._git(self.repo_path(repo_id), "tag", "-f", name, ref)


class _AuthFront(BaseHTTPRequestHandler):
    """Forwards to olah; repos of the `private` org need the right bearer token."""

    server: _FrontServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        return

    def _handle(self) -> None:
        auth = self.headers.get("Authorization")
        self.server.seen.append((self.command, self.path, auth))
        if f"/{PRIVATE_ORG}/" in self.path and auth != f"Bearer {self.server.token}":
            body = b'{"error":"Invalid credentials in Authorization header"}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        length = int(self.headers.get("Content-Length") or 0)
        body_in = self.rfile.read(length) if length else None
        conn = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        conn.request(self.command, self.path, body=body_in, headers=headers)
        upstream = conn.getresponse()
        data = upstream.read()  # olah sends no Content-Length on GET; test files are small
        self.send_response(upstream.status)
        for key, value in upstream.getheaders():
            # HEAD answers keep olah's own Content-Length: clients read the file size from it.
            if key.lower() in ("transfer-encoding", "connection", "server", "date"):
                continue
            if key.lower() == "content-length" and self.command != "HEAD":
                continue
            self.send_header(key, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    do_GET = _handle
    do_HEAD = _handle
    do_POST = _handle


class _FrontServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, upstream_port: int, token: str) -> None:
        super().__init__(("127.0.0.1", port), _AuthFront)
        self.upstream_port = upstream_port
        self.token = token
        self.seen: list[tuple[str, str, str | None]] = []


@dataclass
class HubServer:
    endpoint: str  # what clients use as HF_ENDPOINT (the auth front)
    mirror: HubMirror
    token: str  # the token the front accepts for `private/...` repos
    front: _FrontServer
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    def requests_seen(self) -> list[tuple[str, str, str | None]]:
        return list(self.front.seen)


@pytest.fixture(scope="session", name="hub")
def hub_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    if not OLAH_CLI.exists():
        pytest.skip(f"olah not installed at {OLAH_CLI}")
    if shutil.which("git-lfs") is None:
        pytest.skip("git-lfs not installed")
    base = tmp_path_factory.mktemp("hub")
    mirror = HubMirror(base / "mirror")
    (base / "mirror" / "models").mkdir(parents=True)
    olah_port, front_port = free_port(), free_port()
    config = base / "olah.toml"
    # Links olah hands out (LFS redirects) must point at the front, or clients would bypass it.
    config.write_text(
        "[basic]\n"
        f'host = "127.0.0.1"\nport = {olah_port}\n'
        f'repos-path = "{base / "olah-cache"}"\nmirrors-path = ["{base / "mirror"}"]\n'
        'hf-scheme = "http"\nhf-netloc = "127.0.0.1:9"\n'
        f'mirror-netloc = "127.0.0.1:{front_port}"\nmirror-lfs-netloc = "127.0.0.1:{front_port}"\n'
        "metadata-cache-ttl = 0\n"
        "[accessibility]\noffline = true\n"
    )
    log = base / "olah.log"
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            [str(OLAH_CLI), "-c", str(config)],
            cwd=base,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    front = _FrontServer(front_port, olah_port, token="hf_test_SECRET_token_9f8e7d")
    thread = threading.Thread(target=front.serve_forever, name="hub-auth-front", daemon=True)
    try:
        wait_for_http("127.0.0.1", olah_port, "/", 30, proc, log)
        thread.start()
        yield HubServer(
            endpoint=f"http://127.0.0.1:{front_port}",
            mirror=mirror,
            token=front.token,
            front=front,
            log_path=log,
            env={"HF_ENDPOINT": f"http://127.0.0.1:{front_port}", "HF_HUB_DISABLE_PROGRESS_BARS": "1"},
        )
    finally:
        if thread.is_alive():
            front.shutdown()
        front.server_close()
        stop_process(proc)


# --- S3 ------------------------------------------------------------------------------------------


@dataclass
class MotoS3:
    endpoint: str
    env: dict[str, str]

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )


@pytest.fixture(scope="session", name="moto_s3")
def moto_s3_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    if not MOTO_SERVER.exists():
        pytest.skip(f"moto_server not installed at {MOTO_SERVER}")
    base = tmp_path_factory.mktemp("moto")
    port = free_port()
    log = base / "moto.log"
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_http("127.0.0.1", port, "/moto-api/", 30, proc, log)
        endpoint = f"http://127.0.0.1:{port}"
        yield MotoS3(
            endpoint=endpoint,
            env={
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1",
            },
        )
    finally:
        stop_process(proc)
