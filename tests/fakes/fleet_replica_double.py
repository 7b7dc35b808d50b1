"""A fleet replica without its stack: `runtime.fleet_replica.ReplicaWorker` (the real Dynamo worker: discovery,
registration, KV event publisher, health watch) over a stand-in for the stack whose Triton address is given and
which is always ready. For tests of routing that need no engine (tests/unit/test_fleet_routing.py).

    python fleet_replica_double.py SETTINGS_JSON FAKE_GRPC_URL TOKENIZER_DIR

prints one JSON line {"events": <the PULL address its engine would relay KV events to>, "pid": ...} once in
the fleet, and runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from types import SimpleNamespace

import uvloop

from trtllm_truss.runtime.fleet_replica import ReplicaSettings, ReplicaWorker, _bind_events_socket


class _Server:
    failed = None
    alive = True

    def __init__(self, grpc_url: str) -> None:
        self.grpc_url = grpc_url
        self.metrics_url = "none (no tritonserver)"

    def ready(self) -> bool:
        return True


def main() -> None:
    settings = ReplicaSettings.from_json(sys.argv[1])
    stack = SimpleNamespace(server=_Server(sys.argv[2]), plan=SimpleNamespace(tokenizer_dir=sys.argv[3]))
    socket, address = _bind_events_socket()
    worker = ReplicaWorker(settings, stack, socket)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for s in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(s, worker.stop_requested.set)
        task = asyncio.ensure_future(worker.run())
        while not worker.registered and not task.done():
            await asyncio.sleep(0.05)
        print(json.dumps({"events": address, "pid": __import__("os").getpid()}), flush=True)
        await task

    uvloop.run(run())
    socket.close(0)


if __name__ == "__main__":
    main()
