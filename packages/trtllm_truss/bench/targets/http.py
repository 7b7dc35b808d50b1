"""Target `http`: truss's model server, `POST /v1/models/model:predict` with `stream: true` (the whole
product path: truss server -> model.py -> gRPC -> ensemble -> engine). The body streams raw text
chunks; they are decoded incrementally so a character split across chunks is not mangled.

aiohttp rather than httpx: on a 2-core machine the client shares the CPU with the server, and
aiohttp's per-chunk cost is several times lower."""

from __future__ import annotations

import codecs
from typing import Any, AsyncIterator

from trtllm_truss.bench.targets.base import IgnoreEos, StreamChunk, TargetError, TargetName
from trtllm_truss.bench.workload import BenchRequest

PREDICT_PATH = "/v1/models/model:predict"
READY_PATH = "/v1/models/model"


class HttpTarget:
    name: TargetName = "http"

    def __init__(self, base_url: str, ignore_eos: IgnoreEos = "min_length", timeout_s: float = 600.0):
        self.url = base_url.rstrip("/")
        self.ignore_eos = ignore_eos
        self.timeout_s = timeout_s
        self._session: Any = None

    async def open(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(
            # No connection cap: the runner decides the concurrency, not the pool.
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        )
        try:
            async with self._session.get(self.url + READY_PATH) as resp:
                status = resp.status
        except aiohttp.ClientError as exc:
            await self.close()
            raise TargetError(f"truss server at {self.url} is not reachable: {exc}") from exc
        if status != 200:
            await self.close()
            raise TargetError(f"truss server at {self.url}: {READY_PATH} answered {status} (not ready)")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def build_body(self, request: BenchRequest) -> dict:
        body: dict = {"prompt": request.prompt, "max_tokens": request.output_len, "stream": True}
        if self.ignore_eos == "min_length":
            body["min_tokens"] = request.output_len
        elif self.ignore_eos == "end_id":
            body["ignore_eos"] = True
        return body

    async def stream(self, request: BenchRequest) -> AsyncIterator[StreamChunk]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        async with self._session.post(self.url + PREDICT_PATH, json=self.build_body(request)) as resp:
            if resp.status != 200:
                detail = (await resp.text())[:300]
                raise RuntimeError(f"HTTP {resp.status} from {PREDICT_PATH}: {detail}")
            async for raw in resp.content.iter_any():
                text = decoder.decode(raw)
                if text:
                    yield StreamChunk(token_count=None, text=text)
            tail = decoder.decode(b"", final=True)
            if tail:
                yield StreamChunk(token_count=None, text=tail)
