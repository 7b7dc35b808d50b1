"""The truss entry point: a thin shell around `trtllm_truss.fronts.service.LLMService`.

truss's model server calls `load()` once in a background thread (readiness answers 503 until it
returns), then routes `/v1/models/model:predict`, `/v1/chat/completions`, `/v1/completions`,
`/v1/responses` and `/v1/messages` to the methods below. All logic lives in `packages/trtllm_truss`.

The route methods take only the raw request: truss then leaves the body unparsed (its own parsing
answers hostile bodies with 500s) and `trtllm_truss.api.body` reads it, every problem a 4xx.
"""

# No `from __future__ import annotations`: truss inspects the `fastapi.Request` annotation objects.
from pathlib import Path
from typing import Any

import fastapi

from trtllm_truss.api.body import read_json_body
from trtllm_truss.api.messages import error_response as anthropic_error
from trtllm_truss.serving.native import native_error
from trtllm_truss.serving.openai_shared import openai_error
from trtllm_truss.fronts.service import LLMService

# model/model.py -> the truss directory (holds config.yaml and data/)
TRUSS_DIR = Path(__file__).resolve().parent.parent


class Model:
    def __init__(self, **kwargs: Any) -> None:
        # `environment` is truss's deployment environment (name etc.), not process variables: the
        # service reads os.environ for configuration overrides.
        self._service = LLMService(TRUSS_DIR, secrets=kwargs.get("secrets"))

    def load(self) -> None:
        self._service.load()

    async def is_healthy(self) -> bool:
        return await self._service.is_healthy()

    async def _answer(self, http_request: fastapi.Request, handle: Any, render_error: Any) -> Any:
        """Read the body ourselves (refusals answered by the route's `render_error(status, message,
        headers)`, in its error shape), then hand the parsed body and the request to the service."""
        try:
            body = await read_json_body(http_request, max_bytes=self._service.limits.max_body_bytes)
        except fastapi.HTTPException as exc:
            return render_error(exc.status_code, str(exc.detail), None)
        return await handle(body, http_request)

    # One line per route: the service's method and the dialect's error shape.
    async def predict(self, http_request: fastapi.Request) -> Any:
        return await self._answer(http_request, self._service.predict, native_error)

    async def chat_completions(self, http_request: fastapi.Request) -> Any:
        return await self._answer(http_request, self._service.chat_completions, openai_error)

    async def completions(self, http_request: fastapi.Request) -> Any:
        return await self._answer(http_request, self._service.completions, openai_error)

    async def responses(self, http_request: fastapi.Request) -> Any:
        return await self._answer(http_request, self._service.responses, openai_error)

    async def messages(self, http_request: fastapi.Request) -> Any:
        return await self._answer(http_request, self._service.messages, anthropic_error)
