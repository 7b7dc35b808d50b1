"""The environment of a process that streams from Triton: credentials dropped, the package importable,
grpc's EventEngine client off unless the user chose otherwise."""

from __future__ import annotations

from trtllm_truss.streaming.environment import worker_environment


def test_grpc_event_engine_client_is_off_and_credentials_are_dropped():
    env = worker_environment({"PATH": "/usr/bin", "HF_TOKEN": "hf_secret", "PYTHONPATH": "/elsewhere"})
    assert env["GRPC_EXPERIMENTS"] == "-event_engine_client"
    assert "HF_TOKEN" not in env
    assert env["PYTHONPATH"].endswith("/elsewhere") and env["PYTHONPATH"].split(":")[0].endswith("packages")


def test_the_users_grpc_experiments_win():
    env = worker_environment({"PATH": "/usr/bin", "GRPC_EXPERIMENTS": "event_engine_client"})
    assert env["GRPC_EXPERIMENTS"] == "event_engine_client"
