"""The stand-in's share of a multi-rank world: every rank joins rank 0 before rank 0 reports ready.

NVIDIA's engine in leader mode constructs its executor collectively over MPI: rank 0's `tensorrt_llm`
model is not ready until every rank has joined, and a rank that dies takes the world down. The stand-in
has no collective of its own, so each rank's first instance joins rank 0 over TCP at
`TRTLLM_TRUSS_WORLD_ADDRESS` (host:port of rank 0's node, forwarded by mpirun) and rank 0's
initialization waits for all of them; rank and size are Open MPI's (`OMPI_COMM_WORLD_RANK` /
`OMPI_COMM_WORLD_SIZE`). A rank's death is Open MPI's business: mpirun ends the whole job.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from trtllm_truss.runtime.cluster import WORLD_ADDRESS_ENV

logger = logging.getLogger(__name__)


@dataclass
class WorldMembership:
    rank: int
    size: int
    connections: list[socket.socket] = field(default_factory=list)

    def close(self) -> None:
        for connection in self.connections:
            connection.close()
        self.connections.clear()


def _world_position(environ: Mapping[str, str]) -> tuple[int, int, str] | None:
    address = environ.get(WORLD_ADDRESS_ENV, "")
    try:
        rank = int(environ.get("OMPI_COMM_WORLD_RANK", "0"))
        size = int(environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    except ValueError:
        return None
    if size <= 1 or not address:
        return None
    return rank, size, address


def join_world(environ: Mapping[str, str], timeout_s: float) -> WorldMembership | None:
    """Rank 0: wait until every other rank has connected. Rank > 0: connect to rank 0. None outside a world.
    Raises RuntimeError naming the ranks missing at the timeout."""
    position = _world_position(environ)
    if position is None:
        return None
    rank, size, address = position
    host, _, port_text = address.rpartition(":")
    port = int(port_text)
    membership = WorldMembership(rank=rank, size=size)
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("", port))
        listener.listen(size)
        joined: set[int] = set()
        try:
            while len(joined) < size - 1:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(range(1, size)) - joined)
                    membership.close()
                    raise RuntimeError(f"rank(s) {missing} of {size} did not join rank 0 within {timeout_s:.0f}s")
                listener.settimeout(min(remaining, 1.0))
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    continue
                connection.settimeout(5.0)
                line = connection.makefile("r").readline().strip()
                if line.isdigit():
                    joined.add(int(line))
                    membership.connections.append(connection)
                    logger.info("rank %s joined (%d of %d)", line, len(joined) + 1, size)
                else:
                    connection.close()
        finally:
            listener.close()
        return membership
    while True:
        try:
            connection = socket.create_connection((host, port), timeout=2.0)
            connection.sendall(f"{rank}\n".encode())
            membership.connections.append(connection)
            return membership
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"rank {rank} could not reach rank 0 at {address} within {timeout_s:.0f}s") from None
            time.sleep(0.2)
