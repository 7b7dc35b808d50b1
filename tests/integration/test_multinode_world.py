"""A two-node MPI world on one machine: real Open MPI, real tritonserver ranks, the stand-in engine.

The group is an Open MPI hostfile of this host (node 0, launched locally by mpirun) and `node1`, whose
daemon Open MPI starts through a launch agent (`--mca plm_rsh_agent`, tests/integration/
local_launch_agent.sh) that runs it here with a bare environment, as a fresh ssh login would: what
rank 1 sees of our environment came through mpirun's `-x` forwarding. The stack is started once for
the module (synthetic engine, two tritonserver ranks); the tests then look at the command line, the
placement of the ranks, a request through rank 0, and rank 1's death taking the world down and the
restart bringing both ranks back.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import textwrap
import time
from pathlib import Path

import pytest
from ensemble_stream import ensemble_inputs, run_on_stream
from trtllm_truss.runtime.cluster import (
    HOSTFILE_ENV,
    LAUNCH_AGENT_ENV,
    NODE_RANK_ENV,
    ClusterError,
)
from trtllm_truss.runtime.stack import start_stack
from trtllm_truss.runtime.process_tree import _session_members

pytestmark = [
    pytest.mark.triton,
    pytest.mark.torch,
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed"),
]

REPO_ROOT = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).resolve().parent / "local_launch_agent.sh"
NOT_FORWARDED = "MULTINODE_TEST_NOT_FORWARDED"


def _write_truss(truss_dir: Path, *, node_count: int = 2) -> None:
    truss_dir.mkdir(parents=True, exist_ok=True)
    (truss_dir / "config.yaml").write_text(
        textwrap.dedent(
            f"""\
            model_name: two-node-standin
            resources:
              accelerator: H100:1
              node_count: {node_count}
            model_metadata:
              trt_llm:
                build:
                  base_model_architecture: llama
                  huggingface_ckpt_repository: {REPO_ROOT / "data" / "embedded-llama"}
                  max_input_len: 128
                  max_output_len: 32
                  max_batch_size: 4
                  dtype: float32
                  tensor_parallel_count: 2
                runtime:
                  backend: auto
                  startup_timeout_s: 180
                  pytorch:
                    synthetic: {{step_time_ms: 0}}
            """
        )
    )


def _world_env(tmp: Path, hosts: list[str], node_rank: int) -> dict[str, str]:
    hostfile = tmp / f"hostfile-{len(hosts)}"
    hostfile.write_text("".join(f"{host} slots=1\n" for host in hosts))
    return {
        HOSTFILE_ENV: str(hostfile),
        NODE_RANK_ENV: str(node_rank),
        LAUNCH_AGENT_ENV: str(AGENT),
        "TRTLLM_TRUSS_ARTIFACTS_DIR": str(tmp / "artifacts"),
        "TRTLLM_TRUSS_NODE_WAIT_S": "60",
        NOT_FORWARDED: "1",
    }


def _ranks(stack) -> dict[int, tuple[int, dict[str, str]]]:
    """rank -> (pid, environment) of the tritonserver ranks of `stack`'s world running now (mpirun's
    session holds them all: the agent starts node1's daemon as mpirun's child)."""
    found = {}
    for pid in _session_members(stack.server.pid):
        entry = Path(f"/proc/{pid}")
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = dict(
                item.split("=", 1) for item in (entry / "environ").read_bytes().decode(errors="replace").split("\0")
                if "=" in item
            )
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"tritonserver") or "OMPI_COMM_WORLD_RANK" not in environ:
            continue
        found[int(environ["OMPI_COMM_WORLD_RANK"])] = (int(entry.name), environ)
    return found


def _poll(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


def _generate(stack) -> str:
    result = run_on_stream(stack.server.grpc_url, {"r": ensemble_inputs("Hello there", 8, stream=True)})["r"]
    assert result.error is None, result.error
    return result.text


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two-nodes")
    truss_dir = tmp / "truss"
    _write_truss(truss_dir)
    env = _world_env(tmp, [socket.gethostname(), "node1"], node_rank=0)
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the stack reads the group and mpirun forwards from the process environment
    stack = None
    try:
        stack = start_stack(truss_dir, environ=env, startup_timeout_s=180)
        yield stack, tmp, truss_dir, env
    finally:
        if stack is not None:
            stack.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def test_two_nodes_run_one_world_through_the_real_mpirun_command_line(world):
    stack, tmp, _, _ = world
    command = stack.server.command
    assert command[command.index("--mca") + 1 : command.index("--mca") + 3] == ["plm_rsh_agent", str(AGENT)]
    hostfile = Path(command[command.index("--hostfile") + 1])
    assert hostfile.read_text() == f"{socket.gethostname()} slots=1\nnode1 slots=1\n"
    assert command[command.index("--map-by") + 1] == "ppr:1:node"
    forwarded = [command[i + 1] for i, arg in enumerate(command) if arg == "-x"]
    assert {"PATH", "PYTHONPATH", "TRTLLM_TRUSS_WORLD_ADDRESS"} <= set(forwarded)
    assert NOT_FORWARDED not in forwarded
    # Each rank starts through the wrapper that waits for its node's repository (the same path everywhere).
    assert command.count("wait-for") == 2
    assert str(stack.repository_dir / ".trtllm_truss_repository") in command
    assert stack.repository_dir.parent == tmp / "artifacts" / "repositories"


def test_rank_1_runs_on_node_1_with_only_the_forwarded_environment(world):
    ranks = _ranks(world[0])
    assert sorted(ranks) == [0, 1]
    _, rank0_env = ranks[0]
    _, rank1_env = ranks[1]
    # Rank 0 was started by mpirun itself (node 0); rank 1 by the daemon the agent started for node1.
    assert "TRTLLM_TRUSS_TEST_NODE" not in rank0_env
    assert rank1_env["TRTLLM_TRUSS_TEST_NODE"] == "node1"
    assert rank1_env["OMPI_COMM_WORLD_SIZE"] == "2" and rank1_env["OMPI_COMM_WORLD_LOCAL_RANK"] == "0"
    # The agent's bare environment: rank 1 has what -x forwarded and nothing else of ours.
    assert rank1_env["TRTLLM_TRUSS_WORLD_ADDRESS"] == rank0_env["TRTLLM_TRUSS_WORLD_ADDRESS"]
    assert rank1_env["PYTHONPATH"] == rank0_env["PYTHONPATH"]
    assert NOT_FORWARDED in rank0_env and NOT_FORWARDED not in rank1_env


def test_a_request_is_served_through_rank_0(world):
    stack = world[0]
    assert _generate(stack)


def test_rank_1_dying_fails_the_world_and_the_restart_brings_both_back(world, caplog):
    stack = world[0]
    before = _ranks(stack)
    restarts = stack.server.restarts
    with caplog.at_level(logging.ERROR, logger="trtllm_truss.runtime.stack"):
        os.kill(before[1][0], signal.SIGKILL)
        _poll(lambda: stack.server.restarts == restarts + 1, 60, "the world to be restarted")
        stack.server.wait_ready(180)
    messages = [record.getMessage() for record in caplog.records if record.name == "trtllm_truss.runtime.stack"]
    assert any(
        "rank 1 on node 1 (node1) died of signal 9" in message and "restarting all of it" in message
        for message in messages
    ), messages
    _poll(lambda: sorted(_ranks(stack)) == [0, 1], 60, "both ranks to be back")
    after = _ranks(stack)
    # Rank 0 went down with rank 1 and came back: the restart covered the whole world.
    assert after[0][0] != before[0][0] and after[1][0] != before[1][0]
    assert after[1][1]["TRTLLM_TRUSS_TEST_NODE"] == "node1"
    assert _generate(stack)


def test_a_worker_node_prepares_the_same_repository_and_starts_nothing(world):
    stack, _, truss_dir, env = world
    worker_env = {**env, NODE_RANK_ENV: "1"}
    worker = start_stack(truss_dir, environ=worker_env)
    try:
        assert worker.is_worker_node and worker.server is None
        assert worker.cluster.group.node_rank == 1
        assert worker.repository_dir == stack.repository_dir  # the path node 0's mpirun hands rank 1
    finally:
        worker.stop()


def test_a_group_that_does_not_match_node_count_is_refused_before_any_work(world, tmp_path):
    _, _, truss_dir, env = world
    three = _world_env(tmp_path, [socket.gethostname(), "node1", "node2"], node_rank=0)
    with pytest.raises(ClusterError, match="resources.node_count is 2 but the hostfile .* has 3 node"):
        start_stack(truss_dir, environ={**env, **three})


def test_a_worker_nodes_truss_serves_nothing_and_names_node_0(world):
    import asyncio

    from fastapi import HTTPException
    from trtllm_truss.fronts.service import LLMService

    _, _, truss_dir, env = world
    service = LLMService(truss_dir, environ={**env, NODE_RANK_ENV: "1"})
    service.load()
    try:
        assert asyncio.run(service.is_healthy())  # prepared; the world's health is node 0's
        with pytest.raises(HTTPException) as refused:
            service.limits  # noqa: B018 -- what model.py reads first for every request
        assert refused.value.status_code == 503
        assert refused.value.detail == (
            f"node 1 of 2 runs model ranks only; send requests to node 0 ({socket.gethostname()})"
        )
    finally:
        service.shutdown()


def test_leaderworkerset_variables_launch_the_world_through_mpirun(world):
    """LeaderWorkerSet's own variables (no hostfile) drive the same real launch: the leader's address is
    this host's name, and LWS names the worker pod <leader>-1, a name only the launch agent knows.
    (Slurm's variables give their hostfile in tests/unit/test_cluster_groups.py.)"""
    _, _, truss_dir, env = world
    host = socket.gethostname()
    base = {
        LAUNCH_AGENT_ENV: str(AGENT),
        "TRTLLM_TRUSS_ARTIFACTS_DIR": env["TRTLLM_TRUSS_ARTIFACTS_DIR"],
        "TRTLLM_TRUSS_NODE_WAIT_S": "60",
    }
    lws = {"LWS_LEADER_ADDRESS": host, "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0"}
    expected = [host, f"{host}-1"]
    stack = start_stack(truss_dir, environ={**base, **lws}, startup_timeout_s=180)
    try:
        command = stack.server.command
        hostfile = Path(command[command.index("--hostfile") + 1])
        assert hostfile.read_text() == "".join(f"{name} slots=1\n" for name in expected)
        assert stack.cluster.group.platform == "lws"
        assert _generate(stack)
        assert _ranks(stack)[1][1]["TRTLLM_TRUSS_TEST_NODE"] == expected[1]
    finally:
        stack.stop()


def test_node_1_leaving_fails_the_world_and_the_restart_brings_it_back(world, caplog):
    """Node 1's Open MPI daemon dies (as when its machine or pod goes away): its rank goes with it
    (parent-death signal), mpirun ends the job, and the supervisor restarts the whole world."""
    stack = world[0]
    daemons = [
        pid for pid in _session_members(stack.server.pid)
        if b"orted" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    ]
    assert len(daemons) == 1  # node 0's ranks are mpirun's own children; node1 has a daemon
    restarts = stack.server.restarts
    with caplog.at_level(logging.ERROR, logger="trtllm_truss.runtime.stack"):
        os.kill(daemons[0], signal.SIGKILL)
        _poll(lambda: stack.server.restarts == restarts + 1, 60, "the world to be restarted")
        stack.server.wait_ready(180)
    messages = [record.getMessage() for record in caplog.records if record.name == "trtllm_truss.runtime.stack"]
    assert any(
        message.startswith("node node1 left (mpirun lost its daemon there)") and "restarting all of it" in message
        for message in messages
    ), messages
    _poll(lambda: sorted(_ranks(stack)) == [0, 1], 60, "both ranks to be back")
    assert _generate(stack)
