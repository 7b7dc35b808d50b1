"""Which model the stack's health probe reaches (engine.health.stack_probe)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trtllm_truss.config.runtime import RuntimeConfig
from trtllm_truss.engine.health import stack_probe
from trtllm_truss.planning.plan import ServingPlan
from trtllm_truss.repository.models import ENGINE, WINDOW_RELAY

EMBEDDED = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"


def _plan(detokenize_in: str) -> ServingPlan:
    return ServingPlan(backend="tensorrtllm", tokenizer_dir=EMBEDDED, model_dir=EMBEDDED, max_batch_size=8,
                       max_input_len=64, max_output_len=16, runtime=RuntimeConfig(detokenize_in=detokenize_in))


@pytest.mark.parametrize(
    ("detokenize_in", "relay_rendered", "expected"),
    [
        ("postprocessing", True, WINDOW_RELAY),  # our routes stream text through the relay
        ("proxy", True, ENGINE),  # the relay is rendered for NVIDIA's clients only: our routes never use it
        ("postprocessing", False, ENGINE),  # an engine that sends prefix_ids itself: no relay
    ],
)
def test_the_probe_reaches_the_model_our_routes_stream_through(tmp_path, detokenize_in, relay_rendered, expected):
    if relay_rendered:
        (tmp_path / WINDOW_RELAY).mkdir()
    probe = stack_probe("127.0.0.1:1", tmp_path, _plan(detokenize_in))
    assert probe.model_name == expected
    assert (probe.interval_s, probe.timeout_s) == (10.0, 5.0)  # runtime.health's defaults


def test_an_unhealthy_engine_is_probed_again_within_retry_s_not_a_whole_interval():
    """A restarted tritonserver reads healthy about a second after it serves again, whatever the interval."""
    import socket
    import time

    from trtllm_truss.engine.health import RETRY_S, EngineProbe

    with socket.socket() as s:  # a port nothing listens on: every probe fails at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with EngineProbe(f"127.0.0.1:{port}", interval_s=60.0, timeout_s=1.0) as probe:
        deadline = time.monotonic() + 10 * RETRY_S + 5
        while probe.probe_count < 3:
            assert time.monotonic() < deadline, f"{probe.probe_count} probes; the interval is 60 s, RETRY_S {RETRY_S}"
            time.sleep(0.05)  # polling the probe's count
        assert not probe.healthy and probe.last_error
