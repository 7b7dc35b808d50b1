"""Which of a fleet's replicas took a request, told to its client in a response header.

A fleet's front (`fronts.fleet`) streams each request from the replica Dynamo's router picks
(`streaming.fleet_router`); the request's `ResponseStream.replica` names it once routed. The request core
keeps the names on the HTTP request when the first output arrives (before any status is sent), and both
fronts send them as `x-replica` on every dialect's response, streamed or not: the direct front's routes, and
under truss's server `with_replica_header` (a dict or model answer becomes the JSON response truss would send).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from starlette.responses import JSONResponse, Response

# The response header naming the fleet's replica(s) that took a request: their Dynamo instance ids, in
# choice order (a fleet's front only: streaming.fleet_router picks them; fronts.direct_app sends it).
REPLICA_HEADER = "x-replica"


def name_replicas(http_request: Any, streams: list[Any]) -> None:
    """Keep on the HTTP request (`request.state.replicas`) which replicas took its streams, for the front's
    `REPLICA_HEADER`; nothing outside a fleet, or for a caller that is no HTTP request (a batch line)."""
    names = list(dict.fromkeys(stream.replica for stream in streams if stream.replica is not None))
    state = getattr(http_request, "state", None)
    if names and state is not None:
        state.replicas = names


def replica_header(http_request: Any) -> dict[str, str]:
    """`REPLICA_HEADER` for the response to `http_request`, where a fleet's replicas took it (else none)."""
    names = getattr(getattr(http_request, "state", None), "replicas", None)
    return {REPLICA_HEADER: ", ".join(names)} if names else {}


def with_replica_header(result: Any, http_request: Any) -> Any:
    """`result` of a route (a Starlette response, a pydantic model or the dict truss renders as JSON) with
    `REPLICA_HEADER` where a fleet's replicas took the request; anything else is returned as it is."""
    header = replica_header(http_request)
    if not header:
        return result
    if isinstance(result, Response):
        result.headers.update(header)
        return result
    if isinstance(result, BaseModel):  # as truss 0.18's server renders one (every field, None included)
        return Response(result.model_dump_json(), media_type="application/json", headers=header)
    if isinstance(result, (dict, list)):
        return JSONResponse(result, headers=header)
    return result
