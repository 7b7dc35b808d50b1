"""One MPI world over several nodes: which nodes form the group, which rank runs where, and how mpirun
reaches them.

`resources.node_count` > 1 makes the deployment a group of nodes that serve one model as one MPI world,
as NVIDIA runs TensorRT-LLM across nodes (tensorrtllm_backend's leader mode under `mpirun`, Triton's
Kubernetes multi-node tutorial, `trtllm-llmapi-launch` for the LLM API). The group comes from the
platform, each by the variables it documents:

- Kubernetes LeaderWorkerSet (kubernetes-sigs/lws, `api/leaderworkerset/v1/leaderworkerset_types.go`):
  `LWS_LEADER_ADDRESS` (`<lws>-<group>.<subdomain>.<namespace>`), `LWS_GROUP_SIZE`, `LWS_WORKER_INDEX`
  (0 on the leader; LWS >= 0.6). Worker pods are named `<leader pod>-<index>` on the same headless
  service (the LWS pod webhook sets `hostname` and `subdomain` so), which gives every node's address.
- Slurm (sbatch(1)/srun(1) "OUTPUT ENVIRONMENT VARIABLES"): `SLURM_JOB_NODELIST` (hostlist syntax,
  e.g. `gpu[01-02]`; `SLURM_NODELIST` on older releases), `SLURM_JOB_NUM_NODES` (`SLURM_NNODES`),
  `SLURM_NODEID` (this node's index in the list) or `SLURMD_NODENAME`.
- An explicit Open MPI hostfile: `TRTLLM_TRUSS_HOSTFILE` (one host per line, `slots=` ignored: every
  node holds resources.accelerator's GPU count), this node's line by `TRTLLM_TRUSS_NODE_RANK` or by
  host name.

Ranks are placed in blocks, `gpus_per_node` per node: rank r runs on node r // gpus_per_node with local
GPU r % gpus_per_node (TensorRT-LLM's default device of a rank). Node 0 runs truss's server, the stream
workers, `mpirun` and rank 0 (Triton's leader); every other node prepares its share of the artifacts
(a prebuilt engine's files of its own ranks) and the same model repository (at the same paths) and
waits for mpirun to start its ranks there. `mpirun` reaches the
other nodes through Open MPI's rsh launcher: `ssh` by default, or the command in
`TRTLLM_TRUSS_MPI_LAUNCH_AGENT` (`--mca plm_rsh_agent`, e.g. NVIDIA's tutorial's `kubessh`).

This module reads only the environment; it starts nothing. `python -m trtllm_truss.runtime.cluster wait-for`
is the small wrapper each rank starts through: it waits until its node has the model repository
(the node's own truss prepared it) and then becomes the rank's command.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

HOSTFILE_ENV = "TRTLLM_TRUSS_HOSTFILE"
NODE_RANK_ENV = "TRTLLM_TRUSS_NODE_RANK"
LAUNCH_AGENT_ENV = "TRTLLM_TRUSS_MPI_LAUNCH_AGENT"
# Rank 0's rendezvous address for the ranks of one world (the stand-in engine joins through it).
WORLD_ADDRESS_ENV = "TRTLLM_TRUSS_WORLD_ADDRESS"
# How long a rank waits for its node's repository before giving up (seconds).
NODE_WAIT_ENV = "TRTLLM_TRUSS_NODE_WAIT_S"
DEFAULT_NODE_WAIT_S = 1800.0

LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_GROUP_SIZE = "LWS_GROUP_SIZE"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"
SLURM_NODELIST_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
SLURM_NUM_NODES_VARS = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")
SLURM_NODEID = "SLURM_NODEID"
SLURMD_NODENAME = "SLURMD_NODENAME"

# Variables mpirun forwards to every rank (`-x NAME`; mpirun's own environment supplies the value).
# Names only, never values: the launch environment is already free of credentials (config.child_env).
# PATH, PYTHONPATH and LD_LIBRARY_PATH always: the launcher adds to them after this list is made.
FORWARDED_ALWAYS = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH")
FORWARDED_NAMES = ("HOME", "HF_HOME", "TMPDIR", WORLD_ADDRESS_ENV, NODE_WAIT_ENV)
FORWARDED_PREFIXES = ("CUDA_", "NCCL_", "UCX_", "TRTLLM_", "TLLM_", "NVIDIA_", "OMPI_MCA_")


class ClusterError(RuntimeError):
    """The platform's group does not match the configuration, or cannot be read; the message says which
    variable or key to change."""


@dataclass(frozen=True)
class NodeGroup:
    """The nodes of one deployment, in node-rank order, and which of them this process runs on."""

    platform: str  # "single", "lws", "slurm" or "hostfile"
    hosts: tuple[str, ...]
    node_rank: int
    source: str  # where the group was read from, for messages

    @property
    def node_count(self) -> int:
        return len(self.hosts)

    @property
    def is_leader(self) -> bool:
        return self.node_rank == 0


@dataclass(frozen=True)
class RankPlacement:
    rank: int
    node: int
    host: str
    local_rank: int  # the GPU on its node


@dataclass(frozen=True)
class ClusterPlan:
    """A group of nodes and the world that runs on it."""

    group: NodeGroup
    gpus_per_node: int
    world_size: int

    def __post_init__(self) -> None:
        expected = self.group.node_count * self.gpus_per_node
        if self.world_size != expected:
            raise ClusterError(
                f"a world of {self.world_size} ranks does not fill {self.group.node_count} node(s) of"
                f" {self.gpus_per_node} GPU(s) ({expected} ranks)"
            )

    @property
    def multi_node(self) -> bool:
        return self.group.node_count > 1

    def placement(self) -> list[RankPlacement]:
        return place_ranks(self.world_size, self.group.hosts, self.gpus_per_node)

    def hostfile_text(self) -> str:
        """Open MPI hostfile: one line per node, its GPUs as slots."""
        return "".join(f"{host} slots={self.gpus_per_node}\n" for host in self.group.hosts)

    def mpirun_args(self, hostfile: Path, *, agent: str | None = None) -> list[str]:
        """mpirun's global options that spread the ranks over the group (before the app contexts)."""
        args = ["--hostfile", str(hostfile), "--map-by", f"ppr:{self.gpus_per_node}:node"]
        if agent:
            args += ["--mca", "plm_rsh_agent", agent]
        return args

    def describe(self) -> list[str]:
        """Which rank runs where, one line per node (validate and serve print it)."""
        lines = [
            (
                f"MPI world of {self.world_size} rank(s) on {self.group.node_count} node(s) x {self.gpus_per_node}"
                f" GPU(s) ({self.group.source})"
            )
        ]
        by_node: dict[int, list[RankPlacement]] = {}
        for placed in self.placement():
            by_node.setdefault(placed.node, []).append(placed)
        for node, ranks in by_node.items():
            role = "leader: truss server, stream workers, mpirun, Triton's rank 0" if node == 0 else "worker: ranks only"
            first, last = ranks[0].rank, ranks[-1].rank
            span = f"rank {first}" if first == last else f"ranks {first}-{last}"
            lines.append(f"  node {node} {ranks[0].host}: {span} on GPUs 0-{len(ranks) - 1} ({role})")
        return lines


def rank_env_args(env: Mapping[str, str]) -> list[str]:
    """`-x NAME` for every forwarded variable. Open MPI 4.1 takes `-x` per app context: given once before
    `-n 1 cmd : -n 1 cmd`, it reaches only the first context's ranks (seen here: a remote rank 1 lacked
    the variable), so every rank's context carries the list."""
    args: list[str] = []
    for name in forwarded_names(env):
        args += ["-x", name]
    return args


def place_ranks(world_size: int, hosts: Sequence[str], gpus_per_node: int) -> list[RankPlacement]:
    """Rank r on node r // gpus_per_node, GPU r % gpus_per_node."""
    if gpus_per_node < 1 or world_size > len(hosts) * gpus_per_node:
        raise ClusterError(f"{world_size} ranks do not fit on {len(hosts)} node(s) of {gpus_per_node} GPU(s)")
    return [
        RankPlacement(rank=r, node=r // gpus_per_node, host=hosts[r // gpus_per_node], local_rank=r % gpus_per_node)
        for r in range(world_size)
    ]


# --- the group from the platform ------------------------------------------------------------------


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm hostlist syntax -> host names: `gpu[01-02],cpu3` -> gpu01, gpu02, cpu3; ranges keep their
    zero padding; several bracket groups in one name multiply (`r[1-2]n[1-2]`)."""
    hosts: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        if not item:
            continue
        parts = re.split(r"(\[[^\]]*\])", item)
        choices: list[list[str]] = []
        for part in parts:
            if part.startswith("[") and part.endswith("]"):
                choices.append(_expand_ranges(part[1:-1], nodelist))
            elif "[" in part or "]" in part:
                raise ClusterError(f"unbalanced brackets in Slurm nodelist {nodelist!r}")
            else:
                choices.append([part])
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    return items


def _expand_ranges(spec: str, whole: str) -> list[str]:
    values: list[str] = []
    for piece in spec.split(","):
        low, dash, high = piece.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ClusterError(f"bad range {piece!r} in Slurm nodelist {whole!r}")
        if not dash:
            values.append(low)
            continue
        width = len(low)
        if int(high) < int(low):
            raise ClusterError(f"descending range {piece!r} in Slurm nodelist {whole!r}")
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def parse_hostfile(text: str) -> list[str]:
    """Host names of an Open MPI hostfile (comments and `slots=...` options dropped), in order."""
    hosts = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            hosts.append(line.split()[0])
    return hosts


def lws_worker_address(leader_address: str, index: int) -> str:
    """Worker `index`'s address: LWS names worker pods `<leader pod>-<index>` on the leader's subdomain."""
    if index == 0:
        return leader_address
    pod, dot, domain = leader_address.partition(".")
    return f"{pod}-{index}{dot}{domain}"


def _int_var(environ: Mapping[str, str], name: str) -> int:
    value = environ.get(name, "")
    try:
        number = int(value)
    except ValueError:
        raise ClusterError(f"{name}={value!r} is not an integer") from None
    if number < 0:
        raise ClusterError(f"{name}={value} is negative")
    return number


def _first(environ: Mapping[str, str], names: Sequence[str]) -> tuple[str, str] | None:
    for name in names:
        if environ.get(name):
            return name, environ[name]
    return None


def _short(host: str) -> str:
    return host.split(".", 1)[0]


def _rank_by_name(hosts: Sequence[str], name: str) -> int | None:
    for index, host in enumerate(hosts):
        if host == name or _short(host) == _short(name):
            return index
    return None


def _from_hostfile(environ: Mapping[str, str]) -> NodeGroup:
    path = Path(environ[HOSTFILE_ENV])
    try:
        hosts = parse_hostfile(path.read_text())
    except OSError as exc:
        raise ClusterError(f"{HOSTFILE_ENV}={path}: cannot read it ({exc.strerror})") from None
    if not hosts:
        raise ClusterError(f"{HOSTFILE_ENV}={path}: no hosts in it")
    if environ.get(NODE_RANK_ENV, "") != "":
        node_rank = _int_var(environ, NODE_RANK_ENV)
    else:
        found = _rank_by_name(hosts, socket.gethostname())
        if found is None:
            raise ClusterError(
                f"{HOSTFILE_ENV}={path}: this host ({socket.gethostname()}) is not in it; set {NODE_RANK_ENV}"
                " to this node's line (0 = the leader)"
            )
        node_rank = found
    return NodeGroup("hostfile", tuple(hosts), node_rank, f"hostfile {path}")


def _from_lws(environ: Mapping[str, str]) -> NodeGroup:
    leader = environ[LWS_LEADER_ADDRESS]
    if not environ.get(LWS_GROUP_SIZE):
        raise ClusterError(f"{LWS_LEADER_ADDRESS} is set but {LWS_GROUP_SIZE} is not (is this a LeaderWorkerSet pod?)")
    size = _int_var(environ, LWS_GROUP_SIZE)
    if not environ.get(LWS_WORKER_INDEX):
        raise ClusterError(
            f"{LWS_WORKER_INDEX} is not set: LeaderWorkerSet sets it from 0.6 on; on older releases set it from"
            " the pod label leaderworkerset.sigs.k8s.io/worker-index (downward API)"
        )
    index = _int_var(environ, LWS_WORKER_INDEX)
    if size < 1 or index >= size:
        raise ClusterError(f"{LWS_WORKER_INDEX}={index} is outside the group of {LWS_GROUP_SIZE}={size}")
    hosts = tuple(lws_worker_address(leader, i) for i in range(size))
    return NodeGroup("lws", hosts, index, f"LeaderWorkerSet {LWS_LEADER_ADDRESS}={leader}")


def _from_slurm(environ: Mapping[str, str]) -> NodeGroup:
    found = _first(environ, SLURM_NODELIST_VARS)
    assert found is not None
    name, nodelist = found
    hosts = expand_nodelist(nodelist)
    if not hosts:
        raise ClusterError(f"{name}={nodelist!r} names no nodes")
    counted = _first(environ, SLURM_NUM_NODES_VARS)
    if counted is not None and counted[1].isdigit() and int(counted[1]) != len(hosts):
        raise ClusterError(f"{name}={nodelist!r} expands to {len(hosts)} nodes but {counted[0]}={counted[1]}")
    if environ.get(SLURM_NODEID, "") != "":
        node_rank = _int_var(environ, SLURM_NODEID)
    else:
        node_name = environ.get(SLURMD_NODENAME) or socket.gethostname()
        found_rank = _rank_by_name(hosts, node_name)
        if found_rank is None:
            raise ClusterError(f"this node ({node_name}) is not in {name}={nodelist!r} and {SLURM_NODEID} is not set")
        node_rank = found_rank
    if node_rank >= len(hosts):
        raise ClusterError(f"{SLURM_NODEID}={node_rank} is outside {name}={nodelist!r} ({len(hosts)} nodes)")
    return NodeGroup("slurm", tuple(hosts), node_rank, f"Slurm {name}={nodelist}")


def detect_group(environ: Mapping[str, str] | None = None) -> NodeGroup | None:
    """The group the platform describes, in this order: an explicit hostfile, LeaderWorkerSet, Slurm.
    None when none of them is present."""
    environ = os.environ if environ is None else environ
    if environ.get(HOSTFILE_ENV):
        return _from_hostfile(environ)
    if environ.get(LWS_LEADER_ADDRESS):
        return _from_lws(environ)
    if _first(environ, SLURM_NODELIST_VARS) is not None:
        return _from_slurm(environ)
    return None


def cluster_plan(
    world_size: int, node_count: int, gpus_per_node: int, environ: Mapping[str, str] | None = None
) -> ClusterPlan:
    """The world for `node_count` nodes on this platform. One node: this host alone, whatever the platform
    says (a single-node deployment inside a Slurm job is still single-node)."""
    if node_count <= 1:
        group = NodeGroup("single", (socket.gethostname(),), 0, "one node")
        return ClusterPlan(group, gpus_per_node=max(world_size, 1), world_size=max(world_size, 1))
    group = detect_group(environ)
    if group is None:
        raise ClusterError(
            f"resources.node_count is {node_count} but no group of nodes was found: run the truss as a"
            f" Kubernetes LeaderWorkerSet ({LWS_LEADER_ADDRESS}, {LWS_GROUP_SIZE}, {LWS_WORKER_INDEX}), inside a"
            f" Slurm job (SLURM_JOB_NODELIST, SLURM_NODEID), or name the nodes in an Open MPI hostfile ({HOSTFILE_ENV})"
        )
    if group.node_count != node_count:
        raise ClusterError(
            f"resources.node_count is {node_count} but the {group.source} has {group.node_count} node(s);"
            " make them agree (LeaderWorkerSet: leaderWorkerTemplate.size; Slurm: --nodes)"
        )
    return ClusterPlan(group, gpus_per_node=gpus_per_node, world_size=world_size)


def planned_cluster(world_size: int, node_count: int, gpus_per_node: int) -> ClusterPlan:
    """The world as the configuration lays it out, nodes named by rank (`validate`, before any platform)."""
    hosts = tuple(f"node{i}" for i in range(node_count))
    return ClusterPlan(NodeGroup("planned", hosts, 0, "resources.node_count"), gpus_per_node, world_size)


def forwarded_names(env: Mapping[str, str]) -> list[str]:
    """The names mpirun forwards to remote ranks: FORWARDED_ALWAYS, and those of FORWARDED_NAMES /
    FORWARDED_PREFIXES that are set."""
    chosen = {name for name in env if name in FORWARDED_NAMES or name.startswith(FORWARDED_PREFIXES)}
    return [*FORWARDED_ALWAYS, *sorted(chosen - set(FORWARDED_ALWAYS))]


def node_wait_s(environ: Mapping[str, str]) -> float:
    return float(environ.get(NODE_WAIT_ENV) or DEFAULT_NODE_WAIT_S)


def launch_agent(environ: Mapping[str, str] | None = None) -> str | None:
    environ = os.environ if environ is None else environ
    return environ.get(LAUNCH_AGENT_ENV) or None


def wait_for_nodes(
    plan: ClusterPlan,
    agent: str | None,
    timeout_s: float,
    *,
    env: Mapping[str, str] | None = None,
    poll_s: float = 2.0,
) -> None:
    """Block until the launch agent (default ssh) runs `true` on every other node, as mpirun will run its
    daemons there. Pods and nodes of a group start in any order: without this, a leader up before its
    workers would fail its first launch. Raises ClusterError naming the node and the agent's last words."""
    import shlex
    import subprocess

    command = shlex.split(agent) if agent else ["ssh", "-o", "BatchMode=yes"]
    deadline = time.monotonic() + timeout_s
    for node, host in enumerate(plan.group.hosts):
        if node == plan.group.node_rank:
            continue
        while True:
            try:
                done = subprocess.run(
                    [*command, host, "true"], env=None if env is None else dict(env), capture_output=True,
                    text=True, timeout=max(1.0, min(30.0, deadline - time.monotonic())), check=False,
                )
                ok, said = done.returncode == 0, (done.stderr or done.stdout).strip()
            except (OSError, subprocess.TimeoutExpired) as exc:
                ok, said = False, str(exc)
            if ok:
                break
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"node {node} ({host}) did not answer through {' '.join(command)} within {timeout_s:.0f}s"
                    f" (last: {said.splitlines()[-1] if said else 'no output'}); mpirun starts that node's ranks"
                    f" this way: check the node is up and reachable, or set {LAUNCH_AGENT_ENV}"
                )
            time.sleep(poll_s)


def write_hostfile(plan: ClusterPlan, directory: Path) -> Path:
    path = Path(directory) / "hostfile"
    path.write_text(plan.hostfile_text())
    return path


def repository_digest(repository: Path) -> str:
    """sha256 over the relative paths and bytes of every file: equal digests, equal repositories."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(repository).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(repository)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


# --- a world that ended ---------------------------------------------------------------------------

# What Open MPI 4.1's mpirun prints when a rank or a node ends the job.
_RANK_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)(?: \(([^)]+)\))?")
_RANK_STATUS = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]")
_EXIT_CODE = re.compile(r"Exit code:\s+(\d+)")
_LOST_DAEMON = re.compile(r"Remote daemon: \[\[\d+,\d+\],\d+\] on node (\S+)")
_DAEMON_FAILED = "ORTE was unable to reliably start one or more daemons"


def explain_world_exit(plan: ClusterPlan, log_tail: Sequence[str], *, will_restart: bool) -> str:
    """One line saying which rank or node ended the world, from mpirun's own report."""
    text = "\n".join(log_tail)
    placement = plan.placement()
    world = f"the MPI world of {plan.world_size} ranks on {plan.group.node_count} nodes"
    then = "; restarting all of it (every node's ranks)" if will_restart else "; not restarting it"
    match = _RANK_SIGNAL.search(text)
    if match:
        rank = int(match[1])
        node = placement[rank].node if rank < len(placement) else "?"
        signal_name = f" ({match[4]})" if match[4] else ""
        return f"rank {rank} on node {node} ({match[2]}) died of signal {match[3]}{signal_name}: {world} failed with it{then}"
    match = _LOST_DAEMON.search(text)
    if match:
        return f"node {match[1]} left (mpirun lost its daemon there): {world} failed with it{then}"
    if _DAEMON_FAILED in text:
        return (
            f"a node's Open MPI daemon did not start or was lost (mpirun: {_DAEMON_FAILED}): {world} failed with it"
            f"{then}"
        )
    match = _RANK_STATUS.search(text)
    if match:
        rank = int(match[1])
        node = placement[rank].node if rank < len(placement) else "?"
        code = _EXIT_CODE.search(text)
        status = f" with exit code {code[1]}" if code else ""
        return f"rank {rank} on node {node} exited{status}: {world} failed with it{then}"
    return f"{world} ended (see mpirun's output above){then}"


# --- the rank wrapper -----------------------------------------------------------------------------


def wait_for_path(path: Path, timeout_s: float, *, poll_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def rank_wrapper(path: Path, timeout_s: float) -> list[str]:
    """The argv prefix that makes a rank wait for `path` on its own node before it starts."""
    return [sys.executable, "-m", "trtllm_truss.runtime.cluster", "wait-for", str(path), str(timeout_s), "--"]


def main(argv: Sequence[str] | None = None) -> int:
    """`wait-for PATH TIMEOUT_S -- COMMAND...`: wait until PATH exists on this node, then exec COMMAND."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 5 or args[0] != "wait-for" or args[3] != "--":
        print("usage: python -m trtllm_truss.runtime.cluster wait-for PATH TIMEOUT_S -- COMMAND...", file=sys.stderr)
        return 2
    path, timeout_s, command = Path(args[1]), float(args[2]), args[4:]
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "?")
    if not wait_for_path(path, timeout_s):
        print(
            f"error: rank {rank} on {socket.gethostname()}: {path} did not appear within {timeout_s:.0f}s;"
            " this node's truss has not prepared the model (is it running, with the same config.yaml and"
            " environment as node 0?)",
            file=sys.stderr,
            flush=True,
        )
        return 1
    os.execvp(command[0], command)
    return 1  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
