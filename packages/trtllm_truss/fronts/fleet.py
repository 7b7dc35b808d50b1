"""A fleet on one host: `trtllm-truss serve DIR --replicas N`.

The fleet's start (plan, replicas, readiness, the routers' settings) is `fronts.fleet_stack`, which truss's
server uses too (`fronts.service.LLMService`, where `model_metadata.trt_llm.fleet` is set): there truss's
server process takes the launcher's part and one frontend's (its `load()` starts the replicas from a thread of
the fleet's own, which restarts them; its event loop holds the router and streams).

Who owns what (one host; several hosts run the same with one discovery, docs/deploy.md "Fleet"):

| process | owns |
|---|---|
| launcher (`FleetFront`, this module; the direct front's launcher, `fronts.direct`) | the fleet's plan (`planning.fleet`, started by `fronts.fleet_stack`), the replicas (`runtime.fleet.FleetReplicas`: started, started again when one exits, stopped), the file-discovery directory, the listening socket, the shared state, the frontends; readiness: ready while at least one replica's tritonserver is |
| replica `i` (`runtime.fleet_replica`, N of them, each its own process group) | its stack (artifacts, repository, tritonserver and its supervisor, which restarts it) on its GPUs; its Dynamo worker: the instance of `<namespace>.replica.generate` that says where its Triton is, its model registration (KV block size), the KV events relayed from its engine to Dynamo's event plane; it leaves the fleet while its tritonserver is down |
| tritonserver of replica `i`, its stubs | as with one replica; the engine's python model relays its KV cache events to its replica (`runtime.kv_event_relay`) |
| frontend `j` (`fronts.direct_app`, M of them) | as with one replica (HTTP, dialects, request core, tokenizer, detokenizer), plus its `streaming.fleet_router.FleetRouter`: a Dynamo runtime, the endpoint's client and Dynamo's `KvRouter`, which picks the replica of each engine request; the frontend streams from that replica's Triton gRPC itself |
| truss's server, in place of the launcher and the frontends (`fronts.service`) | the launcher's part (the replicas, started and restarted from the thread `FleetReplicas.start_watched` makes, stopped by the service's SIGTERM handler before the server exits) and one frontend's, on truss's event loop (`fronts.fleet_stack.LoopRouter` attaches the router at the first readiness check or request) |

Nothing of ours decides where a request goes: Dynamo's router does (kv: by the replicas' KV events and
load; approximate: by where it sent prefixes before; round_robin: Dynamo's client). A replica that dies
(or is stopped) leaves the fleet: its open streams end with an error (their gRPC stream breaks), the router
stops choosing it (its instance unregisters at once on a clean stop or a tritonserver death; discovery's
lease drops a killed one), and the launcher starts it again: it rejoins as a new instance.
Stop (SIGTERM / SIGINT to the launcher): the frontends (as the direct front), then every replica
(SIGTERM: it leaves the fleet, stops its tritonserver and Dynamo's runtime), then the discovery directory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtllm_truss.fronts.direct import DirectFront
from trtllm_truss.fronts.fleet_stack import front_settings, start_fleet_stack

__all__ = ["FleetFront", "front_settings"]

logger = logging.getLogger(__name__)

FIRST_REPLICA_TIMEOUT_S = 600.0


class FleetFront(DirectFront):
    def __init__(self, truss_dir: Path | str, *, replicas: int | None = None, advertise_host: str | None = None,
                 log_dir: Path | None = None, **kwargs: Any) -> None:
        super().__init__(truss_dir, **kwargs)
        self._replica_count = replicas
        self._advertise_host = advertise_host
        self._log_dir = log_dir
        self.fleet_plan: Any = None
        self.replicas: Any = None
        self._front_settings: Any = None

    def _start_stack(self, progress: Callable[[str], None]) -> Any:
        """The fleet (`fronts.fleet_stack`), the same as truss's server starts for a fleet."""
        stack = start_fleet_stack(
            self.truss_dir, self._environ, secrets=self._secrets, replicas=self._replica_count,
            advertise_host=self._advertise_host, log_dir=self._log_dir, startup_timeout_s=self._startup_timeout_s,
            progress=progress,
        )
        self.fleet_plan, self.replicas, self._front_settings = stack.fleet_plan, stack.replicas, stack.front_settings
        return stack

    def _frontend_extra(self) -> dict[str, Any]:
        return {"fleet": self._front_settings}

    def _start_probe(self, plan: Any) -> None:
        pass  # each replica's stack is its own; the fleet is ready while one replica is

    def check(self) -> bool:
        if self.replicas is not None:
            self.replicas.check()
        return super().check()
