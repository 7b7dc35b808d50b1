"""bench's per-round ratios and their spread, and the servers' CPU per target (bench.cpu)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from test_bench_runner import ScriptedTarget, _requests
from trtllm_truss.bench.cpu import (
    CpuProbe,
    classify,
    cpu_between,
    listening_pid,
    probe_for,
)
from trtllm_truss.bench.load import ClosedLoop
from trtllm_truss.bench.report import BenchReport
from trtllm_truss.bench.session import BenchPlan, run_bench


def test_processes_are_grouped_by_what_they_are():
    assert classify("tritonserver", "tritonserver") == "tritonserver"
    assert classify("triton_python_b", "triton_python_backend_stub") == "python_stubs"  # comm is cut at 15
    assert classify("python3", "python3") == "serving_path"


def test_cpu_between_counts_new_processes_whole_and_a_reused_pid_from_zero():
    before = {1: ("serving_path", 100.0, 5.0), 2: ("tritonserver", 100.0, 7.0), 3: ("python_stubs", 100.0, 9.0)}
    after = {
        1: ("serving_path", 100.0, 6.5),  # +1.5
        2: ("tritonserver", 100.0, 10.0),  # +3
        3: ("python_stubs", 200.0, 0.25),  # pid 3 is another process now: all of its 0.25
        4: ("serving_path", 150.0, 0.5),  # started in the window (a restarted worker): all of it
    }
    assert cpu_between(before, after) == {"serving_path": 2.0, "tritonserver": 3.0, "python_stubs": 0.25, "truss_process": 0.0}


def test_truss_process_is_reported_alone_and_within_the_serving_path():
    before = {1: ("truss_process", 100.0, 5.0), 4: ("serving_path", 100.0, 1.0)}
    after = {1: ("truss_process", 100.0, 6.0), 4: ("serving_path", 100.0, 3.0)}
    used = cpu_between(before, after)
    assert (used["truss_process"], used["serving_path"]) == (1.0, 3.0)


_BURNER = """
import sys, time
sys.stdin.readline()
start = time.process_time()
while time.process_time() - start < 0.2:  # burn 0.2 s of CPU
    sum(range(1000))
print("burnt", flush=True)
sys.stdin.readline()
"""


def test_a_probe_reads_the_cpu_its_process_tree_used():
    # A process of its own as the tree's root: pytest's own tree may hold other tests' servers.
    child = subprocess.Popen([sys.executable, "-c", _BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        probe = CpuProbe((child.pid,))
        before = probe.snapshot()
        assert before[child.pid][0] == "truss_process"  # the root that is not Triton's
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "burnt\n"
        used = cpu_between(before, probe.snapshot())
    finally:
        child.kill()
        child.wait()
    assert used["serving_path"] >= 0.15 and used["truss_process"] == used["serving_path"]
    assert used["tritonserver"] == used["python_stubs"] == 0.0


def test_the_process_listening_on_a_port_is_found():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert listening_pid(f"127.0.0.1:{port}") == os.getpid()
        assert listening_pid(f"http://127.0.0.1:{port}") == os.getpid()
    assert listening_pid("http://example.com:80") is None  # not this machine
    assert probe_for([None, None]) is None
    assert probe_for([5, None, 5]).roots == (5,)


class ScriptedProbe:
    """Each snapshot adds CPU: the direct engine's rounds cost tritonserver 1 s each, the full path's
    cost our processes 2 s and tritonserver 1 s."""

    def __init__(self):
        self.cpu = {"serving_path": 0.0, "tritonserver": 0.0, "python_stubs": 0.0}

    def root_pids(self):
        return tuple(range(len(self.cpu)))

    def snapshot(self):
        return {k: (group, 1.0, self.cpu[group]) for k, group in enumerate(self.cpu)}


async def test_compare_reports_each_rounds_ratio_its_spread_and_the_servers_cpu(tmp_path):
    probe = ScriptedProbe()

    class Charging(ScriptedTarget):
        async def stream(self, request):
            async for chunk in super().stream(request):
                yield chunk
            if self.name == "http":
                probe.cpu["serving_path"] += 2.0 / 4
            probe.cpu["tritonserver"] += 1.0 / 4

    plan = BenchPlan(
        targets=[Charging("engine", step_s=0.001), Charging("http", step_s=0.003, text=True)],
        levels=[ClosedLoop(concurrency=2)],
        requests=_requests(4, output_len=5),
        workload={},
        compare=("engine", "http"),
        warmup_requests=0,
        rounds=3,
        cpu_probe=probe,
    )
    report = await run_bench(plan, None)
    path = tmp_path / "bench.json"
    report.write_json(path)
    data = json.loads(path.read_text())

    engine, http = data["runs"]
    assert len(engine["rounds"]) == len(http["rounds"]) == 3
    assert all(r["output_tokens_per_s"] > 0 and r["ttft_p50_ms"] > 0 for r in http["rounds"])
    comparison = data["comparisons"][0]
    expected = [h["output_tokens_per_s"] / e["output_tokens_per_s"] for e, h in zip(engine["rounds"], http["rounds"])]
    assert comparison["round_ratios"] == pytest.approx(expected)
    assert comparison["ratio_min"] == pytest.approx(min(expected))
    assert comparison["ratio_max"] == pytest.approx(max(expected))
    assert comparison["ratio_stddev"] > 0
    assert comparison["ratio_min"] <= comparison["ratio"] <= comparison["ratio_max"]

    # 3 rounds x 4 requests x 5 tokens = 60 tokens per target
    assert http["server_cpu"]["serving_path"]["cpu_s"] == pytest.approx(6.0)
    assert http["server_cpu"]["serving_path"]["cores_per_10k_tok_s"] == pytest.approx(6.0 * 10_000 / 60)
    assert http["server_cpu"]["tritonserver"]["cpu_s"] == pytest.approx(3.0)
    assert http["server_cpu"]["serving_path"]["cores"] == pytest.approx(6.0 / http["metrics"]["duration_s"])
    assert engine["server_cpu"]["serving_path"]["cpu_s"] == 0.0
    assert engine["server_cpu"]["tritonserver"]["cores_per_10k_tok_s"] == pytest.approx(3.0 * 10_000 / 60)
    assert BenchReport.read_json(path).comparisons[0].round_ratios == comparison["round_ratios"]


async def test_one_round_has_no_spread_and_no_probe_no_cpu():
    plan = BenchPlan(
        targets=[ScriptedTarget("engine"), ScriptedTarget("http", text=True)],
        levels=[ClosedLoop(concurrency=2)],
        requests=_requests(2, output_len=3),
        workload={},
        compare=("engine", "http"),
        warmup_requests=0,
    )
    report = await run_bench(plan, None)
    comparison = report.comparisons[0]
    assert len(comparison.round_ratios) == 1 and comparison.ratio_stddev is None
    assert comparison.ratio_min == comparison.ratio_max == pytest.approx(comparison.ratio)
    assert all(run.server_cpu is None for run in report.runs)


async def test_targets_on_their_own_stacks_are_read_by_their_own_probes_and_their_cpu_per_token_compared():
    """--compare-backends: each target's rounds read its own stack's processes; the comparison gives the
    second's CPU per token over the first's, per group (ours, tritonserver + stubs) and in all."""
    probes = {"http@pytorch": ScriptedProbe(), "http@llmapi": ScriptedProbe()}
    charge = {"http@pytorch": (1.0, 2.0, 1.0), "http@llmapi": (1.0, 2.0, 1.5)}  # ours, tritonserver, stubs per request

    class Charging(ScriptedTarget):
        async def stream(self, request):
            async for chunk in super().stream(request):
                yield chunk
            ours, triton, stubs = charge[self.name]
            cpu = probes[self.name].cpu
            cpu["serving_path"] += ours
            cpu["tritonserver"] += triton
            cpu["python_stubs"] += stubs

    plan = BenchPlan(
        targets=[Charging("http@pytorch", text=True), Charging("http@llmapi", text=True)],
        levels=[ClosedLoop(concurrency=2)],
        requests=_requests(4, output_len=5),
        workload={},
        compare=("http@pytorch", "http@llmapi"),
        warmup_requests=0,
        rounds=2,
        cpu_probes=probes,
    )
    report = await run_bench(plan, None)
    pytorch, llmapi = report.runs
    assert pytorch.server_cpu["python_stubs"].cpu_s == pytest.approx(8 * 1.0)  # 2 rounds x 4 requests
    assert llmapi.server_cpu["python_stubs"].cpu_s == pytest.approx(8 * 1.5)
    ratios = report.comparisons[0].cpu_ratios
    assert ratios["serving_path"] == pytest.approx(1.0)
    assert ratios["triton_and_stubs"] == pytest.approx(3.5 / 3.0)
    assert ratios["total"] == pytest.approx(4.5 / 4.0)


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE)


async def test_a_replaced_root_is_followed_and_a_round_it_ended_in_is_reported():
    """A tritonserver the bench started is read through its supervisor: after a restart the new one is
    measured, and the round in which the old one ended says its CPU misses that process."""
    current = [_sleeper()]
    ended = []
    probe = CpuProbe((), current_roots=lambda: (current[0].pid,))

    class Restarting(ScriptedTarget):
        async def stream(self, request):
            async for chunk in super().stream(request):
                yield chunk
            if not ended:  # the supervised process restarts once, during the first round
                ended.append(current[0])
                current[0].kill()
                current[0].wait()
                current[0] = _sleeper()

    plan = BenchPlan(targets=[Restarting("engine")], levels=[ClosedLoop(concurrency=1)], requests=_requests(2, output_len=2),
                     workload={}, warmup_requests=0, rounds=2, cpu_probe=probe)
    try:
        report = await run_bench(plan, None)
        assert probe.snapshot().keys() == {current[0].pid}  # the one running now
    finally:
        current[0].kill()
        current[0].wait()
    (warning,) = report.warnings  # the first round only: the second read the new process from its start
    assert f"[{ended[0].pid}]" in warning and "ended during a round" in warning
    assert report.runs[0].server_cpu is not None


def test_processes_a_stub_started_count_as_the_stubs(tmp_path):
    """The llmapi model's LLM host and its executor's worker are started by a python stub: their CPU is the
    engine's side (python_stubs), as the tensor stand-in's engine inside its stub is, never ours."""
    stub = tmp_path / "triton_python_backend_stub"
    stub.symlink_to(sys.executable)
    child = "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.readline()'], stdin=subprocess.PIPE); print(p.pid, flush=True); sys.stdin.readline(); p.stdin.close(); p.wait()"
    process = subprocess.Popen([str(stub), "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(process.stdout.readline())
        snapshot = CpuProbe((os.getpid(),)).snapshot()
        assert snapshot[process.pid][0] == "python_stubs"
        assert snapshot[grandchild][0] == "python_stubs"
        assert snapshot[os.getpid()][0] == "truss_process"
    finally:
        process.stdin.close()
        process.wait(10)
