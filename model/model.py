"""The truss entry point: a thin shell around `trtllm_truss.service.LLMService`.

truss's model server calls `load()` once in a background thread (readiness answers 503 until it
returns), then routes `/v1/models/model:predict`, `/v1/chat/completions` and `/v1/completions` to
the methods below. All logic lives in `packages/trtllm_truss`.

The three methods take only the raw request: truss then leaves the body unparsed (its own parsing
answers hostile bodies with 500s) and `trtllm_truss.api.body` reads it, every problem a 4xx.
"""

# No `from __future__ import annotations`: truss inspects the `fastapi.Request` annotation objects.
from pathlib import Path
from typing import Any

import fastapi

from trtllm_truss.api.body import read_json_body
from trtllm_truss.service import LLMService, openai_error_shape

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

    async def _body(self, http_request: fastapi.Request) -> Any:
        return await read_json_body(http_request, max_bytes=self._service.limits.max_body_bytes)

    async def predict(self, http_request: fastapi.Request) -> Any:
        return await self._service.predict(await self._body(http_request), http_request)

    async def chat_completions(self, http_request: fastapi.Request) -> Any:
        with openai_error_shape():
            body = await self._body(http_request)
        return await self._service.chat_completions(body, http_request)

    async def completions(self, http_request: fastapi.Request) -> Any:
        with openai_error_shape():
            body = await self._body(http_request)
        return await self._service.completions(body, http_request)
