"""tritonserver's ports and command lines: one rank, or one `mpirun` of ranks (NVIDIA's leader-mode flags).

Pure functions of a LaunchSpec, kept apart from the supervisor so they can be built and tested without a process.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

ENGINE_MODEL = "tensorrt_llm"

__all__ = [
    "LaunchSpec",
    "TritonPorts",
    "build_launch_command",
    "choose_free_ports",
    "tritonserver_rank_args",
]


# ---------------------------------------------------------------------------------------------- ports


@dataclass(frozen=True)
class TritonPorts:
    http: int
    grpc: int
    metrics: int

    def __post_init__(self) -> None:
        values = (self.http, self.grpc, self.metrics)
        if len(set(values)) != 3 or not all(0 < p < 65536 for p in values):
            raise ValueError(f"tritonserver ports must be three distinct ports in 1..65535, got {self}")


def choose_free_ports() -> TritonPorts:
    """Three distinct ports the kernel reports free right now (all three held open while choosing)."""
    sockets = []
    try:
        for _ in range(3):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))  # Triton binds 0.0.0.0, so check the same address
            sockets.append(s)
        http, grpc, metrics = (s.getsockname()[1] for s in sockets)
    finally:
        for s in sockets:
            s.close()
    return TritonPorts(http=http, grpc=grpc, metrics=metrics)


# ----------------------------------------------------------------------------------- command lines


@dataclass(frozen=True)
class LaunchSpec:
    """Everything that determines the tritonserver command line."""

    binary: Path
    repository: Path
    backend_dir: Path
    ports: TritonPorts
    world_size: int = 1
    # Unique per server: several servers on one host must not share python backend shm regions.
    shm_prefix: str = "trtllm_truss_"
    engine_model: str = ENGINE_MODEL
    log_verbose: int = 0
    exit_timeout_s: int = 10
    # By name, not by absolute path: Open MPI treats `/usr/bin/mpirun` like `--prefix /usr` and puts
    # /usr/bin first on the ranks' PATH, so the python backend would embed the system python3.
    mpirun: str = "mpirun"
    oversubscribe: bool = True  # more ranks than cores is fine (CPU tests, SLURM-style hosts)
    extra_args: tuple[str, ...] = ()
    # util-linux `setpriv`, to give each process a parent-death signal (None: launched without one).
    # tritonserver (every rank) gets SIGTERM, so it shuts down gracefully; mpirun gets SIGKILL, because
    # its own SIGTERM handling holds the ranks for a while and then SIGKILLs them, and Open MPI's ranks
    # outlive a killed mpirun, which is why each rank carries its own.
    setpriv: str | None = None
    # Several nodes (trtllm_truss.runtime.cluster): mpirun's global options placing the ranks (hostfile, launch
    # agent), and what every rank's app context starts with: its options (`-x` forwarding) and the argv
    # it starts through (a wrapper that waits for its node's repository).
    mpi_args: tuple[str, ...] = ()
    rank_prefix: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")


def _parent_death(spec: LaunchSpec, signal_name: str) -> list[str]:
    return [spec.setpriv, "--pdeathsig", signal_name, "--"] if spec.setpriv else []


def tritonserver_rank_args(spec: LaunchSpec, rank: int) -> list[str]:
    """The tritonserver argv of one rank (rank 0 is the only one for world size 1)."""
    args = [
        *_parent_death(spec, "TERM"),
        str(spec.binary),
        f"--model-repository={spec.repository}",
        f"--backend-directory={spec.backend_dir}",
    ]
    if rank == 0:
        args += [
            f"--grpc-port={spec.ports.grpc}",
            f"--http-port={spec.ports.http}",
            f"--metrics-port={spec.ports.metrics}",
        ]
    else:
        # As NVIDIA's launcher: ranks > 0 load only the engine model, which joins rank 0's executor.
        args += ["--model-control-mode=explicit", f"--load-model={spec.engine_model}"]
        # NVIDIA gives every rank the same ports; that works on GPUs only because the TensorRT-LLM backend
        # never returns from a worker rank's model load. Worker ranks serve nothing, so they open no ports
        # at all, which also keeps a python-backend engine model (the CPU stand-in) from clashing on them.
        args += ["--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"]
    args += [
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name={spec.shm_prefix}prefix{rank}_",
        f"--exit-timeout-secs={spec.exit_timeout_s}",
    ]
    if spec.log_verbose:
        args.append(f"--log-verbose={spec.log_verbose}")
    args += list(spec.extra_args)
    return args


def build_launch_command(spec: LaunchSpec) -> list[str]:
    """tritonserver itself for world size 1; `mpirun ... -n 1 <rank 0> : -n 1 <rank 1> ...` otherwise."""
    if spec.world_size == 1:
        return tritonserver_rank_args(spec, 0)
    command = [*_parent_death(spec, "KILL"), spec.mpirun, "--allow-run-as-root"]
    if spec.oversubscribe:
        command.append("--oversubscribe")
    command += spec.mpi_args
    for rank in range(spec.world_size):
        if rank:
            command.append(":")
        command += ["-n", "1", *spec.rank_prefix, *tritonserver_rank_args(spec, rank)]
    return command
