"""The fleet-kv-routing study's harness against Dynamo's real frontend and mocker workers (ai-dynamo 1.6.1,
no GPU, file discovery): both router modes replay a slice of the study's trace, and the reports hold what
the study reads (cached tokens from the mocker's usage, the serving worker, the bound)."""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "docs" / "performance" / "fleet-kv-routing" / "harness.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("dynamo") is None or importlib.util.find_spec("dynamo.mocker") is None,
        reason="Dynamo (ai-dynamo, ai-dynamo-runtime) is not installed",
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _harness():
    spec = importlib.util.spec_from_file_location("fleet_kv_routing_harness", HARNESS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_mocker_fleet_replays_the_trace_in_both_router_modes(tmp_path):
    if not (REPO / "data" / "embedded-llama" / "tokenizer.json").is_file():
        pytest.skip("the embedded model is not generated in this checkout")
    harness = _harness()
    code = harness.main([
        "--replicas", "2", "--trace-limit", "24", "--trace-block-tokens", "16", "--block-size", "16",
        "--pool-blocks", "512", "--trace-max-output", "4", "--speedup-ratio", "0", "--concurrency", "4",
        "--http-port", str(_free_port()), "--out", str(tmp_path),
    ])
    assert code == 0
    for mode in ("kv", "round-robin"):
        report = json.loads((tmp_path / f"mocker-{mode}.json").read_text())
        reuse = report["reuse"]
        assert report["metrics"]["succeeded"] == 24, report["metrics"]["first_errors"]
        assert reuse["cached_reported"] == 24  # the mocker reports cached tokens in every usage
        # Every request of the trace's first seconds shares its first block: the second one on a worker reuses it.
        assert 0 < reuse["cached_tokens"] <= reuse["bound"]["cached_tokens_of_succeeded"]
        assert set(report["per_replica"]) != {"unknown"} and len(report["per_replica"]) <= 2
    assert not _our_dynamo_left(tmp_path)  # the harness stopped the fleets it started


def _our_dynamo_left(out: Path) -> bool:
    """A Dynamo process still running whose discovery folder (DYN_FILE_KV, under `out`) is this test's."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"dynamo.mocker" in a or b"dynamo.frontend" in a for a in args):
            try:
                environ = (cmdline.parent / "environ").read_bytes()
            except OSError:
                continue
            if str(out).encode() in environ:
                return True
    return False
