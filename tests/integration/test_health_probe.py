"""EngineProbe against a real tritonserver whose `tensorrt_llm` model (a TEST DOUBLE) stops answering.

The double answers one-token generations until a file appears, then holds requests unanswered, as a
wedged engine does while Triton still reports the model ready. The probe must report unhealthy
within interval + timeout of the hang, say why, and recover once the engine answers again.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from trtllm_truss.engine.health import EngineProbe

pytestmark = pytest.mark.triton

HANG_DOUBLE = Path(__file__).resolve().parent / "triton_models" / "tensorrt_llm_hang_double" / "model.py"
INTERVAL_S = 0.5
TIMEOUT_S = 1.5
# Scheduling slack on a 2-core machine shared with other test servers; the bound stays interval+timeout+slack.
SLACK_S = 2.0

CONFIG = """
name: "tensorrt_llm"
backend: "python"
max_batch_size: 1
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "input_lengths" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "request_output_len" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "streaming" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}
]
output [
  {{ name: "output_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] }},
  {{ name: "sequence_length" data_type: TYPE_INT32 dims: [ -1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "hang_file" value: {{ string_value: "{hang_file}" }} }}
"""


def wait_for(predicate, timeout_s: float, step_s: float = 0.05) -> float:
    """Poll `predicate` until true; return the seconds it took (fails the test on timeout)."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            pytest.fail(f"condition not reached within {timeout_s} s")
        time.sleep(step_s)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def hang_server(tmp_path_factory):
    from trtllm_truss.runtime.supervisor import TritonServer

    root = tmp_path_factory.mktemp("hang")
    hang_file = root / "hang"
    model = root / "repo" / "tensorrt_llm"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG.format(hang_file=hang_file))
    (model / "1" / "model.py").write_text(HANG_DOUBLE.read_text())
    server = TritonServer(root / "repo", startup_timeout_s=180.0)
    server.start()
    try:
        server.wait_ready(180.0, models=["tensorrt_llm"])
        yield server, hang_file
    finally:
        server.stop()


def test_a_hung_engine_reads_unhealthy_within_interval_plus_timeout_and_recovers(hang_server):
    server, hang_file = hang_server
    with EngineProbe(server.grpc_url, interval_s=INTERVAL_S, timeout_s=TIMEOUT_S) as probe:
        wait_for(lambda: probe.healthy, 30.0)
        assert probe.last_error is None
        hang_file.touch()
        try:
            took = wait_for(lambda: not probe.healthy, 30.0)
            assert took <= INTERVAL_S + TIMEOUT_S + SLACK_S, f"unhealthy only after {took:.2f} s"
            assert "did not answer a one-token generation within 1.5 s" in (probe.last_error or "")
        finally:
            hang_file.unlink()
        wait_for(lambda: probe.healthy, 30.0)
        assert probe.last_error is None and probe.failure_count >= 1


def test_an_unreachable_server_is_unhealthy_with_the_reason():
    with EngineProbe("127.0.0.1:9", interval_s=INTERVAL_S, timeout_s=TIMEOUT_S) as probe:
        wait_for(lambda: probe.probe_count >= 1, 30.0)
        assert not probe.healthy and probe.last_error
        assert "tensorrt_llm" in probe.last_error


def test_the_stacks_probe_goes_through_the_window_relay_and_a_dead_relay_stub_restarts_the_server(tmp_path):
    """`detokenize_in: postprocessing` on the relay layout: the probe of the stack reaches the relay (so a relay
    that stops answering reads unhealthy where a probe of the engine alone would pass). When the relay's stub
    dies (as its watchdog ends it after python_backend's deadlock, docs/deploy.md) Triton never starts it again:
    the supervisor ends tritonserver and restarts it, and the probe through the relay reads healthy again.
    Real tritonserver; the engine is the echo TEST DOUBLE."""
    import signal

    import psutil
    from conftest import ECHO_ENGINE_DOUBLE, _plan
    from trtllm_truss.config.runtime import RuntimeConfig
    from trtllm_truss.engine.health import stack_probe
    from trtllm_truss.repository import WINDOW_RELAY, render_repository
    from trtllm_truss.runtime.supervisor import TritonServer

    runtime = RuntimeConfig(
        preprocessing_instance_count=1,
        postprocessing_instance_count=1,
        detokenize_in="postprocessing",
        health={"interval_s": INTERVAL_S, "timeout_s": TIMEOUT_S},
    )
    plan = _plan(runtime, max_batch_size=8)
    repository = render_repository(plan, tmp_path / "model_repository", engine_model_source=ECHO_ENGINE_DOUBLE, window_relay=True)
    with TritonServer(repository, startup_timeout_s=180.0) as server:
        exits = []
        server.add_exit_listener(exits.append)
        with stack_probe(server.grpc_url, repository, plan) as probe:
            assert probe.model_name == WINDOW_RELAY
            wait_for(lambda: probe.healthy, 60.0)
            tree = psutil.Process(server.pid).children(recursive=True)
            relay_stub = next(p for p in tree if any(f"/{WINDOW_RELAY}/" in part for part in p.cmdline()))
            relay_stub.send_signal(signal.SIGKILL)
            wait_for(lambda: not server.ready(), 5.0)  # at once: readiness reads the stubs
            wait_for(lambda: exits, 10.0)
            (exit,) = exits
            assert exit.cause == f"the python-backend stub of {WINDOW_RELAY} (pid {relay_stub.pid}) died", exit
            assert exit.will_restart and exit.was_ready
            wait_for(lambda: server.restarts == 1 and server.ready() and probe.healthy, 120.0)
