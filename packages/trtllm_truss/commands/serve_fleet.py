"""`trtllm-truss serve DIR --replicas N`: a fleet on this host (`fronts.fleet.FleetFront`) until SIGTERM / Ctrl-C.

Exit codes as `serve`'s: 0 stopped, 1 failed to start, 130 interrupted while starting. A replica that
exits is started again; the fleet serves while one of its replicas is ready.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable


EXIT_STARTUP_FAILED = 1  # as serve's
EXIT_INTERRUPTED_STARTUP = 130


def run_fleet(args: argparse.Namespace, console, startup_errors: tuple[type[BaseException], ...],
              describe: Callable[[BaseException], str]) -> int:
    """`startup_errors`, `describe`: serve's (which errors are reported as a failed start, and how)."""
    from trtllm_truss.fronts.direct import DirectFrontError
    from trtllm_truss.fronts.fleet import FleetFront

    if args.replicas is not None and args.replicas < 1:
        console.print(f"[bold red]trtllm-truss serve: --replicas {args.replicas}: at least 1[/]")
        return EXIT_STARTUP_FAILED
    stop_requested = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop_requested.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    front = FleetFront(args.truss_dir, replicas=args.replicas, host=args.host, port=args.port,
                       startup_timeout_s=args.startup_timeout)
    try:
        try:
            with console.status("starting", spinner="dots") as status:
                front.start(progress=lambda message: status.update(message))
        except (*startup_errors, DirectFrontError, RuntimeError) as exc:
            console.print(f"[bold red]trtllm-truss serve: {type(exc).__name__}[/]")
            console.print(describe(exc), markup=False, soft_wrap=True)
            return EXIT_INTERRUPTED_STARTUP if stop_requested.is_set() else EXIT_STARTUP_FAILED
        if stop_requested.is_set():
            return 0
        plan = front.fleet_plan
        console.print(f"[bold green]ready[/]: {front.url}, a fleet of {plan.replicas} replica(s) (pids"
                      f" {', '.join(map(str, front.replicas.pids()))}) behind Dynamo's {plan.router_mode} router,"
                      f" {len(front.frontend_pids)} frontend process(es). Ctrl-C stops it.")
        front.monitor(stop_requested)
        return 0
    finally:
        console.print("stopping the frontends and the replicas")
        front.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
