"""Served by truss's own model server, as deployed: the truss process holds the secrets, none of the
processes it starts (tritonserver, python-backend stubs, stream workers) inherits one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from trtllm_truss.fronts.truss_server import TrussServer, build_server_root, start_truss_server

pytestmark = [pytest.mark.truss_server, pytest.mark.triton, pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(420)]

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 300
SECRET_ENV = {
    "TRUSS_SECRET_hf_access_token": "not-an-hf-shaped-secret-31337",  # config.yaml declares hf_access_token
    "HF_TOKEN": "hf_processenvTOKEN1234567",
    "AWS_ACCESS_KEY_ID": "AKIAPROCESSENV000001",
    "AWS_SECRET_ACCESS_KEY": "process/env+secret==",
    "COPY_OF_THE_SECRET": "not-an-hf-shaped-secret-31337",  # a declared secret's value under another name
}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[TrussServer]:
    work = tmp_path_factory.mktemp("truss_server_secrets")
    fs_root = build_server_root(REPO_ROOT, work)
    proc = start_truss_server(
        fs_root, work / "server.log", env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **SECRET_ENV}
    )
    try:
        proc.wait_ready(STARTUP_TIMEOUT_S)
        yield proc
    finally:
        proc.stop()


def _children(server: TrussServer) -> dict[int, str]:
    tree = psutil.Process(server.process.pid).children(recursive=True)
    return {p.pid: " ".join(p.cmdline()) for p in tree}


def _leaks(pid: int) -> list[str]:
    """Names of the SECRET_ENV entries whose value is in the process's environment."""
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    return [name for name, value in SECRET_ENV.items() if value.encode() in environ]


def test_the_truss_process_keeps_its_secrets(server: TrussServer):
    assert _leaks(server.process.pid) == list(SECRET_ENV)  # the check below can see a leak


def test_tritonserver_and_stubs_inherit_no_secret(server: TrussServer):
    children = _children(server)
    triton = [pid for pid, cmd in children.items() if "tritonserver" in cmd.split(" ")[0] or " tritonserver" in cmd]
    stubs = [pid for pid, cmd in children.items() if "triton_python_backend_stub" in cmd]
    assert triton and stubs, children
    for pid in triton + stubs:
        assert _leaks(pid) == [], children[pid]


def test_stream_workers_inherit_no_secret(server: TrussServer):
    children = _children(server)
    workers = [pid for pid, cmd in children.items() if "trtllm_truss.streaming" in cmd]
    assert workers, children
    for pid in workers:
        assert _leaks(pid) == [], children[pid]
        # grpc's EventEngine client off where tokens stream from Triton (streaming/environment.py)
        expected = os.environ.get("GRPC_EXPERIMENTS", "-event_engine_client")  # a user's own value wins
        assert f"GRPC_EXPERIMENTS={expected}\0".encode() in Path(f"/proc/{pid}/environ").read_bytes()
