"""Target `openai`: `POST /v1/completions` of any OpenAI-compatible server (ours, a fleet's frontend such as
Dynamo's), the prompt sent as token ids so that the server's KV cache sees exactly the blocks the
workload built (trace replay). Streams with `stream_options.include_usage`, so the last event's usage
gives the exact output tokens and `usage.prompt_tokens_details.cached_tokens` (counted as 0 when absent).

Which replica served a request, where the server says: the `x-replica` response header, or Dynamo's
`nvext.worker_id.decode_worker_id` when `dynamo_worker_id` asks for it (`nvext.extra_fields`)."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from trtllm_truss.bench.targets.base import IgnoreEos, StreamChunk, TargetError, TargetName
from trtllm_truss.bench.workload import BenchRequest

COMPLETIONS_PATH = "/v1/completions"
MODELS_PATH = "/v1/models"
REPLICA_HEADER = "x-replica"


def usage_fields(event: dict) -> tuple[int | None, int | None]:
    """(completion tokens, cached prompt tokens) of an event's usage; None for what it does not say (the
    report counts an unsaid cached count as 0 and warns when no response said it)."""
    usage = event.get("usage")
    if not isinstance(usage, dict):
        return None, None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return usage.get("completion_tokens"), cached if isinstance(cached, int) else None


def dynamo_worker(event: dict) -> str | None:
    """The decode worker Dynamo names in `nvext.worker_id` (asked for with nvext.extra_fields)."""
    nvext = event.get("nvext")
    worker = nvext.get("worker_id") if isinstance(nvext, dict) else None
    if isinstance(worker, dict) and worker.get("decode_worker_id") is not None:
        return str(worker["decode_worker_id"])
    return None


class OpenAiTarget:
    name: TargetName = "openai"

    def __init__(
        self, base_url: str, ignore_eos: IgnoreEos = "min_length", timeout_s: float = 600.0,
        model: str | None = None, dynamo_worker_id: bool = False, api_key: str | None = None,
    ):
        self.url = base_url.rstrip("/")
        self.ignore_eos = ignore_eos
        self.timeout_s = timeout_s
        self.model = model
        self.dynamo_worker_id = dynamo_worker_id
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: Any = None

    async def open(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),  # the runner decides the concurrency
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            headers=self._headers,
        )
        try:
            async with self._session.get(self.url + MODELS_PATH) as resp:
                status = resp.status
                listing = await resp.json(content_type=None) if status == 200 else None
        except (aiohttp.ClientError, json.JSONDecodeError) as exc:
            await self.close()
            raise TargetError(f"server at {self.url} is not reachable: {exc}") from exc
        models = [m.get("id") for m in (listing or {}).get("data", []) if isinstance(m, dict)]
        if status != 200 or not models:
            await self.close()
            raise TargetError(f"server at {self.url}: {MODELS_PATH} answered {status} with no model (not ready)")
        if self.model is None:
            self.model = models[0]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def build_body(self, request: BenchRequest) -> dict:
        body: dict = {
            "model": self.model,
            "prompt": list(request.input_ids),
            "max_tokens": request.output_len,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.ignore_eos == "min_length":
            body["min_tokens"] = request.output_len
        elif self.ignore_eos == "end_id":
            body["ignore_eos"] = True
        if self.dynamo_worker_id:
            body["nvext"] = {"extra_fields": ["worker_id"]}
        return body

    async def stream(self, request: BenchRequest) -> AsyncIterator[StreamChunk]:
        async with self._session.post(self.url + COMPLETIONS_PATH, json=self.build_body(request)) as resp:
            if resp.status != 200:
                detail = (await resp.text())[:300]
                raise RuntimeError(f"HTTP {resp.status} from {COMPLETIONS_PATH}: {detail}")
            replica = resp.headers.get(REPLICA_HEADER)
            if replica is not None:
                yield StreamChunk(token_count=None, replica=replica)
            worker_told = False
            async for raw in resp.content:  # one SSE line at a time
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    raise RuntimeError(f"error event from {COMPLETIONS_PATH}: {str(event['error'])[:300]}")
                worker = None if worker_told or replica is not None else dynamo_worker(event)
                worker_told = worker_told or worker is not None
                output_tokens, cached = usage_fields(event)
                text = "".join(c.get("text") or "" for c in event.get("choices") or ())
                yield StreamChunk(
                    token_count=None, text=text or None, usage_output_tokens=output_tokens,
                    cached_tokens=cached, replica=worker,
                )
