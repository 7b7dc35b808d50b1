"""Readiness that follows the front's refusals: once the front refuses a request because the engine
could not be reached (a 503 whose stream end says `engine_down`), readiness reads 503 too, at once,
whatever the stack's own checks say yet, until the front serves a request again.

The stack's checks (tritonserver alive and ready, the stream workers, the engine probe) see a dead
engine by other roads than a request does, and may read it later: readiness once said 200 for 2-4 s
after a tritonserver kill while requests got 503. A refusal is the front's own evidence, so it counts
first; a request served (its first output read) clears it. Without traffic a refusal counts for
`HOLD_S`: after that readiness is the stack's checks again, so a replica that a load balancer took
out of rotation on a refusal alone (no request comes to clear it) returns once the checks pass.

A refusal of a request sent before the last request served is stale (sent while the engine was down,
answered after it came back) and counts for nothing.

Times are `time.monotonic_ns()`: CLOCK_MONOTONIC, one clock for every process on the host, so the
direct front's processes share theirs in the replica's state file (`fronts.replica_state`); truss's
server keeps them in its process (`Availability`).
"""

from __future__ import annotations

import time

HOLD_S = 5.0
_HOLD_NS = int(HOLD_S * 1e9)


def refusing(refused_ns: int, served_ns: int, now_ns: int) -> bool:
    """Whether readiness must read 503: a refusal since the last request served, within `HOLD_S`."""
    return refused_ns > served_ns and now_ns - refused_ns < _HOLD_NS


class Availability:
    """When the front last refused a request for an unavailable engine and last served one, in one
    process. The shared variant (`fronts.replica_state.SharedAvailability`) has the same methods."""

    def __init__(self) -> None:
        self._refused_ns = 0
        self._served_ns = 0

    def refused(self, sent_ns: int) -> None:
        """A request sent at `sent_ns` was refused: the engine is unavailable."""
        if sent_ns >= self._served_ns:
            self._refused_ns = time.monotonic_ns()

    def served(self) -> None:
        self._served_ns = time.monotonic_ns()

    def refusing(self) -> bool:
        return refusing(self._refused_ns, self._served_ns, time.monotonic_ns())
