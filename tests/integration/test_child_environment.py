"""No credential reaches tritonserver, its MPI ranks or its python-backend stubs (real tritonserver).

Anything in a process's environment can be read from /proc/<pid>/environ, so the check reads exactly that
for tritonserver (or mpirun and every rank) and every `triton_python_backend_stub` it started.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil
import pytest
import yaml
from test_supervisor_server import make_tiny_repository, stream_words
from trtllm_truss.config import load_config
from trtllm_truss.config import secrets as config_secrets
from trtllm_truss.config.errors import forget_secret_values
from trtllm_truss.runtime.supervisor import TritonServer

pytestmark = [pytest.mark.triton, pytest.mark.timeout(240)]

# Distinct shapes on purpose: none of them looks like an `hf_` token except the first.
CREDENTIALS = {
    "HF_TOKEN": "hf_envtokenABCDEFGH12345678",
    "HUGGING_FACE_HUB_TOKEN": "legacy-hub-token-4711",
    "HF_HUB_TOKEN": "hub-token-0815",
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEYID0001",
    "AWS_SECRET_ACCESS_KEY": "aws/secret+access/KEY==",
    "AWS_SESSION_TOKEN": "aws-session-token-xyz",
    "TRUSS_SECRET_hf_access_token": "hf_trusssecretTOKEN987654",
    "TRUSS_SECRET_db_password": "correct horse battery staple",
}
MOUNTED_SECRET = "mounted-secret-value-42"  # /secrets/api_key, as truss mounts deployment secrets


@pytest.fixture
def secret_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Credentials in os.environ, a mounted secret file, copies of both values under innocent names, and
    a truss whose config.yaml declares the secrets (load_config remembers their values, as serving does)."""
    mount = tmp_path / "secrets"
    mount.mkdir()
    (mount / "api_key").write_text(MOUNTED_SECRET + "\n")
    monkeypatch.setattr(config_secrets, "SECRETS_MOUNT_DIR", mount)
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("COPY_OF_DB_PASSWORD", CREDENTIALS["TRUSS_SECRET_db_password"])
    monkeypatch.setenv("COPY_OF_MOUNTED_SECRET", MOUNTED_SECRET)
    monkeypatch.setenv("KEEP_ME", "an-ordinary-setting")
    truss = tmp_path / "truss"
    truss.mkdir()
    config = {
        "secrets": {"hf_access_token": None, "db_password": None, "api_key": None},
        "model_metadata": {"trt_llm": {"serve": {"engine_repository": "org/engine"}}},
    }
    (truss / "config.yaml").write_text(yaml.safe_dump(config))
    forget_secret_values()
    load_config(truss)
    yield [*CREDENTIALS.values(), MOUNTED_SECRET]
    forget_secret_values()


def _environ(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


def _variables(environ: bytes) -> dict[str, str]:
    pairs = (entry.decode(errors="replace").partition("=") for entry in environ.split(b"\0") if entry)
    return {name: value for name, _, value in pairs}


@pytest.mark.parametrize(
    "world_size",
    [1, pytest.param(2, marks=pytest.mark.skipif(shutil.which("mpirun") is None, reason="no Open MPI mpirun"))],
)
def test_tritonserver_and_stubs_inherit_no_secret(tmp_path: Path, secret_environment: list[str], world_size: int):
    repo = make_tiny_repository(tmp_path)
    server = TritonServer(repo, world_size=world_size, startup_timeout_s=180)
    try:
        server.start()
        server.wait_ready()
        assert stream_words(server.grpc_url, "still works") == ["STILL", "WORKS"]
        assert server.pid is not None
        tree = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
        names = {p.pid: p.name() for p in tree}
        stubs = [pid for pid, name in names.items() if "triton_python_backend_stub" in name]
        servers = [pid for pid, name in names.items() if name == "tritonserver"]
        # preprocessing and tensorrt_llm on rank 0 (+ tensorrt_llm on rank 1): one stub per instance
        assert len(stubs) >= world_size + 1, names
        assert len(servers) == world_size, names
        for pid in names:
            environ = _environ(pid)
            variables = _variables(environ)
            leaked = [value for value in secret_environment if value.encode() in environ]
            assert not leaked, f"{names[pid]} (pid {pid}) has secret values in its environment"
            named = sorted(n for n in variables if n in CREDENTIALS or n.startswith("TRUSS_SECRET_"))
            assert not named, f"{names[pid]} (pid {pid}) has {named}"
            assert "COPY_OF_DB_PASSWORD" not in variables and "COPY_OF_MOUNTED_SECRET" not in variables
        for pid in servers + stubs:
            # What children legitimately need is kept.
            variables = _variables(_environ(pid))
            assert variables.get("KEEP_ME") == "an-ordinary-setting", names[pid]
            assert "PATH" in variables and "PYTHONPATH" in variables
    finally:
        server.stop()
