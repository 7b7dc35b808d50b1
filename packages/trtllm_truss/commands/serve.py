"""`trtllm-truss serve [TRUSS_DIR]`: bring up tritonserver with the truss's model and keep it running.

Prints the gRPC / HTTP / metrics endpoints of Triton (NVIDIA's clients work against them unchanged) and
runs until Ctrl-C or SIGTERM, then stops tritonserver cleanly. The supervisor restarts a tritonserver
that dies meanwhile; if it cannot, serve exits non-zero.

`--replicas N` (or a `model_metadata.trt_llm.fleet` section) serves a fleet: N replicas behind NVIDIA
Dynamo's router with the direct front on `--port` (`trtllm_truss.commands.serve_fleet`, `fronts.fleet`).

`--front direct` also serves the API (every dialect, `/v1/models`, readiness, liveness, `/metrics`) on
`--port` from `runtime.direct_front.processes` processes (`trtllm_truss.fronts.direct`): what a truss with
`docker_server` runs (`trtllm-truss init DIR --front direct`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

HELP = "render the Triton model repository, start tritonserver and serve until interrupted"

# Exit codes: 0 stopped by the user, 1 failed to start, 2 tritonserver died and could not be restarted,
# 130 interrupted before it was ready (the shell's code for SIGINT).
EXIT_STARTUP_FAILED = 1
EXIT_SERVER_LOST = 2
EXIT_INTERRUPTED_STARTUP = 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("truss_dir", nargs="?", default=".", type=Path, help="truss directory (default: .)")
    parser.add_argument("--http-port", type=int, help="Triton HTTP port (default: a free port)")
    parser.add_argument("--grpc-port", type=int, help="Triton gRPC port (default: a free port)")
    parser.add_argument("--metrics-port", type=int, help="Triton metrics port (default: a free port)")
    parser.add_argument(
        "--repository-dir", type=Path, help="render the model repository here and keep it (default: a temporary dir)"
    )
    parser.add_argument("--startup-timeout", type=float, help="seconds (default: runtime.startup_timeout_s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tritonserver's own log")
    parser.add_argument("--front", choices=("none", "direct"), default="none",
                        help="direct: also serve the HTTP API from runtime.direct_front.processes processes on --port"
                             " (default: none, tritonserver only)")
    parser.add_argument("--host", default="0.0.0.0", help="--front direct: address to listen on (default: 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8000, help="--front direct: port to listen on (default: 8000; 0: a free one)")
    parser.add_argument("--replicas", type=int, default=None,
                        help="serve a fleet of N replicas behind NVIDIA Dynamo's router (model_metadata.trt_llm.fleet;"
                             " one per GPU set, or N stacks on CPU) with the direct front on --port")


def requested_ports(http: int | None, grpc: int | None, metrics: int | None):
    """Ports given on the command line; the others free ones. None when none was given."""
    from trtllm_truss.runtime.launch import TritonPorts, choose_free_ports

    if http is None and grpc is None and metrics is None:
        return None
    taken = {p for p in (http, grpc, metrics) if p is not None}
    while True:  # a free port may coincide with a requested one: choose again
        free = choose_free_ports()
        if not taken & {free.http, free.grpc, free.metrics}:
            break
    return TritonPorts(http=http or free.http, grpc=grpc or free.grpc, metrics=metrics or free.metrics)


def _configure_logging(console, verbose: bool) -> None:
    from rich.logging import RichHandler

    handler = RichHandler(console=console, show_path=False, markup=False, rich_tracebacks=False)
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[handler], force=True)
    from trtllm_truss.config.errors import install_log_redaction

    install_log_redaction()  # no declared secret's value in any log line, whatever logged it
    # Triton's own log is long; without -v only its warnings and errors show.
    logging.getLogger("trtllm_truss.tritonserver").setLevel(logging.INFO if verbose else logging.WARNING)


def _startup_errors() -> tuple[type[BaseException], ...]:
    from trtllm_truss.artifacts import FetchError
    from trtllm_truss.runtime.cluster import ClusterError
    from trtllm_truss.config import ConfigError
    from trtllm_truss.planning.plan import PlanError
    from trtllm_truss.repository import RepositoryError
    from trtllm_truss.runtime.supervisor import TritonInstallError, TritonStartupError

    return (
        ConfigError, PlanError, FetchError, RepositoryError, ClusterError, TritonInstallError, TritonStartupError, ValueError
    )


def _describe(exc: BaseException) -> str:
    from trtllm_truss.config import ConfigError
    from trtllm_truss.config.errors import redact

    if isinstance(exc, ConfigError):
        return "\n".join(redact(problem) for problem in exc.problems)
    return redact(str(exc))


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from trtllm_truss.runtime.stack import start_stack

    # Piped output (CI logs, tests) gets long lines instead of 80 columns of wrapped log records.
    console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)
    _configure_logging(console, args.verbose)
    if args.replicas is not None or _has_fleet_section(args.truss_dir):
        from trtllm_truss.commands.serve_fleet import run_fleet

        return run_fleet(args, console, _startup_errors(), _describe)
    if args.front == "direct":
        return _run_direct(args, console)

    stop_requested = threading.Event()
    # SIGTERM (docker stop, systemd) stops as cleanly as Ctrl-C.
    previous_sigterm = signal.signal(signal.SIGTERM, lambda *_: stop_requested.set())
    # A shell starts background jobs with SIGINT ignored, and Python then raises no KeyboardInterrupt:
    # `kill -INT` must stop serve wherever it was started.
    previous_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    stack = None
    try:
        try:
            ports = requested_ports(args.http_port, args.grpc_port, args.metrics_port)
            with console.status("starting", spinner="dots") as status:
                stack = start_stack(
                    args.truss_dir,
                    repository_dir=args.repository_dir,
                    ports=ports,
                    startup_timeout_s=args.startup_timeout,
                    progress=lambda message: status.update(message),
                )
        except _startup_errors() as exc:
            console.print(f"[bold red]trtllm-truss serve: {type(exc).__name__}[/]")
            console.print(_describe(exc), markup=False, soft_wrap=True)
            return EXIT_STARTUP_FAILED

        server, plan = stack.server, stack.plan
        out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
        if server is None:  # a worker node of a multi-node group: node 0's mpirun starts its ranks here
            group = stack.cluster.group
            out.print(f"[bold green]prepared[/]: node {group.node_rank} of {group.node_count}, repository"
                      f" {stack.repository_dir}; node 0 ({group.hosts[0]}) starts this node's ranks. Ctrl-C stops.")
            while not stop_requested.wait(0.5):  # a timeout keeps Ctrl-C deliverable
                pass
            return 0
        out.print(f"[bold green]ready[/]: backend {plan.backend}, world size {plan.world_size}, "
                  f"repository {stack.repository_dir}")
        out.print(f"  gRPC     {server.grpc_url}")
        out.print(f"  HTTP     {server.http_url}")
        out.print(f"  metrics  {server.metrics_url}")
        out.print(f"  try: curl -s {server.http_url}/v2/models/ensemble/generate "
                  "-d '{\"text_input\": \"Hello\", \"max_tokens\": 32}'", markup=False)
        out.print("Ctrl-C stops the server.")

        while not stop_requested.wait(0.5):
            if server.failed is not None:
                console.print(
                    f"[bold red]tritonserver exited with code {server.failed.returncode} and could not be "
                    f"restarted[/] (restarts so far: {server.restarts})"
                )
                return EXIT_SERVER_LOST
        return 0
    except KeyboardInterrupt:
        return 0 if stack is not None else EXIT_INTERRUPTED_STARTUP
    finally:
        if stack is not None:
            console.print("stopping tritonserver")
            stack.stop()
        signal.signal(signal.SIGTERM, previous_sigterm)
        signal.signal(signal.SIGINT, previous_sigint)


def _has_fleet_section(truss_dir: Path) -> bool:
    """The truss serves a fleet (`config.fleet_configured`, the rule truss's server follows too); then serve runs
    the fleet, as --replicas does. A configuration that does not load is not a fleet here: the serving path's
    own load_config reports it, naming the problem."""
    from trtllm_truss.config import ConfigError, fleet_configured

    try:
        return fleet_configured(truss_dir)
    except ConfigError:
        return False


def _run_direct(args: argparse.Namespace, console) -> int:
    """The stack and the direct front until SIGTERM / Ctrl-C; exit codes as without it."""
    from trtllm_truss.fronts.direct import DirectFront, DirectFrontError

    stop_requested = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop_requested.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    front = DirectFront(
        args.truss_dir, host=args.host, port=args.port, repository_dir=args.repository_dir,
        ports=requested_ports(args.http_port, args.grpc_port, args.metrics_port), startup_timeout_s=args.startup_timeout,
    )
    try:
        try:
            with console.status("starting", spinner="dots") as status:
                front.start(progress=lambda message: status.update(message))
        except (*_startup_errors(), DirectFrontError) as exc:
            console.print(f"[bold red]trtllm-truss serve: {type(exc).__name__}[/]")
            console.print(_describe(exc), markup=False, soft_wrap=True)
            return EXIT_INTERRUPTED_STARTUP if stop_requested.is_set() else EXIT_STARTUP_FAILED
        if stop_requested.is_set():  # while the last frontends started: the first ones were serving
            return 0
        server = front.stack.server
        console.print(f"[bold green]ready[/]: {front.url} ({len(front.frontend_pids)} frontend processes);"
                      f" tritonserver gRPC {server.grpc_url}. Ctrl-C stops the server.")
        if not front.monitor(stop_requested):
            console.print(f"[bold red]tritonserver exited with code {server.failed.returncode} and could not be "
                          f"restarted[/] (restarts so far: {server.restarts})")
            return EXIT_SERVER_LOST
        return 0
    finally:
        console.print("stopping the frontends and tritonserver")
        front.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
