"""The environment of a process that streams from Triton: credentials dropped, the package importable,
grpc's EventEngine client off unless the user chose otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

from trtllm_truss.engine.client import GRPC_CLIENT_ENVIRONMENT
from trtllm_truss.streaming.environment import worker_environment


def test_grpc_event_engine_client_is_off_and_credentials_are_dropped():
    env = worker_environment({"PATH": "/usr/bin", "HF_TOKEN": "hf_secret", "PYTHONPATH": "/elsewhere"})
    assert env["GRPC_EXPERIMENTS"] == "-event_engine_client"
    assert "HF_TOKEN" not in env
    assert env["PYTHONPATH"].endswith("/elsewhere") and env["PYTHONPATH"].split(":")[0].endswith("packages")


def test_the_users_grpc_experiments_win():
    env = worker_environment({"PATH": "/usr/bin", "GRPC_EXPERIMENTS": "event_engine_client"})
    assert env["GRPC_EXPERIMENTS"] == "event_engine_client"


def test_the_pinned_grpcio_knows_the_experiment():
    """grpc ignores an experiment it does not know (logging "Unknown experiment"): after a grpcio upgrade
    that drops it, this fails instead of the saving disappearing without notice."""
    probe = "import grpc; grpc.insecure_channel('127.0.0.1:1').close()"
    env = {**os.environ, **GRPC_CLIENT_ENVIRONMENT}
    known = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert known.returncode == 0 and "Unknown experiment" not in known.stderr, known.stderr
    made_up = subprocess.run([sys.executable, "-c", probe], env={**env, "GRPC_EXPERIMENTS": "-no_such_experiment"},
                             capture_output=True, text=True, timeout=60)
    assert "Unknown experiment" in made_up.stderr  # the check above could see it
