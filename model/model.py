"""The truss entry point: a thin shell around `trtllm_truss.service.LLMService`.

truss's model server calls `load()` once in a background thread (readiness answers 503 until it
returns), then routes `/v1/models/model:predict`, `/v1/chat/completions` and `/v1/completions` to
the methods below (and `/v1/responses`, `/v1/messages`). All logic lives in `packages/trtllm_truss`.

The three methods take only the raw request: truss then leaves the body unparsed (its own parsing
answers hostile bodies with 500s) and `trtllm_truss.api.body` reads it, every problem a 4xx.
"""

# No `from __future__ import annotations`: truss inspects the `fastapi.Request` annotation objects.
from pathlib import Path
from typing import Any

import fastapi

from functools import partial

from trtllm_truss.api import messages as anthropic_messages
from trtllm_truss.api.body import read_json_body
from trtllm_truss.api.errors import error_response
from trtllm_truss.service import LLMService

NATIVE_ERROR = partial(error_response, openai=False)
OPENAI_ERROR = partial(error_response, openai=True)
ANTHROPIC_ERROR = anthropic_messages.error_response

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

    async def _answer(self, http_request: fastapi.Request, handle: Any, error: Any) -> Any:
        """Read the body ourselves (refusals answered in the route's error shape), then hand the
        parsed body and the request to the service."""
        try:
            body = await read_json_body(http_request, max_bytes=self._service.limits.max_body_bytes)
        except fastapi.HTTPException as exc:
            return error(exc.status_code, str(exc.detail))
        return await handle(body, http_request)

    async def predict(self, http_request: fastapi.Request) -> Any:
        return await self._answer(http_request, self._service.predict, NATIVE_ERROR)

    async def chat_completions(self, http_request: fastapi.Request) -> Any:
        return await self._answer(http_request, self._service.chat_completions, OPENAI_ERROR)

    async def completions(self, http_request: fastapi.Request) -> Any:
        return await self._answer(http_request, self._service.completions, OPENAI_ERROR)

    async def responses(self, http_request: fastapi.Request) -> Any:
        return await self._answer(http_request, self._service.responses, OPENAI_ERROR)

    async def messages(self, http_request: fastapi.Request) -> Any:
        return await self._answer(http_request, self._service.messages, ANTHROPIC_ERROR)
