"""The environment a stream worker starts with: this package importable, no secret inherited."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trtllm_truss

# Variables that hold credentials: a worker needs none of them (it talks to tritonserver on loopback).
_SECRET_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_SECRET_PREFIXES = ("TRUSS_SECRET_",)


def worker_environment(environ: Mapping[str, str], secrets: Mapping[str, Any] | None = None) -> dict[str, str]:
    env = {
        name: value
        for name, value in environ.items()
        if name not in _SECRET_NAMES and not name.startswith(_SECRET_PREFIXES)
    }
    # truss puts packages/ on sys.path inside its own process only; the worker is a fresh interpreter.
    package_root = str(Path(trtllm_truss.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    return env
