"""`trtllm-truss predict`: the newcomer's first command, run as a real subprocess on this repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "trtllm_truss.cli", "predict", str(REPO_ROOT)]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _run(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=ENV, timeout=timeout_s)


def test_malformed_json_request_is_rejected_before_loading():
    result = _run("--json", json.dumps({"prompt": "hi", "temperature": "hot"}), timeout_s=60)
    assert result.returncode == 2, result.stderr
    assert "temperature:" in result.stderr
    assert "tritonserver" not in result.stderr  # nothing was started


@pytest.mark.triton
@pytest.mark.torch  # the embedded default runs the stand-in engine
@pytest.mark.slow
def test_predict_brings_the_stack_up_answers_and_stops():
    result = _run(
        "--json",
        json.dumps({"prompt": "Once upon a time", "max_tokens": 6, "stream": False, "ignore_eos": True}),
        timeout_s=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout)
    assert answer["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 6
    assert "ready in" in result.stderr
