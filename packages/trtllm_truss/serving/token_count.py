"""The count routes' shared part: a request's input tokens as the request itself would report them
(`usage.input_tokens`), without generating.

The dialect builds its `GenerationRequest` as for the real request, the core makes the worker's spec
of it (`RequestCore.spec`: the same chat turns, tools and template variables), and a stream worker (or
the in-process pool) renders and tokenizes the prompt exactly as it does before generating, then ends
the request with the count (`GenerationSpec.count_only`): one path for the count and the real request,
so they cannot differ, and nothing reaches the engine. What the real request would refuse about its
prompt (a turn the template refuses, a prompt over `max_input_len`) is refused here too, in the
dialect's error shape. The output constraint (`response_format`, a forced `tool_choice`) is not
compiled: it does not change the prompt.
"""

from __future__ import annotations

import dataclasses

from fastapi import Request

from trtllm_truss.serving.core import DISCONNECT_POLL_S, Refused, RequestCore
from trtllm_truss.serving.request import GenerationRequest


async def input_tokens(core: RequestCore, req: GenerationRequest, http_request: Request | None) -> int:
    """The prompt tokens of `req` (one choice), as its `usage` would say; Refused as the request would be."""
    spec = dataclasses.replace(core.spec(req), count_only=True)
    stream = await core._submit(spec)  # admitted as any request: a count takes a worker's turn
    try:
        while not await stream.wait_for_text(DISCONNECT_POLL_S):
            if http_request is not None and await http_request.is_disconnected():
                raise Refused(499, "client disconnected while waiting for the count")
    finally:
        stream.close()
    end = stream.end
    assert end is not None  # the worker ends a count at once, with no text
    if end.error is not None:
        raise Refused(end.status or 503, end.error)
    return end.prompt_tokens
