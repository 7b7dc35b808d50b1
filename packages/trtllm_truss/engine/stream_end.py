"""Ending a Triton `ModelStreamInfer` call once its last response is in: half-close, let Triton finish
the call, and cancel only a call that did not end.

Why never cancel right after the final response (issue 24, the stop that waited out its exit timeout):
tritonserver 2.51's gRPC frontend (triton-inference-server/server r24.10, src/grpc) loses the request
of a stream when the client's cancel lands between the final response and the end of the call. The
stream's first request is the state gRPC's AsyncNotifyWhenDone reports on, so its final response
leaves it among the context's in-flight states (stream_infer_handler.cc:653) while Finish() moves it
to PARTIAL_COMPLETION (:587-597). A cancel notification then makes HandleCancellation
(infer_handler.h:835) call IssueRequestCancellation (:791), which cancels that finished request and
marks it CANCELLATION_ISSUED (:819); the state then waits for a response callback (:884) that already
came, so it is never released and never drops its `TRITONSERVER_InferenceRequest`
(infer_handler.h:1113, stream_infer_handler.cc:268). The request holds its model (core r24.10
infer_request.h:798), so at shutdown that model is never unloaded, its python stub never gets
`finalize`, and tritonserver leaves at --exit-timeout-secs ("Exit timeout expired"). The engine probe
cancelled its stream as soon as its one answer arrived (every 10 s): about 1 stop in 10 of three
stacks stopping at once on 2 cores waited out the exit timeout for that (docs/design.md, "Shutdown").

A call whose client half-closed is ended by Triton itself right after the last response, so waiting
for that end costs well under a millisecond; a cancel after it is a no-op.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

END_TIMEOUT_S = 1.0  # Triton ends a half-closed stream within microseconds of its last response


async def end_call(call: grpc.aio.StreamStreamCall, timeout_s: float = END_TIMEOUT_S) -> bool:
    """Half-close `call` (a raw `ModelStreamInfer` call whose final response was read) and wait for
    Triton to end it. True once it has ended; the caller cancels it either way (then a no-op)."""
    try:
        await call.done_writing()
        await asyncio.wait_for(call.code(), timeout_s)  # asyncio.timeout is 3.11+
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError, asyncio.TimeoutError):
        return False
    return True


async def read_to_end(responses: AsyncIterator, timeout_s: float = END_TIMEOUT_S) -> bool:
    """Read what is left of a stream whose requests are all sent (tritonclient's `stream_infer`
    iterator, which half-closes once its request iterator is exhausted) until Triton ends it.
    True once it has ended; the caller cancels it either way (then a no-op)."""

    async def rest() -> None:
        async for _ in responses:
            pass

    try:
        await asyncio.wait_for(rest(), timeout_s)
    except Exception:  # noqa: BLE001 - a failed or slow end: the caller's cancel is all that is left
        return False
    return True
