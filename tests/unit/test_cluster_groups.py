"""The group of nodes from each platform's own variables, rank placement, hostfile and mpirun options.

The variables are those the platforms document: LeaderWorkerSet sets LWS_LEADER_ADDRESS
(`<lws>-<group>.<lws>.<namespace>`, or `<lws>-<group>.<lws>-<group>.<namespace>` with
subdomainPolicy UniquePerReplica), LWS_GROUP_SIZE and LWS_WORKER_INDEX (kubernetes-sigs/lws
`api/leaderworkerset/v1/leaderworkerset_types.go` and its pod webhook); Slurm sets SLURM_JOB_NODELIST,
SLURM_JOB_NUM_NODES, SLURM_NODEID, SLURMD_NODENAME, SLURM_NTASKS_PER_NODE (sbatch(1) "OUTPUT
ENVIRONMENT VARIABLES").
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from trtllm_truss.runtime.cluster import (
    ClusterError,
    cluster_plan,
    detect_group,
    expand_nodelist,
    explain_world_exit,
    forwarded_names,
    parse_hostfile,
    planned_cluster,
    rank_env_args,
    wait_for_nodes,
)
from trtllm_truss.engine_standin.world import join_world

# --- LeaderWorkerSet -------------------------------------------------------------------------------

LWS_LEADER = {"LWS_LEADER_ADDRESS": "llama-0.llama.serving", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0"}


def test_leaderworkerset_leader_gets_every_pod_of_its_group_and_rank_0():
    plan = cluster_plan(16, 2, 8, LWS_LEADER)
    assert plan.group.platform == "lws"
    assert plan.group.hosts == ("llama-0.llama.serving", "llama-0-1.llama.serving")
    assert plan.group.is_leader
    assert plan.hostfile_text() == "llama-0.llama.serving slots=8\nllama-0-1.llama.serving slots=8\n"
    placement = plan.placement()
    assert [(p.rank, p.node, p.local_rank) for p in placement[7:9]] == [(7, 0, 7), (8, 1, 0)]
    assert {p.host for p in placement[8:]} == {"llama-0-1.llama.serving"}


def test_leaderworkerset_worker_knows_it_is_node_1():
    group = detect_group({**LWS_LEADER, "LWS_WORKER_INDEX": "1"})
    assert group is not None and group.node_rank == 1 and not group.is_leader


def test_leaderworkerset_unique_per_replica_subdomain_and_another_replica():
    group = detect_group(
        {"LWS_LEADER_ADDRESS": "llama-3.llama-3.ns", "LWS_GROUP_SIZE": "3", "LWS_WORKER_INDEX": "2"}
    )
    assert group.hosts == ("llama-3.llama-3.ns", "llama-3-1.llama-3.ns", "llama-3-2.llama-3.ns")
    assert group.node_rank == 2


def test_leaderworkerset_without_worker_index_says_how_to_set_it():
    with pytest.raises(ClusterError, match="LWS_WORKER_INDEX is not set.*worker-index"):
        detect_group({"LWS_LEADER_ADDRESS": "a-0.a.ns", "LWS_GROUP_SIZE": "2"})


def test_leaderworkerset_group_size_must_match_node_count():
    with pytest.raises(ClusterError, match=r"node_count is 2 but the LeaderWorkerSet .* has 3 node.*leaderWorkerTemplate.size"):
        cluster_plan(16, 2, 8, {**LWS_LEADER, "LWS_GROUP_SIZE": "3"})


# --- Slurm ------------------------------------------------------------------------------------------

SLURM_NODE_1 = {
    "SLURM_JOB_NODELIST": "gpu[01-02]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NODEID": "1",
    "SLURMD_NODENAME": "gpu02",
    "SLURM_NTASKS_PER_NODE": "8",
}


def test_slurm_nodelist_gives_hosts_and_this_node():
    plan = cluster_plan(16, 2, 8, SLURM_NODE_1)
    assert plan.group.platform == "slurm"
    assert plan.group.hosts == ("gpu01", "gpu02") and plan.group.node_rank == 1
    assert plan.hostfile_text() == "gpu01 slots=8\ngpu02 slots=8\n"
    assert [p.rank for p in plan.placement() if p.host == "gpu02"] == list(range(8, 16))


def test_slurm_node_rank_from_the_node_name_when_nodeid_is_absent():
    environ = {k: v for k, v in SLURM_NODE_1.items() if k != "SLURM_NODEID"}
    assert detect_group(environ).node_rank == 1
    assert detect_group({**environ, "SLURMD_NODENAME": "gpu01.cluster.local"}).node_rank == 0


def test_slurm_count_disagreeing_with_the_list_is_refused():
    with pytest.raises(ClusterError, match="expands to 2 nodes but SLURM_JOB_NUM_NODES=3"):
        detect_group({**SLURM_NODE_1, "SLURM_JOB_NUM_NODES": "3"})


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("gpu[01-02]", ["gpu01", "gpu02"]),
        ("gnode[10,20,25,37]", ["gnode10", "gnode20", "gnode25", "gnode37"]),
        ("a[1-2],b3", ["a1", "a2", "b3"]),
        ("node[008-010,012]", ["node008", "node009", "node010", "node012"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("single", ["single"]),
    ],
)
def test_slurm_hostlist_expansion(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["gpu[01-", "gpu[a-b]", "gpu[3-1]"])
def test_slurm_hostlist_errors_name_the_list(nodelist):
    with pytest.raises(ClusterError, match="Slurm nodelist"):
        expand_nodelist(nodelist)


# --- hostfile and precedence ------------------------------------------------------------------------


def test_hostfile_with_comments_and_slots(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the group\nleader.example slots=8\n\nworker.example slots=8 # second\n")
    assert parse_hostfile(hostfile.read_text()) == ["leader.example", "worker.example"]
    group = detect_group({"TRTLLM_TRUSS_HOSTFILE": str(hostfile), "TRTLLM_TRUSS_NODE_RANK": "1"})
    assert group.platform == "hostfile" and group.node_rank == 1


def test_hostfile_finds_this_host_by_name_or_asks_for_the_rank(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"elsewhere\n{socket.gethostname()}\n")
    assert detect_group({"TRTLLM_TRUSS_HOSTFILE": str(hostfile)}).node_rank == 1
    hostfile.write_text("elsewhere\nnowhere\n")
    with pytest.raises(ClusterError, match="TRTLLM_TRUSS_NODE_RANK"):
        detect_group({"TRTLLM_TRUSS_HOSTFILE": str(hostfile)})


def test_explicit_hostfile_wins_over_the_platform(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a\nb\n")
    group = detect_group({**SLURM_NODE_1, **LWS_LEADER, "TRTLLM_TRUSS_HOSTFILE": str(hostfile), "TRTLLM_TRUSS_NODE_RANK": "0"})
    assert group.hosts == ("a", "b")


def test_no_group_for_several_nodes_names_every_way_to_give_one():
    with pytest.raises(ClusterError, match="LWS_LEADER_ADDRESS.*SLURM_JOB_NODELIST.*TRTLLM_TRUSS_HOSTFILE"):
        cluster_plan(16, 2, 8, {})


def test_one_node_is_this_host_even_inside_a_slurm_job():
    plan = cluster_plan(8, 1, 8, SLURM_NODE_1)
    assert plan.group.platform == "single" and not plan.multi_node


# --- layout, forwarding, mpirun's reports -------------------------------------------------------------


def test_the_configured_layout_of_16_ranks_on_2_nodes():
    lines = planned_cluster(16, 2, 8).describe()
    assert lines[0].startswith("MPI world of 16 rank(s) on 2 node(s) x 8 GPU(s)")
    assert "node 0 node0: ranks 0-7 on GPUs 0-7 (leader" in lines[1]
    assert "node 1 node1: ranks 8-15 on GPUs 0-7 (worker" in lines[2]


def test_a_world_that_does_not_fill_the_nodes_is_refused():
    with pytest.raises(ClusterError, match="does not fill 2 node"):
        planned_cluster(8, 2, 8)


def test_forwarding_names_paths_and_engine_variables_never_credentials():
    env = {
        "PATH": "/bin",
        "NCCL_IB_HCA": "mlx5",
        "CUDA_VISIBLE_DEVICES": "0",
        "TRTLLM_TRUSS_WORLD_ADDRESS": "h:1",
        "HF_TOKEN": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "TRUSS_SECRET_hf_access_token": "z",
        "UNRELATED": "1",
    }
    names = forwarded_names(env)
    assert names[:3] == ["PATH", "PYTHONPATH", "LD_LIBRARY_PATH"]
    assert {"NCCL_IB_HCA", "CUDA_VISIBLE_DEVICES", "TRTLLM_TRUSS_WORLD_ADDRESS"} <= set(names)
    assert not {"HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "TRUSS_SECRET_hf_access_token", "UNRELATED"} & set(names)
    assert rank_env_args({"PATH": "/bin"})[:2] == ["-x", "PATH"]


def test_mpirun_reports_become_one_line_naming_rank_and_node():
    plan = planned_cluster(16, 2, 8)
    killed = explain_world_exit(
        plan, ["mpirun noticed that process rank 9 with PID 4242 on node gpu02 exited on signal 9 (Killed)."], will_restart=True
    )
    assert killed.startswith("rank 9 on node 1 (gpu02) died of signal 9 (Killed): the MPI world of 16 ranks on 2 nodes")
    assert killed.endswith("restarting all of it (every node's ranks)")
    exited = explain_world_exit(plan, ["  Process name: [[1234,1],3]", "  Exit code:    1"], will_restart=False)
    assert exited.startswith("rank 3 on node 0 exited with exit code 1") and exited.endswith("not restarting it")
    lost = explain_world_exit(
        plan, ["  HNP daemon   : [[1,0],0] on node gpu01", "  Remote daemon: [[1,0],1] on node gpu02"], will_restart=True
    )
    assert lost.startswith("node gpu02 left")
    gone = explain_world_exit(plan, ["ORTE was unable to reliably start one or more daemons."], will_restart=True)
    assert gone.startswith("a node's Open MPI daemon did not start or was lost")


# --- rank 0 waits for every rank; the rank wrapper --------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_rank_0_is_ready_only_once_every_rank_has_joined():
    address = f"127.0.0.1:{_free_port()}"
    joined_at: dict[str, float] = {}

    def rank(number: int, delay: float) -> None:
        time.sleep(delay)
        env = {"OMPI_COMM_WORLD_RANK": str(number), "OMPI_COMM_WORLD_SIZE": "3", "TRTLLM_TRUSS_WORLD_ADDRESS": address}
        join_world(env, 10)
        joined_at[str(number)] = time.monotonic()

    others = [threading.Thread(target=rank, args=(1, 0.0)), threading.Thread(target=rank, args=(2, 0.5))]
    for thread in others:
        thread.start()
    leader = join_world({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3", "TRTLLM_TRUSS_WORLD_ADDRESS": address}, 10)
    leader_ready = time.monotonic()
    for thread in others:
        thread.join(5)
    assert leader is not None and len(leader.connections) == 2
    assert leader_ready >= joined_at["2"] - 0.05  # not before the late rank joined
    leader.close()


def test_a_missing_rank_fails_rank_0_naming_it():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "TRTLLM_TRUSS_WORLD_ADDRESS": f"127.0.0.1:{_free_port()}"}
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[1\] of 2 did not join rank 0 within 1s"):
        join_world(env, 1)
    assert join_world({"OMPI_COMM_WORLD_SIZE": "1"}, 1) is None  # one rank: nothing to join


def test_rank_wrapper_waits_for_the_node_repository_then_becomes_the_command(tmp_path):
    marker = tmp_path / "repo" / ".trtllm_truss_repository"
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "trtllm_truss.runtime.cluster", "wait-for", str(marker), "30", "--", "echo", "started"],
        stdout=subprocess.PIPE, text=True,
    )
    time.sleep(0.5)
    assert wrapper.poll() is None  # still waiting
    marker.parent.mkdir()
    marker.touch()
    out, _ = wrapper.communicate(timeout=30)
    assert wrapper.returncode == 0 and out.strip() == "started"


def test_rank_wrapper_gives_up_with_the_reason(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "trtllm_truss.runtime.cluster", "wait-for", str(tmp_path / "never"), "0.3", "--", "true"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert done.returncode == 1
    assert "did not appear within 0s" in done.stderr and "same config.yaml" in done.stderr


# --- the other nodes must answer before mpirun starts -------------------------------------------------


def _agent(tmp_path: Path, body: str) -> str:
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


def test_the_leader_waits_until_the_other_nodes_answer_through_the_agent(tmp_path):
    # Answers from the third try on, as a worker pod that starts a few seconds after its leader.
    counter = tmp_path / "tries"
    agent = _agent(tmp_path, f'echo x >> {counter}\n[ "$(wc -l < {counter})" -ge 3 ] || {{ echo "no route to $1" >&2; exit 255; }}\nshift; exec sh -c "$*"\n')
    wait_for_nodes(planned_cluster(2, 2, 1), agent, 30, poll_s=0.05)
    assert counter.read_text().count("x") == 3


def test_a_node_that_never_answers_is_named_with_the_agents_last_words(tmp_path):
    agent = _agent(tmp_path, 'echo "ssh: connect to host $1 port 22: Connection refused" >&2\nexit 255\n')
    with pytest.raises(ClusterError, match=r"node 1 \(node1\) did not answer .* within 0s \(last: ssh: connect to host node1"):
        wait_for_nodes(planned_cluster(2, 2, 1), agent, 0.2, poll_s=0.05)
