"""`trtllm-truss serve` as a user runs it: a subprocess on a truss directory, stopped with Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from trtllm_truss.runtime.launch import choose_free_ports

pytestmark = [pytest.mark.triton, pytest.mark.torch, pytest.mark.timeout(300)]  # serves the embedded default (stand-in engine)

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_MODEL = ROOT / "data" / "embedded-llama"


def _serve(truss_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trtllm_truss.cli", "serve", str(truss_dir), *args],
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # Ctrl-C is sent by the test to serve alone, as a terminal would to its job
    )


def _processes_mentioning(marker: str) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                pids.append(int(entry.name))
    return pids


def _http_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _truss_with(tmp_path: Path, **runtime: object) -> Path:
    """A copy of the repository's own truss config (embedded model and its LoRA adapters by absolute
    path) with runtime settings."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    trt_llm = config["model_metadata"]["trt_llm"]
    trt_llm["build"]["huggingface_ckpt_repository"] = str(EMBEDDED_MODEL)
    adapters = trt_llm["build"].get("lora_adapters") or {}
    for name, source in adapters.items():
        adapters[name] = str(ROOT / source) if isinstance(source, str) and (ROOT / source).is_dir() else source
    trt_llm.setdefault("runtime", {}).update(runtime)
    truss = tmp_path / "truss"
    truss.mkdir()
    (truss / "config.yaml").write_text(yaml.safe_dump(config))
    return truss


def test_serve_fails_fast_on_a_tritonserver_setting_that_does_not_exist(tmp_path):
    process = _serve(ROOT, env={"TRTLLM_RUNTIME__TRITONSERVER_PATH": str(tmp_path / "no" / "tritonserver")})
    _, err = process.communicate(timeout=120)
    assert process.returncode == 1, err
    assert "model_metadata.trt_llm.runtime.tritonserver_path points at" in err
    assert str(tmp_path / "no" / "tritonserver") in err


@pytest.mark.slow
def test_serve_prints_endpoints_serves_and_stops_on_ctrl_c(tmp_path):
    ports = choose_free_ports()
    repository = tmp_path / "rendered-repository"
    process = _serve(ROOT, "--http-port", str(ports.http), "--grpc-port", str(ports.grpc),
                     "--repository-dir", str(repository))
    ready_url = f"http://127.0.0.1:{ports.http}/v2/models/ensemble/ready"
    printed: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while not _http_ready(ready_url):
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "serve did not make the ensemble ready in 240s"
            time.sleep(0.2)
        request = urllib.request.Request(
            f"http://127.0.0.1:{ports.http}/v2/models/ensemble/generate",
            data=json.dumps({"text_input": "Once upon a time", "max_tokens": 8}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert isinstance(json.loads(response.read())["text_output"], str)
        assert _processes_mentioning(str(repository))  # tritonserver runs on the rendered repository
        # Triton answers before serve has finished starting (its readiness checks); Ctrl-C then is an
        # interrupted startup (exit 130). The line serve prints once started is what a user waits for.
        while not printed or "Ctrl-C stops the server." not in printed[-1]:
            assert time.monotonic() < deadline, "serve did not print its endpoints in 240s"
            printed.append(process.stdout.readline())
            assert printed[-1] or process.poll() is None, "serve exited before printing its endpoints"
    finally:
        process.send_signal(signal.SIGINT)
        rest, err = process.communicate(timeout=60)
    out = "".join(printed) + rest
    assert process.returncode == 0, err[-3000:]
    assert f"gRPC     127.0.0.1:{ports.grpc}" in out
    assert f"HTTP     http://127.0.0.1:{ports.http}" in out
    assert "metrics  http://127.0.0.1:" in out and "/metrics" in out
    assert _processes_mentioning(str(repository)) == []  # Ctrl-C stopped tritonserver and its stubs
    assert (repository / "ensemble" / "config.pbtxt").is_file()  # --repository-dir keeps the rendering


@pytest.mark.slow
def test_serve_reports_tritons_own_error_for_a_model_that_cannot_load(tmp_path):
    broken = tmp_path / "broken-checkpoint"
    shutil.copytree(EMBEDDED_MODEL, broken)
    (broken / "model.safetensors").write_bytes(b"\x00not a safetensors file" * 64)
    truss = _truss_with(tmp_path, pytorch={"model": str(broken)}, startup_timeout_s=120)
    started = time.monotonic()
    process = _serve(truss)
    out, err = process.communicate(timeout=200)
    assert process.returncode == 1, (out, err)
    assert time.monotonic() - started < 150
    assert "TritonStartupError" in err
    assert "Triton's errors:" in err and "tensorrt_llm" in err
