"""The environment a process that streams from Triton starts with (a stream worker, a direct-front
process): this package importable, no credential inherited, grpc's client set up for streaming."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import trtllm_truss
from trtllm_truss.config.child_env import child_environment
from trtllm_truss.engine.client import GRPC_CLIENT_ENVIRONMENT


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    env = child_environment(environ)
    # truss puts packages/ on sys.path inside its own process only; the worker is a fresh interpreter.
    package_root = str(Path(trtllm_truss.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    for name, value in GRPC_CLIENT_ENVIRONMENT.items():
        env.setdefault(name, value)
    return env
